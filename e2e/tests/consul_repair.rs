//! The Consul watcher's second layer against a real Consul 1.8 agent
//! (`MESHBRIDGE_CONSUL_BIN`): cases its change detectors cannot see, or
//! could not before, each repaired within one anti-entropy interval (or at
//! once, where the detectors now see them) and counted under its kind.
//! The periodic sweep is an hour away in every test, so nothing but the
//! layer under test can repair them.

use std::time::{Duration, Instant};

use meshbridge_e2e::consul::{CheckStatus, Consul};
use meshbridge_e2e::recorder::{Event, Recorder};
use meshbridge_registries::consul::ConsulWatcher;
use meshbridge_registries::{RegistryKind, RegistrySpec, RepairKind, Secret};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(15);
const HOUR: Duration = Duration::from_secs(3600);
const WEB: &str = "web.dc1.consul";

fn spec(port: u16, anti_entropy: Duration) -> RegistrySpec {
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "consul-repair", "127.0.0.1", port);
    spec.consul_refresh_interval = Some(HOUR);
    spec.anti_entropy_interval = Some(anti_entropy);
    spec
}

/// A watcher with the default 30 s blocking wait, longer than the deadline,
/// so a detector parked on a wrong index cannot pass a test by timing out.
fn watch(spec: RegistrySpec) -> Recorder {
    Recorder::start(Box::new(ConsulWatcher::new(spec).expect("valid spec")), DEADLINE)
}

async fn consul() -> Consul {
    Consul::start().await.expect("start consul (source e2e/env.sh consul)")
}

fn catalog_entry(node: &str, address: &str, id: &str, service: &str, port: u16) -> Value {
    json!({
        "Node": node, "Address": address, "SkipNodeUpdate": true,
        "Service": {"ID": id, "Service": service, "Address": address, "Port": port},
    })
}

fn agent_instance(id: &str, name: &str, address: &str, port: u16) -> Value {
    json!({"ID": id, "Name": name, "Address": address, "Port": port,
           "Check": {"CheckID": id, "TTL": "120s", "Status": "passing"}})
}

/// The first case: a snapshot taken before `web-2` was registered on
/// an existing node is restored. Consul serves `web-1` alone again; so must
/// meshbridge, at once (the catalog detector sees its index go back), and
/// the correction is counted as an index reset. Before: `web-2` stayed for
/// good and nothing was counted.
#[tokio::test]
async fn a_restored_snapshot_is_repaired_and_counted() {
    let consul = consul().await;
    consul.catalog_register(catalog_entry("n1", "127.0.0.21", "web-1", "web", 8080)).await.unwrap();
    // Some writes after the snapshot, so the restored index is well below.
    let snapshot = consul.snapshot_save().await.expect("snapshot save");
    for i in 0..10 {
        consul.catalog_register(catalog_entry("n9", "127.0.0.29", &format!("x{i}"), "churn", 9000)).await.unwrap();
    }
    consul.catalog_register(catalog_entry("n1", "127.0.0.21", "web-2", "web", 8081)).await.unwrap();

    let mut rec = watch(spec(consul.http_port, HOUR));
    rec.until("both instances", |r| r.endpoints(WEB).is_some_and(|e| e.len() == 2)).await;
    let mark = rec.mark();
    let t = Instant::now();
    consul.snapshot_restore(snapshot).await.expect("snapshot restore");
    rec.until("web-1 alone, as the restored catalog has it", |r| {
        r.endpoints(WEB) == Some(vec!["127.0.0.21:8080".into()]) && r.endpoints("churn.dc1.consul").is_none()
    })
    .await;
    println!("FIGURE consul repair snapshot_restore_ms={:.0}", t.elapsed().as_secs_f64() * 1e3);
    let repairs = rec.repairs_since(mark);
    assert!(repairs.contains(&(RepairKind::IndexReset, &WEB.to_string())), "counted as an index reset: {repairs:?}");
    // And the detectors watch the restored catalog: a change after the
    // restore is seen at once, not after a 30 s wait on the old index.
    consul.catalog_register(catalog_entry("n1", "127.0.0.21", "web-3", "web", 8082)).await.unwrap();
    rec.until("a registration after the restore", |r| r.endpoints(WEB).is_some_and(|e| e.len() == 2)).await;
}

/// A dev agent comes back from a restart with its indexes reset, far below
/// the ones the detectors held (hole H3b). A change after the recovery is
/// seen at once, by change detection, with the periodic sweep an hour away
/// and the blocking wait (30 s) longer than the deadline: the recovery
/// resync re-bases every detector.
#[tokio::test]
async fn changes_after_a_restart_that_reset_the_index_are_seen_at_once() {
    let mut consul = consul().await;
    consul.register(agent_instance("web-1", "web", "127.0.0.3", 8080)).await.unwrap();
    for i in 0..40 {
        consul.register(agent_instance(&format!("churn-{i}"), "churn", "127.0.0.4", 9000)).await.unwrap();
        consul.deregister(&format!("churn-{i}")).await.unwrap();
    }
    let mut rec = watch(spec(consul.http_port, HOUR));
    rec.until("web", |r| r.endpoints(WEB) == Some(vec!["127.0.0.3:8080".into()])).await;

    let mark = rec.mark();
    consul.stop();
    rec.until("an error", |r| !r.errors_since(mark).is_empty()).await;
    let mark = rec.mark();
    consul.restart().await.expect("restart consul");
    rec.until("healthy and a fresh snapshot", |r| {
        r.since(mark).any(|e| matches!(e, Event::Healthy)) && r.snapshot_since(mark).is_some()
    })
    .await;
    let t = Instant::now();
    consul.register(agent_instance("late-1", "late", "127.0.0.5", 7070)).await.unwrap();
    rec.until("a service registered after the restart", |r| {
        r.endpoints("late.dc1.consul") == Some(vec!["127.0.0.5:7070".into()])
    })
    .await;
    println!("FIGURE consul repair registration_after_index_reset_ms={:.0}", t.elapsed().as_secs_f64() * 1e3);
    // A check flip of an existing service, too (hole H3b, third variant):
    // the restarted agent restores web-1's TTL check as critical.
    consul.set_ttl_check("web-1", CheckStatus::Pass).await.unwrap();
    rec.until("web's instance passing after the restart", |r| r.endpoints(WEB) == Some(vec!["127.0.0.3:8080".into()]))
        .await;
    consul.set_ttl_check("web-1", CheckStatus::Fail).await.unwrap();
    rec.until("web's instance failing after the restart", |r| r.endpoints(WEB) == Some(vec![])).await;
}

/// Hole H10: the token's policy is widened to a second service. Consul moves
/// no index for that, so no detector wakes; the anti-entropy pass's listing
/// finds the service within one interval and counts a missed change.
#[tokio::test]
async fn an_acl_policy_change_is_repaired_by_the_anti_entropy_pass() {
    const MASTER: &str = "4f1c5a8e-0000-4000-8000-000000000001";
    // Nodes (health answers carry them) and the agent (`/v1/agent/self`
    // tells the datacenter), as a read-only discovery token has.
    const NODES: &str = "node_prefix \"\" { policy = \"read\" }\nagent_prefix \"\" { policy = \"read\" }";
    let consul = Consul::start_with_acl(MASTER).await.expect("start consul with ACLs");
    let policy = consul
        .put_json(
            "/v1/acl/policy",
            json!({"Name": "reader", "Rules": format!("service \"web\" {{ policy = \"read\" }}\n{NODES}")}),
        )
        .await
        .expect("create policy");
    let policy_id = policy["ID"].as_str().expect("policy ID").to_string();
    let token = consul.put_json("/v1/acl/token", json!({"Policies": [{"ID": policy_id}]})).await.expect("create token");
    let secret = token["SecretID"].as_str().expect("token SecretID").to_string();
    consul.register(agent_instance("web-1", "web", "127.0.0.6", 8080)).await.unwrap();
    consul.register(agent_instance("api-1", "api", "127.0.0.7", 8081)).await.unwrap();

    let anti_entropy = Duration::from_secs(3);
    let mut spec = spec(consul.http_port, anti_entropy);
    spec.auth.insert("consulToken".into(), Secret::new(secret));
    let mut rec = watch(spec);
    rec.until("web", |r| r.endpoints(WEB).is_some_and(|e| e.len() == 1)).await;
    assert_eq!(rec.endpoints("api.dc1.consul"), None, "api is not readable yet");

    let mark = rec.mark();
    let t = Instant::now();
    let rules = format!("service \"web\" {{ policy = \"read\" }}\nservice \"api\" {{ policy = \"read\" }}\n{NODES}");
    consul
        .put_json(&format!("/v1/acl/policy/{policy_id}"), json!({"Name": "reader", "Rules": rules}))
        .await
        .expect("widen the policy");
    rec.until("api, once the token may read it", |r| {
        r.endpoints("api.dc1.consul") == Some(vec!["127.0.0.7:8081".into()])
    })
    .await;
    println!("FIGURE consul repair acl_change_ms={:.0} anti_entropy_interval_s=3", t.elapsed().as_secs_f64() * 1e3);
    let repairs = rec.repairs_since(mark);
    let api = "api.dc1.consul".to_string();
    assert!(repairs.contains(&(RepairKind::MissedChange, &api)), "counted as a missed change: {repairs:?}");
}

/// A convergence check for the layer itself: with the pass running every
/// 2 s over a steady catalog, nothing is counted (a correct watcher keeps
/// the counter at 0), while every pass reads every service.
#[tokio::test]
async fn a_steady_catalog_is_verified_without_a_repair() {
    let consul = consul().await;
    for i in 0..20 {
        consul.register(agent_instance(&format!("s{i}"), &format!("svc-{i}"), "127.0.0.8", 9000 + i)).await.unwrap();
    }
    let mut rec = watch(spec(consul.http_port, Duration::from_secs(2)));
    rec.until("every service", |r| r.hosts().len() == 20).await;
    let mark = rec.mark();
    // Changes during the passes are the detectors' to deliver, not repairs.
    for i in 0..10 {
        consul.register(agent_instance(&format!("s{i}"), &format!("svc-{i}"), "127.0.0.9", 9000 + i)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    rec.until("every change", |r| {
        (0..10).all(|i| {
            r.endpoints(&format!("svc-{i}.dc1.consul")).is_some_and(|e| e == [format!("127.0.0.9:{}", 9000 + i)])
        })
    })
    .await;
    rec.idle(Duration::from_secs(5)).await;
    assert_eq!(rec.repairs_since(mark), Vec::<(RepairKind, &String)>::new(), "no repair in a correct watcher");
}

/// Hole H4: Consul behind a load balancer or NAT that resets connections
/// idle longer than its timeout (a test proxy of our own, `IdleCutProxy`).
/// After each quiet spell the first reads and probes of a burst meet a cut
/// pooled connection. They are sent again on another, so the change lands
/// at once with no error and no full resync; before, the sweep was
/// abandoned, the registry flapped unhealthy and a full resync followed.
#[tokio::test]
async fn a_pooled_connection_cut_while_idle_costs_no_error_and_no_resync() {
    use meshbridge_e2e::idle_cut_proxy::IdleCutProxy;
    use meshbridge_registries::consul::requests_resent;
    const IDLE: Duration = Duration::from_secs(1);
    let consul = consul().await;
    consul.register(agent_instance("web-1", "web", "127.0.0.31", 8080)).await.unwrap();
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], consul.http_port));
    let proxy = IdleCutProxy::start(upstream, IDLE).await.expect("start the test proxy");
    let mut rec = watch(spec(proxy.port, HOUR));
    rec.until("web", |r| r.endpoints(WEB).is_some_and(|e| e.len() == 1)).await;
    let resent = requests_resent();
    for round in 2..=4u16 {
        // Long enough for the pool's idle connections to be cut.
        rec.idle(IDLE + Duration::from_millis(500)).await;
        let mark = rec.mark();
        let t = Instant::now();
        let id = format!("web-{round}");
        consul.register(agent_instance(&id, "web", "127.0.0.31", 8080 + round)).await.unwrap();
        rec.until("the new instance", |r| r.endpoints(WEB).is_some_and(|e| e.len() == usize::from(round))).await;
        println!("FIGURE consul repair registration_after_idle_cut_ms={:.0}", t.elapsed().as_secs_f64() * 1e3);
        rec.idle(Duration::from_millis(300)).await;
        assert!(rec.errors_since(mark).is_empty(), "no failed call: {}", rec.dump());
        assert_eq!(rec.snapshots_since(mark), 0, "no full resync: {}", rec.dump());
    }
    assert!(proxy.cuts() > 0, "the proxy cut idle connections");
    assert!(requests_resent() > resent, "the cut requests were sent again");
}
