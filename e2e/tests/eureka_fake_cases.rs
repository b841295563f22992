//! The Eureka watcher against the FAKE Eureka server
//! (`meshbridge_e2e::eureka_fake`), only for what a real server cannot be
//! made to answer on demand (e2e/README.md says why for each). Everything
//! else runs against the real server in `eureka_registry.rs`.

use std::time::Duration;

use meshbridge_e2e::eureka::instance;
use meshbridge_e2e::eureka_fake::EurekaFake;
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::eureka::EurekaWatcher;
use meshbridge_registries::{RegistryKind, RegistrySpec, RepairKind, Update};

const INTERVAL: Duration = Duration::from_millis(200);
const DEADLINE: Duration = Duration::from_secs(10);
const ORDERS: &str = "orders.eureka";

fn watch(domain: &str) -> Recorder {
    let spec = RegistrySpec::new(RegistryKind::Eureka, "eureka-e2e", domain, 8761);
    Recorder::start(Box::new(EurekaWatcher::new(spec).expect("valid spec").with_interval(INTERVAL)), DEADLINE)
}

async fn fake() -> EurekaFake {
    EurekaFake::start().await.expect("start the fake Eureka")
}

/// Old XStream/Jettison servers wrote a one-element list as a bare object;
/// today's Jackson codec never does.
#[tokio::test]
async fn legacy_single_object_json() {
    let eureka = fake().await;
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8081, "UP")).await.unwrap();
    eureka.single_as_object(true);
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS) == Some(vec!["127.0.0.11:8081".into()])).await;
    eureka.api.set_status("ORDERS", "o1", "OUT_OF_SERVICE").await.unwrap();
    rec.until("o1 out by a one-element delta", |r| r.endpoints(ORDERS) == Some(vec![])).await;
    assert_eq!(rec.snapshots_since(0), 1, "{:#?}", rec.events);
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.events);
}

/// A delta whose hashcode disagrees with the copy it was applied to: a real
/// server answers one only after a change the client missed, never on
/// demand.
#[tokio::test]
async fn hashcode_mismatch_triggers_a_full_fetch() {
    let eureka = fake().await;
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
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
    eureka.api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
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
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut rec = watch(&eureka.host_port());
    rec.until("o1", |r| r.endpoints(ORDERS).is_some()).await;
    let mark = rec.mark();
    eureka.set_delta_retention(Duration::ZERO);
    eureka.api.register(instance("orders", "o2", "127.0.0.12", 8080, "UP")).await.unwrap();
    rec.until("o2 by a full fetch", |r| r.endpoints(ORDERS).is_some_and(|e| e.len() == 2)).await;
    assert_eq!(rec.drift_since(mark), [ORDERS], "{:#?}", rec.events);
}

/// The anti-entropy pass: a change no delta carries and the hashcode
/// cannot show (a port moved, statuses unchanged) is repaired by the next
/// full read, within one `--anti-entropy-interval`, and counted as a missed
/// change; passes that find the copy right count nothing. Only the fake can
/// lose a delta on demand (a delta queue that forgets at once).
#[tokio::test]
async fn the_anti_entropy_pass_repairs_a_change_no_delta_carried() {
    const ANTI_ENTROPY: Duration = Duration::from_secs(2);
    let eureka = fake().await;
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8080, "UP")).await.unwrap();
    let mut spec = RegistrySpec::new(RegistryKind::Eureka, "eureka-e2e", eureka.host_port(), 8761);
    spec.anti_entropy_interval = Some(ANTI_ENTROPY);
    let watcher = EurekaWatcher::new(spec).expect("valid spec").with_interval(INTERVAL);
    let mut rec: Recorder = Recorder::start(Box::new(watcher), DEADLINE);
    rec.until("o1", |r| r.endpoints(ORDERS) == Some(vec!["127.0.0.11:8080".into()])).await;
    let full = |log: &[String]| log.iter().filter(|q| *q == "GET /eureka/apps").count();
    // Two passes over a copy that is right: nothing counted.
    rec.until("two passes", |_| full(&eureka.requests()) >= 3).await;
    assert!(rec.drift_since(0).is_empty(), "{:#?}", rec.events);
    assert_eq!(rec.snapshots_since(0), 1, "a pass that finds nothing sends nothing: {:#?}", rec.events);

    let mark = rec.mark();
    eureka.set_delta_retention(Duration::ZERO);
    let hashcode = eureka.hashcode();
    eureka.api.register(instance("orders", "o1", "127.0.0.11", 8081, "UP")).await.unwrap();
    assert_eq!(eureka.hashcode(), hashcode, "the hashcode cannot show it");
    let (changed, fulls) = (tokio::time::Instant::now(), full(&eureka.requests()));
    rec.until("o1 on its new port", |r| r.endpoints(ORDERS) == Some(vec!["127.0.0.11:8081".into()])).await;
    let took = changed.elapsed();
    assert_eq!(full(&eureka.requests()) - fulls, 1, "{took:?}: not the first pass after the change");
    assert!(took <= ANTI_ENTROPY * 2, "{took:?}");
    assert_eq!(rec.repairs_since(mark), [(RepairKind::MissedChange, &ORDERS.to_string())], "{:#?}", rec.events);
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.events);
}
