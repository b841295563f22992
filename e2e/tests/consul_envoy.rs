//! The spine, end to end on real parts: a change in a real Consul reaches a
//! real Envoy through meshbridge (in-process, on free ports).
//!
//! Needs `source e2e/env.sh` (MESHBRIDGE_CONSUL_BIN, MESHBRIDGE_ENVOY_BIN).

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::consul::{CheckStatus, Consul};
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::traffic::{eds_ack_after, sample, wait_for_traffic};
use serde_json::json;

const CLUSTER: &str = "outbound|8080||web.dc1.consul";

async fn start_meshbridge(consul: &Consul, dir: &std::path::Path) -> anyhow::Result<App> {
    // vport pins the service port at 8080 whatever ports the instances use,
    // so the static route's cluster name is stable; endpoints keep theirs.
    let bridge = format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: consul
      name: local
      domain: 127.0.0.1
      port: {port}
      consulDatacenter: dc1
      consulRefreshInterval: 5000000000
      vport: {{ default: 8080 }}
"#,
        port = consul.http_port
    );
    // The 5 s resync is below Higress's 10 s floor: allow it.
    std::fs::write(dir.join("mcpbridge.yaml"), bridge)?;
    App::start(RunArgs::loopback(dir).with_min_refresh_interval(Duration::from_secs(5))).await
}

fn instance(id: &str, backend: &Backend, address: &str) -> serde_json::Value {
    json!({
        "ID": id,
        "Name": "web",
        "Address": address,
        "Port": backend.addr.port(),
        "Check": { "CheckID": format!("{id}-ttl"), "TTL": "300s", "Status": "passing" },
    })
}

async fn spine(mode: AdsMode) {
    let mut consul = Consul::start().await.expect("start consul");
    let dir = tempfile::tempdir().unwrap();
    let app = start_meshbridge(&consul, dir.path()).await.expect("start meshbridge");
    let b1 = Backend::start("127.0.0.1", "backend-1").await.unwrap();
    let b2 = Backend::start("127.0.0.1", "backend-2").await.unwrap();
    consul.register(instance("web-1", &b1, "127.0.0.1")).await.unwrap();
    // No service address: the node's address must be used.
    consul.register(instance("web-2", &b2, "")).await.unwrap();

    let envoy = Envoy::start(app.xds_addr, mode, CLUSTER).await.expect("start envoy");
    wait_for_traffic(&envoy, 200, &["backend-1", "backend-2"], "both instances serve").await;

    // A failing check removes that instance alone.
    let t0 = SystemTime::now();
    consul.set_ttl_check("web-2-ttl", CheckStatus::Fail).await.unwrap();
    let latency = eds_ack_after(&app, t0).await;
    println!("FIGURE consul_change_to_envoy_eds_ack mode={mode:?} ms={:.1}", latency.as_secs_f64() * 1e3);
    wait_for_traffic(&envoy, 200, &["backend-1"], "failed check removes web-2").await;

    // Deregistering the last passing instance empties the cluster: 503.
    consul.deregister("web-1").await.unwrap();
    wait_for_traffic(&envoy, 503, &[], "last instance gone").await;

    // Back to one instance, then Consul goes away: the endpoint must stay.
    consul.register(instance("web-1", &b1, "127.0.0.1")).await.unwrap();
    wait_for_traffic(&envoy, 200, &["backend-1"], "re-registered").await;
    consul.stop();
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.cache.statuses().iter().any(|(_, st, ..)| st.healthy) {
        assert!(Instant::now() < deadline, "registry still reported healthy with Consul stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (statuses, bodies) = sample(&envoy, 20).await;
    assert_eq!(
        (statuses, bodies),
        (BTreeSet::from([200]), BTreeSet::from(["backend-1".to_string()])),
        "Consul outage must keep endpoints"
    );
    let clusters = envoy.admin("/clusters").await.unwrap();
    assert!(clusters.contains(&format!("{CLUSTER}::{}", b1.addr)), "envoy lost the endpoint:\n{clusters}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_to_envoy_sotw() {
    spine(AdsMode::Sotw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_to_envoy_delta() {
    spine(AdsMode::Delta).await;
}
