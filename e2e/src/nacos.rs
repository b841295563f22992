//! A real Nacos-protocol server, rnacos (`MESHBRIDGE_RNACOS_BIN`), on free
//! loopback ports in a temp dir, and the HTTP calls tests use to change it
//! or Nacos itself ([`Api`]; the Nacos 3 server is [`crate::nacos_server`]).
//!
//! Nacos clients find the gRPC port at the HTTP port + 1000, so both are picked
//! together. The separate console is off (port 0); the Nacos console API
//! (namespaces) is served on the HTTP port. [`Rnacos::restart`] brings the
//! server back on the same ports and data dir.
//!
//! Where rnacos differs from Nacos in what tests can do (see e2e/README.md):
//! it ignores `healthy` on register and update (an instance is healthy until
//! its heartbeats stop), and probes persistent instances over TCP by default
//! (turned off here, so instances may point at ports nobody listens on).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tempfile::TempDir;

use crate::netns::Host;
use crate::process::{ChildGuard, binary_from_env, free_port};

const BIN_VAR: &str = "MESHBRIDGE_RNACOS_BIN";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts at a fresh start: a port picked by `free_port` can be taken by
/// another test before rnacos binds it, and rnacos can lose its start-up
/// race (`wait_ready`), every time while a JVM starts beside it.
const START_ATTEMPTS: usize = 8;
const GRPC_OFFSET: u16 = 1000;
const CALL_RETRY: Duration = Duration::from_secs(10);

/// How to start rnacos.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Turn on open API (and gRPC) auth with this admin user and password.
    pub auth: Option<(String, String)>,
    /// Lifetime of a login token (`RNACOS_API_LOGIN_TIMEOUT`, whole seconds).
    pub token_ttl: Option<Duration>,
    /// An ephemeral instance without heartbeats turns unhealthy after this
    /// (rnacos adds 3 s); it is removed only after 10 minutes.
    pub heartbeat_timeout: Option<Duration>,
    /// Where the server runs and is reached (loopback by default).
    pub host: Host,
}

/// An instance as the 1.x open API takes it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub service: String,
    pub group: String,
    /// Namespace id; `public` is the default one.
    pub namespace: String,
    pub ip: String,
    pub port: u16,
    pub weight: f64,
    pub enabled: bool,
    /// Sent on register and update; rnacos ignores it, Nacos honours it.
    pub healthy: bool,
    /// Persistent (`false`) instances need no heartbeats.
    pub ephemeral: bool,
    pub metadata: BTreeMap<String, String>,
}

impl Instance {
    /// A persistent instance in `DEFAULT_GROUP` of the public namespace.
    pub fn new(service: &str, ip: &str, port: u16) -> Instance {
        Instance {
            service: service.into(),
            group: "DEFAULT_GROUP".into(),
            namespace: "public".into(),
            ip: ip.into(),
            port,
            weight: 1.0,
            enabled: true,
            healthy: true,
            ephemeral: false,
            metadata: BTreeMap::new(),
        }
    }

    pub fn group(mut self, group: &str) -> Instance {
        self.group = group.into();
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Instance {
        self.namespace = namespace.into();
        self
    }

    pub fn meta(mut self, key: &str, value: &str) -> Instance {
        self.metadata.insert(key.into(), value.into());
        self
    }

    fn params(&self) -> Vec<(&'static str, String)> {
        vec![
            ("serviceName", self.service.clone()),
            ("groupName", self.group.clone()),
            ("namespaceId", self.namespace.clone()),
            ("ip", self.ip.clone()),
            ("port", self.port.to_string()),
            ("weight", self.weight.to_string()),
            ("enabled", self.enabled.to_string()),
            ("healthy", self.healthy.to_string()),
            ("ephemeral", self.ephemeral.to_string()),
            ("metadata", serde_json::to_string(&self.metadata).unwrap_or_default()),
        ]
    }
}

pub struct Rnacos {
    pub http_port: u16,
    pub host: Host,
    env: Vec<(String, String)>,
    api: Api,
    guard: ChildGuard,
    dir: TempDir,
}

/// The open API calls, on the server's HTTP port.
impl std::ops::Deref for Rnacos {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

/// A pause before the next start after a failed one, longer each time: the
/// start-up race below is likeliest while the machine is busy (a JVM
/// starting beside it), so tries back to back can all lose it.
async fn retry_pause(attempt: usize) {
    tokio::time::sleep(Duration::from_millis(500 * (attempt as u64 + 1))).await;
}

impl Rnacos {
    pub async fn start() -> anyhow::Result<Rnacos> {
        Rnacos::start_with(Options::default()).await
    }

    pub async fn start_with(opts: Options) -> anyhow::Result<Rnacos> {
        let bin = binary_from_env(BIN_VAR)?;
        let mut last_err = None;
        for attempt in 0..START_ATTEMPTS {
            let Some(http_port) = port_pair() else { continue };
            let dir = tempfile::Builder::new().prefix("meshbridge-rnacos-").tempdir()?;
            let env = environment(http_port, &dir, &opts);
            std::fs::write(dir.path().join("rnacos.env"), "")?;
            let host = opts.host.clone();
            let guard = spawn(&host, &bin, &env, &dir)?;
            let api = Api::new(Flavor::Rnacos, format!("http://{}:{http_port}", host.ip), opts.auth.clone());
            let mut rnacos = Rnacos { http_port, host, env, api, guard, dir };
            match rnacos.wait_ready().await {
                Ok(()) => return Ok(rnacos),
                Err(e) => last_err = Some(e.context(format!("rnacos log:\n{}", rnacos.log()))),
            }
            retry_pause(attempt).await;
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no free port pair for rnacos")))
    }

    /// `http://{host}:{http_port}`.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.host.ip, self.http_port)
    }

    /// The server's process id (to SIGSTOP / SIGCONT it).
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    pub fn grpc_port(&self) -> u16 {
        self.http_port + GRPC_OFFSET
    }

    /// The server's output so far.
    pub fn log(&self) -> String {
        let s = self.guard.log();
        let cut = s.len().saturating_sub(8000);
        s.get(cut..).unwrap_or(&s).to_string()
    }

    /// Kill the server (SIGKILL): clients see connection refused.
    pub fn stop(&mut self) {
        self.guard.kill();
    }

    /// Start the server again with the same ports, settings and data dir.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let bin = binary_from_env(BIN_VAR)?;
        let mut last_err = None;
        for attempt in 0..START_ATTEMPTS {
            self.guard.kill();
            // A fresh log each time, so that a panic in an earlier run does
            // not fail this one.
            std::fs::write(self.dir.path().join("rnacos.log"), "")?;
            self.guard = spawn(&self.host, &bin, &self.env, &self.dir)?;
            match self.wait_ready().await {
                Ok(()) => return Ok(()),
                Err(e) => last_err = Some(e.context(format!("rnacos log:\n{}", self.log()))),
            }
            retry_pause(attempt).await;
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("rnacos did not restart")))
    }

    /// Ready: the open API answers (which needs the raft leader for naming)
    /// and the gRPC port accepts connections.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.guard.is_running() {
                bail!("rnacos exited during startup");
            }
            let grpc = tokio::net::TcpStream::connect((self.host.ip, self.grpc_port())).await.is_ok();
            let params = [("pageNo", "1"), ("pageSize", "1")].map(|(k, v)| (k, v.to_string()));
            let listed = self.call_once(reqwest::Method::GET, "/nacos/v1/ns/service/list", &params).await;
            if grpc && listed.is_ok_and(|(status, _)| status.is_success()) {
                // rnacos 0.8.8 has a startup race: its raft state-apply actor
                // can panic (raftapply.rs:421) when raft applies its first
                // log before the actor is wired up. Naming still answers but
                // every raft-backed call (namespaces) fails with "Mailbox has
                // closed". It happens within milliseconds of start: look.
                tokio::time::sleep(Duration::from_millis(200)).await;
                ensure!(!self.guard.log().contains("panicked at"), "rnacos panicked during startup");
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "rnacos not ready after {READY_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Which server an [`Api`] talks to: their HTTP APIs differ where Nacos 3
/// moved a call to its v3 admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Rnacos,
    /// Nacos 3 ([`crate::nacos_server`]).
    Nacos,
}

/// The HTTP calls tests make to change a Nacos-protocol server.
#[derive(Clone)]
pub struct Api {
    flavor: Flavor,
    /// `http://host:port`.
    base: String,
    auth: Option<(String, String)>,
    http: reqwest::Client,
}

impl Api {
    pub fn new(flavor: Flavor, base: String, auth: Option<(String, String)>) -> Api {
        Api { flavor, base, auth, http: reqwest::Client::new() }
    }

    /// `POST /nacos/v1/ns/instance`.
    pub async fn register(&self, instance: &Instance) -> anyhow::Result<()> {
        self.call(reqwest::Method::POST, "/nacos/v1/ns/instance", &instance.params()).await.map(drop)
    }

    /// `PUT /nacos/v1/ns/instance` (rnacos) or `/nacos/v3/admin/ns/instance`
    /// (Nacos 3 answers the 1.x one `410 Gone` unless its admin API
    /// compatibility is on): weight, enabled, metadata. rnacos only applies
    /// a weight other than 1 and a metadata map other than `{}`.
    pub async fn update(&self, instance: &Instance) -> anyhow::Result<()> {
        let path = match self.flavor {
            Flavor::Rnacos => "/nacos/v1/ns/instance",
            Flavor::Nacos => "/nacos/v3/admin/ns/instance",
        };
        self.call(reqwest::Method::PUT, path, &instance.params()).await.map(drop)
    }

    /// `DELETE /nacos/v1/ns/instance`.
    pub async fn deregister(&self, instance: &Instance) -> anyhow::Result<()> {
        self.call(reqwest::Method::DELETE, "/nacos/v1/ns/instance", &instance.params()).await.map(drop)
    }

    /// `PUT /nacos/v1/ns/instance/beat`: an ephemeral instance's heartbeat.
    pub async fn beat(&self, instance: &Instance) -> anyhow::Result<()> {
        let beat = serde_json::json!({
            "serviceName": instance.service, "ip": instance.ip, "port": instance.port,
            "cluster": "DEFAULT", "weight": instance.weight, "metadata": instance.metadata,
        });
        let params = vec![
            ("serviceName", instance.service.clone()),
            ("groupName", instance.group.clone()),
            ("namespaceId", instance.namespace.clone()),
            ("ip", instance.ip.clone()),
            ("port", instance.port.to_string()),
            ("beat", beat.to_string()),
        ];
        self.call(reqwest::Method::PUT, "/nacos/v1/ns/instance/beat", &params).await.map(drop)
    }

    /// `POST /nacos/v1/console/namespaces` (rnacos) or
    /// `/nacos/v3/admin/core/namespace` (Nacos 3 serves the console API only
    /// on its console).
    pub async fn create_namespace(&self, id: &str, name: &str) -> anyhow::Result<()> {
        let (path, id_param) = match self.flavor {
            Flavor::Rnacos => ("/nacos/v1/console/namespaces", "customNamespaceId"),
            Flavor::Nacos => ("/nacos/v3/admin/core/namespace", "namespaceId"),
        };
        let params = vec![
            (id_param, id.to_string()),
            ("namespaceName", name.to_string()),
            ("namespaceDesc", format!("e2e {name}")),
        ];
        self.call(reqwest::Method::POST, path, &params).await.map(drop)
    }

    /// `GET /nacos/v1/ns/instance/list`, for failure messages.
    pub async fn instances(&self, service: &str, group: &str, namespace: &str) -> anyhow::Result<String> {
        let params = vec![
            ("serviceName", service.to_string()),
            ("groupName", group.to_string()),
            ("namespaceId", namespace.to_string()),
            ("healthyOnly", "false".to_string()),
        ];
        self.call(reqwest::Method::GET, "/nacos/v1/ns/instance/list", &params).await
    }

    /// One open API call. Failures and 5xx answers are retried for a
    /// while: creating a namespace right after start failed once under load.
    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        params: &[(&str, String)],
    ) -> anyhow::Result<String> {
        let deadline = Instant::now() + CALL_RETRY;
        loop {
            let error = match self.call_once(method.clone(), path, params).await {
                Ok((status, text)) if status.is_success() => return Ok(text),
                Ok((status, text)) => {
                    let error = anyhow::anyhow!("{method} {path}: {status}: {text}");
                    if !status.is_server_error() {
                        return Err(error);
                    }
                    error
                }
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(error);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn call_once(
        &self,
        method: reqwest::Method,
        path: &str,
        params: &[(&str, String)],
    ) -> anyhow::Result<(reqwest::StatusCode, String)> {
        let url = format!("{}{path}", self.base);
        // Nacos (a servlet) reads a form body on POST and PUT only.
        let mut req = if method == reqwest::Method::POST || method == reqwest::Method::PUT {
            self.http.request(method.clone(), url).form(params)
        } else {
            self.http.request(method.clone(), url).query(params)
        };
        if let Some(token) = self.admin_token().await? {
            req = req.header("accessToken", token);
        }
        let resp = req.timeout(Duration::from_secs(10)).send().await.with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        Ok((status, resp.text().await.unwrap_or_default()))
    }

    /// A fresh admin token when auth is on (tokens may be short-lived), from
    /// the v3 login both servers serve.
    async fn admin_token(&self) -> anyhow::Result<Option<String>> {
        let Some((user, password)) = &self.auth else {
            return Ok(None);
        };
        let url = format!("{}/nacos/v3/auth/user/login", self.base);
        let form = [("username", user.as_str()), ("password", password.as_str())];
        let resp = self.http.post(url).form(&form).timeout(Duration::from_secs(5)).send().await?;
        let status = resp.status();
        let text = resp.text().await.context("login answer")?;
        ensure!(status.is_success(), "login: {status}: {text}");
        let body: serde_json::Value = serde_json::from_str(&text).context("login answer")?;
        let token = body["accessToken"].as_str().context("no accessToken")?;
        Ok(Some(token.to_string()))
    }
}

/// An HTTP port whose +1000 is free too.
fn port_pair() -> Option<u16> {
    for _ in 0..20 {
        let port = free_port();
        let Some(grpc) = port.checked_add(GRPC_OFFSET) else { continue };
        if std::net::TcpListener::bind(("127.0.0.1", grpc)).is_ok() {
            return Some(port);
        }
    }
    None
}

fn environment(http_port: u16, dir: &TempDir, opts: &Options) -> Vec<(String, String)> {
    let data = dir.path().join("data").display().to_string();
    let grpc = http_port + GRPC_OFFSET;
    let ip = opts.host.ip;
    let mut env: Vec<(&str, String)> = vec![
        ("RNACOS_HTTP_PORT", http_port.to_string()),
        ("RNACOS_GRPC_PORT", grpc.to_string()),
        // 0 turns the separate console off; its default is HTTP + 2000.
        ("RNACOS_HTTP_CONSOLE_PORT", "0".into()),
        ("RNACOS_SDK_HOST", ip.to_string()),
        ("RNACOS_CONSOLE_HOST", ip.to_string()),
        ("RNACOS_RAFT_NODE_ADDR", format!("{ip}:{grpc}")),
        ("RNACOS_DATA_DIR", data.clone()),
        ("RNACOS_CONFIG_DB_DIR", data),
        // rnacos probes persistent instances over TCP (as Nacos does);
        // test instances point at ports nobody listens on.
        ("RNACOS_NAMING_PERPETUAL_INSTANCE_PROBE_INTERVAL_SECOND", "0".into()),
        ("RNACOS_ENABLE_METRICS", "false".into()),
        ("RUST_LOG", "info".into()),
    ];
    if let Some(t) = opts.heartbeat_timeout {
        env.push(("RNACOS_NAMING_HEALTH_TIMEOUT_SECOND", t.as_secs().max(1).to_string()));
        env.push(("RNACOS_NAMING_INSTANCE_TIMEOUT_SECOND", "600".into()));
    }
    if let Some((user, password)) = &opts.auth {
        env.push(("RNACOS_ENABLE_OPEN_API_AUTH", "true".into()));
        env.push(("RNACOS_INIT_ADMIN_USERNAME", user.clone()));
        env.push(("RNACOS_INIT_ADMIN_PASSWORD", password.clone()));
    }
    if let Some(ttl) = opts.token_ttl {
        env.push(("RNACOS_API_LOGIN_TIMEOUT", ttl.as_secs().max(1).to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn spawn(host: &Host, bin: &PathBuf, env: &[(String, String)], dir: &TempDir) -> anyhow::Result<ChildGuard> {
    let mut cmd = host.command(bin);
    // An empty env file and the temp dir as working dir: no `.env` from the
    // repo leaks into the server.
    cmd.arg("-e").arg(dir.path().join("rnacos.env")).current_dir(dir.path());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("RNACOS_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    ChildGuard::spawn("rnacos", cmd, dir.path().join("rnacos.log"))
}
