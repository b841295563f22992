//! A real Consul dev agent (`consul agent -dev`) on free loopback ports.
//!
//! [`Consul::restart`] brings the agent back on the same ports and data dir,
//! so clients reconnect to the same address. The agent reloads its services
//! and checks from the data dir, but (Consul 1.8) TTL checks come back
//! critical, and re-registering does not reset an existing check's status:
//! use [`Consul::set_ttl_check`] to make an instance pass again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tempfile::TempDir;

use crate::netns::Host;
use crate::process::{ChildGuard, binary_from_env, free_port};

const BIN_VAR: &str = "MESHBRIDGE_CONSUL_BIN";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts at a fresh start: a port picked by `free_port` can be taken by
/// another test before Consul binds it.
const START_ATTEMPTS: usize = 3;

/// A TTL check's next state, for [`Consul::set_ttl_check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckStatus {
    Pass,
    Warn,
    Fail,
}

impl CheckStatus {
    fn as_path(self) -> &'static str {
        match self {
            CheckStatus::Pass => "pass",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }
}

pub struct Consul {
    pub http_port: u16,
    /// The ACL master token when started with [`Consul::start_with_acl`].
    pub token: Option<String>,
    /// Where the agent runs and is reached (loopback unless started in a
    /// network namespace).
    pub host: Host,
    args: Vec<String>,
    http: reqwest::Client,
    guard: ChildGuard,
    dir: TempDir,
}

impl Consul {
    /// Start a dev agent and wait until it has a leader.
    pub async fn start() -> anyhow::Result<Consul> {
        Consul::start_inner(None, None, false, Host::loopback()).await
    }

    /// Start a dev agent with extra HCL configuration, e.g.
    /// `limits { http_max_conns_per_client = 10 }`.
    pub async fn start_with_hcl(hcl: &str) -> anyhow::Result<Consul> {
        Consul::start_inner(None, Some(hcl.to_string()), false, Host::loopback()).await
    }

    /// Start a single-server agent (not `-dev`) that keeps its catalog and
    /// Raft indexes in its data dir, so [`Consul::restart`] comes back with
    /// the same state, as a real cluster does.
    pub async fn start_persistent() -> anyhow::Result<Consul> {
        Consul::start_inner(None, None, true, Host::loopback()).await
    }

    /// [`Consul::start_persistent`] at `host` (e.g. in a network namespace).
    pub async fn start_persistent_at(host: Host) -> anyhow::Result<Consul> {
        Consul::start_inner(None, None, true, host).await
    }

    /// Start a dev agent with ACLs on, default policy `deny`, and `master` as
    /// the master token. The harness's own calls use that token.
    pub async fn start_with_acl(master: &str) -> anyhow::Result<Consul> {
        Consul::start_inner(Some(master.to_string()), None, false, Host::loopback()).await
    }

    async fn start_inner(
        token: Option<String>,
        hcl: Option<String>,
        persistent: bool,
        host: Host,
    ) -> anyhow::Result<Consul> {
        let bin = binary_from_env(BIN_VAR)?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new().prefix("meshbridge-consul-").tempdir()?;
            let http_port = free_port();
            let mut args = agent_args(http_port, &dir, token.as_deref(), &host);
            if let Some(hcl) = &hcl {
                args.extend(["-hcl".to_string(), hcl.clone()]);
            }
            if persistent {
                args[1] = "-server".into();
                args.extend([
                    "-bootstrap-expect".into(),
                    "1".into(),
                    "-hcl".into(),
                    "performance { raft_multiplier = 1 }".into(),
                ]);
            }
            let guard = spawn(&host, &bin, &args, &dir)?;
            // No idle connections kept: tests count the watcher's connections
            // to the agent, and the harness must not add to them. On
            // loopback it also calls from its own address, which
            // `established_to` leaves out, so a call still closing is not
            // counted either.
            let from = (host.ip == std::net::IpAddr::from([127, 0, 0, 1])).then_some(HARNESS_IP.into());
            let http = reqwest::Client::builder().pool_max_idle_per_host(0).local_address(from).build()?;
            let mut consul = Consul { http_port, token: token.clone(), host: host.clone(), args, http, guard, dir };
            match consul.wait_ready().await {
                Ok(()) => return Ok(consul),
                Err(e) => last_err = Some(e.context(format!("consul log:\n{}", consul.log()))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("consul did not start")))
    }

    /// `http://{host}:{http_port}`.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host.ip, self.http_port)
    }

    /// The agent's output so far.
    pub fn log(&self) -> String {
        self.guard.log()
    }

    /// The agent's process id (to SIGSTOP / SIGCONT it).
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    /// Kill the agent (SIGKILL): clients see connection refused.
    pub fn stop(&mut self) {
        self.guard.kill();
    }

    /// Start the agent again with the same arguments, ports and data dir.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.guard.kill();
        let bin = binary_from_env(BIN_VAR)?;
        self.guard = spawn(&self.host, &bin, &self.args, &self.dir)?;
        self.wait_ready().await.with_context(|| format!("consul log:\n{}", self.log()))
    }

    /// `PUT /v1/agent/service/register` with a service definition, e.g.
    /// `{"ID": "web-1", "Name": "web", "Port": 8080, "Check": {"CheckID": "web-1", "TTL": "60s", "Status": "passing"}}`.
    pub async fn register(&self, service: serde_json::Value) -> anyhow::Result<()> {
        self.put("/v1/agent/service/register", Some(service)).await
    }

    /// `PUT /v1/catalog/register` (a catalog entry on the agent's node,
    /// bypassing the agent's anti-entropy), e.g. `{"Node": .., "Address": ..,
    /// "Service": {..}}`.
    pub async fn catalog_register(&self, entry: serde_json::Value) -> anyhow::Result<()> {
        self.put("/v1/catalog/register", Some(entry)).await
    }

    /// ESTABLISHED TCP connections from this host to the agent's HTTP port
    /// (client side), from `/proc/net/tcp`. Counts every process on the
    /// host, so a test counts its watcher's connections while nothing else
    /// of its own talks to the agent.
    pub fn client_connections(&self) -> usize {
        established_to(self.http_port)
    }

    /// `PUT /v1/agent/service/deregister/:id`.
    pub async fn deregister(&self, id: &str) -> anyhow::Result<()> {
        self.put(&format!("/v1/agent/service/deregister/{id}"), None).await
    }

    /// `PUT /v1/agent/check/{pass,warn,fail}/:id` for a TTL check.
    pub async fn set_ttl_check(&self, check_id: &str, status: CheckStatus) -> anyhow::Result<()> {
        self.put(&format!("/v1/agent/check/{}/{check_id}", status.as_path()), None).await
    }

    /// `GET /v1/snapshot`: the agent's state, as `consul snapshot save` takes it.
    pub async fn snapshot_save(&self) -> anyhow::Result<Vec<u8>> {
        let mut req = self.http.get(format!("{}/v1/snapshot", self.url())).header("Connection", "close");
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        let resp = req.timeout(Duration::from_secs(30)).send().await.context("GET /v1/snapshot")?;
        let status = resp.status();
        ensure!(status.is_success(), "GET /v1/snapshot: {status}");
        Ok(resp.bytes().await?.to_vec())
    }

    /// `PUT /v1/snapshot`: restore a snapshot, as `consul snapshot restore` does.
    pub async fn snapshot_restore(&self, snapshot: Vec<u8>) -> anyhow::Result<()> {
        let mut req = self.http.put(format!("{}/v1/snapshot", self.url())).header("Connection", "close");
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        let resp = req.body(snapshot).timeout(Duration::from_secs(30)).send().await.context("PUT /v1/snapshot")?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        ensure!(status.is_success(), "PUT /v1/snapshot: {status}: {text}");
        Ok(())
    }

    /// `PUT path` with a JSON body and the harness's token; the JSON answer
    /// (the ACL API answers with the object it wrote).
    pub async fn put_json(&self, path: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let mut req = self.http.put(format!("{}{path}", self.url())).header("Connection", "close").json(&body);
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        let resp = req.timeout(Duration::from_secs(10)).send().await.with_context(|| format!("PUT {path}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        ensure!(status.is_success(), "PUT {path}: {status}: {text}");
        Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    async fn put(&self, path: &str, body: Option<serde_json::Value>) -> anyhow::Result<()> {
        // `Connection: close`: tests count connections to the agent.
        let mut req = self
            .http
            .put(format!("{}{path}", self.url()))
            .header("Connection", "close")
            .timeout(Duration::from_secs(10));
        if let Some(token) = &self.token {
            req = req.header("X-Consul-Token", token);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.with_context(|| format!("PUT {path}"))?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        ensure!(status.is_success(), "PUT {path}: {status}: {text}");
        Ok(())
    }

    /// Ready means a leader is elected and, with ACLs, the master token works
    /// (it is bootstrapped just after the election).
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.guard.is_running() {
                bail!("consul exited during startup");
            }
            if self.has_leader().await && self.token_works().await {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "consul not ready after {READY_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn has_leader(&self) -> bool {
        let url = format!("{}/v1/status/leader", self.url());
        match self.http.get(url).timeout(Duration::from_secs(2)).send().await {
            Ok(r) if r.status().is_success() => r.json::<String>().await.is_ok_and(|leader| !leader.is_empty()),
            _ => false,
        }
    }

    async fn token_works(&self) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let url = format!("{}/v1/agent/self", self.url());
        let req = self.http.get(url).header("X-Consul-Token", token).timeout(Duration::from_secs(2));
        req.send().await.is_ok_and(|r| r.status().is_success())
    }
}

/// The loopback address the harness's own calls to the agent come from.
const HARNESS_IP: [u8; 4] = [127, 0, 0, 2];

/// ESTABLISHED TCP connections whose remote port is `port`, from
/// `/proc/net/tcp` and `/proc/net/tcp6` (rows: `sl local rem st ...`,
/// addresses as `HEXIP:HEXPORT`, state `01` = ESTABLISHED), but for the
/// harness's own (from [`HARNESS_IP`]).
pub fn established_to(port: u16) -> usize {
    let want = format!("{port:04X}");
    // /proc/net/tcp writes an IPv4 address as the hex of its bytes in host
    // order: 127.0.0.2 is 0200007F on x86.
    let harness = format!("{:08X}", u32::from_ne_bytes(HARNESS_IP));
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|table| {
            let rows = table.lines().skip(1).filter(|row| {
                let cols: Vec<&str> = row.split_whitespace().collect();
                cols.len() > 3
                    && cols[3] == "01"
                    && cols[2].rsplit(':').next() == Some(want.as_str())
                    && !cols[1].starts_with(&format!("{harness}:"))
            });
            rows.count()
        })
        .sum()
}

fn agent_args(http_port: u16, dir: &TempDir, token: Option<&str>, host: &Host) -> Vec<String> {
    let port = |p: u16| p.to_string();
    let node = format!("mb-{}-{http_port}", std::process::id());
    let mut args: Vec<String> =
        ["agent", "-dev", "-log-level", "debug", "-dns-port", "-1", "-grpc-port", "-1", "-serf-wan-port", "-1"]
            .map(String::from)
            .into();
    args.extend([
        "-bind".into(),
        host.ip.to_string(),
        "-client".into(),
        host.ip.to_string(),
        "-http-port".into(),
        port(http_port),
        "-serf-lan-port".into(),
        port(free_port()),
        "-server-port".into(),
        port(free_port()),
        "-data-dir".into(),
        dir.path().join("data").display().to_string(),
        "-node".into(),
        node,
    ]);
    if let Some(token) = token {
        args.push("-hcl".into());
        args.push(format!(r#"acl {{ enabled = true, default_policy = "deny", tokens {{ master = "{token}" }} }}"#));
    }
    args
}

fn spawn(host: &Host, bin: &PathBuf, args: &[String], dir: &TempDir) -> anyhow::Result<ChildGuard> {
    let mut cmd = host.command(bin);
    cmd.args(args);
    ChildGuard::spawn("consul", cmd, dir.path().join("consul.log"))
}
