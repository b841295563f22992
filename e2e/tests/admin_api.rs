//! The admin API against a real Consul (`MESHBRIDGE_CONSUL_BIN`, see
//! `e2e/env.sh`), with meshbridge in-process on free ports:
//!
//! - registry health follows Consul going away and coming back, while the
//!   last known endpoints stay served;
//! - metrics parse and move when the registry changes;
//! - no credential ever appears in an admin answer or a log line (every
//!   test in this binary logs at debug level into one captured buffer);
//! - a non-loopback admin address requires the bearer token.
//!
//! Every wait polls with a deadline.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use meshbridge::lifecycle::LifecycleArgs;
use meshbridge::run::{AdminArgs, App, RunArgs, RunCommand};
use meshbridge::testing::SotwClient;
use meshbridge::testing::exposition;
use meshbridge::translate::envoy::CLUSTER_TYPE;
use meshbridge_e2e::captured_logs::logs;
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::free_port;
use meshbridge_e2e::netns::Netns;
use meshbridge_registries::Secret;
use serde_json::{Value, json};
use tokio::time::Instant;

fn consul_entry(name: &str, port: u16, extra: &str) -> String {
    format!(
        "    - type: consul\n      name: {name}\n      domain: 127.0.0.1\n      port: {port}\n      \
         consulDatacenter: dc1\n      consulRefreshInterval: 30000000000\n{extra}"
    )
}

fn bridge(entries: &[String]) -> String {
    format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n{}",
        entries.concat()
    )
}

async fn start(dir: &std::path::Path, yaml: &str) -> App {
    logs();
    std::fs::write(dir.join("bridge.yaml"), yaml).unwrap();
    App::start(RunArgs::loopback(dir)).await.expect("start meshbridge")
}

async fn get_text(app: &App, path: &str) -> (u16, String) {
    let resp = reqwest::get(format!("http://{}{path}", app.admin_addr)).await.expect(path);
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn get(app: &App, path: &str) -> Value {
    let (status, text) = get_text(app, path).await;
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

async fn metrics(app: &App) -> Vec<exposition::Sample> {
    let (status, text) = get_text(app, "/metrics").await;
    assert_eq!(status, 200);
    exposition::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Poll `check` every 100 ms until it returns `Some`, or fail after `secs`.
async fn until<T, F: Future<Output = Option<T>>>(what: &str, secs: u64, mut check: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs}s waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn has_api_endpoint(configz: &Value) -> bool {
    configz["items"].as_array().unwrap().iter().any(|o| {
        o["kind"] == "ServiceEntry"
            && o["spec"]["hosts"][0] == "api.dc1.consul"
            && o["spec"]["endpoints"][0]["address"] == "127.0.0.1"
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_consul_outage_and_recovery() {
    let mut consul = Consul::start().await.expect("start consul");
    consul.register(json!({"ID": "api-1", "Name": "api", "Address": "127.0.0.1", "Port": 9000})).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &bridge(&[consul_entry("local", consul.http_port, "")])).await;

    let r = until("registry healthy, ready, with the api endpoint", 15, || async {
        let r = get(&app, "/v1/registries/local").await;
        (r["healthy"] == true && r["ready"] == true && r["endpoints"] == 1).then_some(r)
    })
    .await;
    assert_eq!(r["type"], "consul");
    assert_eq!(r["endpoint"], format!("127.0.0.1:{}", consul.http_port));
    assert!(r["lastError"].is_null());
    let synced_before = r["lastSyncTime"].as_str().unwrap().to_string();
    let svc = get(&app, "/v1/registries/local/services/api.dc1.consul").await;
    assert_eq!(svc["endpoints"][0]["port"], 9000);
    assert_eq!(svc["endpoints"][0]["healthSource"], "consul: all checks passing");
    // The publisher translates the cache a moment after it changes.
    until("api served", 5, || async { has_api_endpoint(&get(&app, "/debug/configz").await).then_some(()) }).await;

    // Consul goes away: unhealthy within 15 s, endpoints kept and served.
    consul.stop();
    let r = until("registry unhealthy", 15, || async {
        let r = get(&app, "/v1/registries/local").await;
        (r["healthy"] == false).then_some(r)
    })
    .await;
    assert!(r["lastError"].as_str().is_some_and(|e| e.contains("unreachable")), "{r}");
    assert!(r["lastErrorTime"].is_string());
    assert!(r["consecutiveFailures"].as_u64().unwrap() >= 1);
    assert_eq!(r["endpoints"], 1, "an outage must not remove endpoints");
    assert_eq!(r["ready"], true);
    assert!(has_api_endpoint(&get(&app, "/debug/configz").await), "endpoints still served");
    assert_eq!(
        get(&app, "/registry/watcherStatus").await,
        json!([{"name": "local", "type": "consul", "healthy": false, "ready": true}])
    );
    let m = metrics(&app).await;
    let reg = [("name", "local"), ("type", "consul")];
    assert_eq!(exposition::value(&m, "meshbridge_registry_up", &reg), Some(0.0));
    let errors = [("name", "local"), ("type", "consul"), ("kind", "unreachable")];
    assert!(exposition::value(&m, "meshbridge_registry_errors_total", &errors).unwrap() >= 1.0);
    assert_eq!(exposition::value(&m, "meshbridge_registry_endpoints", &reg), Some(1.0));
    // Still unhealthy a probe period later: health is refreshed, not a one-time check.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(get(&app, "/v1/registries/local").await["healthy"], false);
    assert_eq!(get(&app, "/ready").await["ready"], true, "a failed registry does not hold readiness");

    // Consul comes back: healthy again, then a fresh full sync.
    consul.restart().await.expect("restart consul");
    until("registry healthy again", 20, || async {
        (get(&app, "/v1/registries/local").await["healthy"] == true).then_some(())
    })
    .await;
    // A restarted dev agent may answer the resync before its anti-entropy
    // has put `api` back in the (in-memory) catalog; the catalog detector
    // then brings the endpoint back.
    let r = until("resynced after recovery, with the api endpoint", 20, || async {
        let r = get(&app, "/v1/registries/local").await;
        (r["lastSyncTime"].as_str().is_some_and(|t| t > synced_before.as_str()) && r["endpoints"] == 1).then_some(r)
    })
    .await;
    assert_eq!(r["consecutiveFailures"], 0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_registry_events() {
    let consul = Consul::start().await.expect("start consul");
    consul.register(json!({"ID": "api-1", "Name": "api", "Address": "127.0.0.1", "Port": 9000})).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &bridge(&[consul_entry("local", consul.http_port, "")])).await;
    until("ready", 15, || async { (get(&app, "/v1/registries/local").await["ready"] == true).then_some(()) }).await;
    until("api served", 5, || async { has_api_endpoint(&get(&app, "/debug/configz").await).then_some(()) }).await;

    let mut client = SotwClient::connect(app.xds_addr).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let first = client.recv().await;
    client.ack(&first, &[]).await;

    let reg = [("name", "local"), ("type", "consul")];
    let cds = [("type_url", CLUSTER_TYPE), ("mode", "sotw")];
    let m = metrics(&app).await;
    let value = |m: &[exposition::Sample], name: &str, labels: &[(&str, &str)]| {
        exposition::value(m, name, labels).unwrap_or(0.0)
    };
    let events = value(&m, "meshbridge_registry_events_total", &reg);
    let pushes = value(&m, "meshbridge_xds_pushes_total", &cds);
    assert_eq!(value(&m, "meshbridge_registry_endpoints", &reg), 1.0);
    assert_eq!(value(&m, "meshbridge_registry_services", &reg), 1.0);
    assert!(value(&m, "meshbridge_registry_sync_duration_seconds_count", &reg) >= 1.0);
    assert!(exposition::value(&m, "meshbridge_registry_last_sync_age_seconds", &reg).is_some());
    assert_eq!(value(&m, "meshbridge_xds_connected_clients", &[("mode", "sotw")]), 1.0);

    // A new service: events, endpoints and pushes go up; the push is ACKed.
    consul.register(json!({"ID": "web-1", "Name": "web", "Address": "127.0.0.1", "Port": 9100})).await.unwrap();
    let pushed = client.recv_within(Duration::from_secs(10)).await.expect("CDS push for web");
    assert_eq!(pushed.resources.len(), 2);
    client.ack(&pushed, &[]).await;
    let m = until("metrics moved", 10, || async {
        let m = metrics(&app).await;
        (value(&m, "meshbridge_xds_event_to_ack_seconds_count", &cds) >= 1.0).then_some(m)
    })
    .await;
    assert!(value(&m, "meshbridge_registry_events_total", &reg) > events);
    assert_eq!(value(&m, "meshbridge_registry_endpoints", &reg), 2.0);
    assert!(value(&m, "meshbridge_xds_pushes_total", &cds) > pushes);
    assert!(value(&m, "meshbridge_xds_push_bytes_total", &cds) > 0.0);
    assert!(value(&m, "meshbridge_xds_event_to_send_seconds_count", &cds) >= 1.0);
    assert_eq!(value(&m, "meshbridge_config_objects", &[("kind", "Cluster")]), 2.0);
    assert_eq!(value(&m, "meshbridge_config_objects", &[("kind", "ServiceEntry")]), 2.0);

    let xdsz = get(&app, "/debug/xdsz").await;
    let c = &xdsz["clients"][0];
    assert_eq!(c["subscribedTypes"], json!([CLUSTER_TYPE]));
    assert_eq!(c["types"][CLUSTER_TYPE]["lastAck"], pushed.version_info.as_str());
    drop(client);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_shown_or_logged() {
    const CONSUL_TOKEN: &str = "acl-master-5e0d3b";
    const NACOS_PASSWORD: &str = "nacos-pw-8c41f2";
    const NACOS_AK: &str = "nacos-ak-27b9e6";
    const NACOS_SK: &str = "nacos-sk-d03a55";
    let secrets = [CONSUL_TOKEN, NACOS_PASSWORD, NACOS_AK, NACOS_SK];

    let consul = Consul::start_with_acl(CONSUL_TOKEN).await.expect("start consul with ACLs");
    consul.register(json!({"ID": "api-1", "Name": "api", "Address": "127.0.0.1", "Port": 9000})).await.unwrap();
    let dead = free_port();
    let nacos = format!(
        "    - type: nacos2\n      name: nacos-dead\n      domain: 127.0.0.1\n      port: {dead}\n      \
         nacosAccessKey: {NACOS_AK}\n      nacosSecretKey: {NACOS_SK}\n      authSecretName: nacos-auth\n"
    );
    let yaml = format!(
        "{}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: consul-acl, namespace: higress-system }}\n\
         stringData:\n  consulToken: {CONSUL_TOKEN}\n---\napiVersion: v1\nkind: Secret\n\
         metadata: {{ name: nacos-auth, namespace: higress-system }}\n\
         stringData:\n  nacosUsername: nacos\n  nacosPassword: {NACOS_PASSWORD}\n",
        bridge(&[consul_entry("acl", consul.http_port, "      authSecretName: consul-acl\n"), nacos])
    );
    let dir = tempfile::tempdir().unwrap();
    // The dead Nacos never answers: do not hold clients for the default 30 s.
    logs();
    std::fs::write(dir.path().join("bridge.yaml"), &yaml).unwrap();
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: AdminArgs::default(),
        gateway: Default::default(),
        lifecycle: LifecycleArgs { initial_sync_timeout: Duration::from_secs(1), ..Default::default() },
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .expect("start meshbridge");
    until("consul registry synced with the token", 15, || async {
        let r = get(&app, "/v1/registries/acl").await;
        (r["ready"] == true && r["endpoints"] == 1).then_some(())
    })
    .await;
    // Give the dead Nacos a while to fail (and log about it); not asserted,
    // since how soon it reports is the Nacos watcher's business.
    let _ = tokio::time::timeout(
        Duration::from_secs(15),
        until("nacos reports its failure", 15, || async {
            get(&app, "/v1/registries/nacos-dead").await["lastError"].as_str().map(str::to_string)
        }),
    )
    .await;
    let mut client = SotwClient::connect(app.xds_addr).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    client.recv().await;

    let paths = [
        "/healthz",
        "/ready",
        "/v1/registries",
        "/v1/registries/acl?services=true",
        "/v1/registries/nacos-dead?services=true",
        "/v1/registries/acl/services/api.dc1.consul",
        "/",
        "/ui/registries/consul/acl",
        "/ui/registries/consul/acl/services/api.dc1.consul",
        "/registry/watcherStatus",
        "/debug/configz",
        "/debug/xdsz",
        "/metrics",
        "/v1/registries/nope",
    ];
    for path in paths {
        let (_, body) = get_text(&app, path).await;
        for s in secrets {
            assert!(!body.contains(s), "{path} shows a credential: {body}");
        }
    }
    drop(client);
    app.stop().await;
    drop(consul);
    let logged = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    assert!(logged.contains("DEBUG"), "debug logs were not captured");
    assert!(logged.contains("effective config"), "startup config was not logged");
    for s in secrets {
        if let Some(line) = logged.lines().find(|l| l.contains(s)) {
            panic!("a credential was logged: {line}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_loopback_admin_requires_the_token() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    // Not loopback, and on no real interface: the host's end of a network
    // namespace's link.
    let ns = Netns::create().expect("a network namespace (this test needs root)");
    let ip = ns.host_ip();
    let args = RunArgs {
        config_dir: Some(dir.path().into()),
        xds_addr: "127.0.0.1:0".parse().unwrap(),
        admin_addr: SocketAddr::new(ip.into(), 0),
        ..RunArgs::loopback(dir.path())
    };
    let http = reqwest::Client::new();
    let protected = ["/", "/v1/registries", "/registry/watcherStatus", "/debug/configz", "/debug/xdsz", "/metrics"];

    // With a token: 401 without it or with a wrong one, 200 with it.
    let app = App::start_with(
        args.clone(),
        AdminArgs { admin_token: Some(Secret::new("admin-tok-61e0")), ..AdminArgs::default() },
    )
    .await
    .unwrap();
    let base = format!("http://{}", app.admin_addr);
    for path in ["/ready", "/healthz"] {
        assert_eq!(http.get(format!("{base}{path}")).send().await.unwrap().status(), 200, "{path} must stay open");
    }
    for path in protected {
        let url = format!("{base}{path}");
        let resp = http.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path} without a token");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        assert!(resp.json::<Value>().await.unwrap()["error"].is_string());
        assert_eq!(http.get(&url).bearer_auth("wrong").send().await.unwrap().status(), 401, "{path}");
        assert_eq!(http.get(&url).bearer_auth("admin-tok-61e0").send().await.unwrap().status(), 200, "{path}");
    }
    app.stop().await;

    // Without a token: protected endpoints refuse and say how to fix it.
    let app = App::start(args).await.unwrap();
    let base = format!("http://{}", app.admin_addr);
    assert_eq!(http.get(format!("{base}/ready")).send().await.unwrap().status(), 200);
    let resp = http.get(format!("{base}/v1/registries")).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("--admin-token"), "{body}");
    app.stop().await;
}
