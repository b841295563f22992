//! The admin API over real HTTP, fed from a cache driven by hand: JSON
//! shapes and field names, errors, readiness, the Higress-compatible
//! watcher status, the xDS client view and the metrics exposition.

use std::sync::Arc;
use std::time::Duration;

use meshbridge::admin::{AdminState, Auth};
use meshbridge::cache::{Cache, RegistryKey};
use meshbridge::metrics::Metrics;
use meshbridge::publish::Published;
use meshbridge::testing::SotwClient;
use meshbridge::testing::exposition;
use meshbridge::translate::envoy::CLUSTER_TYPE;
use meshbridge::translate::{Inputs, Translator};
use meshbridge::xds::{AdsServer, Clients};
use meshbridge_registries::{Endpoint, Protocol, RegistryKind, RegistrySpec, Secret, Service, ServicePort, Update};
use serde_json::Value;
use tokio::sync::watch;

struct Fixture {
    admin: String,
    xds: std::net::SocketAddr,
    cache: Arc<Cache>,
    tx: watch::Sender<Arc<Published>>,
    translator: std::sync::Mutex<Translator>,
}

impl Fixture {
    async fn start() -> Fixture {
        let cache = Cache::new();
        let clients = Clients::new();
        let mut translator = Translator::new();
        translator.apply(cache.take_all(), &Inputs::default(), true);
        let (tx, config) = watch::channel(Arc::new(Published::ready(translator.set().clone())));
        let metrics = Arc::new(Metrics::new(cache.clone(), clients.clone(), config.clone()));
        let state = AdminState {
            cache: cache.clone(),
            config: config.clone(),
            clients: clients.clone(),
            metrics,
            auth: Auth::Open,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, meshbridge::admin::router(state)).await });
        let xds_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let xds = xds_listener.local_addr().unwrap();
        let ads = AdsServer::new(config, clients);
        tokio::spawn(ads.serve(xds_listener, std::future::pending()));
        Fixture { admin, xds, cache, tx, translator: std::sync::Mutex::new(translator) }
    }

    /// Publish the cache's changes, as the publisher task does (with the
    /// change time, for the latency metrics).
    fn publish(&self) {
        let mut t = self.translator.lock().unwrap();
        t.apply(self.cache.take_changes(), &Inputs::default(), false);
        self.tx.send_replace(Arc::new(Published::ready(t.set().clone())));
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = reqwest::get(format!("{}{path}", self.admin)).await.unwrap();
        let status = resp.status().as_u16();
        let ctype = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}, {ctype}): {text}"));
        (status, body)
    }

    async fn metrics(&self) -> Vec<exposition::Sample> {
        let resp = reqwest::get(format!("{}/metrics", self.admin)).await.unwrap();
        assert_eq!(resp.status(), 200);
        let ctype = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
        let text = resp.text().await.unwrap();
        exposition::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }
}

fn web() -> Service {
    let ep = |a: &str| Endpoint {
        address: a.into(),
        port: 8080,
        weight: 1,
        labels: [("version".to_string(), "v1".to_string())].into(),
    };
    Service::new(
        "web.dc1.consul",
        vec![ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() }],
        vec![ep("10.0.0.1"), ep("10.0.0.2")],
    )
}

fn is_rfc3339(v: &Value) -> bool {
    v.as_str().is_some_and(|s| s.len() == 24 && s.ends_with('Z') && s.as_bytes()[10] == b'T')
}

#[tokio::test]
async fn registries_api_shapes_errors_and_readiness() {
    let f = Fixture::start().await;
    let consul = RegistryKey::new(RegistryKind::Consul, "shared");
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "shared", "127.0.0.1", 8500);
    spec.auth.insert("consulToken".into(), Secret::new("tok-admin-http"));
    f.cache.describe(&consul, &spec);
    let sink = f.cache.attach(&consul);

    // Attached but not synced: not ready.
    let (status, body) = f.get("/ready").await;
    assert_eq!((status, &body["waitingFor"][0]), (503, &Value::from("consul/shared")));

    sink.update(Update::Snapshot(vec![web()]));
    // A second registry of another type with the same name, which fails.
    let nacos = RegistryKey::new(RegistryKind::Nacos2, "shared");
    f.cache.describe(&nacos, &RegistrySpec::new(RegistryKind::Nacos2, "shared", "127.0.0.1", 1));
    f.cache.set_failed(&nacos, "shared: type: registry type nacos2 is not supported yet");
    f.publish();
    assert_eq!(f.get("/ready").await.0, 200);

    let (status, list) = f.get("/v1/registries").await;
    assert_eq!(status, 200);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    // Type order: nacos2 sorts before consul.
    let (n, c) = (&list[0], &list[1]);
    let mut keys: Vec<&str> = c.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "conflicts",
            "consecutiveFailures",
            "endpoint",
            "endpoints",
            "healthy",
            "lastChangeTime",
            "lastError",
            "lastErrorTime",
            "lastRepair",
            "lastSyncTime",
            "missing",
            "name",
            "ready",
            "repairs",
            "services",
            "sharedServices",
            "stale",
            "type",
            "unreachableSince",
            "withdrawn"
        ]
    );
    assert_eq!((&c["sharedServices"], &c["conflicts"]), (&Value::from(0), &serde_json::json!([])));
    assert_eq!(c["type"], "consul");
    assert_eq!(c["endpoint"], "127.0.0.1:8500");
    assert_eq!((c["healthy"].as_bool(), c["ready"].as_bool()), (Some(true), Some(true)));
    assert_eq!((c["services"].as_u64(), c["endpoints"].as_u64()), (Some(1), Some(2)));
    assert!(is_rfc3339(&c["lastSyncTime"]) && is_rfc3339(&c["lastChangeTime"]), "{c}");
    assert!(c["lastError"].is_null() && c["lastErrorTime"].is_null());
    let zero = serde_json::json!({"index_reset": 0, "missed_change": 0, "name_resolution": 0, "stale_read": 0, "unreadable": 0});
    assert_eq!((&c["repairs"], &c["lastRepair"]), (&zero, &Value::Null), "every kind listed, at 0");
    sink.repaired(meshbridge_registries::RepairKind::IndexReset, &["web.dc1.consul".to_string()]);
    let (_, one) = f.get("/v1/registries/shared?type=consul").await;
    assert_eq!(one["repairs"]["index_reset"], 1);
    assert_eq!(
        (&one["lastRepair"]["kind"], &one["lastRepair"]["count"]),
        (&Value::from("index_reset"), &Value::from(1))
    );
    assert_eq!(one["lastRepair"]["services"], serde_json::json!(["web.dc1.consul"]));
    assert!(is_rfc3339(&one["lastRepair"]["time"]), "{one}");
    assert_eq!(n["type"], "nacos2");
    assert_eq!((n["healthy"].as_bool(), n["ready"].as_bool()), (Some(false), Some(false)));
    assert!(n["lastError"].as_str().unwrap().contains("not supported"));
    assert!(is_rfc3339(&n["lastErrorTime"]));
    assert_eq!(n["consecutiveFailures"], 1);

    // By name: the first type unless ?type= says which.
    assert_eq!(f.get("/v1/registries/shared").await.1["type"], "nacos2");
    let (_, one) = f.get("/v1/registries/shared?type=consul&services=true").await;
    assert_eq!(one["type"], "consul");
    assert_eq!(one["serviceList"][0]["host"], "web.dc1.consul");
    assert_eq!(one["serviceList"][0]["endpoints"], 2);
    assert_eq!(one["serviceList"][0]["ports"][0]["number"], 8080);
    assert!(f.get("/v1/registries/shared?type=consul").await.1.get("serviceList").is_none());

    let (status, svc) = f.get("/v1/registries/shared/services/web.dc1.consul?type=consul").await;
    assert_eq!(status, 200, "{svc}");
    assert_eq!(svc["host"], "web.dc1.consul");
    assert_eq!(svc["ports"][0]["protocol"], "HTTP");
    let ep = &svc["endpoints"][0];
    assert_eq!(
        (ep["address"].as_str(), ep["port"].as_u64(), ep["weight"].as_u64()),
        (Some("10.0.0.1"), Some(8080), Some(1))
    );
    assert_eq!(ep["labels"]["version"], "v1");
    assert_eq!(ep["healthSource"], "consul: all checks passing");

    // Errors are JSON with a message.
    for (path, want) in [
        ("/v1/registries/nope", 404),
        ("/v1/registries/shared?type=bogus", 400),
        ("/v1/registries/shared?services=maybe", 400),
        ("/v1/registries/shared/services/nope.dc1.consul?type=consul", 404),
        ("/v1/registries/shared/services/web.dc1.consul", 404), // nacos2 "shared" has no such service
        ("/no/such/endpoint", 404),
        ("/v1/registries/%FF", 400), // not UTF-8
    ] {
        let (status, body) = f.get(path).await;
        assert_eq!(status, want, "{path}: {body}");
        assert!(body["error"].as_str().is_some_and(|m| !m.is_empty()), "{path}: {body}");
    }
    let resp = reqwest::Client::new().post(format!("{}/v1/registries", f.admin)).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert!(resp.json::<Value>().await.unwrap()["error"].is_string());

    // Higress's shape: a bare array of {name, type, healthy, ready}.
    let (_, ws) = f.get("/registry/watcherStatus").await;
    assert_eq!(
        ws,
        serde_json::json!([
            {"name": "shared", "type": "nacos2", "healthy": false, "ready": false},
            {"name": "shared", "type": "consul", "healthy": true, "ready": true},
        ])
    );

    // configz lists the ServiceEntry.
    let (_, configz) = f.get("/debug/configz").await;
    let items = configz["items"].as_array().unwrap();
    assert!(
        items.iter().any(|o| o["kind"] == "ServiceEntry" && o["spec"]["hosts"][0] == "web.dc1.consul"),
        "{configz}"
    );

    // No credential anywhere.
    for path in ["/v1/registries", "/v1/registries/shared?type=consul&services=true", "/debug/configz", "/metrics"] {
        let text = reqwest::get(format!("{}{path}", f.admin)).await.unwrap().text().await.unwrap();
        assert!(!text.contains("tok-admin-http"), "{path} shows the token");
    }
}

#[tokio::test]
async fn xdsz_and_metrics_follow_events() {
    let f = Fixture::start().await;
    let key = RegistryKey::new(RegistryKind::Consul, "c");
    let sink = f.cache.attach(&key);
    sink.update(Update::Snapshot(vec![]));
    sink.synced(Duration::from_millis(3));
    f.publish();

    let m = f.metrics().await;
    let reg = [("name", "c"), ("type", "consul")];
    assert_eq!(exposition::value(&m, "meshbridge_registry_up", &reg), Some(1.0));
    assert_eq!(exposition::value(&m, "meshbridge_registry_endpoints", &reg), Some(0.0));
    assert_eq!(exposition::value(&m, "meshbridge_registry_events_total", &reg), Some(1.0));
    assert_eq!(exposition::value(&m, "meshbridge_registry_sync_duration_seconds_count", &reg), Some(1.0));
    assert!(exposition::value(&m, "meshbridge_registry_last_sync_age_seconds", &reg).is_some());
    assert_eq!(exposition::value(&m, "meshbridge_xds_connected_clients", &[("mode", "sotw")]), Some(0.0));
    assert_eq!(exposition::value(&m, "meshbridge_config_objects", &[("kind", "ServiceEntry")]), Some(0.0));
    assert_eq!(exposition::value(&m, "meshbridge_config_rejected_objects", &[("reason", "host_conflict")]), Some(0.0));

    // A client subscribes to clusters; a registry event reaches it.
    let mut client = SotwClient::connect(f.xds).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let first = client.recv().await;
    client.ack(&first, &[]).await;
    sink.update(Update::Upsert(web()));
    f.publish();
    let pushed = client.recv().await;
    assert_eq!(pushed.resources.len(), 1);
    client.ack(&pushed, &[]).await;

    let cds = [("type_url", CLUSTER_TYPE), ("mode", "sotw")];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let m = loop {
        let m = f.metrics().await;
        if exposition::value(&m, "meshbridge_xds_event_to_ack_seconds_count", &cds) == Some(1.0) {
            break m;
        }
        assert!(tokio::time::Instant::now() < deadline, "event-to-ACK never observed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(exposition::value(&m, "meshbridge_registry_events_total", &reg), Some(2.0));
    assert_eq!(exposition::value(&m, "meshbridge_registry_endpoints", &reg), Some(2.0));
    assert_eq!(exposition::value(&m, "meshbridge_xds_pushes_total", &cds), Some(2.0));
    assert!(exposition::value(&m, "meshbridge_xds_push_bytes_total", &cds).unwrap() > 0.0);
    assert_eq!(exposition::value(&m, "meshbridge_xds_event_to_send_seconds_count", &cds), Some(1.0));
    assert_eq!(exposition::value(&m, "meshbridge_xds_connected_clients", &[("mode", "sotw")]), Some(1.0));
    assert_eq!(exposition::value(&m, "meshbridge_config_objects", &[("kind", "Cluster")]), Some(1.0));
    assert_eq!(exposition::value(&m, "meshbridge_config_objects", &[("kind", "ServiceEntry")]), Some(1.0));

    // A NACK is counted and shown with its detail.
    sink.update(Update::Upsert(Service { endpoints: vec![], ..web() }));
    f.publish();
    let eds_only = client.recv_within(Duration::from_millis(500)).await;
    assert!(eds_only.is_none(), "CDS unchanged, nothing pushed on CDS: {eds_only:?}");
    sink.update(Update::Upsert(Service::new("api.dc1.consul", web().ports, vec![])));
    f.publish();
    let pushed = client.recv().await;
    client.nack(&pushed, &[], &first.version_info, "cluster rejected").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, xdsz) = f.get("/debug/xdsz").await;
        let c = &xdsz["clients"][0];
        let t = &c["types"][CLUSTER_TYPE];
        if t["nacks"] == 1 {
            assert_eq!(c["nodeId"], "test-envoy");
            assert_eq!(c["mode"], "sotw");
            assert!(is_rfc3339(&c["connectedAt"]), "{c}");
            assert_eq!(c["subscribedTypes"], serde_json::json!([CLUSTER_TYPE]));
            assert_eq!(t["wildcard"], true);
            assert_eq!(t["lastNackDetail"], "cluster rejected");
            assert_eq!(t["lastSentVersion"], pushed.version_info.as_str());
            assert!(is_rfc3339(&t["lastAckTime"]) && is_rfc3339(&t["lastNackTime"]), "{t}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "NACK never recorded: {xdsz}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = f.metrics().await;
    assert_eq!(exposition::value(&m, "meshbridge_xds_nacks_total", &cds), Some(1.0));
    drop(client);
}

/// The service page's table of what each client holds.
fn holders(body: &str) -> &str {
    let start = body.find("What each xDS client holds").unwrap_or_else(|| panic!("no holders table:\n{body}"));
    &body[start..]
}

/// GET `path` as a browser would: (status, headers, body).
async fn html(f: &Fixture, path: &str) -> (u16, reqwest::header::HeaderMap, String) {
    let resp = reqwest::get(format!("{}{path}", f.admin)).await.unwrap();
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.text().await.unwrap())
}

/// The status page: what the JSON shows, rendered on the server, every
/// value escaped, nothing loadable from anywhere, and a client's view of
/// a service's clusters.
#[tokio::test]
async fn the_status_page_shows_registries_services_and_clients_escaped() {
    let f = Fixture::start().await;
    let key = RegistryKey::new(RegistryKind::Consul, "c");
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "c", "127.0.0.1", 8500);
    spec.auth.insert("consulToken".into(), Secret::new("tok-status-page"));
    f.cache.describe(&key, &spec);
    let sink = f.cache.attach(&key);
    let hostile = Endpoint {
        address: "10.0.0.9".into(),
        port: 8080,
        weight: 1,
        labels: [("note".to_string(), "<script>alert(1)</script>".to_string())].into(),
    };
    let mut svc = web();
    svc.endpoints.push(hostile);
    sink.update(Update::Snapshot(vec![svc]));
    sink.synced(Duration::from_millis(1));
    f.publish();
    let mut client = SotwClient::connect(f.xds).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let first = client.recv().await;
    client.ack(&first, &[]).await;

    let (status, headers, body) = html(&f, "/").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert!(body.starts_with("<!DOCTYPE html>"), "{body}");
    assert!(body.contains("<a href=\"/ui/registries/consul/c\">c</a>"), "{body}");
    assert!(!body.contains("<script") && !body.contains("src="), "nothing to run or load:\n{body}");
    assert!(!body.contains("tok-status-page"), "a credential on the page");
    // The client and its ACK of the clusters' version.
    assert!(body.contains("Cluster"), "{body}");
    assert!(body.contains(&format!("<span class=\"ok\">{}</span>", first.version_info)), "{body}");

    let (status, _, body) = html(&f, "/ui/registries/consul/c").await;
    assert_eq!(status, 200);
    assert!(body.contains("<a href=\"/ui/registries/consul/c/services/web.dc1.consul\">web.dc1.consul</a>"), "{body}");

    let (status, _, body) = html(&f, "/ui/registries/consul/c/services/web.dc1.consul").await;
    assert_eq!(status, 200);
    assert!(body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "the label is escaped:\n{body}");
    assert!(!body.contains("<script"), "{body}");
    assert!(body.contains("outbound|8080||web.dc1.consul"), "its cluster:\n{body}");
    assert!(body.contains("consul: all checks passing"), "{body}");
    // The client ACKed the clusters: it holds this service's, at the
    // version served now.
    let held = holders(&body);
    assert!(held.contains("test-envoy") && held.contains("(current)"), "{held}");
    assert!(!held.contains("class=\"bad\""), "{held}");

    // The service's cluster changes (its port becomes gRPC) and the client
    // refuses it: it still holds the old version, and the refused one is
    // shown with the client's message.
    let mut grpc = web();
    grpc.ports[0].protocol = Protocol::Grpc;
    sink.update(Update::Upsert(grpc));
    f.publish();
    let pushed = client.recv().await;
    client.nack(&pushed, &[], &first.version_info, "h2 refused").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, _, body) = html(&f, "/ui/registries/consul/c/services/web.dc1.consul").await;
        let holders = holders(&body);
        if holders.contains("class=\"bad\"") {
            assert!(holders.contains("(not current)"), "{holders}");
            assert!(holders.contains("h2 refused"), "{holders}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the NACK never reached the page: {holders}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (status, _, body) = html(&f, "/ui/registries/consul/nope").await;
    assert_eq!(status, 404);
    assert!(body.contains("no registry consul/nope"), "{body}");
    // A name with markup in a path is escaped in the answer too.
    let (status, _, body) = html(&f, "/ui/registries/consul/%3Cb%3E").await;
    assert_eq!(status, 404);
    assert!(body.contains("no registry consul/&lt;b&gt;"), "{body}");
}
