//! The registries under test, filled with `n` services × `per` instances,
//! and the two things the bench does to them: remove one instance, and
//! watch that service as a bare client of the registry would.
//!
//! Every HTTP client here keeps no idle connection, so that the harness
//! holds as few connections to the registry as it can (Consul counts them
//! per client address, meshbridge's included).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::task::JoinHandle;
use zookeeper_client as zk;

use super::consul::ConsulDev;
use crate::nacos::Rnacos;
use crate::netns::Host;
use crate::zookeeper::{ZooKeeper, dubbo_node_name};

/// Concurrent registrations while filling a registry. Every harness call
/// to Consul opens a connection and closes it after the answer (no idle
/// pool), so the harness holds at most this many connections, plus one
/// bare-client watch and one peer call, from the address meshbridge uses:
/// with meshbridge's cap of 8, at most 42 of Consul's default 200 per client.
const FILL_CONCURRENCY: usize = 32;
/// Operations per Consul `/v1/txn` call: Consul's limit.
const CONSUL_TXN_OPS: usize = 64;
/// Per-call limit for the harness's own registry calls.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// ZooKeeper's heap for the benches: a base, and about 1.5 KB a node.
pub const ZK_HEAP_BASE_MB: usize = 256;
pub const ZK_HEAP_PER_1K_INSTANCES_MB: usize = 2;
/// The benches' ZooKeeper sessions (and the server's cap on them).
const ZK_BENCH_SESSION: Duration = Duration::from_secs(30);
/// How often the bare Nacos client polls the instance list.
const NACOS_POLL: Duration = Duration::from_millis(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Consul,
    /// rnacos watched over gRPC (`type: nacos2`).
    Nacos,
    /// rnacos watched over the 1.x HTTP open API (`type: nacos`): it polls,
    /// so a change waits for the next refresh (30 s); run it with
    /// `--changes 0` for its sync figures.
    NacosHttp,
    Zookeeper,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "consul" => Some(Kind::Consul),
            "nacos" => Some(Kind::Nacos),
            "nacos1" => Some(Kind::NacosHttp),
            "zookeeper" | "zk" => Some(Kind::Zookeeper),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Consul => "consul",
            Kind::Nacos => "nacos",
            Kind::NacosHttp => "nacos1",
            Kind::Zookeeper => "zookeeper",
        }
    }

    /// What the bare client does, for the table's notes.
    pub fn bare_client(self) -> &'static str {
        match self {
            Kind::Consul => "blocking query on /v1/health/service/<svc>?passing",
            Kind::Nacos | Kind::NacosHttp => "HTTP poll of /nacos/v1/ns/instance/list every 2 ms",
            Kind::Zookeeper => "children watch on the service's providers node",
        }
    }
}

enum Server {
    Consul(ConsulDev),
    Nacos(Rnacos),
    Zookeeper(ZooKeeper, zk::Client),
}

/// A running registry with the bench's services in it.
pub struct Registry {
    pub kind: Kind,
    server: Server,
    http: reqwest::Client,
}

/// Instance `j`'s address (the same for every service: clusters differ).
fn address(j: usize) -> String {
    format!("10.1.{}.{}", j / 250, j % 250 + 1)
}

/// Address `k` in 198.18.0.0/15 (RFC 2544's benchmarking block: nothing
/// answers there), for the scale benches' instances.
pub fn benchmark_address(k: usize) -> String {
    format!("198.{}.{}.{}", 18 + (k >> 16) % 2, (k >> 8) & 255, k & 255)
}

fn service(i: usize) -> String {
    format!("svc-{i}")
}

fn dubbo_url(i: usize, j: usize) -> String {
    format!("dubbo://{}:20880/com.bench.Svc{i}?version=1.0.0&application=bench&side=provider", address(j))
}

fn dubbo_providers(i: usize) -> String {
    format!("/dubbo/com.bench.Svc{i}/providers")
}

pub fn no_pool_client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).timeout(CALL_TIMEOUT).build().expect("reqwest client")
}

/// Run `job(k)` for every `k` in `0..total`, `concurrency` at a time.
pub async fn bounded<F, Fut>(total: usize, concurrency: usize, job: F) -> anyhow::Result<()>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let job = Arc::new(job);
    let workers: Vec<JoinHandle<anyhow::Result<()>>> = (0..concurrency)
        .map(|_| {
            let (next, job) = (next.clone(), job.clone());
            tokio::spawn(async move {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= total {
                        return Ok(());
                    }
                    job(k).await?;
                }
            })
        })
        .collect();
    for w in workers {
        w.await??;
    }
    Ok(())
}

impl Registry {
    pub async fn start(kind: Kind) -> anyhow::Result<Registry> {
        Registry::start_sized(kind, 0).await
    }

    /// [`Registry::start`] for a catalog of `instances`: ZooKeeper gets a
    /// heap of [`ZK_HEAP_BASE_MB`] plus [`ZK_HEAP_PER_1K_INSTANCES_MB`] per
    /// thousand instances (1.1M nodes at 100k × 10 do not fit the tests'
    /// 256 MiB), and sessions of up to 30 s, so that a collection pause of
    /// the server on a big tree does not expire the sessions.
    pub async fn start_sized(kind: Kind, instances: usize) -> anyhow::Result<Registry> {
        let server = match kind {
            Kind::Consul => Server::Consul(ConsulDev::start().await?),
            Kind::Nacos | Kind::NacosHttp => Server::Nacos(Rnacos::start().await?),
            Kind::Zookeeper => {
                let heap = ZK_HEAP_BASE_MB + instances.div_ceil(1000) * ZK_HEAP_PER_1K_INSTANCES_MB;
                let zk = ZooKeeper::start_sized(Host::loopback(), ZK_BENCH_SESSION, heap).await?;
                let client = zk::Client::connector()
                    .with_session_timeout(ZK_BENCH_SESSION)
                    .connect(&zk.addr())
                    .await
                    .context("connect to zookeeper")?;
                Server::Zookeeper(zk, client)
            }
        };
        Ok(Registry { kind, server, http: no_pool_client() })
    }

    /// The Consul agent, for the peer comparison.
    pub fn consul(&self) -> Option<&ConsulDev> {
        match &self.server {
            Server::Consul(c) => Some(c),
            _ => None,
        }
    }

    /// Ports meshbridge may connect to.
    pub fn ports(&self) -> Vec<u16> {
        match &self.server {
            Server::Consul(c) => vec![c.http_port],
            Server::Nacos(n) => vec![n.http_port, n.grpc_port()],
            Server::Zookeeper(z, _) => vec![z.port],
        }
    }

    /// The McpBridge registry entry, with the registry's default settings.
    pub fn bridge_entry(&self) -> String {
        let (kind, port, extra) = match &self.server {
            Server::Consul(c) => ("consul", c.http_port, "      consulDatacenter: dc1\n"),
            Server::Nacos(n) if self.kind == Kind::NacosHttp => ("nacos", n.http_port, ""),
            Server::Nacos(n) => ("nacos2", n.http_port, ""),
            Server::Zookeeper(z, _) => ("zookeeper", z.port, ""),
        };
        format!("    - type: {kind}\n      name: bench\n      domain: 127.0.0.1\n      port: {port}\n{extra}")
    }

    /// Register `n` services × `per` instances, in parallel.
    pub async fn fill(&self, n: usize, per: usize) -> anyhow::Result<()> {
        match &self.server {
            Server::Consul(c) => {
                let (http, url) = (self.http.clone(), c.url());
                for j in 0..per {
                    let node = serde_json::json!({ "Node": format!("node-{j}"), "Address": address(j) });
                    send(http.put(format!("{url}/v1/catalog/register")).json(&node)).await?;
                }
                // Instances in `/v1/txn` batches of Consul's maximum, 64
                // operations: one raft write per batch instead of per instance.
                let batches = (n * per).div_ceil(CONSUL_TXN_OPS);
                bounded(batches, FILL_CONCURRENCY, move |b| {
                    let ops: Vec<serde_json::Value> = (b * CONSUL_TXN_OPS..((b + 1) * CONSUL_TXN_OPS).min(n * per))
                        .map(|k| {
                            let (i, j) = (k / per, k % per);
                            serde_json::json!({ "Service": { "Verb": "set", "Node": format!("node-{j}"),
                                "Service": { "ID": format!("svc-{i}-{j}"), "Service": service(i), "Port": 8080 } } })
                        })
                        .collect();
                    send(http.put(format!("{url}/v1/txn")).json(&ops))
                })
                .await
            }
            Server::Nacos(r) => {
                let (http, url) = (self.http.clone(), r.url());
                bounded(n * per, FILL_CONCURRENCY, move |k| {
                    let (i, j) = (k / per, k % per);
                    send(http.post(format!("{url}/nacos/v1/ns/instance")).query(&nacos_params(i, j)))
                })
                .await
            }
            Server::Zookeeper(_, client) => {
                let client = client.clone();
                // A worker per service: parents first, then its providers.
                bounded(n, FILL_CONCURRENCY, move |i| {
                    let client = client.clone();
                    async move {
                        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                        let parent = dubbo_providers(i);
                        client.mkdir(&parent, &options).await.with_context(|| format!("mkdir {parent}"))?;
                        for j in 0..per {
                            let path = format!("{parent}/{}", dubbo_node_name(&dubbo_url(i, j)));
                            client.create(&path, b"", &options).await.with_context(|| format!("create {path}"))?;
                        }
                        Ok(())
                    }
                })
                .await
            }
        }
    }

    /// Arm a bare client's watch on service `i`: the task ends at the moment
    /// the registry tells that client the service changed (`None` if it
    /// failed or saw nothing within `limit`).
    pub async fn watch(&self, i: usize, limit: Duration) -> JoinHandle<Option<Instant>> {
        match &self.server {
            Server::Consul(c) => {
                let url = format!("{}/v1/health/service/{}?passing", c.url(), service(i));
                let http = self.http.clone();
                let index = consul_index(&http, &url).await;
                tokio::spawn(async move {
                    let index = index?;
                    let wait = limit.as_secs().max(1);
                    let req = http.get(format!("{url}&index={index}&wait={wait}s")).timeout(limit + CALL_TIMEOUT);
                    let resp = req.send().await.ok()?;
                    let at = Instant::now();
                    let changed = resp.headers().get("x-consul-index")?.to_str().ok()? != index;
                    changed.then_some(at)
                })
            }
            Server::Nacos(r) => {
                let url = format!("{}/nacos/v1/ns/instance/list?serviceName={}", r.url(), service(i));
                let http = self.http.clone();
                tokio::spawn(async move {
                    let before = nacos_hosts(&http, &url).await?;
                    let deadline = Instant::now() + limit;
                    while Instant::now() < deadline {
                        tokio::time::sleep(NACOS_POLL).await;
                        if nacos_hosts(&http, &url).await.is_some_and(|n| n != before) {
                            return Some(Instant::now());
                        }
                    }
                    None
                })
            }
            Server::Zookeeper(_, client) => {
                let watch = client.get_and_watch_children(&dubbo_providers(i)).await;
                tokio::spawn(async move {
                    let (_, _, watcher) = watch.ok()?;
                    tokio::time::timeout(limit, watcher.changed()).await.ok()?;
                    Some(Instant::now())
                })
            }
        }
    }

    /// Change number `k`: remove one instance of one service. Returns the
    /// service's index. Changes walk the services first, so the first `n`
    /// changes touch `n` different services.
    pub async fn change(&self, k: usize, n: usize, per: usize) -> anyhow::Result<usize> {
        let (i, j) = (k % n, (k / n) % per);
        self.set_instance(i, j, false).await?;
        Ok(i)
    }

    /// Add instance `j` of service `i` back as [`Registry::fill`] made it
    /// (`present`), or remove it.
    pub async fn set_instance(&self, i: usize, j: usize, present: bool) -> anyhow::Result<()> {
        match (&self.server, present) {
            (Server::Consul(c), false) => {
                let body = serde_json::json!({ "Node": format!("node-{j}"), "ServiceID": format!("svc-{i}-{j}") });
                send(self.http.put(format!("{}/v1/catalog/deregister", c.url())).json(&body)).await?;
            }
            (Server::Consul(c), true) => {
                let body = serde_json::json!([{ "Service": { "Verb": "set", "Node": format!("node-{j}"),
                    "Service": { "ID": format!("svc-{i}-{j}"), "Service": service(i), "Port": 8080 } } }]);
                send(self.http.put(format!("{}/v1/txn", c.url())).json(&body)).await?;
            }
            (Server::Nacos(r), false) => {
                send(self.http.delete(format!("{}/nacos/v1/ns/instance", r.url())).query(&nacos_params(i, j))).await?
            }
            (Server::Nacos(r), true) => {
                send(self.http.post(format!("{}/nacos/v1/ns/instance", r.url())).query(&nacos_params(i, j))).await?
            }
            (Server::Zookeeper(_, client), false) => {
                let path = format!("{}/{}", dubbo_providers(i), dubbo_node_name(&dubbo_url(i, j)));
                client.delete(&path, None).await.with_context(|| format!("delete {path}"))?;
            }
            (Server::Zookeeper(_, client), true) => {
                let path = format!("{}/{}", dubbo_providers(i), dubbo_node_name(&dubbo_url(i, j)));
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                client.create(&path, b"", &options).await.with_context(|| format!("create {path}"))?;
            }
        }
        Ok(())
    }
}

fn nacos_params(i: usize, j: usize) -> Vec<(&'static str, String)> {
    vec![
        ("serviceName", service(i)),
        ("ip", address(j)),
        ("port", "8080".into()),
        ("ephemeral", "false".into()),
        ("healthy", "true".into()),
        ("enabled", "true".into()),
        ("weight", "1".into()),
    ]
}

async fn send(req: reqwest::RequestBuilder) -> anyhow::Result<()> {
    let resp = req.send().await?;
    let status = resp.status();
    if !status.is_success() {
        bail!("{status}: {}", resp.text().await.unwrap_or_default());
    }
    Ok(())
}

async fn consul_index(http: &reqwest::Client, url: &str) -> Option<String> {
    let resp = http.get(url).send().await.ok()?;
    resp.headers().get("x-consul-index")?.to_str().ok().map(String::from)
}

async fn nacos_hosts(http: &reqwest::Client, url: &str) -> Option<usize> {
    let body: serde_json::Value = http.get(url).send().await.ok()?.json().await.ok()?;
    Some(body.get("hosts")?.as_array()?.len())
}

/// Wait until `pred` holds, polling every `every`, for at most `limit`.
pub async fn poll_until(limit: Duration, every: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if pred() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}
