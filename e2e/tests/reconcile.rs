//! Reconciling McpBridge edits against a real Consul: a spec change
//! restarts the watcher without dropping its services, removing the
//! registry removes them, and the admin API shows what is served.

use std::sync::Arc;
use std::time::{Duration, Instant};

use meshbridge::run::{App, RunArgs};
use meshbridge::translate::ConfigSet;
use meshbridge::translate::envoy::CLUSTER_TYPE;
use meshbridge_e2e::consul::Consul;
use serde_json::json;
use tokio::sync::watch;

const CLUSTER: &str = "outbound|9000||api.dc1.consul";

fn bridge(consul_port: u16, refresh_secs: u64) -> String {
    format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: consul
      name: local
      domain: 127.0.0.1
      port: {consul_port}
      consulDatacenter: dc1
      consulRefreshInterval: {ns}
"#,
        ns = refresh_secs * 1_000_000_000
    )
}

fn has_cluster(set: &ConfigSet) -> bool {
    set.envoy.get(CLUSTER_TYPE).is_some_and(|c| c.contains_key(CLUSTER))
}

/// Wait until the published config satisfies `pred`.
async fn wait_config(
    rx: &mut watch::Receiver<Arc<meshbridge::publish::Published>>,
    what: &str,
    pred: impl Fn(&ConfigSet) -> bool,
) {
    let res = tokio::time::timeout(Duration::from_secs(15), rx.wait_for(|s| pred(s))).await;
    assert!(matches!(res, Ok(Ok(_))), "timed out waiting for: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_change_restarts_without_flap_and_removal_empties() {
    let consul = Consul::start().await.expect("start consul");
    consul.register(json!({"ID": "api-1", "Name": "api", "Address": "127.0.0.1", "Port": 9000})).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bridge.yaml");
    std::fs::write(&file, bridge(consul.http_port, 30)).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    let mut rx = app.config.clone();
    wait_config(&mut rx, "api cluster", has_cluster).await;

    // /debug/configz shows the ServiceEntry in Istio's field names.
    let url = format!("http://{}/debug/configz", app.admin_addr);
    let configz: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    let se = &configz["items"][0];
    assert_eq!(se["kind"], "ServiceEntry");
    assert_eq!(se["spec"]["hosts"][0], "api.dc1.consul");
    assert_eq!(se["spec"]["endpoints"][0]["ports"]["http-9000"], 9000);
    let ready = reqwest::get(format!("http://{}/ready", app.admin_addr)).await.unwrap();
    assert_eq!(ready.status(), 200);

    // Edit the spec: the watcher restarts. Every config published from now
    // until the new watcher's first full sync must still hold the cluster.
    let mut watch_all = app.config.clone();
    let watcher = tokio::spawn(async move {
        let mut flapped = false;
        let deadline = Instant::now() + Duration::from_secs(6);
        while Instant::now() < deadline {
            if tokio::time::timeout(Duration::from_millis(200), watch_all.changed()).await.is_ok() {
                flapped |= !has_cluster(&watch_all.borrow_and_update());
            }
        }
        flapped
    });
    let synced_before = app.cache.statuses()[0].1.last_sync_time;
    std::fs::write(&file, bridge(consul.http_port, 31)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st = app.cache.statuses();
        // A full sync newer than the old watcher's: the new watcher's first.
        if st.len() == 1 && st[0].1.ready && st[0].1.last_sync_time > synced_before {
            break;
        }
        assert!(Instant::now() < deadline, "restarted watcher never synced: {st:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!watcher.await.unwrap(), "the cluster disappeared while the watcher restarted");
    assert!(has_cluster(&app.config.borrow()));

    // Remove the registry: its services go.
    std::fs::write(&file, "# no registries\n").unwrap();
    wait_config(&mut rx, "cluster removed", |s| !has_cluster(s)).await;
    assert!(app.cache.statuses().is_empty());
    app.stop().await;
}
