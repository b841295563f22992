//! Start and stop: the startup gate (never serve a partial view), graceful
//! shutdown of the real binary with a client connected, and watcher churn
//! without leaks. Registries are `static` (always answers) and a Consul on
//! a closed loopback port (never answers), so no server is needed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshbridge::cache::{Cache, RegistryKey};
use meshbridge::lifecycle::LifecycleArgs;
use meshbridge::metrics::Metrics;
use meshbridge::reconcile::Reconciler;
use meshbridge::run::{AdminArgs, App, GatewayArgs, RunArgs, RunCommand};
use meshbridge::testing::SotwClient;
use meshbridge::testing::exposition;
use meshbridge::translate::envoy::CLUSTER_TYPE;
use meshbridge::xds::Clients;
use meshbridge_registries::{RegistryKind, RegistrySpec};
use serde_json::Value;

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn write_bridge(dir: &Path, consul_port: u16) {
    let yaml = format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - {{ type: static, name: echo, domain: "127.0.0.1:10081", port: 80 }}
    - {{ type: consul, name: down, domain: 127.0.0.1, port: {consul_port} }}
"#
    );
    std::fs::write(dir.join("bridge.yaml"), yaml).unwrap();
}

async fn get(admin: std::net::SocketAddr, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("http://{admin}{path}")).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

#[tokio::test]
async fn clients_wait_for_every_registry_until_the_initial_sync_timeout() {
    let dir = tempfile::tempdir().unwrap();
    write_bridge(dir.path(), closed_port());
    let timeout = Duration::from_millis(2500);
    let started = Instant::now();
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: AdminArgs::default(),
        gateway: GatewayArgs::default(),
        lifecycle: LifecycleArgs { initial_sync_timeout: timeout, ..Default::default() },
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .unwrap();

    let mut client = SotwClient::connect(app.xds_addr).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    // The static registry answered at once, but Consul never does: nothing
    // is sent while the set lacks it.
    assert!(client.recv_within(Duration::from_millis(1500)).await.is_none(), "a partial view was served");
    let (status, body) = get(app.admin_addr, "/ready").await;
    assert_eq!(
        (status, &body["waitingFor"], &body["serving"]),
        (503, &serde_json::json!(["consul/down"]), &Value::Bool(false))
    );

    // Past the timeout the client gets what there is, and everything says so.
    let resp = client.recv_within(Duration::from_secs(5)).await.expect("served after the timeout");
    let waited = started.elapsed();
    assert!(waited >= timeout, "served after {waited:?}, before the {timeout:?} timeout");
    assert_eq!(resp.resources.len(), 1, "the static registry's cluster");
    let (status, body) = get(app.admin_addr, "/ready").await;
    assert_eq!((status, &body["serving"]), (503, &Value::Bool(true)), "{body}");
    let (_, regs) = get(app.admin_addr, "/v1/registries").await;
    let missing: Vec<(&str, bool)> = regs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["missing"].as_bool().unwrap()))
        .collect();
    assert_eq!(missing, [("down", true), ("echo", false)]);
    println!("initial sync timeout {timeout:?}: first response after {waited:?}");
    app.stop().await;
}

fn write_static_bridge(dir: &Path) {
    std::fs::write(
        dir.join("bridge.yaml"),
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: { name: default, namespace: higress-system }\n\
         spec:\n  registries:\n    - { type: static, name: echo, domain: \"127.0.0.1:10081\", port: 80 }\n",
    )
    .unwrap();
}

#[tokio::test]
async fn a_complete_set_is_served_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    write_static_bridge(dir.path());
    let app = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    let started = Instant::now();
    let mut client = SotwClient::connect(app.xds_addr).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let resp = client.recv().await;
    assert_eq!(resp.resources.len(), 1);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(get(app.admin_addr, "/ready").await, (200, serde_json::json!({"ready": true, "stale": []})));
    app.stop().await;
}

/// SIGTERM to the real binary with a client connected: not ready and no new
/// streams at once, the existing stream served through the drain, the dump
/// flushed, exit 0.
#[tokio::test]
async fn sigterm_drains_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = dir.path().join("config");
    std::fs::create_dir(&config).unwrap();
    write_static_bridge(&config);
    let (xds, admin) = (closed_port(), closed_port());
    let drain = Duration::from_secs(3);
    let log = std::fs::File::create(dir.path().join("meshbridge.log")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_meshbridge"))
        .args(["run", "--config-dir"])
        .arg(&config)
        .args(["--xds-addr", &format!("127.0.0.1:{xds}"), "--admin-addr", &format!("127.0.0.1:{admin}")])
        .arg("--state-dir")
        .arg(state.path())
        .args(["--drain", "3s", "--initial-sync-timeout", "500ms"])
        .stderr(log)
        .spawn()
        .unwrap();
    let result = async {
        let xds_addr: std::net::SocketAddr = format!("127.0.0.1:{xds}").parse().unwrap();
        let admin_addr: std::net::SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut client = loop {
            if let Ok(c) = SotwClient::connect(xds_addr).await {
                break c;
            }
            assert!(Instant::now() < deadline, "meshbridge did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
        let resp = client.recv().await;
        client.ack(&resp, &[]).await;

        assert_eq!(get(admin_addr, "/ready").await.0, 200);
        let term = Instant::now();
        assert!(
            std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success()
        );
        // Not ready first.
        let mut unready = None;
        while term.elapsed() < Duration::from_secs(2) {
            if let Ok(r) = reqwest::get(format!("http://{admin_addr}/ready")).await
                && r.status() == 503
                && r.json::<Value>().await.is_ok_and(|b| b["draining"] == true)
            {
                unready = Some(term.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let unready = unready.expect("/ready did not turn 503 after SIGTERM");
        // New streams are refused; the existing one is still listed.
        let refused = match SotwClient::connect(xds_addr).await {
            Err(e) => format!("{e:#}"),
            Ok(_) => panic!("a new stream was accepted while draining"),
        };
        assert!(refused.to_lowercase().contains("shutting down"), "{refused}");
        let (_, xdsz) = get(admin_addr, "/debug/xdsz").await;
        assert_eq!(xdsz["clients"].as_array().unwrap().len(), 1, "the existing stream is served on");

        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(term.elapsed() < drain + Duration::from_secs(5), "did not exit after the drain");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let exited = term.elapsed();
        assert!(status.success(), "exit status {status}");
        assert!(exited >= drain, "exited after {exited:?}, before the {drain:?} drain with a client connected");
        // The stream is closed by the server, not reset mid-way.
        assert!(client.recv_within(Duration::from_secs(1)).await.is_none());
        let files: Vec<String> =
            std::fs::read_dir(state.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(files, ["registry-static-echo.json"], "the answered registry's state is flushed");
        println!("SIGTERM: /ready 503 after {unready:?}, exit 0 after {exited:?} (drain {drain:?})");
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.path().join("meshbridge.log")).unwrap_or_default();
    assert!(log.contains("shutting down"), "{log}");
    result
}

/// Many config edits in a short time: every stopped watcher's task ends, and
/// no removed registry leaves a metric series behind.
#[tokio::test]
async fn watcher_churn_leaks_no_tasks_or_series() {
    let cache = Cache::new();
    let metrics = Metrics::new(cache.clone(), Clients::new(), tokio::sync::watch::channel(Arc::default()).1);
    let mut reconciler = Reconciler::new(cache.clone());
    let down = closed_port();
    let spec = |i: usize| -> RegistrySpec {
        // Alternate kinds: static watchers finish their work at once, Consul
        // ones sit in retry backoff against a closed port.
        if i.is_multiple_of(2) {
            RegistrySpec::new(RegistryKind::Static, format!("s{}", i % 23), format!("127.0.0.1:{}", 10000 + i), 80)
        } else {
            RegistrySpec::new(RegistryKind::Consul, format!("c{}", i % 19), "127.0.0.1", down)
        }
    };
    let edits = 1000;
    let started = Instant::now();
    let mut peak = 0;
    for edit in 0..edits {
        // Each edit keeps a sliding window of 8 registries, with changed specs.
        let desired: Vec<RegistrySpec> = (edit..edit + 8).map(spec).collect();
        reconciler.apply(&desired);
        peak = peak.max(cache.watchers().get());
        if edit.is_multiple_of(50) {
            tokio::task::yield_now().await;
        }
    }
    let last: Vec<RegistrySpec> = (edits - 1..edits + 7).map(spec).collect();
    let configured = reconciler.running().count();
    assert_eq!(configured, last.len());
    // Aborted tasks end at their next poll.
    let deadline = Instant::now() + Duration::from_secs(5);
    while cache.watchers().get() != configured as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = metrics.render().unwrap();
    let samples = exposition::parse(&text).unwrap();
    assert_eq!(exposition::value(&samples, "meshbridge_watchers", &[]), Some(configured as f64), "{text}");
    // Every per-registry series names a configured registry.
    let keys: std::collections::BTreeSet<RegistryKey> = reconciler.running().cloned().collect();
    let names: std::collections::BTreeSet<String> = keys.iter().map(|k| k.name.clone()).collect();
    let mut series = 0;
    for s in &samples {
        if let Some(name) = s.labels.get("name") {
            assert!(names.contains(name), "leaked series {} for {name}", s.name);
            series += 1;
        }
    }
    assert_eq!(cache.registries().len(), configured, "leaked cache entries");
    println!("{edits} edits in {took:?}: peak {peak} watchers, {configured} live after, {series} registry series");
    drop(reconciler);
}

fn dumped_web() -> meshbridge_registries::Service {
    use meshbridge_registries::{Endpoint, Protocol, Service, ServicePort};
    let ep = |a: &str| Endpoint { address: a.into(), port: 8080, weight: 1, labels: Default::default() };
    Service::new(
        "web.service.consul",
        vec![ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() }],
        vec![ep("10.1.0.1"), ep("10.1.0.2")],
    )
}

/// Restart while a registry is down: the dump is served to a brand-new
/// client at once (no wait for the timeout), marked stale; a corrupt file
/// for another registry is ignored, never fatal.
#[tokio::test]
async fn warm_restart_serves_the_dump_and_ignores_a_corrupt_file() {
    use meshbridge::dump::StateDir;
    use meshbridge::translate::envoy::ENDPOINT_TYPE;
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_bridge(dir.path(), closed_port());
    let sd = StateDir::open(state.path()).unwrap();
    sd.write(&RegistryKey::new(RegistryKind::Consul, "down"), &[&dumped_web()]).unwrap();
    let echo = RegistryKey::new(RegistryKind::Static, "echo");
    std::fs::write(sd.path(&echo), b"{\"format\": \"meshbridge.io/registry-state\", \"version\": 99}").unwrap();
    // Not in the config: never loaded.
    sd.write(&RegistryKey::new(RegistryKind::Consul, "gone"), &[&dumped_web()]).unwrap();

    let started = Instant::now();
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: AdminArgs::default(),
        gateway: GatewayArgs::default(),
        lifecycle: LifecycleArgs { state_dir: Some(state.path().into()), ..Default::default() },
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .expect("a corrupt state file is not fatal");
    let mut client = SotwClient::connect(app.xds_addr).await.unwrap();
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let cds = client.recv().await;
    assert_eq!(cds.resources.len(), 2, "the static cluster and the dumped Consul one");
    client.ack(&cds, &[]).await;
    let cluster = "outbound|8080||web.service.consul";
    client.send(SotwClient::request(ENDPOINT_TYPE, &[cluster], "", "")).await;
    let eds = client.recv().await;
    assert_eq!(eds.resources.len(), 1);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(5), "served from the dump after {waited:?}");

    let (status, ready) = get(app.admin_addr, "/ready").await;
    assert_eq!((status, ready), (200, serde_json::json!({"ready": true, "stale": ["consul/down"]})));
    let (_, down) = get(app.admin_addr, "/v1/registries/down").await;
    assert_eq!((down["stale"].as_bool(), down["endpoints"].as_u64()), (Some(true), Some(2)));
    assert!(app.cache.registry(&RegistryKey::new(RegistryKind::Consul, "gone")).is_none(), "resurrected");
    let samples = exposition::parse(&app.metrics.render().unwrap()).unwrap();
    assert_eq!(exposition::value(&samples, "meshbridge_registry_stale", &[("name", "down")]), Some(1.0));
    // The static registry answered live, and its file is now valid.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !matches!(sd.read(&echo), Ok(Some(_))) {
        assert!(Instant::now() < deadline, "{:?}", sd.read(&echo));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("warm restart: CDS and EDS from the dump {waited:?} after start");
    app.stop().await;
}

/// `--max-stale`: a registry that has not answered for longer is withdrawn
/// (its cluster stays, with no endpoints).
#[tokio::test]
async fn max_stale_withdraws_a_registry_that_stays_down() {
    use meshbridge::dump::StateDir;
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    write_bridge(dir.path(), closed_port());
    let down = RegistryKey::new(RegistryKind::Consul, "down");
    StateDir::open(state.path()).unwrap().write(&down, &[&dumped_web()]).unwrap();
    let app = App::launch(RunCommand {
        args: RunArgs::loopback(dir.path()),
        admin: AdminArgs::default(),
        gateway: GatewayArgs::default(),
        lifecycle: LifecycleArgs {
            state_dir: Some(state.path().into()),
            max_stale: Some(Duration::from_secs(1)),
            ..Default::default()
        },
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
    .unwrap();
    let started = Instant::now();
    assert_eq!(app.cache.registry(&down).unwrap().0.endpoints, 2);
    while !app.cache.registry(&down).unwrap().0.status.withdrawn {
        assert!(started.elapsed() < Duration::from_secs(5), "not withdrawn");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let withdrawn = started.elapsed();
    let (report, services) = app.cache.registry(&down).unwrap();
    assert_eq!(report.endpoints, 0);
    assert_eq!(services["web.service.consul"].ports[0].number, 8080, "the service stays, without endpoints");
    let (_, r) = get(app.admin_addr, "/v1/registries/down").await;
    assert_eq!(r["withdrawn"], true);
    assert!(withdrawn >= Duration::from_millis(900), "{withdrawn:?}");
    println!("max-stale 1s: withdrawn after {withdrawn:?}");
    app.stop().await;
}
