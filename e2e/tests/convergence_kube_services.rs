//! Randomized, seeded bursts of EndpointSlice and Service changes on a REAL
//! kube-apiserver (`src/apiserver.rs`), written as the EndpointSlice
//! controller and users would write them, against meshbridge's Kubernetes
//! Service endpoints (issue 35); after each burst meshbridge's view of the
//! `kubernetes` pseudo-registry (its admin API) must equal the truth the
//! test computes from what the API server lists, and at the end a real
//! Envoy's EDS must too (`src/convergence.rs`).
//!
//! Operations: an endpoint added, removed, made ready, not ready or
//! terminating; a slice created, deleted, given another target port, or
//! relabelled to another Service (the controller moving it); a Service's
//! port renamed, so that its slices' ports no longer match by name; the
//! Ingress's reference to one Service dropped and restored. One Service has
//! two ports, each served on its own target port.
//!
//! Addresses are in 198.18.0.0/15 and nothing connects to them: Envoy only
//! learns them. `MESHBRIDGE_CONVERGENCE_SEED` / `_BURSTS` as in the other
//! convergence tests.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use meshbridge::kube::KubeArgs;
use meshbridge::run::GatewayArgs;
use meshbridge::translate::model::LABEL_SERVICE_PORT;
use meshbridge_e2e::apiserver::{ApiServer, launch_meshbridge};
use meshbridge_e2e::convergence::{self, AdminView, Options, Registry, Rng, Truth, View};
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use serde_json::{Value, json};

const NS: &str = "shop";
const SERVICE_LABEL: &str = "kubernetes.io/service-name";
/// The Services: `web0`/`web1`/`web3` with one port (`http` 80), `web2`
/// with two (`http` 80, `grpc` 9090). `web1`'s port name flips between
/// `http` and `web`; `web3` is referenced by the Ingress only at times.
const SERVICES: [&str; 4] = ["web0", "web1", "web2", "web3"];
const TWO_PORTS: &str = "web2";
const RENAMED: &str = "web1";
const SOMETIMES: &str = "web3";
/// Endpoint addresses per Service.
const POOL: u8 = 10;
const MANAGER: &str = "endpointslice-controller.k8s.io";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Ready,
    NotReady,
    Terminating,
}

#[derive(Clone)]
struct Slice {
    service: String,
    /// (name, target port).
    ports: Vec<(String, u16)>,
    endpoints: BTreeMap<String, Phase>,
}

/// What one operation writes.
enum Write {
    Slice(String, Value),
    DeleteSlice(String),
    Service(Value),
    Ingress(Value),
}

/// One operation: what it does (printed with a failing burst) and its write.
struct Op {
    what: String,
    write: Write,
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

/// The test's model of what it wrote, and the API it writes through.
struct Kube {
    client: Client,
    slices: BTreeMap<String, Slice>,
    next_slice: u32,
    /// `web1`'s port name now.
    renamed: bool,
    /// Whether the Ingress names `web3` now.
    sometimes: bool,
}

fn address(service: &str, n: u64) -> String {
    let i = SERVICES.iter().position(|s| *s == service).unwrap_or(0);
    format!("198.18.{}.{}", 100 + i, 1 + n)
}

/// A target port for a slice's port: `http` in 8000..8010, `grpc` in
/// 50000..50010, so that a two-port Service's ports never share one.
fn target(rng: &mut Rng, name: &str) -> u16 {
    let base = if name == "grpc" { 50000 } else { 8000 };
    base + rng.below(10) as u16
}

fn service_object(name: &str, renamed: bool) -> Value {
    let http = if name == RENAMED && renamed { "web" } else { "http" };
    let mut ports = vec![json!({"name": http, "port": 80, "targetPort": "http", "protocol": "TCP"})];
    if name == TWO_PORTS {
        ports.push(json!({"name": "grpc", "port": 9090, "targetPort": "grpc", "protocol": "TCP"}));
    }
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"app": name}, "ports": ports}})
}

fn ingress_object(sometimes: bool) -> Value {
    let paths: Vec<Value> = SERVICES
        .iter()
        .filter(|s| **s != SOMETIMES || sometimes)
        .map(|s| {
            json!({"path": format!("/{s}"), "pathType": "Prefix",
            "backend": {"service": {"name": s, "port": {"number": 80}}}})
        })
        .collect();
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "shop", "namespace": NS},
        "spec": {"ingressClassName": "higress", "rules": [{"http": {"paths": paths}}]}})
}

fn slice_object(name: &str, s: &Slice) -> Value {
    let conditions = |p: Phase| match p {
        Phase::Ready => json!({"ready": true, "serving": true, "terminating": false}),
        Phase::NotReady => json!({"ready": false, "serving": false, "terminating": false}),
        Phase::Terminating => json!({"ready": false, "serving": true, "terminating": true}),
    };
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {SERVICE_LABEL: s.service}},
        "addressType": "IPv4",
        "ports": s.ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
        "endpoints": s.endpoints.iter().map(|(ip, p)| json!({"addresses": [ip], "conditions": conditions(*p)}))
            .collect::<Vec<_>>(),
    })
}

fn phase(rng: &mut Rng) -> Phase {
    match rng.below(4) {
        0 => Phase::NotReady,
        1 => Phase::Terminating,
        _ => Phase::Ready,
    }
}

impl Kube {
    /// A new slice of `service` with 1..=3 endpoints.
    fn new_slice(&mut self, rng: &mut Rng, service: &str) -> (String, Slice) {
        self.next_slice += 1;
        let name = format!("{service}-{}", self.next_slice);
        let mut ports = vec![("http".to_owned(), target(rng, "http"))];
        if service == TWO_PORTS {
            ports.push(("grpc".to_owned(), target(rng, "grpc")));
        }
        let endpoints = (0..rng.range(1, 3)).map(|_| (address(service, rng.below(POOL.into())), phase(rng))).collect();
        (name, Slice { service: service.to_owned(), ports, endpoints })
    }

    fn put(&mut self, name: String, slice: Slice, what: String) -> Op {
        let write = Write::Slice(name.clone(), slice_object(&name, &slice));
        self.slices.insert(name, slice);
        Op { what, write }
    }

    fn service_names(&self) -> Vec<String> {
        SERVICES.iter().map(|s| s.to_string()).collect()
    }
}

impl Registry for Kube {
    type Op = Op;

    fn next_op(&mut self, rng: &mut Rng) -> Op {
        let names: Vec<String> = self.slices.keys().cloned().collect();
        let roll = rng.below(100);
        let Some(name) = rng.pick(&names).cloned().filter(|_| roll >= 12) else {
            // No slice to change, or 12 in 100: a new slice.
            let service = rng.pick(&self.service_names()).cloned().unwrap_or_default();
            let (name, slice) = self.new_slice(rng, &service);
            let what = format!("create slice {name} of {service}: {:?} {:?}", slice.ports, slice.endpoints);
            return self.put(name, slice, what);
        };
        let mut slice = self.slices[&name].clone();
        match roll {
            12..=21 => {
                self.slices.remove(&name);
                Op { what: format!("delete slice {name}"), write: Write::DeleteSlice(name) }
            }
            22..=28 => {
                let port = target(rng, "http");
                slice.ports[0].1 = port;
                self.put(name.clone(), slice, format!("slice {name}: http target port {port}"))
            }
            29..=33 => {
                // The two-port Service keeps two-port slices, and the others
                // one-port ones: relabel among the one-port Services.
                let others: Vec<&str> =
                    SERVICES.iter().copied().filter(|s| *s != TWO_PORTS && *s != slice.service).collect();
                if slice.service == TWO_PORTS {
                    return self.put(name.clone(), slice, format!("slice {name}: written again unchanged"));
                }
                let to = rng.pick(&others).copied().unwrap_or("web0").to_owned();
                let what = format!("slice {name}: relabelled from {} to {to}", slice.service);
                slice.service = to;
                self.put(name, slice, what)
            }
            34..=38 => {
                self.renamed = !self.renamed;
                let what = format!("Service {RENAMED}: port 80 renamed {}", if self.renamed { "web" } else { "http" });
                Op { what, write: Write::Service(service_object(RENAMED, self.renamed)) }
            }
            39..=42 => {
                self.sometimes = !self.sometimes;
                let what = format!("Ingress: {SOMETIMES} {}", if self.sometimes { "referenced" } else { "dropped" });
                Op { what, write: Write::Ingress(ingress_object(self.sometimes)) }
            }
            43..=57 if !slice.endpoints.is_empty() => {
                let ips: Vec<String> = slice.endpoints.keys().cloned().collect();
                let ip = rng.pick(&ips).cloned().unwrap_or_default();
                slice.endpoints.remove(&ip);
                self.put(name.clone(), slice, format!("slice {name}: {ip} removed"))
            }
            _ => {
                let ip = address(&slice.service, rng.below(POOL.into()));
                let p = phase(rng);
                slice.endpoints.insert(ip.clone(), p);
                self.put(name.clone(), slice, format!("slice {name}: {ip} {p:?}"))
            }
        }
    }

    async fn apply(&mut self, op: &Op) -> anyhow::Result<()> {
        let params = PatchParams::apply(MANAGER).force();
        match &op.write {
            Write::Slice(name, object) => {
                Api::<EndpointSlice>::namespaced(self.client.clone(), NS)
                    .patch(name, &params, &Patch::Apply(object))
                    .await?;
            }
            Write::DeleteSlice(name) => {
                Api::<EndpointSlice>::namespaced(self.client.clone(), NS)
                    .delete(name, &DeleteParams::default())
                    .await?;
            }
            Write::Service(object) => {
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                Api::<KubeService>::namespaced(self.client.clone(), NS)
                    .patch(name, &params, &Patch::Apply(object))
                    .await?;
            }
            Write::Ingress(object) => {
                Api::<Ingress>::namespaced(self.client.clone(), NS)
                    .patch("shop", &params, &Patch::Apply(object))
                    .await?;
            }
        }
        Ok(())
    }

    /// From what the API server lists, the way kube-proxy reads it: the
    /// Ingress's Service backends; each one's TCP ports; each of its slices'
    /// ports matched by name; endpoints whose `ready` is not false and that
    /// are not `terminating`; a Service with several ports labels each
    /// endpoint with its port.
    async fn truth(&mut self) -> anyhow::Result<Truth> {
        let ingress = Api::<Ingress>::namespaced(self.client.clone(), NS).get("shop").await?;
        let referenced: BTreeSet<String> = ingress
            .spec
            .iter()
            .flat_map(|s| s.rules.iter().flatten())
            .flat_map(|r| r.http.iter().flat_map(|h| h.paths.iter()))
            .filter_map(|p| Some(p.backend.service.as_ref()?.name.clone()))
            .collect();
        let services = Api::<KubeService>::namespaced(self.client.clone(), NS).list(&ListParams::default()).await?;
        let slices = Api::<EndpointSlice>::namespaced(self.client.clone(), NS)
            .list(&ListParams::default().labels(SERVICE_LABEL))
            .await?;
        let mut truth = Truth::new();
        for svc in services.items.iter().filter(|s| referenced.contains(&s.name_any())) {
            let ports: Vec<(String, i32)> = svc
                .spec
                .iter()
                .flat_map(|s| s.ports.iter().flatten())
                .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
                .map(|p| (p.name.clone().unwrap_or_default(), p.port))
                .collect();
            let host = format!("{}.{NS}.svc.cluster.local", svc.name_any());
            let mut endpoints = BTreeSet::new();
            for slice in slices.items.iter().filter(|s| s.labels().get(SERVICE_LABEL) == Some(&svc.name_any())) {
                for sp in slice.ports.iter().flatten() {
                    let Some((_, number)) = ports.iter().find(|(n, _)| Some(n) == sp.name.as_ref()) else { continue };
                    let label = number.to_string();
                    let labels: Vec<(&str, &str)> =
                        if ports.len() > 1 { vec![(LABEL_SERVICE_PORT, &label)] } else { Vec::new() };
                    for ep in &slice.endpoints {
                        let c = ep.conditions.as_ref();
                        let ready = c.and_then(|c| c.ready).unwrap_or(true);
                        let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
                        if ready && !terminating {
                            let port = sp.port.unwrap_or_default() as u64;
                            endpoints.insert(convergence::endpoint(&ep.addresses[0], port, 1, &labels));
                        }
                    }
                }
            }
            truth.insert(host, endpoints.into_iter().collect());
        }
        Ok(convergence::non_empty(truth))
    }
}

/// meshbridge's view through its admin API. The Kubernetes source has no
/// periodic full read of its own to count repairs with: its watches relist
/// on any gap (kube-rs `watcher`), so drift is 0 by construction here.
struct KubeView(AdminView);

impl View for KubeView {
    async fn read(&mut self) -> anyhow::Result<Truth> {
        self.0.read().await
    }

    async fn drift(&mut self) -> anyhow::Result<u64> {
        Ok(0)
    }
}

fn cluster_host(cluster: &str) -> Option<String> {
    let host = cluster.strip_prefix("outbound|")?.split('|').nth(2)?;
    host.ends_with(".svc.cluster.local").then(|| host.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_service_bursts_converge() {
    let api = ApiServer::start().await.unwrap();
    api.install_shipped().await.unwrap();
    api.kubectl(&["create", "namespace", NS]).await.unwrap();
    let admin = KubeArgs { kubeconfig: Some(api.admin_kubeconfig.clone()), ..KubeArgs::default() };
    let client = meshbridge::kube::client(&admin).await.unwrap();
    let mut kube = Kube { client, slices: BTreeMap::new(), next_slice: 0, renamed: false, sometimes: true };
    for s in SERVICES {
        kube.apply(&Op { what: String::new(), write: Write::Service(service_object(s, false)) }).await.unwrap();
    }
    kube.apply(&Op { what: String::new(), write: Write::Ingress(ingress_object(true)) }).await.unwrap();
    // A first slice for every Service, all ready.
    let mut rng = Rng::new(1);
    for s in SERVICES {
        let (name, mut slice) = kube.new_slice(&mut rng, s);
        slice.endpoints.values_mut().for_each(|p| *p = Phase::Ready);
        let op = kube.put(name, slice, String::new());
        kube.apply(&op).await.unwrap();
    }

    let args = KubeArgs { kube: true, leader_elect: Some(false), ..admin };
    let app = launch_meshbridge(args, GatewayArgs::default()).await.expect("start meshbridge");
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, "outbound|80||web0.shop.svc.cluster.local")
        .await
        .expect("start envoy");
    // The startup gate holds the gateway's first config until every
    // registry has answered (30 s at most): the Services' pseudo-registry
    // answers once its namespaces are listed, well before that.
    let initial = kube.truth().await.unwrap();
    if let Err(e) = convergence::envoy_converges(&envoy, &initial, cluster_host, Duration::from_secs(10)).await {
        panic!("the initial Services never reached Envoy (held at startup?):\n{e}");
    }
    let mut view = KubeView(AdminView::new(&app, "kubernetes", &[LABEL_SERVICE_PORT]));
    let opts = Options::new("kubernetes-services", Duration::from_secs(3));
    let last = convergence::run(&mut kube, &mut view, &opts).await;
    match convergence::envoy_converges(&envoy, &last, cluster_host, Duration::from_secs(20)).await {
        Ok(took) => {
            println!("FIGURE convergence kubernetes-services envoy_eds_after_last_burst_ms={}", took.as_millis())
        }
        Err(e) => panic!("{e}"),
    }
    app.stop().await;
}
