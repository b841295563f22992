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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

use super::decode::{Instance, ServiceKey};

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
}

impl Pushed {
    /// The server pushed a change of `key`, announcing `hint`.
    pub fn mark(&self, key: &ServiceKey, hint: Hint) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
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
            {
                let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(key) = q.order.pop_front() {
                    let hint = q.hints.remove(&key).flatten();
                    q.busy.insert(key.clone());
                    return (key, hint);
                }
            }
            notified.await;
        }
    }

    /// A reader is done with `key` (read and applied, or skipped).
    pub fn done(&self, key: &ServiceKey) {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).busy.remove(key);
    }

    /// Whether `key` waits for a reader or is being read.
    pub fn pending(&self, key: &ServiceKey) -> bool {
        let q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.hints.contains_key(key) || q.busy.contains(key)
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
