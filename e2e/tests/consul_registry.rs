//! The Consul watcher against a real Consul dev agent (`MESHBRIDGE_CONSUL_BIN`,
//! see `e2e/env.sh`). Each test starts its own agent. Blocking `wait` and the
//! resync period are 2 s, and every assertion polls the recorded sink calls
//! with a 10 s deadline.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshbridge_e2e::consul::{CheckStatus, Consul};
use meshbridge_e2e::recorder::{Event, Recorder};
use meshbridge_registries::consul::ConsulWatcher;
use meshbridge_registries::{Endpoint, RegistryError, RegistryKind, RegistrySpec, Secret, Service, Update};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(2);
const REFRESH: Duration = Duration::from_secs(2);
const DEADLINE: Duration = Duration::from_secs(10);

/// Run a Consul watcher on `spec`, recording its sink calls.
fn watch(spec: RegistrySpec) -> Recorder {
    Recorder::start(Box::new(ConsulWatcher::new(spec).expect("valid spec").with_wait(WAIT)), DEADLINE)
}

fn spec(port: u16) -> RegistrySpec {
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "consul-e2e", "127.0.0.1", port);
    spec.consul_refresh_interval = Some(REFRESH);
    spec
}

/// A service instance with a passing TTL check whose ID is the instance's.
fn instance(id: &str, name: &str, address: &str, port: u16, extra: Value) -> Value {
    let mut def = json!({
        "ID": id, "Name": name, "Address": address, "Port": port,
        "Check": {"CheckID": id, "TTL": "120s", "Status": "passing"},
    });
    if let (Some(def), Value::Object(extra)) = (def.as_object_mut(), extra) {
        def.extend(extra);
    }
    def
}

async fn consul() -> Consul {
    Consul::start().await.expect("start consul (source e2e/env.sh consul)")
}

const WEB: &str = "web.dc1.consul";

#[tokio::test]
async fn instances_follow_registrations_and_ttl_checks() {
    let consul = consul().await;
    let meta = json!({"Meta": {"version": "v1", "note": "not a label value"}, "Weights": {"Passing": 3, "Warning": 1}});
    consul.register(instance("web-a", "web", "127.0.0.2", 8082, meta)).await.unwrap();

    let mut rec = watch(spec(consul.http_port));
    rec.until("startup snapshot", |r| r.snapshot_since(0).is_some()).await;
    let first = rec.updates_since(0)[0].clone();
    let Update::Snapshot(all) = first else { panic!("first update must be the ready snapshot: {first:?}") };
    assert_eq!(all.len(), 1, "{all:?}");
    let web = &all[0];
    assert_eq!(web.host, WEB);
    assert_eq!(web.ports.len(), 1);
    assert_eq!((web.ports[0].number, web.ports[0].name.as_str()), (8082, "http-8082"));
    let labels = BTreeMap::from([("version".to_string(), "v1".to_string())]);
    let a = Endpoint { address: "127.0.0.2".into(), port: 8082, weight: 3, labels: labels.into() };
    assert_eq!(web.endpoints, vec![a]);
    assert!(rec.since(0).any(|e| matches!(e, Event::Healthy)));

    // Empty Service.Address: the node's address (the dev agent binds 127.0.0.1).
    let mark = rec.mark();
    consul.register(instance("web-b", "web", "", 8081, json!({}))).await.unwrap();
    let both = vec!["127.0.0.1:8081".to_string(), "127.0.0.2:8082".to_string()];
    rec.until("both instances", |r| r.endpoints(WEB) == Some(both.clone())).await;
    assert!(rec.updates_since(mark).iter().any(|u| matches!(u, Update::Upsert(s) if s.endpoints.len() == 2)));
    assert_eq!(rec.view[WEB].ports[0].number, 8081, "the lowest instance port");

    consul.set_ttl_check("web-a", CheckStatus::Fail).await.unwrap();
    rec.until("web-a gone once critical", |r| r.endpoints(WEB) == Some(vec!["127.0.0.1:8081".into()])).await;

    // web-a is still registered (critical), so the service stays, empty.
    let mark = rec.mark();
    consul.deregister("web-b").await.unwrap();
    rec.until("authoritative empty web", |r| {
        r.updates_since(mark).iter().any(|u| matches!(u, Update::Upsert(s) if s.host == WEB && s.endpoints.is_empty()))
    })
    .await;
    assert_eq!(rec.view[WEB].ports[0].number, 8081, "an empty service keeps its last port");

    consul.deregister("web-a").await.unwrap();
    rec.until("web removed", |r| r.updates_since(mark).iter().any(|u| **u == Update::Remove(WEB.into()))).await;
    assert!(rec.view.is_empty(), "{:?}", rec.view);
}

#[tokio::test]
async fn tag_filter_vport_protocol_and_underscored_names() {
    let consul = consul().await;
    consul.register(instance("pay-1", "pay_api", "127.0.0.5", 7001, json!({"Tags": ["Mesh", "v1"]}))).await.unwrap();
    consul.register(instance("edge-1", "edge", "127.0.0.6", 7002, json!({"Tags": ["edge"]}))).await.unwrap();
    consul.register(instance("plain-1", "plain", "127.0.0.7", 7003, json!({}))).await.unwrap();

    let mut spec = spec(consul.http_port);
    spec.consul_service_tag = Some("mESH".into());
    spec.protocol = Some("grpc".into());
    spec.vport_services.insert("pay-api.dc1.consul".into(), 9000); // by host, as Higress
    let mut rec = watch(spec);
    rec.until("startup snapshot", |r| r.snapshot_since(0).is_some()).await;
    let all = rec.snapshot_since(0).unwrap().clone();
    let hosts: Vec<&str> = all.iter().map(|s| s.host.as_str()).collect();
    assert_eq!(hosts, vec!["pay-api.dc1.consul"]);
    assert_eq!(all[0].ports[0].name, "grpc-9000", "vport and protocol");
    assert_eq!(all[0].endpoints[0].port, 7001, "endpoints keep the instance port");

    consul.register(instance("late-1", "late", "127.0.0.8", 7004, json!({"Tags": ["MESH"]}))).await.unwrap();
    rec.until("late service", |r| r.view.contains_key("late.dc1.consul")).await;
    assert_eq!(rec.view["late.dc1.consul"].ports[0].name, "grpc-7004");

    // Let a periodic resync pass, then check nothing untagged ever showed up.
    let mark = rec.mark();
    rec.until("a periodic snapshot", |r| r.snapshot_since(mark).is_some()).await;
    let seen: Vec<&str> = rec.view.keys().map(String::as_str).collect();
    assert_eq!(seen, vec!["late.dc1.consul", "pay-api.dc1.consul"]);
    let leaked = rec
        .updates_since(0)
        .into_iter()
        .any(|u| format!("{u:?}").contains("edge.") || format!("{u:?}").contains("plain."));
    assert!(!leaked, "untagged services must not be reported:\n{}", rec.dump());
}

#[tokio::test]
async fn acl_token_is_sent_and_never_leaked() {
    const TOKEN: &str = "e2e-master-token-4f1c";
    let consul = Consul::start_with_acl(TOKEN).await.expect("start consul with ACLs");
    consul.register(instance("web-1", "web", "127.0.0.9", 8080, json!({}))).await.unwrap();

    // With the token: the datacenter comes from /v1/agent/self (which needs
    // agent:read) and the catalog shows web.
    let mut with = spec(consul.http_port);
    with.auth.insert("consulToken".into(), Secret::new(TOKEN));
    let mut rec = watch(with);
    rec.until("web with the token", |r| r.endpoints(WEB) == Some(vec!["127.0.0.9:8080".into()])).await;

    // A wrong token: 403 errors naming the call, no updates, no token in any message.
    let mut wrong = spec(consul.http_port);
    wrong.auth.insert("consulToken".into(), Secret::new("wrong-token-77aa"));
    let mut bad = watch(wrong);
    bad.until("two 403s", |r| {
        r.errors_since(0)
            .iter()
            .filter(|e| matches!(e, RegistryError::Status { status: 403, what, .. } if what == "/v1/agent/self"))
            .count()
            >= 2
    })
    .await;
    assert!(bad.updates_since(0).is_empty(), "{}", bad.dump());
    assert!(!bad.dump().contains("wrong-token-77aa") && !rec.dump().contains(TOKEN));

    // No token and a fixed datacenter: the default-deny policy filters the
    // catalog to nothing, so the token above really was what showed web.
    let mut anonymous = spec(consul.http_port);
    anonymous.consul_datacenter = Some("dc1".into());
    let mut anon = watch(anonymous);
    anon.until("anonymous snapshot", |r| r.snapshot_since(0).is_some()).await;
    assert_eq!(anon.snapshot_since(0).unwrap(), &Vec::<Service>::new());
}

#[tokio::test]
async fn outage_keeps_endpoints_then_restart_resyncs() {
    let mut consul = consul().await;
    consul.register(instance("web-1", "web", "127.0.0.3", 8080, json!({}))).await.unwrap();
    let mut rec = watch(spec(consul.http_port));
    rec.until("web", |r| r.endpoints(WEB) == Some(vec!["127.0.0.3:8080".into()])).await;

    let mark = rec.mark();
    let stopped = Instant::now();
    consul.stop();
    // The outage window covers more than a resync period and errors from
    // both change detectors.
    rec.until("errors over a resync period", |r| {
        let errors = r.errors_since(mark);
        let last = r.last_at().unwrap_or(stopped);
        let said = |path: &str| errors.iter().any(|e| e.to_string().contains(path));
        errors.len() >= 6
            && said("/v1/catalog/services")
            && said("/v1/health/state/critical")
            && last.duration_since(stopped) > REFRESH + Duration::from_millis(500)
    })
    .await;
    assert!(rec.errors_since(mark).iter().all(|e| matches!(e, RegistryError::Unreachable { .. })), "{}", rec.dump());
    assert!(rec.updates_since(mark).is_empty(), "no update while Consul is down:\n{}", rec.dump());
    assert_eq!(rec.endpoints(WEB), Some(vec!["127.0.0.3:8080".into()]));

    // The agent reloads its services from the data dir, but TTL checks come
    // back critical: the fresh snapshot says web has no instances, and a
    // passing check brings the instance back.
    let mark = rec.mark();
    consul.restart().await.expect("restart consul");
    rec.until("healthy and a fresh snapshot", |r| {
        r.since(mark).any(|e| matches!(e, Event::Healthy)) && r.snapshot_since(mark).is_some()
    })
    .await;
    consul.set_ttl_check("web-1", CheckStatus::Pass).await.unwrap();
    rec.until("web back", |r| r.endpoints(WEB) == Some(vec!["127.0.0.3:8080".into()])).await;
}

/// A server that answers every request with 200, an index, and garbage,
/// and keeps the head of every request it got.
async fn garbage_server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                seen.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let body = "{\"web\": [\"a\"";
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nX-Consul-Index: 7\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
            });
        }
    });
    (port, heads)
}

#[tokio::test]
async fn garbage_answers_are_errors_not_updates() {
    const TOKEN: &str = "hdr-token-31d9";
    let (port, heads) = garbage_server().await;
    let mut spec = spec(port);
    spec.consul_datacenter = Some("dc1".into());
    spec.auth.insert("consulToken".into(), Secret::new(TOKEN));
    let mut rec = watch(spec);
    rec.until("two bad-response errors", |r| {
        r.errors_since(0)
            .iter()
            .filter(|e| matches!(e, RegistryError::BadResponse { what, .. } if what == "/v1/catalog/services"))
            .count()
            >= 2
    })
    .await;
    assert!(rec.updates_since(0).is_empty(), "{}", rec.dump());
    assert!(!rec.since(0).any(|e| matches!(e, Event::Healthy)), "garbage is not health");
    assert!(!rec.dump().contains(TOKEN));
    assert!(!rec.task.is_finished(), "the watcher keeps retrying");

    // What went on the wire: dc and the token header on every call.
    let heads = heads.lock().unwrap().clone();
    assert!(heads.len() >= 2, "{heads:?}");
    for head in &heads {
        let request_line = head.lines().next().unwrap_or_default();
        // The catalog (failing, retried) and the health probe.
        let path_ok =
            ["GET /v1/catalog/services?", "GET /v1/status/leader?"].iter().any(|p| request_line.starts_with(p));
        assert!(path_ok, "{request_line}");
        assert!(request_line.contains("dc=dc1"), "{request_line}");
        let token = format!("x-consul-token: {TOKEN}");
        assert!(head.lines().any(|l| l.eq_ignore_ascii_case(&token)), "{head}");
    }
}

/// Consul CE has no namespaces and answers `ns` with 400: a spec with
/// `consulNamespace` still works against it (the field is ignored, with a
/// warning), as it does with Higress.
#[tokio::test]
async fn consul_namespace_is_ignored_by_consul_ce() {
    let consul = consul().await;
    consul.register(instance("web-1", "web", "127.0.0.4", 8080, json!({}))).await.unwrap();
    let mut spec = spec(consul.http_port);
    spec.consul_namespace = Some("team-a".into());
    let mut rec = watch(spec);
    rec.until("web", |r| r.endpoints(WEB) == Some(vec!["127.0.0.4:8080".into()])).await;
    let first = rec.snapshot_since(0).cloned();
    assert!(first.is_some_and(|s| s.len() == 1), "{}", rec.dump());
    assert!(rec.errors_since(0).is_empty(), "no 400 for ns: {}", rec.dump());
}
