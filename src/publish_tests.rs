use std::sync::Arc;
use std::time::Duration;

use meshbridge_registries::{Endpoint, Protocol, RegistryKind, Service, ServicePort, Update};
use tokio::sync::watch;

use super::*;
use crate::config::{build_desired, parse_documents};

const INGRESS: &str = "
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shop}
spec:
  ingressClassName: higress
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}
";

fn service(host: &str) -> Service {
    let port = ServicePort { number: 8080, protocol: Protocol::Http, name: "http".into() };
    let endpoint = Endpoint { address: "10.0.0.1".into(), port: 8080, weight: 1, labels: Default::default() };
    Service::new(host, vec![port], vec![endpoint])
}

/// A new Desired and a cache change that reach the publisher together
/// (as a kube Service upsert does with the Ingress that made it
/// referenced) both take effect, whichever of the two wakes it. The
/// publisher's select picks a ready branch at random, so each round is a
/// fresh coin toss; twelve rounds miss a lost config with odds of 1 in 4096.
#[tokio::test]
async fn a_config_change_that_arrives_with_a_cache_change_is_translated() {
    let docs = parse_documents("ingress.yaml", INGRESS).unwrap();
    let with_ingress = Arc::new(build_desired(&docs));
    assert_eq!(with_ingress.ingresses.len(), 1, "{:?}", with_ingress.errors);
    for round in 0..12 {
        let cache = Cache::new();
        let sink = cache.attach(&RegistryKey::new(RegistryKind::Consul, "test"));
        sink.update(Update::Snapshot(vec![service("a.consul")]));
        let (tx, rx) = watch::channel(Arc::new(Desired::default()));
        let mut tasks = Vec::new();
        let mut published = spawn(&cache, rx, PublishOptions::default(), StartupGate::new(Duration::ZERO), &mut tasks);
        // The publisher parks on its select (one thread: it runs only
        // when this task yields).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(published.borrow().objects("VirtualService").count(), 0);
        // Both at once, with no yield between.
        tx.send_replace(with_ingress.clone());
        sink.update(Update::Upsert(service("b.consul")));
        let routed = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if published.borrow_and_update().objects("VirtualService").count() > 0 {
                    return;
                }
                published.changed().await.expect("the publisher runs");
            }
        })
        .await;
        assert!(routed.is_ok(), "round {round}: the Ingress never reached the published set");
        for t in tasks {
            t.abort();
        }
    }
}
