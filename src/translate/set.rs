//! The published config set: what `xds` serves and `admin` shows. Every
//! collection in it is persistent (`imbl`), so publishing a set is O(1)
//! and consecutive sets share everything that did not change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::mcp;
use super::model::IstioObject;
use super::warning::Warning;
use crate::resources::TypeResources;

/// An Istio object's place in the set: kind, namespace, name.
pub type ObjectKey = (&'static str, String, String);

/// The whole translated state.
#[derive(Debug, Clone, Default)]
pub struct ConfigSet {
    /// Grows by one with every published set; every change in a
    /// [`TypeResources`] log carries the revision of the set that made it.
    pub revision: u64,
    /// Envoy resources by type URL.
    pub envoy: BTreeMap<&'static str, TypeResources>,
    /// MCP resources by collection (`group/Kind`, see [`mcp::collection`]),
    /// each named `namespace/name`.
    pub mcp: BTreeMap<String, TypeResources>,
    /// Every Istio object, by kind, namespace and name: what Pilot gets over
    /// MCP (those that pass its rules) and `/debug/configz` shows.
    pub istio: imbl::OrdMap<ObjectKey, Arc<IstioObject>>,
    /// Problems found while translating, by where they come from (a host,
    /// or the Ingress/gateway/proxy stage).
    pub warnings: imbl::OrdMap<String, Arc<[Warning]>>,
    /// When the oldest registry change this set is the first to carry
    /// happened; set by the publisher, never by translation.
    pub changed_at: Option<Instant>,
}

impl ConfigSet {
    /// The resources a type URL asks for: Envoy's by type URL, MCP's by
    /// collection whatever version the client names.
    pub fn resources(&self, type_url: &str) -> Option<&TypeResources> {
        match mcp::collection(type_url) {
            Some(c) => self.mcp.get(&c),
            None => self.envoy.get(type_url),
        }
    }

    /// Every warning, grouped by source.
    pub fn warnings(&self) -> impl Iterator<Item = &Warning> {
        self.warnings.values().flat_map(|w| w.iter())
    }

    /// The Istio objects of one kind, in namespace/name order.
    pub fn objects<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a IstioObject> + 'a {
        self.istio.iter().filter(move |(k, _)| k.0 == kind).map(|(_, o)| &**o)
    }
}
