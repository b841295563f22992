//! A Consul 1.8 dev agent for the bench: like [`crate::consul::Consul`],
//! but with its DNS interface on (the peer Envoy resolves services there)
//! and with Consul's default limits, `limits.http_max_conns_per_client`
//! = 200 included.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::process::{ChildGuard, binary_from_env, free_port};

pub struct ConsulDev {
    pub http_port: u16,
    pub dns_port: u16,
    http: reqwest::Client,
    guard: ChildGuard,
    _dir: TempDir,
}

impl ConsulDev {
    pub async fn start() -> anyhow::Result<ConsulDev> {
        let bin = binary_from_env("MESHBRIDGE_CONSUL_BIN")?;
        let dir = tempfile::Builder::new().prefix("meshbridge-bench-consul-").tempdir()?;
        let (http_port, dns_port) = (free_port(), free_port());
        let mut cmd = Command::new(bin);
        cmd.args(["agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1", "-log-level", "warn"])
            .args(["-grpc-port", "-1", "-serf-wan-port", "-1"])
            .args(["-http-port", &http_port.to_string(), "-dns-port", &dns_port.to_string()])
            .args(["-serf-lan-port", &free_port().to_string(), "-server-port", &free_port().to_string()])
            .arg("-data-dir")
            .arg(dir.path().join("data"))
            .args(["-node", "bench-agent"]);
        let guard = ChildGuard::spawn("consul", cmd, dir.path().join("consul.log"))?;
        let mut consul = ConsulDev { http_port, dns_port, http: super::registry::no_pool_client(), guard, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if !consul.guard.is_running() {
                bail!("consul exited during startup:\n{}", consul.guard.log());
            }
            if consul.has_leader().await {
                return Ok(consul);
            }
            ensure!(Instant::now() < deadline, "consul not ready:\n{}", consul.guard.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// The agent's process id, to read its CPU from `/proc`.
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    async fn has_leader(&self) -> bool {
        match self.http.get(format!("{}/v1/status/leader", self.url())).send().await {
            Ok(r) if r.status().is_success() => r.json::<String>().await.is_ok_and(|l| !l.is_empty()),
            _ => false,
        }
    }

    /// `PUT path` with an optional JSON body; errors carry Consul's answer.
    pub async fn put(&self, path: &str, body: Option<serde_json::Value>) -> anyhow::Result<()> {
        let mut req = self.http.put(format!("{}{path}", self.url()));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await?;
        let status = resp.status();
        ensure!(status.is_success(), "PUT {path}: {status}: {}", resp.text().await.unwrap_or_default());
        Ok(())
    }
}

/// Instances per service in a [`fill`]ed catalog: instance `j` of every
/// service is on `node-j`, at that node's address (`10.1.0.{j+1}`).
pub const PER: usize = 10;
/// Operations per `/v1/txn` call (Consul's limit is 64).
const TXN_OPS: usize = 64;

/// The `/v1/txn` operations that register instance `j` of `svc-i` (and its
/// check, with `status`, when `checks`).
pub fn instance_ops(i: usize, j: usize, checks: bool, status: &str) -> Vec<Value> {
    let mut ops = vec![json!({"Service": {"Verb": "set", "Node": format!("node-{j}"),
        "Service": {"ID": format!("svc-{i}-{j}"), "Service": format!("svc-{i}"), "Port": 8080}}})];
    if checks {
        ops.push(check_op(i, j, status));
    }
    ops
}

/// The `/v1/txn` operation that sets the check of instance `j` of `svc-i`.
pub fn check_op(i: usize, j: usize, status: &str) -> Value {
    json!({"Check": {"Verb": "set", "Check": {"Node": format!("node-{j}"), "CheckID": format!("chk-{i}-{j}"),
        "Name": "bench", "Status": status, "ServiceID": format!("svc-{i}-{j}"), "ServiceName": format!("svc-{i}")}}})
}

impl ConsulDev {
    /// Register `n` services × [`PER`] instances on `PER + 1` nodes (one
    /// spare), each instance with a passing check when `checks`, through
    /// `/v1/txn`, eight calls at a time (far under Consul's 200 connections
    /// per client).
    pub async fn fill(&self, n: usize, checks: bool) -> anyhow::Result<()> {
        for j in 0..=PER {
            let node = json!({"Node": format!("node-{j}"), "Address": format!("10.1.0.{}", j + 1)});
            self.put("/v1/catalog/register", Some(node)).await?;
        }
        let ops: Vec<Value> =
            (0..n).flat_map(|i| (0..PER).flat_map(move |j| instance_ops(i, j, checks, "passing"))).collect();
        let batches: Vec<Value> = ops.chunks(TXN_OPS).map(|c| Value::from(c.to_vec())).collect();
        for group in batches.chunks(8) {
            let mut set = tokio::task::JoinSet::new();
            for body in group {
                let (http, url, body) = (self.http.clone(), self.url(), body.clone());
                set.spawn(async move {
                    let resp = http.put(format!("{url}/v1/txn")).json(&body).send().await?;
                    let status = resp.status();
                    ensure!(status.is_success(), "PUT /v1/txn: {status}: {}", resp.text().await.unwrap_or_default());
                    Ok(())
                });
            }
            while let Some(done) = set.join_next().await {
                done??;
            }
        }
        Ok(())
    }
}
