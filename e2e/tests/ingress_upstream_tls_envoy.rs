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
//! Through a REAL istiod (config only): the DestinationRule istiod holds,
//! and the cluster it builds for the gateway Envoy (the certificate and CA
//! by SDS, the SNI). istiod serves a `credentialName` over SDS only to an
//! authenticated proxy (its TLS xDS port, normally through the Istio agent);
//! the harness's Envoy connects in plaintext with no agent, so istiod
//! withholds the Secret (its log says so) and no request is sent that way.

use std::path::Path;
use std::time::{Duration, Instant};

use meshbridge::testing::pki::{Issued, TestPki};
use meshbridge_e2e::gateway::{Gateway, Via};
use meshbridge_e2e::istiod::Version;
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
istiod_tests!(proxy_ssl_destination_rule_through_istiod);

/// What istiod makes of `proxy-ssl-*`: the DestinationRule it holds and the
/// gateway cluster it builds. The mutual-TLS Ingress is added once the
/// gateway Envoy runs: its cluster waits for a Secret istiod does not serve
/// this Envoy (see the module doc), and a cluster warming in Envoy's first
/// CDS would hold back its listeners.
async fn proxy_ssl_destination_rule_through_istiod(version: Version) {
    let ca = TestPki::new("meshbridge upstream ca").unwrap();
    let client = ca.issue("gateway-client", &["DNS:gateway.client".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let addr = "127.0.0.1:9".parse().unwrap();
    let registries = [static_registry("mtls", addr), static_registry("plain", addr)];
    std::fs::write(dir.path().join("mcpbridge.yaml"), mcpbridge(&registries)).unwrap();
    std::fs::write(dir.path().join("secret.yaml"), secret_yaml("upstream-client", &client, &ca.ca.cert)).unwrap();
    // A route first, so that the gateway has a listener.
    let plain = mcp_ingress("plain", 1, HOST, "plain.static:80", &[], &["/plain"]);
    std::fs::write(dir.path().join("plain.yaml"), plain).unwrap();
    let gw = Gateway::start(dir.path(), Via::Istiod(version)).await.expect("start meshbridge, istiod and the gateway");
    let (api, istiod) = gw.istiod.as_ref().unwrap();
    // The Secret where istiod would read it, as in a cluster.
    api.apply(&secret_yaml("upstream-client", &client, &ca.ca.cert)).await.unwrap();

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
        assert!(Instant::now() < deadline, "{version} has no DestinationRule for mtls.static\n{}", gw.istiod_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let tls = &rule["spec"]["trafficPolicy"]["tls"];
    assert_eq!(tls["mode"], "MUTUAL", "{rule:#}");
    assert_eq!(tls["credentialName"], "upstream-client", "{rule:#}");
    assert_eq!(tls["sni"], SNI, "{rule:#}");
    assert!(tls.get("insecureSkipVerify").is_none_or(|v| v == false), "verify on: {rule:#}");

    // The cluster istiod builds: the certificate and its CA by SDS, the SNI.
    let deadline = Instant::now() + Duration::from_secs(30);
    let cluster = loop {
        let dump = gw.envoy.admin("/config_dump?resource=dynamic_warming_clusters").await.unwrap_or_default();
        let active = gw.envoy.admin("/config_dump?resource=dynamic_active_clusters").await.unwrap_or_default();
        let found = [dump, active].iter().find_map(|d| {
            let v: serde_json::Value = serde_json::from_str(d).ok()?;
            v["configs"]
                .as_array()?
                .iter()
                .map(|c| c["cluster"].clone())
                .find(|c| c["name"] == "outbound|80||mtls.static" && c.get("transport_socket").is_some())
        });
        if let Some(c) = found {
            break c;
        }
        assert!(Instant::now() < deadline, "{version}: no TLS cluster for mtls.static\n{}", gw.envoy.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ctx = &cluster["transport_socket"]["typed_config"];
    assert_eq!(ctx["sni"], SNI, "{cluster:#}");
    let common = &ctx["common_tls_context"];
    assert_eq!(common["tls_certificate_sds_secret_configs"][0]["name"], "kubernetes://upstream-client", "{cluster:#}");
    let ca_sds = &common["combined_validation_context"]["validation_context_sds_secret_config"]["name"];
    assert_eq!(*ca_sds, "kubernetes://upstream-client-cacert", "{cluster:#}");

    // istiod withholds the Secret from an unauthenticated proxy.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !istiod.log().contains("is not authorized to receive") {
        assert!(Instant::now() < deadline, "{version} never refused the Secret\n{}", gw.istiod_log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gw.app.stop().await;
}
