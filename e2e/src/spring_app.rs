//! The Spring Cloud app in `deploy/examples/dubbo-spring/spring-app`
//! (`MESHBRIDGE_SPRING_APP_JAR`, built by `e2e/setup.sh spring-app`): Spring
//! Boot web with `GET /` and `GET /hello` answering its instance id, and the
//! Consul, ZooKeeper and Nacos discovery starters, one of them switched on
//! by a Spring profile. It registers itself as service `greeter` at
//! 127.0.0.1 and its port, and deregisters when stopped with SIGTERM.
//! Started with `java -jar` on a free loopback port in a temp dir (its home
//! too), killed when dropped.

use std::path::Path;

use tempfile::TempDir;

use crate::jvm::{self, START_ATTEMPTS};
use crate::process::{ChildGuard, binary_from_env, free_port};

const JAR_VAR: &str = "MESHBRIDGE_SPRING_APP_JAR";
/// The `spring.application.name` every instance registers under.
pub const SERVICE: &str = "greeter";

/// Where an instance registers, and the profile that picks the starter.
#[derive(Debug, Clone)]
pub enum Registry {
    /// A Consul agent's HTTP port on 127.0.0.1.
    Consul { port: u16 },
    /// A ZooKeeper connect string, `127.0.0.1:port`, and the root the
    /// instances go under (Spring Cloud Zookeeper's default is `/services`).
    ZooKeeper { connect: String, root: String },
    /// A Nacos server's HTTP port on 127.0.0.1 (gRPC is that + 1000).
    Nacos { port: u16 },
}

impl Registry {
    fn args(&self) -> Vec<String> {
        match self {
            Registry::Consul { port } => {
                vec!["--spring.profiles.active=consul".into(), format!("--spring.cloud.consul.port={port}")]
            }
            Registry::ZooKeeper { connect, root } => vec![
                "--spring.profiles.active=zookeeper".into(),
                format!("--spring.cloud.zookeeper.connect-string={connect}"),
                format!("--spring.cloud.zookeeper.discovery.root={root}"),
            ],
            // After deregistering, the Nacos starter keeps serving for
            // `graceful-shutdown-wait-time` (10 s by default) before the web
            // server stops, so callers see the change first: 3 s here, to
            // keep the test short.
            Registry::Nacos { port } => vec![
                "--spring.profiles.active=nacos".into(),
                format!("--spring.cloud.nacos.discovery.server-addr=127.0.0.1:{port}"),
                "--spring.cloud.nacos.discovery.graceful-shutdown-wait-time=3000".into(),
            ],
        }
    }
}

/// A running instance; killed (SIGKILL) when dropped.
pub struct SpringApp {
    pub port: u16,
    /// What it answers, and its id in the registry.
    pub instance_id: String,
    guard: ChildGuard,
    _dir: TempDir,
}

impl SpringApp {
    /// Start an instance registering in `registry` as `instance_id`; ready
    /// once it serves `GET /hello` (it registers itself at the same time or
    /// just after).
    pub async fn start(registry: &Registry, instance_id: &str) -> anyhow::Result<SpringApp> {
        let jar = binary_from_env(JAR_VAR)?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let mut app = SpringApp::spawn(&jar, registry, instance_id)?;
            let url = app.url("/hello");
            match jvm::wait_serving(&mut app.guard, &url).await {
                Ok(()) => return Ok(app),
                Err(e) => last_err = Some(e.context(format!("{instance_id} log:\n{}", app.log()))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("{instance_id} did not start")))
    }

    /// Start two instances at once: a JVM is mostly single-threaded while
    /// it starts, so on two cores the pair takes little longer than one.
    pub async fn start_pair(registry: &Registry, ids: [&str; 2]) -> anyhow::Result<(SpringApp, SpringApp)> {
        let (a, b) = tokio::join!(SpringApp::start(registry, ids[0]), SpringApp::start(registry, ids[1]));
        Ok((a?, b?))
    }

    fn spawn(jar: &Path, registry: &Registry, instance_id: &str) -> anyhow::Result<SpringApp> {
        let dir = tempfile::Builder::new().prefix("meshbridge-spring-app-").tempdir()?;
        let port = free_port();
        let mut cmd = jvm::java_command(jar, dir.path());
        cmd.arg(format!("--server.port={port}")).arg(format!("--greeter.instance-id={instance_id}"));
        cmd.args(registry.args());
        let guard = ChildGuard::spawn(instance_id, cmd, dir.path().join("app.log"))?;
        Ok(SpringApp { port, instance_id: instance_id.to_string(), guard, _dir: dir })
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `127.0.0.1:{port}`, as an endpoint.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The app's output so far (its tail).
    pub fn log(&self) -> String {
        self.guard.log_tail(8000)
    }

    /// The JVM's process id (to SIGSTOP / SIGCONT it).
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    /// `POST /actuator/serviceregistry {"status": status}`: the starter
    /// sets the instance's status in its registry (an operator taking it
    /// out of traffic, or back in).
    pub async fn set_status(&self, status: &str) -> anyhow::Result<()> {
        let resp = reqwest::Client::new()
            .post(self.url("/actuator/serviceregistry"))
            .json(&serde_json::json!({ "status": status }))
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await?;
        let code = resp.status();
        anyhow::ensure!(code.is_success(), "set status {status}: {code}: {}", resp.text().await.unwrap_or_default());
        Ok(())
    }

    /// SIGTERM, as a platform stops it: the starter deregisters the
    /// instance on the way out. Waits for the exit.
    pub async fn stop_gracefully(&mut self) -> anyhow::Result<()> {
        jvm::stop_gracefully(&mut self.guard).await
    }
}
