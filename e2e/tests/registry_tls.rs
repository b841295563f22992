//! TLS to registries (`registryTls`), with meshbridge in-process and test
//! certificates made at test time (`meshbridge_e2e::test_pki`):
//!
//! - real Consul 1.8.7 on its own https listener;
//! - rnacos (no TLS of its own) behind the TLS test proxy, on both its HTTP
//!   port (open API and login) and its gRPC port, with auth on;
//! - a real Eureka server (no TLS of its own here) behind the TLS test proxy.
//!
//! Each time, the registry trusting the test CA serves its services, and the
//! one trusting another CA (or verifying another name) fails with an error on
//! `/v1/registries` that names the certificate verification and holds no
//! secret.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use meshbridge::lifecycle::LifecycleArgs;
use meshbridge::run::{App, RunArgs, RunCommand};
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::eureka::{EurekaServer, instance};
use meshbridge_e2e::free_port;
use meshbridge_e2e::nacos::{Instance, Options, Rnacos};
use meshbridge_e2e::test_pki::TestPki;
use meshbridge_e2e::tls_test_proxy::{NacosTlsProxies, TlsTestProxy};
use serde_json::{Value, json};
use tokio::time::Instant;

const TOKEN: &str = "tok-e2e-7f3a91";
const NACOS_PASSWORD: &str = "pw-e2e-55c2d";

/// A Secret with `ca.crt` and extra string data (YAML lines, indented by 2).
fn secret(name: &str, ca_pem: &str, extra: &str) -> String {
    let ca: String = ca_pem.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: {name}, namespace: higress-system }}\n\
         stringData:\n{extra}  ca.crt: |\n{ca}"
    )
}

fn bridge(entries: &[String]) -> String {
    format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n{}",
        entries.concat()
    )
}

async fn launch(dir: &std::path::Path, yaml: &str) -> App {
    std::fs::write(dir.join("bridge.yaml"), yaml).unwrap();
    // Some registries never sync here: serve without waiting for them.
    App::launch(RunCommand {
        args: RunArgs::loopback(dir),
        admin: Default::default(),
        gateway: Default::default(),
        lifecycle: LifecycleArgs { initial_sync_timeout: Duration::from_millis(300), ..Default::default() },
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .expect("start meshbridge")
}

async fn get(app: &App, path: &str) -> (String, Value) {
    let text = reqwest::get(format!("http://{}{path}", app.admin_addr)).await.unwrap().text().await.unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::Null);
    (text, value)
}

async fn until<T, F: Future<Output = Option<T>>>(what: &str, secs: u64, mut check: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs}s waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until registry `name` serves `endpoints` endpoints and is healthy.
async fn serves(app: &App, name: &str, endpoints: u64) -> Value {
    let path = format!("/v1/registries/{name}");
    until(&format!("{name} serves {endpoints} endpoint(s) over TLS"), 30, || async {
        let (_, r) = get(app, &path).await;
        (r["healthy"] == true && r["endpoints"] == endpoints).then_some(r)
    })
    .await
}

/// Wait until registry `name` reports an error containing `want`; check it
/// holds no secret and it serves nothing.
async fn fails_with(app: &App, name: &str, want: &str) -> String {
    let path = format!("/v1/registries/{name}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (text, r) = loop {
        let (text, r) = get(app, &path).await;
        if r["lastError"].as_str().is_some_and(|e| e.contains(want)) {
            break (text, r);
        }
        assert!(Instant::now() < deadline, "timed out waiting for {name} to fail with {want:?}: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(r["healthy"], false, "{r}");
    assert_eq!(r["endpoints"], 0, "{r}");
    for secret in [TOKEN, NACOS_PASSWORD] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    r["lastError"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_over_https_verifies_the_certificate() {
    let pki = TestPki::new().expect("test certificates");
    let https_port = free_port();
    let hcl = format!(
        "ports {{ https = {https_port} }}\ncert_file = {:?}\nkey_file = {:?}\nca_file = {:?}\n",
        pki.cert_file, pki.key_file, pki.ca_file
    );
    let consul = Consul::start_with_hcl(&hcl).await.expect("start consul with its https listener");
    consul
        .register(json!({"ID": "api-1", "Name": "api", "Address": "127.0.0.1", "Port": 9000}))
        .await
        .expect("register");

    let dir = tempfile::tempdir().unwrap();
    let entry = |name: &str, secret: &str, tls: &str| {
        format!(
            "    - {{type: consul, name: {name}, domain: 127.0.0.1, port: {https_port}, consulDatacenter: dc1, \
             authSecretName: {secret}, registryTls: {{enabled: true, caKey: ca.crt{tls}}}}}\n"
        )
    };
    let token = format!("  consulToken: {TOKEN}\n");
    let yaml = bridge(&[
        entry("good", "consul-ca", ""),
        entry("named", "consul-ca", ", serverName: localhost"),
        entry("wrong-ca", "consul-wrong-ca", ""),
        entry("wrong-name", "consul-ca", ", serverName: consul.other.example"),
    ]) + &secret("consul-ca", &pki.ca_pem, &token)
        + &secret("consul-wrong-ca", &pki.wrong_ca_pem, &token);
    let app = launch(dir.path(), &yaml).await;

    let r = serves(&app, "good", 1).await;
    assert_eq!(r["endpoint"], format!("https://127.0.0.1:{https_port}"), "TLS shows on /v1/registries");
    serves(&app, "named", 1).await;
    // An instance without checks joins the service: no detector names it,
    // so only a sweep of index probes finds it, pipelined over the TLS
    // connection with the token (well before the 30 s periodic sweep).
    let t = Instant::now();
    consul
        .register(json!({"ID": "api-2", "Name": "api", "Address": "127.0.0.2", "Port": 9000}))
        .await
        .expect("register");
    serves(&app, "good", 2).await;
    assert!(t.elapsed() < Duration::from_secs(15), "found by the sweep, not the periodic one: {:?}", t.elapsed());
    let err = fails_with(&app, "wrong-ca", "TLS handshake failed: certificate verification failed").await;
    assert!(err.contains("UnknownIssuer"), "{err}");
    let err = fails_with(&app, "wrong-name", "TLS handshake failed: certificate verification failed").await;
    assert!(err.contains("not valid for name \"consul.other.example\""), "{err}");
    let (_, config) = get(&app, "/v1/config").await;
    assert_eq!(config["errors"], json!([]), "{config}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_http_login_and_grpc_over_tls() {
    let pki = TestPki::new().expect("test certificates");
    let auth = Some(("nacos".to_string(), NACOS_PASSWORD.to_string()));
    let nacos = Rnacos::start_with(Options { auth, ..Default::default() }).await.expect("start rnacos");
    nacos.register(&Instance::new("orders", "127.0.0.1", 8080)).await.expect("register");
    let proxies = NacosTlsProxies::start(&pki, nacos.http_port, nacos.grpc_port()).await.expect("TLS test proxies");
    let port = proxies.http.addr.port();

    let dir = tempfile::tempdir().unwrap();
    let entry = |kind: &str, name: &str, secret: &str| {
        format!(
            "    - {{type: {kind}, name: {name}, domain: 127.0.0.1, port: {port}, authSecretName: {secret}, \
             registryTls: {{enabled: true, caKey: ca.crt}}}}\n"
        )
    };
    let creds = format!("  nacosUsername: nacos\n  nacosPassword: {NACOS_PASSWORD}\n");
    let yaml = bridge(&[
        entry("nacos", "http-good", "nacos-ca"),
        entry("nacos2", "grpc-good", "nacos-ca"),
        entry("nacos", "http-wrong", "nacos-wrong-ca"),
        entry("nacos2", "grpc-wrong", "nacos-wrong-ca"),
    ]) + &secret("nacos-ca", &pki.ca_pem, &creds)
        + &secret("nacos-wrong-ca", &pki.wrong_ca_pem, &creds);
    let app = launch(dir.path(), &yaml).await;

    serves(&app, "http-good", 1).await;
    serves(&app, "grpc-good", 1).await;
    // Both came through TLS: the open API and login on the HTTP port, gRPC
    // (meshbridge's own gRPC client, ALPN h2) on the gRPC port.
    assert!(proxies.http.handshakes() > 0 && proxies.grpc.handshakes() > 0);
    fails_with(&app, "http-wrong", "certificate verification failed").await;
    let err = fails_with(&app, "grpc-wrong", "certificate verification failed").await;
    assert!(err.contains("UnknownIssuer"), "{err}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eureka_over_tls() {
    let pki = TestPki::new().expect("test certificates");
    let eureka = EurekaServer::start().await.expect("start the Eureka server (source e2e/env.sh eureka-server)");
    eureka.api.register(instance("billing", "b-1", "127.0.0.1", 8081, "UP")).await.expect("register");
    let upstream: SocketAddr = eureka.host_port().parse().unwrap();
    let proxy = TlsTestProxy::start(&pki, "127.0.0.1:0".parse().unwrap(), upstream, &[b"http/1.1"])
        .await
        .expect("TLS test proxy");

    let dir = tempfile::tempdir().unwrap();
    let port = proxy.addr.port();
    let entry = |name: &str, secret: &str, host: &str| {
        format!(
            "    - {{type: eureka, name: {name}, domain: '{host}', port: {port}, authSecretName: {secret}, \
             registryTls: {{enabled: true, caKey: ca.crt}}}}\n"
        )
    };
    let yaml = bridge(&[entry("good", "eureka-ca", "localhost"), entry("wrong-ca", "eureka-wrong-ca", "127.0.0.1")])
        + &secret("eureka-ca", &pki.ca_pem, "")
        + &secret("eureka-wrong-ca", &pki.wrong_ca_pem, "");
    let app = launch(dir.path(), &yaml).await;

    serves(&app, "good", 1).await;
    assert!(proxy.handshakes() > 0);
    fails_with(&app, "wrong-ca", "certificate verification failed").await;
    app.shutdown().await;
}
