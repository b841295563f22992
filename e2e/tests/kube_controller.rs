//! Kubernetes mode against the FAKE kube-apiserver (`kube_fake`): McpBridge,
//! Ingress and Secret changes drive watchers and config, status and
//! listener ports are written back, a 410 relists, and two replicas elect
//! one leader. Registries are `static`, so no registry server is needed.
//! The same behaviours against a real API server, as the shipped
//! ServiceAccount, are in `kube_apiserver.rs`; these stay for what only the
//! fake can show (request counts and content types, a 410 on demand, Lease
//! timing in milliseconds).

use std::time::{Duration, Instant, SystemTime};

use meshbridge::cache::{RegistryKey, RegistryReport};
use meshbridge::kube::KubeArgs;
use meshbridge::run::{App, GatewayArgs};
use meshbridge_e2e::apiserver::launch_meshbridge;
use meshbridge_e2e::kube_fake::KubeFake;
use meshbridge_registries::RegistryKind;
use serde_json::{Value, json};

const NS: &str = "higress-system";
const BRIDGES: &str = "networking.higress.io/mcpbridges";

fn args(fake: &KubeFake) -> KubeArgs {
    KubeArgs {
        leader_elect: Some(false),
        status_interval: Duration::from_millis(200),
        kube_sync_timeout: Duration::from_secs(10),
        // Referenced Secrets are read by name: a changed one is seen
        // within this.
        secret_resync_interval: Duration::from_millis(200),
        ..KubeArgs::at(fake.url())
    }
}

async fn start(kube: KubeArgs, gateway: GatewayArgs) -> App {
    launch_meshbridge(kube, gateway).await.expect("start meshbridge")
}

fn bridge(name: &str, registries: Value, proxies: Value) -> Value {
    json!({
        "apiVersion": "networking.higress.io/v1", "kind": "McpBridge",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"registries": registries, "proxies": proxies},
    })
}

fn static_registry(name: &str, endpoints: &str) -> Value {
    json!({"type": "static", "name": name, "domain": endpoints, "port": 80})
}

fn report(app: &App, name: &str) -> Option<RegistryReport> {
    let key = RegistryKey::new(RegistryKind::Static, name);
    app.cache.registries().into_iter().find(|r| r.key == key)
}

async fn eventually(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn endpoints(app: &App, name: &str) -> Option<usize> {
    report(app, name).filter(|r| r.status.ready).map(|r| r.endpoints)
}

fn status_patches(fake: &KubeFake, name: &str) -> usize {
    let path = format!("/apis/networking.higress.io/v1/namespaces/{NS}/mcpbridges/{name}/status");
    fake.requests().iter().filter(|r| r.method == "PATCH" && r.path == path).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcpbridge_add_update_delete_drive_watchers() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    // Not `default`: ignored unless widened, as Higress does.
    fake.put(bridge("other", json!([static_registry("kb-other", "10.0.0.9:80")]), json!([])));
    let app = start(args(&fake), GatewayArgs::default()).await;
    assert!(app.cache.registries().is_empty(), "no McpBridge named default yet");

    fake.put(bridge("default", json!([static_registry("kb-a", "10.0.0.1:80")]), json!([])));
    eventually("kb-a running", Duration::from_secs(10), || endpoints(&app, "kb-a") == Some(1)).await;

    fake.put(bridge(
        "default",
        json!([static_registry("kb-a", "10.0.0.1:80,10.0.0.2:80"), static_registry("kb-b", "10.0.0.3:80")]),
        json!([]),
    ));
    eventually("kb-a updated, kb-b added", Duration::from_secs(10), || {
        endpoints(&app, "kb-a") == Some(2) && endpoints(&app, "kb-b") == Some(1)
    })
    .await;
    assert!(report(&app, "kb-other").is_none(), "only `default` is read");

    fake.delete(BRIDGES, NS, "default");
    eventually("watchers stopped", Duration::from_secs(10), || app.cache.registries().is_empty()).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_mcpbridges_report_a_clash_on_both_objects() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(bridge("a", json!([static_registry("kb-shared", "10.0.1.1:80")]), json!([])));
    fake.put(bridge(
        "b",
        json!([static_registry("kb-shared", "10.0.1.2:80"), static_registry("kb-own", "10.0.1.3:80")]),
        json!([]),
    ));
    let app = start(KubeArgs { all_mcpbridges: true, ..args(&fake) }, GatewayArgs::default()).await;
    eventually("both bridges in force", Duration::from_secs(10), || {
        endpoints(&app, "kb-shared").is_some() && endpoints(&app, "kb-own").is_some()
    })
    .await;
    let errors = |name: &str| {
        fake.get(BRIDGES, NS, name).and_then(|o| o["status"]["errors"].as_array().cloned()).unwrap_or_default()
    };
    eventually("clash in both statuses", Duration::from_secs(10), || {
        !errors("a").is_empty() && !errors("b").is_empty()
    })
    .await;
    let (a, b) = (errors("a"), errors("b"));
    assert_eq!(a.len(), 1, "{a:?}");
    assert!(
        a[0].as_str().unwrap().starts_with(
            "spec.registries[0].name: registry static/kb-shared is also defined by McpBridge higress-system/b"
        ),
        "{a:?}"
    );
    assert!(
        b[0].as_str().unwrap().starts_with("spec.registries[0].name: duplicate registry static/kb-shared"),
        "{b:?}"
    );
    let status = fake.get(BRIDGES, NS, "b").unwrap()["status"].clone();
    let degraded = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Degraded").unwrap().clone();
    assert_eq!((degraded["status"].as_str(), degraded["reason"].as_str()), (Some("True"), Some("ConfigErrors")));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_carries_registry_health_and_is_not_rewritten_when_nothing_changed() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(bridge(
        "default",
        json!([static_registry("kb-s1", "10.0.2.1:80,10.0.2.2:80"), {"type": "static", "name": "kb-bad", "port": 80}]),
        json!([]),
    ));
    let app = start(args(&fake), GatewayArgs::default()).await;
    let status = || fake.get(BRIDGES, NS, "default").map(|o| o["status"].clone()).unwrap_or(Value::Null);
    eventually("status written", Duration::from_secs(10), || status()["registries"][0]["ready"] == json!(true)).await;
    let s = status();
    assert_eq!(s["observedGeneration"], json!(1));
    let r = &s["registries"][0];
    assert_eq!((r["name"].as_str(), r["type"].as_str()), (Some("kb-s1"), Some("static")));
    assert_eq!(
        (r["healthy"].as_bool(), r["services"].as_u64(), r["endpoints"].as_u64()),
        (Some(true), Some(1), Some(2))
    );
    assert!(r["lastSyncTime"].as_str().is_some_and(|t| t.ends_with('Z')), "{r}");
    let bad = &s["registries"][1];
    assert_eq!(bad["ready"], json!(false));
    assert!(bad["message"].as_str().unwrap().starts_with("spec.registries[1].domain:"), "{bad}");
    assert!(s["errors"][0].as_str().unwrap().starts_with("spec.registries[1].domain:"), "{s}");
    let cond = |t: &str| s["conditions"].as_array().unwrap().iter().find(|c| c["type"] == t).unwrap().clone();
    assert_eq!(cond("Ready")["status"], "False");
    assert_eq!(cond("Degraded")["reason"], "ConfigErrors");
    assert_eq!(cond("Ready")["observedGeneration"], json!(1));
    let manager = fake.requests().into_iter().find(|r| r.path.ends_with("/default/status")).unwrap();
    assert!(manager.query.contains("fieldManager=meshbridge"), "{manager:?}");
    assert_eq!(manager.content_type, "application/apply-patch+yaml");

    // Steady state: ten status intervals, no writes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = status_patches(&fake, "default");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(status_patches(&fake, "default"), writes, "status rewritten with nothing changed");

    // A spec change is a content change: observedGeneration moves.
    fake.put(bridge("default", json!([static_registry("kb-s1", "10.0.2.1:80")]), json!([])));
    eventually("new generation observed", Duration::from_secs(10), || {
        status()["observedGeneration"] == json!(2) && status()["registries"][0]["endpoints"] == json!(1)
    })
    .await;
    let ready = status()["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
    assert_eq!((ready["status"].as_str(), ready["observedGeneration"].as_i64()), (Some("True"), Some(2)));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_change_restarts_only_its_watcher() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    let secret = |token: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kb-auth", "namespace": NS},
               "stringData": {"consulToken": token}})
    };
    fake.put(secret("first"));
    let mut with_auth = static_registry("kb-auth-user", "10.0.3.1:80");
    with_auth["authSecretName"] = json!("kb-auth");
    fake.put(bridge("default", json!([with_auth, static_registry("kb-plain", "10.0.3.2:80")]), json!([])));
    let app = start(args(&fake), GatewayArgs::default()).await;
    eventually("both running", Duration::from_secs(10), || {
        endpoints(&app, "kb-auth-user").is_some() && endpoints(&app, "kb-plain").is_some()
    })
    .await;
    let synced = |name: &str| -> SystemTime { report(&app, name).unwrap().status.last_sync_time.unwrap() };
    let (auth_before, plain_before) = (synced("kb-auth-user"), synced("kb-plain"));
    // A Secret nobody names changes nothing.
    fake.put(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated", "namespace": NS},
                    "stringData": {"x": "y"}}));
    tokio::time::sleep(Duration::from_millis(20)).await;
    fake.put(secret("second"));
    eventually("the Secret's user restarted", Duration::from_secs(10), || {
        report(&app, "kb-auth-user").and_then(|r| r.status.last_sync_time).is_some_and(|t| t > auth_before)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(synced("kb-plain"), plain_before, "a watcher not using the Secret restarted");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_410_relists_with_no_lost_update() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(bridge("default", json!([static_registry("kb-r", "10.0.4.1:80")]), json!([])));
    let app = start(args(&fake), GatewayArgs::default()).await;
    eventually("running", Duration::from_secs(10), || endpoints(&app, "kb-r") == Some(1)).await;
    // The watch must be open before it is cut: a watch that starts after
    // the cut, from the list's resourceVersion, is not too old (as on a real
    // API server) and would see the change without a relist.
    eventually("the McpBridge watch is open", Duration::from_secs(10), || bridge_watches(&fake) > 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lists_before = bridge_lists(&fake);

    // Cut every watch with a 410 and change the McpBridge while they are
    // down: the change is only in the next list.
    fake.expire_watches();
    fake.put(bridge("default", json!([static_registry("kb-r", "10.0.4.1:80,10.0.4.2:80")]), json!([])));
    eventually("update seen after relist", Duration::from_secs(15), || endpoints(&app, "kb-r") == Some(2)).await;
    assert!(bridge_lists(&fake) > lists_before, "the 410 did not cause a relist");
    app.stop().await;
}

/// LIST (not watch) requests for McpBridges.
fn bridge_lists(fake: &KubeFake) -> usize {
    bridge_gets(fake, false)
}

/// WATCH requests for McpBridges.
fn bridge_watches(fake: &KubeFake) -> usize {
    bridge_gets(fake, true)
}

fn bridge_gets(fake: &KubeFake, watch: bool) -> usize {
    let path = format!("/apis/networking.higress.io/v1/namespaces/{NS}/mcpbridges");
    fake.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == path && r.query.contains("watch=true") == watch)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_changes_reach_the_config_set() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(bridge("default", json!([static_registry("kb-web", "10.0.5.1:80")]), json!([])));
    let ingress = |host: &str, class: Option<&str>| {
        let mut spec = json!({"rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"resource": {"apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]});
        if let Some(c) = class {
            spec["ingressClassName"] = json!(c);
        }
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
               "metadata": {"name": "web", "namespace": "apps",
                            "annotations": {"higress.io/destination": "kb-web.static:80"}},
               "spec": spec})
    };
    // The class is `mesh`; IngressClass `mesh` is the cluster default, so an
    // Ingress naming no class is ours too.
    fake.put(json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
                    "metadata": {"name": "mesh", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
                    "spec": {"controller": "higress.io/higress-controller"}}));
    fake.put(ingress("a.example.com", Some("mesh")));
    let gateway = GatewayArgs { ingress_class: "mesh".into(), ..GatewayArgs::default() };
    let app = start(args(&fake), gateway).await;
    let hosts = |app: &App| -> Vec<String> {
        let set = app.config.borrow().clone();
        set.objects("VirtualService")
            .flat_map(|o| o.spec.to_json()["hosts"].as_array().cloned().unwrap_or_default())
            .filter_map(|h| h.as_str().map(str::to_owned))
            .collect()
    };
    let has = |app: &App, host: &str| hosts(app).iter().any(|k| k.contains(host));
    eventually("a.example.com routed", Duration::from_secs(10), || has(&app, "a.example.com")).await;

    fake.put(ingress("b.example.com", Some("other")));
    eventually("another class is dropped", Duration::from_secs(10), || !has(&app, "example.com")).await;

    fake.put(ingress("c.example.com", None));
    eventually("no class, default IngressClass", Duration::from_secs(10), || has(&app, "c.example.com")).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_port_is_written_back_once() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    let proxy = json!({"type": "http", "name": "kb-proxy", "serverAddress": "10.0.6.9", "serverPort": 3128});
    let mut registry = static_registry("kb-proxied", "10.0.6.1:443");
    registry["proxyName"] = json!("kb-proxy");
    registry["protocol"] = json!("https");
    registry["sni"] = json!("api.example.com");
    fake.put(bridge("default", json!([registry]), json!([proxy])));
    let app = start(args(&fake), GatewayArgs::default()).await;
    let port = || fake.get(BRIDGES, NS, "default").and_then(|o| o["spec"]["proxies"][0]["listenerPort"].as_u64());
    eventually("listenerPort pinned", Duration::from_secs(10), || port().is_some()).await;
    let pinned = port().unwrap();
    assert!((50001..=50999).contains(&pinned), "{pinned}");
    eventually("pinned port in force", Duration::from_secs(10), || {
        app.kube.as_ref().unwrap().observed.borrow().desired.proxies.first().and_then(|p| p.listener_port)
            == Some(pinned as u16)
    })
    .await;
    // The rest of the entry is as written.
    let entry = fake.get(BRIDGES, NS, "default").unwrap()["spec"]["proxies"][0].clone();
    assert_eq!(entry["serverAddress"], "10.0.6.9");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let path = format!("/apis/networking.higress.io/v1/namespaces/{NS}/mcpbridges/default");
    let patches: Vec<_> = fake.requests().into_iter().filter(|r| r.method == "PATCH" && r.path == path).collect();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(patches[0].content_type, "application/json-patch+json");
    assert_eq!(port(), Some(pinned));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader_and_the_second_takes_over() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(bridge("default", json!([static_registry("kb-l", "10.0.7.1:80")]), json!([])));
    let replica = |id: &str| KubeArgs {
        leader_elect: Some(true),
        leader_identity: Some(id.into()),
        leader_lease_duration: Duration::from_secs(2),
        leader_renew_deadline: Duration::from_millis(1500),
        leader_retry_period: Duration::from_millis(200),
        ..args(&fake)
    };
    let one = start(replica("replica-1"), GatewayArgs::default()).await;
    let two = start(replica("replica-2"), GatewayArgs::default()).await;
    let leading = |app: &App| *app.kube.as_ref().unwrap().leader.borrow();
    eventually("a leader", Duration::from_secs(10), || leading(&one) || leading(&two)).await;
    // Both serve: both have the registry.
    eventually("both replicas watch", Duration::from_secs(10), || {
        endpoints(&one, "kb-l").is_some() && endpoints(&two, "kb-l").is_some()
    })
    .await;
    for _ in 0..10 {
        assert!(leading(&one) ^ leading(&two), "exactly one leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let holder = |fake: &KubeFake| {
        fake.get("coordination.k8s.io/leases", NS, "meshbridge")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    let (leader, follower, follower_id) = if leading(&one) { (one, two, "replica-2") } else { (two, one, "replica-1") };
    assert_ne!(holder(&fake).as_deref(), Some(follower_id));
    eventually("leader wrote status", Duration::from_secs(10), || status_patches(&fake, "default") > 0).await;

    // The leader stops renewing (a crash: no release); the follower takes
    // over after the lease duration, by its own clock.
    let stopped = Instant::now();
    drop(leader);
    eventually("follower takes over", Duration::from_secs(10), || leading(&follower)).await;
    let took = stopped.elapsed();
    assert!(took >= Duration::from_millis(1500), "took over before the lease expired: {took:?}");
    assert_eq!(holder(&fake).as_deref(), Some(follower_id));
    follower.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_the_lease_stops_writing_status() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(bridge("default", json!([static_registry("kb-w", "10.0.8.1:80")]), json!([])));
    let kube = KubeArgs {
        leader_elect: Some(true),
        leader_identity: Some("replica-1".into()),
        leader_lease_duration: Duration::from_secs(30),
        leader_renew_deadline: Duration::from_secs(1),
        leader_retry_period: Duration::from_millis(200),
        ..args(&fake)
    };
    let app = start(kube, GatewayArgs::default()).await;
    let leading = |app: &App| *app.kube.as_ref().unwrap().leader.borrow();
    eventually("leading", Duration::from_secs(10), || leading(&app)).await;
    eventually("status written", Duration::from_secs(10), || status_patches(&fake, "default") > 0).await;

    // Another holder appears with a fresh renewTime: this replica must step
    // down within the renew deadline and write no more status.
    let mut lease = fake.get("coordination.k8s.io/leases", NS, "meshbridge").unwrap();
    lease["spec"]["holderIdentity"] = json!("intruder");
    lease["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    let lost_at = Instant::now();
    fake.put(lease);
    eventually("stepped down", Duration::from_secs(5), || !leading(&app)).await;
    assert!(lost_at.elapsed() < Duration::from_secs(1), "stepped down after the renew deadline");
    let writes = status_patches(&fake, "default");
    fake.put(bridge("default", json!([static_registry("kb-w", "10.0.8.1:80,10.0.8.2:80")]), json!([])));
    eventually("change applied", Duration::from_secs(10), || endpoints(&app, "kb-w") == Some(2)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(status_patches(&fake, "default"), writes, "a follower wrote status");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_hands_the_lease_over_at_once() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    let replica = |id: &str| KubeArgs {
        leader_elect: Some(true),
        leader_identity: Some(id.into()),
        leader_lease_duration: Duration::from_secs(30),
        leader_renew_deadline: Duration::from_secs(10),
        leader_retry_period: Duration::from_millis(200),
        ..args(&fake)
    };
    let one = start(replica("replica-1"), GatewayArgs::default()).await;
    let leading = |app: &App| *app.kube.as_ref().unwrap().leader.borrow();
    eventually("first replica leads", Duration::from_secs(10), || leading(&one)).await;
    let two = start(replica("replica-2"), GatewayArgs::default()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!leading(&two));
    let stopped = Instant::now();
    one.stop().await;
    eventually("second replica leads", Duration::from_secs(5), || leading(&two)).await;
    assert!(stopped.elapsed() < Duration::from_secs(5), "waited for expiry instead of a release");
    two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_tls_secrets_are_read_from_the_ingress_namespace() {
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(bridge("default", json!([static_registry("kb-tls", "10.0.10.1:80")]), json!([])));
    let tls_secret = |ns: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "shop-cert", "namespace": ns},
               "stringData": {"tls.crt": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                              "tls.key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"}})
    };
    // Same name, other namespace: not the Ingress's.
    fake.put(tls_secret("elsewhere"));
    fake.put(json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "apps", "annotations": {"higress.io/destination": "kb-tls.static:80"}},
        "spec": {"ingressClassName": "higress", "tls": [{"hosts": ["shop.example.com"], "secretName": "shop-cert"}],
                 "rules": [{"host": "shop.example.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"resource": {"apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]}}));
    let app = start(args(&fake), GatewayArgs::default()).await;
    let tls = |app: &App| -> Vec<(String, String)> {
        let desired = app.kube.as_ref().unwrap().observed.borrow().desired.clone();
        desired.tls_secrets.iter().map(|s| (s.namespace.clone(), s.name.clone())).collect()
    };
    eventually("Ingress routed", Duration::from_secs(10), || {
        app.kube.as_ref().unwrap().observed.borrow().desired.ingresses.len() == 1
    })
    .await;
    assert!(tls(&app).is_empty(), "a Secret in another namespace was used: {:?}", tls(&app));
    fake.put(tls_secret("apps"));
    eventually("TLS Secret read", Duration::from_secs(10), || {
        tls(&app) == [("apps".to_owned(), "shop-cert".to_owned())]
    })
    .await;
    let https = || {
        app.config.borrow().objects("Gateway").any(|o| {
            o.spec.to_json()["servers"].as_array().is_some_and(|s| s.iter().any(|s| s["port"]["number"] == json!(443)))
        })
    };
    eventually("HTTPS server in the Gateway", Duration::from_secs(10), https).await;
    app.stop().await;
}
