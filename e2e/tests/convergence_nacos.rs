//! Issue 24: randomized bursts against rnacos (`MESHBRIDGE_RNACOS_BIN`)
//! and Nacos 3.1.0 (`MESHBRIDGE_NACOS_SERVER_JAR`, one server for this
//! binary, a namespace per test), watched by meshbridge in-process, once
//! over gRPC (`type: nacos2`, our own client, pushes) and once over HTTP
//! (`type: nacos`, the 1.x open API); after each burst meshbridge's view of
//! every service (admin API) must equal the server's instance lists, read
//! directly.
//!
//! Operations, 1–8 a burst, back to back, over 14 services: instances
//! registered and deregistered, ephemeral or persistent (on Nacos by
//! service: it refuses to mix them); weight and metadata
//! (`rev`) edits; `enabled` flips; whole services emptied (their every
//! instance deregistered) and filled again. Ten services keep one anchor
//! instance that is never touched, so they stay listed; the other four come
//! and go as whole services. On Nacos also `healthy` flips (a register
//! again with the flag turned), which rnacos ignores (an instance turns
//! unhealthy there only when its heartbeats stop, and rnacos does not push
//! that change; see `nacos_registry.rs`). Ephemeral instances never turn
//! unhealthy during a run: an hour of heartbeat timeout on rnacos, health
//! checks off on Nacos.
//!
//! - gRPC: `nacosRefreshInterval` 300 s, so no refresh can hide a miss: an
//!   instance change is pushed; a service that appears is found by the
//!   health probe (every 500 ms) and then read: the 4 s deadline allows for
//!   the server's push delay (rnacos batches about a second) or the probe,
//!   and a loaded machine.
//!   The periodic full read (`--anti-entropy-interval` 5 s) runs through
//!   the bursts; any service it corrected would count in
//!   `meshbridge_registry_drift_corrected_total`, asserted 0.
//! - HTTP: converges only at its polling interval, by design (no pushes in
//!   the 1.x API): a 1 s refresh and a 3 s deadline.
//!
//! Seeded: see `meshbridge_e2e::convergence`. Needs
//! `source e2e/env.sh rnacos nacos-server`.

use std::time::Duration;

use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::convergence::{self, AdminView, Options, REV, Registry, Rng, Truth, endpoint_rev};
use meshbridge_e2e::nacos::{self, Flavor, Instance};
use meshbridge_e2e::nacos_server::Target;
use serde_json::Value;

/// The anti-entropy pass runs through the bursts (the full read of every
/// service, judged): against a real server it must correct nothing.
const ANTI_ENTROPY: Duration = Duration::from_secs(5);

const SERVICES: usize = 14;
/// Services 0..ANCHORED keep an anchor instance; the rest come and go.
const ANCHORED: usize = 10;
fn service(i: usize) -> String {
    format!("conv-svc{i}")
}

/// Nacos (2.x and later) keeps a service's instances all ephemeral or all
/// persistent, and refuses the other kind (`400 … is persistent service,
/// can't register ephemeral instance`): on Nacos the odd services are
/// ephemeral (their anchors too), the even ones persistent.
fn ephemeral_service(i: usize) -> bool {
    i % 2 == 1
}

#[derive(Debug)]
enum Op {
    Register(Instance),
    Deregister(Instance),
    /// Weight and `rev` metadata.
    Edit(Instance),
    Enabled(Instance),
    EmptyService(usize),
    /// Registered again with `healthy` turned (Nacos only).
    Healthy(Instance),
}

struct Nacos {
    server: Target,
    /// What the test registered (anchors excluded).
    instances: Vec<Instance>,
    next_port: u16,
    rev: u64,
}

impl Nacos {
    fn instance(&mut self, rng: &mut Rng) -> Instance {
        self.next_port += 1;
        let s = rng.index(SERVICES);
        let mut i = self.server.instance(&service(s), "127.0.0.1", self.next_port);
        i.ephemeral = match self.server.flavor {
            Flavor::Rnacos => rng.chance(0.5),
            Flavor::Nacos => ephemeral_service(s),
        };
        // rnacos applies only a weight other than 1 on update: start at 1,
        // edits pick 2..9.
        self.with_rev(i, rng)
    }

    fn with_rev(&mut self, i: Instance, rng: &mut Rng) -> Instance {
        self.rev += 1;
        let _ = rng;
        i.meta("rev", &self.rev.to_string())
    }
}

impl Registry for Nacos {
    type Op = Op;

    fn next_op(&mut self, rng: &mut Rng) -> Op {
        loop {
            let pick = |s: &Nacos, rng: &mut Rng| s.instances[rng.index(s.instances.len())].clone();
            let flips = self.server.flavor == Flavor::Nacos;
            return match rng.index(13) {
                0..=3 => Op::Register(self.instance(rng)),
                4..=5 if !self.instances.is_empty() => Op::Deregister(pick(self, rng)),
                6..=8 if !self.instances.is_empty() => {
                    let mut i = pick(self, rng);
                    i.weight = rng.range(2, 9) as f64;
                    Op::Edit(self.with_rev(i, rng))
                }
                9..=10 if !self.instances.is_empty() => {
                    let mut i = pick(self, rng);
                    i.enabled = !i.enabled;
                    Op::Enabled(i)
                }
                11 => Op::EmptyService(rng.index(SERVICES)),
                12 if flips && !self.instances.is_empty() => {
                    let mut i = pick(self, rng);
                    i.healthy = !i.healthy;
                    Op::Healthy(i)
                }
                _ => continue,
            };
        }
    }

    async fn apply(&mut self, op: &Op) -> anyhow::Result<()> {
        let same = |a: &Instance, b: &Instance| a.service == b.service && a.port == b.port;
        match op {
            Op::Register(i) => {
                self.server.register(i).await?;
                self.instances.push(i.clone());
            }
            Op::Deregister(i) => {
                self.server.deregister(i).await?;
                self.instances.retain(|x| !same(x, i));
            }
            Op::Edit(i) | Op::Enabled(i) => {
                self.server.update(i).await?;
                for x in self.instances.iter_mut().filter(|x| same(x, i)) {
                    *x = i.clone();
                }
            }
            Op::Healthy(i) => {
                self.server.register(i).await?;
                for x in self.instances.iter_mut().filter(|x| same(x, i)) {
                    *x = i.clone();
                }
            }
            Op::EmptyService(s) => {
                let name = service(*s);
                for i in self.instances.iter().filter(|i| i.service == name) {
                    self.server.deregister(i).await?;
                }
                self.instances.retain(|i| i.service != name);
            }
        }
        Ok(())
    }

    async fn truth(&mut self) -> anyhow::Result<Truth> {
        let mut truth = Truth::new();
        for s in (0..SERVICES).map(service) {
            let text = self.server.instances(&s, "DEFAULT_GROUP", &self.server.namespace).await?;
            let list: Value = serde_json::from_str(&text)?;
            for i in list["hosts"].as_array().into_iter().flatten() {
                let on = |k: &str| i[k].as_bool().unwrap_or(true);
                if !on("healthy") || !on("enabled") {
                    continue;
                }
                let weight = i["weight"].as_f64().unwrap_or(1.0).round().max(1.0) as u32;
                let (ip, port) = (i["ip"].as_str().unwrap_or_default(), i["port"].as_u64().unwrap_or(0) as u16);
                convergence::push(
                    &mut truth,
                    &self.server.host(&s, "DEFAULT_GROUP"),
                    endpoint_rev(ip, port, weight, i["metadata"]["rev"].as_str()),
                );
            }
        }
        Ok(convergence::non_empty(truth))
    }
}

async fn start(flavor: Flavor, kind: &str, refresh: Duration) -> (Nacos, App, tempfile::TempDir) {
    // An hour of heartbeat timeout: ephemeral instances stay healthy unbeaten.
    let opts = nacos::Options { heartbeat_timeout: Some(Duration::from_secs(3600)), ..nacos::Options::default() };
    let server = Target::start(flavor, opts).await.expect("start the server");
    for s in 0..ANCHORED {
        let mut anchor = server.instance(&service(s), "127.0.0.2", 40000 + s as u16).meta("rev", "anchor");
        anchor.ephemeral = flavor == Flavor::Nacos && ephemeral_service(s);
        server.register(&anchor).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let bridge = format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: {kind}
      name: nacos
      domain: 127.0.0.1
      port: {port}
      nacosNamespaceId: {namespace}
      nacosRefreshInterval: {nanos}
"#,
        port = server.http_port,
        namespace = server.namespace,
        nanos = refresh.as_nanos()
    );
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    let args =
        RunArgs::loopback(dir.path()).with_min_refresh_interval(refresh).with_anti_entropy_interval(ANTI_ENTROPY);
    let app = App::start(args).await.expect("start meshbridge");
    (Nacos { server, instances: Vec::new(), next_port: 30000, rev: 0 }, app, dir)
}

async fn grpc_bursts_converge(flavor: Flavor) {
    let (mut registry, app, _dir) = start(flavor, "nacos2", Duration::from_secs(300)).await;
    let mut view = AdminView::new(&app, "nacos", &[REV]);
    let what = if flavor == Flavor::Nacos { "nacos3-grpc" } else { "nacos2-grpc" };
    let opts = Options::new(what, Duration::from_secs(8));
    convergence::run(&mut registry, &mut view, &opts).await;
}

async fn http_bursts_converge_at_the_polling_interval(flavor: Flavor) {
    let refresh = Duration::from_secs(1);
    let (mut registry, app, _dir) = start(flavor, "nacos", refresh).await;
    let mut view = AdminView::new(&app, "nacos", &[REV]);
    let what = if flavor == Flavor::Nacos { "nacos3-http" } else { "nacos-http" };
    let opts = Options::new(what, refresh * 3);
    convergence::run(&mut registry, &mut view, &opts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_grpc_bursts_converge() {
    grpc_bursts_converge(Flavor::Rnacos).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_http_bursts_converge_at_the_polling_interval() {
    http_bursts_converge_at_the_polling_interval(Flavor::Rnacos).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos3_grpc_bursts_converge() {
    grpc_bursts_converge(Flavor::Nacos).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos3_http_bursts_converge_at_the_polling_interval() {
    http_bursts_converge_at_the_polling_interval(Flavor::Nacos).await;
}

/// Issue 34: two registries that share every service, as during a
/// migration: namespace A of the server over gRPC (`nacos2`) and namespace
/// B over HTTP (`nacos`), both under `nacosNamespace: shop`, so each service
/// is one host. Bursts go to either side; after each, the ServiceEntries
/// meshbridge publishes (the merged view istiod and Envoy get) must hold
/// the union of both sides' truths, endpoint for endpoint, an instance on
/// both sides once. The sides share anchors and pick ports from the same
/// range, so double registrations come and go all through the run.
struct Shared {
    grpc: Nacos,
    http: Nacos,
}

/// `svc.DEFAULT-GROUP.<namespace>.nacos` → `svc.DEFAULT-GROUP.shop.nacos`.
fn shop_host(host: &str) -> String {
    let mut parts = host.splitn(3, '.');
    let (service, group) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    format!("{service}.{group}.shop.nacos")
}

impl Registry for Shared {
    /// `true`: the gRPC side.
    type Op = (bool, Op);

    fn next_op(&mut self, rng: &mut Rng) -> (bool, Op) {
        let grpc = rng.chance(0.5);
        let op = if grpc { self.grpc.next_op(rng) } else { self.http.next_op(rng) };
        (grpc, op)
    }

    async fn apply(&mut self, (grpc, op): &(bool, Op)) -> anyhow::Result<()> {
        if *grpc { self.grpc.apply(op).await } else { self.http.apply(op).await }
    }

    async fn truth(&mut self) -> anyhow::Result<Truth> {
        // Merge order is (priority, type, name): `nacos` (HTTP) before
        // `nacos2`. An instance both list (the anchors, and ports both
        // sides picked) is served once, as the first lists it.
        let mut union = Truth::new();
        for side in [self.http.truth().await?, self.grpc.truth().await?] {
            for (host, endpoints) in side {
                let merged = union.entry(shop_host(&host)).or_default();
                for e in endpoints {
                    let addr = |e: &str| e.split(' ').next().unwrap_or_default().to_string();
                    if !merged.iter().any(|m| addr(m) == addr(&e)) {
                        merged.push(e);
                    }
                }
            }
        }
        for endpoints in union.values_mut() {
            endpoints.sort();
        }
        Ok(union)
    }
}

/// The published ServiceEntries of `*.shop.nacos`, as [`Truth`]; drift is
/// both registries' repairs.
struct Merged<'a> {
    app: &'a App,
    views: [AdminView; 2],
}

impl convergence::View for Merged<'_> {
    async fn read(&mut self) -> anyhow::Result<Truth> {
        use meshbridge::translate::model::Spec;
        let published = self.app.config.borrow().clone();
        let mut truth = Truth::new();
        for obj in published.set.istio.values() {
            let Spec::ServiceEntry(se) = &obj.spec else { continue };
            let Some(host) = se.hosts.first().filter(|h| h.ends_with(".shop.nacos")) else { continue };
            let endpoints = truth.entry(host.clone()).or_default();
            for ep in &se.endpoints {
                let port = ep.ports.values().next().copied().unwrap_or_default();
                let port = u16::try_from(port).unwrap_or_default();
                endpoints.push(endpoint_rev(&ep.address, port, ep.weight, ep.labels.get(REV).map(String::as_str)));
            }
            endpoints.sort();
        }
        Ok(truth)
    }

    async fn drift(&mut self) -> anyhow::Result<u64> {
        let mut total = 0;
        for v in &mut self.views {
            total += convergence::View::drift(v).await?;
        }
        Ok(total)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos3_bursts_on_two_registries_sharing_services_converge_to_the_union() {
    let opts = nacos::Options { heartbeat_timeout: Some(Duration::from_secs(3600)), ..nacos::Options::default() };
    let mut sides = Vec::new();
    for _ in 0..2 {
        let server = Target::start(Flavor::Nacos, opts.clone()).await.expect("start the server");
        for s in 0..ANCHORED {
            let mut anchor = server.instance(&service(s), "127.0.0.2", 40000 + s as u16).meta("rev", "anchor");
            anchor.ephemeral = ephemeral_service(s);
            server.register(&anchor).await.unwrap();
        }
        sides.push(Nacos { server, instances: Vec::new(), next_port: 30000, rev: 0 });
    }
    let http = sides.pop().unwrap();
    let grpc = sides.pop().unwrap();
    let refresh = Duration::from_secs(1);
    let entry = |kind: &str, name: &str, side: &Nacos| {
        format!(
            "{{type: {kind}, name: {name}, domain: 127.0.0.1, port: {port}, nacosNamespaceId: {ns}, \
             nacosNamespace: shop, nacosRefreshInterval: {nanos}}}",
            port = side.server.http_port,
            ns = side.server.namespace,
            nanos = refresh.as_nanos()
        )
    };
    let bridge = meshbridge_e2e::traffic::mcpbridge(&[entry("nacos2", "grpc", &grpc), entry("nacos", "http", &http)]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    let args =
        RunArgs::loopback(dir.path()).with_min_refresh_interval(refresh).with_anti_entropy_interval(ANTI_ENTROPY);
    let app = App::start(args).await.expect("start meshbridge");
    let mut view =
        Merged { app: &app, views: [AdminView::new(&app, "grpc", &[REV]), AdminView::new(&app, "http", &[REV])] };
    let mut registry = Shared { grpc, http };
    // The HTTP side converges at its 1 s polling interval; the gRPC side's
    // new services are found by its 500 ms probe.
    let opts = Options::new("nacos3-shared", Duration::from_secs(4));
    convergence::run(&mut registry, &mut view, &opts).await;
}
