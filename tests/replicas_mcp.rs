//! What istiod receives does not depend on which replica it asks, or on a
//! restart (issue 37): two meshbridge processes on one config directory,
//! and one of them started again, send every MCP resource with the same
//! name, `create_time` and version. A Pilot-like SotW client
//! (`meshbridge::testing::SotwClient`) asks each for every collection.

use std::collections::BTreeMap;
use std::time::Duration;

use meshbridge::run::{App, RunArgs};
use meshbridge::testing::SotwClient;
use meshbridge_proto::istio::mcp::v1alpha1 as mcp;
use prost::Message;

const COLLECTIONS: [&str; 4] = [
    "networking.istio.io/v1/Gateway",
    "networking.istio.io/v1/VirtualService",
    "networking.istio.io/v1/DestinationRule",
    "networking.istio.io/v1/ServiceEntry",
];

const INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: shop
  creationTimestamp: "2024-01-02T03:04:05Z"
  annotations:
    higress.io/destination: web.static:80
    nginx.ingress.kubernetes.io/load-balance: round_robin
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}}
"#;

/// name → (create_time seconds, version) of every resource `app` serves.
async fn served(app: &App) -> BTreeMap<String, (i64, String)> {
    let mut client = SotwClient::connect(app.xds_addr).await.unwrap();
    let mut out = BTreeMap::new();
    for collection in COLLECTIONS {
        client.send(SotwClient::request(collection, &[], "", "")).await;
        let resp = tokio::time::timeout(Duration::from_secs(10), client.recv()).await.expect("an answer");
        client.ack(&resp, &[]).await;
        for any in &resp.resources {
            let meta = mcp::Resource::decode(any.value.as_slice()).unwrap().metadata.unwrap();
            out.insert(meta.name, (meta.create_time.unwrap().seconds, meta.version));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_and_restarts_send_istiod_the_same_objects() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("mcpbridge.yaml"),
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {name: default, namespace: higress-system}\n\
         spec:\n  registries:\n    - {type: static, name: web, domain: '10.0.0.1:80,10.0.0.2:80', port: 80}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("ingress.yaml"), INGRESS).unwrap();

    let first = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    // A second replica starts a second later: a clock-based time would differ.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    let (a, b) = (served(&first).await, served(&second).await);
    let kinds: Vec<&str> = a.keys().map(String::as_str).collect();
    assert!(a.len() >= 4, "a Gateway, a VirtualService, DestinationRules and a ServiceEntry: {kinds:?}");
    assert_eq!(a, b, "two replicas");
    assert!(a.values().any(|(t, _)| *t == 1_704_164_645), "the Ingress's creationTimestamp: {a:?}");

    first.stop().await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let restarted = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    assert_eq!(served(&restarted).await, b, "after a restart");
    restarted.stop().await;
    second.stop().await;
}
