//! One config set, end to end: an Ingress in the config dir routes
//! `shop.example.com` through a standalone Envoy (listeners and routes over
//! ADS) to services found in a real Consul, with an 80/20 split across two
//! destinations given by Higress's `higress.io/destination` annotation.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::traffic::start_gateway;
use serde_json::json;

const HOST: &str = "shop.example.com";

fn config(consul_port: u16) -> String {
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
      vport: {{ default: 8080 }}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: orders
  namespace: shop
  creationTimestamp: "2026-01-01T00:00:00Z"
  annotations:
    higress.io/destination: orders.dc1.consul:8080
spec:
  ingressClassName: higress
  rules:
    - host: {HOST}
      http:
        paths:
          - path: /orders
            pathType: Prefix
            backend:
              resource: {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: users
  namespace: shop
  creationTimestamp: "2026-01-02T00:00:00Z"
  annotations:
    higress.io/destination: |
      80% users-a.dc1.consul:8080
      20% users-b.dc1.consul:8080
spec:
  ingressClassName: higress
  rules:
    - host: {HOST}
      http:
        paths:
          - path: /users
            pathType: Prefix
            backend:
              resource: {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }}
"#
    )
}

async fn register(consul: &Consul, name: &str, backend: &Backend) {
    let body = json!({"ID": name, "Name": name, "Address": "127.0.0.1", "Port": backend.addr.port()});
    consul.register(body).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_routes_and_splits_traffic_through_envoy() {
    let consul = Consul::start().await.expect("start consul");
    let orders = Backend::start("127.0.0.1", "orders").await.unwrap();
    let users_a = Backend::start("127.0.0.1", "users-a").await.unwrap();
    let users_b = Backend::start("127.0.0.1", "users-b").await.unwrap();
    register(&consul, "orders", &orders).await;
    register(&consul, "users-a", &users_a).await;
    register(&consul, "users-b", &users_b).await;

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("shop.yaml"), config(consul.http_port)).unwrap();
    let gateway_port = free_port();
    let app = start_gateway(dir.path(), gateway_port).await.expect("start meshbridge");
    // The Istio side of the same set: Gateway, VirtualService, ServiceEntries.
    let mut rx = app.config.clone();
    let set = tokio::time::timeout(
        Duration::from_secs(15),
        rx.wait_for(|s| s.objects("ServiceEntry").count() == 3 && s.objects("VirtualService").next().is_some()),
    )
    .await
    .expect("config with the Ingress and all three services")
    .unwrap()
    .clone();
    for kind in ["Gateway", "VirtualService", "ServiceEntry"] {
        assert!(set.mcp.keys().any(|k| k.ends_with(kind)), "{kind} missing from MCP: {:?}", set.mcp.keys());
    }

    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, gateway_port).await.expect("start envoy");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok((200, body)) = envoy.get_host("/orders/42", HOST).await {
            assert_eq!(body, "orders");
            break;
        }
        assert!(Instant::now() < deadline, "/orders never routed\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Wait until both users destinations have endpoints, then count.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let clusters = envoy.admin("/clusters").await.unwrap();
        let ready = [&users_a, &users_b].iter().all(|b| clusters.contains(&b.addr.to_string()));
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "users clusters never got endpoints:\n{clusters}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..200 {
        let (status, body) = envoy.get_host("/users", HOST).await.unwrap();
        assert_eq!(status, 200, "{body}");
        *counts.entry(body).or_default() += 1;
    }
    let a = counts.get("users-a").copied().unwrap_or(0);
    let b = counts.get("users-b").copied().unwrap_or(0);
    println!("FIGURE ingress_weighted_split users-a={a} users-b={b} of 200 (want 160/40)");
    assert_eq!(a + b, 200, "{counts:?}");
    // 80/20 over 200 draws: the standard deviation is about 5.7, so ±25 is
    // over four sigma.
    assert!((135..=185).contains(&a), "split off 80/20: {counts:?}");

    // A host the Ingress does not name gets no route.
    let (status, _) = envoy.get_host("/orders", "other.example.com").await.unwrap();
    assert_eq!(status, 404);
    app.stop().await;
}
