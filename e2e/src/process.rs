//! Process and port helpers shared by every harness.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that is free now, for a server that binds it later (often much
/// later: an Envoy binds its gateway listener only when LDS arrives).
///
/// It comes from below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768–60999 by default), where neither
/// a `bind` to port 0 nor the local port of an outgoing connection can land,
/// so nothing else in the tests takes it in between. Each process walks the
/// range from its own starting point (its pid) and never hands a port out
/// twice; a port something already holds (on any address) is skipped. On a
/// machine whose ephemeral range leaves no room below it, the port is the
/// kernel's pick, as before.
///
/// Test binaries that run at the same time (e2e/run-tests.py's lanes) get
/// disjoint shares of the range: `MESHBRIDGE_TEST_PORT_SLOT=k/n` gives this
/// process share `k` of `n`, so no two lanes can hand out the same port.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    static RANGE: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    let (low, high) = *RANGE.get_or_init(|| {
        let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(0);
        port_share(LOW, high, std::env::var("MESHBRIDGE_TEST_PORT_SLOT").ok().as_deref())
    });
    if high > low + 1_000 {
        let span = high - low;
        let start = std::process::id().wrapping_mul(7919);
        for _ in 0..span {
            let port = low + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            let port = u16::try_from(port).expect("below the ephemeral range");
            if TcpListener::bind(("0.0.0.0", port)).is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// Share `k` of `n` (`slot` is "k/n") of the ports from `low` to `high`,
/// or all of them when there is no slot. A malformed slot panics: it comes
/// from the test runner, never from a user.
fn port_share(low: u32, high: u32, slot: Option<&str>) -> (u32, u32) {
    let Some(slot) = slot else { return (low, high) };
    let parsed = slot.split_once('/').and_then(|(k, n)| Some((k.parse::<u32>().ok()?, n.parse::<u32>().ok()?)));
    let (k, n) = match parsed {
        Some((k, n)) if k < n => (k, n),
        _ => panic!("MESHBRIDGE_TEST_PORT_SLOT={slot}: want k/n with k < n"),
    };
    if high <= low {
        return (low, high);
    }
    let share = (high - low) / n;
    (low + k * share, low + (k + 1) * share)
}

/// The path of a server binary installed by `e2e/setup.sh`, from `var`.
pub fn binary_from_env(var: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("{var} is not set: run `source e2e/env.sh` (it installs the server)"))?;
    anyhow::ensure!(path.exists(), "{var}={} does not exist: run e2e/setup.sh", path.display());
    Ok(path)
}

/// Run a command line tool to its end: its stdout, or an error with `what`
/// (the command as the test wrote it) and its stderr.
pub async fn stdout_of(mut cmd: tokio::process::Command, what: &str) -> anyhow::Result<String> {
    let out = cmd.output().await.map_err(|e| anyhow::anyhow!("run {what}: {e}"))?;
    anyhow::ensure!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Kills (SIGKILL) and reaps the child when dropped. Output goes to a log
/// file in the test's temp dir, printed by [`ChildGuard::log`] on failure.
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ChildGuard {
    /// Spawn `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: PathBuf) -> anyhow::Result<ChildGuard> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd.spawn().map_err(|e| anyhow::anyhow!("spawn {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(ChildGuard { name: name.to_string(), child: Some(child), log })
    }

    /// Like [`ChildGuard::spawn`], but stderr is a pipe handed back to the
    /// caller, who must keep reading it (and may copy it to `log`).
    pub fn spawn_piped_stderr(name: &str, mut cmd: Command, log: PathBuf) -> anyhow::Result<(ChildGuard, ChildStderr)> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| anyhow::anyhow!("spawn {name} ({:?}): {e}", cmd.get_program()))?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("{name}: no stderr pipe"))?;
        Ok((ChildGuard { name: name.to_string(), child: Some(child), log }, stderr))
    }

    /// The process output so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `max` bytes or so of [`ChildGuard::log`] (cut at a char
    /// boundary): what matters in a failure message.
    pub fn log_tail(&self, max: usize) -> String {
        let mut s = self.log();
        let cut = s.len().saturating_sub(max);
        s.split_off(s.char_indices().map(|(i, _)| i).find(|i| *i >= cut).unwrap_or(s.len()))
    }

    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Stop the process now (SIGKILL) and wait for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Wait until something accepts TCP connections on `addr`.
pub async fn wait_for_tcp(addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "nothing listening on {addr} after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until `GET url` answers 2xx.
pub async fn wait_for_http(url: &str, timeout: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + timeout;
    loop {
        match client.get(url).timeout(Duration::from_secs(2)).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            _ => {}
        }
        anyhow::ensure!(Instant::now() < deadline, "{url} not ready after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::port_share;

    #[test]
    fn lanes_get_disjoint_shares_of_the_port_range() {
        assert_eq!(port_share(10_000, 32_768, None), (10_000, 32_768));
        let (a, b) = (port_share(10_000, 32_768, Some("0/2")), port_share(10_000, 32_768, Some("1/2")));
        assert_eq!(a, (10_000, 21_384));
        assert_eq!(b, (21_384, 32_768));
        let thirds: Vec<_> = (0..3).map(|k| port_share(10_000, 32_768, Some(&format!("{k}/3")))).collect();
        assert!(thirds.windows(2).all(|w| w[0].1 == w[1].0), "{thirds:?}");
    }

    #[test]
    #[should_panic(expected = "want k/n with k < n")]
    fn a_slot_past_its_count_is_refused() {
        port_share(10_000, 32_768, Some("2/2"));
    }
}
