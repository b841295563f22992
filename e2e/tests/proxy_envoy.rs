//! McpBridge `proxies`, end to end: a `dns` registry with `protocol: https`
//! and `proxyName` is reached from a gateway Envoy through a real HTTP
//! CONNECT proxy (Debian's tinyproxy) to a local TLS backend, which sees
//! the SNI, and goes direct again once `proxyName` is removed from the
//! config file. The Envoy is the standalone gateway, and then a stock Envoy
//! fed only by a REAL istiod, which applies meshbridge's EnvoyFilters (the
//! tunnel listener, the service's endpoints moved to it) and its
//! DestinationRule (TLS with the SNI) itself; the same checks run on both.
//!
//! The tunnel listener CONNECTs to `{SNI}:443`, as Higress's does, so the
//! proxy must resolve the SNI and find the backend on port 443. Without
//! touching /etc/hosts the one name that works is `localhost`: the registry's
//! domain is `localhost` (the dns watcher resolves it from the hosts file;
//! meshbridge has no way to point it at the fake DNS server from config),
//! which also makes it the SNI, and the backend listens on 127.0.0.1:443 and
//! [::1]:443 (we run as root). The two tests bind 443 one after the other
//! ([`PORT_443`]).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshbridge::cache::{CachedService, RegistryKey, View};
use meshbridge::config::ProxySpec;
use meshbridge::translate::{self, Inputs};
use meshbridge_e2e::envoy::Envoy;
use meshbridge_e2e::free_port;
use meshbridge_e2e::gateway::{Gateway, Via};
use meshbridge_e2e::istiod::Version;
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::process::binary_from_env;
use meshbridge_e2e::tinyproxy::Tinyproxy;
use meshbridge_e2e::tls_backend::TlsBackend;
use meshbridge_registries::{Endpoint, Protocol, RegistryKind, Service, ServicePort, Tls};
use serde_json::{Value, json};

const HOST: &str = "partner.example.com";
const CLUSTER: &str = "outbound|443||partner.dns";

fn config(proxy_port: u16, listener_port: u16, proxied: bool) -> String {
    let proxy_name = if proxied { "      proxyName: corp\n" } else { "" };
    format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: dns
      name: partner
      domain: localhost
      port: 443
      protocol: https
{proxy_name}  proxies:
    - type: http
      name: corp
      serverAddress: 127.0.0.1
      serverPort: {proxy_port}
      listenerPort: {listener_port}
      connectTimeout: 2000
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: partner
  namespace: shop
  annotations:
    higress.io/destination: partner.dns:443
spec:
  ingressClassName: higress
  rules:
    - host: {HOST}
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              resource: {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }}
"#
    )
}

/// Poll `GET /` for HOST until it answers 200 with `want`.
async fn wait_for_answer(envoy: &Envoy, want: &str, what: &str, extra: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match envoy.get_host("/", HOST).await {
            Ok((200, body)) if body == want => return,
            other => {
                assert!(Instant::now() < deadline, "{what}: last answer {other:?}\n{}\n{}", envoy.log(), extra());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Envoy's endpoints of CLUSTER, from `/clusters` (`ip:port` each).
async fn endpoints(envoy: &Envoy) -> Vec<String> {
    let clusters = envoy.admin("/clusters").await.unwrap_or_default();
    let mut eps: Vec<String> = clusters
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{CLUSTER}::"))?.split_once("::cx_active").map(|(a, _)| a.to_string()))
        .collect();
    eps.sort();
    eps.dedup();
    eps
}

async fn wait_for_endpoints(envoy: &Envoy, what: &str, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let eps = endpoints(envoy).await;
        if pred(&eps) {
            return eps;
        }
        assert!(Instant::now() < deadline, "{what}: endpoints of {CLUSTER}: {eps:?}\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Held while a test binds port 443.
static PORT_443: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_service_goes_through_the_connect_proxy_and_back_to_direct() {
    through_the_connect_proxy(Via::Standalone).await;
}

// Once per istiod build. Needs `source e2e/env.sh envoy tinyproxy
// kubetools kube-apiserver istiod istiod-1.27`.
istiod_tests!(https_service_goes_through_the_connect_proxy_through_istiod);

async fn https_service_goes_through_the_connect_proxy_through_istiod(version: Version) {
    through_the_connect_proxy(Via::Istiod(version)).await;
}

async fn through_the_connect_proxy(via: Via) {
    let _port_443 = PORT_443.lock().await;
    let mut addrs: Vec<SocketAddr> = vec!["127.0.0.1:443".parse().unwrap()];
    // localhost may also resolve to ::1; serve there too when the host has it.
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        addrs.push("[::1]:443".parse().unwrap());
    }
    let backend = TlsBackend::start(&addrs, "localhost", "partner").await.expect("TLS backend on port 443 (root)");
    let proxy = Tinyproxy::start(443).await.expect("start tinyproxy");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bridge.yaml");
    let listener_port = free_port();
    std::fs::write(&file, config(proxy.port, listener_port, true)).unwrap();
    let gw = Gateway::start(dir.path(), via).await.expect("start meshbridge and the gateway");
    let (app, envoy) = (&gw.app, &gw.envoy);

    // Pilot's side of the same set: the two EnvoyFilters.
    let mut rx = app.config.clone();
    let set = tokio::time::timeout(
        Duration::from_secs(15),
        rx.wait_for(|s| {
            s.mcp.contains_key("networking.istio.io/EnvoyFilter")
                && s.objects("ServiceEntry").count() == 1
                && s.mcp["networking.istio.io/EnvoyFilter"].len() == 2
        }),
    )
    .await
    .expect("EnvoyFilters for the proxy and the proxied service")
    .unwrap()
    .clone();
    assert!(set.warnings().all(|w| !w.to_string().contains("proxy")), "{:?}", set.warnings().collect::<Vec<_>>());

    let tunnel = format!("127.0.0.1:{listener_port}");
    wait_for_endpoints(envoy, "the tunnel listener as the only endpoint", |eps| eps == [tunnel.clone()]).await;
    wait_for_answer(envoy, "partner", "through the proxy", || format!("{}\n{}", proxy.log(), gw.istiod_log())).await;

    let connects = proxy.connects();
    assert!(!connects.is_empty() && connects.iter().all(|c| c == "localhost:443"), "{connects:?}\n{}", proxy.log());
    let names = backend.server_names();
    assert!(!names.is_empty() && names.iter().all(|n| n.as_deref() == Some("localhost")), "SNI seen: {names:?}");
    let stats = envoy.admin("/stats?filter=tcpproxy.corp").await.unwrap();
    assert!(stats.contains("tcpproxy.corp.downstream_cx_total"), "{stats}");

    // Remove proxyName: the watcher restarts on the changed spec, the
    // endpoints go back to the backend itself, and nothing restarts.
    std::fs::write(&file, config(proxy.port, listener_port, false)).unwrap();
    let direct = wait_for_endpoints(envoy, "the backend's own addresses", |eps| {
        !eps.is_empty() && eps.iter().all(|e| e.ends_with(":443"))
    })
    .await;
    assert!(direct.contains(&"127.0.0.1:443".to_string()), "{direct:?}");
    if matches!(via, Via::Istiod(_)) {
        // Direct, istiod makes the TLS of the DestinationRule (mode SIMPLE,
        // the SNI, no CA) itself, and since Istio 1.20 that verifies the
        // backend's certificate against the gateway's system roots, which
        // its Envoy gets over SDS (`file-root:system`) from the Istio agent
        // beside it. A stock Envoy has no agent, and this backend's CA is
        // the test's own: the config is checked, not traffic.
        let dump = envoy.admin("/config_dump?resource=dynamic_active_clusters").await.unwrap();
        let at = dump.find(&format!("\"name\": \"{CLUSTER}\"")).unwrap_or_else(|| panic!("no {CLUSTER}: {dump:.3000}"));
        let cluster = dump[at..].split("\"version_info\"").next().unwrap();
        assert!(cluster.contains("\"sni\": \"localhost\""), "{cluster}");
        assert!(cluster.contains("file-root:system"), "{cluster}");
        gw.app.stop().await;
        return;
    }
    let (before_connects, before_tls) = (proxy.connects().len(), backend.server_names().len());
    for _ in 0..5 {
        let (status, body) = envoy.get_host("/", HOST).await.unwrap();
        assert_eq!((status, body.as_str()), (200, "partner"), "{}", envoy.log());
    }
    // New connections reach the backend, none of them through the proxy.
    // (Envoy may reuse a direct connection, so at least one new one.)
    assert!(backend.server_names().len() > before_tls, "no direct TLS connection: {:?}", backend.server_names());
    assert_eq!(proxy.connects().len(), before_connects, "still proxied:\n{}", proxy.log());
    // The proxy itself stays configured, as in Higress: it does not depend on use.
    let listeners = envoy.admin("/listeners").await.unwrap();
    assert!(listeners.contains("istio-autogenerated-proxy-listener-corp"), "{listeners}");
    gw.app.stop().await;
}

/// A proxied `dns` service and its proxy, translated as the publisher would.
fn proxied_set() -> translate::ConfigSet {
    let key = RegistryKey::new(RegistryKind::Dns, "partner");
    let svc = Service::new(
        "partner.dns",
        vec![ServicePort { number: 443, protocol: Protocol::Https, name: "https-443".into() }],
        vec![Endpoint { address: "203.0.113.7".into(), port: 443, weight: 1, labels: Default::default() }],
    )
    .with_tls(Tls { sni: Some("api.partner.example".into()) });
    let view = View {
        revision: 1,
        services: [(svc.host.clone(), CachedService { registry: key.clone(), service: Arc::new(svc) })].into(),
        also: Default::default(),
    };
    let proxies = [ProxySpec {
        name: "corp".into(),
        server_address: "proxy.corp.example".into(),
        server_port: 3128,
        listener_port: None,
        connect_timeout: Some(Duration::from_millis(1500)),
    }];
    let inputs = Inputs { proxies: &proxies, registry_proxies: [(key, "corp".into())].into(), ..Inputs::default() };
    translate::build(&view, &inputs)
}

/// Every `patch.value` of every EnvoyFilter, by what it applies to.
fn patch_values(set: &translate::ConfigSet) -> (Vec<Value>, Vec<Value>) {
    let (mut clusters, mut listeners) = (Vec::new(), Vec::new());
    for f in set.objects("EnvoyFilter") {
        for patch in f.spec.to_json()["configPatches"].as_array().unwrap() {
            let Some(value) = patch["patch"].get("value") else { continue };
            match patch["applyTo"].as_str() {
                Some("CLUSTER") => clusters.push(value.clone()),
                Some("LISTENER") => listeners.push(value.clone()),
                other => panic!("unexpected applyTo {other:?}"),
            }
        }
    }
    (clusters, listeners)
}

/// Pilot hands the patch values to Envoy as they are; no Pilot runs here,
/// so the real Envoy checks them: as static resources of a bootstrap, in
/// `--mode validate`.
#[tokio::test]
async fn envoy_filter_patch_values_are_valid_envoy_config() {
    let set = proxied_set();
    let (clusters, listeners) = patch_values(&set);
    assert_eq!((clusters.len(), listeners.len()), (2, 1), "proxy cluster + service cluster, tunnel listener");
    let bootstrap = json!({ "static_resources": { "clusters": clusters, "listeners": listeners } });
    let dir = tempfile::tempdir().unwrap();
    let (ok, out) = validate(dir.path(), &bootstrap);
    assert!(ok, "envoy rejected the EnvoyFilter values:\n{out}\n{bootstrap:#}");

    // And it does reject what is wrong, so the check means something.
    let mut broken = bootstrap.clone();
    broken["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["tunneling_config"]
        ["hostnme"] = json!("x");
    let (ok, out) = validate(dir.path(), &broken);
    assert!(!ok, "a misspelt field passed validation:\n{out}");
}

fn validate(dir: &Path, bootstrap: &Value) -> (bool, String) {
    let bin = binary_from_env("MESHBRIDGE_ENVOY_BIN").expect("envoy installed");
    let path = dir.join("bootstrap.json");
    std::fs::write(&path, serde_json::to_vec_pretty(bootstrap).unwrap()).unwrap();
    let out = Command::new(bin)
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(&path)
        .args(["--disable-hot-restart", "-l", "warn"])
        .output()
        .expect("run envoy --mode validate");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}
