//! The standalone gateway routes Ingresses to Kubernetes Services (issue 35),
//! on a REAL kube-apiserver and etcd (`src/apiserver.rs`) with meshbridge
//! as the shipped ServiceAccount, through a real Envoy.
//!
//! The API server runs no kubelet and no controller manager, so the test
//! writes each Service's EndpointSlices itself, as the EndpointSlice
//! controller would: one slice per set of resolved target ports, labelled
//! `kubernetes.io/service-name`, with the `ready`/`serving`/`terminating`
//! conditions a pod goes through. The API server refuses loopback
//! addresses in a slice, so each "pod" is a backend in a network namespace
//! of its own that this test makes (`src/netns.rs`, needs root), reached at
//! an address in 198.18.0.0/15.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use meshbridge::kube::KubeArgs;
use meshbridge::run::{App, GatewayArgs};
use meshbridge_e2e::apiserver::{ApiServer, launch_meshbridge};
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::netns::Netns;
use meshbridge_e2e::traffic::{sample, wait_for_traffic};
use serde_json::{Value, json};

const NS: &str = "shop";
/// The cluster of Service `web`'s port 8080.
const WEB: &str = "outbound|8080||web.shop.svc.cluster.local";
/// How long Envoy may take to follow a slice change (issue 35).
const FOLLOW: Duration = Duration::from_secs(1);

/// A pod: a backend answering its name, alone in a network namespace.
struct Pod {
    backend: Backend,
    _ns: Netns,
}

impl Pod {
    /// Listen on `port` (0: any) at the namespace's address.
    fn start(name: &str, port: u16) -> Pod {
        let ns = Netns::create().expect("a network namespace (needs root)");
        let ip = ns.host().ip;
        let listener = ns.run(|| std::net::TcpListener::bind((ip, port))).unwrap().expect("bind in the namespace");
        Pod { backend: Backend::on(listener, name).unwrap(), _ns: ns }
    }

    fn ip(&self) -> String {
        self.backend.addr.ip().to_string()
    }

    fn port(&self) -> u16 {
        self.backend.addr.port()
    }

    fn member(&self) -> String {
        self.backend.addr.to_string()
    }
}

/// Where a pod is in its life, as the slice's conditions say.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Ready,
    NotReady,
    /// Being deleted, still serving: not ready, serving, terminating.
    Terminating,
}

fn conditions(phase: Phase) -> Value {
    match phase {
        Phase::Ready => json!({"ready": true, "serving": true, "terminating": false}),
        Phase::NotReady => json!({"ready": false, "serving": false, "terminating": false}),
        Phase::Terminating => json!({"ready": false, "serving": true, "terminating": true}),
    }
}

/// An EndpointSlice of Service `service` as the controller writes it.
fn slice(name: &str, service: &str, ports: &[(&str, u16)], endpoints: &[(&Pod, Phase)]) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {
            "kubernetes.io/service-name": service,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
        "endpoints": endpoints.iter().map(|(pod, phase)| json!({
            "addresses": [pod.ip()], "conditions": conditions(*phase),
            "targetRef": {"kind": "Pod", "namespace": NS, "name": pod.backend.name},
        })).collect::<Vec<_>>(),
    })
}

/// A Service whose ports each name their pods' port by name.
fn service(name: &str, ports: &[(&str, u16, &str)]) -> String {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"app": name}, "ports": ports.iter().map(|(n, p, target)| json!({
            "name": n, "port": p, "targetPort": target, "protocol": "TCP"})).collect::<Vec<_>>()},
    })
    .to_string()
}

struct Cluster {
    api: ApiServer,
    slices: Api<EndpointSlice>,
}

impl Cluster {
    async fn start() -> Cluster {
        let api = ApiServer::start().await.unwrap();
        api.install_shipped().await.unwrap();
        api.kubectl(&["create", "namespace", NS]).await.unwrap();
        let args = KubeArgs { kubeconfig: Some(api.admin_kubeconfig.clone()), ..KubeArgs::default() };
        let client = meshbridge::kube::client(&args).await.unwrap();
        Cluster { slices: Api::namespaced(client, NS), api }
    }

    /// Write a slice (server-side apply, as the controller's own manager).
    async fn put(&self, slice: Value) {
        let name = slice["metadata"]["name"].as_str().unwrap().to_owned();
        let params = PatchParams::apply("endpointslice-controller.k8s.io").force();
        self.slices.patch(&name, &params, &Patch::Apply(&slice)).await.unwrap();
    }

    async fn delete(&self, name: &str) {
        self.slices.delete(name, &DeleteParams::default()).await.unwrap();
    }

    /// meshbridge as the shipped ServiceAccount, its gateway on Envoy.
    async fn gateway(&self) -> (App, Envoy) {
        let kubeconfig = self.api.service_account_kubeconfig("meshbridge-system", "meshbridge").await.unwrap();
        let kube =
            KubeArgs { kube: true, leader_elect: Some(false), kubeconfig: Some(kubeconfig), ..KubeArgs::default() };
        let port = free_port();
        let gateway = GatewayArgs { gateway_http_port: vec![port], ..GatewayArgs::default() };
        let app = launch_meshbridge(kube, gateway).await.expect("start meshbridge");
        let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, port).await.expect("start envoy");
        (app, envoy)
    }
}

/// An Ingress with one path, `/`, to `backend`.
fn ingress(name: &str, annotations: Value, backend: Value) -> String {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"ingressClassName": "higress", "rules": [{"http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": backend}]}}]},
    })
    .to_string()
}

fn web_backend() -> Value {
    json!({"service": {"name": "web", "port": {"number": 8080}}})
}

/// Poll Envoy's `/clusters` until `cluster`'s members are `want`; the time
/// from `since` (the write's answer) to then. Panics after [`FOLLOW`].
async fn follows(envoy: &Envoy, cluster: &str, want: &[&Pod], since: Instant, what: &str) -> Duration {
    let want: BTreeSet<String> = want.iter().map(|p| p.member()).collect();
    loop {
        let got = envoy.members(cluster).await;
        let took = since.elapsed();
        if got == want {
            println!("FIGURE kube_services slice change to Envoy ({what}): {} ms", took.as_millis());
            return took;
        }
        assert!(took < FOLLOW, "{what}: Envoy has {got:?} after {took:?}, want {want:?}\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An Ingress to a Service: traffic flows to its ready pods, and Envoy
/// follows each pod added, made not ready, made terminating and removed,
/// and a second slice whose pods resolve the named target port to another
/// number, each within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_to_a_service_follows_its_pods() {
    let cluster = Cluster::start().await;
    let a = Pod::start("pod-a", 0);
    // One slice holds the pods whose `web` port is the same number.
    let (b, c) = (Pod::start("pod-b", a.port()), Pod::start("pod-c", a.port()));
    // A pod whose `web` port is another number: its own slice.
    let d = Pod::start("pod-d", 0);
    assert_ne!(a.port(), d.port());
    cluster.api.apply(&service("web", &[("http", 8080, "web")])).await.unwrap();
    cluster.put(slice("web-abc", "web", &[("http", a.port())], &[(&a, Phase::Ready)])).await;
    cluster.api.apply(&ingress("shop", json!({}), web_backend())).await.unwrap();

    let (app, envoy) = cluster.gateway().await;
    wait_for_traffic(&envoy, 200, &["pod-a"], "an Ingress to a Service with one ready pod").await;

    let mut worst = Duration::ZERO;
    let mut step = async |endpoints: &[(&Pod, Phase)], want: &[&Pod], what: &str| {
        cluster.put(slice("web-abc", "web", &[("http", a.port())], endpoints)).await;
        let took = follows(&envoy, WEB, want, Instant::now(), what).await;
        worst = worst.max(took);
    };
    step(&[(&a, Phase::Ready), (&b, Phase::Ready)], &[&a, &b], "pod b added").await;
    step(&[(&a, Phase::Ready), (&b, Phase::NotReady)], &[&a], "pod b not ready").await;
    step(&[(&a, Phase::Ready), (&b, Phase::Ready), (&c, Phase::NotReady)], &[&a, &b], "pod b ready, c starting").await;
    step(&[(&a, Phase::Terminating), (&b, Phase::Ready), (&c, Phase::Ready)], &[&b, &c], "pod a terminating").await;
    step(&[(&b, Phase::Ready), (&c, Phase::Ready)], &[&b, &c], "pod a removed").await;
    wait_for_traffic(&envoy, 200, &["pod-b", "pod-c"], "pods b and c").await;

    // The named target port: pod d serves `web` on another number.
    let since = Instant::now();
    cluster.put(slice("web-d", "web", &[("http", d.port())], &[(&d, Phase::Ready)])).await;
    worst = worst.max(follows(&envoy, WEB, &[&b, &c, &d], since, "a second slice, another target port").await);
    wait_for_traffic(&envoy, 200, &["pod-b", "pod-c", "pod-d"], "both slices").await;

    let since = Instant::now();
    cluster.delete("web-abc").await;
    worst = worst.max(follows(&envoy, WEB, &[&d], since, "the first slice deleted").await);
    wait_for_traffic(&envoy, 200, &["pod-d"], "the second slice alone").await;
    println!("FIGURE kube_services slice change to Envoy, worst of 7: {} ms", worst.as_millis());

    // The Service goes: its cluster goes, and the route answers 503.
    cluster.api.kubectl(&["delete", "service", "web", "-n", NS]).await.unwrap();
    wait_for_traffic(&envoy, 503, &[], "the Service deleted").await;
    assert!(envoy.members(WEB).await.is_empty());
    app.stop().await;
}

/// A canary whose main backend is a Kubernetes Service and whose canary is
/// a registry service (a `static` registry on loopback): the header sends a
/// request to the canary, the weight splits the rest. Then an `ExternalName`
/// Service, which Envoy resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_canary_beside_a_service_main() {
    // Every log line of this binary, for the failure message below.
    meshbridge_e2e::captured_logs::logs();
    let cluster = Cluster::start().await;
    let pod = Pod::start("pod-main", 0);
    let canary = Backend::start("127.0.0.1", "vm-canary").await.unwrap();
    cluster.api.apply(&service("web", &[("http", 8080, "web")])).await.unwrap();
    cluster.put(slice("web-1", "web", &[("http", pod.port())], &[(&pod, Phase::Ready)])).await;
    let bridge = json!({
        "apiVersion": "networking.higress.io/v1", "kind": "McpBridge",
        "metadata": {"name": "default", "namespace": "higress-system"},
        "spec": {"registries": [{"type": "static", "name": "vm", "domain": canary.addr.to_string(), "port": 80}]},
    });
    cluster.api.apply(&bridge.to_string()).await.unwrap();
    cluster.api.apply(&ingress("shop", json!({}), web_backend())).await.unwrap();
    let mcp = json!({"resource": {"apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}});
    let canary_annotations = json!({
        "higress.io/destination": "vm.static:80",
        "higress.io/canary": "true",
        "higress.io/canary-by-header": "x-canary",
        "higress.io/canary-weight": "30",
    });
    cluster.api.apply(&ingress("shop-canary", canary_annotations, mcp)).await.unwrap();

    let (app, envoy) = cluster.gateway().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (statuses, bodies) = sample(&envoy, 60).await;
        if statuses == BTreeSet::from([200]) && bodies == BTreeSet::from(["pod-main".into(), "vm-canary".into()]) {
            break;
        }
        assert!(Instant::now() < deadline, "the 30/70 split: got {statuses:?} {bodies:?}\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for value in ["always", "never"] {
        let want = if value == "always" { "vm-canary" } else { "pod-main" };
        for _ in 0..20 {
            let (status, body) = envoy.get_with("/", "shop.example.com", &[("x-canary", value)]).await.unwrap();
            assert_eq!((status, body.as_str()), (200, want), "x-canary: {value}");
        }
    }
    // The Service's pod goes not ready: the main side has no endpoint, and
    // the canary keeps its share.
    cluster.put(slice("web-1", "web", &[("http", pod.port())], &[(&pod, Phase::NotReady)])).await;
    follows(&envoy, WEB, &[], Instant::now(), "the main side's only pod not ready").await;
    let (status, body) = envoy.get_with("/", "shop.example.com", &[("x-canary", "always")]).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "vm-canary"));

    // An ExternalName Service: Envoy resolves the name itself (a STRICT_DNS
    // cluster), on the Service's port. `localhost` is in /etc/hosts.
    let outside = Backend::start("127.0.0.1", "outside").await.unwrap();
    let port = outside.addr.port();
    let external = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "outside", "namespace": NS},
        "spec": {"type": "ExternalName", "externalName": "localhost", "ports": [{"name": "http", "port": port}]}});
    cluster.api.apply(&external.to_string()).await.unwrap();
    let to_outside = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "outside", "namespace": NS},
        "spec": {"ingressClassName": "higress", "rules": [{"host": "outside.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": "outside", "port": {"number": port}}}}]}}]},
    });
    cluster.api.apply(&to_outside.to_string()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = envoy.get_host("/", "outside.example.com").await.ok();
        if got.as_ref().is_some_and(|(status, body)| *status == 200 && body == "outside") {
            break;
        }
        if Instant::now() >= deadline {
            // What each side held, to tell a route never sent from one
            // sent but not applied, or a cluster still warming.
            let routes = envoy.admin("/config_dump?resource=dynamic_route_configs").await.unwrap_or_default();
            let clusters = envoy.admin("/clusters").await.unwrap_or_default();
            let outside: Vec<&str> = clusters.lines().filter(|l| l.contains("outside")).collect();
            let config = reqwest::get(format!("http://{}/v1/config", app.admin_addr)).await;
            let config = match config {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            // meshbridge's own lines about the Kubernetes watches (a watch
            // in backoff would hold the Ingress back).
            let logs = meshbridge_e2e::captured_logs::text();
            let kube: Vec<&str> =
                logs.lines().filter(|l| l.contains("kube_") || l.contains("WARN") || l.contains("outside")).collect();
            let kube = kube[kube.len().saturating_sub(40)..].join("\n");
            panic!(
                "ExternalName through Envoy: {got:?}\n--- Envoy's routes ---\n{routes:.6000}\n--- Envoy's clusters \
                 (outside) ---\n{outside:?}\n--- meshbridge /v1/config ---\n{config:.4000}\n--- meshbridge's \
                 kube lines ---\n{kube}\n--- Envoy ---\n{}",
                envoy.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dump = envoy.admin("/config_dump?resource=dynamic_active_clusters").await.unwrap();
    let cluster_name = format!("outbound|{port}||outside.shop.svc.cluster.local");
    let at = dump.find(&cluster_name).expect("the ExternalName cluster in Envoy");
    assert!(dump[at..].split("\"name\": \"outbound").next().unwrap().contains("STRICT_DNS"), "a DNS cluster");
    app.stop().await;
}
