//! A real Envoy gets an Ingress's TLS key over SDS, and serves HTTPS with
//! it, when meshbridge trusts it: over mTLS (the deploy/examples bootstrap,
//! to meshbridge on the host's end of a network namespace's link, an address
//! that is not loopback, so loopback trust plays no part), or from loopback. Certificates are made at test time by
//! the openssl CLI.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use meshbridge::run::{AdminArgs, App, GatewayArgs, RunArgs, RunCommand};
use meshbridge::testing::pki::{self, Issued, TestPki};
use meshbridge::xds::{XdsLimits, XdsTlsArgs};
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::netns::Netns;

const HOST: &str = "shop.example.com";
/// The name meshbridge's serving certificate carries (the bootstrap's `sni`).
const XDS_NAME: &str = "meshbridge.test";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn replace(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not found in:\n{text}");
    text.replace(from, to)
}

struct Setup {
    pki: TestPki,
    backend: Backend,
    dir: tempfile::TempDir,
    http_port: u16,
    https_port: u16,
}

/// A CA, the Ingress (TLS for HOST, routed to a static-registry backend)
/// in a config dir, and free gateway ports.
async fn setup() -> Setup {
    let pki = TestPki::new("meshbridge-e2e-ca").unwrap();
    let ingress = pki.server("ingress", &[HOST], &[]).unwrap();
    let backend = Backend::start("127.0.0.1", "shop").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n    \
         - {{ type: static, name: shop, domain: \"{}\", port: 80 }}\n",
        backend.addr
    );
    std::fs::write(dir.path().join("bridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), pki::tls_ingress_yaml(HOST, "shop.static:80", &ingress).unwrap())
        .unwrap();
    Setup { pki, backend, dir, http_port: free_port(), https_port: free_port() }
}

async fn launch(s: &Setup, xds: SocketAddr, tls: XdsTlsArgs) -> App {
    let mut args = RunArgs::loopback(s.dir.path());
    args.xds_addr = xds;
    App::launch(RunCommand {
        args,
        admin: AdminArgs::default(),
        gateway: GatewayArgs {
            gateway_http_port: vec![s.http_port],
            gateway_https_port: s.https_port,
            ..Default::default()
        },
        lifecycle: Default::default(),
        xds: XdsLimits { tls, ..Default::default() },
        kube: Default::default(),
    })
    .await
    .expect("start meshbridge")
}

/// A client for `https://HOST:{https_port}/` via Envoy, trusting the test CA only.
fn https_client(s: &Setup) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&s.pki.ca.cert).unwrap()).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(ca)
        .tls_built_in_root_certs(false)
        .resolve(HOST, SocketAddr::from(([127, 0, 0, 1], s.https_port)))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// `GET https://HOST/` through Envoy's HTTPS listener (SNI HOST, the
/// certificate checked against the test CA) until it answers 200.
async fn wait_for_https(s: &Setup, envoy: &Envoy) -> String {
    let client = https_client(s);
    let url = format!("https://{HOST}:{}/", s.https_port);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = match client.get(&url).send().await {
            Ok(resp) if resp.status() == 200 => return resp.text().await.unwrap(),
            Ok(resp) => format!("status {}", resp.status()),
            Err(e) => format!("{e:?}"),
        };
        assert!(Instant::now() < deadline, "HTTPS never served: {last}\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// deploy/examples/envoy-bootstrap-mtls.yaml as written, but for the
/// addresses, the certificate files and meshbridge's name.
async fn envoy_over_mtls(s: &Setup, xds: SocketAddr, client: &Issued) -> Envoy {
    let text = std::fs::read_to_string(repo().join("deploy/examples/envoy-bootstrap-mtls.yaml")).unwrap();
    let text = replace(
        &text,
        "socket_address: { address: meshbridge.meshbridge-system.svc, port_value: 15051 }",
        &format!("socket_address: {{ address: {}, port_value: {} }}", xds.ip(), xds.port()),
    );
    let text = replace(&text, "port_value: 9901", "port_value: 0");
    let text = replace(&text, "meshbridge.meshbridge-system.svc", XDS_NAME);
    let text = replace(&text, "/etc/envoy/xds/tls.crt", &client.cert.display().to_string());
    let text = replace(&text, "/etc/envoy/xds/tls.key", &client.key.display().to_string());
    let text = replace(&text, "/etc/envoy/xds/ca.crt", &s.pki.ca.cert.display().to_string());
    Envoy::start_bootstrap(&text, 0, s.http_port).await.expect("start envoy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_envoy_gets_its_key_over_sds_and_serves_https() {
    // An address that is not loopback and on no real interface: the host's
    // end of a namespace's link. Envoy (on the host) connects to it.
    let ns = Netns::create().expect("a network namespace (this test needs root)");
    let ip = IpAddr::V4(ns.host_ip());
    let s = setup().await;
    let server = s.pki.server("xds", &[XDS_NAME], &[ip]).unwrap();
    let client = s.pki.issue("envoy", &["URI:spiffe://cluster.local/ns/gateway/sa/envoy".into()]).unwrap();
    let tls = XdsTlsArgs {
        xds_tls_cert: Some(server.cert.clone()),
        xds_tls_key: Some(server.key.clone()),
        xds_client_ca: Some(s.pki.ca.cert.clone()),
        ..Default::default()
    };
    let app = launch(&s, SocketAddr::new(ip, 0), tls).await;
    let envoy = envoy_over_mtls(&s, app.xds_addr, &client).await;
    assert_eq!(wait_for_https(&s, &envoy).await, s.backend.name);

    let snap = app.clients.snapshot();
    assert_eq!(snap.len(), 1, "{snap:?}");
    assert_eq!((snap[0].auth, snap[0].secrets_withheld), ("mtls", false));
    assert_eq!(snap[0].identity.as_deref(), Some("spiffe://cluster.local/ns/gateway/sa/envoy"));
    // The listener Envoy holds names the certificate; the key came by SDS.
    let dump = envoy.admin("/config_dump").await.unwrap();
    assert!(dump.contains("tls_certificate_sds_secret_configs"), "listener without SDS");
    assert!(dump.contains("\"name\": \"shop/shop-cert\""), "no SDS secret shop/shop-cert in the config dump");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_envoy_gets_its_key_over_sds_and_serves_https() {
    let s = setup().await;
    let app = launch(&s, SocketAddr::from(([127, 0, 0, 1], 0)), XdsTlsArgs::default()).await;
    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Delta, s.http_port).await.expect("start envoy");
    assert_eq!(wait_for_https(&s, &envoy).await, s.backend.name);
    let snap = app.clients.snapshot();
    assert_eq!((snap[0].auth, snap[0].secrets_withheld), ("loopback", false));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_envoy_from_elsewhere_gets_the_listener_but_no_key() {
    // An address that is not loopback and on no real interface: the host's
    // end of a namespace's link. Envoy (on the host) connects to it.
    let ns = Netns::create().expect("a network namespace (this test needs root)");
    let ip = IpAddr::V4(ns.host_ip());
    let s = setup().await;
    let app = launch(&s, SocketAddr::new(ip, 0), XdsTlsArgs::default()).await;
    // deploy/examples/envoy-bootstrap.yaml, pointed at that address.
    let text = std::fs::read_to_string(repo().join("deploy/examples/envoy-bootstrap.yaml")).unwrap();
    let text = replace(
        &text,
        "socket_address: { address: 127.0.0.1, port_value: 15051 }",
        &format!("socket_address: {{ address: {ip}, port_value: {} }}", app.xds_addr.port()),
    );
    let text = replace(&text, "port_value: 9901", "port_value: 0");
    // Ready once the HTTPS listener gives up waiting for its Secret (SDS
    // initial fetch timeout, 15 s).
    let envoy = Envoy::start_bootstrap(&text, 0, s.http_port).await.expect("start envoy");
    let snap = app.clients.snapshot();
    assert_eq!((snap[0].auth, snap[0].secrets_withheld), ("plaintext", true), "{snap:?}");
    let listeners = envoy.admin("/listeners").await.unwrap();
    assert!(listeners.contains(&format!("https.{}", s.https_port)), "no HTTPS listener: {listeners}");
    let got = https_client(&s).get(format!("https://{HOST}:{}/", s.https_port)).send().await;
    assert!(got.is_err(), "HTTPS served without the key: {got:?}");
    let xdsz: serde_json::Value =
        reqwest::get(format!("http://{}/debug/xdsz", app.admin_addr)).await.unwrap().json().await.unwrap();
    assert!(xdsz.to_string().contains("\"secretsWithheld\":true"), "{xdsz}");
    app.stop().await;
}
