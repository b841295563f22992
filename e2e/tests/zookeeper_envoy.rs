//! A Dubbo provider registered in a real ZooKeeper becomes a real Envoy's
//! cluster member, through meshbridge (in-process, on free ports). Dubbo is
//! not HTTP, so this checks cluster membership in Envoy's admin `/clusters`,
//! not traffic.
//!
//! Needs `source e2e/env.sh zookeeper envoy` (MESHBRIDGE_ZK_JAR, MESHBRIDGE_ENVOY_BIN).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use meshbridge::run::App;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::traffic::{self, wait_for_members};
use meshbridge_e2e::zookeeper::ZooKeeper;

const INTERFACE: &str = "com.example.Greeter";
/// vport pins the service port, so the cluster name is known up front;
/// endpoints keep their own ports.
const CLUSTER: &str = "outbound|20880||providers:com.example.Greeter:1.0.0:.zookeeper";

async fn start_meshbridge(zk: &ZooKeeper, dir: &std::path::Path) -> anyhow::Result<App> {
    let bridge = format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: zookeeper
      name: zk
      domain: 127.0.0.1
      port: {port}
      vport: {{ default: 20880 }}
"#,
        port = zk.port
    );
    traffic::start_meshbridge(dir, &bridge).await
}

fn provider_url(address: &str, port: u16) -> String {
    format!("dubbo://{address}:{port}/{INTERFACE}?version=1.0.0&application=greeter&side=provider")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dubbo_provider_becomes_an_envoy_cluster_member() {
    let mut zk = ZooKeeper::start().await.expect("start zookeeper");
    let c = zk.client().await.unwrap();
    let (p1, p2) = (free_port(), free_port());
    let first = c.add_dubbo_provider(INTERFACE, &provider_url("127.0.0.1", p1)).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let app = start_meshbridge(&zk, dir.path()).await.expect("start meshbridge");
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, CLUSTER).await.expect("start envoy");
    let one = format!("127.0.0.1:{p1}");
    wait_for_members(&envoy, CLUSTER, &[&one], "the registered provider").await;

    let two = format!("127.0.0.2:{p2}");
    c.add_dubbo_provider(INTERFACE, &provider_url("127.0.0.2", p2)).await.unwrap();
    wait_for_members(&envoy, CLUSTER, &[&one, &two], "a second provider").await;

    c.delete_tree(&first).await.unwrap();
    wait_for_members(&envoy, CLUSTER, &[&two], "the first provider deregistered").await;

    // ZooKeeper goes away: the registry turns unhealthy, the member stays.
    zk.stop();
    let deadline = Instant::now() + Duration::from_secs(20);
    while app.cache.statuses().iter().any(|(_, st, ..)| st.healthy) {
        assert!(Instant::now() < deadline, "registry still reported healthy with ZooKeeper stopped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(envoy.members(CLUSTER).await, BTreeSet::from([two]), "a ZooKeeper outage must keep endpoints");
    app.stop().await;
}
