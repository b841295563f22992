//! One service in two registries, as during a migration, on the real Nacos
//! 3.1 server: a `nacos` registry (HTTP, the Nacos 1.x client way) and a
//! `nacos2` registry (gRPC) read two namespaces of one server that hold the
//! same service, under one `nacosNamespace`, so both make the same host.
//! Traffic goes through a real Envoy fed by meshbridge:
//!
//! - both registries' instances get traffic (merged, none dropped);
//! - a weight share of 80/20 (`meshbridgeMigration`) holds in 1,000
//!   requests within ±5 %, although the sides have 1 and 3 instances;
//! - each migration step (a McpBridge edit of the weights, or a switch to
//!   priorities and back) reaches Envoy within 1 s, with no request failed
//!   under load;
//! - with the new registry preferred (`priority`), all traffic moves to the
//!   old one within 2 s of the new side's last instance going, and back
//!   when it returns.
//!
//! And Eureka to Nacos, on the real Eureka server and the real Nacos server
//! at once: their hosts never meet (`.eureka`, `.nacos`), so the route's
//! weights move the traffic, as `deploy/examples/eureka-to-nacos` shows.
//!
//! Needs `source e2e/env.sh nacos-server eureka-server envoy`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use meshbridge::run::App;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::load::Load;
use meshbridge_e2e::nacos::{Flavor, Instance};
use meshbridge_e2e::nacos_server::Target;
use meshbridge_e2e::traffic::{self, eds_ack_after, wait_for_traffic};

/// `vport` pins the service port on both sides, so both make this cluster.
const CLUSTER: &str = "outbound|8080||web.DEFAULT-GROUP.shop.nacos";

/// `migration`: the `meshbridgeMigration` of (old, new), YAML flow maps.
fn bridge(nacos: &Target, old_ns: &str, new_ns: &str, migration: (&str, &str)) -> String {
    let entry = |kind: &str, name: &str, ns: &str, m: &str| {
        let m = if m.is_empty() { String::new() } else { format!(", meshbridgeMigration: {m}") };
        format!(
            "{{type: {kind}, name: {name}, domain: 127.0.0.1, port: {port}, nacosNamespaceId: {ns}, \
             nacosNamespace: shop, nacosRefreshInterval: 30000000000, vport: {{default: 8080}}{m}}}",
            port = nacos.http_port
        )
    };
    traffic::mcpbridge(&[entry("nacos", "old", old_ns, migration.0), entry("nacos2", "new", new_ns, migration.1)])
}

/// Write the McpBridge and wait until Envoy ACKs the EDS it makes;
/// returns how long that took.
async fn step(app: &App, dir: &Path, yaml: &str) -> Duration {
    let t0 = SystemTime::now();
    // Whole or not at all, as `kubectl apply` would change it.
    std::fs::write(dir.join(".mcpbridge.tmp"), yaml).unwrap();
    std::fs::rename(dir.join(".mcpbridge.tmp"), dir.join("mcpbridge.yaml")).unwrap();
    eds_ack_after(app, t0).await
}

/// Which backends answered `n` requests.
async fn spread(envoy: &Envoy, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let (status, body) = envoy.get("/").await.expect("request");
        assert_eq!(status, 200, "{body}");
        *seen.entry(body).or_default() += 1;
    }
    seen
}

fn side(seen: &BTreeMap<String, usize>, prefix: &str) -> usize {
    seen.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, n)| n).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_http_and_grpc_registries_share_a_service_with_weights_and_failover() {
    let nacos = Target::start(Flavor::Nacos, Default::default()).await.expect("start nacos");
    let (old_ns, new_ns) = (nacos.namespace.clone(), nacos.other_namespace("new"));
    nacos.create_namespace(&new_ns, "new").await.unwrap();
    let old = Backend::start("127.0.0.1", "old-1").await.unwrap();
    let mut new = Vec::new();
    for i in 1..=3 {
        new.push(Backend::start("127.0.0.1", &format!("new-{i}")).await.unwrap());
    }
    let instance = |b: &Backend, ns: &str| Instance::new("web", "127.0.0.1", b.addr.port()).namespace(ns);
    nacos.register(&instance(&old, &old_ns)).await.unwrap();
    for b in &new {
        nacos.register(&instance(b, &new_ns)).await.unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let app = traffic::start_meshbridge(dir.path(), &bridge(&nacos, &old_ns, &new_ns, ("", ""))).await.unwrap();
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, CLUSTER).await.expect("start envoy");

    // 1. Merged: every instance of both registries serves.
    wait_for_traffic(&envoy, 200, &["new-1", "new-2", "new-3", "old-1"], "both registries' instances").await;
    let registries = reqwest::get(format!("http://{}/v1/registries", app.admin_addr))
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    for r in registries.as_array().unwrap() {
        assert_eq!(r["sharedServices"], 1, "{r:#}");
        assert_eq!(r["conflicts"].as_array().map(Vec::len), Some(0), "{r:#}");
    }

    // 2. Migration steps under load: each reaches Envoy within 1 s and
    //    fails no request.
    let load = Load::start(envoy.listen_port, "/", 50);
    let mut worst = Duration::ZERO;
    let steps = [
        ("{weight: 90}", "{weight: 10}"),
        ("{weight: 50}", "{weight: 50}"),
        ("{priority: 1}", "{priority: 0}"),
        ("{weight: 80}", "{weight: 20}"),
    ];
    for (o, n) in steps {
        let took = step(&app, dir.path(), &bridge(&nacos, &old_ns, &new_ns, (o, n))).await;
        println!("FIGURE migration_step_to_eds_ack old={o} new={n} ms={:.1}", took.as_secs_f64() * 1e3);
        worst = worst.max(took);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = load.stop().await;
    println!("FIGURE migration_steps_under_load {}", report.summary());
    assert_eq!(report.failed, 0, "a migration step failed requests: {}", report.summary());
    assert!(worst < Duration::from_secs(1), "a migration step took {worst:?} to reach Envoy");

    // 3. 80/20 whatever the instance counts (1 old, 3 new).
    let seen = spread(&envoy, 1000).await;
    let share = side(&seen, "old-") as f64 / 1000.0;
    println!("FIGURE migration_weight_share want=0.80 got={share:.3} {seen:?}");
    assert!((share - 0.80).abs() <= 0.05, "old share {share} not 0.80 ± 0.05: {seen:?}");

    // 4. Priority: the new registry preferred, the old one a fallback.
    step(&app, dir.path(), &bridge(&nacos, &old_ns, &new_ns, ("{priority: 1}", "{priority: 0}"))).await;
    wait_for_traffic(&envoy, 200, &["new-1", "new-2", "new-3"], "the preferred registry takes everything").await;
    for b in &new[1..] {
        nacos.deregister(&instance(b, &new_ns)).await.unwrap();
    }
    wait_for_traffic(&envoy, 200, &["new-1"], "the preferred level keeps its last instance").await;
    let gone = Instant::now();
    nacos.deregister(&instance(&new[0], &new_ns)).await.unwrap();
    wait_for_traffic(&envoy, 200, &["old-1"], "failover to the old registry").await;
    let failover = gone.elapsed();
    println!("FIGURE migration_priority_failover ms={:.0}", failover.as_secs_f64() * 1e3);
    assert!(failover < Duration::from_secs(2), "failover took {failover:?}");
    let back = Instant::now();
    nacos.register(&instance(&new[0], &new_ns)).await.unwrap();
    wait_for_traffic(&envoy, 200, &["new-1"], "back to the preferred registry").await;
    let failback = back.elapsed();
    println!("FIGURE migration_priority_failback ms={:.0}", failback.as_secs_f64() * 1e3);
    assert!(failback < Duration::from_secs(2), "failback took {failback:?}");
    app.stop().await;
}

/// The Ingress that moves `orders.example.com` from the app's Eureka host
/// to its Nacos host (they never share a host: `.eureka` and `.nacos`), as
/// `deploy/examples/eureka-to-nacos/ingress.yaml` does.
fn orders_ingress(eureka_pct: u32, nacos_host: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: orders\n  namespace: shop\n  \
         annotations:\n    higress.io/destination: |\n      {eureka_pct}% orders.eureka:8080\n      \
         {}% {nacos_host}:8080\nspec:\n  ingressClassName: higress\n  rules:\n    - host: orders.example.com\n      \
         http:\n        paths:\n          - {{ path: /, pathType: Prefix, backend: {{ resource: \
         {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }} }} }}\n",
        100 - eureka_pct
    )
}

/// Eureka's share of `n` requests to `orders.example.com`.
async fn eureka_share(envoy: &Envoy, n: usize) -> f64 {
    let mut eureka = 0;
    for _ in 0..n {
        let (status, body) = envoy.get_host("/", "orders.example.com").await.expect("request");
        assert_eq!(status, 200, "{body}");
        eureka += usize::from(body.starts_with("eureka-"));
    }
    eureka as f64 / n as f64
}

/// Eureka to Nacos with the real Eureka server and the real Nacos 3.1
/// server at once, through the standalone gateway: the route's weights
/// move the traffic (90/10, then 10/90 under load, no request failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eureka_to_nacos_moves_by_the_routes_weights_on_the_real_servers() {
    use meshbridge_e2e::eureka::{EurekaServer, instance as eureka_instance};
    let eureka = EurekaServer::start().await.expect("start the Eureka server (source e2e/env.sh eureka-server)");
    let nacos = Target::start(Flavor::Nacos, Default::default()).await.expect("start nacos");
    let (from, to) =
        (Backend::start("127.0.0.1", "eureka-1").await.unwrap(), Backend::start("127.0.0.1", "nacos-1").await.unwrap());
    eureka.api.register(eureka_instance("orders", "orders-1", "127.0.0.1", from.addr.port(), "UP")).await.unwrap();
    nacos.register(&nacos.instance("orders", "127.0.0.1", to.addr.port())).await.unwrap();
    let nacos_host = nacos.host("orders", "DEFAULT_GROUP");

    let dir = tempfile::tempdir().unwrap();
    let bridge = traffic::mcpbridge(&[
        format!("{{type: eureka, name: eureka, domain: 127.0.0.1, port: {}, vport: {{default: 8080}}}}", eureka.port),
        format!(
            "{{type: nacos2, name: nacos, domain: 127.0.0.1, port: {}, nacosNamespaceId: {}, vport: {{default: 8080}}}}",
            nacos.http_port, nacos.namespace
        ),
    ]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("ingress.yaml"), orders_ingress(90, &nacos_host)).unwrap();
    let gateway_port = meshbridge_e2e::free_port();
    let app = traffic::start_gateway(dir.path(), gateway_port).await.expect("start meshbridge");
    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, gateway_port).await.expect("start envoy");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        assert!(Instant::now() < deadline, "both registries never answered: {seen:?}\n{}", envoy.log());
        if let Ok((200, body)) = envoy.get_host("/", "orders.example.com").await {
            seen.insert(body);
        }
    }
    let share = eureka_share(&envoy, 1000).await;
    println!("FIGURE eureka_to_nacos_route_split want=0.90 got={share:.3}");
    assert!((share - 0.90).abs() <= 0.05, "Eureka's share {share} not 0.90 ± 0.05");

    let load = Load::start_host(envoy.listen_port, "/", "orders.example.com", 50);
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(dir.path().join(".ingress.tmp"), orders_ingress(10, &nacos_host)).unwrap();
    std::fs::rename(dir.path().join(".ingress.tmp"), dir.path().join("ingress.yaml")).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let report = load.stop().await;
    println!("FIGURE eureka_to_nacos_step_under_load {}", report.summary());
    assert_eq!(report.failed, 0, "the step failed requests: {}", report.summary());
    let share = eureka_share(&envoy, 1000).await;
    println!("FIGURE eureka_to_nacos_route_split want=0.10 got={share:.3}");
    assert!((share - 0.10).abs() <= 0.05, "Eureka's share {share} not 0.10 ± 0.05");
    app.stop().await;
}
