//! Scaffolding shared by the watchers that run child loops in a `JoinSet`
//! (Consul reads, Nacos per-service loops): what a loop's exit means, and
//! the port a service keeps while it has no instances.

use tokio::task::JoinError;
use tracing::error;

use crate::model::Service;

/// A child loop ended. Aborted loops are the normal way services stop; a
/// panic is a bug, logged here, and the watcher's next sync starts the loop
/// again.
pub(crate) fn on_worker_exit(watcher: &'static str, done: Result<(), JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        error!(error = %e, watcher, "watch loop panicked");
    }
}

/// The port last reported for a service, so that a service left without
/// instances keeps its shape (see each watcher's `Naming::service`).
pub(crate) fn last_port(service: Option<&Service>) -> Option<u16> {
    service.and_then(|s| s.ports.first()).map(|p| p.number)
}
