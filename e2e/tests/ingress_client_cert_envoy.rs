//! `auth-tls-secret` (client certificates on an Ingress's HTTPS hosts)
//! through a real Envoy, with real TLS clients.
//!
//! Two Ingresses share the gateway and its certificate (`gw-cert`, both
//! hosts): `mtls.example.com` names the CA Secret beside it
//! (`gw-cert-cacert`, Istio's convention, so istiod reads it too);
//! `plain.example.com` asks nothing. On each path:
//! - a client with a certificate that CA signed gets 200 from `mtls`;
//! - without a certificate, or with one another CA signed, the TLS
//!   handshake is refused (a TLS alert, no HTTP answer);
//! - `plain` answers 200 with or without a certificate;
//! - a request over `plain`'s SNI naming `mtls` in its Host gets 404, not
//!   `mtls`'s backend.
//!
//! On the standalone gateway meshbridge builds the HTTPS listener (the CA
//! inline, the certificate by SDS). Through a REAL istiod, on both builds,
//! the Gateway server istiod holds is `MUTUAL`, and the Envoy it feeds
//! (identified over istiod's TLS xDS port, [`Istiod::secure_gateway_envoy`],
//! so that istiod serves the certificate and the CA by SDS) carries the
//! same traffic.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshbridge::run::{App, RunArgs};
use meshbridge::testing::pki::{Issued, TestPki};
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::istiod::{Istiod, Options, Version};
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{mcpbridge, start_https_gateway, static_registry};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const MTLS: &str = "mtls.example.com";
const PLAIN: &str = "plain.example.com";
/// The gateway's namespace: Secrets there are ones stock istiod serves to
/// the gateway.
const GW_NS: &str = "higress-system";
const AUTH_TLS: &str = "nginx.ingress.kubernetes.io/auth-tls-secret";

/// The test PKI: the CA of the gateway's certificate and of the clients'
/// (as one CA often is), a client it signed, and a client another CA
/// signed.
struct Pki {
    ca: TestPki,
    server: Issued,
    client: Issued,
    _other_ca: TestPki,
    stranger: Issued,
}

impl Pki {
    fn new() -> Pki {
        let ca = TestPki::new("meshbridge client-cert ca").unwrap();
        let server = ca.server("gateway", &[MTLS, PLAIN], &[]).unwrap();
        let client = ca.issue("client", &["DNS:client.example.com".into()]).unwrap();
        let other_ca = TestPki::new("meshbridge client-cert other ca").unwrap();
        let stranger = other_ca.issue("stranger", &["DNS:client.example.com".into()]).unwrap();
        Pki { ca, server, client, _other_ca: other_ca, stranger }
    }

    /// The gateway's certificate Secret and the CA Secret beside it.
    fn secrets_yaml(&self) -> String {
        let indent = |p: &Path| -> String {
            std::fs::read_to_string(p).unwrap().lines().map(|l| format!("    {l}\n")).collect()
        };
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{ name: gw-cert, namespace: {GW_NS} }}\ntype: kubernetes.io/tls\n\
             stringData:\n  tls.crt: |\n{}  tls.key: |\n{}---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{ name: gw-cert-cacert, namespace: {GW_NS} }}\n\
             stringData:\n  ca.crt: |\n{}",
            indent(&self.server.cert),
            indent(&self.server.key),
            indent(&self.ca.ca.cert)
        )
    }
}

/// An Ingress `name` in the gateway's namespace routing `host` (over TLS
/// with `gw-cert`) to the static registry service `{name}.static`.
fn ingress(name: &str, day: u32, host: &str, annotations: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: {GW_NS}\n  \
         creationTimestamp: \"2026-01-{day:02}T00:00:00Z\"\n  annotations:\n    \
         higress.io/destination: {name}.static:80\n"
    );
    for (k, v) in annotations {
        yaml.push_str(&format!("    {k}: {v}\n"));
    }
    yaml.push_str(&format!(
        "spec:\n  ingressClassName: higress\n  tls:\n    - {{ hosts: [{host}], secretName: gw-cert }}\n  rules:\n    \
         - host: {host}\n      http:\n        paths:\n          - {{ path: /, pathType: Prefix, backend: {{ resource: \
         {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }} }} }}\n---\n"
    ));
    yaml
}

/// The backends and the config directory: the McpBridge, both Ingresses
/// and the Secrets.
async fn setup(pki: &Pki) -> (tempfile::TempDir, Backend, Backend) {
    let (mtls, plain) =
        (Backend::start("127.0.0.1", "mtls").await.unwrap(), Backend::start("127.0.0.1", "plain").await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[static_registry("mtls", mtls.addr), static_registry("plain", plain.addr)]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    let yaml = [
        ingress("mtls", 1, MTLS, &[(AUTH_TLS, "gw-cert-cacert")]),
        ingress("plain", 2, PLAIN, &[]),
        pki.secrets_yaml(),
    ]
    .concat();
    std::fs::write(dir.path().join("ingresses.yaml"), yaml).unwrap();
    (dir, mtls, plain)
}

/// An HTTP/1.1 client to both hosts at `addr`, trusting the test CA, with
/// `cert` as its client certificate if given.
fn client(pki: &Pki, cert: Option<&Issued>, addr: SocketAddr) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&pki.ca.ca.cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match cert {
        Some(c) => {
            let chain = CertificateDer::pem_file_iter(&c.cert).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&c.key).unwrap()).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    // HTTP/1.1, so that a Host header of the test's choosing is the one sent.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .resolve(MTLS, addr)
        .resolve(PLAIN, addr)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// `GET https://{host}/` (that SNI) with `Host: host_header` if given.
async fn get(
    client: &reqwest::Client,
    host: &str,
    port: u16,
    host_header: Option<&str>,
) -> reqwest::Result<(u16, String)> {
    let mut req = client.get(format!("https://{host}:{port}/"));
    if let Some(h) = host_header {
        req = req.header("host", h);
    }
    let resp = req.send().await?;
    let status = resp.status().as_u16();
    Ok((status, resp.text().await?))
}

/// Poll until `GET https://{host}/` answers 200 with `want`.
async fn wait_for(client: &reqwest::Client, host: &str, port: u16, want: &str, log: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = match get(client, host, port, None).await {
            Ok((200, body)) if body == want => return,
            other => format!("{other:?}"),
        };
        assert!(Instant::now() < deadline, "{host} never answered 200 {want}: {last}\n{}", log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A request the gateway refused in the TLS handshake: no HTTP answer,
/// and the TLS alert `alert` from the gateway (with TLS 1.3 the client
/// learns of it on its first read).
fn assert_refused(result: reqwest::Result<(u16, String)>, what: &str, alert: &str) {
    match result {
        Ok(answer) => panic!("{what}: answered {answer:?}, want the handshake refused"),
        Err(e) => {
            let text = format!("{e:?}");
            assert!(text.contains(&format!("AlertReceived({alert})")), "{what}: want alert {alert}, got: {text}");
        }
    }
}

/// The traffic both paths must carry, on the HTTPS listener at `port`.
async fn check_client_certificates(pki: &Pki, port: u16, log: impl Fn() -> String) {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (with_cert, without, stranger) =
        (client(pki, Some(&pki.client), addr), client(pki, None, addr), client(pki, Some(&pki.stranger), addr));
    // Until the listener and its certificates (by SDS) are there.
    wait_for(&without, PLAIN, port, "plain", &log).await;
    wait_for(&with_cert, MTLS, port, "mtls", &log).await;

    assert_refused(get(&without, MTLS, port, None).await, "mtls without a certificate", "CertificateRequired");
    assert_refused(get(&stranger, MTLS, port, None).await, "mtls with another CA's certificate", "UnknownCA");
    // The host that does not ask is unaffected, whatever the client has.
    for (c, what) in [(&without, "without"), (&with_cert, "with"), (&stranger, "with another CA's")] {
        assert_eq!(get(c, PLAIN, port, None).await.unwrap(), (200, "plain".into()), "plain {what} a certificate");
    }
    // Over plain's SNI, the mtls host is not there to be named.
    let (status, body) = get(&without, PLAIN, port, Some(MTLS)).await.unwrap();
    assert_eq!(status, 404, "SNI {PLAIN}, Host {MTLS}: {body}");
    // Still served to the client that has a certificate.
    assert_eq!(get(&with_cert, MTLS, port, None).await.unwrap(), (200, "mtls".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_on_the_standalone_gateway() {
    let pki = Pki::new();
    let (dir, _mtls, _plain) = setup(&pki).await;
    let (http_port, https_port) = (free_port(), free_port());
    let app = start_https_gateway(dir.path(), http_port, https_port).await.expect("start meshbridge");
    // From loopback: trusted with the certificate's key (docs/src/tls.md).
    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, http_port).await.expect("start envoy");

    // No warning about either Ingress: the CA is where istiod looks too.
    let config: serde_json::Value =
        reqwest::get(format!("http://{}/v1/config", app.admin_addr)).await.unwrap().json().await.unwrap();
    let warnings = config["warnings"].as_array().cloned().unwrap_or_default();
    assert!(!warnings.iter().any(|w| w["object"].as_str().is_some_and(|o| o.starts_with("Ingress "))), "{warnings:#?}");

    check_client_certificates(&pki, https_port, || envoy.log()).await;
    app.stop().await;
}

// Once per istiod build. Needs `source e2e/env.sh envoy kubetools
// kube-apiserver istiod istiod-1.27`.
istiod_tests!(client_certificates_through_istiod);

/// The same Ingresses through istiod: the Secrets in the API server it
/// reads (and the gateway's ServiceAccount allowed to read them there),
/// the Gateway it holds, and the traffic through the Envoy it feeds.
async fn client_certificates_through_istiod(version: Version) {
    let pki = Pki::new();
    let (dir, _mtls, _plain) = setup(&pki).await;
    let app = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    let api = ApiServer::start().await.unwrap();
    let options = Options { version, upstream_envoy: true, stock_gateway_listeners: true, secure_xds: true };
    let istiod = Istiod::start(&api, app.xds_addr, options).await.unwrap();
    api.apply(&pki.secrets_yaml()).await.unwrap();
    istiod.allow_gateway_secrets(&api).await.unwrap();

    // The Gateway as istiod decoded it: mtls's host on a MUTUAL server
    // with the certificate's Secret, plain's on a SIMPLE one.
    let deadline = Instant::now() + Duration::from_secs(30);
    let gateway = loop {
        let configs = istiod.configs().await.unwrap_or_default();
        if let Some(gw) = configs.values().find(|c| c["kind"] == "Gateway") {
            break gw.clone();
        }
        assert!(Instant::now() < deadline, "{version} has no Gateway\n{}", istiod.log_tail(4000));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let servers = gateway["spec"]["servers"].as_array().unwrap();
    let tls_of = |host: &str| {
        let https = servers.iter().filter(|s| s["port"]["protocol"] == "HTTPS");
        https.clone().find(|s| s["hosts"].as_array().unwrap().iter().any(|h| h == host)).map(|s| s["tls"].clone())
    };
    let mtls = tls_of(MTLS).unwrap_or_else(|| panic!("no server for {MTLS}: {gateway:#}"));
    assert_eq!(
        (mtls["mode"].as_str(), mtls["credentialName"].as_str()),
        (Some("MUTUAL"), Some("gw-cert")),
        "{gateway:#}"
    );
    let plain = tls_of(PLAIN).unwrap_or_else(|| panic!("no server for {PLAIN}: {gateway:#}"));
    assert_eq!(plain["mode"], "SIMPLE", "{gateway:#}");

    let envoy = istiod.secure_gateway_envoy(&api).await.expect("the gateway Envoy over istiod's TLS port");
    let https_port = istiod.gateway_https_port.expect("the gateway Service's HTTPS target port");
    let log = || {
        let istiod_log = istiod.log();
        let istiod_warnings: Vec<&str> =
            istiod_log.lines().filter(|l| l.contains("warn") || l.contains("rror")).collect();
        format!("{}\n{}", envoy.log(), istiod_warnings.join("\n"))
    };
    check_client_certificates(&pki, https_port, log).await;

    // The listener istiod built: the mtls chain requires a certificate,
    // its CA by SDS from the Secret beside the certificate.
    let dump = envoy.admin("/config_dump?resource=dynamic_listeners").await.unwrap();
    assert!(dump.contains("\"require_client_certificate\": true"), "{dump}");
    assert!(dump.contains("kubernetes://gw-cert-cacert"), "{dump}");
    app.stop().await;
}
