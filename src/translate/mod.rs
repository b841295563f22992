//! Pure functions from registry services to Istio objects and to Envoy
//! resources. No I/O, no clocks, no locks: the same input always gives the
//! same output, byte for byte, which is what makes versions stable content
//! hashes and the output snapshot-testable.

pub mod envoy;
pub mod istio;

use std::collections::BTreeMap;

use envoy_types::pb::google::protobuf::Any;

use crate::cache::View;

/// An Envoy resource ready to send: its name, content-hash version and body.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub name: String,
    pub version: String,
    pub body: Any,
}

impl Resource {
    /// Wrap a message, versioning it by the hash of its encoding.
    pub fn new(name: String, body: Any) -> Resource {
        let version = content_hash(&body.value);
        Resource { name, version, body }
    }
}

/// The whole translated state: what `xds` serves and `admin` shows.
#[derive(Debug, Clone, Default)]
pub struct ConfigSet {
    /// Cache revision this set was built from.
    pub revision: u64,
    pub service_entries: Vec<istio::ServiceEntry>,
    /// Envoy resources by type URL, then by name.
    pub envoy: BTreeMap<&'static str, BTreeMap<String, Resource>>,
    /// Problems found while translating (objects left out, conflicts).
    pub warnings: Vec<String>,
}

/// Translate a cache view into the full config set.
pub fn config_set(view: &View) -> ConfigSet {
    let mut set = ConfigSet { revision: view.revision, warnings: view.conflicts.clone(), ..ConfigSet::default() };
    let clusters = set.envoy.entry(envoy::CLUSTER_TYPE).or_default();
    for cached in view.services.values() {
        for c in envoy::clusters(&cached.service) {
            clusters.insert(c.name.clone(), c);
        }
    }
    let cla = set.envoy.entry(envoy::ENDPOINT_TYPE).or_default();
    for cached in view.services.values() {
        for c in envoy::load_assignments(&cached.service) {
            cla.insert(c.name.clone(), c);
        }
    }
    for cached in view.services.values() {
        match istio::service_entry(&cached.registry, &cached.service) {
            Ok(se) => set.service_entries.push(se),
            Err(e) => set.warnings.push(e),
        }
    }
    set
}

/// FNV-1a (64 bit) as hex: stable across processes and Rust versions, unlike
/// `DefaultHasher`, so a reconnecting client's versions still match.
pub fn content_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
