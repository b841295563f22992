//! Fault scenarios under load: real Consul, real Envoy, meshbridge
//! in-process, and a bounded-rate load generator (200 req/s) sending
//! traffic through Envoy to two backends registered in the registry. Each
//! scenario prints its figures and fails on a failed request or a missed
//! deadline.
//!
//! Faults last `MESHBRIDGE_FAULT_SECS` seconds (default 10, for CI);
//! `e2e/faults.sh` runs them with 60. Needs `source e2e/env.sh consul envoy zookeeper rnacos`.

use std::time::{Duration, Instant, SystemTime};

use meshbridge::cache::RegistryKey;
use meshbridge::run::App;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::faults::{RATE, RESYNC_BOUND, Registry, launch, mcp_bridge, signal, until};
use meshbridge_e2e::load::{Load, fault_secs};
use meshbridge_e2e::netns::Host;
use meshbridge_registries::RegistryKind;
use serde_json::json;

const CLUSTER: &str = "outbound|8080||web.dc1.consul";

/// One scenario at a time: each holds 200 req/s through its own Envoy, and
/// two at once on a small machine would measure the machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn bridge(consuls: &[(&str, u16)]) -> String {
    let entries: Vec<String> = consuls
        .iter()
        .map(|(name, port)| {
            format!(
                "{{ type: consul, name: {name}, domain: 127.0.0.1, port: {port}, consulDatacenter: dc1, \
                 consulRefreshInterval: 30000000000, vport: {{ default: 8080 }} }}"
            )
        })
        .collect();
    mcp_bridge(&entries)
}

/// No service check: a TTL check comes back `critical` after a `kill -9`
/// of the agent until the app's next heartbeat, so Consul itself would
/// report the instances down (see RELIABILITY.md); the node check remains.
fn instance(id: &str, name: &str, backend: &Backend) -> serde_json::Value {
    json!({ "ID": id, "Name": name, "Address": "127.0.0.1", "Port": backend.addr.port() })
}

fn status(app: &App, name: &str) -> meshbridge::cache::RegistryReport {
    app.cache.registry(&RegistryKey::new(RegistryKind::Consul, name)).expect("registry").0
}

struct World {
    consul: Consul,
    backends: Vec<Backend>,
    config: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        let consul = Consul::start_persistent().await.expect("start consul");
        let backends =
            vec![Backend::start("127.0.0.1", "b1").await.unwrap(), Backend::start("127.0.0.1", "b2").await.unwrap()];
        let w = World { consul, backends, config: tempfile::tempdir().unwrap(), state: tempfile::tempdir().unwrap() };
        w.register().await;
        std::fs::write(w.config.path().join("bridge.yaml"), bridge(&[("local", w.consul.http_port)])).unwrap();
        w
    }

    /// Register both instances (the agent keeps them across restarts).
    async fn register(&self) {
        for (i, b) in self.backends.iter().enumerate() {
            self.consul.register(instance(&format!("web-{i}"), "web", b)).await.unwrap();
        }
    }
}

async fn serving(app: &App, envoy: &Envoy) {
    until("registry synced", Duration::from_secs(20), || status(app, "local").endpoints == 2).await;
    meshbridge_e2e::traffic::wait_for_traffic(envoy, 200, &["b1", "b2"], "both backends").await;
}

#[tokio::test]
async fn registry_killed_then_restarted() {
    let _serial = SERIAL.lock().await;
    let mut w = World::start().await;
    let app = launch(w.config.path(), w.state.path(), "127.0.0.1:0".parse().unwrap()).await;
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, CLUSTER).await.expect("envoy");
    serving(&app, &envoy).await;
    let fault = fault_secs(10);
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    w.consul.stop(); // SIGKILL
    let detect =
        until("health false after kill -9", Duration::from_secs(15), || !status(&app, "local").status.healthy).await;
    tokio::time::sleep(fault.saturating_sub(detect)).await;
    // Taken before the restart: Consul is down until then, so any sync
    // after this instant is a post-restart one. Taken after `restart()`
    // returns, a resync that lands between the election and this line (a
    // detector's retry can answer at once) would be missed, and the wait
    // would time out although meshbridge had resynced.
    let back = SystemTime::now();
    w.consul.restart().await.expect("restart consul");
    let resync = until("resync after restart", Duration::from_secs(15), || {
        let r = status(&app, "local");
        r.status.healthy && r.endpoints == 2 && r.status.last_sync_time.is_some_and(|t| t > back)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    println!(
        "FIGURES registry killed {fault:?}: detect {:.1}s, resync {:.1}s after restart; {}",
        detect.as_secs_f64(),
        resync.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}\n{}", &report.failures[..report.failures.len().min(20)], envoy.log());
    assert!(resync <= RESYNC_BOUND, "resync took {resync:?}");
}

#[tokio::test]
async fn registry_hung_does_not_delay_another() {
    let _serial = SERIAL.lock().await;
    let w = World::start().await;
    let other = Consul::start().await.expect("second consul");
    std::fs::write(
        w.config.path().join("bridge.yaml"),
        bridge(&[("local", w.consul.http_port), ("other", other.http_port)]),
    )
    .unwrap();
    let app = launch(w.config.path(), w.state.path(), "127.0.0.1:0".parse().unwrap()).await;
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, CLUSTER).await.expect("envoy");
    serving(&app, &envoy).await;
    until("other synced", Duration::from_secs(20), || status(&app, "other").status.ready).await;
    let fault = fault_secs(10);
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pid = w.consul.pid().expect("consul pid");
    signal(pid, "-STOP");
    let hung = Instant::now();
    // While it hangs, a change in the other registry goes through at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b3 = Backend::start("127.0.0.1", "b3").await.unwrap();
    other.register(instance("api-1", "api", &b3)).await.unwrap();
    let other_change = until("other registry's change while the first hangs", Duration::from_secs(5), || {
        status(&app, "other").endpoints == 1
    })
    .await;
    until("hung registry reported", Duration::from_secs(60), || !status(&app, "local").status.healthy).await;
    let detect = hung.elapsed();
    let last_error = status(&app, "local").status.last_error.unwrap_or_default();
    tokio::time::sleep(fault.saturating_sub(hung.elapsed())).await;
    signal(pid, "-CONT");
    let recover =
        until("healthy after SIGCONT", Duration::from_secs(30), || status(&app, "local").status.healthy).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    println!(
        "FIGURES registry hung {fault:?}: reported after {:.1}s ({last_error}), other registry's change in {:.2}s, \
         healthy {:.1}s after SIGCONT; {}",
        detect.as_secs_f64(),
        other_change.as_secs_f64(),
        recover.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}", &report.failures[..report.failures.len().min(20)]);
}

#[tokio::test]
async fn meshbridge_restarts_with_every_registry_down() {
    let _serial = SERIAL.lock().await;
    let mut w = World::start().await;
    let app = launch(w.config.path(), w.state.path(), "127.0.0.1:0".parse().unwrap()).await;
    let xds = app.xds_addr;
    let envoy = Envoy::start(xds, AdsMode::Delta, CLUSTER).await.expect("envoy");
    serving(&app, &envoy).await;
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    w.consul.stop();
    until("health false", Duration::from_secs(15), || !status(&app, "local").status.healthy).await;
    let down = Instant::now();
    app.shutdown().await; // drains, flushes the dump
    let app = launch(w.config.path(), w.state.path(), xds).await;
    let restarted = down.elapsed();
    // Served from the dump at once, marked stale, and ready.
    let r = status(&app, "local");
    assert!(r.status.stale && r.endpoints == 2, "{r:?}");
    let ready = reqwest::get(format!("http://{}/ready", app.admin_addr)).await.unwrap();
    assert_eq!(ready.status(), 200);
    let reconnect = until("Envoy reconnected", Duration::from_secs(15), || !app.clients.snapshot().is_empty()).await;
    tokio::time::sleep(fault_secs(10)).await;
    let report = load.stop().await;
    let m = app.metrics.render().unwrap();
    assert!(m.contains("meshbridge_registry_stale{name=\"local\",type=\"consul\"} 1"), "{m}");
    println!(
        "FIGURES restart with every registry down: new process serving the dump {:.2}s after the old one stopped, \
         Envoy reconnected in {:.1}s; {}",
        restarted.as_secs_f64(),
        reconnect.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}", &report.failures[..report.failures.len().min(20)]);
    // And the registry's return replaces the dump.
    w.consul.restart().await.unwrap();
    until("live again", Duration::from_secs(20), || !status(&app, "local").status.stale).await;
}

#[tokio::test]
async fn rolling_restart_of_two_replicas() {
    let _serial = SERIAL.lock().await;
    let w = World::start().await;
    let state_b = tempfile::tempdir().unwrap();
    let a = launch(w.config.path(), w.state.path(), "127.0.0.1:0".parse().unwrap()).await;
    let b = launch(w.config.path(), state_b.path(), "127.0.0.1:0".parse().unwrap()).await;
    let (xa, xb) = (a.xds_addr, b.xds_addr);
    let envoy = Envoy::start_replicas(&[xa, xb], AdsMode::Sotw, CLUSTER).await.expect("envoy");
    serving(&a, &envoy).await;
    until("b synced", Duration::from_secs(20), || status(&b, "local").endpoints == 2).await;
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Restart a, then b, each on its own address, as a rollout does.
    let mut reconnects = Vec::new();
    let (mut a, mut b) = (Some(a), Some(b));
    for (slot, addr, state) in [(&mut a, xa, w.state.path()), (&mut b, xb, state_b.path())] {
        let old = slot.take().unwrap();
        let t = Instant::now();
        old.shutdown().await;
        let new = launch(w.config.path(), state, addr).await;
        until("replica synced", Duration::from_secs(20), || status(&new, "local").endpoints == 2).await;
        reconnects.push(t.elapsed());
        *slot = Some(new);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let a = a.unwrap();
    let b = b.unwrap();
    let connected = until("Envoy connected to a replica", Duration::from_secs(15), || {
        a.clients.snapshot().len() + b.clients.snapshot().len() == 1
    })
    .await;
    let report = load.stop().await;
    println!(
        "FIGURES rolling restart of 2 replicas: replicas back in {:?}, Envoy on a replica {:.1}s later; {}",
        reconnects.iter().map(|d| format!("{:.1}s", d.as_secs_f64())).collect::<Vec<_>>(),
        connected.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}", &report.failures[..report.failures.len().min(20)]);
}

/// Envoy NACK: a proxy tunnel listener is moved to a port another process
/// holds, so Envoy cannot bind it and rejects the LDS update. Traffic goes
/// on with the last good config, the NACK shows on `/debug/xdsz` and in the
/// metrics, and the next good change is accepted.
#[tokio::test]
async fn envoy_nack_keeps_last_good_and_next_change_goes_through() {
    let _serial = SERIAL.lock().await;
    use meshbridge::translate::envoy::LISTENER_TYPE;
    let w = World::start().await;
    let gateway_port = meshbridge_e2e::free_port();
    let write = |listener_port: u16| {
        let mut yaml = bridge(&[("local", w.consul.http_port)]);
        yaml.push_str(&format!(
            "    - {{ type: static, name: side, domain: \"127.0.0.1:9\", port: 443, protocol: https, proxyName: corp }}\n  \
             proxies:\n    - {{ type: http, name: corp, serverAddress: 127.0.0.1, serverPort: 9, listenerPort: {listener_port} }}\n\
             ---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: web\n  namespace: shop\n  annotations:\n    \
             higress.io/destination: web.dc1.consul:8080\nspec:\n  ingressClassName: higress\n  rules:\n    - http:\n        paths:\n          \
             - {{ path: /, pathType: Prefix, backend: {{ resource: {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }} }} }}\n"
        ));
        std::fs::write(w.config.path().join("bridge.yaml"), yaml).unwrap();
    };
    write(meshbridge_e2e::free_port());
    let app = meshbridge_e2e::traffic::start_gateway(w.config.path(), gateway_port).await.expect("meshbridge");
    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, gateway_port).await.expect("envoy");
    serving(&app, &envoy).await;
    let listener = |app: &App| {
        app.clients.snapshot().into_iter().find_map(|c| c.types.get(LISTENER_TYPE).cloned()).unwrap_or_default()
    };
    until("listeners ACKed", Duration::from_secs(10), || listener(&app).last_ack.is_some()).await;
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Bad: a port that is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    write(taken.local_addr().unwrap().port());
    let nacked =
        until("Envoy NACKs the listener it cannot bind", Duration::from_secs(15), || listener(&app).nacks > 0).await;
    let detail = listener(&app).last_nack_detail.unwrap_or_default().trim().to_string();
    let (_, xdsz) = {
        let r = reqwest::get(format!("http://{}/debug/xdsz", app.admin_addr)).await.unwrap();
        (r.status(), r.text().await.unwrap())
    };
    assert!(xdsz.contains("lastNackDetail"), "{xdsz}");
    let m = app.metrics.render().unwrap();
    assert!(m.lines().any(|l| l.starts_with("meshbridge_xds_nacks_total") && !l.ends_with(" 0")), "{m}");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Good again: the next change is accepted.
    let acked_before = listener(&app).last_ack_time;
    write(meshbridge_e2e::free_port());
    let accepted = until("the next good change is ACKed", Duration::from_secs(15), || {
        let l = listener(&app);
        l.last_ack_time > acked_before && l.last_ack_time > l.last_nack_time
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    drop(taken);
    println!(
        "FIGURES Envoy NACK: NACK recorded {:.1}s after the bad edit ({detail}), next good edit ACKed in {:.1}s; {}",
        nacked.as_secs_f64(),
        accepted.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}", &report.failures[..report.failures.len().min(20)]);
}

/// A ZooKeeper (Dubbo providers) or rnacos (Nacos 2 gRPC, persistent
/// instances) `kill -9`ed, then restarted on its data dir.
async fn killed(kind: RegistryKind) {
    let _serial = SERIAL.lock().await;
    let mut reg = Registry::start(kind, Host::loopback()).await.expect("start the registry");
    let (config, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(config.path().join("bridge.yaml"), mcp_bridge(&[reg.bridge_entry()])).unwrap();
    let app = launch(config.path(), state.path(), "127.0.0.1:0".parse().unwrap()).await;
    until("registry synced", Duration::from_secs(20), || reg.status(&app).endpoints == 2).await;
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, reg.cluster()).await.expect("envoy");
    meshbridge_e2e::traffic::wait_for_traffic(&envoy, 200, &["b1", "b2"], "both backends").await;
    let fault = fault_secs(10);
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    reg.stop();
    let detect =
        until("health false after kill -9", Duration::from_secs(15), || !reg.status(&app).status.healthy).await;
    tokio::time::sleep(fault.saturating_sub(detect)).await;
    // A sync after the new process started is one with it. The harness's
    // restart returns once it has a session of its own (ZooKeeper: seconds of
    // JVM start), and the watcher may have resynced before that: the figure
    // is then 0.
    let restarting = SystemTime::now();
    reg.restart().await.expect("restart the registry");
    let started = Instant::now();
    let synced = |r: &meshbridge::cache::RegistryReport| {
        r.status.healthy && r.endpoints == 2 && r.status.last_sync_time.is_some_and(|t| t > restarting)
    };
    while !synced(&reg.status(&app)) {
        assert!(started.elapsed() < Duration::from_secs(90), "no resync within 90 s: {:?}", reg.status(&app));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resync = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    println!(
        "FIGURES {kind} killed {fault:?}: detect {:.1}s, resync {:.1}s after restart; {}",
        detect.as_secs_f64(),
        resync.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}", &report.failures[..report.failures.len().min(20)]);
    assert!(resync <= RESYNC_BOUND, "resync took {resync:?}");
}

#[tokio::test]
async fn zookeeper_killed_then_restarted() {
    killed(RegistryKind::Zookeeper).await;
}

#[tokio::test]
async fn nacos_killed_then_restarted() {
    killed(RegistryKind::Nacos2).await;
}
