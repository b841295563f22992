//! The Apache Dubbo 3 provider of `deploy/examples/dubbo-spring/dubbo-provider`
//! (`MESHBRIDGE_DUBBO_PROVIDER_JAR`, built by `e2e/setup.sh dubbo-provider`):
//! a real Dubbo app that registers itself in ZooKeeper or Nacos and serves
//! [`INTERFACE`] over Triple.
//!
//! Dubbo will not register a 127.x address: `NetUtils.isInvalidLocalHost`
//! turns `dubbo.protocol.host=127.0.0.1` into "any host", which binds every
//! interface and registers this machine's own address, and it refuses
//! `DUBBO_IP_TO_REGISTRY=127.0.0.1`. `::1` passes that check, so each
//! instance binds and registers the IPv6 loopback `[::1]` on a free port:
//! traffic stays on loopback.

use std::net::{Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tempfile::TempDir;

use crate::jvm;
use crate::process::{ChildGuard, binary_from_env, free_port};

const JAR_VAR: &str = "MESHBRIDGE_DUBBO_PROVIDER_JAR";
/// The provider's one service, its version and its application name.
pub const INTERFACE: &str = "com.example.greeter.Greeter";
pub const VERSION: &str = "1.0.0";
pub const APPLICATION: &str = "greeter";
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// A port picked free on 127.0.0.1 may be taken on ::1: try again.
const START_ATTEMPTS: usize = 3;

/// Dubbo 3's `dubbo.registry.register-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterMode {
    /// One registration per interface: `/dubbo/{interface}/providers/{url}`
    /// in ZooKeeper, service `providers:{interface}:{version}:{group}` in Nacos.
    Interface,
    /// One registration per application: `/services/{app}/{host:port}` in
    /// ZooKeeper, service `{app}` in Nacos.
    Instance,
    /// Both (Dubbo 3.3's default).
    All,
}

impl RegisterMode {
    fn as_str(self) -> &'static str {
        match self {
            RegisterMode::Interface => "interface",
            RegisterMode::Instance => "instance",
            RegisterMode::All => "all",
        }
    }
}

/// What the provider's one port speaks, and so what it registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `dubbo.protocol.name=tri`: registers `tri://` URLs.
    Triple,
    /// `dubbo.protocol.name=dubbo` with `ext-protocol=tri`: registers
    /// `dubbo://` URLs, and the same port also answers Triple (HTTP/1.1 and
    /// HTTP/2), which Dubbo 3.2+ tells apart from its binary protocol by the
    /// first bytes.
    DubboAndTriple,
}

/// How to start an instance.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub mode: RegisterMode,
    pub protocol: Protocol,
}

/// One running provider instance; SIGKILLed when dropped.
pub struct DubboProvider {
    /// What [`INTERFACE`]`.whoami()` answers.
    pub id: String,
    pub port: u16,
    guard: ChildGuard,
    _dir: TempDir,
}

impl DubboProvider {
    /// Start one instance registering in `registry` (`zookeeper://127.0.0.1:port`
    /// or `nacos://127.0.0.1:port`); ready once Dubbo has exported and
    /// registered the service (the app prints a line then) and its port
    /// accepts connections.
    pub async fn start(registry: &str, opts: Options, id: &str) -> anyhow::Result<DubboProvider> {
        let jar = binary_from_env(JAR_VAR)?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new().prefix("meshbridge-dubbo-").tempdir()?;
            let port = free_port();
            let guard = spawn(&jar, dir.path(), registry, opts, id, port)?;
            let mut provider = DubboProvider { id: id.to_string(), port, guard, _dir: dir };
            match provider.wait_ready().await {
                Ok(()) => return Ok(provider),
                Err(e) => last_err = Some(e.context(format!("dubbo provider {id} log:\n{}", provider.log()))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("dubbo provider {id} did not start")))
    }

    /// Start one instance per id, all at once (JVM start-up dominates).
    pub async fn start_all(registry: &str, opts: Options, ids: &[&str]) -> anyhow::Result<Vec<DubboProvider>> {
        let tasks: Vec<_> = ids
            .iter()
            .map(|id| {
                let (registry, id) = (registry.to_string(), id.to_string());
                tokio::spawn(async move { DubboProvider::start(&registry, opts, &id).await })
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await??);
        }
        Ok(out)
    }

    /// Where it listens and what it registers.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv6Addr::LOCALHOST, self.port))
    }

    /// The end of its log (for failure messages).
    pub fn log(&self) -> String {
        self.guard.log_tail(8000)
    }

    /// SIGTERM, as a platform stops it: Dubbo's shutdown hook unregisters
    /// the instance and its interfaces, then closes the registry client.
    /// Waits for the exit.
    pub async fn stop_gracefully(&mut self) -> anyhow::Result<()> {
        jvm::stop_gracefully(&mut self.guard).await
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = format!("greeter provider {} started", self.id);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.guard.is_running() {
                bail!("dubbo provider exited during startup");
            }
            if self.guard.log().contains(&started) && tokio::net::TcpStream::connect(self.addr()).await.is_ok() {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "dubbo provider not ready after {READY_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn spawn(jar: &Path, dir: &Path, registry: &str, opts: Options, id: &str, port: u16) -> anyhow::Result<ChildGuard> {
    // Dubbo's caches (~/.dubbo) and nacos-client's (~/nacos) go to the temp
    // dir (`jvm::java_command_with` makes it the home), so instances share
    // nothing.
    let mut props = vec![
        format!("-Dgreeter.instance-id={id}"),
        format!("-Ddubbo.registry.address={registry}"),
        format!("-Ddubbo.registry.register-mode={}", opts.mode.as_str()),
        "-Ddubbo.protocol.host=::1".to_string(),
        format!("-Ddubbo.protocol.port={port}"),
    ];
    if opts.protocol == Protocol::DubboAndTriple {
        // The application-level instance then advertises the dubbo port.
        props.extend(
            ["-Ddubbo.protocol.name=dubbo", "-Ddubbo.protocol.ext-protocol=tri", "-Ddubbo.application.protocol=dubbo"]
                .map(String::from),
        );
    }
    let mut cmd = jvm::java_command_with(jar, dir, props);
    // Dubbo reads these from the environment before its own properties.
    for var in ["DUBBO_IP_TO_REGISTRY", "DUBBO_IP_TO_BIND", "DUBBO_PORT_TO_REGISTRY", "DUBBO_PORT_TO_BIND"] {
        cmd.env_remove(var);
    }
    ChildGuard::spawn("dubbo-provider", cmd, dir.join("provider.log"))
}

/// Call `whoami` over Triple's HTTP/1.1 JSON mapping, `POST
/// /{interface}/{method}` with the version in `tri-service-version`, at
/// `base` (`http://127.0.0.1:port`, e.g. an Envoy listener): the instance
/// id, or the status and body of a failure.
pub async fn whoami(http: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    let resp = http
        .post(format!("{base}/{INTERFACE}/whoami"))
        .header("content-type", "application/json")
        .header("tri-service-version", VERSION)
        .body("[]")
        .timeout(Duration::from_secs(5))
        .send()
        .await?;
    let status = resp.status();
    let body = resp.text().await?;
    ensure!(status.is_success(), "{status}: {body}");
    // The answer is a JSON string: `"p1"`.
    serde_json::from_str(&body).with_context(|| format!("not a JSON string: {body}"))
}
