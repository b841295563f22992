//! Health reporting shared by the watchers whose many loops report to one
//! sink (Consul, Nacos, ZooKeeper): every failure goes to the sink, a
//! success at most once a second, so busy loops do not flood it. A success
//! after a failure signals [`Health::recovered`], on which watchers resync.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

use tokio::sync::Notify;

use crate::watcher::{RegistryError, Sink};

/// `Sink::healthy` at most this often while all is well.
const HEALTHY_EVERY: Duration = Duration::from_secs(1);

/// Reports one watcher's calls to its sink.
pub(crate) struct Health {
    sink: Arc<dyn Sink>,
    /// The watcher's kind, for the log line of a failed call.
    watcher: &'static str,
    failed: AtomicBool,
    /// Some part of the registry (a service) cannot be read: calls that
    /// succeed are not health while it lasts.
    degraded: AtomicBool,
    last_healthy: Mutex<Option<Instant>>,
    /// Signalled when a call succeeds after a failure.
    pub recovered: Notify,
}

impl Health {
    pub fn new(sink: Arc<dyn Sink>, watcher: &'static str) -> Health {
        Health {
            sink,
            watcher,
            failed: AtomicBool::new(false),
            degraded: AtomicBool::new(false),
            last_healthy: Mutex::new(None),
            recovered: Notify::new(),
        }
    }

    /// A call succeeded. Tells the sink at once after a failure, otherwise
    /// at most every [`HEALTHY_EVERY`]; never while degraded. Returns whether
    /// this success ended a run of failures, and then signals
    /// [`Health::recovered`] (watchers resync on that).
    pub fn ok(&self) -> bool {
        let recovered = self.failed.swap(false, Ordering::SeqCst);
        if recovered {
            self.recovered.notify_one();
        }
        if self.degraded.load(Ordering::SeqCst) {
            return recovered;
        }
        let now = Instant::now();
        let mut last = self.last_healthy.lock().unwrap_or_else(PoisonError::into_inner);
        if recovered || last.is_none_or(|t| now.duration_since(t) >= HEALTHY_EVERY) {
            *last = Some(now);
            self.sink.healthy();
        }
        recovered
    }

    /// A call failed: logged and told to the sink, every time.
    pub fn fail(&self, e: &RegistryError) {
        warn!(error = %e, kind = e.kind(), "{} call failed", self.watcher);
        self.failed.store(true, Ordering::SeqCst);
        self.sink.error(e);
    }

    /// One part of the registry (a service) failed while the registry
    /// itself answers: told to the sink like a failure, but it is no outage,
    /// so the next success is no recovery.
    pub fn fail_part(&self, e: &RegistryError) {
        warn!(error = %e, kind = e.kind(), "{} read failed; skipping it", self.watcher);
        self.sink.degraded(e);
    }

    /// Whether some part cannot be read. While it is, successes are not
    /// told to the sink, so `healthy` does not read true.
    pub fn set_degraded(&self, degraded: bool) {
        let was = self.degraded.swap(degraded, Ordering::SeqCst);
        if was && !degraded {
            *self.last_healthy.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use futures::FutureExt;

    use super::*;
    use crate::watcher::Update;

    #[derive(Default)]
    struct Counts {
        healthy: AtomicUsize,
        errors: AtomicUsize,
    }

    impl Sink for Counts {
        fn update(&self, _: Update) {}
        fn healthy(&self) {
            self.healthy.fetch_add(1, Ordering::SeqCst);
        }
        fn error(&self, _: &RegistryError) {
            self.errors.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn successes_are_rate_limited_but_recovery_is_told_at_once() {
        let counts = Arc::new(Counts::default());
        let health = Health::new(counts.clone(), "test");
        assert!(!health.ok(), "a first success ends no failure");
        assert!(!health.ok());
        assert_eq!(counts.healthy.load(Ordering::SeqCst), 1, "the second within a second is not sent");
        let e = RegistryError::Unreachable { registry: "r".into(), reason: "down".into() };
        health.fail(&e);
        health.fail(&e);
        assert_eq!(counts.errors.load(Ordering::SeqCst), 2, "every failure is sent");
        assert!(health.ok(), "this success ends the failures");
        assert_eq!(counts.healthy.load(Ordering::SeqCst), 2, "recovery is sent at once");
        assert!(!health.ok());
        assert!(health.recovered.notified().now_or_never().is_some(), "recovery was signalled");

        health.set_degraded(true);
        health.fail_part(&e);
        assert!(!health.ok(), "a part failing is no outage");
        assert_eq!(counts.healthy.load(Ordering::SeqCst), 2, "no health while degraded");
        health.set_degraded(false);
        assert!(!health.ok());
        assert_eq!(counts.healthy.load(Ordering::SeqCst), 3, "health is told again at once");
    }
}
