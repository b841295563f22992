//! Spring Cloud apps that register themselves (the user's view: a discovery
//! starter and its properties, nothing else) in a real Consul, a real
//! ZooKeeper and rnacos get HTTP traffic through a real Envoy via
//! meshbridge (in-process, on free ports). The app is
//! `deploy/examples/dubbo-spring/spring-app`, one jar with the three
//! starters; a Spring profile picks the registry.
//!
//! Each registry's test starts two instances at once, and checks that both
//! become Envoy endpoints and both get requests, and what the starter wrote
//! in its registry; takes one out through `/actuator/serviceregistry` and
//! puts it back; then stops it with SIGTERM (its starter deregisters it on
//! the way out) and checks that traffic goes only to the other within 20 s.
//! The Consul test also checks that the HTTP health check Spring registers
//! decides traffic; a fourth test puts a ZooKeeper app under a
//! `zkServicesPath` root.
//!
//! Needs `source e2e/env.sh spring-app envoy consul zookeeper rnacos`
//! (MESHBRIDGE_SPRING_APP_JAR, MESHBRIDGE_ENVOY_BIN, MESHBRIDGE_CONSUL_BIN,
//! MESHBRIDGE_ZK_JAR, MESHBRIDGE_RNACOS_BIN).

use std::time::{Duration, Instant};

use meshbridge::run::App;
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::faults::signal;
use meshbridge_e2e::nacos::Rnacos;
use meshbridge_e2e::spring_app::{Registry, SERVICE, SpringApp};
use meshbridge_e2e::traffic::{self, wait_for_members, wait_for_traffic};
use meshbridge_e2e::zookeeper::ZooKeeper;
use serde_json::Value;

/// vport pins the service port, so each cluster name is known up front;
/// endpoints keep the apps' own ports.
const VPORT: &str = "vport: {default: 8080}";

/// meshbridge on one registry (`entry`: a YAML flow mapping's entries) in
/// front of a real Envoy routing everything to `cluster`, and two instances
/// registering in `registry`, started together; both serve through Envoy.
struct Mesh {
    app: App,
    envoy: Envoy,
    first: SpringApp,
    second: SpringApp,
    _dir: tempfile::TempDir,
}

async fn mesh(registry: Registry, entry: &str, cluster: &str) -> Mesh {
    let dir = tempfile::tempdir().unwrap();
    let bridge = traffic::mcpbridge(&[format!("{{{entry}, {VPORT}}}")]);
    let meshbridge = async {
        let app = traffic::start_meshbridge(dir.path(), &bridge).await.expect("start meshbridge");
        let envoy = Envoy::start(app.xds_addr, AdsMode::Delta, cluster).await.expect("start envoy");
        (app, envoy)
    };
    let (apps, (app, envoy)) = tokio::join!(SpringApp::start_pair(&registry, ["greeter-1", "greeter-2"]), meshbridge);
    let (first, second) = apps.expect("start the Spring apps (source e2e/env.sh spring-app)");
    both_serve(&envoy, cluster, &first, &second).await;
    Mesh { app, envoy, first, second, _dir: dir }
}

/// Both self-registered instances are endpoints and get requests.
async fn both_serve(envoy: &Envoy, cluster: &str, first: &SpringApp, second: &SpringApp) {
    let (a, b) = (first.addr(), second.addr());
    wait_for_members(envoy, cluster, &[&a, &b], "both instances registered themselves").await;
    wait_for_traffic(envoy, 200, &[&first.instance_id, &second.instance_id], "both instances serve").await;
}

/// An operator takes the first out through Spring's service-registry
/// endpoint (`out` is the status its starter takes: Consul sets maintenance
/// mode, ZooKeeper `instance_status`, Nacos deregisters) and puts it back.
/// Then it is stopped gracefully and deregisters; traffic goes to the
/// second only, within `wait_for_traffic`'s 20 s. Returns how long that
/// took from the SIGTERM.
async fn out_back_then_stop(
    envoy: &Envoy,
    cluster: &str,
    first: &mut SpringApp,
    second: &SpringApp,
    out: &str,
) -> Duration {
    first.set_status(out).await.unwrap_or_else(|e| panic!("{e}\n{}", first.log()));
    wait_for_traffic(envoy, 200, &[&second.instance_id], &format!("the first instance set {out}")).await;
    first.set_status("UP").await.unwrap_or_else(|e| panic!("{e}\n{}", first.log()));
    wait_for_traffic(envoy, 200, &[&first.instance_id, &second.instance_id], "the first instance UP again").await;

    // Traffic is watched from the SIGTERM on: the JVM may take a while to
    // exit after it has deregistered.
    let stopped = Instant::now();
    let (exited, left) = tokio::join!(first.stop_gracefully(), async {
        wait_for_traffic(envoy, 200, &[&second.instance_id], "the stopped instance deregistered").await;
        stopped.elapsed()
    });
    exited.expect("stop the first instance");
    wait_for_members(envoy, cluster, &[&second.addr()], "the stopped instance left the endpoints").await;
    left
}

/// ZooKeeper with sessions of up to 30 s: the tests expire none, and a JVM
/// busy starting on 2 cores can miss a 3 s session's pings.
async fn zookeeper() -> ZooKeeper {
    ZooKeeper::start_with(Default::default(), Duration::from_secs(30))
        .await
        .expect("start zookeeper (source e2e/env.sh zookeeper)")
}

fn figure(registry: &str, started: Instant, left: Duration) {
    println!(
        "FIGURE spring_apps registry={registry} sigterm_to_settled_ms={} test_wall_s={:.1}",
        left.as_millis(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_cloud_consul_apps_get_traffic_through_envoy() {
    let started = Instant::now();
    let consul = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
    let cluster = "outbound|8080||greeter.dc1.consul";
    let entry =
        format!("type: consul, name: consul, domain: 127.0.0.1, port: {}, consulDatacenter: dc1", consul.http_port);
    let Mesh { app, envoy, mut first, second, _dir } =
        mesh(Registry::Consul { port: consul.http_port }, &entry, cluster).await;

    // What spring-cloud-consul registered: service `greeter`, our id, the
    // app's address and port, and an HTTP check on /actuator/health.
    let http = reqwest::Client::new();
    let url = format!("{}/v1/health/service/{SERVICE}", consul.url());
    let entries: Vec<Value> = http.get(&url).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = entries.iter().filter_map(|e| e["Service"]["ID"].as_str()).collect();
    assert_eq!(ids.len(), 2, "two instances of {SERVICE}: {entries:?}");
    assert!(ids.contains(&"greeter-1") && ids.contains(&"greeter-2"), "{entries:?}");
    let checks: Vec<&Value> = entries.iter().flat_map(|e| e["Checks"].as_array().into_iter().flatten()).collect();
    let http_checks = checks.iter().filter(|c| c["Type"] == "http" && c["ServiceName"] == SERVICE).count();
    assert_eq!(http_checks, 2, "one HTTP check per instance: {checks:?}");

    // A frozen JVM fails its HTTP check (1 s timeout): Consul marks it
    // critical and it leaves; thawed, it passes and comes back.
    let pid = first.pid().expect("first instance running");
    signal(pid, "-STOP");
    wait_for_members(&envoy, cluster, &[&second.addr()], "a critical instance leaves the endpoints").await;
    signal(pid, "-CONT");
    wait_for_traffic(&envoy, 200, &[&first.instance_id, &second.instance_id], "a passing instance is back").await;

    let left = out_back_then_stop(&envoy, cluster, &mut first, &second, "OUT_OF_SERVICE").await;
    let entries: Vec<Value> = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(entries.len(), 1, "only the second instance is left in Consul: {entries:?}");
    figure("consul", started, left);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_cloud_zookeeper_apps_get_traffic_through_envoy() {
    let started = Instant::now();
    let zk = zookeeper().await;
    // Spring Cloud Zookeeper's root, /services, becomes the host's label.
    let cluster = "outbound|8080||greeter.services.zookeeper";
    let entry = format!("type: zookeeper, name: zk, domain: 127.0.0.1, port: {}", zk.port);
    let registry = Registry::ZooKeeper { connect: zk.addr(), root: "/services".into() };
    let Mesh { app, envoy, mut first, second, _dir } = mesh(registry, &entry, cluster).await;

    // What spring-cloud-zookeeper wrote: /services/greeter/{id}, Curator's
    // ServiceInstance JSON with the app's address and port.
    let client = zk.client().await.expect("zookeeper client");
    let root = format!("/services/{SERVICE}");
    let nodes = client.zk().list_children(&root).await.unwrap();
    assert_eq!(nodes.len(), 2, "two instance nodes under {root}: {nodes:?}");
    let mut ports = Vec::new();
    for node in &nodes {
        let (data, _) = client.zk().get_data(&format!("{root}/{node}")).await.unwrap();
        let json: Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(json["id"], node.as_str(), "the node is named by the instance id: {json}");
        assert_eq!(json["payload"]["metadata"]["instance_status"], "UP", "{json}");
        assert_eq!(json["address"], "127.0.0.1", "{json}");
        assert_eq!(json["name"], SERVICE, "{json}");
        ports.push(json["port"].as_u64().unwrap());
    }
    ports.sort();
    let mut want = vec![u64::from(first.port), u64::from(second.port)];
    want.sort();
    assert_eq!(ports, want, "each instance node has its app's port");

    let left = out_back_then_stop(&envoy, cluster, &mut first, &second, "OUT_OF_SERVICE").await;
    let nodes = client.zk().list_children(&root).await.unwrap();
    assert_eq!(nodes.len(), 1, "the stopped instance deleted its node: {nodes:?}");
    figure("zookeeper", started, left);
    app.stop().await;
}

/// An app whose `spring.cloud.zookeeper.discovery.root` is not `/services`
/// is read through the McpBridge's `zkServicesPath`, and named after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_cloud_zookeeper_app_under_zk_services_path_gets_traffic() {
    let started = Instant::now();
    let zk = zookeeper().await;
    let cluster = "outbound|8080||greeter.apps-spring.zookeeper";
    let dir = tempfile::tempdir().unwrap();
    let entry = format!(
        "{{type: zookeeper, name: zk, domain: 127.0.0.1, port: {}, zkServicesPath: [/apps/spring], {VPORT}}}",
        zk.port
    );
    let registry = Registry::ZooKeeper { connect: zk.addr(), root: "/apps/spring".into() };
    let meshbridge = async {
        let app = traffic::start_meshbridge(dir.path(), &traffic::mcpbridge(&[entry])).await.expect("start meshbridge");
        let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, cluster).await.expect("start envoy");
        (app, envoy)
    };
    let (only, (app, envoy)) = tokio::join!(SpringApp::start(&registry, "greeter-1"), meshbridge);
    let mut only = only.expect("start the Spring app (source e2e/env.sh spring-app)");
    wait_for_members(&envoy, cluster, &[&only.addr()], "the instance under /apps/spring").await;
    wait_for_traffic(&envoy, 200, &[&only.instance_id], "the instance serves").await;

    let stopped = Instant::now();
    only.stop_gracefully().await.expect("stop the instance");
    wait_for_members(&envoy, cluster, &[], "the stopped instance left").await;
    figure("zookeeper-zkServicesPath", started, stopped.elapsed());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_cloud_alibaba_nacos_apps_get_traffic_through_envoy() {
    let started = Instant::now();
    let nacos = Rnacos::start().await.expect("start rnacos (source e2e/env.sh rnacos)");
    let cluster = "outbound|8080||greeter.DEFAULT-GROUP.public.nacos";
    let entry = format!("type: nacos2, name: nacos, domain: 127.0.0.1, port: {}", nacos.http_port);
    let Mesh { app, envoy, mut first, second, _dir } =
        mesh(Registry::Nacos { port: nacos.http_port }, &entry, cluster).await;

    // What nacos-client registered over gRPC: two ephemeral instances of
    // `greeter` in DEFAULT_GROUP, namespace public.
    let listed = nacos.instances(SERVICE, "DEFAULT_GROUP", "public").await.expect("list instances");
    let json: Value = serde_json::from_str(&listed).unwrap();
    let hosts = json["hosts"].as_array().cloned().unwrap_or_default();
    let ports: Vec<u64> = hosts.iter().filter_map(|h| h["port"].as_u64()).collect();
    assert!(ports.contains(&u64::from(first.port)) && ports.contains(&u64::from(second.port)), "{listed}");
    assert!(hosts.iter().all(|h| h["ephemeral"] == true && h["ip"] == "127.0.0.1"), "{listed}");

    let left = out_back_then_stop(&envoy, cluster, &mut first, &second, "DOWN").await;
    let listed = nacos.instances(SERVICE, "DEFAULT_GROUP", "public").await.expect("list instances");
    assert!(!listed.contains(&format!("\"port\":{}", first.port)), "the stopped instance deregistered: {listed}");
    figure("nacos", started, left);
    app.stop().await;
}
