//! Registry watchers for meshbridge.
//!
//! Every registry (Consul, Nacos, ZooKeeper, Eureka, static, DNS) sits behind
//! one small trait, [`Watcher`], and reports what it sees as neutral
//! [`Service`] records through a [`Sink`]. Nothing in this crate knows about
//! Istio or Envoy; naming a service's host is the registry's job because each
//! registry has its own Higress-compatible naming rule.

mod clip;
pub mod consul;
pub mod dns;
pub mod eureka;
pub mod fixed;
mod health;
mod http_error;
mod labels;
mod model;
pub mod nacos;
mod resolve;
mod retry;
mod spec;
pub mod zookeeper;

#[cfg(test)]
mod fuzz_tests;

pub use clip::{LOG_MESSAGE_MAX, LOG_VALUE_MAX, clip, clip_owned, clip_to};
pub use model::{Endpoint, Protocol, Service, ServicePort, Tls};
pub use spec::{RegistryKind, RegistrySpec, Secret};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

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
    /// A full sync (every service read and sent as one [`Update::Snapshot`])
    /// took `took`. For metrics; watchers without full syncs never call it.
    fn synced(&self, took: Duration) {
        let _ = took;
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
            RegistryError::Config { .. } => "config",
        }
    }
}

/// Build the watcher for a spec. A spec the watcher cannot use is a config
/// error for that registry alone.
pub fn watcher_for(spec: &RegistrySpec) -> Result<Box<dyn Watcher>, RegistryError> {
    match spec.kind {
        RegistryKind::Consul => Ok(Box::new(consul::ConsulWatcher::new(spec.clone())?)),
        RegistryKind::Eureka => Ok(Box::new(eureka::EurekaWatcher::new(spec.clone())?)),
        RegistryKind::Static => Ok(Box::new(fixed::StaticWatcher::new(spec.clone())?)),
        RegistryKind::Dns => Ok(Box::new(dns::DnsWatcher::new(spec.clone())?)),
        RegistryKind::Zookeeper => Ok(Box::new(zookeeper::ZookeeperWatcher::new(spec.clone())?)),
        RegistryKind::Nacos | RegistryKind::Nacos2 | RegistryKind::Nacos3 => {
            Ok(Box::new(nacos::NacosWatcher::new(spec.clone())?))
        }
    }
}

/// Replace characters that are not valid in a DNS label the way Higress does
/// when it builds host names (`_` becomes `-`).
pub fn host_part(s: &str) -> String {
    s.replace('_', "-")
}
