//! Health reporting and retry pacing, shared by every loop of a watcher.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::warn;

use super::{auth, is_auth_error};
use crate::{RegistryError, Sink};

const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// `Sink::healthy` at most this often while all is well.
const HEALTHY_EVERY: Duration = Duration::from_secs(1);

/// Reports health to the sink and notices recovery.
pub(super) struct Health {
    sink: Arc<dyn Sink>,
    failed: AtomicBool,
    /// Credential refusals in a row (logins excluded).
    pub auth_failures: AtomicU32,
    last_healthy: Mutex<Option<Instant>>,
    /// Signalled when a call succeeds after a failure.
    pub recovered: Notify,
}

impl Health {
    pub fn new(sink: Arc<dyn Sink>) -> Health {
        Health {
            sink,
            failed: AtomicBool::new(false),
            auth_failures: AtomicU32::new(0),
            last_healthy: Mutex::new(None),
            recovered: Notify::new(),
        }
    }

    pub fn ok(&self) {
        let recovered = self.failed.swap(false, Ordering::SeqCst);
        self.auth_failures.store(0, Ordering::SeqCst);
        let now = Instant::now();
        {
            let mut last = self.last_healthy.lock().unwrap_or_else(PoisonError::into_inner);
            if recovered || last.is_none_or(|t| now.duration_since(t) >= HEALTHY_EVERY) {
                *last = Some(now);
                self.sink.healthy();
            }
        }
        if recovered {
            self.recovered.notify_one();
        }
    }

    pub fn fail(&self, e: &RegistryError) {
        warn!(error = %e, kind = e.kind(), "nacos call failed");
        self.failed.store(true, Ordering::SeqCst);
        if is_auth_error(e) && !auth::is_login_error(e) {
            self.auth_failures.fetch_add(1, Ordering::SeqCst);
        }
        self.sink.error(e);
    }
}

/// Exponential backoff, 200 ms doubling to 10 s, with ±20% jitter so that
/// retries of many watchers do not run in lockstep.
pub(super) struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { next: BACKOFF_START }
    }
}

impl Backoff {
    pub fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(BACKOFF_MAX);
        let r = RandomState::new().hash_one(Instant::now()) % 1000;
        d.mul_f64(0.8 + 0.4 * r as f64 / 1000.0)
    }

    pub fn reset(&mut self) {
        self.next = BACKOFF_START;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap_with_jitter() {
        let mut b = Backoff::default();
        for i in 0..10 {
            let d = b.next();
            let base = (BACKOFF_START * 2u32.pow(i)).min(BACKOFF_MAX);
            assert!(d >= base.mul_f64(0.8) && d <= base.mul_f64(1.2), "step {i}: {d:?}");
        }
        b.reset();
        assert!(b.next() <= BACKOFF_START.mul_f64(1.2));
    }
}
