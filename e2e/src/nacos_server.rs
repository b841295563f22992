//! A real Nacos 3.1.0 server (`MESHBRIDGE_NACOS_SERVER_JAR`, built by
//! `e2e/setup.sh nacos-server` from `e2e/nacos-server/`): standalone, the
//! embedded Derby store, auth off, started with `java -jar` on free loopback
//! ports in a temp dir that is its `nacos.home`.
//!
//! Ports: Nacos clients find gRPC at the HTTP port + 1000; the server also
//! opens its cluster gRPC port at + 1001 and JRaft at − 1000 (even
//! standalone: persistent instances go through it), so all four are picked
//! free together. No console.
//!
//! A JVM start costs 10–30 s of both cores, so a test binary shares one
//! server ([`Target::start`] with [`Flavor::Nacos`]): each test gets a
//! namespace of its own on it. Tests that stop or restart the server start
//! their own ([`NacosServer::start`]).
//!
//! Health checks are switched off after start (switch `check=false`
//! through the v3 admin API): Nacos probes persistent instances over TCP,
//! and test instances point at ports nobody listens on. That switch also
//! stops heartbeat expiry of ephemeral instances. `healthy` on register is
//! honoured either way.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tempfile::TempDir;

use crate::nacos::{self, Api, Flavor, Instance, Rnacos};
use crate::process::{ChildGuard, binary_from_env, free_port};

const JAR_VAR: &str = "MESHBRIDGE_NACOS_SERVER_JAR";
/// About 25 s on the loaded 2-core machine; room for a busier CI.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const START_ATTEMPTS: usize = 3;
const GRPC_OFFSET: u16 = 1000;
/// C1 only, serial GC, a small heap: start-up is what the tests pay for.
const JVM_FLAGS: [&str; 5] = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xms64m", "-Xmx320m", "-Xss512k"];
const SHARED_PREFIX: &str = "meshbridge-nacos-shared-";
/// Nacos 3's admin user.
pub const ADMIN: &str = "nacos";
/// Nacos reloads its user, role and permission caches 5 s after start,
/// then every 15 s (`AbstractCachedUserService.reload`).
const USER_CACHE_WAIT: Duration = Duration::from_secs(40);

/// A Nacos server of the test's own, which it may stop and restart.
pub struct NacosServer {
    pub http_port: u16,
    api: Api,
    guard: ChildGuard,
    dir: TempDir,
    /// The `-D` options it was started with (auth).
    extra: Vec<String>,
    /// Its JVM flags ([`JVM_FLAGS`] unless a bench sized them).
    jvm: Vec<String>,
}

/// Auth settings of a [`NacosServer::start_with_auth`].
struct Auth {
    admin_password: String,
    token_ttl: Duration,
}

impl Auth {
    fn options(&self) -> Vec<String> {
        vec![
            "-Dnacos.core.auth.enabled=true".into(),
            format!("-Dnacos.core.auth.plugin.nacos.token.expire.seconds={}", self.token_ttl.as_secs().max(1)),
        ]
    }
}

/// The HTTP calls tests make ([`Api`]).
impl std::ops::Deref for NacosServer {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl NacosServer {
    pub async fn start() -> anyhow::Result<NacosServer> {
        NacosServer::start_as(None, test_jvm()).await
    }

    /// With these JVM flags instead of the tests' [`JVM_FLAGS`] (C1 only,
    /// a 320 MB heap): a bench runs the server as a user would, its heap
    /// sized for the catalog.
    pub async fn start_with_jvm(jvm: &[String]) -> anyhow::Result<NacosServer> {
        NacosServer::start_as(None, jvm.to_vec()).await
    }

    /// With auth on (`nacos.core.auth.enabled`; the token key and server
    /// identity are in the jar's properties): tokens live `token_ttl`, and
    /// the admin `nacos` gets `admin_password` through
    /// `POST /nacos/v3/auth/user/admin` (Nacos 3 has no default password).
    /// The returned server's [`Api`] logs in as that admin.
    ///
    /// Nacos reads users, roles and permissions from caches it reloads
    /// every 15 s (`nacos.core.auth.caching.enabled=true`, its default):
    /// until then a new user's login is refused (`403 Access Denied` on
    /// v3, `500 Handle API Compatibility failed` on v1). So this returns
    /// once the admin's login works, 5–20 s after the admin is set.
    pub async fn start_with_auth(admin_password: &str, token_ttl: Duration) -> anyhow::Result<NacosServer> {
        let auth = Auth { admin_password: admin_password.to_string(), token_ttl };
        NacosServer::start_as(Some(auth), test_jvm()).await
    }

    async fn start_as(auth: Option<Auth>, jvm: Vec<String>) -> anyhow::Result<NacosServer> {
        let jar = binary_from_env(JAR_VAR)?;
        let extra = auth.as_ref().map(Auth::options).unwrap_or_default();
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let Some(http_port) = port_quad() else { continue };
            let dir = tempfile::Builder::new().prefix("meshbridge-nacos-").tempdir()?;
            let cmd = java(&jar, &jvm, http_port, dir.path(), false, &extra);
            let guard = ChildGuard::spawn("nacos", cmd, log_path(dir.path()))?;
            let admin = auth.as_ref().map(|a| (ADMIN.to_string(), a.admin_password.clone()));
            let api = Api::new(Flavor::Nacos, base(http_port), admin);
            let mut server = NacosServer { http_port, api, guard, dir, extra: extra.clone(), jvm: jvm.clone() };
            let started = Instant::now();
            let ready = match &auth {
                Some(a) => server.init_admin(&a.admin_password).await,
                None => Ok(()),
            };
            let ready = match ready {
                Ok(()) => wait_ready(&server.api, http_port, &mut server.guard).await,
                Err(e) => Err(e),
            };
            match ready {
                Ok(()) => {
                    println!("FIGURE nacos_server_start auth={} ms={}", auth.is_some(), started.elapsed().as_millis());
                    return Ok(server);
                }
                Err(e) => last_err = Some(e.context(format!("nacos log:\n{}", server.log()))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no four free ports for nacos")))
    }

    /// Set the admin's password as soon as the HTTP API answers, then wait
    /// until the admin can log in (the user cache, above).
    async fn init_admin(&mut self, password: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = format!("{}/nacos/v3/auth/user/admin", base(self.http_port));
        let http = reqwest::Client::new();
        loop {
            ensure!(self.guard.is_running(), "nacos exited during startup");
            let sent = http.post(&url).form(&[("password", password)]).timeout(Duration::from_secs(5)).send().await;
            match sent {
                Ok(resp) if resp.status().is_success() => break,
                Ok(resp) => bail!("POST /nacos/v3/auth/user/admin: {}: {}", resp.status(), resp.text().await?),
                Err(_) => {}
            }
            ensure!(Instant::now() < deadline, "nacos HTTP API not up after {READY_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        self.wait_login(ADMIN, password).await.map(drop)
    }

    /// Poll `POST /nacos/v3/auth/user/login` until it gives `user` a token
    /// (a new user shows after Nacos's next cache reload).
    pub async fn wait_login(&self, user: &str, password: &str) -> anyhow::Result<String> {
        let deadline = Instant::now() + USER_CACHE_WAIT;
        loop {
            let (status, body) = self.login(user, password).await?;
            if status.is_success() {
                let answer: serde_json::Value = serde_json::from_str(&body)?;
                return answer["accessToken"].as_str().map(str::to_string).context("login answer without a token");
            }
            ensure!(Instant::now() < deadline, "{user} cannot log in after {USER_CACHE_WAIT:?}: {status}: {body}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// One `POST /nacos/v3/auth/user/login`: the status and body.
    pub async fn login(&self, user: &str, password: &str) -> anyhow::Result<(reqwest::StatusCode, String)> {
        let params = [("username", user.to_string()), ("password", password.to_string())];
        let url = format!("{}/nacos/v3/auth/user/login", base(self.http_port));
        let resp = reqwest::Client::new().post(url).form(&params).timeout(Duration::from_secs(5)).send().await?;
        Ok((resp.status(), resp.text().await?))
    }

    /// A user who may read `namespace` only (a role of its own with an `r`
    /// permission on `namespace:*:*`); returns once Nacos's caches let it.
    pub async fn add_reader(&self, user: &str, password: &str, namespace: &str) -> anyhow::Result<()> {
        let role = format!("{user}-role");
        let calls = [
            ("/nacos/v3/auth/user", vec![("username", user.to_string()), ("password", password.to_string())]),
            ("/nacos/v3/auth/role", vec![("role", role.clone()), ("username", user.to_string())]),
            (
                "/nacos/v3/auth/permission",
                vec![("role", role), ("resource", format!("{namespace}:*:*")), ("action", "r".to_string())],
            ),
        ];
        for (path, params) in calls {
            self.api.call(reqwest::Method::POST, path, &params).await?;
        }
        let token = self.wait_login(user, password).await?;
        let deadline = Instant::now() + USER_CACHE_WAIT;
        let params = [("pageNo", "1"), ("pageSize", "1"), ("namespaceId", namespace), ("accessToken", &token)];
        let url = format!("{}/nacos/v1/ns/service/list", base(self.http_port));
        loop {
            let resp = reqwest::Client::new().get(&url).query(&params).send().await?;
            if resp.status().is_success() {
                return Ok(());
            }
            let (status, body) = (resp.status(), resp.text().await?);
            ensure!(
                Instant::now() < deadline,
                "{user} cannot read {namespace} after {USER_CACHE_WAIT:?}: {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub fn grpc_port(&self) -> u16 {
        self.http_port + GRPC_OFFSET
    }

    pub fn log(&self) -> String {
        self.guard.log_tail(8000)
    }

    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    /// Kill the server (SIGKILL): clients see connection refused.
    pub fn stop(&mut self) {
        self.guard.kill();
    }

    /// Start it again on the same ports with the same `nacos.home` (Derby
    /// and JRaft data kept).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let jar = binary_from_env(JAR_VAR)?;
        self.guard.kill();
        std::fs::write(log_path(self.dir.path()), "")?;
        let cmd = java(&jar, &self.jvm, self.http_port, self.dir.path(), false, &self.extra);
        self.guard = ChildGuard::spawn("nacos", cmd, log_path(self.dir.path()))?;
        let started = Instant::now();
        wait_ready(&self.api, self.http_port, &mut self.guard)
            .await
            .with_context(|| format!("nacos log:\n{}", self.log()))?;
        println!("FIGURE nacos_server_start restart=true ms={}", started.elapsed().as_millis());
        Ok(())
    }
}

/// The one Nacos server a test binary shares: its HTTP port.
static SHARED: tokio::sync::OnceCell<u16> = tokio::sync::OnceCell::const_new();
static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

/// Start the shared server once per process. It is spawned from a thread
/// that lives as long as the process, under `setpriv --pdeathsig KILL`, so
/// it dies with the test binary (statics are never dropped); its temp dir
/// is removed by the next run that finds its process gone.
async fn shared_port() -> anyhow::Result<u16> {
    SHARED
        .get_or_try_init(|| async {
            remove_stale_shared_dirs();
            let jar = binary_from_env(JAR_VAR)?;
            let mut last_err = None;
            for _ in 0..START_ATTEMPTS {
                let Some(http_port) = port_quad() else { continue };
                let prefix = format!("{SHARED_PREFIX}{}-", std::process::id());
                let dir = tempfile::Builder::new().prefix(&prefix).tempdir()?.keep();
                let (spawned_tx, spawned_rx) = std::sync::mpsc::channel();
                let (kill_tx, kill_rx) = std::sync::mpsc::channel::<()>();
                let (cmd, log) = (java(&jar, &test_jvm(), http_port, &dir, true, &[]), log_path(&dir));
                // The server's parent thread, which holds its guard: it
                // ends (and the server with it) on a message, or when the
                // process does.
                std::thread::Builder::new().name("shared-nacos".into()).spawn(move || {
                    let guard = ChildGuard::spawn("nacos", cmd, log);
                    let _ = spawned_tx.send(guard.as_ref().map(drop).map_err(|e| anyhow::anyhow!("{e:#}")));
                    let _ = kill_rx.recv();
                    drop(guard);
                })?;
                spawned_rx.recv().context("shared nacos thread")??;
                let api = Api::new(Flavor::Nacos, base(http_port), None);
                let started = Instant::now();
                match wait_ready_shared(&api, http_port).await {
                    Ok(()) => {
                        println!("FIGURE nacos_server_start shared=true ms={}", started.elapsed().as_millis());
                        // Never sent: the server lives as long as the process.
                        std::mem::forget(kill_tx);
                        return Ok(http_port);
                    }
                    Err(e) => {
                        let _ = kill_tx.send(());
                        let log = std::fs::read_to_string(log_path(&dir)).unwrap_or_default();
                        let tail = log.get(log.len().saturating_sub(8000)..).unwrap_or(&log).to_string();
                        last_err = Some(e.context(format!("shared nacos log ({}):\n{tail}", dir.display())));
                    }
                }
            }
            Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no four free ports for nacos")))
        })
        .await
        .copied()
}

/// The Nacos-protocol server a test runs against, and the namespace its
/// instances go to: rnacos of its own (namespace `public`), or the Nacos
/// server the test binary shares, in a namespace made for this test.
pub struct Target {
    pub flavor: Flavor,
    pub http_port: u16,
    /// Namespace id: `public`, or `e2e-N` on the shared Nacos.
    pub namespace: String,
    server: TargetServer,
}

enum TargetServer {
    Rnacos(Rnacos),
    Shared(Api),
}

impl std::ops::Deref for Target {
    type Target = Api;

    fn deref(&self) -> &Api {
        match &self.server {
            TargetServer::Rnacos(r) => r,
            TargetServer::Shared(api) => api,
        }
    }
}

impl Target {
    /// rnacos with `opts`, or a fresh namespace on the shared Nacos (which
    /// has no such options).
    pub async fn start(flavor: Flavor, opts: nacos::Options) -> anyhow::Result<Target> {
        match flavor {
            Flavor::Rnacos => {
                let rnacos = Rnacos::start_with(opts).await.context("start rnacos (source e2e/env.sh rnacos)")?;
                let http_port = rnacos.http_port;
                Ok(Target { flavor, http_port, namespace: "public".into(), server: TargetServer::Rnacos(rnacos) })
            }
            Flavor::Nacos => {
                let http_port = shared_port().await.context("start nacos (source e2e/env.sh nacos-server)")?;
                let api = Api::new(Flavor::Nacos, base(http_port), None);
                let namespace = format!("e2e-{}", NAMESPACES.fetch_add(1, Ordering::Relaxed));
                api.create_namespace(&namespace, &namespace).await?;
                Ok(Target { flavor, http_port, namespace, server: TargetServer::Shared(api) })
            }
        }
    }

    pub fn grpc_port(&self) -> u16 {
        self.http_port + GRPC_OFFSET
    }

    /// A persistent instance in `DEFAULT_GROUP` of this test's namespace.
    pub fn instance(&self, service: &str, ip: &str, port: u16) -> Instance {
        Instance::new(service, ip, port).namespace(&self.namespace)
    }

    /// The host meshbridge makes of `service` in `group` of this test's
    /// namespace (`_` becomes `-`).
    pub fn host(&self, service: &str, group: &str) -> String {
        let dns = |s: &str| s.replace('_', "-");
        format!("{service}.{}.{}.nacos", dns(group), dns(&self.namespace))
    }

    /// A namespace id of its own beside this test's (`suffix` on rnacos,
    /// where every test has its server).
    pub fn other_namespace(&self, suffix: &str) -> String {
        match self.flavor {
            Flavor::Rnacos => suffix.to_string(),
            Flavor::Nacos => format!("{}-{suffix}", self.namespace),
        }
    }
}

fn base(http_port: u16) -> String {
    format!("http://127.0.0.1:{http_port}")
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("nacos.out")
}

/// An HTTP port with − 1000, + 1000 and + 1001 free too.
fn port_quad() -> Option<u16> {
    for _ in 0..50 {
        let port = free_port();
        let (Some(raft), Some(grpc)) = (port.checked_sub(GRPC_OFFSET), port.checked_add(GRPC_OFFSET + 1)) else {
            continue;
        };
        let others = [raft, grpc - 1, grpc];
        if raft > 1024 && others.iter().all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()) {
            return Some(port);
        }
    }
    None
}

fn test_jvm() -> Vec<String> {
    JVM_FLAGS.map(String::from).to_vec()
}

fn java(jar: &Path, jvm: &[String], http_port: u16, home: &Path, die_with_parent: bool, extra: &[String]) -> Command {
    let java =
        std::env::var_os("JAVA_HOME").map_or_else(|| PathBuf::from("java"), |h| PathBuf::from(h).join("bin/java"));
    let mut cmd = if die_with_parent {
        let mut c = Command::new("setpriv");
        c.arg("--pdeathsig").arg("KILL").arg(java);
        c
    } else {
        Command::new(java)
    };
    let tmp = home.join("tmp");
    let _ = std::fs::create_dir_all(&tmp);
    cmd.args(jvm)
        .arg(format!("-Djava.io.tmpdir={}", tmp.display()))
        .arg("-Dnacos.standalone=true")
        .arg(format!("-Dnacos.home={}", home.display()))
        .arg(format!("-Dnacos.server.main.port={http_port}"))
        // Its own address for cluster membership, and Tomcat bound to
        // loopback (the gRPC servers bind every address; only loopback is
        // used).
        .arg("-Dnacos.server.ip=127.0.0.1")
        .arg("-Dserver.address=127.0.0.1")
        .args(extra)
        .arg("-jar")
        .arg(jar)
        .current_dir(home);
    cmd
}

/// Ready: the open API answers, the gRPC port accepts connections, and
/// health checks are off.
async fn wait_ready(api: &Api, http_port: u16, guard: &mut ChildGuard) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if !guard.is_running() {
            bail!("nacos exited during startup");
        }
        if ready_once(api, http_port).await {
            return switch_health_checks_off(api).await;
        }
        ensure!(Instant::now() < deadline, "nacos not ready after {READY_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn wait_ready_shared(api: &Api, http_port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while !ready_once(api, http_port).await {
        ensure!(Instant::now() < deadline, "nacos not ready after {READY_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    switch_health_checks_off(api).await
}

async fn ready_once(api: &Api, http_port: u16) -> bool {
    let grpc = tokio::net::TcpStream::connect(("127.0.0.1", http_port + GRPC_OFFSET)).await.is_ok();
    let params = [("pageNo", "1"), ("pageSize", "1")].map(|(k, v)| (k, v.to_string()));
    let listed = api.call_once(reqwest::Method::GET, "/nacos/v1/ns/service/list", &params).await;
    grpc && listed.is_ok_and(|(status, _)| status.is_success())
}

/// The switch's entry is `check`; the server answers `ok` to an entry it
/// does not know, so the result is read back.
async fn switch_health_checks_off(api: &Api) -> anyhow::Result<()> {
    const SWITCHES: &str = "/nacos/v3/admin/ns/ops/switches";
    let params = [("entry", "check"), ("value", "false")].map(|(k, v)| (k, v.to_string()));
    api.call(reqwest::Method::PUT, SWITCHES, &params).await?;
    let switches: serde_json::Value = serde_json::from_str(&api.call(reqwest::Method::GET, SWITCHES, &[]).await?)?;
    ensure!(switches["data"]["healthCheckEnabled"] == false, "health checks still on: {switches}");
    Ok(())
}

/// Temp dirs of shared servers whose test process is gone.
fn remove_stale_shared_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(SHARED_PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A server of the test's own, of either flavor, that it may stop and
/// restart.
pub enum Owned {
    Rnacos(Rnacos),
    Nacos(NacosServer),
}

impl std::ops::Deref for Owned {
    type Target = Api;

    fn deref(&self) -> &Api {
        match self {
            Owned::Rnacos(r) => r,
            Owned::Nacos(n) => n,
        }
    }
}

impl Owned {
    pub async fn start(flavor: Flavor) -> anyhow::Result<Owned> {
        Ok(match flavor {
            Flavor::Rnacos => Owned::Rnacos(Rnacos::start().await.context("start rnacos (source e2e/env.sh rnacos)")?),
            Flavor::Nacos => {
                Owned::Nacos(NacosServer::start().await.context("start nacos (source e2e/env.sh nacos-server)")?)
            }
        })
    }

    pub fn http_port(&self) -> u16 {
        match self {
            Owned::Rnacos(r) => r.http_port,
            Owned::Nacos(n) => n.http_port,
        }
    }

    pub fn stop(&mut self) {
        match self {
            Owned::Rnacos(r) => r.stop(),
            Owned::Nacos(n) => n.stop(),
        }
    }

    pub async fn restart(&mut self) -> anyhow::Result<()> {
        match self {
            Owned::Rnacos(r) => r.restart().await,
            Owned::Nacos(n) => n.restart().await,
        }
    }
}
