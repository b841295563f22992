//! The Helm chart (`deploy/helm/meshbridge`) with REAL helm
//! (`e2e/setup.sh helm`, `src/helm.rs`): it renders what the kustomization
//! (`deploy/kubernetes`) renders, so the two cannot drift apart; each value
//! lands where it should and gives flags meshbridge accepts; and it
//! installs on a REAL kube-apiserver (`src/apiserver.rs`), where meshbridge
//! runs with the chart's flags as the chart's ServiceAccount.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use clap::Parser;
use meshbridge::kube::KubeArgs;
use meshbridge::run::{Cli, Command, GatewayArgs};
use meshbridge_e2e::apiserver::{ApiServer, launch_meshbridge, repo};
use meshbridge_e2e::captured_logs;
use meshbridge_e2e::helm::{Helm, chart, key, objects};
use meshbridge_e2e::process::{binary_from_env, stdout_of};
use serde_json::{Value, json};

const NS: &str = "meshbridge-system";

/// `helm template meshbridge CHART -n meshbridge-system --include-crds ARGS`.
async fn template(helm: &Helm, args: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut all = vec!["template", "meshbridge", chart.to_str().unwrap(), "-n", NS, "--include-crds"];
    all.extend_from_slice(args);
    objects(&helm.run(&all).await.unwrap()).unwrap()
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let mut of_kind = objects.iter().filter(|o| o["kind"] == kind);
    let found = of_kind.next().unwrap_or_else(|| panic!("no {kind} in {:?}", keys(objects)));
    assert!(of_kind.next().is_none(), "more than one {kind}");
    found
}

fn keys(objects: &[Value]) -> BTreeSet<String> {
    objects.iter().map(key).collect()
}

/// meshbridge's own parse of a container's args.
fn parse_args(container: &Value) -> KubeArgs {
    let args = container["args"].as_array().expect("args").iter().map(|a| a.as_str().unwrap().to_owned());
    let cli = Cli::try_parse_from(std::iter::once("meshbridge".to_owned()).chain(args))
        .unwrap_or_else(|e| panic!("meshbridge refuses the chart's args {}: {e}", container["args"]));
    let Command::Run(run) = cli.command else { panic!("not run") };
    run.kube
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)
}

/// An object without what the chart adds for Helm's sake: its labels
/// (`helm.sh/chart`, `app.kubernetes.io/managed-by`, ...) and the
/// `app.kubernetes.io/instance` label in selectors, which tells releases
/// apart.
fn comparable(mut object: Value) -> Value {
    fn strip_instance(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.remove("app.kubernetes.io/instance");
                map.values_mut().for_each(strip_instance);
            }
            Value::Array(items) => items.iter_mut().for_each(strip_instance),
            _ => {}
        }
    }
    if let Some(m) = object["metadata"].as_object_mut() {
        m.remove("labels");
    }
    strip_instance(&mut object);
    object
}

#[test]
fn the_chart_crd_is_the_kustomization_crd() {
    let kustomize = std::fs::read(repo().join("deploy/kubernetes/crd-mcpbridge.yaml")).unwrap();
    let chart = std::fs::read(chart().join("crds/crd-mcpbridge.yaml")).unwrap();
    assert!(
        kustomize == chart,
        "deploy/helm/meshbridge/crds/crd-mcpbridge.yaml differs from deploy/kubernetes/crd-mcpbridge.yaml: \
         copy it over (cp deploy/kubernetes/crd-mcpbridge.yaml deploy/helm/meshbridge/crds/)"
    );
}

/// With default values the chart renders the kustomization's objects, field
/// for field, but for Helm's labels, the release's selector label, the
/// Namespace (`helm install --create-namespace` makes it) and the admin
/// token Secret (the chart makes it; the kustomization expects one made by
/// hand, with the same name and key).
#[tokio::test]
async fn helm_template_renders_the_kustomization() {
    let helm = Helm::new().unwrap();
    let kubectl = binary_from_env("MESHBRIDGE_KUBECTL_BIN").unwrap();
    let chart = chart();
    helm.run(&["lint", "--strict", chart.to_str().unwrap()]).await.unwrap();
    let rendered = template(&helm, &[]).await;
    let mut kustomize = tokio::process::Command::new(&kubectl);
    kustomize.args(["kustomize", &repo().join("deploy/kubernetes").to_string_lossy()]);
    let kustomized = objects(&stdout_of(kustomize, "kubectl kustomize").await.unwrap()).unwrap();

    let mut expected = keys(&kustomized);
    assert!(expected.remove("Namespace meshbridge-system"), "{expected:?}");
    expected.insert("Secret meshbridge-system/meshbridge-admin".into());
    assert_eq!(keys(&rendered), expected, "objects the chart renders (left), the kustomization's (right)");

    // The parts that matter most, each with its own message.
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(find(&rendered, kind)["rules"], find(&kustomized, kind)["rules"], "{kind} rules");
    }
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        let (c, k) = (find(&rendered, kind), find(&kustomized, kind));
        assert_eq!((&c["roleRef"], &c["subjects"]), (&k["roleRef"], &k["subjects"]), "{kind}");
    }
    let (chart_deployment, kustomize_deployment) = (find(&rendered, "Deployment"), find(&kustomized, "Deployment"));
    assert_eq!(container(chart_deployment)["args"], container(kustomize_deployment)["args"], "container args");
    // Then every object whole.
    for object in &kustomized {
        let Some(ours) = rendered.iter().find(|o| key(o) == key(object)) else { continue };
        assert_eq!(comparable(ours.clone()), comparable(object.clone()), "{}", key(object));
    }
    // The release label is in the chart's selectors, and they select the pods.
    let selector = &chart_deployment["spec"]["selector"]["matchLabels"];
    assert_eq!(selector["app.kubernetes.io/instance"], "meshbridge");
    for (k, v) in selector.as_object().unwrap() {
        assert_eq!(&chart_deployment["spec"]["template"]["metadata"]["labels"][k], v, "pod label {k}");
        assert_eq!(&find(&rendered, "Service")["spec"]["selector"][k], v, "Service selector {k}");
    }

    // The Secret the Deployment reads: that name and key, a random token.
    let secret = find(&rendered, "Secret");
    let token_ref = &env(container(chart_deployment), "MESHBRIDGE_ADMIN_TOKEN").unwrap()["valueFrom"]["secretKeyRef"];
    assert_eq!(token_ref, &json!({"name": "meshbridge-admin", "key": "token"}));
    assert_eq!(secret["data"].as_object().unwrap().keys().collect::<Vec<_>>(), ["token"]);
    let again = template(&helm, &[]).await;
    assert_ne!(find(&again, "Secret")["data"], secret["data"], "the same token twice");
}

/// Every value away from its default (`e2e/fixtures/helm-values-all.yaml`,
/// which CI also lints and validates) lands where it should, and the
/// flags it gives are ones meshbridge accepts and reads that way.
#[tokio::test]
async fn helm_values_land_where_they_should() {
    let helm = Helm::new().unwrap();
    let values = repo().join("e2e/fixtures/helm-values-all.yaml");
    let values = values.to_str().unwrap();
    helm.run(&["lint", "--strict", chart().to_str().unwrap(), "-f", values]).await.unwrap();
    let rendered = template(&helm, &["-f", values]).await;
    assert_eq!(
        keys(&rendered),
        BTreeSet::from(
            [
                "ClusterRole mesh",
                "ClusterRoleBinding mesh",
                "CustomResourceDefinition mcpbridges.networking.higress.io",
                "Deployment meshbridge-system/mesh",
                "McpBridge mesh-config/default",
                "Role mesh-config/mesh",
                "RoleBinding mesh-config/mesh",
                "Role apps/mesh-secrets",
                "RoleBinding apps/mesh-secrets",
                "Role shop/mesh-secrets",
                "RoleBinding shop/mesh-secrets",
                "Service meshbridge-system/mesh",
                "ServiceAccount meshbridge-system/mesh-sa",
            ]
            .map(String::from)
        ),
        "no Secret (existingSecret), no PodDisruptionBudget, no NetworkPolicy"
    );
    // Secrets: `get` only, in the namespaces named, never cluster-wide.
    for role in rendered.iter().filter(|o| o["kind"] == "Role" && o["metadata"]["name"] == "mesh-secrets") {
        assert_eq!(role["rules"], json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]));
    }
    let cluster_role = rendered.iter().find(|o| o["kind"] == "ClusterRole").unwrap();
    assert!(!cluster_role["rules"].to_string().contains("secrets"), "{cluster_role}");
    let deployment = find(&rendered, "Deployment");
    let pod = &deployment["spec"]["template"];
    let c = container(deployment);
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        (&c["image"], &c["imagePullPolicy"]),
        (&json!("registry.example.com/meshbridge:0.1.0"), &json!("Always"))
    );
    assert_eq!(pod["spec"]["imagePullSecrets"], json!([{"name": "registry-pull"}]));
    assert_eq!(pod["spec"]["serviceAccountName"], "mesh-sa");
    assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 40);
    assert_eq!(pod["spec"]["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["spec"]["tolerations"][0]["key"], "dedicated");
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
        1
    );
    assert!(pod["spec"]["topologySpreadConstraints"].is_null());
    assert_eq!(pod["metadata"]["annotations"], json!({"example.com/team": "mesh"}));
    assert_eq!(pod["metadata"]["labels"]["example.com/tier"], "control");
    assert_eq!(c["resources"], json!({"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}));
    let value = |name: &str| env(c, name).map(|e| e["value"].clone());
    assert_eq!(value("MESHBRIDGE_LOG_FORMAT"), Some(json!("text")));
    assert_eq!(value("MESHBRIDGE_DRAIN"), Some(json!("25s")));
    assert_eq!(value("RUST_LOG"), Some(json!("info")));
    assert_eq!(value("MESHBRIDGE_XDS_TLS_CERT"), Some(json!("/etc/meshbridge/xds/tls.crt")));
    assert_eq!(value("MESHBRIDGE_XDS_CLIENT_CERT_OPTIONAL"), None);
    assert_eq!(
        env(c, "MESHBRIDGE_ADMIN_TOKEN").unwrap()["valueFrom"]["secretKeyRef"],
        json!({"name": "my-admin", "key": "admin-token"})
    );
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    assert!(
        volumes.contains(&json!({"name": "xds-tls", "secret": {"secretName": "meshbridge-xds-tls"}})),
        "{volumes:?}"
    );

    let kube = parse_args(c);
    assert_eq!(kube.namespace, "mesh-config");
    assert_eq!(kube.watch_namespace.as_deref(), Some("apps"));
    assert_eq!(kube.leader_elect, Some(true));
    assert_eq!(kube.leader_lease, "mesh-leader");
    assert_eq!(
        (kube.leader_lease_duration, kube.leader_renew_deadline, kube.leader_retry_period),
        (Duration::from_secs(20), Duration::from_secs(12), Duration::from_secs(3))
    );
    assert!(kube.all_mcpbridges, "extraArgs");

    let service = find(&rendered, "Service");
    let ports: Vec<_> =
        service["spec"]["ports"].as_array().unwrap().iter().map(|p| (&p["port"], &p["targetPort"])).collect();
    assert_eq!(ports, [(&json!(15010), &json!("grpc-xds")), (&json!(9888), &json!("http-admin"))]);
    let bindings = rendered.iter().filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding");
    for binding in bindings {
        assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": "mesh-sa", "namespace": NS}]));
    }
    let bridge = find(&rendered, "McpBridge");
    assert_eq!(bridge["spec"]["registries"][1]["domain"], "10.0.0.1:80,10.0.0.2:80");
    assert_eq!(bridge["spec"]["proxies"][0]["name"], "egress");

    // Leader election off is said explicitly (it is on by default in a pod).
    let off = template(&helm, &["--set", "leaderElection.enabled=false", "--set", "replicaCount=1"]).await;
    assert_eq!(parse_args(container(find(&off, "Deployment"))).leader_elect, Some(false));
}

/// `helm install` on a real API server (no `--wait`: nothing runs pods),
/// every object the chart renders stored, meshbridge running with the
/// stored Deployment's args as the chart's ServiceAccount (a TokenRequest
/// token) and writing status on the McpBridge the chart made; an upgrade
/// keeps the admin token, and an uninstall leaves only the CRD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_the_chart_on_a_real_api_server() {
    let helm = Helm::new().unwrap();
    let api = ApiServer::start().await.unwrap();
    api.kubectl(&["create", "namespace", "higress-system"]).await.unwrap();
    let values = json!({"mcpBridge": {"create": true, "registries": [
        {"type": "static", "name": "helm-a", "domain": "10.0.9.1:80,10.0.9.2:80", "port": 80}]}});
    let values = helm.values_file("install.yaml", &values).unwrap();
    let (kubeconfig, values) = (api.admin_kubeconfig.to_str().unwrap(), values.to_str().unwrap());
    let chart = chart();
    let release = ["meshbridge", chart.to_str().unwrap(), "-n", NS, "--kubeconfig", kubeconfig, "-f", values];
    let out = helm.run(&[&["install", "--create-namespace"][..], &release[..]].concat()).await.unwrap();
    assert!(out.contains("STATUS: deployed"), "{out}");

    // What helm installed is what it renders, and it is all stored.
    let manifest =
        objects(&helm.run(&["get", "manifest", "meshbridge", "-n", NS, "--kubeconfig", kubeconfig]).await.unwrap())
            .unwrap();
    let rendered = template(&helm, &["-f", values]).await;
    let mut installed = keys(&manifest);
    installed.insert("CustomResourceDefinition mcpbridges.networking.higress.io".into());
    assert_eq!(installed, keys(&rendered));
    for object in &rendered {
        let (kind, name) = (object["kind"].as_str().unwrap(), object["metadata"]["name"].as_str().unwrap());
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or("default");
        let stored =
            api.get(kind, namespace, name).await.unwrap().unwrap_or_else(|| panic!("{} not stored", key(object)));
        match kind {
            "ClusterRole" | "Role" => assert_eq!(stored["rules"], object["rules"], "{}", key(object)),
            "Deployment" => assert_eq!(container(&stored)["args"], container(object)["args"]),
            // Nothing pruned by the CRD.
            "McpBridge" => assert_eq!(stored["spec"], object["spec"]),
            _ => {}
        }
    }
    let token = |secret: &Value| secret["data"]["token"].as_str().unwrap().to_owned();
    let secret = api.get("secret", NS, "meshbridge-admin").await.unwrap().unwrap();
    assert_eq!(token(&secret).len(), 44, "32 characters, base64: {}", token(&secret).len());

    // meshbridge with the chart's flags, as the chart's ServiceAccount.
    let deployment = api.get("deployment", NS, "meshbridge").await.unwrap().unwrap();
    let sa = deployment["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap().to_owned();
    let sa_kubeconfig = api.service_account_kubeconfig(NS, &sa).await.unwrap();
    let kube = KubeArgs {
        kubeconfig: Some(sa_kubeconfig),
        leader_identity: Some("meshbridge-pod-1".into()),
        status_interval: Duration::from_millis(300),
        ..parse_args(container(&deployment))
    };
    captured_logs::logs();
    let app = launch_meshbridge(kube, GatewayArgs::default()).await.expect("start meshbridge");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let bridge = api.get("mcpbridge", "higress-system", "default").await.unwrap().unwrap();
        let ready = bridge["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .is_some_and(|c| c["status"] == "True");
        if ready && bridge["status"]["registries"][0]["endpoints"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no Ready status from meshbridge: {}", bridge["status"]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lease = api.get("lease", "higress-system", "meshbridge").await.unwrap().expect("the Lease");
    assert_eq!(lease["spec"]["holderIdentity"], "meshbridge-pod-1");
    app.stop().await;

    // An upgrade keeps the token the install made (lookup), so running
    // pods and their clients keep working.
    let out = helm.run(&[&["upgrade"][..], &release[..]].concat()).await.unwrap();
    assert!(out.contains("REVISION: 2"), "{out}");
    let after = api.get("secret", NS, "meshbridge-admin").await.unwrap().unwrap();
    assert_eq!(token(&after), token(&secret), "the upgrade changed the admin token");

    // Helm never deletes what crds/ installed; everything else goes.
    helm.run(&["uninstall", "meshbridge", "-n", NS, "--kubeconfig", kubeconfig]).await.unwrap();
    assert!(api.get("deployment", NS, "meshbridge").await.unwrap().is_none(), "Deployment left");
    assert!(api.get("clusterrole", "default", "meshbridge").await.unwrap().is_none(), "ClusterRole left");
    assert!(api.get("mcpbridge", "higress-system", "default").await.unwrap().is_none(), "McpBridge left");
    assert!(api.get("crd", "default", "mcpbridges.networking.higress.io").await.unwrap().is_some(), "CRD removed");
}
