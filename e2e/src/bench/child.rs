//! meshbridge as its own process, the release binary as a user runs it, so
//! that its CPU, memory and connections are its own (`/proc/<pid>`), apart
//! from the harness and its in-process ADS clients.
//!
//! The harness learns from the child's stderr, read as it is written:
//! the addresses it listens on (its `serving` line; both ports are 0, so
//! no port can be taken in between), and when the real Envoy ACKs an EDS
//! response. Only Envoy's stream logs at debug, through a span filter on
//! the stream id: Envoy is the first xDS client of each child, so its
//! stream is number 1 (`RUST_LOG` below). Every other stream logs at info
//! as usual, which is nothing per change.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, Command};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use meshbridge::translate::envoy::ENDPOINT_TYPE;

use super::procfs::Proc;
use crate::process::ChildGuard;

/// The child's log filter: info everywhere, debug (its `ACK` lines) for
/// xDS stream 1 only, which is the real Envoy's.
pub const LOG_FILTER: &str = "info,meshbridge::xds[ads{stream=1}]=debug";
/// How long the child may take to listen.
const START_LIMIT: Duration = Duration::from_secs(60);

/// The meshbridge binary to run: `MESHBRIDGE_BIN` if set, else `meshbridge`
/// in the cargo target directory the running executable was built into
/// (`target/<profile>/`, or its parent when run from `deps/` by `cargo
/// test`). With `build`, `cargo build -p meshbridge --bin meshbridge` runs
/// first, in the same profile and target directory (a no-op when it is up
/// to date), with the `testing` feature the e2e crate turns on so that the
/// library is not compiled twice (that feature only adds a test-helper
/// module the binary never calls).
pub fn binary(build: bool) -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("MESHBRIDGE_BIN") {
        let bin = PathBuf::from(bin);
        ensure!(bin.exists(), "MESHBRIDGE_BIN={} does not exist", bin.display());
        return Ok(bin);
    }
    let exe = std::env::current_exe().context("path of the running executable")?;
    let mut dir = exe.parent().context("executable without a directory")?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    if build {
        cargo_build(&dir)?;
    }
    let bin = dir.join("meshbridge");
    ensure!(
        bin.exists(),
        "no meshbridge binary at {}: build it (`cargo build -p meshbridge --bin meshbridge`, with --release for a \
         release harness) or set MESHBRIDGE_BIN",
        bin.display()
    );
    Ok(bin)
}

fn cargo_build(profile_dir: &Path) -> anyhow::Result<()> {
    let profile = profile_dir.file_name().and_then(|p| p.to_str()).context("target profile directory")?;
    let profile = if profile == "debug" { "dev" } else { profile };
    let target = profile_dir.parent().context("target directory")?;
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("bench: cargo build --profile {profile} -p meshbridge --features testing --bin meshbridge");
    let mut cmd = Command::new(cargo);
    // What `cargo run` sets for the bench is not the nested build's: build
    // scripts that watch these (ring's) would rebuild half the tree.
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || ["OUT_DIR", "CARGO_CRATE_NAME", "CARGO_BIN_NAME", "CARGO_PRIMARY_PACKAGE"].contains(&k.as_ref())
        {
            cmd.env_remove(&key);
        }
    }
    let status = cmd
        .args(["build", "--profile", profile, "-p", "meshbridge", "--features", "testing", "--bin", "meshbridge"])
        .arg("--manifest-path")
        .arg(manifest)
        .env("CARGO_TARGET_DIR", target)
        .status()
        .context("run cargo")?;
    ensure!(status.success(), "cargo build of the meshbridge binary failed: {status}");
    Ok(())
}

/// A running meshbridge child; dropping it kills it.
pub struct Meshbridge {
    pub xds_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub proc: Proc,
    eds_ack: Arc<Mutex<Option<Instant>>>,
    http: reqwest::Client,
    guard: ChildGuard,
}

impl Meshbridge {
    /// `meshbridge run --config-dir <config_dir>` on free loopback ports,
    /// with `env` added (e.g. `MALLOC_ARENA_MAX`); its output goes to `log`.
    pub async fn start(bin: &Path, config_dir: &Path, log: PathBuf, env: &[(String, String)]) -> anyhow::Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .arg("--config-dir")
            .arg(config_dir)
            .args(["--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .env("RUST_LOG", LOG_FILTER)
            .envs(env.iter().map(|(k, v)| (k, v)));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let (mut guard, stderr) = ChildGuard::spawn_piped_stderr("meshbridge", cmd, log)?;
        let pid = guard.id().context("meshbridge child without a pid")?;
        let eds_ack = Arc::new(Mutex::new(None));
        let (tx, rx) = mpsc::channel();
        let ack = eds_ack.clone();
        std::thread::Builder::new()
            .name("mb-stderr".into())
            .spawn(move || read_stderr(stderr, file, tx, &ack))
            .context("spawn the stderr reader")?;
        let deadline = Instant::now() + START_LIMIT;
        let serving = loop {
            if let Ok(line) = rx.try_recv() {
                break line;
            }
            if !guard.is_running() {
                bail!("meshbridge exited during startup:\n{}", guard.log());
            }
            ensure!(Instant::now() < deadline, "meshbridge not serving after {START_LIMIT:?}:\n{}", guard.log());
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let addr = |key: &str| -> anyhow::Result<SocketAddr> {
            field(&serving, key).and_then(|v| v.parse().ok()).with_context(|| format!("no {key} in {serving:?}"))
        };
        Ok(Meshbridge {
            xds_addr: addr("xds_addr")?,
            admin_addr: addr("admin_addr")?,
            proc: Proc::pid(pid),
            eds_ack,
            http: reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?,
            guard,
        })
    }

    /// (services, endpoints) over every registry, from `GET /v1/registries`.
    pub async fn counts(&self) -> Option<(usize, usize)> {
        let url = format!("http://{}/v1/registries", self.admin_addr);
        let list: Vec<serde_json::Value> = self.http.get(url).send().await.ok()?.json().await.ok()?;
        let n = |r: &serde_json::Value, k: &str| r.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
        Some(list.iter().fold((0, 0), |(s, e), r| (s + n(r, "services"), e + n(r, "endpoints"))))
    }

    /// When the real Envoy's last EDS ACK line arrived, if after `since`.
    pub fn envoy_ack_after(&self, since: Instant) -> Option<Instant> {
        let at = *self.eds_ack.lock().unwrap_or_else(PoisonError::into_inner);
        at.filter(|t| *t > since)
    }

    pub fn is_running(&mut self) -> bool {
        self.guard.is_running()
    }

    /// The child's output so far.
    pub fn log(&self) -> String {
        self.guard.log()
    }
}

/// Copy the child's stderr to `log`; send the `serving` line to `serving`
/// and stamp each EDS ACK line (only Envoy's stream logs them) on arrival.
fn read_stderr(
    stderr: ChildStderr,
    mut log: std::fs::File,
    serving: mpsc::Sender<String>,
    ack: &Mutex<Option<Instant>>,
) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        let at = Instant::now();
        if line.contains(": ACK ") && line.contains(ENDPOINT_TYPE) {
            *ack.lock().unwrap_or_else(PoisonError::into_inner) = Some(at);
        } else if line.contains(" serving ") && line.contains("xds_addr=") {
            let _ = serving.send(line.clone());
        }
        let _ = writeln!(log, "{line}");
    }
}

/// The value of `key=value` in a text log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!(" {key}="))? + key.len() + 2;
    line[at..].split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_a_text_log_line() {
        let line =
            "2026-11-23T18:00:00Z  INFO meshbridge::run: serving xds_addr=127.0.0.1:4000 admin_addr=127.0.0.1:4001";
        assert_eq!(field(line, "xds_addr"), Some("127.0.0.1:4000"));
        assert_eq!(field(line, "admin_addr"), Some("127.0.0.1:4001"));
        assert_eq!(field(line, "peer"), None);
    }
}
