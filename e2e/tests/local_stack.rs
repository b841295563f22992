//! The local stack of docker-compose.yml, run with local binaries: rnacos,
//! Consul and ZooKeeper, meshbridge in-process, Envoy, the two demo
//! backends (deploy/examples/demo-backend.py) registering themselves, and
//! the demo apps of deploy/examples/dubbo-spring from their jars (the
//! compose file builds them into images): the Spring Cloud app in Consul
//! and the Dubbo provider in ZooKeeper at application level. It uses the
//! compose stack's own files (McpBridge, Ingresses, Envoy bootstrap), with
//! only addresses and ports replaced, so that what the compose file and
//! deploy/README.md document is what runs here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use meshbridge::lifecycle::LifecycleArgs;
use meshbridge::run::{AdminArgs, App, GatewayArgs, RunArgs, RunCommand};
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::dubbo::{self, DubboProvider, Options, Protocol, RegisterMode};
use meshbridge_e2e::envoy::Envoy;
use meshbridge_e2e::free_port;
use meshbridge_e2e::nacos::Rnacos;
use meshbridge_e2e::process::ChildGuard;
use meshbridge_e2e::spring_app::{self, SpringApp};
use meshbridge_e2e::zookeeper::ZooKeeper;
use meshbridge_registries::Secret;

/// The admin token the compose file sets and the docs use.
const ADMIN_TOKEN: &str = "dev-admin-token";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `text` with `from` replaced by `to`; `from` must be there, so the test
/// breaks if the deploy file drifts.
fn replace(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not found in:\n{text}");
    text.replace(from, to)
}

/// Envoy on a bootstrap from deploy/examples/, as written but for two
/// addresses: meshbridge's (`{xds_host}:15051`) becomes the in-process one,
/// and the admin's (`{admin_host}:9901`) a loopback port Envoy picks.
async fn envoy_from(file: &str, xds_host: &str, admin_host: &str, app: &App, gateway_port: u16) -> Envoy {
    let text = std::fs::read_to_string(repo().join("deploy/examples").join(file)).unwrap();
    let at = |host: &str, port: u16| format!("socket_address: {{ address: {host}, port_value: {port} }}");
    let text = replace(&text, &at(xds_host, 15051), &at("127.0.0.1", app.xds_addr.port()));
    let text = replace(&text, &at(admin_host, 9901), &at("127.0.0.1", 0));
    Envoy::start_bootstrap(&text, 0, gateway_port).await.expect("start envoy")
}

/// One demo backend process, registering itself in `registry`.
fn demo_backend(name: &str, registry: &str, registry_addr: &str, dir: &Path) -> (ChildGuard, u16) {
    let port = free_port();
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("deploy/examples/demo-backend.py"))
        .env("NAME", name)
        .env("PORT", port.to_string())
        .env("REGISTRY", registry)
        .env(registry.to_uppercase(), registry_addr)
        .env("ADVERTISE", "127.0.0.1");
    (ChildGuard::spawn(name, cmd, dir.join(format!("{name}.log"))).expect("start demo backend"), port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_topology_with_local_binaries() {
    let nacos = Rnacos::start().await.expect("start rnacos (source e2e/env.sh rnacos)");
    let consul = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
    let zk = ZooKeeper::start().await.expect("start zookeeper (source e2e/env.sh zookeeper)");
    let logs = tempfile::tempdir().unwrap();

    // The two JVM apps start in parallel, beside everything below, as the
    // compose services `greeter-spring` (profile consul) and `greeter-dubbo`
    // (ZooKeeper, register-mode instance); each takes 10-40 s.
    let spring_registry = spring_app::Registry::Consul { port: consul.http_port };
    let dubbo_registry = format!("zookeeper://127.0.0.1:{}", zk.port);
    let jvms = tokio::spawn(async move {
        let dubbo_opts = Options { mode: RegisterMode::Instance, protocol: Protocol::Triple };
        let (spring, dubbo) = tokio::join!(
            SpringApp::start(&spring_registry, "greeter-spring-1"),
            DubboProvider::start(&dubbo_registry, dubbo_opts, "greeter-dubbo-1")
        );
        (
            spring.expect("start the Spring app (source e2e/env.sh spring-app)"),
            dubbo.expect("start the Dubbo provider (source e2e/env.sh dubbo-provider)"),
        )
    });

    // The compose config dir, each registry pointed at its local server.
    let dir = tempfile::tempdir().unwrap();
    let compose = repo().join("deploy/examples/compose");
    let bridge = std::fs::read_to_string(compose.join("mcpbridge.yaml")).unwrap();
    let bridge = replace(
        &bridge,
        "domain: nacos\n      port: 8848",
        &format!("domain: 127.0.0.1\n      port: {}", nacos.http_port),
    );
    let bridge = replace(
        &bridge,
        "domain: consul\n      port: 8500",
        &format!("domain: 127.0.0.1\n      port: {}", consul.http_port),
    );
    let bridge =
        replace(&bridge, "domain: zookeeper\n      port: 2181", &format!("domain: 127.0.0.1\n      port: {}", zk.port));
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::copy(compose.join("ingress.yaml"), dir.path().join("ingress.yaml")).unwrap();
    assert_eq!(std::fs::read_dir(&compose).unwrap().count(), 2, "a new file in compose/ needs a place here");

    // meshbridge as the compose file runs it: gateway listener, admin token.
    let gateway_port = free_port();
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: AdminArgs { admin_token: Some(Secret::new(ADMIN_TOKEN)), ..AdminArgs::default() },
        gateway: GatewayArgs { gateway_http_port: vec![gateway_port], ..GatewayArgs::default() },
        lifecycle: Default::default(),
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .expect("start meshbridge");

    // The compose bootstrap, pointed at meshbridge and a free admin port.
    let envoy = envoy_from("compose-envoy.yaml", "meshbridge", "0.0.0.0", &app, gateway_port).await;

    let (mut demo_nacos, _) =
        demo_backend("demo-nacos", "nacos", &format!("127.0.0.1:{}", nacos.http_port), logs.path());
    let (mut demo_consul, _) =
        demo_backend("demo-consul", "consul", &format!("127.0.0.1:{}", consul.http_port), logs.path());

    // curl localhost:10080/nacos and /consul, as the compose file says.
    for (path, want) in [("/nacos", "hello from demo-nacos\n"), ("/consul", "hello from demo-consul\n")] {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = envoy.get(path).await;
            if matches!(&got, Ok((200, body)) if body == want) {
                break;
            }
            assert!(
                Instant::now() < deadline && demo_nacos.is_running() && demo_consul.is_running(),
                "{path}: last answer {got:?}\nenvoy:\n{}\ndemo-nacos:\n{}\ndemo-consul:\n{}",
                envoy.log(),
                demo_nacos.log(),
                demo_consul.log()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    // curl localhost:10080/spring and the Triple call the compose file
    // documents: each app answers its instance id through Envoy.
    let (spring, dubbo) = jvms.await.expect("the JVM apps");
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", envoy.listen_port);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got_spring = envoy.get("/spring").await;
        let got_dubbo = dubbo::whoami(&http, &base).await;
        let spring_ok = matches!(&got_spring, Ok((200, body)) if *body == spring.instance_id);
        let dubbo_ok = matches!(&got_dubbo, Ok(id) if *id == dubbo.id);
        if spring_ok && dubbo_ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/spring: {got_spring:?}, whoami: {got_dubbo:?}\nenvoy:\n{}\nspring:\n{}\ndubbo:\n{}",
            envoy.log(),
            spring.log(),
            dubbo.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The admin API with the documented token: every registry healthy.
    let url = format!("http://{}/v1/registries", app.admin_addr);
    let denied = http.get(&url).send().await.unwrap();
    assert_eq!(denied.status(), 401, "the token is enforced");
    let registries: serde_json::Value =
        http.get(&url).bearer_auth(ADMIN_TOKEN).send().await.unwrap().json().await.unwrap();
    let health: Vec<(String, bool)> = registries
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), r["healthy"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        health,
        [("nacos".to_string(), true), ("consul".to_string(), true), ("zookeeper".to_string(), true)],
        "{registries:#}"
    );
    app.stop().await;
}

/// README's quick start and deploy/README.md's "without containers" recipe:
/// meshbridge on deploy/examples/standalone with `--gateway-http-port`,
/// Envoy on deploy/examples/envoy-bootstrap.yaml, `python3 -m http.server`
/// as the static registry's endpoint, and `curl -H 'Host: echo.example.com'`.
/// Only ports are replaced (10080, 10081, 15051, 9901 become free ones).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_quick_start_with_local_binaries() {
    let logs = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let standalone = repo().join("deploy/examples/standalone");
    let echo_port = free_port();
    for entry in std::fs::read_dir(&standalone).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let text = if path.ends_with("mcpbridge.yaml") {
            replace(&text, "domain: 127.0.0.1:10081", &format!("domain: 127.0.0.1:{echo_port}"))
        } else {
            text
        };
        std::fs::write(dir.path().join(path.file_name().unwrap()), text).unwrap();
    }

    // python3 -m http.server PORT --bind 127.0.0.1 (serving an empty dir).
    let served = tempfile::tempdir().unwrap();
    std::fs::write(served.path().join("index.html"), "echo\n").unwrap();
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "http.server", &echo_port.to_string(), "--bind", "127.0.0.1"]).current_dir(served.path());
    let mut http_server = ChildGuard::spawn("http.server", cmd, logs.path().join("http.server.log")).unwrap();

    let gateway_port = free_port();
    // As the README's quick start: the defaults, nothing else running.
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: AdminArgs::default(),
        gateway: GatewayArgs { gateway_http_port: vec![gateway_port], ..GatewayArgs::default() },
        lifecycle: LifecycleArgs::default(),
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .expect("start meshbridge");
    let envoy = envoy_from("envoy-bootstrap.yaml", "127.0.0.1", "127.0.0.1", &app, gateway_port).await;

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = envoy.get_host("/", "echo.example.com").await;
        if matches!(&got, Ok((200, body)) if body == "echo\n") {
            break;
        }
        assert!(
            Instant::now() < deadline && http_server.is_running(),
            "last answer {got:?}\nenvoy:\n{}\nhttp.server:\n{}",
            envoy.log(),
            http_server.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Every configured registry is synced: ready, with nothing missing.
    let ready = reqwest::get(format!("http://{}/ready", app.admin_addr)).await.unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap_or_default());
    app.stop().await;
}
