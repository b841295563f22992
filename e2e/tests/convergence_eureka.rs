//! Issue 24: randomized bursts against a real Spring Cloud Netflix Eureka
//! server (`meshbridge_e2e::eureka`, `MESHBRIDGE_EUREKA_SERVER_JAR`),
//! through its REST API, watched by the Eureka watcher run alone under a
//! `Recorder`; after each burst the services it sent must equal the
//! server's `/eureka/apps`, read over HTTP (UP instances by `status`, the
//! server's verdict after its override rules).
//!
//! Operations, 1–8 a burst, back to back, over 12 apps: instances
//! registered and cancelled, status set to UP, DOWN, OUT_OF_SERVICE or
//! STARTING, metadata edits (a re-registration with a new `rev`), and whole
//! apps cancelled.
//!
//! The watcher polls: one `/eureka/apps/delta` per interval, applied to its
//! copy and checked against the delta's reconcile hashcode; McpBridge has no
//! field for the interval (10 s), so the watcher runs alone with a 250 ms
//! one. What bounds convergence: the server answers reads from its
//! read-write response cache, which every change invalidates (the
//! read-only cache, refreshed every 30 s by default, is off in the test
//! app), and keeps changes in its delta queue for 3 minutes; so a burst
//! shows in the next delta, one interval plus one request after its last
//! operation. Except that a read racing a change can leave its older
//! answer in that cache (Guava stores a load that an invalidation
//! overtook) until the next change or the entry's expiry, 180 s by
//! default and 1 s in the test app. The deadline, 3 s, is the interval plus
//! that second, with room for a JVM pause on a loaded 2-core machine. With
//! deltas alone, never a full fetch after the first. A full fetch forced by
//! a hashcode mismatch (a delta missed or misapplied) reports its
//! corrections as drift, asserted 0 at the end. The anti-entropy pass
//! (a full read before a delta, compared with the copy; no snapshot) runs
//! every second through the bursts: against a real server, with its
//! response cache, it must correct nothing either.
//!
//! Seeded: see `meshbridge_e2e::convergence`.

use std::time::Duration;

use meshbridge_e2e::convergence::{self, Options, RecorderView, Registry, Rng, Truth, endpoint};
use meshbridge_e2e::eureka::{self, EurekaServer, instances_of};
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::eureka::EurekaWatcher;
use meshbridge_registries::{RegistryKind, RegistrySpec};
use serde_json::{Value, json};

const APPS: usize = 12;
const INTERVAL: Duration = Duration::from_millis(250);
/// The endpoint label each test sets and compares.
const LABELS: [&str; 1] = ["rev"];

/// One endpoint as the harness writes it.
fn ep(address: &str, port: u16, weight: u32, rev: Option<&str>) -> String {
    let labels: Vec<(&str, &str)> = rev.map(|r| (LABELS[0], r)).into_iter().collect();
    endpoint(address, port.into(), weight.into(), &labels)
}
const STATUSES: [&str; 4] = ["UP", "DOWN", "OUT_OF_SERVICE", "STARTING"];

fn app(i: usize) -> String {
    format!("CONV-APP{i}")
}

#[derive(Debug, Clone)]
struct Inst {
    app: String,
    id: String,
    port: u16,
    status: &'static str,
    rev: u64,
}

impl Inst {
    fn body(&self) -> Value {
        let mut v = eureka::instance(&self.app, &self.id, "127.0.0.1", self.port, self.status);
        v["metadata"] = json!({"rev": self.rev.to_string()});
        v
    }
}

#[derive(Debug)]
enum Op {
    Register(Inst),
    Cancel {
        app: String,
        id: String,
    },
    Status {
        app: String,
        id: String,
        status: &'static str,
    },
    /// A re-registration with new metadata.
    Metadata(Inst),
    CancelApp(String),
}

struct Eureka {
    server: EurekaServer,
    instances: Vec<Inst>,
    next: u16,
}

impl Registry for Eureka {
    type Op = Op;

    fn next_op(&mut self, rng: &mut Rng) -> Op {
        loop {
            let pick = |s: &Eureka, rng: &mut Rng| s.instances[rng.index(s.instances.len())].clone();
            return match rng.index(12) {
                0..=3 => {
                    self.next += 1;
                    let (app, id) = (app(rng.index(APPS)), format!("i-{}", self.next));
                    let status = if rng.chance(0.8) { "UP" } else { *rng.pick(&STATUSES).expect("not empty") };
                    Op::Register(Inst { app, id, port: 30000 + self.next, status, rev: rng.index(1000) as u64 })
                }
                4..=5 if !self.instances.is_empty() => {
                    let i = pick(self, rng);
                    Op::Cancel { app: i.app, id: i.id }
                }
                6..=8 if !self.instances.is_empty() => {
                    let i = pick(self, rng);
                    Op::Status { app: i.app, id: i.id, status: rng.pick(&STATUSES).expect("not empty") }
                }
                9..=10 if !self.instances.is_empty() => {
                    let mut i = pick(self, rng);
                    i.rev = rng.index(1000) as u64;
                    Op::Metadata(i)
                }
                11 => Op::CancelApp(app(rng.index(APPS))),
                _ => continue,
            };
        }
    }

    async fn apply(&mut self, op: &Op) -> anyhow::Result<()> {
        tracing::debug!(?op, "apply");
        match op {
            Op::Register(i) | Op::Metadata(i) => {
                self.server.api.register(i.body()).await?;
                self.instances.retain(|x| x.id != i.id);
                self.instances.push(i.clone());
            }
            Op::Cancel { app, id } => {
                self.server.api.deregister(app, id).await?;
                self.instances.retain(|x| &x.id != id);
            }
            Op::Status { app, id, status } => {
                self.server.api.set_status(app, id, status).await?;
                for x in self.instances.iter_mut().filter(|x| &x.id == id) {
                    x.status = status;
                }
            }
            Op::CancelApp(app) => {
                for i in self.instances.iter().filter(|i| &i.app == app) {
                    self.server.api.deregister(&i.app, &i.id).await?;
                }
                self.instances.retain(|i| &i.app != app);
            }
        }
        Ok(())
    }

    async fn truth(&mut self) -> anyhow::Result<Truth> {
        let apps = self.server.api.apps().await?;
        let mut truth = Truth::new();
        for (name, i) in instances_of(&apps) {
            if i["status"] != "UP" || i["port"]["@enabled"] != "true" {
                continue;
            }
            let host = format!("{}.eureka", name.to_lowercase().replace('_', "-"));
            let (ip, port) = (i["ipAddr"].as_str().unwrap_or_default(), i["port"]["$"].as_u64().unwrap_or(0) as u16);
            convergence::push(&mut truth, &host, ep(ip, port, 1, i["metadata"]["rev"].as_str()));
        }
        Ok(convergence::non_empty(truth))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eureka_bursts_converge_by_deltas() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    }
    let server = EurekaServer::start().await.expect("start the Eureka server (source e2e/env.sh eureka-server)");
    let mut spec = RegistrySpec::new(RegistryKind::Eureka, "eureka-conv", server.host_port(), 8761);
    spec.anti_entropy_interval = Some(Duration::from_secs(1));
    let watcher = EurekaWatcher::new(spec).expect("valid spec").with_interval(INTERVAL);
    let mut view = RecorderView::new(Recorder::start(Box::new(watcher), Duration::from_secs(10)), &LABELS);
    let mut registry = Eureka { server, instances: Vec::new(), next: 0 };
    let opts = Options::new("eureka", Duration::from_secs(3));
    convergence::run(&mut registry, &mut view, &opts).await;
    // Every full fetch is a snapshot.
    let full_fetches = view.recorder.snapshots_since(0);
    assert_eq!(full_fetches, 1, "every burst converged by deltas alone: only the first fetch is a full one");
}
