//! Issue 24: randomized bursts against the *fake* Eureka server
//! (`meshbridge_e2e::eureka_fake`: the registry, deltas with their recent
//! change queue and reconcile hashcode; no real Eureka exists in the suite
//! yet), watched by the Eureka watcher run alone under a `Recorder`; after
//! each burst the services it sent must equal the fake's `/eureka/apps`,
//! read over HTTP.
//!
//! Operations, 1–8 a burst, back to back, over 12 apps: instances
//! registered and cancelled, status set to UP, DOWN, OUT_OF_SERVICE or
//! STARTING, metadata edits (a re-registration with a new `rev`), and whole
//! apps cancelled.
//!
//! The watcher polls: one `/eureka/apps/delta` per interval, applied to its
//! copy and checked against the delta's reconcile hashcode; McpBridge has no
//! field for the interval (10 s), so the watcher runs alone with a 250 ms
//! one, and each burst must converge within 1.5 s (a few polls): with deltas
//! alone, never a full fetch. A full fetch forced by a hashcode mismatch (a
//! delta missed or misapplied) reports its corrections as drift, asserted 0
//! at the end.
//!
//! Seeded: see `meshbridge_e2e::convergence`.

use std::time::Duration;

use meshbridge_e2e::convergence::{self, Options, RecorderView, Registry, Rng, Truth, endpoint};
use meshbridge_e2e::eureka_fake::{self, EurekaFake};
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
        let mut v = eureka_fake::instance(&self.app, &self.id, "127.0.0.1", self.port, self.status);
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
    fake: EurekaFake,
    http: reqwest::Client,
    instances: Vec<Inst>,
    next: u16,
    /// `GET /eureka/apps` made by [`Eureka::truth`], not the watcher.
    truth_reads: usize,
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
        match op {
            Op::Register(i) | Op::Metadata(i) => {
                self.fake.register(i.body()).await?;
                self.instances.retain(|x| x.id != i.id);
                self.instances.push(i.clone());
            }
            Op::Cancel { app, id } => {
                self.fake.deregister(app, id).await?;
                self.instances.retain(|x| &x.id != id);
            }
            Op::Status { app, id, status } => {
                self.fake.set_status(app, id, status).await?;
                for x in self.instances.iter_mut().filter(|x| &x.id == id) {
                    x.status = status;
                }
            }
            Op::CancelApp(app) => {
                for i in self.instances.iter().filter(|i| &i.app == app) {
                    self.fake.deregister(&i.app, &i.id).await?;
                }
                self.instances.retain(|i| &i.app != app);
            }
        }
        Ok(())
    }

    async fn truth(&mut self) -> anyhow::Result<Truth> {
        self.truth_reads += 1;
        let url = format!("http://{}/eureka/apps", self.fake.host_port());
        let body: Value = self.http.get(&url).header("Accept", "application/json").send().await?.json().await?;
        let list = |v: &Value| match v {
            Value::Array(items) => items.clone(),
            Value::Null => Vec::new(),
            other => vec![other.clone()],
        };
        let mut truth = Truth::new();
        for a in list(&body["applications"]["application"]) {
            let host = format!("{}.eureka", a["name"].as_str().unwrap_or_default().to_lowercase().replace('_', "-"));
            for i in list(&a["instance"]) {
                let overridden = i["overriddenstatus"].as_str().unwrap_or("UNKNOWN");
                let status = if overridden != "UNKNOWN" { overridden } else { i["status"].as_str().unwrap_or("UP") };
                if status != "UP" || i["port"]["@enabled"] != "true" {
                    continue;
                }
                let (ip, port) =
                    (i["ipAddr"].as_str().unwrap_or_default(), i["port"]["$"].as_u64().unwrap_or(0) as u16);
                convergence::push(&mut truth, &host, ep(ip, port, 1, i["metadata"]["rev"].as_str()));
            }
        }
        Ok(convergence::non_empty(truth))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eureka_fake_bursts_converge_by_deltas() {
    let fake = EurekaFake::start().await.expect("start the fake eureka");
    let spec = RegistrySpec::new(RegistryKind::Eureka, "eureka-conv", fake.host_port(), 8761);
    let watcher = EurekaWatcher::new(spec).expect("valid spec").with_interval(INTERVAL);
    let mut view = RecorderView::new(Recorder::start(Box::new(watcher), Duration::from_secs(10)), &LABELS);
    let mut registry = Eureka { fake, http: reqwest::Client::new(), instances: Vec::new(), next: 0, truth_reads: 0 };
    let opts = Options::new("eureka-fake", Duration::from_millis(1500));
    convergence::run(&mut registry, &mut view, &opts).await;
    let full_fetches = registry.fake.requests().iter().filter(|r| r.as_str() == "GET /eureka/apps").count();
    let by_watcher = full_fetches - registry.truth_reads;
    assert_eq!(by_watcher, 1, "every burst converged by deltas alone: only the first fetch is a full one");
}
