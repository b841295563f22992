//! Registry watchers for meshbridge.
//!
//! Every registry (Consul, Nacos, ZooKeeper, Eureka, static, DNS) sits behind
//! one small trait, [`Watcher`], and reports what it sees as neutral
//! [`Service`] records through a [`Sink`]. Nothing in this crate knows about
//! Istio or Envoy; naming a service's host is the registry's job because each
//! registry has its own Higress-compatible naming rule.

// No unwrap() outside tests: errors are handled, or expect()ed with a reason.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod body;
mod clip;
pub mod consul;
pub mod dns;
pub mod error_chain;
pub mod eureka;
pub mod fixed;
mod health;
mod http_error;
mod labels;
mod model;
pub mod nacos;
pub mod names;
pub mod repair;
mod resolve;
mod retry;
mod select;
pub mod shared;
mod spec;
pub mod tls;
mod watcher;
mod worker;
pub mod zookeeper;

#[cfg(test)]
mod fuzz_tests;

pub use body::MAX_BODY_BYTES;
pub use clip::{LOG_MESSAGE_MAX, LOG_VALUE_MAX, clip, clip_owned, clip_to};
pub use model::{Endpoint, Protocol, Service, ServicePort, Tls};
pub use names::host_part;
pub use repair::RepairKind;
pub use select::{Referenced, Selection, Selector, WatchMode, WatchSpec, compile_include};
pub use shared::Labels;
pub use spec::{MIGRATION_MAX, Migration, RegistryKind, RegistrySpec, Secret};
pub use tls::RegistryTls;
pub use watcher::{RegistryError, Sink, Update, Watcher};

/// Build the watcher for a spec, reading only what `selector` selects
/// (static and DNS registries list their services in the spec itself and
/// ignore it). A spec the watcher cannot use is a config error for that
/// registry alone.
pub fn watcher_for(spec: &RegistrySpec, selector: Selector) -> Result<Box<dyn Watcher>, RegistryError> {
    match spec.kind {
        RegistryKind::Consul => Ok(Box::new(consul::ConsulWatcher::new(spec.clone())?.with_selector(selector))),
        RegistryKind::Eureka => Ok(Box::new(eureka::EurekaWatcher::new(spec.clone())?.with_selector(selector))),
        RegistryKind::Static => Ok(Box::new(fixed::StaticWatcher::new(spec.clone())?)),
        RegistryKind::Dns => Ok(Box::new(dns::DnsWatcher::new(spec.clone())?)),
        RegistryKind::Zookeeper => {
            Ok(Box::new(zookeeper::ZookeeperWatcher::new(spec.clone())?.with_selector(selector)))
        }
        RegistryKind::Nacos | RegistryKind::Nacos2 | RegistryKind::Nacos3 => {
            Ok(Box::new(nacos::NacosWatcher::new(spec.clone())?.with_selector(selector)))
        }
        RegistryKind::Kubernetes => Err(RegistryError::Config {
            registry: spec.name.clone(),
            field: "type".into(),
            reason: "kubernetes is not an McpBridge registry type: --kube mode reads Services by itself".into(),
        }),
    }
}
