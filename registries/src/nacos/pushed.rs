//! Services a Nacos server pushed as changed, waiting for a read by one of
//! a fixed number of workers: one queue for the whole watcher instead of a
//! task per service. A service pushed again while it waits is read once; a
//! push that arrives while it is being read queues it again, so no change
//! goes unread.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

use super::decode::ServiceKey;

#[derive(Default)]
pub(crate) struct Pushed {
    queue: Mutex<(VecDeque<ServiceKey>, HashSet<ServiceKey>)>,
    notify: Notify,
}

impl Pushed {
    /// The server pushed a change of `key`.
    pub fn mark(&self, key: &ServiceKey) {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if q.1.insert(key.clone()) {
            q.0.push_back(key.clone());
            drop(q);
            self.notify.notify_one();
        }
    }

    /// The next service to read, waiting for one.
    pub async fn next(&self) -> ServiceKey {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(key) = q.0.pop_front() {
                    q.1.remove(&key);
                    return key;
                }
            }
            notified.await;
        }
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
        pushed.mark(&key("a"));
        pushed.mark(&key("b"));
        pushed.mark(&key("a"));
        assert_eq!(pushed.next().await, key("a"));
        assert_eq!(pushed.next().await, key("b"));
        // A waiting worker is woken by the next push.
        let waiter = tokio::spawn({
            let pushed = pushed.clone();
            async move { pushed.next().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        pushed.mark(&key("c"));
        assert_eq!(tokio::time::timeout(Duration::from_secs(1), waiter).await.unwrap().unwrap(), key("c"));
        // Marked again after being taken: read again.
        pushed.mark(&key("c"));
        assert_eq!(pushed.next().await, key("c"));
    }
}
