//! Issue 24: randomized bursts against a real ZooKeeper 3.8, watched by
//! meshbridge in-process; after each burst meshbridge's view of every
//! service (admin API) must equal what ZooKeeper holds, read directly.
//!
//! Operations, 1–8 a burst, back to back: Dubbo providers created and
//! deleted across 10 interfaces (two versions, two groups: several hosts per
//! interface), persistent or ephemeral in one of three test sessions;
//! provider URL edits (Dubbo re-registers under a new node name: weight,
//! `enabled`/`disabled`, a `rev` parameter); whole interfaces deleted; a
//! session closed (its ephemeral providers and instances go together, and a
//! new session takes its place); Spring Cloud (Curator) instances under
//! `/services/<name>/<id>` added, edited in place (`instance_status`, a `rev`
//! metadata label) and deleted, and whole Spring services deleted.
//!
//! The ZooKeeper watcher has no McpBridge field for its period: in-process
//! it verifies every 30 s and re-reads everything every 300 s. The deadline
//! per burst (3 s) is far below that. The bursts are spread over about 35 s
//! so that the first verify runs among them: any difference it corrects
//! that no watch event announced counts in
//! `meshbridge_registry_drift_corrected_total`, asserted 0 at the end.
//!
//! Envoy's EDS (admin `/clusters`) is compared at the end, with 30 s
//! allowed: after a burst that adds a cluster and removes it again while
//! Envoy is warming it, Envoy waits for that cluster's endpoints, which
//! meshbridge no longer has, until its `initial_fetch_timeout` (15 s), and
//! meanwhile does not ACK the CDS response, which holds meshbridge's next
//! CDS push (one response per type in flight). The figure is printed.
//!
//! Seeded: see `meshbridge_e2e::convergence`. Needs
//! `source e2e/env.sh zookeeper envoy` (MESHBRIDGE_ZK_JAR, MESHBRIDGE_ENVOY_BIN).

use std::time::Duration;

use meshbridge_e2e::convergence::{self, AdminView, Options, REV, Registry, Rng, Truth, endpoint_rev};
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::netns::Host;
use meshbridge_e2e::traffic;
use meshbridge_e2e::zookeeper::{ZkClient, ZooKeeper, dubbo_node_name};
use serde_json::{Value, json};
use zookeeper_client as zk;

const INTERFACES: usize = 10;
const SPRING_SERVICES: usize = 5;
const SESSIONS: usize = 3;
const VPORT: u16 = 20880;
/// Sessions of the server and of the test's own clients. No session is
/// left to expire here (a provider session is closed), and a 3 s session
/// fails the writer when the JVM pauses for 1.2 s on a loaded machine.
const SESSION: Duration = Duration::from_secs(10);
fn interface(i: usize) -> String {
    format!("com.example.conv.Svc{i}")
}

fn spring(i: usize) -> String {
    format!("conv-app{i}")
}

#[derive(Debug, Clone)]
struct Provider {
    iface: usize,
    path: String,
    port: u16,
    version: &'static str,
    group: &'static str,
    /// `None`: persistent, else the test session holding it (ephemeral).
    session: Option<usize>,
}

#[derive(Debug, Clone)]
struct Instance {
    service: usize,
    path: String,
    port: u16,
    session: Option<usize>,
}

/// The URLs are there to be printed with a failing burst.
#[derive(Debug)]
#[allow(dead_code)]
enum Op {
    AddProvider {
        provider: Provider,
        url: String,
    },
    RemoveProvider {
        path: String,
    },
    /// Delete one provider node and register it again under a new URL.
    EditProvider {
        old: String,
        provider: Provider,
        url: String,
    },
    RemoveInterface {
        iface: usize,
    },
    CloseSession {
        session: usize,
    },
    AddInstance {
        instance: Instance,
        data: String,
    },
    EditInstance {
        path: String,
        data: String,
    },
    RemoveInstance {
        path: String,
    },
    RemoveSpringService {
        service: usize,
    },
}

struct Zk {
    addr: String,
    /// Persistent writes and the truth reads.
    admin: ZkClient,
    sessions: Vec<ZkClient>,
    providers: Vec<Provider>,
    instances: Vec<Instance>,
    next_port: u16,
    next_id: u64,
}

fn provider_url(p: &Provider, rng: &mut Rng) -> String {
    let mut url = format!(
        "dubbo://127.0.0.1:{}/{}?application=conv&side=provider&version={}",
        p.port,
        interface(p.iface),
        p.version
    );
    if !p.group.is_empty() {
        url.push_str(&format!("&group={}", p.group));
    }
    if rng.chance(0.5) {
        url.push_str(&format!("&weight={}", rng.range(1, 9)));
    }
    match rng.index(8) {
        0 => url.push_str("&enabled=false"),
        1 => url.push_str("&disabled=true"),
        _ => {}
    }
    url.push_str(&format!("&rev={}", rng.index(1000)));
    url
}

fn curator(service: usize, id: &str, port: u16, rng: &mut Rng) -> String {
    let status = *rng.pick(&["UP", "UP", "UP", "OUT_OF_SERVICE"]).expect("not empty");
    json!({
        "name": spring(service), "id": id, "address": "127.0.0.1", "port": port, "sslPort": null,
        "payload": {"@class": "org.springframework.cloud.zookeeper.discovery.ZookeeperInstance",
                    "id": spring(service), "name": spring(service),
                    "metadata": {"instance_status": status, "rev": rng.index(1000).to_string()}},
        "registrationTimeUTC": 0, "serviceType": "DYNAMIC",
    })
    .to_string()
}

impl Zk {
    fn port(&mut self) -> u16 {
        self.next_port += 1;
        self.next_port
    }

    fn session_for(&self, session: Option<usize>) -> &ZkClient {
        session.map_or(&self.admin, |s| &self.sessions[s])
    }

    fn new_provider(&mut self, rng: &mut Rng) -> Provider {
        let iface = rng.index(INTERFACES);
        let port = self.port();
        let path = String::new();
        let version = *rng.pick(&["1.0.0", "2.0.0"]).expect("not empty");
        let group = *rng.pick(&["", "", "blue"]).expect("not empty");
        let session = rng.chance(0.6).then(|| rng.index(SESSIONS));
        Provider { iface, path, port, version, group, session }
    }

    async fn create(&self, path: &str, data: &[u8], session: Option<usize>) -> anyhow::Result<()> {
        let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        let (parent, _) = path.rsplit_once('/').expect("absolute path");
        self.admin.zk().mkdir(parent, &persistent).await?;
        match session {
            None => self.admin.put(path, data).await,
            Some(s) => {
                let ephemeral = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
                self.sessions[s].zk().create(path, data, &ephemeral).await?;
                Ok(())
            }
        }
    }

    async fn delete(&self, path: &str) -> anyhow::Result<()> {
        match self.admin.zk().delete(path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn children(&self, path: &str) -> anyhow::Result<Vec<String>> {
        match self.admin.zk().list_children(path).await {
            Ok(c) => Ok(c),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Registry for Zk {
    type Op = Op;

    fn next_op(&mut self, rng: &mut Rng) -> Op {
        loop {
            let op = match rng.index(20) {
                0..=5 => {
                    let mut provider = self.new_provider(rng);
                    let url = provider_url(&provider, rng);
                    provider.path = format!("/dubbo/{}/providers/{}", interface(provider.iface), dubbo_node_name(&url));
                    Op::AddProvider { provider, url }
                }
                6..=8 if !self.providers.is_empty() => {
                    let i = rng.index(self.providers.len());
                    Op::RemoveProvider { path: self.providers[i].path.clone() }
                }
                9..=10 if !self.providers.is_empty() => {
                    let i = rng.index(self.providers.len());
                    let mut provider = self.providers[i].clone();
                    let url = provider_url(&provider, rng);
                    provider.path = format!("/dubbo/{}/providers/{}", interface(provider.iface), dubbo_node_name(&url));
                    Op::EditProvider { old: self.providers[i].path.clone(), provider, url }
                }
                11 => Op::RemoveInterface { iface: rng.index(INTERFACES) },
                12 => Op::CloseSession { session: rng.index(SESSIONS) },
                13..=14 => {
                    let service = rng.index(SPRING_SERVICES);
                    self.next_id += 1;
                    let id = format!("id-{}", self.next_id);
                    let port = self.port();
                    let path = format!("/services/{}/{id}", spring(service));
                    let session = rng.chance(0.5).then(|| rng.index(SESSIONS));
                    let data = curator(service, &id, port, rng);
                    Op::AddInstance { instance: Instance { service, path, port, session }, data }
                }
                15..=16 if !self.instances.is_empty() => {
                    let i = &self.instances[rng.index(self.instances.len())];
                    let id = i.path.rsplit('/').next().unwrap_or_default().to_string();
                    let (path, data) = (i.path.clone(), curator(i.service, &id, i.port, rng));
                    Op::EditInstance { path, data }
                }
                17..=18 if !self.instances.is_empty() => {
                    Op::RemoveInstance { path: self.instances[rng.index(self.instances.len())].path.clone() }
                }
                19 => Op::RemoveSpringService { service: rng.index(SPRING_SERVICES) },
                _ => continue,
            };
            return op;
        }
    }

    async fn apply(&mut self, op: &Op) -> anyhow::Result<()> {
        match op {
            Op::AddProvider { provider, .. } => {
                self.create(&provider.path, b"", provider.session).await?;
                self.providers.push(provider.clone());
            }
            Op::RemoveProvider { path } => {
                self.delete(path).await?;
                self.providers.retain(|p| &p.path != path);
            }
            Op::EditProvider { old, provider, .. } => {
                self.delete(old).await?;
                self.providers.retain(|p| &p.path != old);
                // Two edits may give the same URL; the node is then there already.
                if !self.providers.iter().any(|p| p.path == provider.path) {
                    self.create(&provider.path, b"", provider.session).await?;
                    self.providers.push(provider.clone());
                }
            }
            Op::RemoveInterface { iface } => {
                self.admin.delete_tree(&format!("/dubbo/{}", interface(*iface))).await?;
                self.providers.retain(|p| p.iface != *iface);
            }
            Op::CloseSession { session } => {
                let fresh = ZkClient::connect_with(&self.addr, SESSION).await?;
                // Dropping the last handle sends CloseSession: ZooKeeper
                // deletes the session's ephemeral nodes together.
                drop(std::mem::replace(&mut self.sessions[*session], fresh));
                self.providers.retain(|p| p.session != Some(*session));
                self.instances.retain(|i| i.session != Some(*session));
            }
            Op::AddInstance { instance, data } => {
                self.create(&instance.path, data.as_bytes(), instance.session).await?;
                self.instances.push(instance.clone());
            }
            Op::EditInstance { path, data } => {
                let session = self.instances.iter().find(|i| &i.path == path).and_then(|i| i.session);
                match self.session_for(session).zk().set_data(path, data.as_bytes(), None).await {
                    Ok(_) | Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Op::RemoveInstance { path } => {
                self.delete(path).await?;
                self.instances.retain(|i| &i.path != path);
            }
            Op::RemoveSpringService { service } => {
                self.admin.delete_tree(&format!("/services/{}", spring(*service))).await?;
                self.instances.retain(|i| i.service != *service);
            }
        }
        Ok(())
    }

    async fn truth(&mut self) -> anyhow::Result<Truth> {
        let mut truth = Truth::new();
        for iface in self.children("/dubbo").await? {
            for node in self.children(&format!("/dubbo/{iface}/providers")).await? {
                let Some((host, key)) = dubbo_endpoint(&iface, &node) else { continue };
                convergence::push(&mut truth, &host, key);
            }
        }
        for service in self.children("/services").await? {
            let host = format!("{service}.services.zookeeper");
            for id in self.children(&format!("/services/{service}")).await? {
                let data = match self.admin.zk().get_data(&format!("/services/{service}/{id}")).await {
                    Ok((data, _)) => data,
                    Err(zk::Error::NoNode) => continue,
                    Err(e) => return Err(e.into()),
                };
                let v: Value = serde_json::from_slice(&data)?;
                let meta = &v["payload"]["metadata"];
                if meta["instance_status"].as_str().is_some_and(|s| s != "UP") {
                    continue;
                }
                let (address, port) =
                    (v["address"].as_str().unwrap_or_default(), v["port"].as_u64().unwrap_or(0) as u16);
                convergence::push(&mut truth, &host, endpoint_rev(address, port, 1, meta["rev"].as_str()));
            }
        }
        Ok(convergence::non_empty(truth))
    }
}

/// What Dubbo's provider node `node` of `iface` serves, as Higress reads
/// it: host and endpoint key, or nothing for a disabled provider.
fn dubbo_endpoint(iface: &str, node: &str) -> Option<(String, String)> {
    let url = form_decode(node);
    let rest = url.strip_prefix("dubbo://")?;
    let (authority, query) = rest.split_once('/').map(|(a, p)| (a, p.split_once('?').map_or("", |(_, q)| q)))?;
    let (address, port) = authority.rsplit_once(':')?;
    let params: Vec<(&str, &str)> = query.split('&').filter_map(|kv| kv.split_once('=')).collect();
    let get = |k: &str| params.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
    if get("enabled") == Some("false") || get("disabled") == Some("true") {
        return None;
    }
    let host =
        format!("providers:{iface}:{}:{}.zookeeper", get("version").unwrap_or("0.0.0"), get("group").unwrap_or(""));
    let weight = get("weight").and_then(|w| w.parse::<u32>().ok()).filter(|w| *w > 0).unwrap_or(1);
    Some((host, endpoint_rev(address, port.parse().ok()?, weight, get("rev"))))
}

/// Undo [`dubbo_node_name`] (Java's form encoding).
fn form_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                if let Some(b) = hex {
                    out.push(b);
                    i += 2;
                } else {
                    out.push(b'%');
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `outbound|20880||{host}` → host, for this registry's hosts.
fn cluster_host(cluster: &str) -> Option<String> {
    let host = cluster.strip_prefix(&format!("outbound|{VPORT}||"))?;
    host.ends_with(".zookeeper").then(|| host.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_bursts_converge() {
    let zk = ZooKeeper::start_with(Host::loopback(), SESSION).await.expect("start zookeeper");
    let admin = zk.client().await.unwrap();
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(zk.client().await.unwrap());
    }
    let mut registry = Zk {
        addr: zk.addr(),
        admin,
        sessions,
        providers: Vec::new(),
        instances: Vec::new(),
        next_port: 30000,
        next_id: 0,
    };
    // A first provider, so that Envoy has a route cluster to ask for.
    let mut first = Provider { iface: 0, path: String::new(), port: 30000, version: "1.0.0", group: "", session: None };
    let url = format!("dubbo://127.0.0.1:30000/{}?version=1.0.0&rev=0", interface(0));
    first.path = format!("/dubbo/{}/providers/{}", interface(0), dubbo_node_name(&url));
    registry.apply(&Op::AddProvider { provider: first, url }).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let bridge = format!(
        r#"apiVersion: networking.higress.io/v1
kind: McpBridge
metadata: {{ name: default, namespace: higress-system }}
spec:
  registries:
    - type: zookeeper
      name: zk
      domain: 127.0.0.1
      port: {port}
      vport: {{ default: {VPORT} }}
"#,
        port = zk.port
    );
    let app = traffic::start_meshbridge(dir.path(), &bridge).await.expect("start meshbridge");
    let route = format!("outbound|{VPORT}||providers:{}:1.0.0:.zookeeper", interface(0));
    let envoy = Envoy::start(app.xds_addr, AdsMode::Sotw, &route).await.expect("start envoy");

    let mut view = AdminView::new(&app, "zk", &[REV]);
    // 100 bursts take a second or two: 350 ms between them spreads them
    // over the watcher's first periodic verify (30 s), which then races them.
    let opts = Options { pause: Duration::from_millis(350), ..Options::new("zookeeper", Duration::from_secs(3)) };
    let last = convergence::run(&mut registry, &mut view, &opts).await;
    let took = match convergence::envoy_converges(&envoy, &last, cluster_host, Duration::from_secs(30)).await {
        Ok(took) => took,
        Err(e) => {
            let xdsz =
                reqwest::get(format!("http://{}/debug/xdsz", app.admin_addr)).await.unwrap().text().await.unwrap();
            panic!("{e}\nmeshbridge /debug/xdsz:\n{xdsz}");
        }
    };
    println!("FIGURE convergence zookeeper envoy_eds_after_last_burst_ms={:.1}", took.as_secs_f64() * 1e3);
}

#[test]
fn dubbo_nodes_decode_as_the_watcher_reads_them() {
    let url = "dubbo://127.0.0.1:30001/com.example.conv.Svc1?version=2.0.0&group=blue&weight=3&rev=7";
    let (host, key) = dubbo_endpoint("com.example.conv.Svc1", &dubbo_node_name(url)).unwrap();
    assert_eq!(host, "providers:com.example.conv.Svc1:2.0.0:blue.zookeeper");
    assert_eq!(key, "127.0.0.1:30001 w=3 rev=7");
    assert!(dubbo_endpoint("i", &dubbo_node_name("dubbo://127.0.0.1:1/i?enabled=false")).is_none());
    assert_eq!(form_decode("a%3Ab+c%2"), "a:b c%2");
}
