//! `/v1/config` and the config metrics with meshbridge in-process on a
//! directory holding a good McpBridge, a copy of it in a second file, a
//! file that does not parse and an Ingress routing to a missing service;
//! and the Grafana dashboard's queries against the real `/metrics`.

use std::collections::BTreeSet;
use std::time::Duration;

use meshbridge::lifecycle::LifecycleArgs;
use meshbridge::run::{App, RunArgs, RunCommand};
use meshbridge::testing::SotwClient;
use meshbridge::testing::exposition;
use meshbridge::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};
use serde_json::Value;

const BRIDGE: &str = "apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {name: default, namespace: higress-system}
spec:
  registries:
    - {type: static, name: legacy, domain: '127.0.0.1:9', port: 80}
    - {type: consul, name: gone, domain: 127.0.0.1, port: 1}
";

const INGRESS: &str = "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: shop
  annotations: {higress.io/destination: 'orders.eureka:8080'}
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}}
";

async fn get(base: &str, path: &str) -> String {
    reqwest::get(format!("{base}{path}")).await.unwrap().text().await.unwrap()
}

#[tokio::test]
async fn config_status_lists_files_errors_and_warnings_and_the_dashboard_matches_metrics() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("20-copy.yaml"), BRIDGE).unwrap();
    std::fs::write(dir.path().join("30-broken.yaml"), "kind: [").unwrap();
    std::fs::write(dir.path().join("40-ingress.yaml"), INGRESS).unwrap();
    std::fs::write(dir.path().join("mcpbridge.yaml"), BRIDGE).unwrap();
    // The Consul registry never answers: serve without waiting for it.
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: Default::default(),
        gateway: Default::default(),
        lifecycle: LifecycleArgs { initial_sync_timeout: Duration::from_millis(300), ..Default::default() },
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .unwrap();
    let base = format!("http://{}", app.admin_addr);

    // Poll until the first config set with the Ingress is published.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let status: Value = loop {
        let v: Value = serde_json::from_str(&get(&base, "/v1/config").await).unwrap();
        if v["warnings"].as_array().is_some_and(|w| !w.is_empty()) || tokio::time::Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let files: Vec<(&str, &str)> = status["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["name"].as_str().unwrap().rsplit('/').next().unwrap(), f["state"].as_str().unwrap()))
        .collect();
    assert!(files.contains(&("30-broken.yaml", "ignored")), "{status:#}");
    assert!(files.contains(&("20-copy.yaml", "loaded")), "{status:#}");
    let errors: Vec<&str> = status["errors"].as_array().unwrap().iter().map(|e| e.as_str().unwrap()).collect();
    assert!(errors.iter().any(|e| e.contains("30-broken.yaml")), "{errors:?}");
    assert!(
        errors.iter().any(|e| e.contains("defined more than once (") && e.contains("/20-copy.yaml and /")),
        "the duplicate names both files: {errors:?}"
    );
    let warning = status["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["reason"] == "no_cluster")
        .unwrap_or_else(|| panic!("a 503 route is a warning: {status:#}"));
    assert!(warning["object"].as_str().unwrap().contains("VirtualService"), "{warning}");
    assert!(warning["detail"].as_str().unwrap().contains("orders.eureka"), "{warning}");

    // Traffic that fills every xDS family: a stream, a registry change
    // after it connected (latency histograms), an ACK and a NACK.
    let mut client = SotwClient::connect(app.xds_addr).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let cds = client.recv().await;
    client.ack(&cds, &[]).await;
    let name = "outbound|80||legacy.static";
    client.send(SotwClient::request(ENDPOINT_TYPE, &[name], "", "")).await;
    let eds = client.recv().await;
    client.ack(&eds, &[name]).await;
    // 20-copy.yaml comes first, so its copy is the one in force.
    std::fs::write(dir.path().join("20-copy.yaml"), BRIDGE.replace("127.0.0.1:9", "127.0.0.1:10")).unwrap();
    let changed = client.recv_within(Duration::from_secs(15)).await.expect("the endpoint change is pushed");
    client.ack(&changed, &[name]).await;
    std::fs::write(dir.path().join("20-copy.yaml"), BRIDGE.replace("127.0.0.1:9", "127.0.0.1:11")).unwrap();
    let again = client.recv_within(Duration::from_secs(15)).await.expect("the second change is pushed");
    client.nack(&again, &[name], &changed.version_info, "test: rejected").await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let text = get(&base, "/metrics").await;
    let samples = exposition::parse(&text).unwrap();
    assert_eq!(exposition::value(&samples, "meshbridge_config_errors", &[]), Some(errors.len() as f64));
    assert_eq!(
        exposition::value(&samples, "meshbridge_config_rejected_objects", &[("reason", "no_cluster")]),
        Some(1.0)
    );

    // Every metric a dashboard query names is a family in /metrics.
    let dashboard: Value =
        serde_json::from_str(include_str!("../../deploy/grafana/meshbridge-dashboard.json")).unwrap();
    let families: BTreeSet<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                let Some(name) = word.strip_prefix("meshbridge_").map(|_| word) else { continue };
                let family = ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|f| families.contains(f))
                    .unwrap_or(name);
                assert!(families.contains(family), "panel {:?} queries {name}, not in /metrics", panel["title"]);
                checked += 1;
            }
        }
    }
    assert!(checked >= 18, "the dashboard queries {checked} metrics");
}
