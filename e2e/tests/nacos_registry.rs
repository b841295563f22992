//! The Nacos watchers against real Nacos-protocol servers: `type: nacos2`
//! over gRPC (our own client) and `type: nacos` over the 1.x HTTP open API,
//! each scenario for both, against rnacos (`MESHBRIDGE_RNACOS_BIN`) and,
//! where the scenario is not about an rnacos quirk, against Nacos 3.1.0
//! (`MESHBRIDGE_NACOS_SERVER_JAR`; see `e2e/env.sh`). A test on rnacos
//! starts its own; tests on Nacos share one server per test binary, each in
//! a namespace of its own, except those that stop it. The refresh interval
//! is 2 s and every assertion polls the recorded sink calls with a deadline.
//!
//! rnacos is not Nacos; what differs and how these tests cope (also in
//! e2e/README.md):
//! - rnacos ignores `healthy` on register and update: an instance turns
//!   unhealthy only when its heartbeats stop (ephemeral) or its TCP probe
//!   fails (persistent; the harness turns probing off). The unhealthy case
//!   uses an ephemeral instance that never beats, then beats.
//! - an update applies `weight` only when it is not 1 and `metadata` only
//!   when it is not `{}`.
//! - `healthyOnly` defaults to `true` on `/nacos/v1/ns/instance/list`
//!   (Nacos: `false`); the watcher always sends `false`.
//! - pushes are batched (up to about 0.75 s after a change).
//! - a health change made by a heartbeat is not pushed: over gRPC it shows
//!   at the watcher's next full read (every `--anti-entropy-interval`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::nacos::{Flavor, Instance, Options, Rnacos};
use meshbridge_e2e::nacos_server::{Owned, Target};
use meshbridge_e2e::recorder::{Event, Recorder};
use meshbridge_registries::{RegistryError, RegistryKind, RegistrySpec, Secret, Update, watcher_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const REFRESH: Duration = Duration::from_secs(2);
const DEADLINE: Duration = Duration::from_secs(15);
const GRPC: RegistryKind = RegistryKind::Nacos2;
const HTTP: RegistryKind = RegistryKind::Nacos;

/// Run the watcher for `spec`, recording its sink calls.
fn watch(spec: RegistrySpec) -> Recorder {
    Recorder::start(watcher_for(&spec, meshbridge_registries::Selector::all()).expect("valid spec"), DEADLINE)
}

fn spec(kind: RegistryKind, rnacos: &Rnacos) -> RegistrySpec {
    spec_at(kind, rnacos.http_port, "public")
}

/// A watcher's spec for `namespace` on the server at `http_port`.
fn spec_at(kind: RegistryKind, http_port: u16, namespace: &str) -> RegistrySpec {
    let mut spec = RegistrySpec::new(kind, format!("{kind}-e2e"), "127.0.0.1", http_port);
    spec.nacos_refresh_interval = Some(REFRESH);
    // rnacos tests leave it unset: the watcher's default is `public`.
    if namespace != "public" {
        spec.nacos_namespace_id = Some(namespace.into());
    }
    spec
}

fn target_spec(kind: RegistryKind, target: &Target) -> RegistrySpec {
    spec_at(kind, target.http_port, &target.namespace)
}

async fn rnacos(opts: Options) -> Rnacos {
    Rnacos::start_with(opts).await.expect("start rnacos (source e2e/env.sh rnacos)")
}

async fn target(flavor: Flavor) -> Target {
    Target::start(flavor, Options::default()).await.expect("start the server")
}

const WEB: &str = "web.DEFAULT-GROUP.public.nacos";

fn eps(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|s| s.to_string()).collect())
}

/// A service registered after the watcher listed is served within a probe
/// period (5 s), although the refresh interval is a minute: the probe
/// counts the services and lists again when the count moved.
async fn new_service_within_a_probe_period(kind: RegistryKind, flavor: Flavor) {
    let nacos = target(flavor).await;
    nacos.register(&nacos.instance("web", "127.0.0.2", 8082)).await.unwrap();
    let mut spec = target_spec(kind, &nacos);
    spec.nacos_refresh_interval = Some(Duration::from_secs(60));
    let mut rec = watch(spec);
    rec.until("startup snapshot", |r| r.snapshot_since(0).is_some()).await;
    let started = Instant::now();
    nacos.register(&nacos.instance("cart", "127.0.0.3", 8083)).await.unwrap();
    let cart = &nacos.host("cart", "DEFAULT_GROUP");
    rec.until("the new service", |r| r.endpoints(cart) == eps(&["127.0.0.3:8083"])).await;
    let took = started.elapsed();
    println!("FIGURE nacos_new_service kind={kind} server={flavor:?} ms={}", took.as_millis());
    // The probe runs every 500 ms; the rest is the listing, the read and a
    // loaded CI machine. The refresh is a minute away.
    assert!(took < Duration::from_secs(4), "{took:?}: not the probe");
    if kind == GRPC {
        // Its instances are pushed from now on (both servers keep the
        // service, empty: the count does not move, and HTTP waits for the
        // refresh).
        nacos.deregister(&nacos.instance("cart", "127.0.0.3", 8083)).await.unwrap();
        rec.until("the service empty", |r| r.endpoints(cart).is_none_or(|e| e.is_empty())).await;
    }
    assert!(rec.errors_since(0).is_empty(), "{}", rec.dump());
}

#[tokio::test]
async fn grpc_new_service_within_a_probe_period() {
    new_service_within_a_probe_period(GRPC, Flavor::Rnacos).await;
}

#[tokio::test]
async fn http_new_service_within_a_probe_period() {
    new_service_within_a_probe_period(HTTP, Flavor::Rnacos).await;
}

#[tokio::test]
async fn nacos3_grpc_new_service_within_a_probe_period() {
    new_service_within_a_probe_period(GRPC, Flavor::Nacos).await;
}

#[tokio::test]
async fn nacos3_http_new_service_within_a_probe_period() {
    new_service_within_a_probe_period(HTTP, Flavor::Nacos).await;
}

/// A service registered in the second group of `nacosGroups` after the
/// watcher listed is served within a probe period too: the probe covers
/// every group, not the first one only (issue 33, H1).
async fn new_service_in_a_second_group_within_a_probe_period(kind: RegistryKind, flavor: Flavor) {
    let nacos = target(flavor).await;
    nacos.register(&nacos.instance("web", "127.0.0.2", 8082)).await.unwrap();
    nacos.register(&nacos.instance("web", "127.0.0.4", 8084).group("shop_v2")).await.unwrap();
    let mut spec = target_spec(kind, &nacos);
    spec.nacos_groups = vec!["DEFAULT_GROUP".into(), "shop_v2".into()];
    spec.nacos_refresh_interval = Some(Duration::from_secs(60));
    let mut rec = watch(spec);
    rec.until("startup snapshot", |r| r.snapshot_since(0).is_some()).await;
    let started = Instant::now();
    nacos.register(&nacos.instance("cart", "127.0.0.3", 8083).group("shop_v2")).await.unwrap();
    let cart = &nacos.host("cart", "shop_v2");
    rec.until("the new service in shop_v2", |r| r.endpoints(cart) == eps(&["127.0.0.3:8083"])).await;
    let took = started.elapsed();
    println!("FIGURE nacos_new_service_second_group kind={kind} server={flavor:?} ms={}", took.as_millis());
    assert!(took < Duration::from_secs(4), "{took:?}: not the probe");
    assert!(rec.errors_since(0).is_empty(), "{}", rec.dump());
}

#[tokio::test]
async fn grpc_new_service_in_a_second_group_within_a_probe_period() {
    new_service_in_a_second_group_within_a_probe_period(GRPC, Flavor::Rnacos).await;
}

#[tokio::test]
async fn http_new_service_in_a_second_group_within_a_probe_period() {
    new_service_in_a_second_group_within_a_probe_period(HTTP, Flavor::Rnacos).await;
}

#[tokio::test]
async fn nacos3_grpc_new_service_in_a_second_group_within_a_probe_period() {
    new_service_in_a_second_group_within_a_probe_period(GRPC, Flavor::Nacos).await;
}

#[tokio::test]
async fn nacos3_http_new_service_in_a_second_group_within_a_probe_period() {
    new_service_in_a_second_group_within_a_probe_period(HTTP, Flavor::Nacos).await;
}

/// Register, scale out, reweigh, relabel, disable, deregister to empty.
async fn follows_instances(kind: RegistryKind, flavor: Flavor) {
    let nacos = target(flavor).await;
    let web = &nacos.host("web", "DEFAULT_GROUP");
    let a = nacos.instance("web", "127.0.0.2", 8082).meta("version", "v1").meta("note", "not a label value");
    let a = Instance { weight: 3.0, ..a };
    nacos.register(&a).await.unwrap();

    let mut rec = watch(target_spec(kind, &nacos));
    rec.until("startup snapshot", |r| r.snapshot_since(0).is_some()).await;
    let first = rec.updates_since(0)[0].clone();
    let Update::Snapshot(all) = first else { panic!("the first update must be the ready snapshot: {first:?}") };
    assert_eq!(all.len(), 1, "{all:?}");
    let first = &all[0];
    assert_eq!(&first.host, web);
    assert_eq!((first.ports[0].number, first.ports[0].name.as_str()), (8082, "http-8082"));
    assert_eq!(first.endpoints.len(), 1);
    assert_eq!(first.endpoints[0].weight, 3);
    let labels = BTreeMap::from([("version".to_string(), "v1".to_string())]);
    assert_eq!(*first.endpoints[0].labels, labels, "invalid label values are dropped");
    assert!(rec.since(0).any(|e| matches!(e, Event::Healthy)));

    let b = nacos.instance("web", "127.0.0.3", 8081);
    nacos.register(&b).await.unwrap();
    rec.until("both instances", |r| r.endpoints(web) == eps(&["127.0.0.2:8082", "127.0.0.3:8081"])).await;
    assert_eq!(rec.view[web].ports[0].number, 8081, "the lowest instance port");

    // Weight and metadata changes propagate.
    let a2 = Instance { weight: 5.0, ..a.clone() }.meta("version", "v2");
    nacos.update(&a2).await.unwrap();
    rec.until("new weight and label", |r| {
        r.view
            .get(web)
            .and_then(|s| s.endpoints.iter().find(|e| e.address == "127.0.0.2"))
            .is_some_and(|e| e.weight == 5 && e.labels.get("version").map(String::as_str) == Some("v2"))
    })
    .await;

    // enabled=false takes an instance out; true brings it back.
    nacos.update(&Instance { enabled: false, ..b.clone() }).await.unwrap();
    rec.until("disabled instance gone", |r| r.endpoints(web) == eps(&["127.0.0.2:8082"])).await;
    nacos.update(&Instance { enabled: true, ..b.clone() }).await.unwrap();
    rec.until("enabled again", |r| r.endpoints(web).is_some_and(|e| e.len() == 2)).await;

    // Deregistering the last instance: an authoritative empty service.
    nacos.deregister(&b).await.unwrap();
    rec.until("one left", |r| r.endpoints(web) == eps(&["127.0.0.2:8082"])).await;
    let mark = rec.mark();
    nacos.deregister(&a2).await.unwrap();
    rec.until("web empty", |r| r.endpoints(web).is_none_or(|e| e.is_empty())).await;
    if let Some(web) = rec.view.get(web) {
        assert_eq!(web.ports[0].number, 8082, "an empty service keeps its last port");
    }
    assert!(rec.errors_since(mark).is_empty(), "{}", rec.dump());
}

#[tokio::test]
async fn grpc_follows_instances() {
    follows_instances(GRPC, Flavor::Rnacos).await;
}

#[tokio::test]
async fn http_follows_instances() {
    follows_instances(HTTP, Flavor::Rnacos).await;
}

#[tokio::test]
async fn nacos3_grpc_follows_instances() {
    follows_instances(GRPC, Flavor::Nacos).await;
}

#[tokio::test]
async fn nacos3_http_follows_instances() {
    follows_instances(HTTP, Flavor::Nacos).await;
}

/// Two namespaces, two groups, Dubbo names, consumers, the loop guard.
async fn namespaces_groups_and_names(kind: RegistryKind, flavor: Flavor) {
    let nacos = target(flavor).await;
    let dev_ns = nacos.other_namespace("dev_ns");
    nacos.create_namespace(&dev_ns, "dev").await.unwrap();
    nacos.register(&nacos.instance("web", "127.0.0.2", 8080)).await.unwrap();
    nacos.register(&nacos.instance("web", "127.0.0.3", 8080).group("shop_v2")).await.unwrap();
    nacos.register(&nacos.instance("web", "127.0.0.4", 8080).group("other")).await.unwrap();
    nacos.register(&Instance::new("api", "127.0.0.5", 9000).namespace(&dev_ns)).await.unwrap();
    let dubbo = "providers:com.example.DemoService:1.0.0:";
    nacos.register(&nacos.instance(dubbo, "127.0.0.6", 20880).meta("protocol", "dubbo")).await.unwrap();
    nacos.register(&nacos.instance("consumers:com.example.DemoService:1.0.0:", "127.0.0.7", 9001)).await.unwrap();
    let guarded = nacos.instance("looped", "127.0.0.8", 80).meta("register-resource", "mcp-bridge");
    nacos.register(&guarded).await.unwrap();
    nacos.register(&nacos.instance("grpcsvc", "127.0.0.9", 50051).meta("protocol", "triple")).await.unwrap();

    let mut public = target_spec(kind, &nacos);
    public.nacos_groups = vec!["DEFAULT_GROUP".into(), "shop_v2".into()];
    let mut rec = watch(public);
    rec.until("startup snapshot", |r| r.snapshot_since(0).is_some()).await;
    let hosts: Vec<&str> = rec.view.keys().map(String::as_str).collect();
    let host = |service: &str| nacos.host(service, "DEFAULT_GROUP");
    let (dubbo_host, web_shop) = (host(dubbo), nacos.host("web", "shop_v2"));
    let want = [host("grpcsvc"), host("looped"), dubbo_host.clone(), host("web"), web_shop.clone()];
    assert_eq!(hosts, want, "no consumers:, no other group, no other namespace");
    assert_eq!(rec.view[&dubbo_host].ports[0].name, "tcp-20880", "dubbo is TCP");
    assert_eq!(rec.view[&host("grpcsvc")].ports[0].name, "grpc-50051");
    assert_eq!(rec.endpoints(&host("looped")), Some(vec![]), "loop guard");
    assert_eq!(rec.endpoints(&web_shop), eps(&["127.0.0.3:8080"]));

    let dev = spec_at(kind, nacos.http_port, &dev_ns);
    let mut rec = watch(dev);
    rec.until("dev namespace", |r| r.snapshot_since(0).is_some()).await;
    let hosts: Vec<&str> = rec.view.keys().map(String::as_str).collect();
    let dev_host = |service: &str| format!("{service}.DEFAULT-GROUP.{}.nacos", dev_ns.replace('_', "-"));
    assert_eq!(hosts, vec![dev_host("api")]);

    // A service appearing later is picked up at the next listing.
    nacos.register(&Instance::new("late", "127.0.0.10", 7000).namespace(&dev_ns)).await.unwrap();
    rec.until("late service", |r| r.view.contains_key(&dev_host("late"))).await;
}

#[tokio::test]
async fn grpc_namespaces_groups_and_names() {
    namespaces_groups_and_names(GRPC, Flavor::Rnacos).await;
}

#[tokio::test]
async fn http_namespaces_groups_and_names() {
    namespaces_groups_and_names(HTTP, Flavor::Rnacos).await;
}

#[tokio::test]
async fn nacos3_grpc_namespaces_groups_and_names() {
    namespaces_groups_and_names(GRPC, Flavor::Nacos).await;
}

#[tokio::test]
async fn nacos3_http_namespaces_groups_and_names() {
    namespaces_groups_and_names(HTTP, Flavor::Nacos).await;
}

/// rnacos ignores `healthy=false`: an ephemeral instance without heartbeats
/// turns unhealthy after the heartbeat timeout (2 s, + 3 s rnacos adds), and
/// a heartbeat makes it healthy again.
async fn unhealthy_instances_are_excluded(kind: RegistryKind) {
    let nacos = rnacos(Options { heartbeat_timeout: Some(Duration::from_secs(2)), ..Options::default() }).await;
    nacos.register(&Instance::new("web", "127.0.0.2", 8080)).await.unwrap();
    let beating = Instance { ephemeral: true, ..Instance::new("web", "127.0.0.3", 8080) };
    nacos.register(&beating).await.unwrap();
    // Over gRPC the recovery below waits for the next full read (the
    // anti-entropy interval, 20 s here).
    let deadline = if kind == GRPC { Duration::from_secs(90) } else { DEADLINE };
    let mut spec = spec(kind, &nacos);
    spec.anti_entropy_interval = Some(Duration::from_secs(20));
    let watcher = watcher_for(&spec, meshbridge_registries::Selector::all()).unwrap();
    let mut rec: Recorder = Recorder::start(watcher, deadline);
    rec.until("both healthy", |r| r.endpoints(WEB).is_some_and(|e| e.len() == 2)).await;
    rec.until("the silent one unhealthy", |r| r.endpoints(WEB) == eps(&["127.0.0.2:8080"])).await;
    // It beats again, as a live instance does. rnacos does not push a health
    // change that a beat makes (it counts it as a time update): over gRPC it
    // shows at the watcher's next full read (every anti-entropy interval,
    // 20 s here); over HTTP at the next refresh.
    let beats = async {
        loop {
            nacos.beat(&beating).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        () = rec.until("healthy after heartbeats", |r| r.endpoints(WEB).is_some_and(|e| e.len() == 2)) => {}
        () = beats => {}
    }
}

#[tokio::test]
async fn grpc_unhealthy_instances_are_excluded() {
    unhealthy_instances_are_excluded(GRPC).await;
}

#[tokio::test]
async fn http_unhealthy_instances_are_excluded() {
    unhealthy_instances_are_excluded(HTTP).await;
}

/// Nacos honours `healthy` on register: an instance registered unhealthy
/// is left out, and registered again healthy it is back, by a push over
/// gRPC (well within the 15 s deadline, no full read needed) and at the
/// next refresh over HTTP. (Health checks are off on the test server, see
/// `nacos_server`; on rnacos, which ignores the flag, the case above.)
async fn nacos_healthy_flag_is_honoured(kind: RegistryKind) {
    let nacos = target(Flavor::Nacos).await;
    let web = &nacos.host("web", "DEFAULT_GROUP");
    nacos.register(&nacos.instance("web", "127.0.0.2", 8080)).await.unwrap();
    let sick = Instance { healthy: false, ..nacos.instance("web", "127.0.0.3", 8080) };
    nacos.register(&sick).await.unwrap();
    // Nacos applies a persistent registration through its Raft log, so a
    // list read right after the write may not show it yet (CI saw only the
    // first instance once): wait for the server to list it, unhealthy.
    let listed_by = Instant::now() + Duration::from_secs(15);
    loop {
        let listed = nacos.instances("web", "DEFAULT_GROUP", &nacos.namespace).await.unwrap();
        if listed.contains(r#""ip":"127.0.0.3""#) {
            assert!(listed.contains(r#""healthy":false"#), "registered unhealthy: {listed}");
            break;
        }
        assert!(Instant::now() < listed_by, "the server never listed the second instance: {listed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut rec = watch(target_spec(kind, &nacos));
    rec.until("only the healthy one", |r| r.endpoints(web) == eps(&["127.0.0.2:8080"])).await;
    let started = Instant::now();
    nacos.register(&Instance { healthy: true, ..sick.clone() }).await.unwrap();
    rec.until("healthy again", |r| r.endpoints(web).is_some_and(|e| e.len() == 2)).await;
    println!("FIGURE nacos_health_restored kind={kind} ms={}", started.elapsed().as_millis());
    nacos.register(&sick).await.unwrap();
    rec.until("unhealthy again", |r| r.endpoints(web) == eps(&["127.0.0.2:8080"])).await;
    assert!(rec.errors_since(0).is_empty(), "{}", rec.dump());
}

#[tokio::test]
async fn nacos3_grpc_healthy_flag_is_honoured() {
    nacos_healthy_flag_is_honoured(GRPC).await;
}

#[tokio::test]
async fn nacos3_http_healthy_flag_is_honoured() {
    nacos_healthy_flag_is_honoured(HTTP).await;
}

/// Stopping the server keeps endpoints (errors only); a restart resyncs.
/// One watcher per kind in `kinds`, all on the same server.
async fn outage_keeps_endpoints_then_restart_resyncs(kinds: &[RegistryKind], flavor: Flavor) {
    let mut nacos = Owned::start(flavor).await.expect("start the server");
    let web = Instance::new("web", "127.0.0.2", 8080);
    nacos.register(&web).await.unwrap();
    let mut recs: Vec<Recorder> = kinds.iter().map(|kind| watch(spec_at(*kind, nacos.http_port(), "public"))).collect();
    for rec in &mut recs {
        rec.until("web", |r| r.endpoints(WEB) == eps(&["127.0.0.2:8080"])).await;
    }

    let marks: Vec<usize> = recs.iter().map(Recorder::mark).collect();
    let stopped = Instant::now();
    nacos.stop();
    for (rec, mark) in recs.iter_mut().zip(&marks) {
        rec.until("errors over more than a refresh period", |r| {
            let last = r.last_at().unwrap_or(stopped);
            r.errors_since(*mark).len() >= 3 && last.duration_since(stopped) > REFRESH * 2
        })
        .await;
        rec.idle(REFRESH).await;
        let errors = rec.errors_since(*mark);
        assert!(errors.iter().all(|e| matches!(e, RegistryError::Unreachable { .. })), "{}", rec.dump());
        assert!(rec.updates_since(*mark).is_empty(), "no update while the server is down:\n{}", rec.dump());
        assert_eq!(rec.endpoints(WEB), eps(&["127.0.0.2:8080"]));
    }

    let marks: Vec<usize> = recs.iter().map(Recorder::mark).collect();
    nacos.restart().await.expect("restart the server");
    // Both servers keep persistent instances across a restart (rnacos in
    // its data dir, Nacos in JRaft's); register again anyway, which is what
    // a provider would do.
    nacos.register(&Instance::new("web", "127.0.0.3", 8080)).await.unwrap();
    for (rec, mark) in recs.iter_mut().zip(&marks) {
        rec.until("healthy, a fresh snapshot, and the new instance", |r| {
            r.since(*mark).any(|e| matches!(e, Event::Healthy))
                && r.snapshot_since(*mark).is_some()
                && r.endpoints(WEB).is_some_and(|e| e.contains(&"127.0.0.3:8080".to_string()))
        })
        .await;
    }
    // Pushes work again after the reconnect, not just the periodic resync.
    let marks: Vec<usize> = recs.iter().map(Recorder::mark).collect();
    nacos.register(&Instance::new("fresh", "127.0.0.4", 8080)).await.unwrap();
    for (rec, mark) in recs.iter_mut().zip(&marks) {
        rec.until("a new service", |r| r.view.contains_key("fresh.DEFAULT-GROUP.public.nacos")).await;
        assert!(rec.errors_since(*mark).is_empty(), "{}", rec.dump());
    }
}

#[tokio::test]
async fn grpc_outage_keeps_endpoints_then_restart_resyncs() {
    outage_keeps_endpoints_then_restart_resyncs(&[GRPC], Flavor::Rnacos).await;
}

#[tokio::test]
async fn http_outage_keeps_endpoints_then_restart_resyncs() {
    outage_keeps_endpoints_then_restart_resyncs(&[HTTP], Flavor::Rnacos).await;
}

/// Both watchers on one Nacos of the test's own: one JVM and one restart
/// instead of two.
#[tokio::test]
async fn nacos3_outage_keeps_endpoints_then_restart_resyncs() {
    outage_keeps_endpoints_then_restart_resyncs(&[GRPC, HTTP], Flavor::Nacos).await;
}

/// The gRPC client holds exactly one connection to the server's gRPC port
/// while the watcher runs, none while the server is down, reconnects within
/// seconds once it is back (its backoff is cut short when the port reopens:
/// nacos-sdk, used before, waited up to 64 s), gets pushes on the new
/// connection, and leaves nothing once the watcher is gone. Counted as this
/// process's established connections to the gRPC port. (A restarted Nacos
/// opens the port while it starts and refuses SDK connections until it has
/// started; the restart below returns once it answers.)
async fn one_connection_reconnects_promptly_and_goes_with_the_watcher(flavor: Flavor) {
    const OUTAGE: Duration = Duration::from_secs(15);
    /// From the restart to the new connection, with room for a loaded CI.
    const RECONNECT_WITHIN: Duration = Duration::from_secs(8);
    const WATCHED: Duration = Duration::from_secs(20);
    let mut nacos = Owned::start(flavor).await.expect("start the server");
    nacos.register(&Instance::new("web", "127.0.0.2", 8080)).await.unwrap();
    let port = nacos.http_port() + 1000;
    // The watcher's reachability check opens and drops a TCP connection:
    // count only what lasts over three samples 20 ms apart.
    let conns = || async move {
        let mut least = usize::MAX;
        for _ in 0..3 {
            least = least.min(meshbridge_e2e::bench::procfs::Proc::me().connections_to(&[port]));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        least
    };
    let mut rec = watch(spec_at(GRPC, nacos.http_port(), "public"));
    rec.until("web", |r| r.endpoints(WEB) == eps(&["127.0.0.2:8080"])).await;
    assert_eq!(conns().await, 1, "one gRPC connection while the watcher runs");

    nacos.stop();
    rec.idle(OUTAGE).await;
    assert_eq!(conns().await, 0);
    nacos.restart().await.expect("restart the server");
    let restarted = Instant::now();
    // (seconds after the restart, connections) at every change of the count.
    let mut timeline: Vec<(f64, usize)> = Vec::new();
    let mut pushed = false;
    while restarted.elapsed() < WATCHED {
        let n = conns().await;
        if timeline.last().is_none_or(|(_, last)| *last != n) {
            timeline.push((restarted.elapsed().as_secs_f64(), n));
        }
        assert!(n <= 1, "more than one connection: {timeline:?}");
        if !pushed && n == 1 {
            // The new connection gets pushes.
            nacos.register(&Instance::new("web", "127.0.0.3", 8080)).await.unwrap();
            pushed = true;
        }
        rec.idle(Duration::from_millis(200)).await;
    }
    eprintln!("connections to the gRPC port after the restart: {timeline:?}");
    let first = timeline.iter().find(|(_, n)| *n == 1).map(|(at, _)| *at);
    assert!(
        first.is_some_and(|at| at < RECONNECT_WITHIN.as_secs_f64()),
        "reconnected within {RECONNECT_WITHIN:?}: {timeline:?}"
    );
    assert_eq!(timeline.last().map(|(_, n)| *n), Some(1), "{timeline:?}");
    assert!(rec.endpoints(WEB).is_some_and(|e| e.contains(&"127.0.0.3:8080".to_string())), "{}", rec.dump());

    // The watcher goes, and its connection with it.
    drop(rec);
    let gone = Instant::now();
    while conns().await > 0 {
        assert!(gone.elapsed() < Duration::from_secs(5), "the connection outlived the watcher");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn grpc_one_connection_reconnects_promptly_and_goes_with_the_watcher() {
    one_connection_reconnects_promptly_and_goes_with_the_watcher(Flavor::Rnacos).await;
}

#[tokio::test]
async fn nacos3_grpc_one_connection_reconnects_promptly_and_goes_with_the_watcher() {
    one_connection_reconnects_promptly_and_goes_with_the_watcher(Flavor::Nacos).await;
}

const ADMIN: &str = "mb-admin";
const PASSWORD: &str = "pw-e2e-7c41d";

/// Login with a 3 s token: sync goes on well past the token's life; a wrong
/// password or none gives errors only, and no secret shows anywhere.
async fn auth_tokens_refresh_and_refusals_are_errors(kind: RegistryKind) {
    let opts = Options {
        auth: Some((ADMIN.into(), PASSWORD.into())),
        token_ttl: Some(Duration::from_secs(3)),
        ..Options::default()
    };
    let nacos = rnacos(opts).await;
    nacos.register(&Instance::new("web", "127.0.0.2", 8080)).await.unwrap();

    let mut good = spec(kind, &nacos);
    good.auth.insert("nacosUsername".into(), Secret::new(ADMIN));
    good.auth.insert("nacosPassword".into(), Secret::new(PASSWORD));
    let mut rec = watch(good);
    rec.until("web with a login", |r| r.endpoints(WEB) == eps(&["127.0.0.2:8080"])).await;

    let mut wrong = spec(kind, &nacos);
    wrong.auth.insert("nacosUsername".into(), Secret::new(ADMIN));
    wrong.auth.insert("nacosPassword".into(), Secret::new("wrong-pw-19ab"));
    let mut bad = watch(wrong);
    let mut anon = watch(spec(kind, &nacos));

    // Three token lifetimes later, a change still arrives.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let mark = rec.mark();
    nacos.register(&Instance::new("web", "127.0.0.3", 8080)).await.unwrap();
    rec.until("a change after the first token expired", |r| r.endpoints(WEB).is_some_and(|e| e.len() == 2)).await;
    assert!(rec.errors_since(mark).is_empty(), "{}", rec.dump());

    bad.until("login refusals", |r| {
        r.errors_since(0).iter().filter(|e| matches!(e, RegistryError::Status { status: 403, .. })).count() >= 2
    })
    .await;
    assert!(bad.updates_since(0).is_empty(), "{}", bad.dump());
    anon.until("refusals without credentials", |r| {
        r.errors_since(0).iter().filter(|e| matches!(e, RegistryError::Status { status: 401 | 403, .. })).count() >= 2
    })
    .await;
    assert!(anon.updates_since(0).is_empty(), "{}", anon.dump());
    for dump in [rec.dump(), bad.dump(), anon.dump()] {
        assert!(!dump.contains(PASSWORD) && !dump.contains("wrong-pw-19ab"), "{dump}");
    }
}

#[tokio::test]
async fn grpc_auth_tokens_refresh_and_refusals_are_errors() {
    auth_tokens_refresh_and_refusals_are_errors(GRPC).await;
}

#[tokio::test]
async fn http_auth_tokens_refresh_and_refusals_are_errors() {
    auth_tokens_refresh_and_refusals_are_errors(HTTP).await;
}

/// A tiny address server: answers `GET /nacos/serverlist` with the current
/// body, and records the request heads.
async fn address_server(body: Arc<Mutex<String>>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (body, seen) = (body.lock().unwrap().clone(), seen.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                seen.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(resp.as_bytes()).await;
            });
        }
    });
    (port, heads)
}

/// The server list comes from the address server; when it changes, the
/// watcher moves to the new servers.
async fn address_server_moves_the_watcher(kind: RegistryKind) {
    let a = rnacos(Options::default()).await;
    let b = rnacos(Options::default()).await;
    a.register(&Instance::new("alpha", "127.0.0.2", 8080)).await.unwrap();
    b.register(&Instance::new("beta", "127.0.0.3", 8080)).await.unwrap();
    let body = Arc::new(Mutex::new(format!("127.0.0.1:{}\n", a.http_port)));
    let (port, heads) = address_server(body.clone()).await;

    let mut spec = RegistrySpec::new(kind, format!("{kind}-as"), "", 0);
    spec.nacos_address_server = Some(format!("127.0.0.1:{port}"));
    spec.nacos_refresh_interval = Some(REFRESH);
    let mut rec = watch(spec);
    rec.until("alpha from server a", |r| r.view.contains_key("alpha.DEFAULT-GROUP.public.nacos")).await;

    *body.lock().unwrap() = format!("127.0.0.1:{}\n", b.http_port);
    rec.until("beta from server b, alpha gone", |r| {
        r.view.keys().collect::<Vec<_>>() == vec!["beta.DEFAULT-GROUP.public.nacos"]
    })
    .await;
    let heads = heads.lock().unwrap().clone();
    assert!(heads.iter().all(|h| h.starts_with("GET /nacos/serverlist ")), "{heads:?}");
}

#[tokio::test]
async fn grpc_address_server_moves_the_watcher() {
    address_server_moves_the_watcher(GRPC).await;
}

#[tokio::test]
async fn http_address_server_moves_the_watcher() {
    address_server_moves_the_watcher(HTTP).await;
}

fn bridge(port: u16, namespace: &str, group: &str) -> String {
    format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: nacos2
      name: local
      domain: 127.0.0.1
      port: {port}
      nacosNamespaceId: {namespace}
      nacosGroups: [{group}]
      nacosRefreshInterval: 2000000000
"#
    )
}

/// Editing nacosNamespaceId and nacosGroups in the McpBridge takes effect
/// without a restart: the reconciler restarts the watcher, the new group's
/// services appear and the old ones go.
async fn spec_change_moves(flavor: Flavor) {
    let nacos = target(flavor).await;
    let team_b = nacos.other_namespace("team_b");
    nacos.create_namespace(&team_b, "team b").await.unwrap();
    nacos.register(&nacos.instance("old", "127.0.0.2", 8080).group("g_one")).await.unwrap();
    nacos.register(&Instance::new("new", "127.0.0.3", 8080).group("g_two").namespace(&team_b)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bridge.yaml");
    std::fs::write(&file, bridge(nacos.http_port, &nacos.namespace, "g_one")).unwrap();
    // The bridge's 2 s resync is below Higress's 10 s floor: allow it.
    let app = App::start(RunArgs::loopback(dir.path()).with_min_refresh_interval(REFRESH)).await.unwrap();
    let hosts = |app: &App| app.cache.view().services.keys().cloned().collect::<Vec<String>>();
    let wait = |want: Vec<String>| {
        let app = &app;
        async move {
            let deadline = Instant::now() + DEADLINE;
            while hosts(app) != want {
                assert!(Instant::now() < deadline, "want {want:?}, have {:?}", hosts(app));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait(vec![nacos.host("old", "g_one")]).await;
    std::fs::write(&file, bridge(nacos.http_port, &team_b, "g_two")).unwrap();
    wait(vec![format!("new.g-two.{}.nacos", team_b.replace('_', "-"))]).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_change_moves_to_the_new_namespace_and_group() {
    spec_change_moves(Flavor::Rnacos).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos3_spec_change_moves_to_the_new_namespace_and_group() {
    spec_change_moves(Flavor::Nacos).await;
}
