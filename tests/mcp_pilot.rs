//! meshbridge as an MCP-over-xDS config source, driven by a client that
//! behaves like Istio Pilot's: SotW only, MeshConfig first, then one
//! wildcard request per collection (v1 or v1alpha3), never a NACK.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshbridge::testing::{ISTIOD_1_27_ASKS_FOR, ISTIOD_MASTER_ALSO_ASKS_FOR, SotwClient, XdsFixture};
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
async fn adsc_watch_config_gets_every_collection_answered() {
    // Istio's ADSC `WatchConfig()` (the MCP client of many Istio releases)
    // sends every collection's first request with `time.Now().String()` as
    // its nonce; each must be answered, or that Pilot never gets config.
    // The requests are those of real istiods: 1.27.9's and master's (one
    // more collection), and a type no istiod knows yet.
    let f = XdsFixture::start(vec![svc("web.dc1.consul", &["10.0.0.1"])]).await;
    let mut adsc = SotwClient::connect(f.addr).await.unwrap();
    let asked: Vec<&str> =
        ISTIOD_1_27_ASKS_FOR.iter().chain(&ISTIOD_MASTER_ALSO_ASKS_FOR).chain(&[UNKNOWN]).copied().collect();
    for type_url in &asked {
        adsc.send(SotwClient::adsc_initial(type_url)).await;
    }
    let mut answered = BTreeMap::new();
    for _ in 0..asked.len() {
        let resp = adsc.recv().await;
        adsc.ack(&resp, &[]).await;
        answered.insert(resp.type_url.clone(), decode(&resp).into_keys().collect::<Vec<_>>());
    }
    assert_eq!(answered[SE_V1], ["mcp/web.dc1.consul"]);
    assert_eq!(
        answered.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        asked.into_iter().collect(),
        "{answered:?}"
    );
    assert!(adsc.recv_within(QUIET).await.is_none(), "ACKs are not answered");
    f.sink.update(Update::Upsert(svc("api.dc1.consul", &["10.0.1.1"])));
    let push = adsc.recv().await;
    assert_eq!(push.type_url, SE_V1);
    assert_eq!(push.resources.len(), 2);
}

#[tokio::test]
async fn hosts_that_are_not_kubernetes_names_get_valid_object_names() {
    // Pilot drops an object with an invalid name without a word; a host
    // such as Dubbo's `providers:…` must still reach it, under a valid name.
    let f = XdsFixture::start(vec![svc("web.dc1.consul", &["10.0.0.1"])]).await;
    f.sink.update(Update::Upsert(svc("providers:com.example.Greeter:1.0.0:.zookeeper", &["10.0.0.9"])));
    let mut rx = f.config.clone();
    let set = tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| s.objects("ServiceEntry").count() == 2))
        .await
        .expect("published")
        .unwrap()
        .clone();
    assert!(set.warnings.is_empty(), "{:?}", set.warnings().collect::<Vec<_>>());
    let names: Vec<&str> = set.mcp["networking.istio.io/ServiceEntry"].keys().map(|n| &**n).collect();
    assert_eq!(names.len(), 2);
    assert!(names[0].starts_with("mcp/providers-com.example.greeter-1.0.0.zookeeper-"), "{names:?}");
    let mut pilot = SotwClient::connect(f.addr).await.unwrap();
    pilot.send(SotwClient::request(SE_V1, &[], "", "")).await;
    let got = decode(&pilot.recv().await);
    let dubbo = got.values().find(|(_, _, spec)| spec["hosts"][0] == "providers:com.example.Greeter:1.0.0:.zookeeper");
    assert!(dubbo.is_some(), "the host itself is kept: {got:?}");
}

const EF_V1ALPHA3: &str = "networking.istio.io/v1alpha3/EnvoyFilter";

/// A `dns` registry `partner` (https, SNI from its host) in the cache, and
/// the Desired that names proxy `corp` for it, served as the binary does.
struct ProxyFixture {
    addr: std::net::SocketAddr,
    desired: tokio::sync::watch::Sender<std::sync::Arc<meshbridge::config::Desired>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ProxyFixture {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn proxied_desired(proxied: bool) -> meshbridge::config::Desired {
    use meshbridge_registries::{RegistryKind, RegistrySpec};
    let mut partner = RegistrySpec::new(RegistryKind::Dns, "partner", "api.partner.example", 443);
    partner.protocol = Some("https".into());
    partner.proxy_name = proxied.then(|| "corp".into());
    let corp = meshbridge::config::ProxySpec {
        name: "corp".into(),
        server_address: "10.1.1.1".into(),
        server_port: 3128,
        listener_port: Some(50010),
        connect_timeout: None,
    };
    meshbridge::config::Desired { registries: vec![partner], proxies: vec![corp], ..Default::default() }
}

impl ProxyFixture {
    async fn start() -> ProxyFixture {
        use meshbridge::cache::{Cache, RegistryKey};
        use meshbridge_registries::{RegistryKind, Tls};
        let cache = Cache::new();
        let partner = Service::new(
            "partner.dns",
            vec![ServicePort { number: 443, protocol: Protocol::Https, name: "https-443".into() }],
            vec![Endpoint { address: "203.0.113.7".into(), port: 443, weight: 1, labels: Default::default() }],
        )
        .with_tls(Tls { sni: Some("api.partner.example".into()) });
        cache.attach(&RegistryKey::new(RegistryKind::Dns, "partner")).update(Update::Snapshot(vec![partner]));
        let (desired, rx) = tokio::sync::watch::channel(std::sync::Arc::new(proxied_desired(true)));
        let mut tasks = Vec::new();
        let config = meshbridge::publish::spawn(
            &cache,
            rx,
            Default::default(),
            meshbridge::startup::StartupGate::new(std::time::Duration::ZERO),
            &mut tasks,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = meshbridge::xds::AdsServer::new(config, meshbridge::xds::Clients::new());
        tasks.push(tokio::spawn(async move {
            let _ = server.serve(listener, std::future::pending()).await;
        }));
        ProxyFixture { addr, desired, tasks }
    }
}

#[tokio::test]
async fn pilot_gets_the_proxy_envoy_filters() {
    let f = ProxyFixture::start().await;
    let mut pilot = SotwClient::connect(f.addr).await.unwrap();
    pilot.send(SotwClient::request(EF_V1ALPHA3, &[], "", "")).await;
    let resp = pilot.recv().await;
    assert_eq!(resp.type_url, EF_V1ALPHA3);
    pilot.ack(&resp, &[]).await;
    let got = decode(&resp);
    let names: Vec<&String> = got.keys().collect();
    assert_eq!(
        names,
        [
            "higress-system/istio-autogenerated-k8s-ingress-proxy-corp",
            "higress-system/istio-autogenerated-k8s-ingress-service-proxy"
        ]
    );

    // The proxy: CLUSTER ADD and LISTENER ADD at the gateway; the patch
    // values (google.protobuf.Struct) come back as the Envoy JSON they were.
    let (_, body_type, spec) = &got["higress-system/istio-autogenerated-k8s-ingress-proxy-corp"];
    assert_eq!(body_type, "type.googleapis.com/istio.networking.v1alpha3.EnvoyFilter");
    let patches = spec["configPatches"].as_array().unwrap();
    let shape: Vec<(&str, &str, &str)> = patches
        .iter()
        .map(|p| {
            (
                p["applyTo"].as_str().unwrap(),
                p["match"]["context"].as_str().unwrap(),
                p["patch"]["operation"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(shape, [("CLUSTER", "GATEWAY", "ADD"), ("LISTENER", "GATEWAY", "ADD")]);
    assert_eq!(patches[0]["patch"]["value"]["name"], "outbound|3128||corp.proxy");
    assert_eq!(patches[0]["patch"]["value"]["type"], "STATIC");
    let listener = &patches[1]["patch"]["value"];
    assert_eq!(
        listener["address"]["socket_address"],
        serde_json::json!({"address": "127.0.0.1", "port_value": 50010.0})
    );
    let tcp = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    assert_eq!(tcp["@type"], "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy");
    assert_eq!(tcp["tunneling_config"]["hostname"], "%REQUESTED_SERVER_NAME%:443");

    // The service: its cluster removed and added back pointing at the tunnel.
    let (_, _, spec) = &got["higress-system/istio-autogenerated-k8s-ingress-service-proxy"];
    let patches = spec["configPatches"].as_array().unwrap();
    assert_eq!(patches[0]["match"]["cluster"]["name"], "outbound|443||partner.dns");
    assert_eq!(patches[0]["patch"]["operation"], "REMOVE");
    let cluster = &patches[1]["patch"]["value"];
    assert_eq!(cluster["name"], "outbound|443||partner.dns");
    assert_eq!(cluster["transport_socket"]["typed_config"]["sni"], "api.partner.example");

    // proxyName removed: Pilot gets the filters again, without the service's.
    f.desired.send_replace(std::sync::Arc::new(proxied_desired(false)));
    let resp = pilot.recv().await;
    assert_eq!(resp.type_url, EF_V1ALPHA3);
    let names: Vec<String> = decode(&resp).into_keys().collect();
    assert_eq!(names, ["higress-system/istio-autogenerated-k8s-ingress-proxy-corp"]);
}

#[tokio::test]
async fn delta_mcp_sends_only_the_changed_object_where_sotw_resends_the_collection() {
    // Istio's istiod config-source client (`pkg/adsc`, `StreamAggregatedResources`)
    // speaks SotW only, so every change re-sends the whole collection to it;
    // a delta MCP client gets the changed object alone. Measured here at
    // 1,000 services × 10 endpoints (figures in BENCHMARKS.md).
    const SERVICES: usize = 1000;
    let addrs: Vec<String> = (1..=10).map(|i| format!("10.0.0.{i}")).collect();
    let addr_refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let all: Vec<Service> = (0..SERVICES).map(|i| svc(&format!("s{i}.dc1.consul"), &addr_refs)).collect();
    let f = XdsFixture::start(all).await;

    let mut sotw = SotwClient::connect(f.addr).await.unwrap();
    sotw.send(SotwClient::request(SE_V1, &[], "", "")).await;
    let first = sotw.recv().await;
    assert_eq!(first.resources.len(), SERVICES);
    sotw.ack(&first, &[]).await;

    let mut delta = meshbridge::testing::DeltaClient::connect(f.addr).await.unwrap();
    delta.send(meshbridge::testing::DeltaClient::subscribe(SE_V1, &["*"])).await;
    let first = delta.recv().await;
    assert_eq!(first.resources.len(), SERVICES);
    delta.ack(&first).await;

    let changes = 5;
    let (mut sotw_bytes, mut delta_bytes) = (0usize, 0usize);
    for round in 0..changes {
        let mut moved = addr_refs.clone();
        let extra = format!("10.0.1.{round}");
        moved.push(&extra);
        f.sink.update(Update::Upsert(svc("s7.dc1.consul", &moved)));
        let s = sotw.recv().await;
        sotw.ack(&s, &[]).await;
        assert_eq!(s.resources.len(), SERVICES, "SotW carries the whole collection");
        sotw_bytes += s.encoded_len();
        let d = delta.recv().await;
        delta.ack(&d).await;
        assert_eq!(d.resources.len(), 1, "delta carries the changed object alone");
        assert_eq!(d.resources[0].name, "mcp/s7.dc1.consul");
        assert!(d.removed_resources.is_empty());
        delta_bytes += d.encoded_len();
    }
    println!(
        "MCP ServiceEntry bytes per one-endpoint change at {SERVICES} services x 10: SotW {} delta {}",
        sotw_bytes / changes,
        delta_bytes / changes
    );
    assert!(sotw.recv_within(QUIET).await.is_none());
    assert!(delta.recv_within(QUIET).await.is_none());
}
