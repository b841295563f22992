//! meshbridge as an MCP-over-xDS config source, driven by a client that
//! behaves like Istio Pilot's: SotW only, MeshConfig first, then one
//! wildcard request per collection (v1 or v1alpha3), never a NACK.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshbridge::testing::{SotwClient, XdsFixture};
use meshbridge::translate::mcp::MCP_RESOURCE_TYPE;
use meshbridge_proto::istio::mcp::v1alpha1 as mcp;
use meshbridge_registries::{Endpoint, Protocol, Service, ServicePort, Update};
use prost::Message;

const MESH_CONFIG: &str = "core/v1alpha1/MeshConfig";
const SE_V1: &str = "networking.istio.io/v1/ServiceEntry";
const SE_V1ALPHA3: &str = "networking.istio.io/v1alpha3/ServiceEntry";
const DR_V1: &str = "networking.istio.io/v1/DestinationRule";
const UNKNOWN: &str = "example.com/v1/Widget";
const QUIET: Duration = Duration::from_millis(300);

fn svc(host: &str, addrs: &[&str]) -> Service {
    let eps = addrs
        .iter()
        .map(|a| Endpoint {
            address: a.to_string(),
            port: 8080,
            weight: 2,
            labels: [("app".into(), "web".into())].into(),
        })
        .collect();
    Service::new(host, vec![ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() }], eps)
}

/// Decode an MCP response into name → (version, body type, spec JSON).
fn decode(resp: &DiscoveryResponse) -> BTreeMap<String, (String, String, serde_json::Value)> {
    resp.resources
        .iter()
        .map(|any| {
            assert_eq!(any.type_url, MCP_RESOURCE_TYPE);
            let r = mcp::Resource::decode(any.value.as_slice()).expect("mcp.Resource");
            let meta = r.metadata.expect("metadata");
            let body = r.body.expect("body");
            let kind = body.type_url.rsplit('.').next().unwrap().to_string();
            let spec = meshbridge_proto::decode_to_json(&format!("istio.networking.v1alpha3.{kind}"), &body.value)
                .expect("body decodes against the Istio schema");
            assert!(meta.create_time.is_some(), "create_time is set");
            (meta.name, (meta.version, body.type_url, spec))
        })
        .collect()
}

#[tokio::test]
async fn pilot_like_client_gets_every_type_answered_and_stable_versions() {
    let f = XdsFixture::start(vec![svc("web.dc1.consul", &["10.0.0.1", "10.0.0.2"])]).await;
    let mut pilot = SotwClient::connect(f.addr).await.unwrap();

    // Pilot asks for MeshConfig first; we produce none, but must answer.
    for type_url in [MESH_CONFIG, SE_V1, SE_V1ALPHA3, DR_V1, UNKNOWN] {
        pilot.send(SotwClient::request(type_url, &[], "", "")).await;
        let resp = pilot.recv().await;
        assert_eq!(resp.type_url, type_url, "the requested type URL is echoed back");
        pilot.ack(&resp, &[]).await;
        match type_url {
            SE_V1 | SE_V1ALPHA3 => {
                let got = decode(&resp);
                let (version, body_type, spec) = &got["mcp/web.dc1.consul"];
                assert_eq!(body_type, "type.googleapis.com/istio.networking.v1alpha3.ServiceEntry");
                assert_eq!(spec["hosts"], serde_json::json!(["web.dc1.consul"]));
                assert_eq!(spec["resolution"], "STATIC");
                assert_eq!(spec["endpoints"][0]["ports"]["http-8080"], 8080);
                assert!(!version.is_empty());
            }
            _ => assert!(resp.resources.is_empty(), "{type_url}: nothing produced, empty answer"),
        }
    }
    assert!(pilot.recv_within(QUIET).await.is_none(), "ACKs are not answered");

    // A no-op resync (same content) pushes nothing.
    f.sink.update(Update::Snapshot(vec![svc("web.dc1.consul", &["10.0.0.2", "10.0.0.1"])]));
    assert!(pilot.recv_within(QUIET).await.is_none(), "an unchanged set must not be pushed");

    // A real change is pushed for both ServiceEntry subscriptions, each as
    // the full state of its type with its own type URL.
    f.sink.update(Update::Upsert(svc("api.dc1.consul", &["10.0.1.1"])));
    let mut pushed = BTreeMap::new();
    for _ in 0..2 {
        let resp = pilot.recv().await;
        pilot.ack(&resp, &[]).await;
        pushed.insert(resp.type_url.clone(), decode(&resp));
    }
    assert_eq!(pushed.keys().map(String::as_str).collect::<Vec<_>>(), vec![SE_V1, SE_V1ALPHA3]);
    let names: Vec<&String> = pushed[SE_V1].keys().collect();
    assert_eq!(names, vec!["mcp/api.dc1.consul", "mcp/web.dc1.consul"]);

    // Versions are per-resource content hashes: a reconnecting Pilot sees
    // the same version for an unchanged object.
    let before = pushed[SE_V1]["mcp/web.dc1.consul"].0.clone();
    drop(pilot);
    let mut again = SotwClient::connect(f.addr).await.unwrap();
    again.send(SotwClient::request(SE_V1, &[], "", "")).await;
    let resp = again.recv().await;
    assert_eq!(decode(&resp)["mcp/web.dc1.consul"].0, before);
}

#[tokio::test]
async fn hosts_that_are_not_kubernetes_names_get_valid_object_names() {
    // Pilot drops an object with an invalid name without a word; a host
    // such as Dubbo's `providers:…` must still reach it, under a valid name.
    let f = XdsFixture::start(vec![svc("web.dc1.consul", &["10.0.0.1"])]).await;
    f.sink.update(Update::Upsert(svc("providers:com.example.Greeter:1.0.0:.zookeeper", &["10.0.0.9"])));
    let mut rx = f.config.clone();
    let set = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| s.service_entries.len() == 2))
        .await
        .expect("published")
        .unwrap()
        .clone();
    assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    let names: Vec<&String> = set.mcp["networking.istio.io/ServiceEntry"].keys().collect();
    assert_eq!(names.len(), 2);
    assert!(names[0].starts_with("mcp/providers-com.example.greeter-1.0.0.zookeeper-"), "{names:?}");
    let mut pilot = SotwClient::connect(f.addr).await.unwrap();
    pilot.send(SotwClient::request(SE_V1, &[], "", "")).await;
    let got = decode(&pilot.recv().await);
    let dubbo = got.values().find(|(_, _, spec)| spec["hosts"][0] == "providers:com.example.Greeter:1.0.0:.zookeeper");
    assert!(dubbo.is_some(), "the host itself is kept: {got:?}");
}
