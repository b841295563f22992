//! Pure functions from registry services to Istio objects and to Envoy
//! resources. No I/O, no clocks, no locks: the same input always gives the
//! same output, byte for byte, which is what makes versions stable content
//! hashes and the output snapshot-testable.

pub mod envoy;
pub mod gateway;
pub mod ingress;
pub mod istio;
pub mod mcp;
pub mod proxy;

use std::collections::BTreeMap;

use envoy_types::pb::google::protobuf::Any;

use crate::cache::{RegistryKey, View};
use crate::config::{IngressDoc, ProxySpec, TlsSecret};

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
    /// One per service reached over TLS (registry `https`/`grpcs`), in host
    /// order: Istio's side of the Envoy clusters' TLS transport socket.
    pub destination_rules: Vec<istio::DestinationRule>,
    /// Every Istio object (ServiceEntries included), sorted by kind,
    /// namespace and name: what Pilot gets over MCP and `/debug/configz` shows.
    pub istio: Vec<istio::IstioObject>,
    /// Envoy resources by type URL, then by name.
    pub envoy: BTreeMap<&'static str, BTreeMap<String, Resource>>,
    /// MCP resources by collection (`group/Kind`, see [`mcp::collection`]),
    /// then by `namespace/name`.
    pub mcp: BTreeMap<String, BTreeMap<String, Resource>>,
    /// Problems found while translating (objects left out, conflicts).
    pub warnings: Vec<String>,
    /// When the oldest registry change this set is the first to carry
    /// happened; set by the publisher (`run.rs`), never by translation.
    pub changed_at: Option<std::time::Instant>,
}

impl ConfigSet {
    /// The resources a type URL asks for: Envoy's by type URL, MCP's by
    /// collection whatever version the client names.
    pub fn resources(&self, type_url: &str) -> Option<&BTreeMap<String, Resource>> {
        match mcp::collection(type_url) {
            Some(c) => self.mcp.get(&c),
            None => self.envoy.get(type_url),
        }
    }
}

/// What translation reads besides the registries' services.
#[derive(Debug, Clone, Default)]
pub struct Inputs<'a> {
    pub ingresses: &'a [IngressDoc],
    pub tls_secrets: &'a [TlsSecret],
    /// `known_secrets` is filled from `tls_secrets`.
    pub ingress: ingress::IngressOptions,
    pub gateway: gateway::GatewayOptions,
    /// McpBridge `spec.proxies[]`, validated.
    pub proxies: &'a [ProxySpec],
    /// The `proxyName` of each registry that has one.
    pub registry_proxies: BTreeMap<RegistryKey, String>,
    /// The `ecdhCurves` of each registry that has some: offered in the TLS
    /// handshakes of its services' clusters and proxied clusters.
    pub registry_ecdh_curves: BTreeMap<RegistryKey, Vec<String>>,
}

/// Translate a cache view alone (no Ingress), with creation times all zero.
pub fn config_set(view: &View) -> ConfigSet {
    build(view, &Inputs::default(), |_| 0)
}

/// Translate everything into one config set: registry services into
/// ServiceEntries, DestinationRules and Envoy clusters/endpoints; Ingresses
/// into Gateways, VirtualServices and DestinationRules; all Istio objects
/// into MCP resources; and Gateways/VirtualServices into Envoy listeners and
/// routes for a standalone gateway; proxies into their clusters, tunnel
/// listeners and EnvoyFilters (see [`proxy`]). `create_time` gives each
/// object's stable MCP creation time in seconds since the epoch.
pub fn build(view: &View, inputs: &Inputs<'_>, create_time: impl Fn(&istio::IstioObject) -> i64) -> ConfigSet {
    let mut set = registry_set(view, &inputs.registry_ecdh_curves);
    let proxied = proxy::translate(view, inputs);
    set.warnings.extend(proxied.warnings);

    let mut opts = inputs.ingress.clone();
    opts.known_secrets.extend(inputs.tls_secrets.iter().map(|t| (t.namespace.clone(), t.name.clone())));
    if !inputs.ingresses.is_empty() {
        // An exact spelling wins; of hosts differing only in case, the first.
        for host in view.services.keys() {
            opts.service_hosts.entry(host.to_ascii_lowercase()).or_insert_with(|| host.clone());
            opts.service_hosts.insert(host.clone(), host.clone());
        }
    }
    let from_ingress = ingress::translate(inputs.ingresses, &opts);
    set.warnings.extend(from_ingress.warnings);

    let mut objects = from_ingress.objects;
    let registry_rules = set.destination_rules.iter().cloned().map(istio::IstioObject::from);
    merge_destination_rules(&mut objects, registry_rules);
    objects.extend(set.service_entries.iter().cloned().map(istio::IstioObject::from));
    objects.extend(proxied.objects);
    objects.sort_by(|a, b| {
        (&a.kind, &a.metadata.namespace, &a.metadata.name).cmp(&(&b.kind, &b.metadata.namespace, &b.metadata.name))
    });
    let (mcp, rejected) = mcp::resources(&objects, create_time);
    set.mcp = mcp;
    set.warnings.extend(rejected);

    let services = view.services.iter().map(|(h, c)| (h.clone(), c.service.clone())).collect();
    let gw = gateway::envoy_gateway(&objects, &services, inputs.tls_secrets, &inputs.gateway);
    set.warnings.extend(gw.warnings);
    // Proxied services' endpoints replace the registry's: their clusters
    // reach the tunnel listener, not the service.
    for (type_url, list) in [
        (envoy::CLUSTER_TYPE, gw.clusters),
        (envoy::ENDPOINT_TYPE, gw.load_assignments),
        (envoy::LISTENER_TYPE, gw.listeners),
        (envoy::ROUTE_TYPE, gw.routes),
        (envoy::CLUSTER_TYPE, proxied.clusters),
        (envoy::ENDPOINT_TYPE, proxied.load_assignments),
        (envoy::LISTENER_TYPE, proxied.listeners),
    ] {
        let by_name = set.envoy.entry(type_url).or_default();
        for r in list {
            by_name.insert(r.name.clone(), r);
        }
    }
    set.istio = objects;
    set
}

/// A registry DestinationRule only fills what an Ingress one for the same
/// host leaves unset; without an Ingress rule it stands alone.
fn merge_destination_rules(objects: &mut Vec<istio::IstioObject>, registry: impl Iterator<Item = istio::IstioObject>) {
    for rule in registry {
        let host = &rule.spec["host"];
        let ingress_rule = objects.iter_mut().find(|o| o.kind == "DestinationRule" && &o.spec["host"] == host);
        match ingress_rule {
            Some(primary) => istio::fill_unset(&mut primary.spec, &rule.spec),
            None => objects.push(rule),
        }
    }
}

/// Envoy clusters and endpoints, and ServiceEntries, for every service.
fn registry_set(view: &View, ecdh_curves: &BTreeMap<RegistryKey, Vec<String>>) -> ConfigSet {
    let mut set = ConfigSet { revision: view.revision, warnings: view.conflicts.clone(), ..ConfigSet::default() };
    let clusters = set.envoy.entry(envoy::CLUSTER_TYPE).or_default();
    for cached in view.services.values() {
        let curves = ecdh_curves.get(&cached.registry).map_or(&[][..], Vec::as_slice);
        for c in envoy::clusters_with(&cached.service, curves) {
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
        set.destination_rules.extend(istio::destination_rule(&cached.registry, &cached.service));
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
