//! The incremental translator: it keeps one [`ConfigSet`] up to date from
//! batches of changed hosts, at the cost of what changed.
//!
//! Two stages, each remembering what it wrote so that it can take back
//! exactly that:
//!
//! - **Per host**: a registry service → its clusters, endpoints,
//!   ServiceEntry and TLS DestinationRule (and their MCP resources). A
//!   changed host costs its own translation and encoding, whatever the
//!   catalog size.
//! - **Derived**: Ingresses → Gateway, VirtualServices, DestinationRules;
//!   those → the standalone gateway's listeners, routes and subset
//!   clusters; McpBridge proxies → their clusters, listeners, EnvoyFilters
//!   and the proxied services' endpoints. It reruns only when its inputs
//!   change, or when a host it reads changes in a way it can see: a route
//!   destination or proxied service appearing, going or changing ports or
//!   TLS, or any change to a host with subsets (whose endpoints it splits).
//!   An endpoint change to a routed host costs nothing here.
//!
//! Ownership between the stages: for a proxied host the derived stage owns
//! its endpoints, and for a host with an Ingress DestinationRule it owns
//! the (merged) rule. When that changes the host is retranslated, and the
//! derived stage removes what it drops before, and writes what it makes
//! after, the per-host stage, so a name that changes owner is never lost.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use meshbridge_registries::{Migration, RegistryKind, ServicePort, Tls};

use super::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, SECRET_TYPE};
use super::gateway::{self, GatewayOutput};
use super::ingress;
use super::inputs::Inputs;
use super::mcp;
use super::merge::{self, Merged};
use super::model::{IstioObject, Spec};
use super::set::{ConfigSet, ObjectKey};
use super::warning::Warning;
use super::{envoy, istio, proxy};
use crate::model::{CachedService, Changes, HostState, RegistryKey, View};
use crate::resources::Resource;

/// Where the derived stage's warnings are kept in [`ConfigSet::warnings`];
/// hosts use `host:{host}`, which sorts after it.
const DERIVED: &str = "derived";

/// What one stage wrote for one host (or for the derived stage).
#[derive(Debug, Default)]
struct Written {
    envoy: Vec<(&'static str, Arc<str>)>,
    mcp: Vec<(String, Arc<str>)>,
    objects: Vec<ObjectKey>,
}

/// What the derived stage made, before it is written.
#[derive(Debug, Default)]
struct Derived {
    envoy: Vec<(&'static str, Resource)>,
    objects: Vec<IstioObject>,
    warnings: Vec<Warning>,
    /// Hosts it reads: route destinations and proxied-registry services.
    referenced: BTreeSet<String>,
    /// Hosts whose endpoints it splits into subsets.
    subset_hosts: BTreeSet<String>,
    /// Hosts whose endpoints it replaces (proxied).
    proxied_hosts: BTreeSet<String>,
}

/// What of a service the derived stage can see.
type Shape = Option<(RegistryKey, Vec<ServicePort>, Option<Tls>)>;

fn shape(c: Option<&CachedService>) -> Shape {
    c.map(|c| (c.registry.clone(), c.service.ports.clone(), c.service.tls.clone()))
}

/// A host more than one registry reports.
#[derive(Debug, Clone)]
struct SharedHost {
    sources: Vec<CachedService>,
    preferred_priority: Option<u32>,
    conflicts: Vec<Warning>,
}

/// Keeps a [`ConfigSet`] up to date. Pure: no clock is read.
#[derive(Debug, Default)]
pub struct Translator {
    set: ConfigSet,
    started: bool,
    /// The merged view: host → the service served, under its primary
    /// registry ([`merge`]). For a host one registry reports, the cache's
    /// own service.
    services: BTreeMap<String, CachedService>,
    /// Hosts reported by more than one registry → each registry's service
    /// (to merge again when a `meshbridgeMigration` changes), with what the
    /// merge found.
    shared: HashMap<String, SharedHost>,
    /// Hosts by registry, every registry that reports them (the primary's
    /// own hosts are those whose `services` entry names it).
    by_registry: BTreeMap<RegistryKey, BTreeSet<String>>,
    /// McpBridge `meshbridgeMigration` by registry, as last applied.
    migration: BTreeMap<RegistryKey, Migration>,
    hosts: HashMap<String, Written>,
    /// The derived stage's Envoy resources.
    derived: Written,
    /// The derived stage's objects, with where each is served over MCP.
    derived_objects: HashMap<ObjectKey, Option<(String, Arc<str>)>>,
    /// Hosts the derived stage reads, lowercased: a destination names a
    /// service ignoring case.
    referenced: BTreeSet<String>,
    subset_hosts: BTreeSet<String>,
    proxied_hosts: BTreeSet<String>,
    proxied_registries: BTreeSet<RegistryKey>,
    /// McpBridge `ecdhCurves` by registry, as last applied.
    ecdh_curves: BTreeMap<RegistryKey, Vec<String>>,
    /// Service hosts by lowercase form → every spelling, and the map the
    /// Ingress translation resolves destination hosts with (see
    /// [`ingress::IngressOptions::service_hosts`]).
    /// (Sorted, without duplicates: nearly always one name, where a
    /// `BTreeSet` would cost a whole node per host.)
    spellings: HashMap<String, Vec<String>>,
    service_hosts: imbl::OrdMap<String, String>,
    /// The derived stage's MCP resources, reused while the object is equal.
    derived_mcp: HashMap<ObjectKey, (Arc<IstioObject>, Result<Resource, Warning>)>,
}

impl Translator {
    pub fn new() -> Translator {
        Translator::default()
    }

    /// The current set (cheap to clone: everything inside is shared).
    pub fn set(&self) -> &ConfigSet {
        &self.set
    }

    /// Apply a batch of changed hosts, and the inputs (`inputs_changed`
    /// when they differ from the last call's). True if the set changed;
    /// its revision then grows by one.
    pub fn apply(&mut self, changes: Changes, inputs: &Inputs<'_>, inputs_changed: bool) -> bool {
        let rev = self.set.revision + 1;
        let mut changed = false;
        let registry_proxies: BTreeSet<RegistryKey> = inputs.registry_proxies.keys().cloned().collect();
        let mut rerun = inputs_changed || !self.started || registry_proxies != self.proxied_registries;
        let mut dirty: BTreeSet<String> = BTreeSet::new();
        // A new share or priority merges again the hosts its registry shares.
        let mut remerge: BTreeSet<String> = BTreeSet::new();
        if inputs.registry_migration != self.migration {
            let keys: BTreeSet<&RegistryKey> = inputs.registry_migration.keys().chain(self.migration.keys()).collect();
            for key in keys {
                if inputs.registry_migration.get(key) != self.migration.get(key) {
                    let hosts = self.by_registry.get(key).into_iter().flatten();
                    remerge.extend(hosts.filter(|h| self.shared.contains_key(*h)).cloned());
                }
            }
            self.migration = inputs.registry_migration.clone();
        }
        let mut batch: Vec<(String, HostState)> = changes.hosts;
        for host in remerge {
            if batch.iter().all(|(h, _)| *h != host)
                && let Some(sh) = self.shared.get(&host)
            {
                let mut sources = sh.sources.clone().into_iter();
                let winner = sources.next();
                batch.push((host, HostState { winner, also: sources.collect() }));
            }
        }
        for (host, state) in batch {
            let old = shape(self.services.get(&host));
            let proxied_before = old.as_ref().is_some_and(|(r, _, _)| registry_proxies.contains(r));
            self.set_host(&host, state);
            let new = shape(self.services.get(&host));
            let proxied = proxied_before || new.as_ref().is_some_and(|(r, _, _)| registry_proxies.contains(r));
            let read = proxied || self.referenced.contains(&host.to_ascii_lowercase());
            rerun |= self.subset_hosts.contains(&host) || (old != new && read);
            dirty.insert(host);
        }
        self.proxied_registries = registry_proxies;
        self.started = true;
        // New curves change every cluster of their registry.
        if inputs.registry_ecdh_curves != self.ecdh_curves {
            let keys: BTreeSet<&RegistryKey> =
                inputs.registry_ecdh_curves.keys().chain(self.ecdh_curves.keys()).collect();
            for key in keys {
                if inputs.registry_ecdh_curves.get(key) != self.ecdh_curves.get(key) {
                    dirty.extend(self.by_registry.get(key).into_iter().flatten().cloned());
                    rerun |= self.proxied_registries.contains(key);
                }
            }
            self.ecdh_curves = inputs.registry_ecdh_curves.clone();
        }

        let derived = rerun.then(|| self.derive(inputs));
        if let Some(d) = &derived {
            // Hosts changing owner are retranslated by their own stage.
            dirty.extend(d.subset_hosts.symmetric_difference(&self.subset_hosts).cloned());
            dirty.extend(d.proxied_hosts.symmetric_difference(&self.proxied_hosts).cloned());
            self.referenced = d.referenced.clone();
            self.subset_hosts = d.subset_hosts.clone();
            self.proxied_hosts = d.proxied_hosts.clone();
            changed |= self.remove_derived(rev, d);
        }
        for host in &dirty {
            changed |= self.translate_host(rev, host);
        }
        if let Some(d) = derived {
            changed |= self.write_derived(rev, d);
        }
        if changed {
            self.set.revision = rev;
        }
        self.set.changed_at = changes.changed_at;
        changed
    }

    fn set_host(&mut self, host: &str, state: HostState) {
        let merged: Option<Merged> = state.winner.as_ref().map(|w| {
            let mut sources: Vec<&CachedService> = vec![w];
            sources.extend(state.also.iter());
            merge::merge(host, &sources, &self.migration)
        });
        let lower = host.to_ascii_lowercase();
        let spellings = self.spellings.entry(lower.clone()).or_default();
        let at = spellings.binary_search_by(|s| s.as_str().cmp(host));
        if merged.is_some() {
            if let Err(i) = at {
                spellings.reserve_exact(1);
                spellings.insert(i, host.to_string());
            }
        } else {
            if let Ok(i) = at {
                spellings.remove(i);
            }
            self.service_hosts.remove(host);
        }
        // An exact spelling names itself; a lowercase form the first
        // spelling that has it.
        for s in spellings.iter() {
            self.service_hosts.insert(s.clone(), s.clone());
        }
        match spellings.first().cloned() {
            None => {
                self.spellings.remove(&lower);
                self.service_hosts.remove(&lower);
            }
            Some(first) if spellings.binary_search(&lower).is_err() => {
                self.service_hosts.insert(lower, first);
            }
            Some(_) => {}
        }
        let old_primary = self.services.remove(host).map(|c| c.registry);
        let old_shared = self.shared.remove(host);
        let old_registries = match &old_shared {
            Some(sh) => sh.sources.iter().map(|c| c.registry.clone()).collect(),
            None => old_primary.into_iter().collect::<Vec<_>>(),
        };
        for key in old_registries {
            if let Some(hosts) = self.by_registry.get_mut(&key) {
                hosts.remove(host);
                if hosts.is_empty() {
                    self.by_registry.remove(&key);
                }
            }
        }
        let Some(m) = merged else { return };
        for key in &m.registries {
            self.by_registry.entry(key.clone()).or_default().insert(host.to_string());
        }
        if !state.also.is_empty() {
            let mut sources = state.also;
            sources.extend(state.winner);
            sources.sort_by(|a, b| a.registry.cmp(&b.registry));
            let sh = SharedHost { sources, preferred_priority: m.preferred_priority, conflicts: m.conflicts };
            self.shared.insert(host.to_string(), sh);
        }
        self.services.insert(host.to_string(), CachedService { registry: m.primary, service: m.service });
    }

    /// The host's registry DestinationRule: its TLS, and registry failover
    /// when its registries have several priorities.
    fn registry_rule(&self, host: &str) -> Option<IstioObject> {
        let c = self.services.get(host)?;
        let preferred = self.shared.get(host).and_then(|sh| sh.preferred_priority);
        istio::destination_rule(&c.registry, &c.service, preferred)
    }

    /// The per-host stage for one host: write what it makes now, take back
    /// what it made before and no longer does.
    fn translate_host(&mut self, rev: u64, host: &str) -> bool {
        let mut warnings = Vec::new();
        let mut resources: Vec<(&'static str, Resource)> = Vec::new();
        let mut objects = Vec::new();
        if let Some(c) = self.services.get(host) {
            if let Some(sh) = self.shared.get(host) {
                warnings.extend(sh.conflicts.iter().cloned());
            }
            let curves = self.ecdh_curves.get(&c.registry).map_or(&[][..], Vec::as_slice);
            resources.extend(envoy::clusters_with(&c.service, curves).into_iter().map(|r| (CLUSTER_TYPE, r)));
            if !self.proxied_hosts.contains(host) {
                resources.extend(envoy::load_assignments(&c.service).into_iter().map(|r| (ENDPOINT_TYPE, r)));
            }
            // A Kubernetes Service is the standalone gateway's alone:
            // istiod reads Services itself.
            if c.registry.kind != RegistryKind::Kubernetes {
                match istio::service_entry(&c.registry, &c.service) {
                    Ok(se) => objects.push(se),
                    Err(w) => warnings.push(w),
                }
                if !self.subset_hosts.contains(host) {
                    objects.extend(self.registry_rule(host));
                }
            }
        }
        let mut written = Written::default();
        let mut changed = false;
        for (type_url, r) in resources {
            written.envoy.push((type_url, r.name.clone()));
            changed |= self.set.envoy.entry(type_url).or_default().insert(rev, r);
        }
        for obj in objects {
            let encoded = encode(&obj);
            let (key, mcp) = self.write_object(rev, Arc::new(obj), encoded, &mut warnings, &mut changed);
            written.objects.push(key);
            written.mcp.extend(mcp);
        }
        let old = self.hosts.remove(host).unwrap_or_default();
        changed |= self.take_back(rev, &old, &written);
        if !written.envoy.is_empty() || !written.objects.is_empty() {
            // Kept for every host (10k at 10k services): no spare capacity.
            written.envoy.shrink_to_fit();
            written.objects.shrink_to_fit();
            written.mcp.shrink_to_fit();
            self.hosts.insert(host.to_string(), written);
        }
        changed |= self.set_warnings(format!("host:{host}"), warnings);
        changed
    }

    /// Put an object and its MCP resource (or the reason it has none) in
    /// the set; returns its key and where it is served.
    fn write_object(
        &mut self,
        rev: u64,
        obj: Arc<IstioObject>,
        encoded: Result<Resource, Warning>,
        warnings: &mut Vec<Warning>,
        changed: &mut bool,
    ) -> (ObjectKey, Option<(String, Arc<str>)>) {
        let key = object_key(&obj);
        let mut served = None;
        match encoded {
            Ok(r) => {
                let collection = mcp::collection_of(&obj);
                served = Some((collection.clone(), r.name.clone()));
                *changed |= self.set.mcp.entry(collection).or_default().insert(rev, r);
            }
            Err(w) => warnings.push(w),
        }
        if self.set.istio.get(&key).is_none_or(|o| **o != *obj) {
            self.set.istio.insert(key.clone(), obj);
            *changed = true;
        }
        (key, served)
    }

    /// Remove what `old` wrote and `new` did not.
    fn take_back(&mut self, rev: u64, old: &Written, new: &Written) -> bool {
        let mut changed = false;
        for (type_url, name) in &old.envoy {
            if !new.envoy.iter().any(|(t, n)| t == type_url && n == name)
                && let Some(t) = self.set.envoy.get_mut(type_url)
            {
                changed |= t.remove(rev, name);
            }
        }
        for (collection, name) in &old.mcp {
            if !new.mcp.iter().any(|(c, n)| c == collection && n == name)
                && let Some(t) = self.set.mcp.get_mut(collection)
            {
                changed |= t.remove(rev, name);
            }
        }
        for key in &old.objects {
            if !new.objects.contains(key) && self.set.istio.remove(key).is_some() {
                changed = true;
            }
        }
        changed
    }

    fn set_warnings(&mut self, source: String, warnings: Vec<Warning>) -> bool {
        if warnings.is_empty() {
            return self.set.warnings.remove(&source).is_some();
        }
        if self.set.warnings.get(&source).is_some_and(|w| **w == *warnings) {
            return false;
        }
        self.set.warnings.insert(source, warnings.into());
        true
    }

    /// The derived stage's output, from the inputs and the current view.
    fn derive(&mut self, inputs: &Inputs<'_>) -> Derived {
        // Redone whenever the stage reruns: destinations resolve against
        // the services there are now. O(Ingresses).
        let mut opts = inputs.ingress.clone();
        opts.known_secrets.extend(inputs.tls_secrets.iter().map(|t| (t.namespace.clone(), t.name.clone())));
        opts.known_ca_secrets.extend(inputs.ca_secrets.iter().map(|t| (t.namespace.clone(), t.name.clone())));
        if !inputs.ingresses.is_empty() {
            opts.service_hosts = self.service_hosts.clone();
        }
        let from_ingress = ingress::translate(inputs.ingresses, &opts);
        let mut d = Derived { warnings: from_ingress.warnings, ..Derived::default() };
        // A mirror target that appears or goes reruns this stage.
        d.referenced.extend(from_ingress.looked_up);
        let mut objects = from_ingress.objects;

        // An Ingress DestinationRule takes the registry rule's TLS for its host.
        for obj in &mut objects {
            if let Spec::DestinationRule(rule) = &mut obj.spec {
                d.subset_hosts.insert(rule.host.clone());
                let registry_rule = self.registry_rule(&rule.host);
                if let Some(IstioObject { spec: Spec::DestinationRule(fallback), .. }) = registry_rule {
                    rule.fill_unset(&fallback);
                }
            }
        }

        let mut candidates: Vec<&CachedService> = self
            .proxied_registries
            .iter()
            .filter_map(|r| Some((r, self.by_registry.get(r)?)))
            .flat_map(|(r, hosts)| hosts.iter().map(move |h| (r, h)))
            .filter_map(|(r, h)| self.services.get(h).filter(|c| c.registry == *r))
            .collect();
        candidates.sort_by(|a, b| a.service.host.cmp(&b.service.host));
        d.referenced.extend(candidates.iter().map(|c| c.service.host.to_ascii_lowercase()));
        let proxied = proxy::translate(candidates, inputs);
        d.warnings.extend(proxied.warnings);
        objects.extend(proxied.objects);

        let services = &self.services;
        let lookup = |host: &str| -> Option<CachedService> { services.get(host).cloned() };
        let gw: GatewayOutput =
            gateway::envoy_gateway(&objects, &lookup, inputs.tls_secrets, inputs.ca_secrets, &inputs.gateway);
        d.warnings.extend(gw.warnings);
        d.referenced.extend(gw.referenced.iter().map(|h| h.to_ascii_lowercase()));
        for r in &proxied.load_assignments {
            d.proxied_hosts.extend(r.name.rsplit('|').next().map(str::to_string));
        }
        for (type_url, list) in [
            (CLUSTER_TYPE, gw.clusters),
            (ENDPOINT_TYPE, gw.load_assignments),
            (LISTENER_TYPE, gw.listeners),
            (ROUTE_TYPE, gw.routes),
            (SECRET_TYPE, gw.secrets),
            (CLUSTER_TYPE, proxied.clusters),
            (ENDPOINT_TYPE, proxied.load_assignments),
            (LISTENER_TYPE, proxied.listeners),
        ] {
            d.envoy.extend(list.into_iter().map(|r| (type_url, r)));
        }
        d.objects = objects;
        d
    }

    /// First half of writing the derived stage: remove what it made before
    /// and no longer makes.
    fn remove_derived(&mut self, rev: u64, d: &Derived) -> bool {
        let envoy: Vec<(&'static str, Arc<str>)> = d.envoy.iter().map(|(t, r)| (*t, r.name.clone())).collect();
        let keep = Written { envoy, ..Written::default() };
        let old = std::mem::take(&mut self.derived.envoy);
        let mut changed = self.take_back(rev, &Written { envoy: old, ..Written::default() }, &keep);
        let live: BTreeSet<ObjectKey> = d.objects.iter().map(object_key).collect();
        let gone: Vec<ObjectKey> = self.derived_objects.keys().filter(|k| !live.contains(*k)).cloned().collect();
        for key in gone {
            let served = self.derived_objects.remove(&key).flatten();
            self.derived_mcp.remove(&key);
            if self.set.istio.remove(&key).is_some() {
                changed = true;
            }
            if let Some((collection, name)) = served
                && let Some(t) = self.set.mcp.get_mut(&collection)
            {
                changed |= t.remove(rev, &name);
            }
        }
        changed
    }

    /// Second half: write what the derived stage makes now.
    fn write_derived(&mut self, rev: u64, d: Derived) -> bool {
        let mut changed = false;
        for (type_url, r) in d.envoy {
            self.derived.envoy.push((type_url, r.name.clone()));
            changed |= self.set.envoy.entry(type_url).or_default().insert(rev, r);
        }
        let mut warnings = d.warnings;
        for obj in d.objects {
            let key = object_key(&obj);
            let reuse = self.derived_mcp.get(&key).filter(|(o, _)| **o == obj).map(|(_, r)| r.clone());
            let encoded = match reuse {
                Some(r) => r,
                None => encode(&obj),
            };
            let obj = Arc::new(obj);
            self.derived_mcp.insert(key.clone(), (obj.clone(), encoded.clone()));
            let (key, served) = self.write_object(rev, obj, encoded, &mut warnings, &mut changed);
            // An object that no longer encodes leaves MCP.
            let before = self.derived_objects.insert(key, served.clone()).flatten();
            if let Some((collection, name)) = before.filter(|_| served.is_none())
                && let Some(t) = self.set.mcp.get_mut(&collection)
            {
                changed |= t.remove(rev, &name);
            }
        }
        // Envoy types the stage owns always exist, so an emptied one is
        // still answered.
        for type_url in [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, SECRET_TYPE] {
            self.set.envoy.entry(type_url).or_default();
        }
        changed |= self.set_warnings(DERIVED.into(), dedup(warnings));
        changed
    }
}

/// The object's MCP resource, with its stable creation time
/// ([`ObjectMeta::created`](super::model::ObjectMeta::created)).
fn encode(obj: &IstioObject) -> Result<Resource, Warning> {
    mcp::resource(obj, obj.metadata.created.unwrap_or(0))
}

fn object_key(o: &IstioObject) -> ObjectKey {
    (o.kind(), o.metadata.namespace.clone(), o.metadata.name.clone())
}

/// Say each thing once, in the order first said.
fn dedup(warnings: Vec<Warning>) -> Vec<Warning> {
    let mut seen = BTreeSet::new();
    warnings.into_iter().filter(|w| seen.insert(w.clone())).collect()
}

/// Translate a whole view at once (tests, and anything that has a view
/// rather than changes), with creation times all zero.
pub fn build(view: &View, inputs: &Inputs<'_>) -> ConfigSet {
    let mut t = Translator::new();
    t.apply(view.clone().into_changes(), inputs, true);
    t.set().clone()
}

/// [`build`] with no Ingress, proxy or gateway inputs.
pub fn config_set(view: &View) -> ConfigSet {
    build(view, &Inputs::default())
}

#[cfg(test)]
#[path = "build_tests.rs"]
mod tests;
