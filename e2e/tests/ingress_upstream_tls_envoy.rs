//! `proxy-ssl-*` (upstream TLS with a client certificate) through a real
//! Envoy, to a TLS backend that REQUIRES a client certificate signed by the
//! test CA and records the SNI and certificate of every handshake.
//!
//! On the standalone gateway (traffic), each Ingress routes one path to a
//! static registry service on that backend:
//! - `/mtls`: `backend-protocol: HTTPS`, `proxy-ssl-secret` (the
//!   `kubernetes.io/tls` Secret with the client certificate and the CA),
//!   `proxy-ssl-verify: on`, `proxy-ssl-name` with
//!   `proxy-ssl-server-name: on`: 200, and the backend saw that certificate
//!   and that SNI;
//! - `/nocert`: `backend-protocol: HTTPS` alone: the backend refuses the
//!   handshake, 503;
//! - `/wrongca`: a Secret whose `ca.crt` did not sign the backend, verify
//!   on: Envoy refuses the backend, 503; `/unverified`, the same Secret
//!   with verify off: 200;
//! - a malformed `proxy-ssl-secret`: a warning naming the Ingress and the
//!   annotation.
//!
//! Through a REAL istiod, on both builds: the DestinationRule istiod
//! holds, the cluster it builds for the gateway Envoy (the certificate and
//! CA by SDS, the SNI), and the same request answered 200 with the
//! backend seeing the certificate and the SNI. istiod serves a
//! `credentialName` Secret over SDS only to a proxy it has identified, so
//! this Envoy connects to istiod's TLS xDS port with a client certificate
//! of the gateway's SPIFFE identity (what the Istio agent does in a
//! cluster; [`Istiod::secure_gateway_envoy`]), the Secret is in the API
//! server istiod reads, and the gateway's ServiceAccount may list Secrets
//! there (istiod asks with a SubjectAccessReview).

use std::path::Path;
use std::time::{Duration, Instant};

use meshbridge::run::{App, RunArgs};
use meshbridge::testing::pki::{Issued, TestPki};
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::gateway::{Gateway, Via};
use meshbridge_e2e::istiod::{Istiod, Options, Version};
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::tls_backend::TlsBackend;
use meshbridge_e2e::traffic::{config_warning, mcp_ingress, mcpbridge, static_registry};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const HOST: &str = "shop.example.com";
/// The name the backend's certificate is for, sent as the SNI.
const SNI: &str = "backend.internal";
/// The gateway's namespace: a Secret there is one stock istiod reads.
const GW_NS: &str = "higress-system";

/// A `kubernetes.io/tls` Secret of `cert` with `ca.crt` = `ca`.
fn secret_yaml(name: &str, cert: &Issued, ca: &Path) -> String {
    let indent =
        |p: &Path| -> String { std::fs::read_to_string(p).unwrap().lines().map(|l| format!("    {l}\n")).collect() };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{ name: {name}, namespace: {GW_NS} }}\ntype: kubernetes.io/tls\n\
         stringData:\n  tls.crt: |\n{}  tls.key: |\n{}  ca.crt: |\n{}",
        indent(&cert.cert),
        indent(&cert.key),
        indent(ca)
    )
}

/// The backend's server config: its certificate for [`SNI`] from `ca`, and
/// a client certificate `ca` signed required.
fn mutual_server_config(ca: &TestPki) -> std::sync::Arc<rustls::ServerConfig> {
    let server = ca.server("backend", &[SNI], &[]).unwrap();
    let certs = CertificateDer::pem_file_iter(&server.cert).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&ca.ca.cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone()).build().unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    std::sync::Arc::new(config)
}

fn der(cert: &Issued) -> Vec<u8> {
    CertificateDer::from_pem_file(&cert.cert).unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_ssl_presents_the_client_certificate_to_the_backend() {
    let ca = TestPki::new("meshbridge upstream ca").unwrap();
    let wrong_ca = TestPki::new("meshbridge upstream wrong-ca").unwrap();
    let client = ca.issue("gateway-client", &["DNS:gateway.client".into()]).unwrap();
    let backend =
        TlsBackend::start_with(&["127.0.0.1:0".parse().unwrap()], mutual_server_config(&ca), "secure").await.unwrap();
    let addr = backend.addrs[0];

    let dir = tempfile::tempdir().unwrap();
    let names = ["mtls", "nocert", "wrongca", "unverified", "bad"];
    let bridge = mcpbridge(&names.map(|n| static_registry(n, addr)));
    let nginx = |k: &str| format!("nginx.ingress.kubernetes.io/{k}");
    let (proto, secret, verify) = (nginx("backend-protocol"), nginx("proxy-ssl-secret"), nginx("proxy-ssl-verify"));
    let (ssl_name, server_name) = (nginx("proxy-ssl-name"), nginx("proxy-ssl-server-name"));
    let good = format!("{GW_NS}/upstream-client");
    let wrong = format!("{GW_NS}/upstream-wrong-ca");
    let ingress = |name: &str, day: u32, annotations: &[(&str, &str)]| {
        mcp_ingress(name, day, HOST, &format!("{name}.static:80"), annotations, &[&format!("/{name}")])
    };
    let yaml = [
        ingress(
            "mtls",
            1,
            &[(&proto, "HTTPS"), (&secret, &good), (&verify, "on"), (&ssl_name, SNI), (&server_name, "on")],
        ),
        ingress("nocert", 2, &[(&proto, "HTTPS")]),
        ingress("wrongca", 3, &[(&proto, "HTTPS"), (&secret, &wrong), (&verify, "on")]),
        ingress("unverified", 4, &[(&proto, "HTTPS"), (&secret, &wrong)]),
        ingress("bad", 5, &[(&proto, "HTTPS"), (&secret, "a/b/c")]),
        secret_yaml("upstream-client", &client, &ca.ca.cert),
        secret_yaml("upstream-wrong-ca", &client, &wrong_ca.ca.cert),
    ]
    .join("---\n");
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), yaml).unwrap();
    let gw = Gateway::start(dir.path(), Via::Standalone).await.expect("start meshbridge and the gateway");
    let (app, envoy) = (&gw.app, &gw.envoy);

    let bad = config_warning(app.admin_addr, "Ingress shop/bad").await;
    assert_eq!(bad["reason"], "invalid_ingress", "{bad}");
    let detail = bad["detail"].as_str().unwrap();
    assert!(detail.starts_with("annotation nginx.ingress.kubernetes.io/proxy-ssl-secret: \"a/b/c\""), "{detail}");

    // Until the routes and the certificate (by SDS) are there.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if envoy.get_host("/mtls", HOST).await.is_ok_and(|(status, _)| status == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "/mtls never answered 200:\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = envoy.get_host("/mtls/x", HOST).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "secure"));
    let seen = backend.handshakes();
    assert!(!seen.is_empty());
    for h in &seen {
        assert_eq!(h.server_name.as_deref(), Some(SNI), "the SNI of proxy-ssl-name: {seen:?}");
        assert_eq!(h.client_cert.as_deref(), Some(der(&client).as_slice()), "the Secret's certificate");
    }

    // Without a client certificate the backend refuses the handshake; with
    // a CA that did not sign the backend, Envoy refuses the backend.
    let before = backend.handshakes().len();
    for path in ["/nocert", "/wrongca", "/bad"] {
        let (status, _) = envoy.get_host(path, HOST).await.unwrap();
        assert_eq!(status, 503, "{path}");
    }
    assert_eq!(backend.handshakes().len(), before, "no handshake completed without a verified pair");
    // The same Secret, not verifying: the certificate goes, the answer comes.
    let (status, body) = envoy.get_host("/unverified", HOST).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "secure"));
    let last = backend.handshakes().pop().unwrap();
    assert_eq!(last.client_cert.as_deref(), Some(der(&client).as_slice()));
    assert_eq!(last.server_name, None, "no proxy-ssl-server-name, no SNI");

    // The key never shows on the debug endpoints.
    let key = std::fs::read_to_string(&client.key).unwrap();
    let key_line = key.lines().nth(1).unwrap();
    for path in ["/v1/config", "/debug/configz"] {
        let body = reqwest::get(format!("http://{}{path}", app.admin_addr)).await.unwrap().text().await.unwrap();
        assert!(!body.contains(key_line), "{path} shows the key");
    }
    gw.app.stop().await;
}

// Once per istiod build. Needs `source e2e/env.sh envoy kubetools
// kube-apiserver istiod istiod-1.27`.
istiod_tests!(proxy_ssl_through_istiod);

/// What istiod makes of `proxy-ssl-*`, and the traffic: the DestinationRule
/// it holds, the gateway cluster it builds, and a request through an Envoy
/// that istiod identifies (its TLS xDS port, as the Istio agent connects)
/// and so serves the Secret by SDS. The mutual-TLS Ingress is added once the
/// gateway Envoy runs, so that its listener does not wait on the Secret.
async fn proxy_ssl_through_istiod(version: Version) {
    let ca = TestPki::new("meshbridge upstream ca").unwrap();
    let client = ca.issue("gateway-client", &["DNS:gateway.client".into()]).unwrap();
    let backend =
        TlsBackend::start_with(&["127.0.0.1:0".parse().unwrap()], mutual_server_config(&ca), "secure").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let registries = [static_registry("mtls", backend.addrs[0]), static_registry("plain", backend.addrs[0])];
    std::fs::write(dir.path().join("mcpbridge.yaml"), mcpbridge(&registries)).unwrap();
    // A route first, so that the gateway has a listener.
    let plain = mcp_ingress("plain", 1, HOST, "plain.static:80", &[], &["/plain"]);
    std::fs::write(dir.path().join("plain.yaml"), plain).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    let api = ApiServer::start().await.unwrap();
    let options = Options { version, upstream_envoy: true, stock_gateway_listeners: true, secure_xds: true };
    let istiod = Istiod::start(&api, app.xds_addr, options).await.unwrap();
    // The Secret where istiod reads it, and the gateway's ServiceAccount
    // allowed to (istiod asks the API server with a SubjectAccessReview).
    api.apply(&secret_yaml("upstream-client", &client, &ca.ca.cert)).await.unwrap();
    istiod.allow_gateway_secrets(&api).await.unwrap();
    let envoy = istiod.secure_gateway_envoy(&api).await.expect("the gateway Envoy over istiod's TLS port");

    let nginx = |k: &str| format!("nginx.ingress.kubernetes.io/{k}");
    let annotations = [
        (nginx("backend-protocol"), "HTTPS".to_owned()),
        (nginx("proxy-ssl-secret"), format!("{GW_NS}/upstream-client")),
        (nginx("proxy-ssl-verify"), "on".to_owned()),
        (nginx("proxy-ssl-name"), SNI.to_owned()),
        (nginx("proxy-ssl-server-name"), "on".to_owned()),
    ];
    let annotations: Vec<(&str, &str)> = annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let yaml = mcp_ingress("mtls", 2, HOST, "mtls.static:80", &annotations, &["/mtls"]);
    std::fs::write(dir.path().join("shop.yaml"), yaml).unwrap();

    // The DestinationRule as istiod decoded it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let rule = loop {
        let configs = istiod.configs().await.unwrap_or_default();
        if let Some(dr) =
            configs.values().find(|c| c["kind"] == "DestinationRule" && c["spec"]["host"] == "mtls.static")
        {
            break dr.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{version} has no DestinationRule for mtls.static\n{}",
            istiod.log_tail(4000)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let tls = &rule["spec"]["trafficPolicy"]["tls"];
    assert_eq!(tls["mode"], "MUTUAL", "{rule:#}");
    assert_eq!(tls["credentialName"], "upstream-client", "{rule:#}");
    assert_eq!(tls["sni"], SNI, "{rule:#}");
    assert!(tls.get("insecureSkipVerify").is_none_or(|v| v == false), "verify on: {rule:#}");

    // Traffic: the backend sees the Secret's certificate and the SNI.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if envoy.get_host("/mtls", HOST).await.is_ok_and(|(status, _)| status == 200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{version}: /mtls never answered 200\n{}\n{}",
            envoy.log(),
            istiod.log().lines().filter(|l| l.contains("warn") || l.contains("rror")).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen = backend.handshakes();
    assert!(!seen.is_empty());
    for h in &seen {
        assert_eq!(h.server_name.as_deref(), Some(SNI), "{seen:?}");
        assert_eq!(h.client_cert.as_deref(), Some(der(&client).as_slice()));
    }

    // The cluster istiod built: the certificate and its CA by SDS, the SNI.
    let dump = envoy.admin("/config_dump?resource=dynamic_active_clusters").await.unwrap();
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let cluster = dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cluster"].clone())
        .find(|c| c["name"] == "outbound|80||mtls.static")
        .expect("the mtls.static cluster");
    let ctx = &cluster["transport_socket"]["typed_config"];
    assert_eq!(ctx["sni"], SNI, "{cluster:#}");
    let common = &ctx["common_tls_context"];
    assert_eq!(common["tls_certificate_sds_secret_configs"][0]["name"], "kubernetes://upstream-client", "{cluster:#}");
    let ca_sds = &common["combined_validation_context"]["validation_context_sds_secret_config"]["name"];
    assert_eq!(*ca_sds, "kubernetes://upstream-client-cacert", "{cluster:#}");
    app.stop().await;
}
