//! The Eureka watcher against the fake Eureka server (`e2e/src/eureka_fake.rs`;
//! no real Eureka is installed here). Each test starts its own fakes on free
//! ports. The watcher polls every 200 ms, and every assertion waits on the
//! recorded sink calls with a 10 s deadline.

use std::time::Duration;

use meshbridge_e2e::eureka_fake::{EurekaFake, instance};
use meshbridge_e2e::free_port;
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::eureka::EurekaWatcher;
use meshbridge_registries::{RegistryError, RegistryKind, RegistrySpec, Update};
use serde_json::{Value, json};

const INTERVAL: Duration = Duration::from_millis(200);
const DEADLINE: Duration = Duration::from_secs(10);

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

async fn fake() -> EurekaFake {
    EurekaFake::start().await.expect("start the fake Eureka")
}

const ORDERS: &str = "orders.eureka";

#[tokio::test]
async fn only_up_instances_with_overrides_winning() {
    let eureka = fake().await;
    let meta = json!({"metadata": {"version": "v1", "note": "not a label value"}});
    eureka.register(with(instance("orders", "o1", "127.0.0.11", 8081, "UP"), meta)).await.unwrap();
    eureka.register(instance("orders", "o2", "127.0.0.12", 8080, "DOWN")).await.unwrap();
    eureka.register(instance("orders", "o3", "127.0.0.13", 8080, "UP")).await.unwrap();
    eureka.set_status("ORDERS", "o3", "OUT_OF_SERVICE").await.unwrap();
    // Registered UP with an override: the override wins.
    let overridden = json!({"overriddenstatus": "OUT_OF_SERVICE"});
    eureka.register(with(instance("orders", "o4", "127.0.0.14", 8080, "UP"), overridden)).await.unwrap();
    let back_up = json!({"overriddenStatus": "UP"});
    eureka.register(with(instance("orders", "o5", "127.0.0.15", 8082, "DOWN"), back_up)).await.unwrap();
    // An app with no UP instance is a service with no endpoints.
    eureka.register(instance("pay_api", "p1", "127.0.0.21", 9000, "STARTING")).await.unwrap();
    // Legacy JSON: one-element lists written as bare objects.
    eureka.single_as_object(true);

    let mut rec = watch(&eureka.host_port());
    rec.until("startup snapshot, then healthy", |r| r.snapshots_since(0) > 0 && r.healthy_since(0)).await;
    let Some(Update::Snapshot(all)) = rec.updates_since(0).first().copied().cloned() else {
        panic!("the first update must be the ready snapshot: {:#?}", rec.events);
    };
    let hosts: Vec<&str> = all.iter().map(|s| s.host.as_str()).collect();
    assert_eq!(hosts, vec![ORDERS, "pay-api.eureka"]);
    assert_eq!(rec.endpoints(ORDERS).unwrap(), vec!["127.0.0.11:8081", "127.0.0.15:8082"]);
    let orders = &rec.view[ORDERS];
    assert_eq!((orders.ports[0].number, orders.ports[0].name.as_str()), (8081, "http-8081"));
    let labels: Vec<(&str, &str)> = orders.endpoints[0].labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(labels, vec![("version", "v1")]);
    assert!(rec.view["pay-api.eureka"].endpoints.is_empty());
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.errors_since(0));

    // Back in service: a delta brings o3 back.
    eureka.set_status("ORDERS", "o3", "UP").await.unwrap();
    let three: Vec<String> = ["127.0.0.11:8081", "127.0.0.13:8080", "127.0.0.15:8082"].map(String::from).into();
    rec.until("o3 back", |r| r.endpoints(ORDERS).as_ref() == Some(&three)).await;
}

#[tokio::test]
async fn deltas_add_modify_and_delete() {
    let eureka = fake().await;
    eureka.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS) == Some(vec!["127.0.0.11:8080".into()])).await;

    let mark = rec.mark();
    eureka.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    let both = vec!["127.0.0.11:8080".to_string(), "127.0.0.12:8080".to_string()];
    rec.until("added o2", |r| r.endpoints(ORDERS) == Some(both.clone())).await;

    eureka.set_status("ORDERS", "o1", "OUT_OF_SERVICE").await.unwrap();
    rec.until("modified o1", |r| r.endpoints(ORDERS) == Some(vec!["127.0.0.12:8080".into()])).await;

    eureka.register(instance("billing", "b1", "127.0.0.31", 7000, "UP")).await.unwrap();
    rec.until("new app", |r| r.endpoints("billing.eureka") == Some(vec!["127.0.0.31:7000".into()])).await;
    eureka.deregister("BILLING", "b1").await.unwrap();
    rec.until("app removed", |r| r.updates_since(mark).iter().any(|u| **u == Update::Remove("billing.eureka".into())))
        .await;

    eureka.deregister("ORDERS", "o2").await.unwrap();
    rec.until("o2 deleted", |r| r.endpoints(ORDERS) == Some(vec![])).await;
    assert_eq!(rec.view[ORDERS].ports[0].number, 8080, "o1 is still registered: the app stays, empty");

    // All of it came as deltas: upserts and a removal, one full fetch only.
    assert_eq!(rec.snapshots_since(mark), 0, "{:#?}", rec.updates_since(mark));
    assert!(rec.errors_since(0).is_empty());
    let full_fetches = eureka.requests().iter().filter(|r| *r == "GET /eureka/apps").count();
    assert_eq!(full_fetches, 1, "{:#?}", eureka.requests());
}

#[tokio::test]
async fn fails_over_between_servers_without_reporting_errors() {
    let dead = format!("127.0.0.1:{}", free_port());
    let mut first = fake().await;
    let second = fake().await;
    first.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    second.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    second.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();

    // The first server listed is down from the start.
    let mut rec = watch(&format!("{dead},{}", second.host_port()));
    rec.until("snapshot from the second server", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    assert!(rec.errors_since(0).is_empty(), "a working failover is not an error: {:#?}", rec.events);
    drop(rec);

    // A server that goes away mid-run: the next one answers, with a full
    // fetch since its delta queue is not the first one's.
    let mut rec = watch(&format!("{},{}", first.host_port(), second.host_port()));
    rec.until("snapshot from the first server", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 1)).await;
    let mark = rec.mark();
    first.stop();
    rec.until("the second server's view", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    assert_eq!(rec.snapshots_since(mark), 1, "{:#?}", rec.updates_since(mark));
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.events);
    assert!(second.requests().iter().any(|r| r == "GET /eureka/apps"));
}

#[tokio::test]
async fn hashcode_mismatch_triggers_a_full_fetch() {
    let eureka = fake().await;
    eureka.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS).is_some()).await;
    // Wait for a clean delta round first, so the log below starts there.
    let seen = eureka.requests().len();
    rec.until("a delta round", |r| {
        let _ = r;
        eureka.requests()[seen..].iter().any(|q| q == "GET /eureka/apps/delta")
    })
    .await;

    let mark = rec.mark();
    let logged = eureka.requests().len();
    eureka.corrupt_delta_hashcode(true);
    eureka.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("a reconciling snapshot", |r| r.snapshots_since(mark) > 0).await;
    assert_eq!(rec.endpoints(ORDERS).unwrap(), vec!["127.0.0.11:8080", "127.0.0.12:8080"]);
    // The delta was not applied on its own: the snapshot carries it.
    assert!(!rec.updates_since(mark).iter().any(|u| matches!(u, Update::Upsert(_))), "{:#?}", rec.events);
    let log = eureka.requests()[logged..].to_vec();
    let delta = log.iter().position(|q| q == "GET /eureka/apps/delta").expect("a delta request");
    assert!(log[delta..].iter().any(|q| q == "GET /eureka/apps"), "no full fetch after the delta: {log:#?}");
    assert!(rec.errors_since(mark).is_empty());
    // The full fetch found what the delta carried: nothing was missed.
    assert!(rec.drift_since(mark).is_empty(), "{:#?}", rec.events);
}

/// A change no delta carried (older than the server's delta queue) shows
/// in the hashcode; the full fetch corrects it and reports it as drift.
#[tokio::test]
async fn a_change_no_delta_carried_is_reported_as_drift() {
    let eureka = fake().await;
    eureka.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS).is_some()).await;
    let mark = rec.mark();
    eureka.set_delta_retention(std::time::Duration::ZERO);
    eureka.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("o2 by a full fetch", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    assert_eq!(rec.drift_since(mark), [ORDERS], "{:#?}", rec.events);
}

#[tokio::test]
async fn refused_deltas_fall_back_to_full_fetches() {
    let eureka = fake().await;
    eureka.refuse_deltas(true);
    eureka.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS).is_some()).await;
    eureka.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("o2 by a full fetch", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    assert!(rec.errors_since(0).is_empty(), "a 403 on deltas is not an outage: {:#?}", rec.events);
    assert!(eureka.requests().iter().any(|q| q == "GET /eureka/apps/delta"));
}

#[tokio::test]
async fn outage_reports_errors_and_keeps_endpoints() {
    let mut eureka = fake().await;
    eureka.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS).is_some()).await;

    let mark = rec.mark();
    eureka.stop();
    rec.until("three errors", |r| r.errors_since(mark).len() >= 3).await;
    let errors = rec.errors_since(mark);
    assert!(errors.iter().all(|e| matches!(e, RegistryError::Unreachable { .. })), "{errors:#?}");
    assert!(errors.iter().all(|e| e.to_string().contains(&eureka.host_port())), "errors name the server");
    assert!(rec.updates_since(mark).is_empty(), "no update while Eureka is down: {:#?}", rec.events);
    assert_eq!(rec.endpoints(ORDERS), Some(vec!["127.0.0.11:8080".into()]));
    assert!(!rec.task.is_finished(), "the watcher keeps retrying");

    // Back, with a change made meanwhile: a full fetch, healthy again.
    let mark = rec.mark();
    eureka.restart().await.unwrap();
    eureka.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("healthy and a fresh snapshot with o2", |r| {
        r.healthy_since(mark) && r.snapshots_since(mark) > 0 && r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)
    })
    .await;
}

/// README: registry health and instance status are at most 10 s old. With
/// the default interval, a status change and an outage both show within it.
#[tokio::test]
async fn default_interval_refreshes_health_within_ten_seconds() {
    let mut eureka = fake().await;
    eureka.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    eureka.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    let spec = RegistrySpec::new(RegistryKind::Eureka, "eureka-e2e", eureka.host_port(), 8761);
    let watcher = EurekaWatcher::new(spec).expect("valid spec");
    let mut rec: Recorder = Recorder::start(Box::new(watcher), Duration::from_secs(12));
    rec.until("both instances", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;

    let changed = std::time::Instant::now();
    eureka.set_status("ORDERS", "o2", "OUT_OF_SERVICE").await.unwrap();
    rec.until("o2 out within 10 s", |r| r.endpoints(ORDERS) == Some(vec!["127.0.0.11:8080".to_string()])).await;
    assert!(changed.elapsed() <= Duration::from_secs(11), "took {:?}", changed.elapsed());

    let mark = rec.mark();
    let stopped = std::time::Instant::now();
    eureka.stop();
    rec.until("the outage reported within 10 s", |r| !r.errors_since(mark).is_empty()).await;
    assert!(stopped.elapsed() <= Duration::from_secs(11), "took {:?}", stopped.elapsed());
}
