//! The ZooKeeper watcher's counters: a leaf, so that the watcher and the
//! parts that count (`view.rs`) both use it without importing each other.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters a running watcher keeps; get them with
/// [`ZookeeperWatcher::stats`] before running it.
#[derive(Debug, Default)]
pub struct ZookeeperStats {
    pub(super) malformed: AtomicU64,
    pub(super) dropped_labels: AtomicU64,
}

impl ZookeeperStats {
    /// Provider or instance nodes skipped because they could not be read,
    /// counted at every read (a node that stays bad counts again each time
    /// its service is read: full syncs, and verifies where it changed).
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    /// Metadata entries (Dubbo URL parameters, Curator metadata) not kept as
    /// labels: not valid Kubernetes labels, or repeated. Counted per read.
    pub fn dropped_labels(&self) -> u64 {
        self.dropped_labels.load(Ordering::Relaxed)
    }
}
