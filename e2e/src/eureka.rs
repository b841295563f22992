//! A real Eureka server: the Spring Cloud Netflix app in `e2e/eureka-server`
//! (`MESHBRIDGE_EUREKA_SERVER_JAR`, built by `e2e/setup.sh eureka-server`),
//! started with `java -jar` on a free loopback port in a temp dir and killed
//! when dropped. Standalone, or two servers peered with each other
//! ([`EurekaServer::start_pair`]), replicating every change.
//!
//! Its settings (`application.properties`) are for tests: no
//! self-preservation, eviction every second, reads from the read-write
//! response cache (every change invalidates it, so an answer shows every
//! change made before it), and no five-minute 403 after an empty start.
//!
//! [`EurekaApi`] is the REST API a discovery client uses (register, cancel,
//! status overrides, heartbeats, reads), for this server and the fake alike.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::jvm::{self, READY_TIMEOUT, START_ATTEMPTS};
use crate::process::{ChildGuard, binary_from_env, free_port};

const JAR_VAR: &str = "MESHBRIDGE_EUREKA_SERVER_JAR";

/// A running server; killed (SIGKILL) when dropped.
pub struct EurekaServer {
    pub port: u16,
    pub api: EurekaApi,
    jar: PathBuf,
    jvm: Vec<String>,
    args: Vec<String>,
    guard: ChildGuard,
    dir: TempDir,
}

impl EurekaServer {
    /// A standalone server, ready to answer.
    pub async fn start() -> anyhow::Result<EurekaServer> {
        EurekaServer::start_with(&[]).await
    }

    /// A standalone server with extra `--key=value` Spring properties.
    pub async fn start_with(props: &[&str]) -> anyhow::Result<EurekaServer> {
        EurekaServer::start_with_jvm(&[], props).await
    }

    /// [`start_with`](Self::start_with) plus JVM options after the
    /// harness's own (`-Xmx1024m` wins over its `-Xmx256m`): a bench's
    /// catalog may need a larger heap than a test's.
    pub async fn start_with_jvm(jvm: &[&str], props: &[&str]) -> anyhow::Result<EurekaServer> {
        let jar = binary_from_env(JAR_VAR)?;
        let jvm: Vec<String> = jvm.iter().map(|o| o.to_string()).collect();
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let mut server = EurekaServer::spawn(&jar, port, None, &jvm, props)?;
            match server.wait_ready().await {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e.context(format!("eureka log:\n{}", server.log()))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("eureka did not start")))
    }

    /// Two servers, each the other's peer: a change made at one is
    /// replicated to the other (batched, within a second or two).
    pub async fn start_pair() -> anyhow::Result<(EurekaServer, EurekaServer)> {
        let jar = binary_from_env(JAR_VAR)?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let (pa, pb) = (free_port(), free_port());
            if pa == pb {
                continue;
            }
            let mut a = EurekaServer::spawn(&jar, pa, Some(pb), &[], &[])?;
            let mut b = EurekaServer::spawn(&jar, pb, Some(pa), &[], &[])?;
            let (ra, rb) = tokio::join!(a.wait_ready(), b.wait_ready());
            match (ra, rb) {
                (Ok(()), Ok(())) => return Ok((a, b)),
                (Err(e), _) => last_err = Some(e.context(format!("eureka A log:\n{}", a.log()))),
                (_, Err(e)) => last_err = Some(e.context(format!("eureka B log:\n{}", b.log()))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("eureka pair did not start")))
    }

    fn spawn(jar: &Path, port: u16, peer: Option<u16>, jvm: &[String], props: &[&str]) -> anyhow::Result<EurekaServer> {
        let dir = tempfile::Builder::new().prefix("meshbridge-eureka-").tempdir()?;
        let mut args = vec![format!("--server.port={port}")];
        if let Some(peer) = peer {
            args.push(format!("--eureka.peers={}", service_url(peer)));
        }
        args.extend(props.iter().map(|p| p.to_string()));
        let guard = spawn("eureka", jar, dir.path(), jvm, &args)?;
        Ok(EurekaServer {
            port,
            api: EurekaApi::new(&format!("127.0.0.1:{port}")),
            jar: jar.to_path_buf(),
            jvm: jvm.to_vec(),
            args,
            guard,
            dir,
        })
    }

    /// `127.0.0.1:port`, as a registry `domain` entry.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's process id while it runs (a bench reads its CPU).
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    /// The server's output so far (its tail).
    pub fn log(&self) -> String {
        self.guard.log_tail(8000)
    }

    /// Kill the server (SIGKILL): clients see connection refused. Its
    /// registry lives in memory only, so it is gone.
    pub fn stop(&mut self) {
        self.guard.kill();
    }

    /// Start it again on the same port with the same settings, plus
    /// `props`; it comes back empty, as a real standalone server does.
    pub async fn restart_with(&mut self, props: &[&str]) -> anyhow::Result<()> {
        self.guard.kill();
        self.args.extend(props.iter().map(|p| p.to_string()));
        self.guard = spawn("eureka", &self.jar, self.dir.path(), &self.jvm, &self.args)?;
        self.wait_until(|status| status.is_some()).await.with_context(|| format!("eureka log:\n{}", self.log()))
    }

    /// Wait until `GET /eureka/apps` answers 200.
    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        self.wait_until(|status| status == Some(StatusCode::OK)).await
    }

    /// Wait until the status `GET /eureka/apps` answers with (`None`: no
    /// answer) satisfies `ready`.
    async fn wait_until(&mut self, ready: impl Fn(Option<StatusCode>) -> bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.guard.is_running() {
                bail!("eureka exited during startup");
            }
            if ready(self.api.apps_status().await) {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "eureka not ready after {READY_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The Spring Cloud app in `e2e/eureka-client` (`MESHBRIDGE_EUREKA_CLIENT_JAR`):
/// `spring-boot-starter-web` with one endpoint, `GET /`, answering its
/// `reply`, and `spring-cloud-starter-netflix-eureka-client`, which
/// registers it as app GREETER (instance `greeter:PORT`, 127.0.0.1,
/// renewing every second, expiring after 3 s). Killed when dropped.
pub struct GreeterApp {
    pub port: u16,
    guard: ChildGuard,
    _dir: TempDir,
}

const CLIENT_JAR_VAR: &str = "MESHBRIDGE_EUREKA_CLIENT_JAR";

impl GreeterApp {
    /// Start it on a free port, registering with `eureka`; ready once it
    /// serves `GET /` (it registers itself at the same time or just after).
    pub async fn start(eureka: &EurekaServer, reply: &str) -> anyhow::Result<GreeterApp> {
        let jar = binary_from_env(CLIENT_JAR_VAR)?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new().prefix("meshbridge-greeter-").tempdir()?;
            let port = free_port();
            let args = [
                format!("--server.port={port}"),
                format!("--eureka.client.service-url.defaultZone={}", service_url(eureka.port)),
                format!("--greeter.reply={reply}"),
            ];
            let guard = spawn("greeter", &jar, dir.path(), &[], &args)?;
            let mut app = GreeterApp { port, guard, _dir: dir };
            match app.wait_ready().await {
                Ok(()) => return Ok(app),
                Err(e) => last_err = Some(e.context(format!("greeter log:\n{}", app.guard.log_tail(8000)))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("greeter did not start")))
    }

    /// Its Eureka instance id.
    pub fn instance_id(&self) -> String {
        format!("greeter:{}", self.port)
    }

    pub fn log(&self) -> String {
        self.guard.log_tail(8000)
    }

    /// SIGTERM, as a platform stopping it: Spring shuts down and the Eureka
    /// client cancels its registration on the way out. Waits for the exit.
    pub async fn stop_gracefully(&mut self) -> anyhow::Result<()> {
        jvm::stop_gracefully(&mut self.guard).await
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        jvm::wait_serving(&mut self.guard, &format!("http://127.0.0.1:{}/", self.port)).await
    }
}

fn service_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/eureka/")
}

fn spawn(name: &str, jar: &Path, dir: &Path, jvm_options: &[String], args: &[String]) -> anyhow::Result<ChildGuard> {
    let mut cmd = jvm::java_command_with(jar, dir, jvm_options);
    cmd.args(args).env_remove("EUREKA_PEERS").env_remove("EUREKA_PORT");
    ChildGuard::spawn(name, cmd, dir.join(format!("{name}.log")))
}

/// An instance as a Spring Cloud client registers it: plain port enabled,
/// secure port 443 disabled, no metadata. The lease lasts an hour, so no
/// test instance expires unless a test asks (a real client renews every
/// 30 s instead).
pub fn instance(app: &str, id: &str, ip: &str, port: u16, status: &str) -> Value {
    json!({
        "instanceId": id,
        "hostName": ip,
        "app": app.to_uppercase(),
        "ipAddr": ip,
        "status": status,
        "overriddenstatus": "UNKNOWN",
        "port": {"$": port, "@enabled": "true"},
        "securePort": {"$": 443, "@enabled": "false"},
        "countryId": 1,
        "dataCenterInfo": {"@class": "com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo", "name": "MyOwn"},
        "leaseInfo": {"renewalIntervalInSecs": 30, "durationInSecs": 3600},
        "metadata": {"@class": "java.util.Collections$EmptyMap"},
        "vipAddress": app.to_lowercase(),
        "isCoordinatingDiscoveryServer": "false",
    })
}

/// Eureka's REST API at one server, as a discovery client calls it.
#[derive(Clone)]
pub struct EurekaApi {
    http: reqwest::Client,
    base: String,
}

impl EurekaApi {
    /// `host_port` is `127.0.0.1:port`.
    pub fn new(host_port: &str) -> EurekaApi {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("a plain HTTP client");
        EurekaApi { http, base: format!("http://{host_port}/eureka") }
    }

    /// `POST /eureka/apps/{app}` with `{"instance": instance}` (204).
    pub async fn register(&self, instance: Value) -> anyhow::Result<()> {
        let app = instance["app"].as_str().context("instance without app")?.to_string();
        let body = json!({ "instance": instance });
        let resp = self.http.post(format!("{}/apps/{app}", self.base)).json(&body).send().await?;
        ensure!(resp.status() == StatusCode::NO_CONTENT, "register {app}: {}", resp.status());
        Ok(())
    }

    /// `DELETE /eureka/apps/{app}/{id}`: cancel.
    pub async fn deregister(&self, app: &str, id: &str) -> anyhow::Result<()> {
        let resp = self.http.delete(format!("{}/apps/{app}/{id}", self.base)).send().await?;
        ensure!(resp.status().is_success(), "deregister {app}/{id}: {}", resp.status());
        Ok(())
    }

    /// `PUT /eureka/apps/{app}/{id}/status?value={status}`: set the
    /// overridden status (an operator taking an instance out, or back).
    pub async fn set_status(&self, app: &str, id: &str, status: &str) -> anyhow::Result<()> {
        let url = format!("{}/apps/{app}/{id}/status", self.base);
        let resp = self.http.put(url).query(&[("value", status)]).send().await?;
        ensure!(resp.status().is_success(), "status {app}/{id}={status}: {}", resp.status());
        Ok(())
    }

    /// `DELETE /eureka/apps/{app}/{id}/status?value={status}`: drop the
    /// override; the instance's status becomes `status`.
    pub async fn delete_override(&self, app: &str, id: &str, status: &str) -> anyhow::Result<()> {
        let url = format!("{}/apps/{app}/{id}/status", self.base);
        let resp = self.http.delete(url).query(&[("value", status)]).send().await?;
        ensure!(resp.status().is_success(), "delete override {app}/{id}: {}", resp.status());
        Ok(())
    }

    /// `PUT /eureka/apps/{app}/{id}`: renew the lease (200; 404 when the
    /// server does not know the instance).
    pub async fn heartbeat(&self, app: &str, id: &str) -> anyhow::Result<()> {
        let resp = self.http.put(format!("{}/apps/{app}/{id}", self.base)).send().await?;
        ensure!(resp.status().is_success(), "heartbeat {app}/{id}: {}", resp.status());
        Ok(())
    }

    /// `GET /eureka/apps` (every app, every status) as JSON.
    pub async fn apps(&self) -> anyhow::Result<Value> {
        self.get_json("/apps").await
    }

    /// `GET /eureka/apps/delta` as JSON.
    pub async fn delta(&self) -> anyhow::Result<Value> {
        self.get_json("/apps/delta").await
    }

    async fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let resp = self.http.get(format!("{}{path}", self.base)).header("Accept", "application/json").send().await?;
        ensure!(resp.status().is_success(), "GET {path}: {}", resp.status());
        Ok(resp.json().await?)
    }

    /// The status `GET /eureka/apps` answers with, or `None` when nothing
    /// answers.
    async fn apps_status(&self) -> Option<StatusCode> {
        let req = self.http.get(format!("{}/apps", self.base)).header("Accept", "application/json");
        req.timeout(Duration::from_secs(2)).send().await.ok().map(|r| r.status())
    }
}

/// Every instance in an `/eureka/apps` answer, with its app's name. One
/// element lists may be bare objects (old servers); a missing list is empty.
pub fn instances_of(apps: &Value) -> Vec<(String, Value)> {
    let list = |v: &Value| match v {
        Value::Array(items) => items.clone(),
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    };
    let mut out = Vec::new();
    for a in list(&apps["applications"]["application"]) {
        let name = a["name"].as_str().unwrap_or_default().to_string();
        out.extend(list(&a["instance"]).into_iter().map(|i| (name.clone(), i)));
    }
    out
}
