//! A count of live watcher tasks, exported as `meshbridge_watchers`.
//!
//! The reconciler wraps each watcher's future with a [`TaskGuard`]: the
//! count goes up when the task starts and down when its future is dropped,
//! which is what `JoinHandle::abort` does (Consul's child loops live in a
//! `JoinSet` inside that future and go with it). So after any number of
//! config edits the gauge equals the number of registries configured; more
//! would be a leak.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Shared counter of live tasks.
#[derive(Debug, Clone, Default)]
pub struct LiveTasks(Arc<AtomicI64>);

/// Held by a live task; dropping it counts the task as ended.
#[derive(Debug)]
pub struct TaskGuard(Arc<AtomicI64>);

impl LiveTasks {
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn guard(&self) -> TaskGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        TaskGuard(self.0.clone())
    }

    /// `fut`, counted while it lives.
    pub fn track<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> + use<F> {
        let guard = self.guard();
        async move {
            let _guard = guard;
            fut.await
        }
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn aborted_and_finished_tasks_are_not_counted() {
        let live = LiveTasks::default();
        let forever = tokio::spawn(live.track(std::future::pending::<()>()));
        let done = tokio::spawn(live.track(async {}));
        done.await.unwrap();
        tokio::task::yield_now().await;
        assert_eq!(live.get(), 1);
        forever.abort();
        let _ = forever.await;
        assert_eq!(live.get(), 0);
    }
}
