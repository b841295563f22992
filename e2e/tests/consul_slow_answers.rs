//! A Consul slow to answer its catalog: meshbridge in-process, a real
//! Consul dev agent (`MESHBRIDGE_CONSUL_BIN`, see `e2e/env.sh`) behind a
//! fake, the delaying proxy of `e2e/src/delaying_proxy.rs`, which holds
//! every non-blocking `GET /v1/catalog/services` for 7 s and passes
//! everything else through. That is how Consul 1.8.7 answered its first
//! catalog read at 100k services × 10 instances right after a mass
//! registration; a dev agent cannot be made that slow on demand.
//!
//! With a fixed 5 s for every non-blocking read, each try of the first sync
//! timed out and the registry never became ready. The catalog read's budget
//! (`registries/src/consul/budget.rs`) doubles on the try after a timeout,
//! and then keeps what it learned from the answer.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meshbridge::cache::{RegistryKey, RegistryReport};
use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::delaying_proxy::{DelayingProxy, non_blocking_get};
use meshbridge_e2e::faults::{mcp_bridge, until};
use meshbridge_registries::RegistryKind;
use serde_json::json;

/// How long the proxy holds each non-blocking catalog read: past the 5 s
/// every non-blocking read used to get, within the 10 s of a second try.
const HOLD: Duration = Duration::from_secs(7);
/// The anti-entropy pass, whose listing is a non-blocking catalog read too.
const ANTI_ENTROPY: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_catalog_slower_than_five_seconds_syncs_on_a_retry_and_stays_healthy() {
    let consul = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
    consul.register(json!({ "ID": "web-1", "Name": "web", "Address": "127.0.0.41", "Port": 8080 })).await.unwrap();
    let upstream = SocketAddr::from(([127, 0, 0, 1], consul.http_port));
    let proxy = DelayingProxy::start(upstream, HOLD, non_blocking_get("/v1/catalog/services"))
        .await
        .expect("start the delaying proxy");
    let config = tempfile::tempdir().unwrap();
    let entry = format!(
        "{{ type: consul, name: slow, domain: 127.0.0.1, port: {}, consulDatacenter: dc1, vport: {{ default: 8080 }} }}",
        proxy.port
    );
    std::fs::write(config.path().join("bridge.yaml"), mcp_bridge(&[entry])).unwrap();
    let started = Instant::now();
    let app = App::start(RunArgs::loopback(config.path()).with_anti_entropy_interval(ANTI_ENTROPY))
        .await
        .expect("start meshbridge");
    let key = RegistryKey::new(RegistryKind::Consul, "slow");
    let status = || -> RegistryReport { app.cache.registry(&key).expect("registry in the cache").0 };

    // The first try still times out after 5 s, and says so at once.
    let timed_out = |r: &RegistryReport| {
        r.status.last_error.as_deref().is_some_and(|e| e.contains("/v1/catalog/services") && e.contains("timed out"))
    };
    until("the first catalog read reported as timed out", Duration::from_secs(15), || timed_out(&status())).await;
    let reported = started.elapsed();
    assert!(!status().status.ready, "{:?}", status());

    // The retry gets 10 s, and the 7 s answer gets through.
    until("ready, with web's endpoint", Duration::from_secs(30), || {
        let r = status();
        r.status.ready && r.status.healthy && r.endpoints == 1
    })
    .await;
    let ready = started.elapsed();
    let first_error = status().status.last_error.unwrap_or_default();
    let held = proxy.held();
    assert!(held >= 2, "the first read and its retry were held: {held}");

    // The anti-entropy listing is held 7 s too: the budget learned from
    // the sync's answer lets it through on its first try, with no error.
    let errors_at = status().status.last_error_time;
    until("the anti-entropy listing sent", ANTI_ENTROPY + Duration::from_secs(10), || proxy.held() > held).await;
    tokio::time::sleep(HOLD + Duration::from_secs(2)).await;
    let r = status();
    assert_eq!(r.status.last_error_time, errors_at, "a new error after the sync: {r:?}");
    assert!(r.status.healthy && r.endpoints == 1, "{r:?}");
    println!(
        "FIGURES consul slow catalog ({HOLD:?} per non-blocking read): timeout reported {:.1}s after start \
         ({first_error}), ready {:.1}s after start, {} reads held",
        reported.as_secs_f64(),
        ready.as_secs_f64(),
        proxy.held(),
    );
    assert!(reported < Duration::from_secs(9), "the timeout was reported {reported:?} after start");
}
