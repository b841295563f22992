//! A real Apache Dubbo 3 provider (`deploy/examples/dubbo-spring/dubbo-provider`,
//! Dubbo 3.3 with Curator 5 and nacos-client 2.5) registers itself in a real
//! ZooKeeper and in rnacos, and its Triple service gets traffic through a
//! real Envoy fed by meshbridge (in-process, on free ports). Two instances
//! run with `register-mode=all`, so each registers both at interface and at
//! application level; one of them then stops the way a platform stops it
//! (SIGTERM: Dubbo unregisters on the way out) and must leave Envoy.
//!
//! What meshbridge serves of it, as Higress does (docs/src/registries/):
//! - ZooKeeper, application level: `/services/greeter/[::1]:{port}` (Curator
//!   JSON) becomes `greeter.services.zookeeper`, plain HTTP upstream.
//! - ZooKeeper, interface level: nothing. A Triple provider registers a
//!   `tri://` URL under `/dubbo/{interface}/providers`, and only `dubbo://`
//!   URLs are read (Higress's parser cuts `providers/dubbo://`).
//! - Nacos, both levels: service `greeter` becomes
//!   `greeter.DEFAULT-GROUP.public.nacos` (no `protocol` metadata: HTTP/1.1
//!   upstream), service `providers:{interface}:1.0.0:` becomes
//!   `providers:{interface}:1.0.0:.DEFAULT-GROUP.public.nacos` (metadata
//!   `protocol=tri`: GRPC, so an HTTP/2 upstream).
//!
//! Triple answers both: the calls are HTTP/1.1 JSON (`POST
//! /{interface}/whoami`) into Envoy, which forwards them as HTTP/1.1 or
//! HTTP/2 as the cluster says.
//!
//! Needs `source e2e/env.sh dubbo-provider zookeeper rnacos envoy`
//! (MESHBRIDGE_DUBBO_PROVIDER_JAR, MESHBRIDGE_ZK_JAR, MESHBRIDGE_RNACOS_BIN,
//! MESHBRIDGE_ENVOY_BIN).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use meshbridge::run::App;
use meshbridge_e2e::dubbo::{APPLICATION, DubboProvider, INTERFACE, Options, Protocol, RegisterMode, VERSION, whoami};
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::nacos::Rnacos;
use meshbridge_e2e::traffic;
use meshbridge_e2e::zookeeper::ZooKeeper;

/// `vport` pins the service port, so cluster names are known up front;
/// endpoints keep the providers' own ports.
const VPORT: u16 = 50051;
/// Dubbo 3.3's defaults: Triple, registered at both levels.
const TRIPLE_ALL: Options = Options { mode: RegisterMode::All, protocol: Protocol::Triple };
/// From SIGTERM to Envoy sending nothing more to the stopped instance.
const LEAVE_DEADLINE: Duration = Duration::from_secs(20);

fn cluster(host: &str) -> String {
    format!("outbound|{VPORT}||{host}")
}

/// The instance ids 20 calls in a row through `envoy` got (`"error"` for a
/// failed call), and the last error.
async fn sample(http: &reqwest::Client, envoy: &Envoy) -> (BTreeSet<String>, Option<String>) {
    let base = format!("http://127.0.0.1:{}", envoy.listen_port);
    let mut ids = BTreeSet::new();
    let mut error = None;
    for _ in 0..20 {
        match whoami(http, &base).await {
            Ok(id) => {
                ids.insert(id);
            }
            Err(e) => {
                ids.insert("error".into());
                error = Some(e.to_string());
            }
        }
    }
    (ids, error)
}

/// Poll until 20 calls in a row reach exactly the instances `want`.
async fn wait_for_ids(http: &reqwest::Client, envoy: &Envoy, want: &[&str], deadline: Duration, what: &str) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let until = Instant::now() + deadline;
    loop {
        let (got, error) = sample(http, envoy).await;
        if got == want {
            return;
        }
        if Instant::now() > until {
            let clusters = envoy.admin("/clusters").await.unwrap_or_default();
            panic!(
                "{what}: calls reached {got:?} (last error {error:?}), want {want:?} within {deadline:?}\n\
                 /clusters:\n{clusters}\n{}",
                envoy.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two provider instances, `p1` and `p2`, registered in `registry`, and
/// meshbridge reading it as `bridge_registry` (an McpBridge registry entry).
struct Run {
    t0: Instant,
    /// From the test's start until both providers had registered.
    started: Duration,
    providers: Vec<DubboProvider>,
    app: App,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Run {
    async fn start(t0: Instant, registry: &str, opts: Options, bridge_registry: String) -> Run {
        let providers = DubboProvider::start_all(registry, opts, &["p1", "p2"])
            .await
            .expect("start two Dubbo providers (source e2e/env.sh dubbo-provider)");
        let started = t0.elapsed();
        let dir = tempfile::tempdir().unwrap();
        let bridge = traffic::mcpbridge(&[bridge_registry]);
        let app = traffic::start_meshbridge(dir.path(), &bridge).await.expect("start meshbridge");
        Run { t0, started, providers, app, http: reqwest::Client::new(), _dir: dir }
    }

    /// An Envoy routing everything to `host`, once calls reach both instances.
    async fn envoy(&self, host: &str, mode: AdsMode) -> Envoy {
        let envoy = Envoy::start(self.app.xds_addr, mode, &cluster(host)).await.expect("start envoy");
        wait_for_ids(&self.http, &envoy, &["p1", "p2"], Duration::from_secs(30), &format!("{host}: both serve")).await;
        envoy
    }

    /// Stop `p1` with SIGTERM and wait until every Envoy routes only to
    /// `p2`, within [`LEAVE_DEADLINE`]; prints the timings.
    async fn stop_first(&mut self, envoys: &[&Envoy], what: &str) {
        let t0 = Instant::now();
        self.providers[0].stop_gracefully().await.expect("stop the first instance");
        for envoy in envoys {
            let left = LEAVE_DEADLINE.saturating_sub(t0.elapsed());
            wait_for_ids(&self.http, envoy, &["p2"], left, "the stopped instance left").await;
        }
        println!(
            "FIGURE dubbo_provider {what}: providers_registered_s={:.1} stopped_left_envoy_s={:.1} test_s={:.1}",
            self.started.as_secs_f64(),
            t0.elapsed().as_secs_f64(),
            self.t0.elapsed().as_secs_f64()
        );
    }
}

fn zookeeper_registry(zk: &ZooKeeper) -> String {
    format!("{{type: zookeeper, name: zk, domain: 127.0.0.1, port: {}, vport: {{default: {VPORT}}}}}", zk.port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dubbo_provider_in_zookeeper_gets_triple_traffic_through_envoy() {
    let t0 = Instant::now();
    let zk = ZooKeeper::start().await.expect("start zookeeper");
    let mut run =
        Run::start(t0, &format!("zookeeper://127.0.0.1:{}", zk.port), TRIPLE_ALL, zookeeper_registry(&zk)).await;
    let envoy = run.envoy(&format!("{APPLICATION}.services.zookeeper"), AdsMode::Delta).await;

    // The interface-level registration is there, and is not served: its URL
    // is tri://, and only dubbo:// providers are read (as in Higress).
    let c = zk.client().await.unwrap();
    let urls = c.zk().list_children(&format!("/dubbo/{INTERFACE}/providers")).await.expect("list the providers");
    assert_eq!(urls.len(), 2, "{urls:?}");
    assert!(urls.iter().all(|u| u.starts_with("tri%3A%2F%2F%5B%3A%3A1%5D")), "{urls:?}");
    let clusters = envoy.admin("/clusters").await.unwrap();
    assert!(!clusters.contains(&format!("providers:{INTERFACE}")), "a tri:// provider was served:\n{clusters}");

    run.stop_first(&[&envoy], "zookeeper").await;
    let instances = c.zk().list_children(&format!("/services/{APPLICATION}")).await.unwrap();
    assert_eq!(instances, vec![format!("[::1]:{}", run.providers[1].port)], "the stopped instance unregistered");
    run.app.stop().await;
}

/// What a Dubbo provider must do to be served at interface level from
/// ZooKeeper: register `dubbo://`. With `ext-protocol=tri` the same port
/// also answers Triple, so HTTP still goes through; meshbridge (like
/// Higress) names the port `dubbo`, a TCP port, and Envoy sends HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dubbo_protocol_provider_in_zookeeper_is_served_at_interface_level() {
    let t0 = Instant::now();
    let zk = ZooKeeper::start().await.expect("start zookeeper");
    let opts = Options { mode: RegisterMode::Interface, protocol: Protocol::DubboAndTriple };
    let mut run = Run::start(t0, &format!("zookeeper://127.0.0.1:{}", zk.port), opts, zookeeper_registry(&zk)).await;
    let c = zk.client().await.unwrap();
    assert!(
        !c.exists(&format!("/services/{APPLICATION}")).await.unwrap(),
        "register-mode=interface registered an instance"
    );
    let envoy = run.envoy(&format!("providers:{INTERFACE}:{VERSION}:.zookeeper"), AdsMode::Sotw).await;

    run.stop_first(&[&envoy], "zookeeper interface").await;
    let urls = c.zk().list_children(&format!("/dubbo/{INTERFACE}/providers")).await.unwrap();
    assert_eq!(urls.len(), 1, "the stopped instance unregistered: {urls:?}");
    run.app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dubbo_provider_in_nacos_gets_triple_traffic_through_envoy() {
    let t0 = Instant::now();
    let nacos = Rnacos::start().await.expect("start rnacos");
    // The real Java nacos-client, over gRPC (HTTP port + 1000).
    let registry = format!("nacos://127.0.0.1:{}", nacos.http_port);
    let bridge_registry = format!(
        "{{type: nacos2, name: nacos, domain: 127.0.0.1, port: {}, vport: {{default: {VPORT}}}}}",
        nacos.http_port
    );
    let mut run = Run::start(t0, &registry, TRIPLE_ALL, bridge_registry).await;
    let by_app = format!("{APPLICATION}.DEFAULT-GROUP.public.nacos");
    let by_interface = format!("providers:{INTERFACE}:{VERSION}:.DEFAULT-GROUP.public.nacos");
    let (app_envoy, iface_envoy) =
        tokio::join!(run.envoy(&by_app, AdsMode::Delta), run.envoy(&by_interface, AdsMode::Sotw));

    // Interface level says protocol=tri: the cluster speaks HTTP/2 upstream;
    // application level names no protocol: HTTP/1.1.
    let config = app_envoy.admin("/config_dump?resource=dynamic_active_clusters").await.unwrap();
    let h2 = |host: &str| {
        let at = config.find(&format!("\"name\": \"{}\"", cluster(host))).expect("cluster in config_dump");
        let end = config[at..].find("\"last_updated\"").map_or(config.len(), |e| at + e);
        config[at..end].contains("http2_protocol_options")
    };
    assert!(h2(&by_interface), "interface-level cluster without HTTP/2:\n{config}");
    assert!(!h2(&by_app), "application-level cluster with HTTP/2:\n{config}");

    run.stop_first(&[&app_envoy, &iface_envoy], "nacos").await;
    for service in [APPLICATION.to_string(), format!("providers:{INTERFACE}:{VERSION}:")] {
        let listed = nacos.instances(&service, "DEFAULT_GROUP", "public").await.unwrap();
        let gone = format!("\"port\":{}", run.providers[0].port);
        assert!(!listed.contains(&gone), "the stopped instance unregistered from {service}: {listed}");
        assert!(listed.contains(&format!("\"port\":{}", run.providers[1].port)), "{service}: {listed}");
    }
    run.app.stop().await;
}
