//! The Consul watcher against a FAKE Consul (`e2e/src/consul_fake.rs`), for
//! what a real agent will not do on request: a malformed health answer for
//! one service, and claiming to be Consul Enterprise.

use std::time::Duration;

use meshbridge_e2e::consul_fake::ConsulFake;
use meshbridge_e2e::recorder::{Event, Recorder};
use meshbridge_registries::consul::ConsulWatcher;
use meshbridge_registries::{RegistryError, RegistryKind, RegistrySpec};

const DEADLINE: Duration = Duration::from_secs(15);

fn watch(port: u16, namespace: Option<&str>) -> Recorder {
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "consul-fake", "127.0.0.1", port);
    spec.consul_refresh_interval = Some(Duration::from_secs(2));
    spec.consul_namespace = namespace.map(str::to_string);
    let watcher = ConsulWatcher::new(spec).expect("valid spec").with_wait(Duration::from_millis(500));
    Recorder::start(Box::new(watcher), DEADLINE)
}

/// `healthy` as the cache folds the sink calls: an update or a success makes
/// it true, an error false.
fn healthy(rec: &Recorder) -> bool {
    matches!(rec.events.last(), Some(Event::Update(_) | Event::Healthy))
}

fn is_bad_b(e: &RegistryError) -> bool {
    matches!(e, RegistryError::BadResponse { what, .. } if what == "/v1/health/service/b")
}

#[tokio::test]
async fn one_malformed_service_is_skipped_and_reported() {
    let fake = ConsulFake::start("1.8.7").await.unwrap();
    for (name, port) in [("a", 8081), ("b", 8082), ("c", 8083)] {
        fake.add_service(name, port);
    }
    fake.set_raw_health("b", Some(r#"[{"Service": {"Port": "not a number"}}]"#));
    let mut rec = watch(fake.port, None);

    // The first full sync serves a and c, and says what is wrong with b.
    rec.until("startup snapshot", |r| r.snapshot_since(0).is_some()).await;
    let hosts: Vec<String> = rec.snapshot_since(0).unwrap().iter().map(|s| s.host.clone()).collect();
    assert_eq!(hosts, vec!["a.dc1.consul", "c.dc1.consul"]);
    rec.until("b reported", |r| r.errors_since(0).iter().any(|e| is_bad_b(e))).await;

    // While b fails (it is retried), the registry never reads healthy.
    rec.idle(Duration::from_secs(3)).await;
    assert!(!healthy(&rec), "healthy while a service fails:\n{}", rec.dump());
    assert!(rec.errors_since(0).iter().filter(|e| is_bad_b(e)).count() >= 2, "retried:\n{}", rec.dump());
    assert!(!rec.view.contains_key("b.dc1.consul"));

    // b answers properly again: served, and healthy.
    let mark = rec.mark();
    fake.set_raw_health("b", None);
    rec.until("b served", |r| r.view.contains_key("b.dc1.consul")).await;
    rec.until("healthy again", |r| r.healthy_since(mark) && healthy(r)).await;
    assert_eq!(rec.hosts(), vec!["a.dc1.consul", "b.dc1.consul", "c.dc1.consul"]);
}

#[tokio::test]
async fn consul_namespace_is_sent_to_enterprise_only() {
    for (version, sent) in [("1.8.7+ent", true), ("1.8.7", false)] {
        let fake = ConsulFake::start(version).await.unwrap();
        fake.add_service("web", 8080);
        let mut rec = watch(fake.port, Some("team-a"));
        rec.until("web", |r| r.view.contains_key("web.dc1.consul")).await;
        let requests = fake.requests();
        let catalog: Vec<&String> = requests.iter().filter(|r| r.starts_with("GET /v1/catalog/services")).collect();
        assert!(!catalog.is_empty(), "{requests:?}");
        for line in catalog {
            assert_eq!(line.contains("ns=team-a"), sent, "{version}: {line}");
        }
        assert!(requests[0].starts_with("GET /v1/agent/self"), "the edition is asked first: {requests:?}");
    }
}

/// An instance re-registered on another port moves only the catalog index
/// and that service's own index: no detector names it, so a sweep of index
/// probes finds it. The sweep probes every service once (one catalog
/// answer may stand for many changes) and reads only the one that moved.
#[tokio::test]
async fn an_unnamed_change_is_found_by_a_sweep_of_every_service() {
    const SERVICES: usize = 200;
    let fake = ConsulFake::start("1.8.7").await.unwrap();
    for i in 0..SERVICES {
        fake.add_service(&format!("s{i}"), 8000);
    }
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "consul-fake", "127.0.0.1", fake.port);
    // No periodic sweep within the test.
    spec.consul_refresh_interval = Some(Duration::from_secs(600));
    let watcher = ConsulWatcher::new(spec).expect("valid spec").with_wait(Duration::from_millis(500));
    let mut rec: Recorder = Recorder::start(Box::new(watcher), DEADLINE);
    rec.until("startup snapshot", |r| r.view.len() == SERVICES).await;
    rec.idle(Duration::from_millis(300)).await;

    let seen = fake.requests().len();
    fake.add_service("s1", 9001);
    rec.until("s1 re-ported", |r| r.view["s1.dc1.consul"].endpoints[0].port == 9001).await;
    rec.idle(Duration::from_millis(500)).await;
    // One sweep of every service; a second catalog answer (the fake moves
    // one index for everything) may extend it by a lap at most.
    let probes = fake.requests_containing(seen, "tag=");
    assert!((SERVICES..=2 * SERVICES).contains(&probes), "{probes} index probes for one change of {SERVICES} services");
    let reads = fake.requests_containing(seen, "/v1/health/service/") - probes;
    assert_eq!(reads, 1, "only s1 is read:\n{:#?}", &fake.requests()[seen..]);
    assert!(rec.updates_since(0).len() == 2, "the snapshot and s1's upsert:\n{}", rec.dump());
}
