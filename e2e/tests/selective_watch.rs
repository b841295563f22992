//! Selective watch (`meshbridgeWatch: {mode: referenced}`) end to end, with
//! meshbridge in-process against real Consul and real rnacos (Nacos 1.x HTTP
//! API): of 50 registered services only the two an Ingress names are read
//! and served; an Ingress naming a third makes it appear within seconds,
//! without restarting the watcher, dropping the other two or reading them
//! again.
//!
//! What the watcher reads is counted by a relay in front of the registry
//! that records every request line (`meshbridge_e2e::request_log`).
//!
//! Over Nacos gRPC (`nacos2`, on the real Nacos 3.1 server) and Eureka (the
//! real server), whose reads a relay cannot count, the served set is what
//! is checked: only the referenced services, a new reference served within
//! seconds while the others never leave, a dropped one gone.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshbridge::cache::{Cache, RegistryKey};
use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::eureka::{EurekaServer, instance};
use meshbridge_e2e::nacos::{Flavor, Instance, Options, Rnacos};
use meshbridge_e2e::nacos_server::Target;
use meshbridge_e2e::request_log::RequestLog;
use meshbridge_registries::RegistryKind;
use serde_json::json;

const SERVICES: usize = 50;
/// How soon a newly referenced service must be served.
const APPEAR_WITHIN: Duration = Duration::from_secs(5);

fn bridge(registry: &str) -> String {
    format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n{registry}"
    )
}

/// An Ingress routing `/{name}` to the registry service `host`.
fn ingress(name: &str, host: &str) -> String {
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {name}
  namespace: shop
  annotations:
    higress.io/destination: {host}
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /{name}
            pathType: Prefix
            backend:
              resource: {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }}
"#
    )
}

fn served(cache: &Cache, key: &RegistryKey) -> BTreeSet<String> {
    cache.registry_services(key).map(|s| s.into_keys().collect()).unwrap_or_default()
}

fn set(hosts: &[&String]) -> BTreeSet<String> {
    hosts.iter().map(|h| h.to_string()).collect()
}

async fn wait_served(cache: &Cache, key: &RegistryKey, want: &BTreeSet<String>, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let now = served(cache, key);
        if &now == want {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "served {now:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The scenario, for any registry: `hosts[i]` is the host of service `s{i}`;
/// `read` lists the service names the watcher read since the log was last
/// cleared. Returns how long the third service took to appear, and whether
/// a full sync (a snapshot) happened meanwhile.
async fn only_referenced_are_read_and_served(
    registry_yaml: String,
    key: RegistryKey,
    hosts: Vec<String>,
    log: &RequestLog,
    read: impl Fn(&RequestLog) -> BTreeSet<String>,
) -> (Duration, bool) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bridge.yaml"), bridge(&registry_yaml)).unwrap();
    std::fs::write(dir.path().join("ing-1.yaml"), ingress("one", &hosts[1])).unwrap();
    std::fs::write(dir.path().join("ing-2.yaml"), ingress("two", &hosts[2])).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.unwrap();

    let two = set(&[&hosts[1], &hosts[2]]);
    wait_served(&app.cache, &key, &two, Duration::from_secs(30)).await;
    // Settle past the first sync: nothing else shows up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(served(&app.cache, &key), two, "only the referenced services are served");
    let names = read(log);
    assert_eq!(names, ["s1", "s2"].map(String::from).into(), "only the referenced services are read");
    let synced = app.cache.statuses().iter().find(|(k, ..)| *k == key).unwrap().1.last_sync_time;

    // Reference a third: it appears within seconds; the two never leave.
    log.clear();
    let three = set(&[&hosts[1], &hosts[2], &hosts[3]]);
    let (cache, k, two_kept) = (app.cache.clone(), key.clone(), two.clone());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let sampler = tokio::spawn(async move {
        let mut dropped = 0;
        while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
            if !served(&cache, &k).is_superset(&two_kept) {
                dropped += 1;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        dropped
    });
    std::fs::write(dir.path().join("ing-3.yaml"), ingress("three", &hosts[3])).unwrap();
    let took = wait_served(&app.cache, &key, &three, APPEAR_WITHIN + Duration::from_secs(5)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(sampler.await.unwrap(), 0, "a referenced service left while the selection changed");
    let names = read(log);
    assert_eq!(names, ["s3".to_string()].into(), "only the newly referenced service is read");
    let status = app.cache.statuses().into_iter().find(|(k, ..)| *k == key).unwrap().1;
    assert!(status.ready, "{status:?}");
    let resynced = status.last_sync_time != synced;

    // Drop a reference: that service goes, the others stay.
    std::fs::remove_file(dir.path().join("ing-1.yaml")).unwrap();
    wait_served(&app.cache, &key, &set(&[&hosts[2], &hosts[3]]), Duration::from_secs(15)).await;
    app.stop().await;
    (took, resynced)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consul_reads_and_serves_only_referenced_services() {
    let consul = Consul::start().await.expect("start consul");
    for i in 0..SERVICES {
        let svc = json!({"ID": format!("s{i}"), "Service": format!("s{i}"), "Port": 9000 + i});
        consul.catalog_register(json!({"Node": "n1", "Address": "127.0.0.1", "Service": svc})).await.unwrap();
    }
    let log = RequestLog::start(consul.http_port).await.unwrap();
    let registry = format!(
        "    - type: consul\n      name: local\n      domain: 127.0.0.1\n      port: {}\n      \
         consulDatacenter: dc1\n      meshbridgeWatch: {{ mode: referenced }}\n",
        log.port
    );
    let hosts: Vec<String> = (0..4).map(|i| format!("s{i}.dc1.consul")).collect();
    let key = RegistryKey::new(RegistryKind::Consul, "local");
    let read = |log: &RequestLog| -> BTreeSet<String> {
        let paths = log.paths_under("/v1/health/service/");
        paths.iter().map(|p| p.trim_start_matches("/v1/health/service/").to_string()).collect()
    };
    let (took, resynced) = only_referenced_are_read_and_served(registry, key, hosts, &log, read).await;
    println!("consul: a newly referenced service served after {took:?}");
    // A restarted watcher would start with a full sync; a new selection is
    // a targeted read.
    assert!(!resynced, "the watcher resynced (or restarted) for a new selection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_reads_and_serves_only_referenced_services() {
    let nacos = Rnacos::start().await.expect("start rnacos");
    for i in 0..SERVICES {
        nacos.register(&Instance::new(&format!("s{i}"), "127.0.0.1", 9000 + i as u16)).await.unwrap();
    }
    let log = RequestLog::start(nacos.http_port).await.unwrap();
    let registry = format!(
        "    - type: nacos\n      name: local\n      domain: 127.0.0.1\n      port: {}\n      \
         meshbridgeWatch: {{ mode: referenced }}\n",
        log.port
    );
    let hosts: Vec<String> = (0..4).map(|i| format!("s{i}.DEFAULT-GROUP.public.nacos")).collect();
    let key = RegistryKey::new(RegistryKind::Nacos, "local");
    let read = |log: &RequestLog| -> BTreeSet<String> {
        let lines = log.lines();
        let reads = lines.iter().filter(|l| l.contains("/nacos/v1/ns/instance/list?"));
        reads
            .filter_map(|l| {
                let query = l.split_once('?')?.1;
                let name = query.split('&').find_map(|kv| kv.strip_prefix("serviceName="))?;
                Some(name.rsplit("%40%40").next().unwrap_or(name).to_string())
            })
            .collect()
    };
    let (took, _) = only_referenced_are_read_and_served(registry, key, hosts, &log, read).await;
    println!("nacos: a newly referenced service served after {took:?}");
}

/// The served-set half of the scenario, for registries whose reads are not
/// counted: `hosts[i]` is service `s{i}`'s host.
async fn only_referenced_are_served(registry_yaml: String, key: RegistryKey, hosts: Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bridge.yaml"), bridge(&registry_yaml)).unwrap();
    std::fs::write(dir.path().join("ing-1.yaml"), ingress("one", &hosts[1])).unwrap();
    std::fs::write(dir.path().join("ing-2.yaml"), ingress("two", &hosts[2])).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.unwrap();
    let two = set(&[&hosts[1], &hosts[2]]);
    wait_served(&app.cache, &key, &two, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(served(&app.cache, &key), two, "only the referenced services are served");

    std::fs::write(dir.path().join("ing-3.yaml"), ingress("three", &hosts[3])).unwrap();
    let three = set(&[&hosts[1], &hosts[2], &hosts[3]]);
    let (cache, k, two_kept) = (app.cache.clone(), key.clone(), two.clone());
    let deadline = Instant::now() + APPEAR_WITHIN + Duration::from_secs(5);
    loop {
        let now = served(&cache, &k);
        assert!(now.is_superset(&two_kept), "a referenced service left while the selection changed: {now:?}");
        if now == three {
            break;
        }
        assert!(Instant::now() < deadline, "served {now:?}, want {three:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    std::fs::remove_file(dir.path().join("ing-1.yaml")).unwrap();
    wait_served(&app.cache, &key, &set(&[&hosts[2], &hosts[3]]), Duration::from_secs(15)).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_grpc_serves_only_referenced_services() {
    let server = Target::start(Flavor::Nacos, Options::default()).await.expect("start the server");
    for i in 0..SERVICES {
        server.register(&server.instance(&format!("s{i}"), "127.0.0.1", 9000 + i as u16)).await.unwrap();
    }
    let registry = format!(
        "    - type: nacos2\n      name: local\n      domain: 127.0.0.1\n      port: {}\n      \
         nacosNamespaceId: {}\n      meshbridgeWatch: {{ mode: referenced }}\n",
        server.http_port, server.namespace
    );
    let hosts: Vec<String> = (0..4).map(|i| server.host(&format!("s{i}"), "DEFAULT_GROUP")).collect();
    only_referenced_are_served(registry, RegistryKey::new(RegistryKind::Nacos2, "local"), hosts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eureka_serves_only_referenced_apps() {
    let eureka = EurekaServer::start().await.expect("start eureka");
    for i in 0..SERVICES {
        let app = format!("S{i}");
        eureka.api.register(instance(&app, &format!("s{i}-1"), "127.0.0.1", 9000 + i as u16, "UP")).await.unwrap();
    }
    let registry = format!(
        "    - type: eureka\n      name: local\n      domain: 127.0.0.1\n      port: {}\n      \
         meshbridgeWatch: {{ mode: referenced }}\n",
        eureka.port
    );
    let hosts: Vec<String> = (0..4).map(|i| format!("s{i}.eureka")).collect();
    only_referenced_are_served(registry, RegistryKey::new(RegistryKind::Eureka, "local"), hosts).await;
}
