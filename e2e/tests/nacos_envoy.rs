//! Nacos end to end on real parts: a service registered in rnacos, and in
//! Nacos 3.1.0, serves HTTP traffic through a real Envoy fed by meshbridge
//! (in-process, on free ports), and a change in the registry reaches Envoy
//! as an EDS update.
//!
//! Needs `source e2e/env.sh rnacos nacos-server envoy`
//! (MESHBRIDGE_RNACOS_BIN, MESHBRIDGE_NACOS_SERVER_JAR, MESHBRIDGE_ENVOY_BIN).

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

use meshbridge::run::App;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::nacos::{Flavor, Instance};
use meshbridge_e2e::nacos_server::Owned;
use meshbridge_e2e::traffic::{self, eds_ack_after, sample, wait_for_traffic};

/// `vport` pins the service port, so the cluster name is stable whatever
/// ports the backends got; endpoints keep theirs.
const CLUSTER: &str = "outbound|8080||web.DEFAULT-GROUP.public.nacos";

async fn start_meshbridge(nacos: &Owned, dir: &std::path::Path) -> anyhow::Result<App> {
    // A long refresh: what Envoy sees after a change comes from the push.
    let bridge = format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: nacos2
      name: local
      domain: 127.0.0.1
      port: {port}
      nacosRefreshInterval: 30000000000
      vport: {{ default: 8080 }}
"#,
        port = nacos.http_port()
    );
    traffic::start_meshbridge(dir, &bridge).await
}

fn instance(backend: &Backend) -> Instance {
    Instance::new("web", &backend.addr.ip().to_string(), backend.addr.port())
}

async fn spine(mode: AdsMode, flavor: Flavor) {
    let mut nacos = Owned::start(flavor).await.expect("start the server");
    let dir = tempfile::tempdir().unwrap();
    let app = start_meshbridge(&nacos, dir.path()).await.expect("start meshbridge");
    let b1 = Backend::start("127.0.0.1", "backend-1").await.unwrap();
    let b2 = Backend::start("127.0.0.1", "backend-2").await.unwrap();
    nacos.register(&instance(&b1)).await.unwrap();
    nacos.register(&instance(&b2)).await.unwrap();

    let envoy = Envoy::start(app.xds_addr, mode, CLUSTER).await.expect("start envoy");
    wait_for_traffic(&envoy, 200, &["backend-1", "backend-2"], "both instances serve").await;

    // Disabling an instance in Nacos takes it out: push → read → cache →
    // EDS. rnacos batches pushes (up to about 0.75 s), Nacos delays them
    // (500 ms), which dominates the figure.
    let t0 = SystemTime::now();
    nacos.update(&Instance { enabled: false, ..instance(&b2) }).await.unwrap();
    let latency = eds_ack_after(&app, t0).await;
    println!(
        "FIGURE nacos_push_to_envoy_eds_ack mode={mode:?} server={flavor:?} ms={:.1}",
        latency.as_secs_f64() * 1e3
    );
    // The share of it before meshbridge's cache changed: the server's delay
    // plus the push and our read of the service.
    let changed = app.cache.statuses().iter().filter_map(|(_, st, ..)| st.last_change_time).max();
    let to_cache = changed.and_then(|t| t.duration_since(t0).ok()).unwrap_or_default();
    println!("FIGURE nacos_push_to_cache mode={mode:?} server={flavor:?} ms={:.1}", to_cache.as_secs_f64() * 1e3);
    wait_for_traffic(&envoy, 200, &["backend-1"], "disabled instance removed").await;

    // Deregistering the last instance empties the cluster: 503.
    nacos.deregister(&instance(&b1)).await.unwrap();
    nacos.deregister(&instance(&b2)).await.unwrap();
    wait_for_traffic(&envoy, 503, &[], "last instance gone").await;

    // Back to one instance, then the server goes away: the endpoint must stay.
    nacos.register(&instance(&b1)).await.unwrap();
    wait_for_traffic(&envoy, 200, &["backend-1"], "re-registered").await;
    nacos.stop();
    let deadline = Instant::now() + Duration::from_secs(15);
    while app.cache.statuses().iter().any(|(_, st, ..)| st.healthy) {
        assert!(Instant::now() < deadline, "registry still reported healthy with the server stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (statuses, bodies) = sample(&envoy, 20).await;
    assert_eq!(
        (statuses, bodies),
        (BTreeSet::from([200]), BTreeSet::from(["backend-1".to_string()])),
        "a Nacos outage must keep endpoints"
    );
    let clusters = envoy.admin("/clusters").await.unwrap();
    assert!(clusters.contains(&format!("{CLUSTER}::{}", b1.addr)), "envoy lost the endpoint:\n{clusters}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_to_envoy_sotw() {
    spine(AdsMode::Sotw, Flavor::Rnacos).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos3_to_envoy_sotw() {
    spine(AdsMode::Sotw, Flavor::Nacos).await;
}
