//! meshbridge as the config source of a REAL istiod (`pilot-discovery`
//! from istio.io/istio, `e2e/setup.sh istiod`, `src/istiod.rs`), which runs
//! against a real kube-apiserver and reads its Istio config only from
//! meshbridge over MCP (`configSources: [{address: xds://…}]`). Registry
//! services come from a real Consul; the McpBridge and an Ingress are
//! meshbridge's config files (standalone mode).
//!
//! What istiod serves is checked at istiod itself (`/debug/configz`,
//! `/debug/registryz`, `/debug/endpointShardz`, `/debug/config_dump`) and
//! through a stock Envoy (the PyPI build, not Istio's proxy) connected to
//! istiod's xDS as an Istio gateway. Upstream Envoy lacks Istio's own
//! extensions, and istiod's gateway listeners carry them (`istio.alpn`,
//! whose config type is `istio.envoy.config.filter.http.alpn.v2alpha1`;
//! with metadata exchange on, `istio.metadata_exchange` too), so that
//! Envoy takes only clusters and endpoints from istiod (CDS/EDS), behind a
//! static listener of its own; the listener and routes istiod builds for
//! the Ingress are fetched from istiod's xDS on a stream of the test's own,
//! as the same proxy (`/debug/config_dump` shows only the types a proxy
//! subscribed to). istiod runs with metadata exchange and auto mTLS off
//! (`istiod::Options::upstream_envoy`), since both would put Istio-only
//! pieces into every cluster.
//!
//! Each scenario runs once per istiod build, master and 1.27.9
//! (`istiod_tests!`). Needs `source e2e/env.sh consul envoy kubetools
//! kube-apiserver istiod istiod-1.27` (MESHBRIDGE_CONSUL_BIN,
//! MESHBRIDGE_ENVOY_BIN, MESHBRIDGE_KUBECTL_BIN, MESHBRIDGE_KUBE_APISERVER_BIN,
//! MESHBRIDGE_ETCD_BIN, MESHBRIDGE_ISTIOD_BIN, MESHBRIDGE_ISTIOD_127_BIN).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::{RouteAction, RouteConfiguration, route};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use futures::StreamExt;
use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::envoy::{AdsMode, Envoy, Node};
use meshbridge_e2e::free_port;
use meshbridge_e2e::istiod::{Istiod, Options, Version};
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::wait_for_traffic;
use prost::Message;
use serde_json::{Value, json};

const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

const HOST: &str = "web.dc1.consul";
const CLUSTER: &str = "outbound|8080||web.dc1.consul";
const INGRESS_HOST: &str = "web.example.com";
/// The EnvoyFilter cluster meshbridge adds for McpBridge proxy `corp`.
const PROXY_CLUSTER: &str = "outbound|3128||corp.proxy";
/// The gateway Envoy's name and namespace: the Ingress Gateway and the
/// proxy EnvoyFilters live in `higress-system`, and a Gateway selects its
/// workloads by labels, which a proxy without a pod gives in its metadata.
const GATEWAY_ID: &str = "higress-gateway-e2e.higress-system";
/// From a registry change to istiod's Envoy, a bound well above istiod's
/// debounce (100 ms, at most 10 s under a burst) and meshbridge's push.
const CHANGE_DEADLINE: Duration = Duration::from_secs(20);

/// What meshbridge publishes, as McpBridge and Ingress files: the Consul
/// registry (`web.dc1.consul`, port pinned at 8080), a static https
/// registry sent through HTTP CONNECT proxy `corp` (nothing listens there;
/// it exists for its DestinationRule and EnvoyFilters), and an Ingress
/// routing `web.example.com` to the Consul service.
fn config(consul: &Consul) -> String {
    format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: consul
      name: local
      domain: 127.0.0.1
      port: {consul_port}
      consulDatacenter: dc1
      vport: {{ default: 8080 }}
    - type: static
      name: partner
      domain: 127.0.0.1:{partner_port}
      port: 443
      protocol: https
      sni: api.partner.example
      proxyName: corp
  proxies:
    - type: http
      name: corp
      serverAddress: 127.0.0.1
      serverPort: 3128
      listenerPort: {listener_port}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  annotations:
    higress.io/destination: {HOST}:8080
spec:
  ingressClassName: higress
  rules:
    - host: {INGRESS_HOST}
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              resource: {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }}
"#,
        consul_port = consul.http_port,
        partner_port = free_port(),
        listener_port = free_port(),
    )
}

fn instance(id: &str, backend: &Backend) -> Value {
    json!({
        "ID": id,
        "Name": "web",
        "Address": backend.addr.ip().to_string(),
        "Port": backend.addr.port(),
        "Check": { "CheckID": format!("{id}-ttl"), "TTL": "300s", "Status": "passing" },
    })
}

/// Consul, meshbridge on it, an API server and istiod reading meshbridge.
struct Stack {
    consul: Consul,
    app: App,
    istiod: Istiod,
    _api: ApiServer,
    _dir: tempfile::TempDir,
}

impl Stack {
    async fn start(version: Version, backends: &[(&str, &Backend)]) -> Stack {
        let consul = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
        for (id, backend) in backends {
            consul.register(instance(id, backend)).await.unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mcpbridge.yaml"), config(&consul)).unwrap();
        let app = App::start(RunArgs::loopback(dir.path())).await.expect("start meshbridge");
        let api = ApiServer::start().await.expect("start kube-apiserver (source e2e/env.sh kube-apiserver kubetools)");
        let options = Options { version, upstream_envoy: true, stock_gateway_listeners: false, secure_xds: false };
        let istiod = Istiod::start(&api, app.xds_addr, options)
            .await
            .unwrap_or_else(|e| panic!("start {version} (source e2e/env.sh istiod istiod-1.27): {e:#}"));
        Stack { consul, app, istiod, _api: api, _dir: dir }
    }

    /// meshbridge's MCP resources now: collection (`group/Kind`) → names.
    fn published(&self) -> BTreeMap<String, BTreeSet<String>> {
        let set = self.app.config.borrow().set.clone();
        set.mcp
            .iter()
            .filter(|(_, r)| !r.is_empty())
            .map(|(c, r)| (c.clone(), r.names().map(|n| n.to_string()).collect()))
            .collect()
    }
}

/// istiod's `/debug/configz` keyed the way MCP names them:
/// `group/Kind` → `namespace/name`.
async fn istiod_configs(istiod: &Istiod) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (key, object) in istiod.configs().await.unwrap() {
        let group = object["apiVersion"].as_str().unwrap_or_default().split('/').next().unwrap_or_default().to_owned();
        let (kind, name) = key.split_once(' ').unwrap();
        out.entry(format!("{group}/{kind}")).or_default().insert(name.to_owned());
    }
    out
}

/// The MCP type URLs `version` asks meshbridge for.
fn asks_for(version: Version) -> BTreeSet<&'static str> {
    use meshbridge::testing::{ISTIOD_1_27_ASKS_FOR, ISTIOD_MASTER_ALSO_ASKS_FOR};
    let also: &[&str] = if version == Version::Master { &ISTIOD_MASTER_ALSO_ASKS_FOR } else { &[] };
    ISTIOD_1_27_ASKS_FOR.iter().chain(also).copied().collect()
}

/// The HTTP filters of `listener`'s connection managers: (name, config type).
fn http_filters(listener: &Listener) -> Vec<(String, String)> {
    let managers = listener.filter_chains.iter().flat_map(|c| &c.filters).filter_map(|f| match &f.config_type {
        Some(envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any))
            if any.type_url.ends_with(".HttpConnectionManager") =>
        {
            HttpConnectionManager::decode(any.value.as_slice()).ok()
        }
        _ => None,
    });
    let filters = managers.flat_map(|m| m.http_filters);
    filters
        .map(|f| {
            let config = match f.config_type {
                Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(any)) => any.type_url,
                _ => String::new(),
            };
            (f.name, config)
        })
        .collect()
}

istiod_tests!(
    registry_service_and_ingress_reach_istiod_over_mcp,
    envoy_on_istiod_gets_the_registry_service_and_follows_changes,
    #[ignore = "a figure at 1k services (about a minute; 10k about 6 min); run with --ignored"]
    figure_change_latency_through_istiod_at_1k_services,
    #[ignore = "a figure: churn at 10 and 50 changes a second for 60 s each (1k services: about 4 min); run with --ignored"]
    figure_churn_through_istiod,
);

async fn registry_service_and_ingress_reach_istiod_over_mcp(version: Version) {
    let backend = Backend::start("127.0.0.1", "backend-1").await.unwrap();
    let stack = Stack::start(version, &[("web-1", &backend)]).await;

    // Everything meshbridge publishes over MCP, and nothing else, is what
    // istiod holds: ServiceEntries, the TLS DestinationRule, the Ingress's
    // Gateway and VirtualService, the proxy EnvoyFilters.
    let want = stack.published();
    for kind in ["ServiceEntry", "DestinationRule", "Gateway", "VirtualService", "EnvoyFilter"] {
        let collection = format!("networking.istio.io/{kind}");
        assert!(want.get(&collection).is_some_and(|n| !n.is_empty()), "meshbridge publishes no {kind}: {want:?}");
    }
    assert!(want["networking.istio.io/ServiceEntry"].contains(&format!("mcp/{HOST}")), "{want:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = istiod_configs(&stack.istiod).await;
    while got != want {
        assert!(Instant::now() < deadline, "{version} holds {got:?}, not {want:?}\n{}", stack.istiod.log_tail(4000));
        tokio::time::sleep(Duration::from_millis(200)).await;
        got = istiod_configs(&stack.istiod).await;
    }
    println!("{version} holds: {got:?}");

    // The ServiceEntry as istiod decoded it, and the service and endpoint
    // its registry made of it.
    let configs = stack.istiod.configs().await.unwrap();
    let se = &configs[&format!("ServiceEntry mcp/{HOST}")];
    assert_eq!(se["spec"]["hosts"], json!([HOST]), "{se}");
    assert_eq!(se["spec"]["ports"][0]["number"], 8080, "{se}");
    assert_eq!(se["spec"]["endpoints"][0]["ports"]["http-8080"], backend.addr.port(), "{se}");
    let vs = configs.values().find(|c| c["kind"] == "VirtualService").unwrap();
    assert_eq!(vs["spec"]["hosts"], json!([INGRESS_HOST]), "{vs}");
    assert_eq!(vs["spec"]["http"][0]["route"][0]["destination"]["host"], HOST, "{vs}");

    let registry = stack.istiod.debug("registryz").await.unwrap();
    let service = registry.as_array().unwrap().iter().find(|s| s["hostname"] == HOST);
    let service = service.unwrap_or_else(|| panic!("{HOST} not in {version}'s /debug/registryz: {registry:.2000}"));
    assert_eq!(service["ports"][0]["port"], 8080, "{service}");
    let shards = stack.istiod.debug_text("endpointShardz").await.unwrap();
    assert!(shards.contains(HOST) && shards.contains(&backend.addr.port().to_string()), "{shards:.3000}");

    // The type URLs istiod asks for, each answered, none refused.
    let clients = stack.app.clients.snapshot();
    let istiod = clients.iter().find(|c| c.subscribed_types.iter().any(|t| t.ends_with("/ServiceEntry")));
    let istiod = istiod.unwrap_or_else(|| panic!("no MCP client among {clients:#?}"));
    println!("{version} (node {}) asks meshbridge for: {:?}", istiod.node_id, istiod.subscribed_types);
    let asked: BTreeSet<&str> = istiod.subscribed_types.iter().map(String::as_str).collect();
    assert_eq!(asked, asks_for(version), "{version}");
    for (type_url, status) in &istiod.types {
        assert!(status.last_sent_version.is_some(), "{version}: {type_url} never answered");
        assert_eq!(status.nacks, 0, "{version}: {type_url} refused: {:?}", status.last_nack_detail);
    }
}

async fn envoy_on_istiod_gets_the_registry_service_and_follows_changes(version: Version) {
    // Two instances of one service: on one address but for 1.27, which
    // misses a change there (`Version::instance_address`).
    let b1 = Backend::start(&version.instance_address(0), "backend-1").await.unwrap();
    let b2 = Backend::start(&version.instance_address(1), "backend-2").await.unwrap();
    let stack = Stack::start(version, &[("web-1", &b1)]).await;

    // An Istio gateway node: `router~IP~name.namespace~domain`, with the
    // labels the Ingress Gateway selects (Higress's gateway pods'). The IP
    // only names the proxy (istiod never connects to it), but istiod looks
    // its workload up by it: 127.0.0.x are the backends' addresses in the
    // ServiceEntry, whose (empty) endpoint labels would then replace
    // these, so it is a documentation address (RFC 5737) instead.
    let node = Node {
        id: format!("router~192.0.2.10~{GATEWAY_ID}~higress-system.svc.cluster.local"),
        cluster: "higress-gateway".into(),
        metadata: Some("{ LABELS: { higress: higress-system-higress-gateway } }".into()),
    };
    let envoy = Envoy::start_as(&node, stack.istiod.grpc_addr, AdsMode::Sotw, CLUSTER).await.expect("start envoy");
    wait_for_traffic(&envoy, 200, &["backend-1"], &format!("the Consul instance serves through {version}")).await;

    // What istiod sent it: the service's cluster over EDS with the
    // instance's endpoint, and the cluster of meshbridge's proxy
    // EnvoyFilter (CLUSTER ADD, context GATEWAY), which only istiod applies.
    let clusters = envoy.admin("/clusters").await.unwrap();
    assert!(clusters.contains(&format!("{CLUSTER}::{}", b1.addr)), "{clusters:.4000}");
    assert!(clusters.contains(&format!("{PROXY_CLUSTER}::127.0.0.1:3128")), "{clusters:.4000}");

    // The listener and routes istiod builds for this gateway from the
    // Ingress's Gateway and VirtualService, asked for on a stream of our
    // own as the same proxy (this Envoy takes no listeners: module doc).
    let labels = [("higress", "higress-system-higress-gateway")];
    let listeners = stack.istiod.fetch(&node.id, &labels, LISTENER_TYPE, &[]).await.unwrap();
    let listeners: Vec<Listener> = listeners.iter().map(|a| Listener::decode(a.value.as_slice()).unwrap()).collect();
    let http80 = listeners.iter().find(|l| l.name == "0.0.0.0_80");
    let http80 = http80.unwrap_or_else(|| {
        let names: Vec<&String> = listeners.iter().map(|l| &l.name).collect();
        panic!("{version}: no gateway listener on 80: {names:?}\n--- istiod ---\n{}", stack.istiod.log_tail(8000))
    });
    let filters = http_filters(http80);
    println!("{version}'s gateway listener 0.0.0.0_80 has HTTP filters {filters:?}");
    assert!(filters.iter().any(|(name, _)| name == "envoy.filters.http.router"), "{filters:?}");
    // Why this Envoy takes no listeners from istiod: a filter whose config
    // type only Istio's Envoy build knows (`istio.alpn`), which a stock
    // Envoy refuses with the whole LDS update.
    assert!(
        filters
            .iter()
            .any(|(_, config)| config.contains(".istio.") || config.starts_with("type.googleapis.com/istio.")),
        "{filters:?}"
    );
    let routes = stack.istiod.fetch(&node.id, &labels, ROUTE_TYPE, &["http.80"]).await.unwrap();
    let route = RouteConfiguration::decode(routes[0].value.as_slice()).unwrap();
    let vhost = route.virtual_hosts.iter().find(|v| v.domains.iter().any(|d| d == INGRESS_HOST));
    let vhost = vhost.unwrap_or_else(|| panic!("{version}: no virtual host for {INGRESS_HOST} in {route:?}"));
    let action = vhost.routes.first().and_then(|r| r.action.clone());
    let Some(route::Action::Route(RouteAction { cluster_specifier: Some(ClusterSpecifier::Cluster(cluster)), .. })) =
        action
    else {
        panic!("{version}: {INGRESS_HOST} does not route to one cluster: {vhost:?}");
    };
    assert_eq!(cluster, CLUSTER, "{version}");

    // A second instance joins, then the first leaves: each change goes
    // Consul → meshbridge → MCP → istiod → EDS → Envoy within the bound.
    let started = Instant::now();
    stack.consul.register(instance("web-2", &b2)).await.unwrap();
    wait_for_traffic(&envoy, 200, &["backend-1", "backend-2"], &format!("the new instance serves ({version})")).await;
    let joined = started.elapsed();
    let started = Instant::now();
    stack.consul.deregister("web-1").await.unwrap();
    wait_for_traffic(&envoy, 200, &["backend-2"], &format!("the removed instance is gone ({version})")).await;
    let left = started.elapsed();
    assert!(
        joined < CHANGE_DEADLINE && left < CHANGE_DEADLINE,
        "{version}: joined after {joined:?}, left after {left:?}"
    );
    println!(
        "FIGURE istiod_consul_change_to_envoy_traffic istiod={} join_ms={} leave_ms={}",
        version.release(),
        joined.as_millis(),
        left.as_millis()
    );
}

/// MCP bytes meshbridge has sent so far (`meshbridge_xds_push_bytes_total`
/// of every Istio collection).
async fn mcp_bytes_sent(app: &App) -> f64 {
    mcp_sum(app, "meshbridge_xds_push_bytes_total").await
}

/// A counter of meshbridge's summed over the Istio collections.
async fn mcp_sum(app: &App, metric: &str) -> f64 {
    let url = format!("http://{}/metrics", app.admin_addr);
    let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
    let samples = meshbridge::testing::exposition::parse(&text).unwrap();
    let mcp = samples.iter().filter(|s| s.name == metric);
    mcp.filter(|s| s.labels.get("type_url").is_some_and(|t| !t.starts_with("type.googleapis.com/")))
        .map(|s| s.value)
        .sum()
}

/// Poll `GET /` through `envoy` every 2 ms until `backend` answers.
async fn first_answer_from(envoy: &Envoy, backend: &str, since: Instant) -> Duration {
    loop {
        if let Ok((200, body)) = envoy.get("/").await
            && body == backend
        {
            return since.elapsed();
        }
        assert!(since.elapsed() < CHANGE_DEADLINE, "{backend} never answered\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// What the figures measure through: istiod on meshbridge, an Envoy on
/// istiod's xDS as the gateway and one on meshbridge's own ADS, both
/// carrying traffic to `web` on `backend-1`.
struct Figure {
    istiod: Istiod,
    via_istiod: Envoy,
    direct: Envoy,
    _api: ApiServer,
}

impl Figure {
    async fn start(app: &App, version: Version) -> Figure {
        let api = ApiServer::start().await.expect("start kube-apiserver");
        let started = Instant::now();
        let options = Options { version, upstream_envoy: true, stock_gateway_listeners: false, secure_xds: false };
        let istiod =
            Istiod::start(&api, app.xds_addr, options).await.unwrap_or_else(|e| panic!("start {version}: {e:#}"));
        println!("{version} ready in {:?}", started.elapsed());
        let node = Node {
            id: format!("router~192.0.2.10~{GATEWAY_ID}~higress-system.svc.cluster.local"),
            cluster: "higress-gateway".into(),
            metadata: Some("{ LABELS: { higress: higress-system-higress-gateway } }".into()),
        };
        let via_istiod = Envoy::start_as(&node, istiod.grpc_addr, AdsMode::Sotw, CLUSTER).await.expect("start envoy");
        let direct = Envoy::start(app.xds_addr, AdsMode::Delta, CLUSTER).await.expect("start envoy");
        wait_for_traffic(&via_istiod, 200, &["backend-1"], &format!("through {version}")).await;
        wait_for_traffic(&direct, 200, &["backend-1"], "direct").await;
        Figure { istiod, via_istiod, direct, _api: api }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// A figure, not a check: with 1,000 more services in Consul (1,000
/// ServiceEntries in istiod, 1,000 clusters in each Envoy), the one
/// instance of `web` moves between two backends 20 times, and each move is
/// timed from the Consul write to the first answer from the new backend,
/// through istiod (Envoy on istiod's xDS) and directly (an Envoy on
/// meshbridge's own ADS), both watching the same change; with istiod's CPU
/// and the MCP bytes per change. Run with
/// `cargo test -p meshbridge-e2e --test istiod -- --ignored --nocapture figure`;
/// (`…::master` or `…::istio_1_27` for one istiod);
/// `MESHBRIDGE_ISTIOD_FIGURE_SERVICES=10000` for another catalog size.
async fn figure_change_latency_through_istiod_at_1k_services(version: Version) {
    let services: usize =
        std::env::var("MESHBRIDGE_ISTIOD_FIGURE_SERVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    const CHANGES: usize = 20;
    let b1 = Backend::start("127.0.0.1", "backend-1").await.unwrap();
    let b2 = Backend::start("127.0.0.1", "backend-2").await.unwrap();
    let consul = Consul::start().await.expect("start consul");
    let started = Instant::now();
    for i in 0..services {
        let other = json!({"ID": format!("svc-{i:05}"), "Name": format!("svc-{i:05}"), "Address": "127.0.0.1", "Port": 20000 + i % 40000});
        consul.register(other).await.unwrap();
    }
    consul.register(instance("web-1", &b1)).await.unwrap();
    println!("registered {services} services in {:?}", started.elapsed());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mcpbridge.yaml"), config(&consul)).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.expect("start meshbridge");
    let Figure { istiod, via_istiod, direct, .. } = &Figure::start(&app, version).await;
    let clusters = via_istiod.admin("/clusters").await.unwrap();
    let count = clusters.lines().filter(|l| l.contains("::observability_name::")).count();
    assert!(count > services, "Envoy on {version} has {count} clusters");

    let proc = meshbridge_e2e::bench::procfs::Proc::pid(istiod.pid().unwrap());
    let (cpu0, bytes0) = (proc.cpu(), mcp_bytes_sent(&app).await);
    let (mut through, mut straight) = (Vec::new(), Vec::new());
    for i in 0..CHANGES {
        let (to, name) = if i % 2 == 0 { (&b2, "backend-2") } else { (&b1, "backend-1") };
        let t0 = Instant::now();
        consul.register(instance("web-1", to)).await.unwrap();
        let (a, b) = tokio::join!(first_answer_from(via_istiod, name, t0), first_answer_from(direct, name, t0));
        through.push(a);
        straight.push(b);
        // Let istiod's debounce window close before the next change.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (cpu, bytes) = (proc.cpu() - cpu0, mcp_bytes_sent(&app).await - bytes0);
    through.sort();
    straight.sort();
    println!(
        "FIGURE istiod_change_to_traffic istiod={} services={services} p50_ms={:.0} p99_ms={:.0} direct_p50_ms={:.0} direct_p99_ms={:.0} istiod_cpu_ms_per_change={:.0} mcp_kb_per_change={:.0}",
        version.release(),
        percentile(&through, 0.5),
        percentile(&through, 0.99),
        percentile(&straight, 0.5),
        percentile(&straight, 0.99),
        cpu * 1e3 / CHANGES as f64,
        bytes / 1024.0 / CHANGES as f64,
    );
}

/// The node the churn figure's instances are on: a catalog node of its
/// own, so that registering and flipping them is one catalog write each
/// (the agent's own registrations resync every service of the agent, which
/// makes 10,000 of them take many minutes).
const FIGURE_NODE: &str = "figure";

/// A catalog entry: instance `id` of service `name` on `addr` on
/// [`FIGURE_NODE`], with a check `passing` or `critical`.
fn checked(id: &str, name: &str, addr: std::net::SocketAddr, passing: bool) -> Value {
    let mut entry = check_entry(id, passing);
    entry["Service"] = json!({ "ID": id, "Service": name, "Address": addr.ip().to_string(), "Port": addr.port() });
    entry
}

/// A catalog write that sets the check of instance `id` alone.
fn check_entry(id: &str, passing: bool) -> Value {
    json!({
        "Node": FIGURE_NODE,
        "Address": "127.0.0.1",
        "SkipNodeUpdate": true,
        "Check": {
            "Node": FIGURE_NODE,
            "CheckID": format!("{id}-check"),
            "Name": "figure",
            "ServiceID": id,
            "Status": if passing { "passing" } else { "critical" },
        },
    })
}

/// Poll `GET /` through `envoy` every 2 ms until `backend` answers, for at
/// most `deadline`.
async fn answer_within(envoy: &Envoy, backend: &str, since: Instant, deadline: Duration) -> Option<Duration> {
    while since.elapsed() < deadline {
        if let Ok((200, body)) = envoy.get("/").await
            && body == backend
        {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

/// A figure, not a check (issue 36 item 4): churn through istiod. With N
/// Consul services of one instance each, with a check of its own (default 1,000;
/// `MESHBRIDGE_ISTIOD_FIGURE_SERVICES=10000`), a seeded writer fails the
/// checks of random services and passes them again about a second later, R
/// writes a second for S seconds (each removes or adds an endpoint, so a
/// ServiceEntry changes), for each R
/// in `MESHBRIDGE_ISTIOD_CHURN_RATES` (default `10,50`) and S in
/// `MESHBRIDGE_ISTIOD_CHURN_SECS` (default 60). Meanwhile a marker service,
/// `web`, moves between two backends (its two instances' checks swap), and
/// each move is timed to the first answer from the new backend through an
/// Envoy on istiod's xDS and through one on meshbridge's own ADS: the lag
/// of Envoy behind the registry under that churn. Also istiod's CPU, and
/// the MCP responses and bytes meshbridge sent, over each churn window.
/// meshbridge's SotW push window is `MESHBRIDGE_ISTIOD_CHURN_WINDOW`
/// (default 500ms, the flag's default; `0s` turns it off).
async fn figure_churn_through_istiod(version: Version) {
    let var = |key: &str, default: &str| std::env::var(key).unwrap_or_else(|_| default.to_owned());
    let services: usize = var("MESHBRIDGE_ISTIOD_FIGURE_SERVICES", "1000").parse().expect("services");
    let rates: Vec<u64> =
        var("MESHBRIDGE_ISTIOD_CHURN_RATES", "10,50").split(',').map(|r| r.trim().parse().expect("rate")).collect();
    let secs: u64 = var("MESHBRIDGE_ISTIOD_CHURN_SECS", "60").parse().expect("seconds");
    let window = var("MESHBRIDGE_ISTIOD_CHURN_WINDOW", "500ms");
    let window = meshbridge::time::parse_duration(&window).expect("window");
    const LAG_DEADLINE: Duration = Duration::from_secs(60);

    let b1 = Backend::start("127.0.0.1", "backend-1").await.unwrap();
    let b2 = Backend::start("127.0.0.1", "backend-2").await.unwrap();
    let consul = Consul::start().await.expect("start consul");
    let started = Instant::now();
    let filler = |i: usize| {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 20000 + (i % 40000) as u16));
        checked(&format!("svc-{i:05}"), &format!("svc-{i:05}"), addr, true)
    };
    let registered: Vec<anyhow::Result<()>> = futures::stream::iter(0..services)
        .map(|i| consul.catalog_register(filler(i)))
        .buffer_unordered(32)
        .collect()
        .await;
    registered.into_iter().collect::<anyhow::Result<()>>().expect("register the services");
    consul.catalog_register(checked("web-1", "web", b1.addr, true)).await.unwrap();
    consul.catalog_register(checked("web-2", "web", b2.addr, false)).await.unwrap();
    println!("registered {services} services in {:?}", started.elapsed());

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mcpbridge.yaml"), config(&consul)).unwrap();
    let xds = meshbridge::xds::XdsLimits { sotw_push_window: window, ..Default::default() };
    let app = App::launch(meshbridge::run::RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: Default::default(),
        gateway: Default::default(),
        lifecycle: Default::default(),
        xds,
        kube: Default::default(),
    })
    .await
    .expect("start meshbridge");
    let Figure { istiod, via_istiod, direct, .. } = &Figure::start(&app, version).await;
    let proc = meshbridge_e2e::bench::procfs::Proc::pid(istiod.pid().unwrap());

    let mut rng = meshbridge_e2e::convergence::Rng::new(1);
    let mut web_on_1 = true;
    for rate in rates {
        // Let the sync and the last round's pushes settle.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (cpu0, bytes0) = (proc.cpu(), mcp_bytes_sent(&app).await);
        let pushes0 = mcp_sum(&app, "meshbridge_xds_pushes_total").await;
        let churn_started = Instant::now();
        // Instances fail and pass again a second later, as in a rolling
        // restart: about `rate / 2` failing at a time (what Consul lists as
        // critical, and the watcher reads per check change, stays small).
        let mut failing = std::collections::VecDeque::new();
        let flips: Vec<(usize, bool)> = (0..rate * secs)
            .map(|_| {
                if failing.len() as u64 >= (rate / 2).max(1) {
                    return (failing.pop_front().expect("failing"), true);
                }
                let i = loop {
                    let i = rng.index(services);
                    if !failing.contains(&i) {
                        break i;
                    }
                };
                failing.push_back(i);
                (i, false)
            })
            .collect();
        // Each write starts on its tick, up to 16 in flight, so a slow
        // answer from Consul does not lower the rate.
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let tick = &tokio::sync::Mutex::new(tick);
        let consul = &consul;
        let writer = async {
            let writes = futures::stream::iter(&flips).map(|(i, pass)| async move {
                tick.lock().await.tick().await;
                consul.catalog_register(check_entry(&format!("svc-{i:05}"), *pass)).await.expect("flip a check");
            });
            writes.buffer_unordered(16).collect::<Vec<()>>().await;
            churn_started.elapsed()
        };
        let marker = async {
            let (mut through, mut straight, mut missed) = (Vec::new(), Vec::new(), 0usize);
            while churn_started.elapsed() < Duration::from_secs(secs) {
                let (to, from, name) =
                    if web_on_1 { ("web-2", "web-1", "backend-2") } else { ("web-1", "web-2", "backend-1") };
                let t0 = Instant::now();
                consul.catalog_register(check_entry(to, true)).await.unwrap();
                consul.catalog_register(check_entry(from, false)).await.unwrap();
                web_on_1 = !web_on_1;
                let (a, b) = tokio::join!(
                    answer_within(via_istiod, name, t0, LAG_DEADLINE),
                    answer_within(direct, name, t0, LAG_DEADLINE)
                );
                match a {
                    Some(a) => through.push(a),
                    None => missed += 1,
                }
                straight.extend(b);
                // The old backend gone before the next move, so that the
                // next move's first answer cannot come from a stale endpoint.
                let mut run = 0;
                while run < 5 && t0.elapsed() < LAG_DEADLINE {
                    run = match via_istiod.get("/").await {
                        Ok((200, body)) if body == name => run + 1,
                        _ => 0,
                    };
                }
            }
            (through, straight, missed)
        };
        let (wrote, (mut through, mut straight, missed)) = tokio::join!(writer, marker);
        let elapsed = churn_started.elapsed().as_secs_f64();
        let cpu = proc.cpu() - cpu0;
        let bytes = mcp_bytes_sent(&app).await - bytes0;
        let pushes = mcp_sum(&app, "meshbridge_xds_pushes_total").await - pushes0;
        through.sort();
        straight.sort();
        assert!(!through.is_empty(), "no move of web reached Envoy through {version}");
        println!(
            "FIGURE istiod_churn istiod={} services={services} window_ms={} rate={rate} wrote_s={:.1} moves={} missed={missed} lag_p50_ms={:.0} lag_p99_ms={:.0} lag_max_ms={:.0} direct_p50_ms={:.0} direct_p99_ms={:.0} istiod_cpu_share={:.2} mcp_responses_per_s={:.1} mcp_mb_per_s={:.2}",
            version.release(),
            window.as_millis(),
            wrote.as_secs_f64(),
            through.len(),
            percentile(&through, 0.5),
            percentile(&through, 0.99),
            percentile(&through, 1.0),
            percentile(&straight, 0.5),
            percentile(&straight, 0.99),
            cpu / elapsed,
            pushes / elapsed,
            bytes / elapsed / 1e6,
        );
    }
}
