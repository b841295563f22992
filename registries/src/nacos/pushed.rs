//! Services a Nacos server pushed as changed, waiting for a read by one of
//! a fixed number of workers: one queue for the whole watcher instead of a
//! task per service. A service pushed again while it waits is read once; a
//! push that arrives while it is being read queues it again, so no change
//! goes unread.
//!
//! A push carries the instances it announces: the latest one queued is
//! kept as a *hint*, which lets the reader skip the read when it says
//! nothing new (see `read_pushed` in the parent module). A subscription's
//! answer is queued the same way, with the instances it carried (usually
//! those the watcher has just read).
//!
//! A read that fails (a timeout, a 5xx, a TPS refusal) queues the service
//! again after a backoff ([`Pushed::failed`]): the push announced a change
//! that nothing else would read before the next full read (issue 33, H9).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::decode::{Instance, ServiceKey};
use crate::retry;

/// The wait before a failed read is tried again: doubling from
/// [`RETRY_START`] to [`RETRY_MAX`], with jitter, per service.
const RETRY_START: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The instances a push announced, when it carried them.
pub(crate) type Hint = Option<Vec<Instance>>;

#[derive(Default)]
pub(crate) struct Pushed {
    queue: Mutex<Queue>,
    notify: Notify,
}

#[derive(Default)]
struct Queue {
    order: VecDeque<ServiceKey>,
    hints: HashMap<ServiceKey, Hint>,
    /// Taken by a reader and not [`Pushed::done`] yet.
    busy: HashSet<ServiceKey>,
    /// Services whose read failed: when each is queued again.
    retry: HashMap<ServiceKey, Instant>,
    /// Failed reads in a row, per service (its backoff step).
    failures: HashMap<ServiceKey, u32>,
}

impl Queue {
    /// Queue the services whose retry is due; the earliest one still
    /// waiting.
    fn promote(&mut self, now: Instant) -> Option<Instant> {
        let due: Vec<ServiceKey> = self.retry.iter().filter(|(_, at)| **at <= now).map(|(k, _)| k.clone()).collect();
        for key in due {
            self.retry.remove(&key);
            // Queued or being read already: that read stands for the retry.
            if !self.hints.contains_key(&key) && !self.busy.contains(&key) {
                self.hints.insert(key.clone(), None);
                self.order.push_back(key);
            }
        }
        self.retry.values().min().copied()
    }
}

impl Pushed {
    /// The server pushed a change of `key`, announcing `hint`.
    pub fn mark(&self, key: &ServiceKey, hint: Hint) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.retry.remove(key);
        if let Some(queued) = q.hints.get_mut(key) {
            // Still waiting: the newer announcement replaces the older.
            *queued = hint;
            return;
        }
        q.hints.insert(key.clone(), hint);
        q.order.push_back(key.clone());
        drop(q);
        self.notify.notify_one();
    }

    /// The next service to read and the last announcement of it, waiting
    /// for one. The reader calls [`Pushed::done`] once it has dealt with it.
    pub async fn next(&self) -> (ServiceKey, Hint) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake = {
                let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                let wake = q.promote(Instant::now());
                if let Some(key) = q.order.pop_front() {
                    let hint = q.hints.remove(&key).flatten();
                    q.busy.insert(key.clone());
                    return (key, hint);
                }
                wake
            };
            match wake {
                Some(at) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// A reader is done with `key`: read and applied, or skipped because
    /// the announcement was what was sent. A retry still waiting is moot.
    pub fn done(&self, key: &ServiceKey) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.busy.remove(key);
        q.retry.remove(key);
        q.failures.remove(key);
    }

    /// A reader could not read `key`: it is queued again after a backoff
    /// that grows with each failure in a row (unless a push queues it
    /// sooner).
    pub fn failed(&self, key: &ServiceKey) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.busy.remove(key);
        let failures = q.failures.entry(key.clone()).or_default();
        *failures = failures.saturating_add(1);
        let wait = retry::jittered(RETRY_START, RETRY_MAX, *failures);
        q.retry.insert(key.clone(), Instant::now() + wait);
        drop(q);
        // A waiting reader sleeps until the earliest retry it knew of.
        self.notify.notify_one();
    }

    /// Whether `key` waits for a reader, is being read, or waits for a
    /// retry.
    pub fn pending(&self, key: &ServiceKey) -> bool {
        let q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.hints.contains_key(key) || q.busy.contains(key) || q.retry.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn key(name: &str) -> ServiceKey {
        ServiceKey { group: "DEFAULT_GROUP".into(), name: name.into() }
    }

    #[tokio::test]
    async fn pushes_fold_per_service_and_wake_waiting_workers() {
        let pushed = Arc::new(Pushed::default());
        pushed.mark(&key("a"), None);
        pushed.mark(&key("b"), None);
        pushed.mark(&key("a"), None);
        assert_eq!(pushed.next().await.0, key("a"));
        assert_eq!(pushed.next().await.0, key("b"));
        // A waiting worker is woken by the next push.
        let waiter = tokio::spawn({
            let pushed = pushed.clone();
            async move { pushed.next().await.0 }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        pushed.mark(&key("c"), None);
        assert_eq!(tokio::time::timeout(Duration::from_secs(1), waiter).await.unwrap().unwrap(), key("c"));
        // Marked again after being taken: read again.
        pushed.mark(&key("c"), None);
        assert_eq!(pushed.next().await.0, key("c"));
    }

    #[tokio::test]
    async fn a_service_is_pending_while_queued_or_being_read() {
        let pushed = Pushed::default();
        assert!(!pushed.pending(&key("a")));
        pushed.mark(&key("a"), None);
        assert!(pushed.pending(&key("a")), "queued");
        let (taken, _) = pushed.next().await;
        assert!(pushed.pending(&taken), "being read");
        pushed.done(&taken);
        assert!(!pushed.pending(&key("a")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_read_is_queued_again_after_a_growing_backoff() {
        let pushed = Arc::new(Pushed::default());
        pushed.mark(&key("a"), None);
        let (taken, _) = pushed.next().await;
        pushed.failed(&taken);
        assert!(pushed.pending(&key("a")), "waiting for its retry");
        let started = Instant::now();
        assert_eq!(pushed.next().await, (key("a"), None));
        let first = started.elapsed();
        assert!(first >= Duration::from_millis(800) && first <= Duration::from_millis(1200), "{first:?}");
        pushed.failed(&key("a"));
        let started = Instant::now();
        pushed.next().await;
        let second = started.elapsed();
        assert!(second >= Duration::from_millis(1600) && second <= Duration::from_millis(2400), "{second:?}");
        // Read at last: the backoff starts again.
        pushed.done(&key("a"));
        assert!(!pushed.pending(&key("a")));
        pushed.mark(&key("a"), None);
        pushed.next().await;
        pushed.failed(&key("a"));
        let started = Instant::now();
        pushed.next().await;
        assert!(started.elapsed() <= Duration::from_millis(1200));

        // A push while the retry waits queues the service at once, once.
        pushed.failed(&key("a"));
        pushed.mark(&key("a"), None);
        assert_eq!(tokio::time::timeout(Duration::from_millis(10), pushed.next()).await.unwrap().0, key("a"));
        pushed.done(&key("a"));
        let waiter = tokio::spawn({
            let pushed = pushed.clone();
            async move { pushed.next().await }
        });
        tokio::time::sleep(RETRY_MAX * 2).await;
        assert!(!waiter.is_finished(), "no second read of the same push");
        waiter.abort();
    }

    #[tokio::test]
    async fn the_latest_announcement_of_a_queued_service_is_kept() {
        let pushed = Pushed::default();
        let one = |ip: &str| {
            let instance = Instance {
                ip: ip.into(),
                port: 8080,
                weight: 1.0,
                healthy: true,
                enabled: true,
                metadata: Default::default(),
            };
            Some(vec![instance])
        };
        pushed.mark(&key("a"), one("10.0.0.1"));
        pushed.mark(&key("a"), one("10.0.0.2"));
        pushed.mark(&key("b"), one("10.0.0.3"));
        pushed.mark(&key("b"), None);
        assert_eq!(pushed.next().await, (key("a"), one("10.0.0.2")));
        // A push without instances leaves nothing to compare: read.
        assert_eq!(pushed.next().await, (key("b"), None));
    }
}
