//! The watches of one session. Without a selection: one persistent
//! recursive watch per root, which reports every change under it. With a
//! selection (`meshbridgeWatch`): a persistent watch on each root for its
//! own children (services added or removed) and a persistent recursive
//! watch per selected service, so ZooKeeper sends nothing about the others.
//!
//! Every watch is a forwarder task passing its events to the session loop;
//! aborting the task drops the `PersistentWatcher`, which removes the watch.

use std::collections::HashMap;

use futures::{StreamExt, stream};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tracing::{Instrument, debug};
use zookeeper_client as zk;

use super::read::Reader;
use super::tree::ServiceKey;
use crate::watcher::RegistryError;

/// Watches added at once.
const CONCURRENCY: usize = 8;

pub(crate) type Events = mpsc::UnboundedSender<(usize, zk::WatchedEvent)>;

pub(crate) struct Watches {
    /// Per-service watches (a selection), else recursive root watches.
    per_service: bool,
    roots: Vec<bool>,
    services: HashMap<ServiceKey, AbortHandle>,
    /// The forwarders. Dropped with the session, which stops them all.
    tasks: JoinSet<()>,
    tx: Events,
}

impl Watches {
    pub fn new(roots: usize, per_service: bool, tx: Events) -> Watches {
        Watches { per_service, roots: vec![false; roots], services: HashMap::new(), tasks: JoinSet::new(), tx }
    }

    /// Add each root's watch not added yet; a root's watch stays for the
    /// whole session.
    pub async fn roots(&mut self, reader: &Reader<'_>) -> Result<(), RegistryError> {
        for (i, root) in reader.tree.roots().iter().enumerate() {
            if self.roots[i] {
                continue;
            }
            let watcher = reader.watch(&root.path, !self.per_service).await?;
            self.tasks.spawn(forward(i, watcher, self.tx.clone()).in_current_span());
            self.roots[i] = true;
        }
        Ok(())
    }

    /// With per-service watches: watch each of `keys` not watched yet, and
    /// when `complete` (the whole selected set) stop watching the others.
    /// Call before reading `keys`, so no change after the read goes unseen.
    pub async fn services(
        &mut self,
        reader: &Reader<'_>,
        keys: &[ServiceKey],
        complete: bool,
    ) -> Result<(), RegistryError> {
        if !self.per_service {
            return Ok(());
        }
        if complete {
            let keep: std::collections::HashSet<&ServiceKey> = keys.iter().collect();
            self.services.retain(|key, task| {
                let kept = keep.contains(key);
                if !kept {
                    task.abort();
                }
                kept
            });
        }
        let new: Vec<(ServiceKey, String)> = keys
            .iter()
            .filter(|k| !self.services.contains_key(*k))
            .map(|k| (k.clone(), reader.tree.service_path(k)))
            .collect();
        let added: Vec<(ServiceKey, Result<zk::PersistentWatcher, RegistryError>)> = stream::iter(new)
            .map(|(key, path)| async move { (key, reader.watch(&path, true).await) })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut first_error = None;
        for (key, watcher) in added {
            match watcher {
                Ok(watcher) => {
                    let task = self.tasks.spawn(forward(key.root, watcher, self.tx.clone()).in_current_span());
                    self.services.insert(key, task);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        debug!(watched = self.services.len(), "service watches");
        first_error.map_or(Ok(()), Err)
    }

    /// Stop watching a service that is gone or no longer selected.
    pub fn forget(&mut self, key: &ServiceKey) {
        if let Some(task) = self.services.remove(key) {
            task.abort();
        }
    }

    /// Forwarders that ended (a panic), for the session loop to log.
    pub async fn join_next(&mut self) -> Option<Result<(), tokio::task::JoinError>> {
        self.tasks.join_next().await
    }
}

/// Pass one watch's events to the session loop, tagged with its root.
async fn forward(root: usize, mut watcher: zk::PersistentWatcher, tx: Events) {
    loop {
        let event = watcher.changed().await;
        // Polling again after a terminal session event would panic.
        let terminal = event.event_type == zk::EventType::Session && event.session_state.is_terminated();
        if tx.send((root, event)).is_err() || terminal {
            return;
        }
    }
}
