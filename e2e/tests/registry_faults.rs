//! Registry faults under load, for each registry kind: a registry cut off
//! by a network partition, and a registry hung (SIGSTOP). Real registries
//! (Consul 1.8.7, ZooKeeper 3.8, rnacos), real Envoy, meshbridge
//! in-process, 200 req/s through Envoy to two backends registered in the
//! registry (see `e2e/src/faults.rs`). Each scenario prints a `FIGURES`
//! line and fails on one failed request or a missed deadline.
//!
//! Faults last `MESHBRIDGE_FAULT_SECS` seconds (default 10, for CI);
//! `e2e/faults.sh` runs them with 60. Partitions need network namespaces
//! (root): without them a partition scenario fails, saying why; it never
//! passes without running. Needs `source e2e/env.sh consul envoy zookeeper rnacos`.

use std::time::{Duration, Instant, SystemTime};

use meshbridge::run::App;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::faults::{DETECT_BOUND, RATE, RESYNC_BOUND, Registry, launch, mcp_bridge, signal, until};
use meshbridge_e2e::load::{Load, fault_secs};
use meshbridge_e2e::netns::{Host, Netns};
use meshbridge_registries::RegistryKind;
use serde_json::json;

/// One scenario at a time: each holds 200 req/s through its own Envoy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// meshbridge and Envoy in front of `reg` (and any `extra` registries),
/// serving both backends.
async fn serve(reg: &Registry, extra: &[String]) -> (tempfile::TempDir, tempfile::TempDir, App, Envoy) {
    let (config, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut entries = vec![reg.bridge_entry()];
    entries.extend_from_slice(extra);
    std::fs::write(config.path().join("bridge.yaml"), mcp_bridge(&entries)).unwrap();
    let app = launch(config.path(), state.path(), "127.0.0.1:0".parse().unwrap()).await;
    until("registry synced", Duration::from_secs(30), || reg.status(&app).endpoints == 2).await;
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, reg.cluster()).await.expect("envoy");
    meshbridge_e2e::traffic::wait_for_traffic(&envoy, 200, &["b1", "b2"], "both backends").await;
    (config, state, app, envoy)
}

/// Healthy, both endpoints, and a sync that finished after `since`.
fn resynced(reg: &Registry, app: &App, since: SystemTime) -> bool {
    let r = reg.status(app);
    r.status.healthy && r.endpoints == 2 && r.status.last_sync_time.is_some_and(|t| t > since)
}

/// The registry runs in its own network namespace; the link is cut for the
/// fault's length and restored. Health turns false within 15 s, Envoy keeps
/// the last endpoints (0 failed requests), and the registry resyncs after
/// the link is back.
async fn partitioned(kind: RegistryKind) {
    let _serial = SERIAL.lock().await;
    // Declared first, so dropped last: the servers in it are killed first.
    let ns = Netns::create().expect("make a network namespace (the partition scenarios need root)");
    let reg = Registry::start(kind, ns.host()).await.expect("start the registry in the namespace");
    let (_config, _state, app, envoy) = serve(&reg, &[]).await;
    let fault = fault_secs(10);
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    ns.cut().expect("cut the link");
    let cut = Instant::now();
    let detect = until("health false after the partition", DETECT_BOUND, || !reg.status(&app).status.healthy).await;
    let last_error = reg.status(&app).status.last_error.unwrap_or_default();
    tokio::time::sleep(fault.saturating_sub(cut.elapsed())).await;
    let failed_during = load.failed().await;
    ns.restore().expect("restore the link");
    let back = SystemTime::now();
    let started = Instant::now();
    while !resynced(&reg, &app, back) {
        assert!(started.elapsed() < Duration::from_secs(90), "no resync within 90 s: {:?}", reg.status(&app));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resync = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    println!(
        "FIGURES registry partitioned ({kind}, netns {}) {fault:?}: detect {:.1}s ({last_error}), \
         {failed_during} failed during the partition, resync {:.1}s after the link came back; {}",
        ns.name(),
        detect.as_secs_f64(),
        resync.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}\n{}", &report.failures[..report.failures.len().min(20)], envoy.log());
    assert!(resync <= RESYNC_BOUND, "resync took {resync:?}; registry log:\n{}", reg.log());
}

#[tokio::test]
async fn consul_partitioned() {
    partitioned(RegistryKind::Consul).await;
}

#[tokio::test]
async fn zookeeper_partitioned() {
    partitioned(RegistryKind::Zookeeper).await;
}

#[tokio::test]
async fn nacos_partitioned() {
    partitioned(RegistryKind::Nacos2).await;
}

/// The registry is SIGSTOPped (connections accepted by the kernel, never
/// answered) for the fault's length, beside a Consul registry. Its watcher
/// times out and reports; the other registry's change and the admin API are
/// not delayed; Envoy keeps the last endpoints; after SIGCONT it recovers.
async fn hung(kind: RegistryKind) {
    let _serial = SERIAL.lock().await;
    let reg = Registry::start(kind, Host::loopback()).await.expect("start the registry");
    let other = Consul::start().await.expect("second consul");
    let other_entry = format!(
        "{{ type: consul, name: other, domain: 127.0.0.1, port: {}, consulDatacenter: dc1, vport: {{ default: 8080 }} }}",
        other.http_port
    );
    let (_config, _state, app, envoy) = serve(&reg, &[other_entry]).await;
    let other_key = meshbridge::cache::RegistryKey::new(RegistryKind::Consul, "other");
    let other_status = |app: &App| app.cache.registry(&other_key).expect("other").0;
    until("other synced", Duration::from_secs(20), || other_status(&app).status.ready).await;
    let fault = fault_secs(10);
    let load = Load::start(envoy.listen_port, "/", RATE);
    tokio::time::sleep(Duration::from_secs(1)).await;

    let pid = reg.pid();
    signal(pid, "-STOP");
    let hung = Instant::now();
    // While it hangs, a change in the other registry goes through at once,
    // and the admin API answers at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b3 = Backend::start("127.0.0.1", "b3").await.unwrap();
    other
        .register(json!({ "ID": "api-1", "Name": "api", "Address": "127.0.0.1", "Port": b3.addr.port() }))
        .await
        .unwrap();
    let other_change = until("the other registry's change while this one hangs", Duration::from_secs(5), || {
        other_status(&app).endpoints == 1
    })
    .await;
    let asked = Instant::now();
    let admin = reqwest::get(format!("http://{}/v1/registries", app.admin_addr)).await.expect("admin API");
    assert!(admin.status().is_success());
    let admin_latency = asked.elapsed();
    until("hung registry reported", Duration::from_secs(60), || !reg.status(&app).status.healthy).await;
    let detect = hung.elapsed();
    let last_error = reg.status(&app).status.last_error.unwrap_or_default();
    tokio::time::sleep(fault.saturating_sub(hung.elapsed())).await;
    signal(pid, "-CONT");
    let cont = SystemTime::now();
    let started = Instant::now();
    while !resynced(&reg, &app, cont) {
        assert!(started.elapsed() < Duration::from_secs(90), "no recovery within 90 s: {:?}", reg.status(&app));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recover = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let report = load.stop().await;
    println!(
        "FIGURES registry hung ({kind}) {fault:?}: reported after {:.1}s ({last_error}), other registry's change \
         in {:.2}s, admin API in {:.3}s, resynced {:.1}s after SIGCONT; {}",
        detect.as_secs_f64(),
        other_change.as_secs_f64(),
        admin_latency.as_secs_f64(),
        recover.as_secs_f64(),
        report.summary()
    );
    assert_eq!(report.failed, 0, "{:?}", &report.failures[..report.failures.len().min(20)]);
    assert!(detect <= DETECT_BOUND, "hung registry reported after {detect:?}");
    assert!(recover <= RESYNC_BOUND, "recovery took {recover:?}; registry log:\n{}", reg.log());
}

#[tokio::test]
async fn zookeeper_hung_does_not_delay_another() {
    hung(RegistryKind::Zookeeper).await;
}

#[tokio::test]
async fn nacos_hung_does_not_delay_another() {
    hung(RegistryKind::Nacos2).await;
}
