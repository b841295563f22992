//! Watcher churn against a real Consul 1.8.7 (`MESHBRIDGE_CONSUL_BIN`, see
//! `e2e/env.sh`): 1,000 McpBridge edits through the reconciler, each a
//! sliding window of 8 registries (Consul ones that really connect and sync,
//! and static ones), some restarted with a changed spec, some replaced by a
//! new name. Afterwards no stopped watcher keeps a task, a connection to
//! Consul or a metric series, and RSS comes back near where it was after a
//! warm-up. Figures are printed; RELIABILITY.md records them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshbridge::cache::{Cache, RegistryKey};
use meshbridge::metrics::Metrics;
use meshbridge::reconcile::Reconciler;
use meshbridge::testing::exposition;
use meshbridge::xds::Clients;
use meshbridge_e2e::consul::{Consul, established_to};
use meshbridge_registries::consul::DEFAULT_MAX_CONNS;
use meshbridge_registries::{RegistryKind, RegistrySpec};
use serde_json::json;

const EDITS: usize = 1_000;
const WARM_UP: usize = 100;
const WINDOW: usize = 8;
/// RSS after the churn may exceed the warm-up figure by this much: the
/// allocator keeps some freed pages, a leak of one watcher per edit would be
/// far above it.
const RSS_SLACK_KB: u64 = 32 * 1024;

/// Registry `i` of the sliding window: even ones Consul (names cycle
/// through 7, and the refresh interval changes with `i`, so an edit either
/// restarts a watcher with a new spec or starts one under a new name), odd
/// ones static.
fn spec(i: usize, consul_port: u16) -> RegistrySpec {
    if i.is_multiple_of(2) {
        let mut spec = RegistrySpec::new(RegistryKind::Consul, format!("c{}", i % 7), "127.0.0.1", consul_port);
        spec.consul_refresh_interval = Some(Duration::from_secs(10 + (i % 5) as u64));
        spec
    } else {
        RegistrySpec::new(RegistryKind::Static, format!("s{}", i % 11), format!("127.0.0.1:{}", 10_000 + i), 80)
    }
}

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Wait until the live watcher count is `want`, or 10 s.
async fn settle(cache: &Cache, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cache.watchers().get() != want as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_leaves_no_task_connection_series_or_memory_behind() {
    let consul = Consul::start().await.expect("consul");
    for n in 0..20 {
        consul
            .register(
                json!({"ID": format!("web-{n}"), "Name": format!("web-{n}"), "Address": "127.0.0.2", "Port": 8000 + n}),
            )
            .await
            .unwrap();
    }
    let port = consul.http_port;
    let cache = Cache::new();
    let metrics = Metrics::new(cache.clone(), Clients::new(), tokio::sync::watch::channel(Arc::default()).1);
    let mut reconciler = Reconciler::new(cache.clone());

    let started = Instant::now();
    let (mut peak_watchers, mut peak_conns) = (0, 0);
    let mut baseline = None;
    for edit in 0..EDITS {
        let desired: Vec<RegistrySpec> = (edit..edit + WINDOW).map(|i| spec(i, port)).collect();
        reconciler.apply(&desired);
        peak_watchers = peak_watchers.max(cache.watchers().get());
        // Let the Consul watchers connect and sync now and then, so stopped
        // ones really had connections to give back.
        if edit.is_multiple_of(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            peak_conns = peak_conns.max(established_to(port));
        } else {
            tokio::task::yield_now().await;
        }
        if edit + 1 == WARM_UP {
            settle(&cache, WINDOW).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            baseline = Some(rss_kb());
        }
    }
    let took = started.elapsed();
    let configured = reconciler.running().count();
    assert_eq!(configured, WINDOW);
    settle(&cache, configured).await;
    assert_eq!(cache.watchers().get(), configured as i64, "watcher tasks left running");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Connections: only the live Consul watchers', each within its cap.
    let live_consul = reconciler.running().filter(|k| k.kind == RegistryKind::Consul).count();
    let conns = established_to(port);
    assert!(
        conns <= live_consul * DEFAULT_MAX_CONNS,
        "{conns} connections to Consul for {live_consul} live Consul watchers (cap {DEFAULT_MAX_CONNS} each)"
    );

    // Series: only configured registries have any.
    let text = metrics.render().unwrap();
    let samples = exposition::parse(&text).unwrap();
    assert_eq!(exposition::value(&samples, "meshbridge_watchers", &[]), Some(configured as f64));
    let names: BTreeSet<String> = reconciler.running().map(|k: &RegistryKey| k.name.clone()).collect();
    for s in &samples {
        if let Some(name) = s.labels.get("name") {
            assert!(names.contains(name), "leaked series {} for {name}", s.name);
        }
    }
    assert_eq!(cache.registries().len(), configured, "leaked cache entries");

    // Memory: back near the warm-up figure.
    let baseline = baseline.expect("warm-up measured");
    let after = rss_kb();
    println!(
        "FIGURE churn: {EDITS} edits in {took:?}; peak {peak_watchers} watchers and {peak_conns} connections to \
         Consul; after: {configured} watchers, {conns} connections ({live_consul} Consul watchers); RSS {} MiB after \
         {WARM_UP} edits, {} MiB after {EDITS}",
        baseline / 1024,
        after / 1024
    );
    assert!(
        after <= baseline + RSS_SLACK_KB,
        "RSS grew from {baseline} kB to {after} kB over {} edits",
        EDITS - WARM_UP
    );

    // Stopping everything gives every connection back.
    reconciler.apply(&[]);
    settle(&cache, 0).await;
    assert_eq!(cache.watchers().get(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while established_to(port) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(established_to(port), 0, "connections to Consul left after every watcher stopped");
}
