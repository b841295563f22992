//! Randomized bursts against a real Consul (`MESHBRIDGE_CONSUL_BIN`): after
//! every burst of Consul operations sent back to back, meshbridge's view of
//! every service (its admin API) must equal what Consul answers, well
//! within the periodic refresh, and no periodic sweep may have had to
//! correct anything (`meshbridge_registry_drift_corrected_total` stays 0).
//!
//! The world: 8 catalog nodes (127.0.1.x, registered through the catalog
//! API, so no agent touches them) and up to 24 services. The operations are
//! the ones rollouts, autoscalers and agents make: instances registered,
//! re-registered (port, own address, weight, meta) and deregistered;
//! service and node checks flipping between passing, warning and critical;
//! node address, tagged address and meta changes; whole nodes leaving and
//! coming back; `/v1/txn` transactions that register and deregister
//! instances in several services at once; and instances registered through
//! the agent, with TTL checks passing, warning and failing.
//!
//! Seeded: the seed is printed first, and `MESHBRIDGE_CONVERGENCE_SEED`
//! replays it; `MESHBRIDGE_CONVERGENCE_BURSTS` sets the number of bursts
//! (100 by default, the long run uses 2,000).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::convergence::{AdminView, Bursts, Rng, Truth, endpoint};
use serde_json::{Value, json};

/// Longer than a burst's deadline, so that a periodic sweep seldom lands
/// inside one, and short enough that some run during the test and one
/// after it, so that a change the detectors missed shows up as drift if
/// not as a divergence.
const REFRESH: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(3);
const NODES: usize = 8;
const SERVICES: usize = 24;
const REGISTRY: &str = "c";
/// The anti-entropy pass runs all through the bursts: every difference it
/// finds must be one the detectors already delivered, so the drift counter
/// still has to stay 0 (a repair here is a false one, or a real miss).
const ANTI_ENTROPY: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
struct Instance {
    service: String,
    node: usize,
    port: u16,
    /// Empty: the node's address is used.
    address: String,
    weight: u32,
    version: u32,
    /// `None`: no check.
    check: Option<&'static str>,
}

/// What the test has written, to choose operations that make sense. The
/// truth compared against is always read back from Consul.
struct World {
    consul: Consul,
    http: reqwest::Client,
    /// Node addresses; `None`: the node is gone.
    nodes: Vec<Option<String>>,
    instances: BTreeMap<String, Instance>,
    /// Instances registered through the agent: ID -> service.
    agent: BTreeMap<String, String>,
    next_id: u64,
    next_addr: u8,
}

const STATUSES: [&str; 3] = ["passing", "warning", "critical"];

impl World {
    fn node_name(i: usize) -> String {
        format!("node-{i}")
    }

    async fn put(&self, path: &str, body: Value) {
        let mut req = self.http.put(format!("{}{path}", self.consul.url()));
        if !body.is_null() {
            req = req.json(&body);
        }
        let resp = req.send().await.expect(path);
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "PUT {path} {body}: {status}: {text}");
    }

    fn service_def(id: &str, i: &Instance) -> Value {
        json!({
            "ID": id, "Service": i.service, "Port": i.port, "Address": i.address,
            "Weights": {"Passing": i.weight, "Warning": 1},
            "Meta": {"version": format!("v{}", i.version)},
        })
    }

    /// Register (or re-register) `id` with its check, on a node that exists.
    async fn register(&mut self, id: &str, inst: Instance) {
        let node = Self::node_name(inst.node);
        let address = self.nodes[inst.node].clone().expect("a live node");
        let mut entry = json!({
            "Node": node, "Address": address, "SkipNodeUpdate": true,
            "Service": Self::service_def(id, &inst),
        });
        if let Some(status) = inst.check {
            entry["Check"] = json!({"CheckID": format!("chk-{id}"), "Name": "c", "ServiceID": id, "Status": status});
        }
        self.put("/v1/catalog/register", entry).await;
        self.instances.insert(id.to_string(), inst);
    }

    fn new_instance(&mut self, rng: &mut Rng, service: String) -> Option<(String, Instance)> {
        let live: Vec<usize> = (0..NODES).filter(|n| self.nodes[*n].is_some()).collect();
        let node = *rng.pick(&live)?;
        self.next_id += 1;
        let inst = Instance {
            service,
            node,
            port: 20000 + rng.below(20000) as u16,
            address: if rng.chance(0.5) { String::new() } else { self.fresh_address() },
            weight: 1 + rng.below(5) as u32,
            version: 1,
            check: if rng.chance(0.7) { Some("passing") } else { None },
        };
        Some((format!("i{}", self.next_id), inst))
    }

    fn fresh_address(&mut self) -> String {
        self.next_addr = self.next_addr.wrapping_add(1).max(1);
        format!("127.0.2.{}", self.next_addr)
    }

    /// One random operation, applied; returns what it did.
    async fn step(&mut self, rng: &mut Rng) -> String {
        let ids: Vec<String> = self.instances.keys().cloned().collect();
        let kind = rng.below(100);
        match kind {
            // Register an instance, often in a new service.
            0..=24 => {
                let service = format!("svc-{}", rng.below(SERVICES as u64));
                let Some((id, inst)) = self.new_instance(rng, service) else { return "no live node".into() };
                let what = format!("register {id} {}@node-{} :{}", inst.service, inst.node, inst.port);
                self.register(&id, inst).await;
                what
            }
            25..=41 if !ids.is_empty() => {
                let id = rng.pick(&ids).unwrap().clone();
                let inst = self.instances.remove(&id).unwrap();
                let node = Self::node_name(inst.node);
                self.put("/v1/catalog/deregister", json!({"Node": node, "ServiceID": id})).await;
                format!("deregister {id} ({})", inst.service)
            }
            // Re-register with another port, address, weight or meta.
            42..=54 if !ids.is_empty() => {
                let id = rng.pick(&ids).unwrap().clone();
                let mut inst = self.instances[&id].clone();
                let what = match rng.below(4) {
                    0 => {
                        inst.port = 20000 + rng.below(20000) as u16;
                        "port"
                    }
                    1 => {
                        inst.address = if inst.address.is_empty() { self.fresh_address() } else { String::new() };
                        "address"
                    }
                    2 => {
                        inst.weight = 1 + (inst.weight % 5);
                        "weight"
                    }
                    _ => {
                        inst.version += 1;
                        "meta"
                    }
                };
                self.register(&id, inst).await;
                format!("re-register {id} ({what})")
            }
            // A service check flips.
            55..=69 if !ids.is_empty() => {
                let id = rng.pick(&ids).unwrap().clone();
                let mut inst = self.instances[&id].clone();
                let status = *rng.pick(&STATUSES).unwrap();
                inst.check = Some(status);
                self.register(&id, inst).await;
                format!("check {id} {status}")
            }
            // A node check flips (every instance on the node).
            70..=74 => {
                let n = rng.below(NODES as u64) as usize;
                let Some(address) = self.nodes[n].clone() else { return "node check on a gone node".into() };
                let status = *rng.pick(&STATUSES).unwrap();
                let check = json!({"CheckID": "node-health", "Name": "node", "Status": status});
                let entry =
                    json!({"Node": Self::node_name(n), "Address": address, "SkipNodeUpdate": true, "Check": check});
                self.put("/v1/catalog/register", entry).await;
                format!("node-{n} check {status}")
            }
            // The node's address, tagged addresses or meta change.
            75..=84 => {
                let n = rng.below(NODES as u64) as usize;
                if self.nodes[n].is_none() {
                    return "node change on a gone node".into();
                }
                let address = if rng.chance(0.6) { self.fresh_address() } else { self.nodes[n].clone().unwrap() };
                self.nodes[n] = Some(address.clone());
                let meta = json!({"rack": format!("r{}", rng.below(100))});
                let tagged = json!({"lan": address, "wan": format!("127.0.3.{}", rng.below(250) + 1)});
                let entry = json!({"Node": Self::node_name(n), "Address": address, "NodeMeta": meta, "TaggedAddresses": tagged});
                self.put("/v1/catalog/register", entry).await;
                format!("node-{n} address {address} (meta, tagged)")
            }
            // A transaction across services.
            85..=93 => {
                let mut ops = Vec::new();
                let mut what = Vec::new();
                for _ in 0..2 + rng.below(3) {
                    if !self.instances.is_empty() && rng.chance(0.3) {
                        let ids: Vec<String> = self.instances.keys().cloned().collect();
                        let id = rng.pick(&ids).unwrap().clone();
                        let inst = self.instances.remove(&id).unwrap();
                        let node = Self::node_name(inst.node);
                        let def = json!({"ID": id, "Service": inst.service});
                        ops.push(json!({"Service": {"Verb": "delete", "Node": node, "Service": def}}));
                        what.push(format!("-{id}"));
                    } else {
                        let service = format!("svc-{}", rng.below(SERVICES as u64));
                        let Some((id, mut inst)) = self.new_instance(rng, service) else { break };
                        // A transaction's service has no check of its own.
                        inst.check = None;
                        let node = Self::node_name(inst.node);
                        ops.push(
                            json!({"Service": {"Verb": "set", "Node": node, "Service": Self::service_def(&id, &inst)}}),
                        );
                        what.push(format!("+{id}({})", inst.service));
                        self.instances.insert(id, inst);
                    }
                }
                if ops.is_empty() {
                    return "empty txn".into();
                }
                self.put("/v1/txn", Value::Array(ops)).await;
                format!("txn {}", what.join(" "))
            }
            // Through the agent: an instance with a TTL check on the agent's
            // own node (synced to the catalog by anti-entropy), its TTL
            // flipping, or its deregistration.
            94..=96 => {
                let agent_ids: Vec<String> = self.agent.keys().cloned().collect();
                match rng.below(3) {
                    0 => {
                        self.next_id += 1;
                        let id = format!("a{}", self.next_id);
                        let service = format!("svc-{}", rng.below(SERVICES as u64));
                        let port = 20000 + rng.below(20000) as u16;
                        let def = json!({"ID": id, "Name": service, "Port": port, "Meta": {"version": "v1"},
                            "Check": {"CheckID": format!("ttl-{id}"), "TTL": "600s", "Status": "passing"}});
                        self.put("/v1/agent/service/register", def).await;
                        self.agent.insert(id.clone(), service.clone());
                        format!("agent register {id} ({service})")
                    }
                    1 if !agent_ids.is_empty() => {
                        let id = rng.pick(&agent_ids).unwrap().clone();
                        let verb = *rng.pick(&["pass", "warn", "fail"]).unwrap();
                        self.put(&format!("/v1/agent/check/{verb}/ttl-{id}"), Value::Null).await;
                        format!("agent ttl {id} {verb}")
                    }
                    _ if !agent_ids.is_empty() => {
                        let id = rng.pick(&agent_ids).unwrap().clone();
                        self.put(&format!("/v1/agent/service/deregister/{id}"), Value::Null).await;
                        self.agent.remove(&id);
                        format!("agent deregister {id}")
                    }
                    _ => "no agent instance".into(),
                }
            }
            // A whole node leaves (taking its instances and checks), or comes back.
            97..=99 => {
                let n = rng.below(NODES as u64) as usize;
                match self.nodes[n].clone() {
                    Some(_) if rng.chance(0.5) => {
                        self.put("/v1/catalog/deregister", json!({"Node": Self::node_name(n)})).await;
                        self.nodes[n] = None;
                        self.instances.retain(|_, i| i.node != n);
                        format!("node-{n} deregistered")
                    }
                    Some(_) => "node stays".into(),
                    None => {
                        let address = self.fresh_address();
                        self.put("/v1/catalog/register", json!({"Node": Self::node_name(n), "Address": address})).await;
                        self.nodes[n] = Some(address.clone());
                        format!("node-{n} back at {address}")
                    }
                }
            }
            _ => "nothing to change".into(),
        }
    }

    /// Consul's truth: every service but `consul`, with the instances whose
    /// every check passes, at the service's address or else the node's.
    async fn truth(&self) -> Truth {
        let url = |path: &str| format!("{}{path}", self.consul.url());
        let names: BTreeMap<String, Value> =
            self.http.get(url("/v1/catalog/services")).send().await.unwrap().json().await.unwrap();
        let mut truth = Truth::new();
        for name in names.keys().filter(|n| *n != "consul") {
            let entries: Vec<Value> =
                self.http.get(url(&format!("/v1/health/service/{name}"))).send().await.unwrap().json().await.unwrap();
            let mut endpoints: Vec<String> = entries
                .iter()
                .filter(|e| e["Checks"].as_array().is_none_or(|c| c.iter().all(|c| c["Status"] == "passing")))
                .map(|e| {
                    let s = &e["Service"];
                    let own = s["Address"].as_str().unwrap_or("");
                    let address = if own.is_empty() { e["Node"]["Address"].as_str().unwrap_or("") } else { own };
                    let weight = s["Weights"]["Passing"].as_u64().unwrap_or(1);
                    let version = s["Meta"]["version"].as_str().unwrap_or("");
                    endpoint(address, s["Port"].as_u64().unwrap_or(0), weight, &[("version", version)])
                })
                .collect();
            endpoints.sort();
            truth.insert(format!("{name}.dc1.consul"), endpoints);
        }
        truth
    }
}

async fn start_meshbridge(consul: &Consul, dir: &std::path::Path) -> App {
    let bridge = format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: consul
      name: {REGISTRY}
      domain: 127.0.0.1
      port: {port}
      consulDatacenter: dc1
      consulRefreshInterval: {refresh}
"#,
        port = consul.http_port,
        refresh = REFRESH.as_nanos(),
    );
    std::fs::write(dir.join("mcpbridge.yaml"), bridge).unwrap();
    let args = RunArgs::loopback(dir).with_min_refresh_interval(REFRESH).with_anti_entropy_interval(ANTI_ENTROPY);
    App::start(args).await.expect("start meshbridge")
}

#[tokio::test]
async fn consul_bursts_converge_without_the_refresh() {
    let consul = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
    let mut bursts = Bursts::from_env("consul");
    let mut rng = bursts.rng();
    let mut world = World {
        consul,
        http: reqwest::Client::new(),
        nodes: (0..NODES).map(|n| Some(format!("127.0.1.{}", n + 1))).collect(),
        instances: BTreeMap::new(),
        agent: BTreeMap::new(),
        next_id: 0,
        next_addr: 0,
    };
    for n in 0..NODES {
        let address = world.nodes[n].clone().unwrap();
        world.put("/v1/catalog/register", json!({"Node": World::node_name(n), "Address": address})).await;
    }
    // 16 services with 3 instances each to begin with.
    for s in 0..16 {
        for _ in 0..3 {
            let (id, inst) = world.new_instance(&mut rng, format!("svc-{s}")).unwrap();
            world.register(&id, inst).await;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let app = start_meshbridge(&world.consul, dir.path()).await;
    let view = AdminView::new(&app, REGISTRY, &["version"]);
    bursts.converge("initial sync", &view, || world.truth(), Duration::from_secs(20)).await;

    while let Some(n) = bursts.next() {
        let size = 1 + rng.below(6) as usize;
        let mut ops = Vec::with_capacity(size);
        let sent = Instant::now();
        for _ in 0..size {
            ops.push(world.step(&mut rng).await);
        }
        bursts.applied(size);
        let what = format!("burst {n} ({:?} to send): {}", sent.elapsed(), ops.join("; "));
        bursts.converge(&what, &view, || world.truth(), DEADLINE).await;
    }
    bursts.report();
    // One more periodic sweep, over what the last bursts changed.
    view.wait_for_full_read(REFRESH * 3).await;
    view.assert_no_drift().await;
}
