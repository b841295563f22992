//! What the JVM harnesses ([`crate::eureka`], [`crate::spring_app`],
//! [`crate::dubbo`]) share: how a jar is started, how readiness is awaited, how it is stopped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use crate::process::ChildGuard;

/// Spring Boot on a busy 2-core machine: 15 s alone, 40 s beside a build.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// A port picked by `free_port` can be taken before the JVM binds it.
pub const START_ATTEMPTS: usize = 3;
/// A short-lived JVM: C1 only, the serial collector, a small heap, the
/// JDK's class-data archive when there is one. It starts about twice as
/// fast as with the defaults.
const JVM_FLAGS: [&str; 4] = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m", "-Xshare:auto"];

/// `java` (from `JAVA_HOME` when set) with [`JVM_FLAGS`], `-jar jar`, in
/// `dir`, which is also its temp dir and its home: nothing it writes
/// (Nacos's client keeps logs and a cache under `~`) leaves the test's dir.
pub fn java_command(jar: &Path, dir: &Path) -> Command {
    java_command_with(jar, dir, std::iter::empty::<String>())
}

/// [`java_command`] with JVM options (`-Dkey=value` system properties)
/// before `-jar`; the program's own arguments go after, with `cmd.arg`.
pub fn java_command_with<S: AsRef<std::ffi::OsStr>>(
    jar: &Path,
    dir: &Path,
    jvm_options: impl IntoIterator<Item = S>,
) -> Command {
    let java =
        std::env::var_os("JAVA_HOME").map_or_else(|| PathBuf::from("java"), |h| PathBuf::from(h).join("bin/java"));
    let mut cmd = Command::new(java);
    cmd.args(JVM_FLAGS)
        .arg(format!("-Djava.io.tmpdir={}", dir.display()))
        .arg(format!("-Duser.home={}", dir.display()))
        .args(jvm_options)
        .arg("-jar")
        .arg(jar)
        .current_dir(dir);
    cmd
}

/// Wait until `GET url` answers 2xx, failing early if the process exits.
pub async fn wait_serving(guard: &mut ChildGuard, url: &str) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if !guard.is_running() {
            bail!("{} exited during startup", guard.name());
        }
        let ok = http.get(url).timeout(Duration::from_secs(2)).send().await.is_ok_and(|r| r.status().is_success());
        if ok {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{} not serving {url} after {READY_TIMEOUT:?}", guard.name());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// SIGTERM, as a platform stopping an app: Spring shuts down, and its
/// discovery client deregisters on the way out. Waits for the exit.
pub async fn stop_gracefully(guard: &mut ChildGuard) -> anyhow::Result<()> {
    let pid = guard.id().with_context(|| format!("{} not running", guard.name()))?;
    crate::faults::signal(pid, "-TERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    while guard.is_running() {
        ensure!(
            Instant::now() < deadline,
            "{} still running 30 s after SIGTERM:\n{}",
            guard.name(),
            guard.log_tail(8000)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
