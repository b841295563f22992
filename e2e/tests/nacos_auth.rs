//! Nacos login against the real Nacos 3.1 with auth on
//! (`MESHBRIDGE_NACOS_SERVER_JAR`, see `e2e/env.sh`): a server of this
//! test's own, tokens living 6 s, the admin `nacos` given its password
//! through the v3 API, and meshbridge in config-dir mode reading it through
//! `authSecretName` Secrets, over gRPC (`nacos2`) and HTTP (`nacos`).
//!
//! - the right credentials: services served, tokens refreshed through
//!   several lifetimes with no failed call, and a change still arrives;
//! - a wrong password: `lastError` on `/v1/registries` names the login and
//!   what to check (Nacos 3.1 answers it `500`, without a reason);
//! - a user who may read one namespace, pointed at another: `lastError`
//!   names the namespace and Nacos's `403`;
//! - no password in any admin answer or log line (debug level).

use std::future::Future;
use std::time::Duration;

use meshbridge::lifecycle::LifecycleArgs;
use meshbridge::run::{AdminArgs, App, RunArgs, RunCommand};
use meshbridge_e2e::captured_logs::{logs, text};
use meshbridge_e2e::nacos::Instance;
use meshbridge_e2e::nacos_server::{ADMIN, NacosServer};
use serde_json::Value;
use tokio::time::Instant;

const ADMIN_PW: &str = "adm-pw-3f81c2";
const WRONG_PW: &str = "wrong-pw-6d20ae";
const READER: &str = "mb-reader";
const READER_PW: &str = "reader-pw-a49b17";
const TOKEN_TTL: Duration = Duration::from_secs(6);
const ALLOWED: &str = "ns-allowed";
const DENIED: &str = "ns-denied";

fn entry(kind: &str, name: &str, port: u16, namespace: &str, secret: &str) -> String {
    format!(
        "    - type: {kind}\n      name: {name}\n      domain: 127.0.0.1\n      port: {port}\n      \
         nacosNamespaceId: {namespace}\n      nacosRefreshInterval: 10000000000\n      authSecretName: {secret}\n"
    )
}

fn secret(name: &str, user: &str, password: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{ name: {name}, namespace: higress-system }}\n\
         stringData:\n  nacosUsername: {user}\n  nacosPassword: {password}\n"
    )
}

async fn get(app: &App, path: &str) -> (u16, String) {
    let resp = reqwest::get(format!("http://{}{path}", app.admin_addr)).await.expect(path);
    (resp.status().as_u16(), resp.text().await.unwrap())
}

async fn registry(app: &App, name: &str) -> Value {
    let (status, body) = get(app, &format!("/v1/registries/{name}")).await;
    assert_eq!(status, 200, "{name}: {body}");
    serde_json::from_str(&body).unwrap()
}

async fn until<T, F: Future<Output = Option<T>>>(what: &str, secs: u64, mut f: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `name`'s `lastError` once it contains `needle`.
async fn error_of(app: &App, name: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = registry(app, name).await;
        if let Some(e) = r["lastError"].as_str().filter(|e| e.contains(needle)) {
            return e.to_string();
        }
        assert!(Instant::now() < deadline, "{name}: no error with {needle:?}: {r}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos3_auth_login_refresh_and_refusals() {
    logs();
    let nacos = NacosServer::start_with_auth(ADMIN_PW, TOKEN_TTL)
        .await
        .expect("start nacos with auth (source e2e/env.sh nacos-server)");
    let port = nacos.http_port;
    for ns in [ALLOWED, DENIED] {
        nacos.create_namespace(ns, ns).await.unwrap();
    }
    nacos.register(&Instance::new("web", "127.0.0.2", 8080).namespace(ALLOWED)).await.unwrap();
    nacos.register(&Instance::new("hidden", "127.0.0.4", 8080).namespace(DENIED)).await.unwrap();
    nacos.add_reader(READER, READER_PW, ALLOWED).await.unwrap();
    // Nacos 3.1 with auth on: a wrong password is a 500 on the v3 login.
    let (status, _) = nacos.login(ADMIN, WRONG_PW).await.unwrap();
    println!("FIGURE nacos3_wrong_password_login status={status}");

    let yaml = format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n{}{}",
        [
            entry("nacos2", "grpc", port, ALLOWED, "nacos-admin"),
            entry("nacos", "http", port, ALLOWED, "nacos-admin"),
            entry("nacos2", "grpc-wrong", port, ALLOWED, "nacos-wrong"),
            entry("nacos", "http-wrong", port, ALLOWED, "nacos-wrong"),
            entry("nacos2", "grpc-denied", port, DENIED, "nacos-reader"),
            entry("nacos", "http-denied", port, DENIED, "nacos-reader"),
            entry("nacos2", "grpc-reader", port, ALLOWED, "nacos-reader"),
        ]
        .concat(),
        [
            secret("nacos-admin", ADMIN, ADMIN_PW),
            secret("nacos-wrong", ADMIN, WRONG_PW),
            secret("nacos-reader", READER, READER_PW),
        ]
        .concat(),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bridge.yaml"), &yaml).unwrap();
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: AdminArgs::default(),
        gateway: Default::default(),
        // The refused registries never sync: serve the others at once.
        lifecycle: LifecycleArgs { initial_sync_timeout: Duration::from_secs(1), ..Default::default() },
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .expect("start meshbridge");

    for name in ["grpc", "http", "grpc-reader"] {
        until(&format!("{name} serves web"), 30, || async {
            let r = registry(&app, name).await;
            (r["ready"] == true && r["endpoints"] == 1).then_some(())
        })
        .await;
    }

    // Three token lifetimes: every call keeps succeeding.
    let logins_before = text().matches("logged in to nacos").count();
    let watch_until = Instant::now() + TOKEN_TTL * 3;
    while Instant::now() < watch_until {
        for name in ["grpc", "http"] {
            let r = registry(&app, name).await;
            assert!(
                r["healthy"] == true && r["consecutiveFailures"] == 0 && r["endpoints"] == 1,
                "{name} failed while its token was refreshed: {r}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let refreshes = text().matches("logged in to nacos").count() - logins_before;
    assert!(refreshes >= 4, "{refreshes} logins in three token lifetimes of two registries");
    // A change made long after the first token expired still arrives.
    nacos.register(&Instance::new("web", "127.0.0.3", 8080).namespace(ALLOWED)).await.unwrap();
    for name in ["grpc", "http"] {
        until(&format!("{name} serves the new instance"), 30, || async {
            (registry(&app, name).await["endpoints"] == 2).then_some(())
        })
        .await;
    }

    for name in ["grpc-wrong", "http-wrong"] {
        let e = error_of(&app, name, "check nacosUsername and nacosPassword").await;
        println!("FIGURE nacos3_auth lastError registry={name}: {e}");
        assert!(e.contains("/nacos/v3/auth/user/login"), "{e}");
        let r = registry(&app, name).await;
        assert!(r["ready"] == false && r["endpoints"] == 0, "{r}");
    }
    for name in ["grpc-denied", "http-denied"] {
        let e = error_of(&app, name, "namespace ns-denied: not readable with these credentials): status 403").await;
        println!("FIGURE nacos3_auth lastError registry={name}: {e}");
        assert!(!e.contains("nacos login"), "the login works, the read is refused: {e}");
        let r = registry(&app, name).await;
        assert!(r["ready"] == false && r["endpoints"] == 0, "{r}");
    }

    let secrets = [ADMIN_PW, WRONG_PW, READER_PW];
    for path in ["/v1/registries", "/v1/registries/grpc?services=true", "/debug/configz", "/metrics"] {
        let (_, body) = get(&app, path).await;
        for s in secrets {
            assert!(!body.contains(s), "{path} shows a password: {body}");
        }
    }
    app.stop().await;
    drop(nacos);
    let logged = text();
    assert!(logged.contains("DEBUG"), "debug logs were not captured");
    for s in secrets {
        if let Some(line) = logged.lines().find(|l| l.contains(s)) {
            panic!("a password was logged: {line}");
        }
    }
}
