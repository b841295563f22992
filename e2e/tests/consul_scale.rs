//! The Consul watcher on a bounded number of connections, against a real
//! Consul 1.8.7 dev agent (`MESHBRIDGE_CONSUL_BIN`, see `e2e/env.sh`) with
//! its DEFAULT `limits.http_max_conns_per_client` (200): 300 services are
//! all served, the registry is healthy, another client still gets answers,
//! and the watcher never holds more connections than its cap. Figures
//! (connections, time for one change to arrive) are printed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use meshbridge_e2e::consul::{CheckStatus, Consul, established_to};
use meshbridge_e2e::recorder::{Event, Recorder};
use meshbridge_registries::consul::{ConsulWatcher, DEFAULT_MAX_CONNS};
use meshbridge_registries::{RegistryError, RegistryKind, RegistrySpec, Update};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

const SERVICES: usize = 300;
const WAIT: Duration = Duration::from_secs(2);
const DEADLINE: Duration = Duration::from_secs(60);

fn spec(port: u16) -> RegistrySpec {
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "consul-scale", "127.0.0.1", port);
    spec.consul_refresh_interval = Some(Duration::from_secs(5));
    spec
}

/// Service `svc-{i}`, one instance on 127.0.0.{2 + i % 200}; even ones have
/// a passing TTL check, odd ones none.
fn service(i: usize) -> Value {
    let id = format!("svc-{i}-a");
    let mut def =
        json!({"ID": id, "Name": format!("svc-{i}"), "Address": format!("127.0.0.{}", 2 + i % 200), "Port": 8000 + i});
    if i.is_multiple_of(2) {
        def["Check"] = json!({"CheckID": id, "TTL": "300s", "Status": "passing"});
    }
    def
}

fn host(i: usize) -> String {
    format!("svc-{i}.dc1.consul")
}

/// Samples the connections to a port every few milliseconds, except while
/// paused (while the test itself talks to Consul), and keeps the most seen.
struct Sampler {
    on: Arc<AtomicBool>,
    most: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(port: u16) -> Sampler {
        let (on, most) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
        let (on2, most2) = (on.clone(), most.clone());
        let task = tokio::spawn(async move {
            loop {
                if on2.load(Ordering::SeqCst) {
                    let now = established_to(port);
                    // Still on after reading: the test did not start a call meanwhile.
                    if on2.load(Ordering::SeqCst) {
                        most2.fetch_max(now, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        });
        Sampler { on, most, task }
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// Run `call` with sampling off; its own connection is closed by the time
    /// sampling resumes (`Connection: close`, plus a moment for the FIN).
    async fn paused<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        self.on.store(false, Ordering::SeqCst);
        let out = call.await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.on.store(true, Ordering::SeqCst);
        out
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What another client of the same Consul sees: the number of services.
async fn count_services(client: &reqwest::Client, url: &str) -> anyhow::Result<usize> {
    let resp = client.get(url).header("Connection", "close").timeout(Duration::from_secs(5)).send().await?;
    anyhow::ensure!(resp.status().is_success(), "status {}", resp.status());
    Ok(resp.json::<serde_json::Map<String, Value>>().await?.len())
}

#[tokio::test]
async fn three_hundred_services_on_a_few_connections_with_the_default_limit() {
    let consul = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
    // One call at a time: the harness is a client of the same limit too.
    for i in 0..SERVICES {
        consul.register(service(i)).await.unwrap();
    }
    let other = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let catalog_url = format!("{}/v1/catalog/services", consul.url());
    // Anti-entropy makes the agent's services visible in the catalog.
    let until = Instant::now() + Duration::from_secs(30);
    while count_services(&other, &catalog_url).await.unwrap_or(0) < SERVICES + 1 {
        assert!(Instant::now() < until, "services never reached the catalog");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(established_to(consul.http_port), 0, "the harness keeps no connection");

    let started = Instant::now();
    let watcher = ConsulWatcher::new(spec(consul.http_port)).unwrap().with_wait(WAIT);
    let cap = watcher.max_conns();
    assert_eq!(cap, DEFAULT_MAX_CONNS);
    let mut rec: Recorder = Recorder::start(Box::new(watcher), DEADLINE);
    let sampler = Sampler::start(consul.http_port);
    let mut most = 0;
    rec.until("all 300 services", |r| r.view.len() == SERVICES).await;
    let synced = started.elapsed();
    for i in 0..SERVICES {
        let svc = &rec.view[&host(i)];
        assert_eq!(svc.endpoints.len(), 1, "{}", host(i));
        assert_eq!(svc.endpoints[0].port as usize, 8000 + i);
    }
    assert!(rec.since(0).any(|e| matches!(e, Event::Healthy)), "healthy:\n{}", rec.dump());

    // While the watcher watches: another client still gets answers, and the
    // watcher holds no more than its cap. Sample over a few blocking rounds.
    for _ in 0..10 {
        most = most.max(sampler.most());
        let seen = sampler.paused(count_services(&other, &catalog_url)).await;
        assert_eq!(seen.expect("another client still queries consul"), SERVICES + 1);
        rec.idle(Duration::from_millis(200)).await;
    }
    let errors = rec.errors_since(0);
    assert!(errors.is_empty(), "no call failed: {errors:?}");

    // One change of a service with a check: a TTL check failing.
    let mark = rec.mark();
    let t = Instant::now();
    sampler.paused(consul.set_ttl_check("svc-10-a", CheckStatus::Fail)).await.unwrap();
    rec.until("svc-10 empty", |r| r.view[&host(10)].endpoints.is_empty()).await;
    let check_change = rec.last_at().unwrap() - t;
    // Only the changed service is sent (a paced sweep may re-read it once
    // more under load, never another one).
    let upserts: Vec<&Update> =
        rec.updates_since(mark).into_iter().filter(|u| matches!(u, Update::Upsert(_))).collect();
    assert!(
        !upserts.is_empty() && upserts.iter().all(|u| matches!(u, Update::Upsert(s) if s.host == host(10))),
        "only the changed service is sent:\n{}",
        rec.dump()
    );
    most = most.max(sampler.most());

    // An instance without checks joins, and leaves, an existing service: no
    // check moves, only the catalog does.
    let t = Instant::now();
    let extra = json!({"ID": "svc-11-b", "Name": "svc-11", "Address": "127.0.0.99", "Port": 9011});
    sampler.paused(consul.register(extra)).await.unwrap();
    rec.until("svc-11 has two instances", |r| r.view[&host(11)].endpoints.len() == 2).await;
    let checkless_add = rec.last_at().unwrap() - t;
    most = most.max(sampler.most());
    let t = Instant::now();
    sampler.paused(consul.deregister("svc-11-b")).await.unwrap();
    rec.until("svc-11 back to one", |r| r.view[&host(11)].endpoints.len() == 1).await;
    let checkless_remove = rec.last_at().unwrap() - t;
    most = most.max(sampler.most());

    // Two check-less instances join two services at once, far apart in the
    // catalog: the sweep's parts (pipelined probes on several connections)
    // find both, within the cap, and no call fails.
    let t = Instant::now();
    for i in [150, 290] {
        let extra =
            json!({"ID": format!("svc-{i}-b"), "Name": format!("svc-{i}"), "Address": "127.0.0.98", "Port": 9000 + i});
        sampler.paused(consul.register(extra)).await.unwrap();
    }
    rec.until("svc-150 and svc-290 have two instances", |r| {
        r.view[&host(150)].endpoints.len() == 2 && r.view[&host(290)].endpoints.len() == 2
    })
    .await;
    let two_checkless = rec.last_at().unwrap() - t;
    most = most.max(sampler.most());
    let errors = rec.errors_since(0);
    assert!(errors.is_empty(), "no call failed: {errors:?}");

    // A service that leaves.
    sampler.paused(consul.deregister("svc-12-a")).await.unwrap();
    rec.until("svc-12 removed", |r| !r.view.contains_key(&host(12))).await;
    most = most.max(sampler.most());

    println!(
        "consul {SERVICES} services: full sync {synced:?}; connections held at most {most} (cap {cap}); \
         check change {check_change:?}; check-less instance added {checkless_add:?}, removed {checkless_remove:?}, \
         two added at once {two_checkless:?}"
    );
    assert!(most <= cap, "the watcher held {most} connections to consul, more than its cap {cap}");
    assert!(most >= 2, "the two detectors are connected ({most})");
}

/// With a connection limit below what other clients already hold, the
/// registry's error says so plainly, and nothing is reported healthy.
#[tokio::test]
async fn a_refused_connection_says_connection_limit_reached() {
    let consul = Consul::start_with_hcl("limits { http_max_conns_per_client = 4 }").await.expect("start consul");
    consul.register(json!({"ID": "web-1", "Name": "web", "Address": "127.0.0.2", "Port": 80})).await.unwrap();
    // Another client on this host holds every allowed connection. Consul
    // may still count a connection the harness closed a moment ago (the
    // registration's), and hang up on one of ours instead: so keep opening
    // until Consul hangs up on a fresh one while all of ours stay open.
    let held = fill_connection_limit(consul.http_port, 4).await;
    let watcher = ConsulWatcher::new(spec(consul.http_port)).unwrap().with_wait(WAIT);
    let mut rec: Recorder = Recorder::start(Box::new(watcher), Duration::from_secs(15));
    rec.until("a connection-limit error", |r| {
        r.errors_since(0).iter().any(|e| matches!(e, RegistryError::ConnectionLimit { .. }))
    })
    .await;
    let limit = rec.errors_since(0).into_iter().find(|e| matches!(e, RegistryError::ConnectionLimit { .. })).cloned();
    assert!(limit.unwrap().to_string().contains("connection limit reached"));
    assert!(!rec.since(0).any(|e| matches!(e, Event::Healthy)), "{}", rec.dump());
    assert!(rec.updates_since(0).is_empty());

    // The other client lets go: the watcher syncs.
    drop(held);
    rec.until("web served", |r| r.view.contains_key("web.dc1.consul")).await;
}

/// Open connections to Consul until it holds `limit` of ours and hangs up on
/// the next one at once. A connection Consul has hung up on is let go and
/// replaced, so the result is `limit` connections Consul counts.
async fn fill_connection_limit(port: u16, limit: usize) -> Vec<tokio::net::TcpStream> {
    let until = Instant::now() + Duration::from_secs(20);
    let mut held: Vec<tokio::net::TcpStream> = Vec::new();
    loop {
        assert!(Instant::now() < until, "consul never enforced its connection limit ({} held)", held.len());
        let mut probe = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let refused = hung_up(&mut probe, Duration::from_millis(500)).await;
        // Consul hangs up on a refused connection at once, so any of ours it
        // refused is closed by now.
        let mut open = Vec::with_capacity(held.len());
        for mut conn in held {
            if !hung_up(&mut conn, Duration::from_millis(20)).await {
                open.push(conn);
            }
        }
        held = open;
        if !refused {
            held.push(probe);
        } else if held.len() >= limit {
            return held;
        }
    }
}

/// Whether the peer closed `conn` (or reset it) within `wait`; the harness
/// never sends on these, so any read that returns is a hang-up.
async fn hung_up(conn: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(wait, conn.read(&mut byte)).await, Ok(Ok(0) | Err(_)))
}

/// When Consul allows fewer connections than the cap (other clients hold the
/// rest), the watcher says so once and works on what it has, instead of
/// failing call after call.
#[tokio::test]
async fn a_partly_used_limit_shrinks_the_watcher_instead_of_flapping() {
    let consul = Consul::start_with_hcl("limits { http_max_conns_per_client = 6 }").await.expect("start consul");
    for i in 0..20 {
        consul.register(service(i)).await.unwrap();
    }
    // Another client on this host holds one of the six: the watcher has
    // five, its four detectors and one read.
    let held = tokio::net::TcpStream::connect(("127.0.0.1", consul.http_port)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let watcher = ConsulWatcher::new(spec(consul.http_port)).unwrap().with_wait(WAIT);
    let mut rec: Recorder = Recorder::start(Box::new(watcher), Duration::from_secs(30));
    rec.until("all 20 services", |r| r.view.len() == 20).await;
    let is_limit = |e: &&RegistryError| matches!(e, RegistryError::ConnectionLimit { .. });
    assert!(rec.errors_since(0).iter().any(is_limit), "the limit is reported:\n{}", rec.dump());

    // From now on: no error, changes still arrive, at most 5 connections.
    // The other client lets go of its connection, which the watcher no
    // longer tries to take, so the harness (a client too) can use it.
    let mark = rec.mark();
    drop(held);
    // Consul notices the close when it next reads the connection.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sampler = Sampler::start(consul.http_port);
    sampler.paused(consul.set_ttl_check("svc-4-a", CheckStatus::Fail)).await.unwrap();
    rec.until("svc-4 empty", |r| r.view[&host(4)].endpoints.is_empty()).await;
    rec.idle(WAIT * 2).await;
    assert!(rec.errors_since(mark).is_empty(), "no flapping:\n{}", rec.dump());
    assert!(sampler.most() <= 5, "{} connections", sampler.most());
    assert!(rec.healthy_since(mark) || rec.updates_since(mark).iter().any(|u| matches!(u, Update::Upsert(_))));
}
