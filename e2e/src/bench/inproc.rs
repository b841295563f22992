//! For tools that run the code under test in their own process
//! (`consul_change_cost`, `zookeeper_change_cost`): two runtimes, the
//! harness's threads named [`HARNESS_THREAD`] so that the CPU of every
//! other thread is the watcher's.

use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

use super::procfs::HARNESS_THREAD;

/// The watcher counts as idle once its threads used less than this in
/// [`IDLE_STEP`].
const IDLE_CPU: Duration = Duration::from_micros(500);
const IDLE_STEP: Duration = Duration::from_millis(150);

/// The harness's runtime and the watcher's, two workers each; their
/// threads are kept for the whole run, so no thread's CPU is lost when it
/// exits.
pub fn runtimes() -> std::io::Result<(Runtime, Runtime)> {
    let build = |name: &str| {
        Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .thread_keep_alive(Duration::from_secs(86_400))
            .enable_all()
            .build()
    };
    Ok((build(HARNESS_THREAD)?, build("watcher")?))
}

/// On-CPU time so far of every thread of this process but the harness's.
pub fn others_cpu() -> Duration {
    let mut ns = 0u64;
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Duration::ZERO };
    for task in tasks.flatten() {
        if std::fs::read_to_string(task.path().join("comm")).unwrap_or_default().trim() == HARNESS_THREAD {
            continue;
        }
        let sched = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += sched.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Duration::from_nanos(ns)
}

/// Returns once the watcher's threads have gone quiet.
pub async fn until_idle() {
    let mut last = others_cpu();
    loop {
        tokio::time::sleep(IDLE_STEP).await;
        let now = others_cpu();
        if now.saturating_sub(last) < IDLE_CPU {
            return;
        }
        last = now;
    }
}
