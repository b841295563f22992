//! One host, several registries: the services they report merged into one
//! (pure, O(the host's endpoints)).
//!
//! What a migration between registries needs, and what istiod does with
//! ServiceEntries that share a host:
//!
//! - **Ports**: the union, by number. Where registries give one number
//!   different protocols or names, the first registry in merge order wins.
//! - **Service-level attributes** (TLS and its SNI): the first registry's.
//! - **Endpoints**: every registry's (an instance several registries list,
//!   by address and port, once: as the first registry lists it), each
//!   labelled with its registry
//!   ([`LABEL_ENDPOINT_REGISTRY`]) and, when the registries have different
//!   priorities, with its registry's priority ([`LABEL_PRIORITY`]).
//! - **Weights** (`meshbridgeMigration.weight`): among the registries at one
//!   priority, once one of them sets a weight, each registry's endpoints
//!   share `weight / sum` of the traffic whatever their number, by scaling
//!   the endpoints' own weights.
//!
//! Merge order is (priority, registry type, registry name): the preferred
//! registry first. Every disagreement is a [`Reason::HostConflict`]
//! warning naming both registries and the field.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use meshbridge_registries::{Endpoint, Labels, Migration, Service, ServicePort};

use super::model::{LABEL_ENDPOINT_REGISTRY, LABEL_PRIORITY};
use super::shared::intern;
use super::warning::{Reason, Warning};
use crate::model::{CachedService, RegistryKey};

/// What a weight share divides among a level's registries: the scaled
/// endpoint weights of one level add up to about this. Small enough that
/// Envoy's limit on a locality's total weight (`u32::MAX`) is far, large
/// enough that a share of 1 % over 10k endpoints keeps its proportion.
pub const SHARE_SCALE: u64 = 1_000_000;

/// A host as translation serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// The registry whose service-level attributes are used (the first in
    /// merge order); it names the ServiceEntry's registry labels.
    pub primary: RegistryKey,
    pub service: Arc<Service>,
    /// The registries it came from, in merge order (one for most hosts).
    pub registries: Vec<RegistryKey>,
    /// The preferred priority, when the registries have several: its
    /// endpoints are tried first ([`LABEL_PRIORITY`]).
    pub preferred_priority: Option<u32>,
    /// The disagreements between the registries.
    pub conflicts: Vec<Warning>,
}

/// Merge `sources` (the registries reporting `host`, non-empty, any order)
/// under each registry's `meshbridgeMigration`.
pub fn merge(host: &str, sources: &[&CachedService], migration: &BTreeMap<RegistryKey, Migration>) -> Merged {
    let setting = |k: &RegistryKey| migration.get(k).copied().unwrap_or_default();
    let mut order: Vec<&CachedService> = sources.to_vec();
    order.sort_by(|a, b| {
        (setting(&a.registry).priority, &a.registry).cmp(&(setting(&b.registry).priority, &b.registry))
    });
    let first = order[0];
    let registries: Vec<RegistryKey> = order.iter().map(|c| c.registry.clone()).collect();
    if order.len() == 1 {
        // Alone, a registry's weight and priority have nothing to divide;
        // the cache's service is served as it is (its registry label is
        // added where endpoints are written: [`RegistryLabels`]).
        return Merged {
            primary: first.registry.clone(),
            service: first.service.clone(),
            registries,
            preferred_priority: None,
            conflicts: Vec::new(),
        };
    }

    let conflicts = disagreements(&order)
        .into_iter()
        .map(|d| Warning::new(format!("host {host}"), Reason::HostConflict, format!("{d}; using {}'s", d.first)))
        .collect();
    let mut ports: BTreeMap<u16, ServicePort> = BTreeMap::new();
    for c in &order {
        for p in &c.service.ports {
            ports.entry(p.number).or_insert_with(|| p.clone());
        }
    }

    // Priorities: the levels, preferred first.
    let mut levels: Vec<u32> = order.iter().map(|c| setting(&c.registry).priority).collect();
    levels.dedup();
    let prioritised = levels.len() > 1;

    let mut endpoints: Vec<Endpoint> = Vec::new();
    // An instance registered in several registries (double registration,
    // common during a move) is served once, as the first registry in merge
    // order has it: Envoy would keep only the first copy of an address in
    // a load assignment anyway, whatever its level.
    let mut seen: HashSet<(&str, u16)> = HashSet::new();
    for &level in &levels {
        let at: Vec<&&CachedService> = order.iter().filter(|c| setting(&c.registry).priority == level).collect();
        let weights: Vec<Option<u32>> = at.iter().map(|c| setting(&c.registry).weight).collect();
        let shared = weights.iter().any(Option::is_some);
        let total: u64 = weights.iter().map(|w| u64::from(w.unwrap_or(100))).sum();
        for (c, w) in at.iter().zip(&weights) {
            let mut relabel = Relabel::new(&c.registry.name, prioritised.then_some(level));
            let share = if shared && total > 0 { Some(u64::from(w.unwrap_or(100))) } else { None };
            if share == Some(0) {
                continue;
            }
            let own: u64 = c.service.endpoints.iter().map(|e| u64::from(e.weight.max(1))).sum();
            for ep in &c.service.endpoints {
                if !seen.insert((ep.address.as_str(), ep.port)) {
                    continue;
                }
                let weight = match share {
                    // share/total of the level, split as the registry's own weights split it.
                    Some(share) => {
                        let scaled = SHARE_SCALE * share * u64::from(ep.weight.max(1)) / (total * own.max(1));
                        u32::try_from(scaled.max(1)).unwrap_or(u32::MAX)
                    }
                    None => ep.weight,
                };
                endpoints.push(Endpoint {
                    address: ep.address.clone(),
                    port: ep.port,
                    weight,
                    labels: relabel.labels(&ep.labels),
                });
            }
        }
    }
    endpoints.sort();
    let service = Service {
        host: first.service.host.clone(),
        ports: ports.into_values().collect(),
        endpoints,
        tls: first.service.tls.clone(),
    };
    Merged {
        primary: first.registry.clone(),
        service: Arc::new(service),
        registries,
        preferred_priority: prioritised.then(|| levels[0]),
        conflicts,
    }
}

/// Two registries reporting one host differently, on a field translation
/// can serve only one way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    /// The registry whose value is used (the first in merge order).
    pub first: RegistryKey,
    pub other: RegistryKey,
    pub field: String,
    pub ours: String,
    pub theirs: String,
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Disagreement { first, other, field, ours, theirs } = self;
        write!(f, "registries {first} and {other} disagree on {field} ({ours} vs {theirs})")
    }
}

/// Where the services of one host (in merge order, the first one's values
/// used) disagree: a port's protocol, the set of ports (a `vport` on one
/// side: both are served), TLS and its SNI.
pub fn disagreements(order: &[&CachedService]) -> Vec<Disagreement> {
    let mut out = Vec::new();
    let Some(first) = order.first() else { return out };
    let mut push = |other: &RegistryKey, field: String, ours: String, theirs: String| {
        out.push(Disagreement { first: first.registry.clone(), other: other.clone(), field, ours, theirs });
    };
    let mut ports: BTreeMap<u16, &ServicePort> = BTreeMap::new();
    for c in order {
        for p in &c.service.ports {
            match ports.get(&p.number) {
                None => {
                    ports.insert(p.number, p);
                }
                Some(kept) if kept.protocol != p.protocol => {
                    let field = format!("the protocol of port {}", p.number);
                    push(&c.registry, field, kept.protocol.to_string(), p.protocol.to_string());
                }
                Some(_) => {}
            }
        }
    }
    let numbers = |s: &Service| s.ports.iter().map(|p| p.number).collect::<Vec<u16>>();
    let show_tls = |s: &Service| match &s.tls {
        None => "plain".to_string(),
        Some(t) => format!("TLS, SNI {:?}", t.sni.as_deref().unwrap_or("")),
    };
    for c in &order[1..] {
        let (ours, theirs) = (numbers(&first.service), numbers(&c.service));
        if theirs != ours && !theirs.is_empty() && !ours.is_empty() {
            push(&c.registry, "the service ports (vport)".into(), format!("{ours:?}"), format!("{theirs:?}"));
        }
        if c.service.tls != first.service.tls {
            push(&c.registry, "TLS (protocol/sni)".into(), show_tls(&first.service), show_tls(&c.service));
        }
    }
    out
}

/// Labels with the registry (and priority) added, made once per distinct
/// label map of a service: endpoints share their maps.
struct Relabel {
    registry: String,
    priority: Option<String>,
    made: HashMap<*const BTreeMap<String, String>, Labels>,
}

impl Relabel {
    fn new(registry: &str, priority: Option<u32>) -> Relabel {
        Relabel { registry: registry.to_string(), priority: priority.map(|p| p.to_string()), made: HashMap::new() }
    }

    fn labels(&mut self, own: &Labels) -> Labels {
        let key: *const BTreeMap<String, String> = &**own;
        self.made
            .entry(key)
            .or_insert_with(|| {
                let mut map: BTreeMap<String, String> = (**own).clone();
                map.insert(LABEL_ENDPOINT_REGISTRY.to_string(), self.registry.clone());
                if let Some(p) = &self.priority {
                    map.insert(LABEL_PRIORITY.to_string(), p.clone());
                }
                intern(map)
            })
            .clone()
    }
}

/// Adds the registry label to endpoints that lack it (those of a host only
/// one registry reports), one new map per distinct map.
pub struct RegistryLabels(Relabel);

impl RegistryLabels {
    pub fn new(registry: &str) -> RegistryLabels {
        RegistryLabels(Relabel::new(registry, None))
    }

    pub fn of(&mut self, own: &Labels) -> Labels {
        if own.contains_key(LABEL_ENDPOINT_REGISTRY) { own.clone() } else { self.0.labels(own) }
    }
}

/// The value of `label` on an endpoint of a host that `registry` serves,
/// counting the registry label the endpoint carries only once written.
pub fn endpoint_label<'a>(ep: &'a Endpoint, registry: &'a str, label: &str) -> Option<&'a str> {
    match ep.labels.get(label) {
        Some(v) => Some(v),
        None if label == LABEL_ENDPOINT_REGISTRY => Some(registry),
        None => None,
    }
}

#[cfg(test)]
#[path = "merge_tests.rs"]
mod tests;
