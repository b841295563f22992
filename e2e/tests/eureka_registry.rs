//! The Eureka watcher against a real Spring Cloud Netflix Eureka server
//! (`meshbridge_e2e::eureka`, `MESHBRIDGE_EUREKA_SERVER_JAR`; see
//! `e2e/setup.sh eureka-server`). Each test starts its own servers on free
//! loopback ports. Changes go through Eureka's REST API as a discovery
//! client or an operator makes them. The watcher polls every 200 ms, and
//! every assertion waits on the recorded sink calls with a 20 s deadline
//! (the server answers at once: reads come from its read-write cache, which
//! every change invalidates; replication between peers is batched, about a
//! second).
//!
//! Cases the real server cannot be made to produce on demand run against
//! the fake, in `eureka_fake_cases.rs`.

use std::time::{Duration, Instant};

use meshbridge_e2e::eureka::{EurekaServer, instance, instances_of};
use meshbridge_e2e::free_port;
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::eureka::EurekaWatcher;
use meshbridge_registries::{RegistryError, RegistryKind, RegistrySpec, Update};
use serde_json::{Value, json};

const INTERVAL: Duration = Duration::from_millis(200);
const DEADLINE: Duration = Duration::from_secs(20);
const ORDERS: &str = "orders.eureka";

/// Run a Eureka watcher on `domain`, recording its sink calls.
fn watch(domain: &str) -> Recorder {
    let spec = RegistrySpec::new(RegistryKind::Eureka, "eureka-e2e", domain, 8761);
    Recorder::start(Box::new(EurekaWatcher::new(spec).expect("valid spec").with_interval(INTERVAL)), DEADLINE)
}

fn with(mut v: Value, extra: Value) -> Value {
    if let (Some(m), Value::Object(extra)) = (v.as_object_mut(), extra) {
        m.extend(extra);
    }
    v
}

async fn server() -> EurekaServer {
    EurekaServer::start().await.expect("start the Eureka server (source e2e/env.sh eureka-server)")
}

fn eps(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// `(status, overriddenStatus)` of one instance, as the server answers.
async fn statuses(eureka: &EurekaServer, id: &str) -> (String, String) {
    let apps = eureka.api.apps().await.expect("GET /eureka/apps");
    let (_, i) = instances_of(&apps).into_iter().find(|(_, i)| i["instanceId"] == id).expect("instance listed");
    let text = |k: &str| i[k].as_str().unwrap_or_default().to_string();
    (text("status"), text("overriddenStatus"))
}

#[tokio::test]
async fn up_down_and_out_of_service_through_the_rest_api() {
    let eureka = server().await;
    let api = &eureka.api;
    let meta = json!({"metadata": {"version": "v1", "note": "not a label value"}});
    api.register(with(instance("orders", "o1", "127.0.0.11", 8081, "UP"), meta)).await.unwrap();
    api.register(instance("orders", "o2", "127.0.0.12", 8080, "DOWN")).await.unwrap();
    api.register(instance("orders", "o3", "127.0.0.13", 8080, "UP")).await.unwrap();
    // An operator takes o3 out of service.
    api.set_status("ORDERS", "o3", "OUT_OF_SERVICE").await.unwrap();
    // Registered UP with an override: the server applies it.
    let out = json!({"overriddenstatus": "OUT_OF_SERVICE"});
    api.register(with(instance("orders", "o4", "127.0.0.14", 8080, "UP"), out)).await.unwrap();
    // Registered DOWN with an override UP: the instance's own DOWN wins
    // (DownOrStartingRule), and the override stays in the answer.
    let up = json!({"overriddenstatus": "UP"});
    api.register(with(instance("orders", "o5", "127.0.0.15", 8082, "DOWN"), up)).await.unwrap();
    assert_eq!(statuses(&eureka, "o5").await, ("DOWN".into(), "UP".into()), "the server's override rules");
    assert_eq!(statuses(&eureka, "o4").await, ("OUT_OF_SERVICE".into(), "OUT_OF_SERVICE".into()));
    // An app with no UP instance is a service with no endpoints.
    api.register(instance("pay_api", "p1", "127.0.0.21", 9000, "STARTING")).await.unwrap();

    let mut rec = watch(&eureka.host_port());
    rec.until("startup snapshot, then healthy", |r| r.snapshots_since(0) > 0 && r.healthy_since(0)).await;
    let Some(Update::Snapshot(all)) = rec.updates_since(0).first().copied().cloned() else {
        panic!("the first update must be the ready snapshot: {:#?}", rec.events);
    };
    let hosts: Vec<&str> = all.iter().map(|s| s.host.as_str()).collect();
    assert_eq!(hosts, vec![ORDERS, "pay-api.eureka"]);
    assert_eq!(rec.endpoints(ORDERS).unwrap(), eps(&["127.0.0.11:8081"]), "only UP instances, o5 is DOWN");
    let orders = &rec.view[ORDERS];
    assert_eq!((orders.ports[0].number, orders.ports[0].name.as_str()), (8081, "http-8081"));
    let labels: Vec<(&str, &str)> = orders.endpoints[0].labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(labels, vec![("version", "v1")]);
    assert!(rec.view["pay-api.eureka"].endpoints.is_empty());
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.errors_since(0));

    // Back in service (override UP), and the DOWN instance reports UP
    // again by registering anew, as a client whose health check recovered.
    api.set_status("ORDERS", "o3", "UP").await.unwrap();
    api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    let three = eps(&["127.0.0.11:8081", "127.0.0.12:8080", "127.0.0.13:8080"]);
    rec.until("o2 and o3 back", |r| r.endpoints(ORDERS).as_ref() == Some(&three)).await;

    // An operator's DOWN, then the override dropped: o1 comes back UP.
    api.set_status("ORDERS", "o1", "DOWN").await.unwrap();
    rec.until("o1 down", |r| r.endpoints(ORDERS) == Some(eps(&["127.0.0.12:8080", "127.0.0.13:8080"]))).await;
    api.delete_override("ORDERS", "o1", "UP").await.unwrap();
    rec.until("o1 up again", |r| r.endpoints(ORDERS).as_ref() == Some(&three)).await;
    // o4's registration-time override dropped too.
    api.delete_override("ORDERS", "o4", "UP").await.unwrap();
    rec.until("o4 in", |r| r.endpoints(ORDERS).is_some_and(|e| e.contains(&"127.0.0.14:8080".to_string()))).await;
    api.register(instance("pay_api", "p1", "127.0.0.21", 9000, "UP")).await.unwrap();
    rec.until("p1 started", |r| r.endpoints("pay-api.eureka") == Some(eps(&["127.0.0.21:9000"]))).await;
    assert_eq!(rec.snapshots_since(0), 1, "every change came as a delta: {:#?}", rec.events);
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.errors_since(0));
}

#[tokio::test]
async fn deltas_add_modify_and_delete() {
    let eureka = server().await;
    let api = &eureka.api;
    api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS) == Some(eps(&["127.0.0.11:8080"]))).await;

    let mark = rec.mark();
    api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("added o2", |r| r.endpoints(ORDERS) == Some(eps(&["127.0.0.11:8080", "127.0.0.12:8080"]))).await;

    api.set_status("ORDERS", "o1", "OUT_OF_SERVICE").await.unwrap();
    rec.until("modified o1", |r| r.endpoints(ORDERS) == Some(eps(&["127.0.0.12:8080"]))).await;

    // Metadata changes by re-registration.
    let v2 = json!({"metadata": {"version": "v2"}});
    api.register(with(instance("orders", "o2", "127.0.0.12", 8080, "UP"), v2)).await.unwrap();
    rec.until("o2 relabelled", |r| {
        r.view
            .get(ORDERS)
            .is_some_and(|s| s.endpoints.iter().any(|e| e.labels.get("version").map(String::as_str) == Some("v2")))
    })
    .await;

    api.register(instance("billing", "b1", "127.0.0.31", 7000, "UP")).await.unwrap();
    rec.until("new app", |r| r.endpoints("billing.eureka") == Some(eps(&["127.0.0.31:7000"]))).await;
    // What the server's delta says of these changes: each instance once,
    // its newest state, with its action.
    let delta = api.delta().await.unwrap();
    let actions: Vec<(String, String)> = instances_of(&delta)
        .into_iter()
        .map(|(_, i)| (i["instanceId"].as_str().unwrap_or("").into(), i["actionType"].as_str().unwrap_or("").into()))
        .collect();
    for want in [("o1", "MODIFIED"), ("o2", "ADDED"), ("b1", "ADDED")] {
        assert!(actions.iter().any(|(id, a)| (id.as_str(), a.as_str()) == want), "{want:?} in {actions:?}");
    }
    api.deregister("BILLING", "b1").await.unwrap();
    rec.until("app removed", |r| r.updates_since(mark).iter().any(|u| **u == Update::Remove("billing.eureka".into())))
        .await;

    api.deregister("ORDERS", "o2").await.unwrap();
    rec.until("o2 deleted", |r| r.endpoints(ORDERS) == Some(vec![])).await;
    assert_eq!(rec.view[ORDERS].ports[0].number, 8080, "o1 is still registered: the app stays, empty");
    let delta = api.delta().await.unwrap();
    assert!(
        instances_of(&delta).iter().any(|(_, i)| i["instanceId"] == "o2" && i["actionType"] == "DELETED"),
        "{delta:#}"
    );

    // All of it came as deltas: upserts and a removal, never a full fetch
    // (each full fetch is a snapshot).
    assert_eq!(rec.snapshots_since(mark), 0, "{:#?}", rec.updates_since(mark));
    assert!(rec.errors_since(0).is_empty());
    assert!(rec.drift_since(0).is_empty());
}

/// Two peered servers: what one is told, it replicates to the other. The
/// watcher lists both; when the one it reads dies, the other answers with
/// the same registry, and nothing is reported as an error.
#[tokio::test]
async fn fails_over_between_peered_servers() {
    let (mut first, second) = EurekaServer::start_pair().await.expect("start two peered Eureka servers");
    first.api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    first.api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    replicated(&second, "o1 and o2", |apps| apps.len() == 2).await;

    // The first server listed is down from the start.
    let dead = format!("127.0.0.1:{}", free_port());
    let mut rec = watch(&format!("{dead},{}", second.host_port()));
    rec.until("snapshot from the second server", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    assert!(rec.errors_since(0).is_empty(), "a working failover is not an error: {:#?}", rec.events);
    drop(rec);

    let mut rec = watch(&format!("{},{}", first.host_port(), second.host_port()));
    rec.until("snapshot from the first server", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    // A change at the first server, replicated; then the first one dies.
    first.api.set_status("ORDERS", "o2", "OUT_OF_SERVICE").await.unwrap();
    rec.until("o2 out", |r| r.endpoints(ORDERS) == Some(eps(&["127.0.0.11:8080"]))).await;
    // Replication is batched and asynchronous: a change one server took is
    // lost if it dies before passing it on (seen here when the first server
    // was killed at once). Wait for the peer to have it.
    replicated(&second, "o2 OUT_OF_SERVICE", |apps| {
        apps.iter().any(|(_, i)| i["instanceId"] == "o2" && i["status"] == "OUT_OF_SERVICE")
    })
    .await;
    let mark = rec.mark();
    first.stop();
    // The second server answers; its delta queue is not the first one's,
    // so the watcher reads it whole, once, and then follows its deltas.
    second.api.register(instance("orders", "o3", "127.0.0.13", 8080, "UP")).await.unwrap();
    rec.until("the second server's view", |r| {
        r.endpoints(ORDERS) == Some(eps(&["127.0.0.11:8080", "127.0.0.13:8080"]))
    })
    .await;
    assert_eq!(rec.snapshots_since(mark), 1, "{:#?}", rec.updates_since(mark));
    second.api.deregister("ORDERS", "o1").await.unwrap();
    rec.until("a delta from the second server", |r| r.endpoints(ORDERS) == Some(eps(&["127.0.0.13:8080"]))).await;
    assert_eq!(rec.snapshots_since(mark), 1, "{:#?}", rec.updates_since(mark));
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.events);
}

/// Wait until `server`'s registry satisfies `done` (its instances, with
/// their app names).
async fn replicated(server: &EurekaServer, what: &str, done: impl Fn(&[(String, Value)]) -> bool) {
    let started = Instant::now();
    loop {
        let apps = server.api.apps().await.map(|a| instances_of(&a)).unwrap_or_default();
        if done(&apps) {
            return;
        }
        assert!(started.elapsed() < DEADLINE, "{what} not replicated to the peer: {apps:#?}\n{}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An instance that stops renewing its lease is evicted by the server (a
/// fake has no leases); one that renews stays.
#[tokio::test]
async fn an_instance_that_stops_renewing_is_evicted() {
    let eureka = server().await;
    let api = &eureka.api;
    let short = json!({"leaseInfo": {"renewalIntervalInSecs": 1, "durationInSecs": 2}});
    api.register(with(instance("orders", "o1", "127.0.0.11", 8080, "UP"), short.clone())).await.unwrap();
    api.register(with(instance("orders", "o2", "127.0.0.12", 8080, "UP"), short)).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("both", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    let mark = rec.mark();
    let started = Instant::now();
    // o1 renews every second, as its client would; o2 has gone silent.
    while rec.endpoints(ORDERS) != Some(eps(&["127.0.0.11:8080"])) {
        assert!(started.elapsed() < DEADLINE, "o2 not evicted: {:#?}\n{}", rec.events, eureka.log());
        api.heartbeat("ORDERS", "o1").await.unwrap();
        rec.idle(Duration::from_secs(1)).await;
    }
    // Eviction is a cancel: a delta, not a full fetch.
    assert_eq!(rec.snapshots_since(mark), 0, "{:#?}", rec.updates_since(mark));
    // And o1 is still there a few lease durations later.
    for _ in 0..5 {
        api.heartbeat("ORDERS", "o1").await.unwrap();
        rec.idle(Duration::from_secs(1)).await;
    }
    assert_eq!(rec.endpoints(ORDERS), Some(eps(&["127.0.0.11:8080"])));
}

/// A server with deltas disabled answers them 403: the watcher reads the
/// whole registry every round instead, and that is not an outage.
#[tokio::test]
async fn refused_deltas_fall_back_to_full_fetches() {
    let eureka = EurekaServer::start_with(&["--eureka.server.disable-delta=true"]).await.expect("start Eureka");
    let api = &eureka.api;
    assert!(api.delta().await.is_err_and(|e| e.to_string().contains("403")), "deltas are refused");
    api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS).is_some()).await;
    let mark = rec.mark();
    api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("o2 by a full fetch", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    assert!(rec.snapshots_since(mark) > 0);
    assert!(rec.errors_since(0).is_empty(), "a 403 on deltas is not an outage: {:#?}", rec.events);
}

#[tokio::test]
async fn outage_reports_errors_and_keeps_endpoints() {
    let mut eureka = server().await;
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS).is_some()).await;

    let mark = rec.mark();
    eureka.stop();
    rec.until("three errors", |r| r.errors_since(mark).len() >= 3).await;
    let errors = rec.errors_since(mark);
    assert!(errors.iter().all(|e| matches!(e, RegistryError::Unreachable { .. })), "{errors:#?}");
    assert!(errors.iter().all(|e| e.to_string().contains(&eureka.host_port())), "errors name the server");
    assert!(rec.updates_since(mark).is_empty(), "no update while Eureka is down: {:#?}", rec.events);
    assert_eq!(rec.endpoints(ORDERS), Some(eps(&["127.0.0.11:8080"])));
    assert!(!rec.task.is_finished(), "the watcher keeps retrying");

    // Back, empty (a standalone server keeps its registry in memory); the
    // clients register again, as theirs do when a heartbeat gets 404.
    let mark = rec.mark();
    eureka.restart_with(&[]).await.unwrap();
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    eureka.api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("healthy and a fresh snapshot with o1 and o2", |r| {
        r.healthy_since(mark) && r.snapshots_since(mark) > 0 && r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)
    })
    .await;
}

/// README: registry health and instance status are at most 10 s old. With
/// the default interval, a status change and an outage both show within it.
#[tokio::test]
async fn default_interval_refreshes_health_within_ten_seconds() {
    let mut eureka = server().await;
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    eureka.api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    let spec = RegistrySpec::new(RegistryKind::Eureka, "eureka-e2e", eureka.host_port(), 8761);
    let watcher = EurekaWatcher::new(spec).expect("valid spec");
    let mut rec: Recorder = Recorder::start(Box::new(watcher), Duration::from_secs(12));
    rec.until("both instances", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;

    let changed = Instant::now();
    eureka.api.set_status("ORDERS", "o2", "OUT_OF_SERVICE").await.unwrap();
    rec.until("o2 out within 10 s", |r| r.endpoints(ORDERS) == Some(eps(&["127.0.0.11:8080"]))).await;
    assert!(changed.elapsed() <= Duration::from_secs(11), "took {:?}", changed.elapsed());

    let mark = rec.mark();
    let stopped = Instant::now();
    eureka.stop();
    rec.until("the outage reported within 10 s", |r| !r.errors_since(mark).is_empty()).await;
    assert!(stopped.elapsed() <= Duration::from_secs(11), "took {:?}", stopped.elapsed());
}
