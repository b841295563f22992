//! A real ZooKeeper 3.8 standalone server, from Debian's `zookeeper` package
//! (`MESHBRIDGE_ZK_JAR`, see `e2e/setup.sh`), on a free loopback port, and a
//! small client for tests to create and delete nodes.
//!
//! The server ticks every 500 ms and caps sessions at [`MAX_SESSION`], so a
//! session whose server has been gone a few seconds expires: tests can see
//! expiry without long waits. [`ZooKeeper::restart`] keeps the port and the
//! data dir, so persistent nodes survive it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use tempfile::TempDir;
use zookeeper_client as zk;

use crate::netns::Host;
use crate::process::{ChildGuard, binary_from_env, free_port};

const JAR_VAR: &str = "MESHBRIDGE_ZK_JAR";
/// The JVM is slow to start on a busy 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// `maxSessionTimeout`: what the server negotiates any session down to.
pub const MAX_SESSION: Duration = Duration::from_secs(3);
/// Attempts at a fresh start: a port picked by `free_port` can be taken by
/// another test before ZooKeeper binds it.
const START_ATTEMPTS: usize = 3;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The JVM heap for the tests' trees.
const DEFAULT_HEAP_MB: usize = 256;

pub struct ZooKeeper {
    pub port: u16,
    /// Where the server runs and is reached (loopback unless started in a
    /// network namespace).
    pub host: Host,
    jar: PathBuf,
    guard: ChildGuard,
    dir: TempDir,
    /// The server's `maxSessionTimeout`, and the test clients' session.
    max_session: Duration,
    /// The JVM's `-Xmx`, in MiB.
    heap_mb: usize,
}

impl ZooKeeper {
    /// Start a standalone server and wait until it serves a session.
    pub async fn start() -> anyhow::Result<ZooKeeper> {
        ZooKeeper::start_at(Host::loopback()).await
    }

    /// [`ZooKeeper::start`] at `host` (e.g. in a network namespace).
    pub async fn start_at(host: Host) -> anyhow::Result<ZooKeeper> {
        ZooKeeper::start_with(host, MAX_SESSION).await
    }

    /// [`ZooKeeper::start_at`] with sessions of up to `max_session`, for the
    /// test's own clients too: tests that expire no session and run long on
    /// a loaded machine, where a 3 s session's 1.2 s answer limit can be
    /// missed by the JVM.
    pub async fn start_with(host: Host, max_session: Duration) -> anyhow::Result<ZooKeeper> {
        ZooKeeper::start_sized(host, max_session, DEFAULT_HEAP_MB).await
    }

    /// [`ZooKeeper::start_with`] with a heap of `heap_mb` MiB, for catalogs
    /// past the tests' few thousand nodes (the benches' 100k services).
    pub async fn start_sized(host: Host, max_session: Duration, heap_mb: usize) -> anyhow::Result<ZooKeeper> {
        let jar = binary_from_env(JAR_VAR)?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new().prefix("meshbridge-zk-").tempdir()?;
            let port = free_port();
            std::fs::write(dir.path().join("zoo.cfg"), config(&host, port, dir.path(), max_session))?;
            let guard = spawn(&host, &jar, dir.path(), heap_mb)?;
            let mut zk = ZooKeeper { port, host: host.clone(), jar: jar.clone(), guard, dir, max_session, heap_mb };
            match zk.wait_ready().await {
                Ok(()) => return Ok(zk),
                Err(e) => last_err = Some(e.context(format!("zookeeper log:\n{}", zk.log()))),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("zookeeper did not start")))
    }

    /// `{host}:{port}`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host.ip, self.port)
    }

    /// The server's process id (to SIGSTOP / SIGCONT it).
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    /// The server's output so far (its tail is what matters).
    pub fn log(&self) -> String {
        let mut s = self.guard.log();
        let cut = s.len().saturating_sub(8000);
        s.split_off(s.char_indices().map(|(i, _)| i).find(|i| *i >= cut).unwrap_or(0))
    }

    /// Kill the server (SIGKILL): clients see connection refused.
    pub fn stop(&mut self) {
        self.guard.kill();
    }

    /// Start the server again on the same port and data dir.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.guard.kill();
        self.guard = spawn(&self.host, &self.jar, self.dir.path(), self.heap_mb)?;
        self.wait_ready().await.with_context(|| format!("zookeeper log:\n{}", self.log()))
    }

    /// A new client session, for the test to change the tree with.
    pub async fn client(&self) -> anyhow::Result<ZkClient> {
        ZkClient::connect_with(&self.addr(), self.max_session).await
    }

    /// [`ZooKeeper::client`] authenticated as `scheme` `auth` (`addauth`),
    /// e.g. `digest` `user:password`, as an app with ZooKeeper ACLs is.
    pub async fn client_with_auth(&self, scheme: &str, auth: &[u8]) -> anyhow::Result<ZkClient> {
        let connector =
            zk::Client::connector().with_session_timeout(self.max_session).with_fail_eagerly().with_auth(scheme, auth);
        let addr = self.addr();
        let client = tokio::time::timeout(CALL_TIMEOUT, connector.connect(&addr))
            .await
            .with_context(|| format!("connect {addr}: timed out"))?
            .with_context(|| format!("connect {addr} with {scheme} auth"))?;
        Ok(ZkClient { client })
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.guard.is_running() {
                bail!("zookeeper exited during startup");
            }
            if let Ok(client) = ZkClient::connect(&self.addr()).await
                && client.exists("/").await.unwrap_or(false)
            {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "zookeeper not ready after {READY_TIMEOUT:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn config(host: &Host, port: u16, dir: &Path, max_session: Duration) -> String {
    format!(
        "dataDir={data}\nclientPort={port}\nclientPortAddress={ip}\nadmin.enableServer=false\n\
         tickTime=500\nmaxSessionTimeout={max}\n4lw.commands.whitelist=*\n",
        data = dir.join("data").display(),
        max = max_session.as_millis(),
        ip = host.ip,
    )
}

fn spawn(host: &Host, jar: &Path, dir: &Path, heap_mb: usize) -> anyhow::Result<ChildGuard> {
    // Debian's zookeeper.jar names its dependencies in its manifest; a
    // logging backend is all it lacks.
    let mut classpath = jar.display().to_string();
    if let Some(simple) = jar.parent().map(|d| d.join("slf4j-simple.jar")).filter(|p| p.exists()) {
        classpath = format!("{classpath}:{}", simple.display());
    }
    let java = std::env::var_os("JAVA_HOME").map(|h| PathBuf::from(h).join("bin/java")).filter(|j| j.exists());
    let mut cmd = host.command(java.unwrap_or_else(|| "java".into()));
    cmd.arg(format!("-Xmx{heap_mb}m"))
        .args(["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Dzookeeper.admin.enableServer=false"])
        .arg("-cp")
        .arg(classpath)
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(dir.join("zoo.cfg"))
        .current_dir(dir);
    ChildGuard::spawn("zookeeper", cmd, dir.join("zookeeper.log"))
}

/// A client session for tests: persistent nodes, parents made as needed.
pub struct ZkClient {
    client: zk::Client,
}

impl ZkClient {
    pub async fn connect(addr: &str) -> anyhow::Result<ZkClient> {
        ZkClient::connect_with(addr, MAX_SESSION).await
    }

    /// [`ZkClient::connect`] asking for a `session` timeout.
    pub async fn connect_with(addr: &str, session: Duration) -> anyhow::Result<ZkClient> {
        let connector = zk::Client::connector().with_session_timeout(session).with_fail_eagerly();
        let client = tokio::time::timeout(CALL_TIMEOUT, connector.connect(addr))
            .await
            .with_context(|| format!("connect {addr}: timed out"))?
            .with_context(|| format!("connect {addr}"))?;
        Ok(ZkClient { client })
    }

    /// The session itself, for calls this wrapper does not have (ephemeral
    /// nodes, reads).
    pub fn zk(&self) -> &zk::Client {
        &self.client
    }

    pub async fn exists(&self, path: &str) -> anyhow::Result<bool> {
        Ok(timed(path, self.client.check_stat(path)).await?.is_some())
    }

    /// Create `path` with `data`, and any missing parents (empty), or set
    /// its data if it exists.
    pub async fn put(&self, path: &str, data: &[u8]) -> anyhow::Result<()> {
        let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        if let Some((parent, _)) = path.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            timed(parent, self.client.mkdir(parent, &options)).await?;
        }
        match timed(path, self.client.create(path, data, &options)).await {
            Ok(_) => Ok(()),
            Err(e) if e.downcast_ref::<zk::Error>() == Some(&zk::Error::NodeExists) => {
                timed(path, self.client.set_data(path, data, None)).await.map(|_| ())
            }
            Err(e) => Err(e),
        }
    }

    /// Delete `path` and everything under it; nothing there is fine.
    pub async fn delete_tree(&self, path: &str) -> anyhow::Result<()> {
        let children = match timed(path, self.client.list_children(path)).await {
            Ok(children) => children,
            Err(e) if e.downcast_ref::<zk::Error>() == Some(&zk::Error::NoNode) => return Ok(()),
            Err(e) => return Err(e),
        };
        for child in children {
            let child = if path == "/" { format!("/{child}") } else { format!("{path}/{child}") };
            Box::pin(self.delete_tree(&child)).await?;
        }
        match timed(path, self.client.delete(path, None)).await {
            Err(e) if e.downcast_ref::<zk::Error>() == Some(&zk::Error::NoNode) => Ok(()),
            other => other,
        }
    }

    /// Register a Dubbo provider the way Dubbo does: a node named by its URL,
    /// encoded once, under `/dubbo/{interface}/providers`. Returns its path.
    pub async fn add_dubbo_provider(&self, interface: &str, url: &str) -> anyhow::Result<String> {
        let path = format!("/dubbo/{interface}/providers/{}", dubbo_node_name(url));
        self.put(&path, b"").await?;
        Ok(path)
    }

    /// Register a new Dubbo interface with one provider as an app with a
    /// ZooKeeper ACL does (Curator's `ACLProvider`): its `providers` node
    /// and the provider are readable only by this session's authenticated
    /// identity (`creator_all`, e.g. `digest:u:…:cdrwa`); the interface node
    /// is open. In one transaction, so that whoever sees the interface appear
    /// finds its providers there. Returns the `providers` path.
    pub async fn add_secured_dubbo_interface(&self, interface: &str, url: &str) -> anyhow::Result<String> {
        let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
        timed("/dubbo", self.client.mkdir("/dubbo", &open)).await?;
        let secured = zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all());
        let service = format!("/dubbo/{interface}");
        let providers = format!("{service}/providers");
        let provider = format!("{providers}/{}", dubbo_node_name(url));
        let mut txn = self.client.new_multi_writer();
        txn.add_create(&service, b"", &open)?;
        txn.add_create(&providers, b"", &secured)?;
        txn.add_create(&provider, b"", &secured)?;
        match tokio::time::timeout(CALL_TIMEOUT, txn.commit()).await {
            Ok(Ok(_)) => Ok(providers),
            Ok(Err(e)) => bail!("create {providers} with a creator-only ACL: {e}"),
            Err(_) => bail!("create {providers} with a creator-only ACL: timed out"),
        }
    }

    /// `setAcl path world:anyone:r` on top of the ACL `path` has (needs this
    /// session to hold ADMIN on it).
    pub async fn grant_world_read(&self, path: &str) -> anyhow::Result<()> {
        self.edit_acl(path, |acls| acls.push(zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()))).await
    }

    /// Take every `world:anyone` entry out of the ACL of `path`.
    pub async fn revoke_world_access(&self, path: &str) -> anyhow::Result<()> {
        self.edit_acl(path, |acls| acls.retain(|acl| acl.scheme() != "world")).await
    }

    async fn edit_acl(&self, path: &str, edit: impl FnOnce(&mut Vec<zk::Acl>)) -> anyhow::Result<()> {
        let (mut acls, stat) = timed(path, self.client.get_acl(path)).await?;
        edit(&mut acls);
        timed(path, self.client.set_acl(path, &acls, Some(stat.aversion))).await.map(|_| ())
    }
}

async fn timed<T>(path: &str, call: impl Future<Output = Result<T, zk::Error>>) -> anyhow::Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context(format!("zookeeper call on {path}"))),
        Err(_) => bail!("zookeeper call on {path}: timed out"),
    }
}

/// What Java's `URLEncoder.encode(url, "UTF-8")` gives, which is how Dubbo
/// names provider nodes.
pub fn dubbo_node_name(url: &str) -> String {
    let mut out = String::with_capacity(url.len() * 2);
    for b in url.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'*' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_form_encoded() {
        assert_eq!(
            dubbo_node_name("dubbo://10.0.0.1:20880/a.B?x=1&y=a b"),
            "dubbo%3A%2F%2F10.0.0.1%3A20880%2Fa.B%3Fx%3D1%26y%3Da+b"
        );
    }
}
