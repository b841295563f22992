//! The watcher contract: what a watcher tells the cache ([`Update`]), where
//! it tells it ([`Sink`]), how it runs ([`Watcher`]) and how a call fails
//! ([`RegistryError`]). A leaf: every watcher module uses it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::model::Service;
use crate::repair::RepairKind;

/// What a watcher tells the cache. The split between *authoritative* data and
/// *errors* is the heart of outage handling: an answer from the registry
/// replaces what we had (even with nothing), an error never does.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// The registry answered with its full list of services: replace all.
    Snapshot(Vec<Service>),
    /// The registry answered for one service: replace it. An empty endpoint
    /// list is authoritative and empties the service.
    Upsert(Service),
    /// The registry answered that this host no longer exists.
    Remove(String),
}

/// Where a watcher sends its updates and its health. Implemented by the cache
/// in the binary; tests implement it with a channel.
pub trait Sink: Send + Sync + 'static {
    /// Apply a change reported by the registry.
    fn update(&self, update: Update);
    /// A real call to the registry succeeded.
    fn healthy(&self);
    /// A call to the registry failed. The last known services stay.
    fn error(&self, error: &RegistryError);
    /// One part of the registry (a service) cannot be read while the
    /// registry itself answers: the registry is not healthy, but this is no
    /// outage (nothing makes its endpoints stale). An error by default.
    fn degraded(&self, error: &RegistryError) {
        self.error(error);
    }
    /// A full sync (every service read and sent as one [`Update::Snapshot`])
    /// took `took`. For metrics; watchers without full syncs never call it.
    fn synced(&self, took: Duration) {
        let _ = took;
    }
    /// The anti-entropy pass ([`crate::repair`]) found `hosts` different
    /// from what the watcher had sent, for a reason of `kind`, and repairs
    /// them now (the update follows). A difference that merely raced the
    /// read is never told here, so a correct watcher never calls this; it
    /// is counted and logged so that a miss is visible, not silent.
    fn repaired(&self, kind: RepairKind, hosts: &[String]) {
        let _ = (kind, hosts);
    }
}

/// A running registry watcher. `run` returns only when the watcher cannot
/// go on at all (bad spec); transient failures are reported to the sink and
/// retried. The reconciler stops a watcher by dropping its task.
pub trait Watcher: Send + 'static {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Errors talking to a registry. Messages never contain credentials.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum RegistryError {
    /// The registry could not be reached (connect, timeout, reset).
    #[error("{registry}: unreachable: {reason}")]
    Unreachable { registry: String, reason: String },
    /// The registry answered with an HTTP or protocol error status.
    #[error("{registry}: {what}: status {status}")]
    Status { registry: String, what: String, status: u16 },
    /// The registry answered with something we cannot read.
    #[error("{registry}: {what}: bad response: {reason}")]
    BadResponse { registry: String, what: String, reason: String },
    /// The registry refuses more connections from this address (Consul's
    /// `limits.http_max_conns_per_client`): other clients on the host hold
    /// them, or the limit is set below the watcher's connection cap.
    #[error("{registry}: {what}: connection limit reached: {reason}")]
    ConnectionLimit { registry: String, what: String, reason: String },
    /// The spec cannot be turned into a watcher.
    #[error("{registry}: {field}: {reason}")]
    Config { registry: String, field: String, reason: String },
}

impl RegistryError {
    /// Short machine-friendly kind, used as a metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            RegistryError::Unreachable { .. } => "unreachable",
            RegistryError::Status { .. } => "status",
            RegistryError::BadResponse { .. } => "bad_response",
            RegistryError::ConnectionLimit { .. } => "connection_limit",
            RegistryError::Config { .. } => "config",
        }
    }
}
