//! TLS and mTLS on the xDS server, and who gets private keys: only a
//! client with a verified certificate, or one on loopback. The certificates
//! are made at test time by the openssl CLI. The clients that must not be
//! trusted as loopback run inside a network namespace the test makes
//! (`meshbridge_e2e::netns`, root): meshbridge listens on the host's end of
//! its link and they connect from the other end.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{DownstreamTlsContext, Secret, secret};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshbridge::run::{AdminArgs, App, GatewayArgs, RunArgs, RunCommand};
use meshbridge::testing::pki::{self, Dial, Issued, TLS_INGRESS_SECRET, TestPki};
use meshbridge::testing::{DeltaClient, SotwClient};
use meshbridge::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, SECRET_TYPE};
use meshbridge::xds::{XdsLimits, XdsTls, XdsTlsArgs};
use meshbridge_e2e::netns::Netns;
use prost::Message;

const HOST: &str = "shop.example.com";

/// What a Gateway/VirtualService/ServiceEntry look like to Pilot over MCP.
/// (A Secret collection, which meshbridge does not serve, included.)
const MCP_TYPES: [&str; 5] = [
    "networking.istio.io/v1alpha3/Gateway",
    "networking.istio.io/v1alpha3/VirtualService",
    "networking.istio.io/v1alpha3/ServiceEntry",
    "networking.istio.io/v1alpha3/DestinationRule",
    "core/v1/Secret",
];

struct Fixture {
    pki: TestPki,
    /// The Ingress's certificate; its key must reach only trusted clients.
    ingress: Issued,
    server: Issued,
    client: Issued,
    dir: tempfile::TempDir,
}

fn fixture(server_ips: &[IpAddr]) -> Fixture {
    let pki = TestPki::new("meshbridge-test-ca").unwrap();
    let ingress = pki.server("ingress", &[HOST], &[]).unwrap();
    let server = pki.server("xds", &["meshbridge.test"], server_ips).unwrap();
    let client = pki.issue("envoy", &["URI:spiffe://cluster.local/ns/gw/sa/envoy".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
                  metadata: { name: default, namespace: higress-system }\nspec:\n  registries:\n    \
                  - { type: static, name: echo, domain: \"127.0.0.1:10081\", port: 80 }\n";
    std::fs::write(dir.path().join("bridge.yaml"), bridge).unwrap();
    let ingress_yaml = pki::tls_ingress_yaml(HOST, "echo.static:80", &ingress).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), ingress_yaml).unwrap();
    Fixture { pki, ingress, server, client, dir }
}

/// A network namespace for clients that are not loopback, and the address
/// meshbridge listens on for them (the host's end of its link).
fn outside() -> (Netns, IpAddr) {
    let ns = Netns::create().expect("a network namespace for the clients (these tests need root)");
    let ip = IpAddr::V4(ns.host_ip());
    (ns, ip)
}

impl Fixture {
    /// The base64 body of the Ingress key: it must not appear anywhere an
    /// untrusted client can read.
    fn key_marker(&self) -> String {
        let pem = std::fs::read_to_string(&self.ingress.key).unwrap();
        pem.lines().find(|l| !l.starts_with("-----")).unwrap().to_string()
    }

    fn tls_args(&self, mtls: bool) -> XdsTlsArgs {
        XdsTlsArgs {
            xds_tls_cert: Some(self.server.cert.clone()),
            xds_tls_key: Some(self.server.key.clone()),
            xds_client_ca: mtls.then(|| self.pki.ca.cert.clone()),
            ..Default::default()
        }
    }
}

async fn launch(dir: &Path, xds_ip: IpAddr, tls: XdsTlsArgs) -> anyhow::Result<App> {
    let mut args = RunArgs::loopback(dir);
    args.xds_addr = SocketAddr::new(xds_ip, 0);
    App::launch(RunCommand {
        args,
        admin: AdminArgs::default(),
        gateway: GatewayArgs { gateway_http_port: vec![18080], gateway_https_port: 18443, ..Default::default() },
        lifecycle: Default::default(),
        xds: XdsLimits { tls, ..Default::default() },
        kube: Default::default(),
    })
    .await
}

/// Wait until the set holds the Ingress's Secret.
async fn ready(app: &App) {
    let mut rx = app.config.clone();
    tokio::time::timeout(
        Duration::from_secs(15),
        rx.wait_for(|s| s.resources(SECRET_TYPE).is_some_and(|r| r.get(TLS_INGRESS_SECRET).is_some())),
    )
    .await
    .expect("the Ingress Secret in the config set")
    .unwrap();
}

fn decode<M: Message + Default>(any: &envoy_types::pb::google::protobuf::Any) -> M {
    M::decode(any.value.as_slice()).unwrap()
}

/// The HTTPS listener names its certificate by SDS and carries no key.
fn assert_sds_listener(resp: &DiscoveryResponse) {
    let https =
        resp.resources.iter().map(decode::<Listener>).find(|l| l.name == "https.18443").expect("https listener");
    let socket = https.filter_chains[0].transport_socket.as_ref().unwrap();
    let Some(envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(any)) =
        &socket.config_type
    else {
        panic!("no typed config")
    };
    let tls: DownstreamTlsContext = decode(any);
    let common = tls.common_tls_context.unwrap();
    assert!(common.tls_certificates.is_empty(), "inline certificate in LDS");
    let sds = &common.tls_certificate_sds_secret_configs;
    assert_eq!(sds.len(), 1);
    assert_eq!(sds[0].name, TLS_INGRESS_SECRET);
    assert!(sds[0].sds_config.is_some());
}

/// Ask for every type over SotW; return every response and the SDS one.
async fn fetch_all_sotw(client: &mut SotwClient) -> (Vec<DiscoveryResponse>, DiscoveryResponse) {
    let mut all = Vec::new();
    for type_url in [CLUSTER_TYPE, LISTENER_TYPE].into_iter().chain(MCP_TYPES) {
        client.send(SotwClient::request(type_url, &[], "", "")).await;
        all.push(client.recv().await);
    }
    for (type_url, names) in [(ROUTE_TYPE, vec!["https.18443", "http.18080"]), (ENDPOINT_TYPE, vec![])] {
        client.send(SotwClient::request(type_url, &names, "", "")).await;
        all.push(client.recv().await);
    }
    client.send(SotwClient::request(SECRET_TYPE, &[TLS_INGRESS_SECRET, "*"], "", "")).await;
    let sds = client.recv().await;
    assert_eq!(sds.type_url, SECRET_TYPE);
    all.push(sds.clone());
    (all, sds)
}

/// Whether a channel (or its connection) was refused, or no stream opens on it.
async fn refused(channel: anyhow::Result<tonic::transport::Channel>) -> bool {
    match channel {
        Err(_) => true,
        Ok(channel) => SotwClient::on(channel).await.is_err(),
    }
}

fn key_of(resp_secret: &Secret) -> String {
    let Some(secret::Type::TlsCertificate(cert)) = &resp_secret.r#type else { panic!("not a TLS certificate") };
    let Some(envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(key)) =
        &cert.private_key.as_ref().unwrap().specifier
    else {
        panic!("key not inline")
    };
    key.clone()
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn an_unauthenticated_client_gets_listeners_and_no_key() {
    let (ns, ip) = outside();
    let f = fixture(&[ip]);
    let app = launch(f.dir.path(), ip, XdsTlsArgs::default()).await.unwrap();
    ready(&app).await;
    assert!(!app.xds_addr.ip().is_loopback());
    let marker = f.key_marker();

    let mut sotw = SotwClient::on(pki::channel_dialed(ns.dial(app.xds_addr)).await.unwrap()).await.unwrap();
    let (all, sds) = fetch_all_sotw(&mut sotw).await;
    assert_sds_listener(&all[1]);
    assert!(sds.resources.is_empty(), "a Secret went to an unauthenticated client");
    for resp in &all {
        let bytes = resp.encode_to_vec();
        assert!(!contains(&bytes, &marker) && !contains(&bytes, "PRIVATE KEY"), "key material in {}", resp.type_url);
    }
    let gateways = &all[2];
    assert!(!gateways.resources.is_empty(), "the Gateway goes to Pilot all the same");

    // Delta, with SDS by name and by wildcard.
    let mut delta = DeltaClient::on(pki::channel_dialed(ns.dial(app.xds_addr)).await.unwrap()).await.unwrap();
    for type_url in [LISTENER_TYPE, SECRET_TYPE] {
        delta.send(DeltaClient::subscribe(type_url, &[TLS_INGRESS_SECRET, "*"])).await;
        let resp = delta.recv().await;
        let bytes = resp.encode_to_vec();
        assert!(!contains(&bytes, &marker) && !contains(&bytes, "PRIVATE KEY"), "key material in delta {type_url}");
        if type_url == SECRET_TYPE {
            assert!(resp.resources.is_empty() && resp.removed_resources.is_empty());
        } else {
            assert!(resp.resources.iter().any(|r| r.name == "https.18443"));
        }
    }

    // /debug/xdsz says why, per client.
    let xdsz: serde_json::Value =
        reqwest::get(format!("http://{}/debug/xdsz", app.admin_addr)).await.unwrap().json().await.unwrap();
    let clients = xdsz.as_array().or_else(|| xdsz["clients"].as_array()).expect("client list").clone();
    assert_eq!(clients.len(), 2, "{xdsz}");
    for c in &clients {
        assert_eq!(c["auth"], "plaintext", "{c}");
        assert_eq!(c["secretsWithheld"], true, "{c}");
    }
    // Both came from inside the namespace.
    let inside = ns.host().ip.to_string();
    let snap = app.clients.snapshot();
    assert!(snap.iter().all(|c| c.peer.starts_with(&format!("{inside}:"))), "not from {inside}: {snap:?}");
    assert!(!xdsz.to_string().contains(&marker));
    drop((sotw, delta));
    app.stop().await;
}

#[tokio::test]
async fn loopback_clients_get_the_key_over_sds() {
    let f = fixture(&[]);
    let app = launch(f.dir.path(), IpAddr::from([127, 0, 0, 1]), XdsTlsArgs::default()).await.unwrap();
    ready(&app).await;
    let want = std::fs::read_to_string(&f.ingress.key).unwrap();

    let mut sotw = SotwClient::connect(app.xds_addr).await.unwrap();
    let (all, sds) = fetch_all_sotw(&mut sotw).await;
    assert_sds_listener(&all[1]);
    assert_eq!(sds.resources.len(), 1);
    assert_eq!(key_of(&decode(&sds.resources[0])), want);

    let mut delta = DeltaClient::connect(app.xds_addr).await.unwrap();
    delta.send(DeltaClient::subscribe(SECRET_TYPE, &[TLS_INGRESS_SECRET])).await;
    let resp = delta.recv().await;
    assert_eq!(resp.resources.len(), 1);
    assert_eq!(key_of(&decode(resp.resources[0].resource.as_ref().unwrap())), want);
    let snap = app.clients.snapshot();
    assert!(snap.iter().all(|c| c.auth == "loopback" && !c.secrets_withheld), "{snap:?}");
    drop((sotw, delta));
    app.stop().await;
}

#[tokio::test]
async fn mtls_clients_get_the_key_and_others_are_refused() {
    let (ns, ip) = outside();
    let f = fixture(&[ip]);
    let app = launch(f.dir.path(), ip, f.tls_args(true)).await.unwrap();
    ready(&app).await;
    let want = std::fs::read_to_string(&f.ingress.key).unwrap();

    // A verified client certificate: SotW and delta both get the key.
    let config = f.pki.client_config(Some(&f.client)).unwrap();
    let channel = pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await.unwrap();
    let mut sotw = SotwClient::on(channel.clone()).await.unwrap();
    let (all, sds) = fetch_all_sotw(&mut sotw).await;
    assert_sds_listener(&all[1]);
    assert_eq!(sds.resources.len(), 1);
    assert_eq!(key_of(&decode(&sds.resources[0])), want);
    let mut delta = DeltaClient::on(channel).await.unwrap();
    delta.send(DeltaClient::subscribe(SECRET_TYPE, &[TLS_INGRESS_SECRET])).await;
    let resp = delta.recv().await;
    assert_eq!(key_of(&decode(resp.resources[0].resource.as_ref().unwrap())), want);
    let snap = app.clients.snapshot();
    assert_eq!(snap.len(), 2);
    for c in &snap {
        assert_eq!((c.auth, c.secrets_withheld), ("mtls", false), "{c:?}");
        assert_eq!(c.identity.as_deref(), Some("spiffe://cluster.local/ns/gw/sa/envoy"));
    }

    // TLS without a client certificate is refused: no stream opens.
    let config = f.pki.client_config(None).unwrap();
    assert!(
        refused(pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await).await,
        "a client without a certificate opened a stream"
    );
    // Plaintext to a TLS port gets nothing either.
    assert!(
        refused(pki::channel_dialed(ns.dial(app.xds_addr)).await).await,
        "plaintext to the TLS port opened a stream"
    );
    // A certificate from another CA is refused too.
    let other = TestPki::new("other-ca").unwrap();
    let stranger = other.issue("stranger", &["DNS:stranger".into()]).unwrap();
    let mut config = f.pki.client_config(None).unwrap();
    let wrong = other.client_config(Some(&stranger)).unwrap();
    config.client_auth_cert_resolver = wrong.client_auth_cert_resolver.clone();
    assert!(
        refused(pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await).await,
        "a certificate from another CA opened a stream"
    );
    assert_eq!(app.clients.snapshot().len(), 2);
    drop((sotw, delta));
    app.stop().await;
}

#[tokio::test]
async fn server_only_tls_is_not_authentication() {
    let (ns, ip) = outside();
    let f = fixture(&[ip]);
    let app = launch(f.dir.path(), ip, f.tls_args(false)).await.unwrap();
    ready(&app).await;
    let config = f.pki.client_config(None).unwrap();
    let channel = pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await.unwrap();
    let mut sotw = SotwClient::on(channel).await.unwrap();
    let (all, sds) = fetch_all_sotw(&mut sotw).await;
    assert_sds_listener(&all[1]);
    assert!(sds.resources.is_empty());
    let marker = f.key_marker();
    assert!(all.iter().all(|r| !contains(&r.encode_to_vec(), &marker)));
    let snap = app.clients.snapshot();
    assert_eq!((snap[0].auth, snap[0].secrets_withheld), ("tls", true));
    drop(sotw);
    app.stop().await;
}

#[tokio::test]
async fn bad_tls_files_are_startup_errors_naming_flag_and_path() {
    let f = fixture(&[]);
    let missing = f.dir.path().join("nope.pem");
    let garbage = f.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let marker = f.key_marker();
    let cases: Vec<(XdsTlsArgs, &str, &Path)> = vec![
        (XdsTlsArgs { xds_tls_cert: Some(missing.clone()), ..f.tls_args(false) }, "--xds-tls-cert", &missing),
        (XdsTlsArgs { xds_tls_key: Some(missing.clone()), ..f.tls_args(false) }, "--xds-tls-key", &missing),
        (XdsTlsArgs { xds_tls_cert: Some(garbage.clone()), ..f.tls_args(false) }, "--xds-tls-cert", &garbage),
        (XdsTlsArgs { xds_tls_key: Some(garbage.clone()), ..f.tls_args(false) }, "--xds-tls-key", &garbage),
        (XdsTlsArgs { xds_client_ca: Some(garbage.clone()), ..f.tls_args(true) }, "--xds-client-ca", &garbage),
        (XdsTlsArgs { xds_client_ca: Some(missing.clone()), ..f.tls_args(true) }, "--xds-client-ca", &missing),
        // A key that is not the certificate's.
        (XdsTlsArgs { xds_tls_key: Some(f.ingress.key.clone()), ..f.tls_args(false) }, "--xds-tls-key", &f.ingress.key),
    ];
    for (args, flag, path) in cases {
        let err = XdsTls::load(&args).expect_err(flag).to_string();
        assert!(err.contains(flag) && err.contains(&path.display().to_string()), "{err}");
        assert!(!err.contains(&marker), "{err}");
        // The same through the app: nothing starts.
        let err = launch(f.dir.path(), IpAddr::from([127, 0, 0, 1]), args).await.err().expect("startup error");
        assert!(format!("{err:#}").contains(flag), "{err:#}");
    }
    let only_ca = XdsTlsArgs { xds_client_ca: Some(f.pki.ca.cert.clone()), ..Default::default() };
    assert!(XdsTls::load(&only_ca).unwrap_err().to_string().contains("--xds-client-ca needs"));
    let only_cert = XdsTlsArgs { xds_tls_cert: Some(f.server.cert.clone()), ..Default::default() };
    assert!(XdsTls::load(&only_cert).unwrap_err().to_string().contains("--xds-tls-key"));
}

/// The certificate the server at `addr` presents in a handshake.
async fn presented(dial: &Dial, config: rustls::ClientConfig) -> Vec<u8> {
    let tcp = pki::dialed(dial).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("meshbridge.test").unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der(pem: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(pem).unwrap().to_vec()
}

#[tokio::test]
async fn rotated_files_are_picked_up_and_a_bad_rotation_keeps_the_last_good() {
    let (ns, ip) = outside();
    let f = fixture(&[ip]);
    let next = f.pki.server("xds2", &["meshbridge.test"], &[ip]).unwrap();
    // The server reads copies the test rotates, as a mounted Secret is.
    let (cert, key) = (f.dir.path().join("tls.crt"), f.dir.path().join("tls.key"));
    let install = |pair: &Issued| {
        std::fs::copy(&pair.cert, &cert).unwrap();
        std::fs::copy(&pair.key, &key).unwrap();
    };
    install(&f.server);
    let args = XdsTlsArgs {
        xds_tls_cert: Some(cert.clone()),
        xds_tls_key: Some(key.clone()),
        xds_tls_reload_interval: Duration::from_millis(100),
        ..f.tls_args(true)
    };

    // The loader alone: no change, a change, a broken change.
    let tls = XdsTls::load(&args).unwrap().unwrap();
    assert!(!tls.reload().unwrap(), "nothing changed");
    install(&next);
    assert!(tls.reload().unwrap());
    std::fs::copy(&f.server.key, &key).unwrap(); // the key of another certificate
    let err = tls.reload().unwrap_err().to_string();
    assert!(err.contains("--xds-tls-key") && err.contains(&key.display().to_string()), "{err}");
    drop(tls);

    // A serving app: each new handshake presents what the files hold now.
    install(&f.server);
    let app = launch(f.dir.path(), ip, args).await.unwrap();
    let config = || f.pki.client_config(Some(&f.client)).unwrap();
    assert_eq!(presented(&ns.dial(app.xds_addr), config()).await, der(&f.server.cert));
    install(&next);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(presented(&ns.dial(app.xds_addr), config()).await, der(&next.cert), "rotation not picked up");
    // Half a rotation (the new certificate with the old key) does not load:
    // the last good pair stays in force.
    std::fs::copy(&f.server.cert, &cert).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        presented(&ns.dial(app.xds_addr), config()).await,
        der(&next.cert),
        "a broken pair replaced the good one"
    );
    // A stream still opens and is served.
    let channel = pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config()).await.unwrap();
    let mut sotw = SotwClient::on(channel).await.unwrap();
    sotw.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    assert_eq!(sotw.recv().await.type_url, CLUSTER_TYPE);
    drop(sotw);
    app.stop().await;
}

#[tokio::test]
async fn optional_client_certificates_admit_istiod_without_keys() {
    let (ns, ip) = outside();
    let f = fixture(&[ip]);
    let args = XdsTlsArgs { xds_client_cert_optional: true, ..f.tls_args(true) };
    let app = launch(f.dir.path(), ip, args).await.unwrap();
    ready(&app).await;
    let marker = f.key_marker();

    // Like istiod's `xds://` config source (TLS, no client certificate): MCP
    // and listeners, no Secret.
    let config = f.pki.client_config(None).unwrap();
    let channel = pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await.unwrap();
    let mut pilot = SotwClient::on(channel).await.unwrap();
    let (all, sds) = fetch_all_sotw(&mut pilot).await;
    assert!(sds.resources.is_empty());
    assert!(!all[2].resources.is_empty(), "no Gateway over MCP");
    assert!(all.iter().all(|r| !contains(&r.encode_to_vec(), &marker)));

    // An Envoy with its certificate gets the key on the same server.
    let config = f.pki.client_config(Some(&f.client)).unwrap();
    let channel = pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await.unwrap();
    let mut envoy = SotwClient::on(channel).await.unwrap();
    let (_, sds) = fetch_all_sotw(&mut envoy).await;
    assert_eq!(sds.resources.len(), 1);
    let mut auth: Vec<_> = app.clients.snapshot().iter().map(|c| (c.auth, c.secrets_withheld)).collect();
    auth.sort();
    assert_eq!(auth, [("mtls", false), ("tls", true)]);

    // A certificate that does not verify is still refused.
    let other = TestPki::new("other-ca").unwrap();
    let stranger = other.issue("stranger", &["DNS:stranger".into()]).unwrap();
    let mut config = f.pki.client_config(None).unwrap();
    config.client_auth_cert_resolver = other.client_config(Some(&stranger)).unwrap().client_auth_cert_resolver.clone();
    assert!(
        refused(pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await).await,
        "a certificate from another CA opened a stream"
    );
    let only = XdsTlsArgs { xds_client_cert_optional: true, ..f.tls_args(false) };
    assert!(XdsTls::load(&only).unwrap_err().to_string().contains("--xds-client-cert-optional needs"));
    drop((pilot, envoy));
    app.stop().await;
}

#[tokio::test]
async fn stalled_tls_handshakes_are_closed_and_hold_no_one_else() {
    use tokio::io::AsyncReadExt;
    let (ns, ip) = outside();
    let f = fixture(&[ip]);
    let mut args = RunArgs::loopback(f.dir.path());
    args.xds_addr = SocketAddr::new(ip, 0);
    let app = App::launch(RunCommand {
        args,
        admin: AdminArgs::default(),
        gateway: GatewayArgs::default(),
        lifecycle: Default::default(),
        xds: XdsLimits { tls: f.tls_args(true), handshake_timeout: Duration::from_millis(300), ..Default::default() },
        kube: Default::default(),
    })
    .await
    .unwrap();
    // More silent connections than handshakes may run at once.
    let mut silent = Vec::new();
    let dial = ns.dial(app.xds_addr);
    for _ in 0..300 {
        silent.push(pki::dialed(&dial).await.unwrap());
    }
    // A real client is served meanwhile...
    let config = f.pki.client_config(Some(&f.client)).unwrap();
    let channel = pki::tls_channel_dialed(ns.dial(app.xds_addr), "meshbridge.test", config).await.unwrap();
    let mut sotw = SotwClient::on(channel).await.unwrap();
    sotw.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    assert_eq!(sotw.recv().await.type_url, CLUSTER_TYPE);
    // ...and the silent ones are closed once the handshake timeout passes.
    for mut s in silent {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "a stalled handshake stayed open: {read:?}");
    }
    drop(sotw);
    app.stop().await;
}
