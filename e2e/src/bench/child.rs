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

use std::collections::HashMap;
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
/// Directives added to [`LOG_FILTER`] for an investigation (e.g.
/// `meshbridge_registries::consul=debug`). They cost the child CPU: leave
/// it unset for figures.
pub const LOG_EXTRA_ENV: &str = "MESHBRIDGE_BENCH_LOG_FILTER";
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

/// What a single-purpose scale bench (`eureka_scale`, `nacos_scale`)
/// does around its measurement: build the meshbridge binary
/// ([`binary`]), copy it to a temp dir of its own (the target directory
/// may be shared, and another build could replace the binary under a long
/// run), run `run(copy)` on a two-thread harness runtime whose threads
/// [`super::procfs`] leaves out, and print the report it returns.
pub fn run_scale<F, Fut>(name: &str, run: F) -> anyhow::Result<()>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = anyhow::Result<String>> + Send + 'static,
{
    let built = binary(true)?;
    let keep = tempfile::Builder::new().prefix(&format!("{name}-")).tempdir()?;
    let bin = keep.path().join("meshbridge");
    std::fs::copy(&built, &bin).with_context(|| format!("copy {}", built.display()))?;
    eprintln!("{name}: meshbridge from {}", built.display());
    let harness = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(super::procfs::HARNESS_THREAD)
        .enable_all()
        .build()?;
    let run = run(bin);
    let report = harness.block_on(async move { tokio::spawn(run).await? })?;
    print!("{report}");
    Ok(())
}

/// `--meshbridge-env`'s value: `KEY=VALUE,…`.
pub fn parse_env(value: &str) -> anyhow::Result<Vec<(String, String)>> {
    value
        .split(',')
        .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect::<Option<_>>()
        .with_context(|| format!("--meshbridge-env: KEY=VALUE,…, not {value}"))
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
    eds: Arc<Mutex<Eds>>,
    http: reqwest::Client,
    guard: ChildGuard,
}

impl Meshbridge {
    /// `meshbridge run --config-dir <config_dir>` on free loopback ports,
    /// with `env` added (e.g. `MALLOC_ARENA_MAX`); its output goes to `log`.
    pub async fn start(bin: &Path, config_dir: &Path, log: PathBuf, env: &[(String, String)]) -> anyhow::Result<Self> {
        Self::start_with(bin, &["--config-dir".into(), config_dir.into()], log, env).await
    }

    /// `meshbridge run ARGS` (the config source, e.g. `--kube --kubeconfig
    /// FILE`) on free loopback ports, as [`start`](Self::start).
    pub async fn start_with(
        bin: &Path,
        args: &[std::ffi::OsString],
        log: PathBuf,
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.arg("run")
            .args(args)
            .args(["--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .env("RUST_LOG", log_filter())
            .envs(env.iter().map(|(k, v)| (k, v)));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let (mut guard, stderr) = ChildGuard::spawn_piped_stderr("meshbridge", cmd, log)?;
        let pid = guard.id().context("meshbridge child without a pid")?;
        let eds = Arc::new(Mutex::new(Eds::default()));
        let (tx, rx) = mpsc::channel();
        let stamps = eds.clone();
        std::thread::Builder::new()
            .name("mb-stderr".into())
            .spawn(move || read_stderr(stderr, file, tx, &stamps))
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
            eds,
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
        let eds = self.eds.lock().unwrap_or_else(PoisonError::into_inner);
        eds.ack.filter(|t| *t > since)
    }

    /// Envoy's own part of its last EDS ACK, if that came after `since`:
    /// from the line saying the response went out to the ACK's line.
    pub fn envoy_own_after(&self, since: Instant) -> Option<Duration> {
        let eds = self.eds.lock().unwrap_or_else(PoisonError::into_inner);
        eds.ack.filter(|t| *t > since).and(eds.own)
    }

    pub fn is_running(&mut self) -> bool {
        self.guard.is_running()
    }

    /// The child's output so far.
    pub fn log(&self) -> String {
        self.guard.log()
    }
}

/// When the real Envoy's EDS responses went out and were ACKed, as the
/// child's stream 1 logs them.
#[derive(Debug, Default)]
pub struct Eds {
    /// EDS responses sent and not yet ACKed, by nonce.
    sent: HashMap<String, Instant>,
    /// The last ACK line's arrival.
    ack: Option<Instant>,
    /// The last ACK's time since its response's `sent` line.
    own: Option<Duration>,
}

/// Unanswered nonces kept at most (Envoy ACKs or NACKs each one).
const SENT_KEPT: usize = 1024;

impl Eds {
    /// Stamp an EDS response or ACK line that arrived `at`; whether it was one.
    fn on_line(&mut self, line: &str, at: Instant) -> bool {
        if !line.contains(ENDPOINT_TYPE) {
            return false;
        }
        let nonce = field(line, "nonce").map(|n| n.trim_matches('"'));
        if line.contains(": ACK ") {
            let sent = nonce.and_then(|n| self.sent.remove(n));
            self.ack = Some(at);
            self.own = sent.map(|t| at - t);
            true
        } else if line.contains(": sent ") {
            if self.sent.len() >= SENT_KEPT {
                self.sent.clear();
            }
            if let Some(n) = nonce {
                self.sent.insert(n.to_string(), at);
            }
            true
        } else {
            false
        }
    }
}

/// Copy the child's stderr to `log`; send the `serving` line to `serving`
/// and stamp each EDS response and ACK line (only Envoy's stream logs
/// them) on arrival.
fn read_stderr(stderr: ChildStderr, mut log: std::fs::File, serving: mpsc::Sender<String>, eds: &Mutex<Eds>) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        let at = Instant::now();
        let stamped = eds.lock().unwrap_or_else(PoisonError::into_inner).on_line(&line, at);
        if !stamped && line.contains(" serving ") && line.contains("xds_addr=") {
            let _ = serving.send(line.clone());
        }
        let _ = writeln!(log, "{line}");
    }
}

/// [`LOG_FILTER`] plus the directives in [`LOG_EXTRA_ENV`], if any.
fn log_filter() -> String {
    match std::env::var(LOG_EXTRA_ENV) {
        Ok(extra) if !extra.trim().is_empty() => format!("{LOG_FILTER},{extra}"),
        _ => LOG_FILTER.to_string(),
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
    fn envoys_own_time_runs_from_the_response_to_its_ack() {
        let sent = format!(
            "2026-11-24T00:12:03Z DEBUG ads{{stream=1}}: meshbridge::xds::delta: sent delta response type_url=\"{ENDPOINT_TYPE}\" nonce=\"103\" size=1 removed=0"
        );
        let other = format!(
            "2026-11-24T00:12:03Z DEBUG ads{{stream=1}}: meshbridge::xds::delta: sent delta response type_url=\"{ENDPOINT_TYPE}\" nonce=\"104\" size=1 removed=0"
        );
        let ack = format!(
            "2026-11-24T00:12:03Z DEBUG ads{{stream=1}}: meshbridge::xds::delta: ACK type_url=\"{ENDPOINT_TYPE}\" nonce=103"
        );
        let t0 = Instant::now();
        let mut eds = Eds::default();
        assert!(eds.on_line(&sent, t0));
        assert!(eds.on_line(&other, t0 + Duration::from_millis(5)));
        assert!(!eds.on_line("INFO meshbridge::run: serving xds_addr=127.0.0.1:1", t0));
        assert_eq!(eds.ack, None);
        assert!(eds.on_line(&ack, t0 + Duration::from_millis(7)));
        assert_eq!(eds.ack, Some(t0 + Duration::from_millis(7)));
        // Timed from its own response (nonce 103), not the later one.
        assert_eq!(eds.own, Some(Duration::from_millis(7)));
        assert_eq!(eds.sent.len(), 1);
    }

    #[test]
    fn fields_are_read_from_a_text_log_line() {
        let line =
            "2026-11-23T18:00:00Z  INFO meshbridge::run: serving xds_addr=127.0.0.1:4000 admin_addr=127.0.0.1:4001";
        assert_eq!(field(line, "xds_addr"), Some("127.0.0.1:4000"));
        assert_eq!(field(line, "admin_addr"), Some("127.0.0.1:4001"));
        assert_eq!(field(line, "peer"), None);
    }
}
