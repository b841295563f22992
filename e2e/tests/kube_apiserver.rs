//! Kubernetes mode against a REAL kube-apiserver and etcd
//! (`e2e/setup.sh kube-apiserver`, `src/apiserver.rs`), with RBAC on:
//! `kubectl apply` of what deploy/kubernetes ships and of the examples,
//! meshbridge running as the shipped ServiceAccount (a TokenRequest token),
//! its watchers, status by server-side apply, listenerPort write-back,
//! leader election on a Lease with failover, and Higress's own CRD, which
//! prunes meshbridge's fields. Registries are `static`, so no registry
//! server is needed.

use std::path::Path;
use std::time::{Duration, Instant};

use meshbridge::kube::KubeArgs;
use meshbridge::run::{App, GatewayArgs};
use meshbridge_e2e::apiserver::{ApiServer, launch_meshbridge, repo};
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::captured_logs;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::traffic::wait_for_traffic;
use serde_json::{Value, json};

const NS: &str = "higress-system";
const SA: &str = "system:serviceaccount:meshbridge-system:meshbridge";

/// meshbridge in process, as the shipped ServiceAccount.
async fn start(kubeconfig: &Path, kube: KubeArgs) -> App {
    start_gateway(kubeconfig, kube, GatewayArgs::default()).await
}

async fn start_gateway(kubeconfig: &Path, kube: KubeArgs, gateway: GatewayArgs) -> App {
    captured_logs::logs();
    let kube = KubeArgs { kubeconfig: Some(kubeconfig.to_owned()), ..kube };
    launch_meshbridge(kube, gateway).await.expect("start meshbridge")
}

fn kube_args(identity: &str) -> KubeArgs {
    KubeArgs {
        kube: true,
        leader_elect: Some(true),
        leader_identity: Some(identity.into()),
        leader_lease_duration: Duration::from_secs(3),
        leader_renew_deadline: Duration::from_secs(2),
        leader_retry_period: Duration::from_millis(300),
        status_interval: Duration::from_millis(300),
        kube_sync_timeout: Duration::from_secs(30),
        // A rotated Secret is seen within this.
        secret_resync_interval: Duration::from_secs(1),
        ..KubeArgs::default()
    }
}

fn bridge(registries: Value, proxies: Value) -> String {
    json!({
        "apiVersion": "networking.higress.io/v1", "kind": "McpBridge",
        "metadata": {"name": "default", "namespace": NS},
        "spec": {"registries": registries, "proxies": proxies},
    })
    .to_string()
}

fn static_registry(name: &str, endpoints: &str) -> Value {
    json!({"type": "static", "name": name, "domain": endpoints, "port": 80})
}

/// Poll `probe` (which reads the API server) until it gives `Some`.
async fn until<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn mcpbridge(api: &ApiServer) -> Value {
    api.get("mcpbridge", NS, "default").await.unwrap().expect("McpBridge default")
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == kind)
}

fn leading(app: &App) -> bool {
    *app.kube.as_ref().unwrap().leader.borrow()
}

fn endpoints(app: &App, name: &str) -> Option<usize> {
    app.cache.registries().into_iter().find(|r| r.key.name == name).filter(|r| r.status.ready).map(|r| r.endpoints)
}

/// Every `verb group/resource` the shipped ClusterRole and Role grant.
fn granted() -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("deploy/kubernetes/rbac.yaml")).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(&text).unwrap();
    let mut all = std::collections::BTreeSet::new();
    for rule in docs.iter().filter_map(|d| d["rules"].as_array()).flatten() {
        let list =
            |k: &str| rule[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect::<Vec<_>>();
        for group in list("apiGroups") {
            for resource in list("resources") {
                for verb in list("verbs") {
                    all.insert(format!("{verb} {group}/{resource}"));
                }
            }
        }
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_kustomization_crd_and_examples() {
    let api = ApiServer::start().await.unwrap();
    // kubectl's default validation is strict: the server rejects a field
    // the schema lacks, so every file here matches the real schemas.
    api.install_shipped().await.unwrap();
    let examples = repo().join("deploy/examples/dubbo-spring");
    let out = api.kubectl(&["apply", "-f", &examples.to_string_lossy()]).await.unwrap();
    assert!(out.contains("mcpbridge.networking.higress.io/default created"), "{out}");
    // Every object of the example, the apps' Deployments (stored, not run:
    // no kubelet) and Services included.
    for created in [
        "ingress.networking.k8s.io/greeter-spring created",
        "ingress.networking.k8s.io/greeter-spring-canary created",
        "ingress.networking.k8s.io/greeter-dubbo created",
        "deployment.apps/greeter-spring created",
        "deployment.apps/greeter-spring-canary created",
        "deployment.apps/greeter-dubbo created",
        "service/greeter-spring created",
        "service/greeter-dubbo created",
        "secret/greeter-nacos created",
    ] {
        assert!(out.contains(created), "{created}: {out}");
    }

    // Nothing pruned: the stored registries are the file's.
    let docs: Vec<Value> =
        serde_saphyr::from_str_multiple(&std::fs::read_to_string(examples.join("mcpbridge.yaml")).unwrap()).unwrap();
    let file = docs.iter().find(|d| d["kind"] == "McpBridge").expect("the McpBridge in mcpbridge.yaml");
    let stored = mcpbridge(&api).await;
    assert_eq!(stored["spec"]["registries"], file["spec"]["registries"]);
    // The printer columns of our CRD.
    let table = api.kubectl(&["get", "mcpbridges", "-n", NS]).await.unwrap();
    assert!(table.starts_with("NAME") && table.contains("READY") && table.contains("DEGRADED"), "{table}");
    // An entry with a field no schema has is refused, naming it.
    let bad = bridge(
        json!([{"type": "static", "name": "x", "domain": "10.0.0.1:80", "port": 80, "nacosTimout": 5}]),
        json!([]),
    );
    let err = api.apply(&bad).await.unwrap_err().to_string();
    assert!(err.contains("unknown field \"spec.registries[0].nacosTimout\""), "{err}");
}

/// The shipped RBAC is enough (everything below runs as the
/// ServiceAccount) and no more than enough (the `can-i` checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshbridge_runs_as_the_shipped_service_account() {
    let api = ApiServer::start().await.unwrap();
    api.install_shipped().await.unwrap();
    for (allowed, args) in [
        (true, &["watch", "ingresses.networking.k8s.io", "--all-namespaces"][..]),
        (true, &["get", "secrets", "-n", NS]),
        (true, &["list", "ingressclasses.networking.k8s.io"]),
        // Secrets are read by name, in the McpBridges' namespace only.
        (false, &["list", "secrets", "--all-namespaces"]),
        (false, &["list", "secrets", "-n", NS]),
        (false, &["watch", "secrets", "-n", NS]),
        (false, &["get", "secrets", "-n", "default"]),
        (true, &["patch", "mcpbridges.networking.higress.io", "-n", NS]),
        (true, &["patch", "mcpbridges.networking.higress.io", "--subresource=status", "-n", NS]),
        (true, &["update", "leases.coordination.k8s.io", "-n", NS]),
        (true, &["get", "customresourcedefinitions.apiextensions.k8s.io/mcpbridges.networking.higress.io"]),
        (false, &["create", "mcpbridges.networking.higress.io", "-n", NS]),
        (false, &["delete", "mcpbridges.networking.higress.io", "-n", NS]),
        (false, &["patch", "mcpbridges.networking.higress.io", "-n", "default"]),
        (false, &["create", "secrets", "-n", NS]),
        (false, &["update", "secrets", "-n", NS]),
        (false, &["delete", "leases.coordination.k8s.io", "-n", NS]),
        (false, &["update", "leases.coordination.k8s.io", "-n", "kube-system"]),
        (false, &["patch", "ingresses.networking.k8s.io", "-n", "default"]),
        (false, &["get", "customresourcedefinitions.apiextensions.k8s.io/leases.example.com"]),
        (false, &["list", "configmaps", "--all-namespaces"]),
    ] {
        assert_eq!(api.can_i(SA, args).await.unwrap(), allowed, "can-i {args:?}");
    }

    let proxy = json!({"type": "http", "name": "egress", "serverAddress": "10.0.6.9", "serverPort": 3128});
    let mut proxied = static_registry("kb-proxied", "10.0.6.1:443");
    proxied["proxyName"] = json!("egress");
    proxied["protocol"] = json!("https");
    proxied["sni"] = json!("api.example.com");
    api.apply(&bridge(json!([static_registry("kb-a", "10.0.0.1:80,10.0.0.2:80"), proxied]), json!([proxy])))
        .await
        .unwrap();
    // A Secret nothing references, beside the ones that will be: never read.
    let unrelated = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kb-unrelated", "namespace": NS},
                           "stringData": {"consulToken": "not-yours"}});
    api.apply(&unrelated.to_string()).await.unwrap();
    let kubeconfig = api.service_account_kubeconfig("meshbridge-system", "meshbridge").await.unwrap();
    let app = start(&kubeconfig, kube_args("replica-1")).await;

    // Status by server-side apply, under the field manager `meshbridge`.
    let object = until("status written", Duration::from_secs(30), || async {
        let o = mcpbridge(&api).await;
        (condition(&o, "Ready")?["status"] == "True").then_some(o)
    })
    .await;
    let s = &object["status"];
    // Generation 1, or 2 once the listenerPort write-back (a spec change)
    // went first.
    assert!(matches!(s["observedGeneration"].as_i64(), Some(1 | 2)), "{s}");
    assert_eq!(
        (s["registries"][0]["name"].as_str(), s["registries"][0]["endpoints"].as_u64()),
        (Some("kb-a"), Some(2))
    );
    assert_eq!(condition(&object, "Degraded").unwrap()["status"], "False");
    let preserved = condition(&object, "FieldsPreserved").expect("FieldsPreserved condition");
    assert_eq!(preserved["status"], "True", "{preserved}");
    let managers = object["metadata"]["managedFields"].as_array().unwrap();
    let status_manager = managers
        .iter()
        .find(|m| m["manager"] == "meshbridge" && m["subresource"] == "status")
        .unwrap_or_else(|| panic!("no status entry for meshbridge: {managers:?}"));
    assert_eq!(status_manager["operation"], "Apply");

    // listenerPort written back once, by JSON patch (an Update entry).
    let port = until("listenerPort pinned", Duration::from_secs(30), || async {
        mcpbridge(&api).await["spec"]["proxies"][0]["listenerPort"].as_u64()
    })
    .await;
    assert!((50001..=50999).contains(&port), "{port}");
    let object = mcpbridge(&api).await;
    assert_eq!(object["spec"]["proxies"][0]["serverAddress"], "10.0.6.9", "the rest of the entry as written");
    let spec_manager = object["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["manager"] == "meshbridge" && m["subresource"].is_null())
        .cloned()
        .expect("meshbridge's spec entry");
    assert_eq!(spec_manager["operation"], "Update");
    // `proxies` is a list keyed by name in our CRD, so meshbridge owns
    // that entry's listenerPort alone, and a user's server-side apply of
    // `proxies` (without listenerPort) neither conflicts nor drops it.
    assert_eq!(
        spec_manager["fieldsV1"],
        json!({"f:spec": {"f:proxies": {"k:{\"name\":\"egress\"}": {"f:listenerPort": {}}}}}),
        "{spec_manager}"
    );
    let mut moved = object["spec"]["proxies"].clone();
    moved[0]["serverPort"] = json!(3129);
    moved[0].as_object_mut().unwrap().remove("listenerPort");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), bridge(object["spec"]["registries"].clone(), moved)).unwrap();
    let path = file.path().to_string_lossy().into_owned();
    api.kubectl(&["apply", "--server-side", "--field-manager", "user", "--force-conflicts", "-f", &path])
        .await
        .unwrap();
    let mut moved = mcpbridge(&api).await["spec"]["proxies"].clone();
    assert_eq!((moved[0]["serverPort"].as_u64(), moved[0]["listenerPort"].as_u64()), (Some(3129), Some(port)));
    moved[0]["serverPort"] = json!(3130);
    moved[0].as_object_mut().unwrap().remove("listenerPort");
    std::fs::write(file.path(), bridge(object["spec"]["registries"].clone(), moved)).unwrap();
    api.kubectl(&["apply", "--server-side", "--field-manager", "user", "-f", &path]).await.unwrap();
    assert_eq!(mcpbridge(&api).await["spec"]["proxies"][0]["listenerPort"].as_u64(), Some(port));
    let lease = api.get("lease", NS, "meshbridge").await.unwrap().expect("the Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "replica-1");

    // Steady state: nothing written, so the resourceVersion stays.
    let settled = until("status settles on the current generation", Duration::from_secs(30), || async {
        let o = mcpbridge(&api).await;
        let ready = condition(&o, "Ready").is_some_and(|c| c["status"] == "True");
        (ready && o["status"]["observedGeneration"] == json!(o["metadata"]["generation"])).then_some(o)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = mcpbridge(&api).await;
    assert_eq!(
        later["metadata"]["resourceVersion"], settled["metadata"]["resourceVersion"],
        "rewritten with nothing changed"
    );

    // An edit reaches the watchers, then the status.
    let mut registries = later["spec"]["registries"].clone();
    registries.as_array_mut().unwrap().push(static_registry("kb-b", "10.0.0.3:80"));
    api.apply(&bridge(registries, later["spec"]["proxies"].clone())).await.unwrap();
    until("kb-b running", Duration::from_secs(30), || async { endpoints(&app, "kb-b").map(|_| ()) }).await;
    until("kb-b in status", Duration::from_secs(30), || async {
        let o = mcpbridge(&api).await;
        let names: Vec<_> = o["status"]["registries"].as_array()?.iter().filter_map(|r| r["name"].as_str()).collect();
        names.contains(&"kb-b").then_some(())
    })
    .await;

    // An Ingress of class higress in another namespace is routed; its
    // second path names a Kubernetes Service, whose EndpointSlices
    // meshbridge then watches in that namespace.
    api.kubectl(&["create", "namespace", "apps"]).await.unwrap();
    let ingress = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "web", "namespace": "apps", "annotations": {"higress.io/destination": "kb-a.static:80"}},
        "spec": {"ingressClassName": "higress", "rules": [{"host": "web.example.com", "http": {"paths": [{"path": "/",
            "pathType": "Prefix", "backend": {"resource": {"apiGroup": "networking.higress.io", "kind": "McpBridge",
            "name": "default"}}}, {"path": "/svc", "pathType": "Prefix",
            "backend": {"service": {"name": "web", "port": {"number": 8080}}}}]}}]}});
    api.apply(&ingress.to_string()).await.unwrap();
    let routed = |app: &App| {
        app.config
            .borrow()
            .objects("VirtualService")
            .any(|o| o.spec.to_json()["hosts"].to_string().contains("web.example.com"))
    };
    until("Ingress routed", Duration::from_secs(30), || async { routed(&app).then_some(()) }).await;

    // A Secret named by authSecretName, read with the ClusterRole: a
    // change restarts the watcher that uses it, and only that one.
    let secret = |token: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kb-auth", "namespace": NS},
               "stringData": {"consulToken": token}})
        .to_string()
    };
    api.apply(&secret("first")).await.unwrap();
    let current = mcpbridge(&api).await;
    let mut registries = current["spec"]["registries"].clone();
    let mut with_auth = static_registry("kb-auth-user", "10.0.3.1:80");
    with_auth["authSecretName"] = json!("kb-auth");
    registries.as_array_mut().unwrap().push(with_auth);
    api.apply(&bridge(registries, current["spec"]["proxies"].clone())).await.unwrap();
    let synced = |name: &str| app.cache.registries().into_iter().find(|r| r.key.name == name)?.status.last_sync_time;
    until("kb-auth-user running", Duration::from_secs(30), || async { synced("kb-auth-user").map(|_| ()) }).await;
    let (auth_before, plain_before) = (synced("kb-auth-user").unwrap(), synced("kb-a").unwrap());
    api.apply(&secret("second")).await.unwrap();
    until("the Secret's user restarted", Duration::from_secs(30), || async {
        synced("kb-auth-user").filter(|t| *t > auth_before).map(|_| ())
    })
    .await;
    assert_eq!(synced("kb-a"), Some(plain_before), "a watcher not using the Secret restarted");

    // An Ingress's TLS Secret and the CA its auth-tls-secret names, each
    // read by name: the Gateway server of its host asks for client
    // certificates, verified against that CA.
    let pem = |what: &str| format!("-----BEGIN {what}-----\nAAAA\n-----END {what}-----\n");
    for (name, data) in [
        ("kb-cert", json!({"tls.crt": pem("CERTIFICATE"), "tls.key": pem("PRIVATE KEY")})),
        ("kb-cert-cacert", json!({"ca.crt": pem("CERTIFICATE")})),
    ] {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
            "stringData": data});
        api.apply(&secret.to_string()).await.unwrap();
    }
    let mtls = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "mtls", "namespace": NS, "annotations": {"higress.io/destination": "kb-a.static:80",
            "nginx.ingress.kubernetes.io/auth-tls-secret": "kb-cert-cacert"}},
        "spec": {"ingressClassName": "higress", "tls": [{"hosts": ["mtls.example.com"], "secretName": "kb-cert"}],
            "rules": [{"host": "mtls.example.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"resource": {"apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]}});
    api.apply(&mtls.to_string()).await.unwrap();
    let client_ca = |app: &App| {
        let config = app.config.borrow();
        let servers = config.objects("Gateway").flat_map(|o| match &o.spec {
            meshbridge::translate::model::Spec::Gateway(g) => g.servers.clone(),
            _ => Vec::new(),
        });
        let mtls = servers.into_iter().find(|s| s.hosts.iter().any(|h| h == "mtls.example.com") && s.tls.is_some())?;
        let tls = mtls.tls?;
        Some((tls.mode.map(|m| m.as_str()), tls.client_ca))
    };
    let want = (Some("MUTUAL"), Some((NS.to_owned(), "kb-cert-cacert".to_owned())));
    until("the client CA on the Gateway", Duration::from_secs(30), || async {
        client_ca(&app).filter(|got| *got == want).map(|_| ())
    })
    .await;

    // The ServiceAccount token is in no log line.
    let kubeconfig_text = std::fs::read_to_string(&kubeconfig).unwrap();
    let token = kubeconfig_text.lines().find_map(|l| l.trim().strip_prefix("token: ")).unwrap();
    assert!(token.len() > 100, "not a token: {} bytes", token.len());
    assert!(!captured_logs::text().contains(token), "the ServiceAccount token was logged");

    // No more than enough: every verb the shipped Roles grant is one
    // meshbridge used, by the API server's audit log.
    assert_eq!(api.requests_by(SA).unwrap(), granted(), "what meshbridge did (left) and what RBAC grants (right)");
    // The Secrets it read: the referenced ones, by name, and no other.
    assert_eq!(
        api.secrets_read_by(SA).unwrap(),
        ["kb-auth", "kb-cert", "kb-cert-cacert"].map(|n| format!("get {NS}/{n}")).into_iter().collect(),
        "Secrets read, from the audit log"
    );

    // Deleting the McpBridge stops its watchers.
    api.kubectl(&["delete", "mcpbridge", "default", "-n", NS]).await.unwrap();
    // (The Services the Ingress names stay watched: not a registry's.)
    let registry_watchers = |app: &App| {
        app.cache.registries().iter().filter(|r| r.key.kind != meshbridge_registries::RegistryKind::Kubernetes).count()
    };
    until("watchers stopped", Duration::from_secs(30), || async { (registry_watchers(&app) == 0).then_some(()) }).await;
    app.stop().await;
}

/// An Ingress and an McpBridge in the real API server route traffic
/// through a real Envoy gateway, and editing the Ingress moves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_edits_in_the_real_api_server_move_envoy_traffic() {
    let v1 = Backend::start("127.0.0.1", "v1").await.unwrap();
    let v2 = Backend::start("127.0.0.1", "v2").await.unwrap();
    let api = ApiServer::start().await.unwrap();
    api.install_shipped().await.unwrap();
    api.kubectl(&["create", "namespace", "apps"]).await.unwrap();
    let registries = json!([
        {"type": "static", "name": "shop-v1", "domain": v1.addr.to_string(), "port": 80},
        {"type": "static", "name": "shop-v2", "domain": v2.addr.to_string(), "port": 80},
    ]);
    api.apply(&bridge(registries, json!([]))).await.unwrap();
    let ingress = |destination: &str| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "shop", "namespace": "apps", "annotations": {"higress.io/destination": destination}},
            "spec": {"ingressClassName": "higress", "rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"resource": {"apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]}})
        .to_string()
    };
    api.apply(&ingress("shop-v1.static:80")).await.unwrap();

    let kubeconfig = api.service_account_kubeconfig("meshbridge-system", "meshbridge").await.unwrap();
    let gateway_port = free_port();
    let gateway = GatewayArgs { gateway_http_port: vec![gateway_port], ..GatewayArgs::default() };
    let app = start_gateway(&kubeconfig, kube_args("replica-1"), gateway).await;
    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, gateway_port).await.expect("start envoy");
    wait_for_traffic(&envoy, 200, &["v1"], "Ingress from the API server").await;
    api.apply(&ingress("shop-v2.static:80")).await.unwrap();
    wait_for_traffic(&envoy, 200, &["v2"], "edited Ingress").await;
    api.kubectl(&["delete", "ingress", "shop", "-n", "apps"]).await.unwrap();
    wait_for_traffic(&envoy, 404, &[], "deleted Ingress").await;
    app.stop().await;
}

/// Two replicas, one Lease: one leads; when it dies without releasing the
/// Lease the other takes over once the Lease expires, and writes status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader_and_fail_over() {
    let api = ApiServer::start().await.unwrap();
    api.install_shipped().await.unwrap();
    api.apply(&bridge(json!([static_registry("kb-l", "10.0.7.1:80")]), json!([]))).await.unwrap();
    let kubeconfig = api.service_account_kubeconfig("meshbridge-system", "meshbridge").await.unwrap();
    let one = start(&kubeconfig, kube_args("replica-1")).await;
    let two = start(&kubeconfig, kube_args("replica-2")).await;
    until("a leader", Duration::from_secs(30), || async { (leading(&one) || leading(&two)).then_some(()) }).await;
    for _ in 0..10 {
        assert!(leading(&one) ^ leading(&two), "exactly one leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (leader, follower, leader_id, follower_id) =
        if leading(&one) { (one, two, "replica-1", "replica-2") } else { (two, one, "replica-2", "replica-1") };
    let lease = api.get("lease", NS, "meshbridge").await.unwrap().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], leader_id);
    let transitions = lease["spec"]["leaseTransitions"].as_i64().unwrap_or(0);
    until("leader wrote status", Duration::from_secs(30), || async {
        condition(&mcpbridge(&api).await, "Ready").map(|_| ())
    })
    .await;
    assert!(endpoints(&follower, "kb-l").is_some(), "the follower serves too");

    // The leader dies: its tasks stop, the Lease is not released.
    let killed = Instant::now();
    drop(leader);
    until("follower takes over", Duration::from_secs(30), || async { leading(&follower).then_some(()) }).await;
    let took = killed.elapsed();
    assert!(took >= Duration::from_secs(2), "took over before the Lease expired: {took:?}");
    let lease = api.get("lease", NS, "meshbridge").await.unwrap().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], follower_id);
    assert_eq!(lease["spec"]["leaseTransitions"].as_i64(), Some(transitions + 1));

    // The new leader writes status: an edit's generation is observed.
    api.apply(&bridge(json!([static_registry("kb-l", "10.0.7.1:80,10.0.7.2:80")]), json!([]))).await.unwrap();
    until("new leader wrote status", Duration::from_secs(30), || async {
        let o = mcpbridge(&api).await;
        (o["status"]["observedGeneration"] == json!(2) && o["status"]["registries"][0]["endpoints"] == json!(2))
            .then_some(())
    })
    .await;
    follower.stop().await;
}

/// A replica that stops cleanly gives the Lease up: the other leads at
/// once, well before the 30 s Lease would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_hands_the_lease_over_at_once() {
    let api = ApiServer::start().await.unwrap();
    api.install_shipped().await.unwrap();
    let kubeconfig = api.service_account_kubeconfig("meshbridge-system", "meshbridge").await.unwrap();
    let long = |id: &str| KubeArgs {
        leader_lease_duration: Duration::from_secs(30),
        leader_renew_deadline: Duration::from_secs(10),
        ..kube_args(id)
    };
    let one = start(&kubeconfig, long("replica-1")).await;
    until("first replica leads", Duration::from_secs(30), || async { leading(&one).then_some(()) }).await;
    let two = start(&kubeconfig, long("replica-2")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!leading(&two), "two leaders");
    let stopped = Instant::now();
    one.stop().await;
    until("second replica leads", Duration::from_secs(10), || async { leading(&two).then_some(()) }).await;
    assert!(stopped.elapsed() < Duration::from_secs(10), "waited for expiry instead of a release");
    let lease = api.get("lease", NS, "meshbridge").await.unwrap().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-2");
    two.stop().await;
}

/// Higress's own CRD instead of ours: the API server prunes the fields
/// meshbridge adds, `kubectl apply` with its default (strict) validation
/// refuses them, and meshbridge reports them in status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_higress_crd_meshbridge_fields_are_pruned_and_reported() {
    let api = ApiServer::start().await.unwrap();
    api.install_with_crd(&repo().join("e2e/fixtures/higress-crd-mcpbridge.yaml")).await.unwrap();
    let mut entry = static_registry("kb-h", "10.0.8.1:80");
    entry["registryTls"] = json!({"enabled": true, "serverName": "registry.example.com"});
    entry["meshbridgeWatch"] = json!({"mode": "referenced"});
    entry["nacosTimeout"] = json!(3000);
    entry["ecdhCurves"] = json!(["P-256"]);
    let doc = bridge(json!([entry]), json!([]));

    let err = api.apply(&doc).await.unwrap_err().to_string();
    for field in ["registryTls", "meshbridgeWatch", "nacosTimeout", "ecdhCurves"] {
        assert!(err.contains(&format!("unknown field \"spec.registries[0].{field}\"")), "{field}: {err}");
    }
    // Without strict validation the object is stored, minus those fields.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &doc).unwrap();
    api.kubectl(&["apply", "--validate=false", "-f", &file.path().to_string_lossy()]).await.unwrap();
    let stored = mcpbridge(&api).await;
    let kept: Vec<&String> = stored["spec"]["registries"][0].as_object().unwrap().keys().collect();
    assert_eq!(kept, ["domain", "name", "port", "type"], "{stored}");

    let kubeconfig = api.service_account_kubeconfig("meshbridge-system", "meshbridge").await.unwrap();
    let app = start(&kubeconfig, kube_args("replica-1")).await;
    // The pruning is reported at once; the registry's first sync may take
    // a moment longer on a loaded machine: wait for both.
    let object = until("FieldsPreserved=False and Ready=True", Duration::from_secs(30), || async {
        let o = mcpbridge(&api).await;
        let pruned = condition(&o, "FieldsPreserved")?["status"] == "False";
        let ready = condition(&o, "Ready")?["status"] == "True";
        (pruned && ready).then_some(o)
    })
    .await;
    let c = condition(&object, "FieldsPreserved").unwrap();
    assert_eq!(c["reason"], "PrunedByCRD");
    let message = c["message"].as_str().unwrap();
    for field in ["registryTls", "meshbridgeWatch", "nacosTimeout", "ecdhCurves"] {
        assert!(message.contains(&format!("spec.registries[].{field}")), "{field}: {message}");
    }
    let warned = captured_logs::text()
        .lines()
        .find(|l| l.contains("WARN") && l.contains("McpBridge CRD does not declare fields"))
        .map(str::to_owned)
        .expect("a WARN naming the pruned fields");
    assert!(warned.contains("spec.registries[].registryTls"), "{warned}");
    // Higress's free-form status keeps the rest of what meshbridge writes.
    assert_eq!(condition(&object, "Ready").unwrap()["status"], "True");
    assert_eq!(object["status"]["registries"][0]["name"], "kb-h");
    app.stop().await;
}
