//! Health reporting shared by the watchers whose many loops report to one
//! sink (Consul, Nacos, ZooKeeper): every failure goes to the sink, a
//! success at most once a second, so busy loops do not flood it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::{RegistryError, Sink};

/// `Sink::healthy` at most this often while all is well.
const HEALTHY_EVERY: Duration = Duration::from_secs(1);

/// Reports one watcher's calls to its sink.
pub(crate) struct Health {
    sink: Arc<dyn Sink>,
    /// The watcher's kind, for the log line of a failed call.
    watcher: &'static str,
    failed: AtomicBool,
    last_healthy: Mutex<Option<Instant>>,
}

impl Health {
    pub fn new(sink: Arc<dyn Sink>, watcher: &'static str) -> Health {
        Health { sink, watcher, failed: AtomicBool::new(false), last_healthy: Mutex::new(None) }
    }

    /// A call succeeded. Tells the sink at once after a failure, otherwise
    /// at most every [`HEALTHY_EVERY`]. Returns whether this success ended a
    /// run of failures (watchers resync on that).
    pub fn ok(&self) -> bool {
        let recovered = self.failed.swap(false, Ordering::SeqCst);
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
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::Update;

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
    }
}
