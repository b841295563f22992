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
/// The same failure logged again at most this often, with a count.
const REPEAT_EVERY: Duration = Duration::from_secs(60);

/// Keeps a retry loop's identical WARNs down: the first is logged, then
/// one a [`REPEAT_EVERY`] saying how many were held back; a different
/// message is logged at once.
#[derive(Default)]
struct Repeats {
    /// The last message logged, when, and how many identical ones since.
    last: Option<(String, Instant, u64)>,
}

impl Repeats {
    /// `None`: hold `message` back. `Some(n)`: log it, saying that `n`
    /// identical ones were held back since it was last logged.
    fn admit(&mut self, message: &str, now: Instant) -> Option<u64> {
        match &mut self.last {
            Some((last, at, held)) if last == message => {
                if now.duration_since(*at) < REPEAT_EVERY {
                    *held += 1;
                    return None;
                }
                let n = std::mem::take(held);
                *at = now;
                Some(n)
            }
            _ => {
                self.last = Some((message.to_string(), now, 0));
                Some(0)
            }
        }
    }

    fn clear(&mut self) {
        self.last = None;
    }
}

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
    /// The WARNs of failed calls and of failed parts.
    repeats: Mutex<[Repeats; 2]>,
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
            repeats: Mutex::new(Default::default()),
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
            // The next failure is news again.
            self.repeats.lock().unwrap_or_else(PoisonError::into_inner)[0].clear();
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

    /// A call failed: told to the sink every time, and logged unless the
    /// same failure was logged less than [`REPEAT_EVERY`] ago.
    pub fn fail(&self, e: &RegistryError) {
        if let Some(held) = self.admit(0, e) {
            if held == 0 {
                warn!(error = %e, kind = e.kind(), "{} call failed", self.watcher);
            } else {
                warn!(error = %e, kind = e.kind(), "{} call failed ({held} more times since the last such line)", self.watcher);
            }
        }
        self.failed.store(true, Ordering::SeqCst);
        self.sink.error(e);
    }

    fn admit(&self, which: usize, e: &RegistryError) -> Option<u64> {
        let message = e.to_string();
        self.repeats.lock().unwrap_or_else(PoisonError::into_inner)[which].admit(&message, Instant::now())
    }

    /// One part of the registry (a service) failed while the registry
    /// itself answers: told to the sink like a failure, but it is no outage,
    /// so the next success is no recovery.
    pub fn fail_part(&self, e: &RegistryError) {
        match self.admit(1, e) {
            Some(0) => warn!(error = %e, kind = e.kind(), "{} read failed; skipping it", self.watcher),
            Some(held) => warn!(
                error = %e,
                kind = e.kind(),
                "{} read failed; skipping it ({held} more times since the last such line)",
                self.watcher
            ),
            None => {}
        }
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
    fn identical_warnings_are_held_back_and_counted() {
        let mut r = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(r.admit("refused", t0), Some(0), "the first is logged");
        assert_eq!(r.admit("refused", t0 + Duration::from_secs(1)), None);
        assert_eq!(r.admit("refused", t0 + Duration::from_secs(30)), None);
        assert_eq!(r.admit("refused", t0 + REPEAT_EVERY), Some(2), "a minute on: logged with the count");
        assert_eq!(r.admit("refused", t0 + REPEAT_EVERY + Duration::from_secs(1)), None);
        assert_eq!(r.admit("timed out", t0 + REPEAT_EVERY + Duration::from_secs(2)), Some(0), "a new one at once");
        r.clear();
        assert_eq!(r.admit("timed out", t0 + REPEAT_EVERY + Duration::from_secs(3)), Some(0), "after a recovery");
    }

    #[test]
    fn every_failure_still_reaches_the_sink() {
        let counts = Arc::new(Counts::default());
        let health = Health::new(counts.clone(), "test");
        let e = RegistryError::Unreachable { registry: "r".into(), reason: "refused".into() };
        for _ in 0..5 {
            health.fail(&e);
        }
        assert_eq!(counts.errors.load(Ordering::SeqCst), 5);
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
