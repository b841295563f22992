//! The memory cache of per-registry services.
//!
//! Each registry owns a map host → service that only its own watcher writes
//! (through a [`RegistrySink`]). Readers take a merged, ordered view. Every
//! change that alters content bumps a revision on a `watch` channel, which
//! coalesces bursts: the publisher always translates the newest state.
//!
//! Outage rule: only answers from a registry change its services. Errors
//! update the registry's status and nothing else, so endpoints survive a
//! registry that goes away.
//!
//! The cache also keeps what the admin API and metrics report per registry:
//! its endpoint (never credentials), status, and event and error counters.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use meshbridge_registries::{RegistryError, RegistrySpec, RepairKind, Secret, Service, Sink, Update};
use serde::Serialize;
use tokio::sync::watch;
use tracing::{debug, warn};

pub mod metrics;

pub use crate::model::{CachedService, Changes, HostState, RegistryKey, View};
use metrics::{RegistryErrorLabels, RegistryLabels, RegistryMetrics, RepairLabels};

/// What we know about a registry's health, from real calls to it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistryStatus {
    /// The most recent call to the registry succeeded.
    pub healthy: bool,
    /// The first full sync has completed.
    pub ready: bool,
    pub last_sync_time: Option<SystemTime>,
    pub last_change_time: Option<SystemTime>,
    pub last_error: Option<String>,
    pub last_error_time: Option<SystemTime>,
    pub consecutive_failures: u64,
    /// The services were loaded from the state dump and the registry has
    /// not answered since (see `crate::dump`).
    pub stale: bool,
    /// The spec cannot become a watcher: reported, never waited for.
    pub config_error: bool,
    /// Since when calls to the registry fail (or, for a stale registry, since
    /// its dump was loaded); `None` while it answers.
    pub unreachable_since: Option<SystemTime>,
    /// `--max-stale` withdrew the endpoints; the next answer restores them.
    pub withdrawn: bool,
    /// The last repair of the anti-entropy layer, if any.
    #[serde(skip)]
    pub last_repair: Option<Repair>,
    /// Services repaired so far, by kind (the counter's values).
    pub repairs: BTreeMap<&'static str, u64>,
}

/// One repair told by [`Sink::repaired`]: when, why, and (some of) the
/// services it corrected.
#[derive(Debug, Clone, PartialEq)]
pub struct Repair {
    pub time: SystemTime,
    pub kind: RepairKind,
    /// How many services it corrected.
    pub count: usize,
    /// The first [`REPAIR_NAMED`] of them.
    pub services: Vec<String>,
}

/// Services a repair names in its log line and on the admin API.
pub const REPAIR_NAMED: usize = 20;

#[derive(Debug, Default)]
struct RegistryEntry {
    /// Bumped each time a watcher is (re)started, so that a stopped
    /// watcher's late updates are dropped.
    generation: u64,
    services: BTreeMap<String, Arc<Service>>,
    status: RegistryStatus,
    /// `domain:port`, from the spec.
    endpoint: String,
    /// The spec's credentials, scrubbed from every error message we keep.
    secrets: Vec<Secret>,
    /// Error kinds counted so far, to drop their series on removal.
    error_kinds: BTreeSet<&'static str>,
}

#[derive(Debug, Default)]
struct State {
    registries: BTreeMap<RegistryKey, RegistryEntry>,
    revision: u64,
    /// When the oldest change not yet taken by [`Cache::take_changes`] happened.
    pending_since: Option<Instant>,
    /// Hosts whose content changed since the last [`Cache::take_changes`].
    dirty: HashSet<String>,
    /// Hosts more than one registry reports, with where they disagree
    /// (kept up to date as changes are taken: O(changed hosts)).
    shared: BTreeMap<String, SharedHost>,
}

/// A host several registries report.
#[derive(Debug, Clone, Default)]
struct SharedHost {
    registries: Vec<RegistryKey>,
    /// [`crate::translate::merge::disagreements`], in registry key order:
    /// the two registries, and the text.
    disagreements: Vec<(RegistryKey, RegistryKey, String)>,
}

/// Service cache shared by watchers (writers) and the publisher (reader).
#[derive(Debug)]
pub struct Cache {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    metrics: RegistryMetrics,
    watchers: crate::watchers::LiveTasks,
}

/// One registry as the admin API and metrics report it.
#[derive(Debug, Clone)]
pub struct RegistryReport {
    pub key: RegistryKey,
    /// `domain:port` as configured; empty if the spec was never described.
    pub endpoint: String,
    pub status: RegistryStatus,
    pub services: usize,
    pub endpoints: usize,
    /// Of its services, those other registries report too (merged).
    pub shared_services: usize,
    /// The first [`CONFLICTS_NAMED`] disagreements with other registries
    /// on hosts it shares, as `host …: registries … disagree on …`.
    pub conflicts: Vec<String>,
}

/// Disagreements a registry report names.
pub const CONFLICTS_NAMED: usize = 10;

impl Default for Cache {
    fn default() -> Self {
        Cache {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
            metrics: RegistryMetrics::default(),
            watchers: Default::default(),
        }
    }
}

impl Cache {
    pub fn new() -> Arc<Cache> {
        Arc::new(Cache::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock must not take the cache
        // down with it: the data is always left consistent between calls.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Revision changes whenever content changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self, state: &mut State) {
        state.revision += 1;
        state.pending_since.get_or_insert_with(Instant::now);
        self.changed.send_replace(state.revision);
    }

    /// The counters and histograms the sinks record.
    pub fn metrics(&self) -> &RegistryMetrics {
        &self.metrics
    }

    /// Live watcher tasks (started by the reconciler, not yet ended).
    pub fn watchers(&self) -> &crate::watchers::LiveTasks {
        &self.watchers
    }

    /// Seed a registry with services from the state dump, before its watcher
    /// starts: they are served, marked stale, until its first answer.
    pub fn load_dump(&self, key: &RegistryKey, services: Vec<Service>) {
        let mut state = self.lock();
        let state = &mut *state;
        let entry = state.registries.entry(key.clone()).or_default();
        entry.status.stale = true;
        entry.status.unreachable_since = Some(SystemTime::now());
        if apply(&mut entry.services, Update::Snapshot(services), &mut state.dirty) {
            self.bump(state);
        }
    }

    /// `--max-stale`: empty every service of a registry that has been
    /// unreachable for too long (ports kept, so clusters stay and answer
    /// 503 rather than vanish). Its next answer restores them.
    pub fn withdraw(&self, key: &RegistryKey) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(entry) = state.registries.get_mut(key) else { return };
        if entry.status.withdrawn {
            return;
        }
        entry.status.withdrawn = true;
        let emptied: Vec<Service> =
            entry.services.values().map(|s| Service { endpoints: Vec::new(), ..Service::clone(s) }).collect();
        if apply(&mut entry.services, Update::Snapshot(emptied), &mut state.dirty) {
            self.bump(state);
        }
    }

    /// Remember what a registry's spec says about where it is and what its
    /// credentials are: the endpoint is reported, the credentials are
    /// scrubbed from every error message the cache keeps.
    pub fn describe(&self, key: &RegistryKey, spec: &RegistrySpec) {
        let mut state = self.lock();
        let entry = state.registries.entry(key.clone()).or_default();
        entry.endpoint = spec.endpoint();
        entry.secrets = spec.secrets().into_iter().cloned().collect();
    }

    /// Prepare for a (new or restarted) watcher of `key` and return the sink
    /// it writes through. The registry's services are kept, so a restart
    /// does not flap them: the new watcher's first snapshot replaces them.
    pub fn attach(self: &Arc<Self>, key: &RegistryKey) -> Arc<dyn Sink> {
        let mut state = self.lock();
        let entry = state.registries.entry(key.clone()).or_default();
        entry.generation += 1;
        entry.status.ready = false;
        Arc::new(RegistrySink { cache: self.clone(), key: key.clone(), generation: entry.generation })
    }

    /// Forget a registry and its services.
    /// The first full read of a source that writes a service at a time and
    /// never sends an [`Update::Snapshot`] (the Kubernetes Services) is
    /// done: it counts as answered, for the startup gate and `/ready`.
    pub fn mark_synced(&self, key: &RegistryKey) {
        let mut state = self.lock();
        if let Some(entry) = state.registries.get_mut(key) {
            entry.status.ready = true;
            entry.status.last_sync_time = Some(SystemTime::now());
        }
    }

    pub fn remove(&self, key: &RegistryKey) {
        let mut state = self.lock();
        let Some(entry) = state.registries.remove(key) else {
            return;
        };
        self.metrics.forget(&RegistryLabels::from(key), &entry.error_kinds);
        if !entry.services.is_empty() {
            state.dirty.extend(entry.services.into_keys());
            self.bump(&mut state);
        }
    }

    /// Record a registry that cannot run (bad spec): it has a status but no
    /// services, and it counts as having finished (failed) its first sync.
    pub fn set_failed(&self, key: &RegistryKey, error: &str) {
        let mut state = self.lock();
        let entry = state.registries.entry(key.clone()).or_default();
        entry.generation += 1;
        // A spec that cannot become a watcher is RegistryError::Config.
        let labels = RegistryErrorLabels { name: key.name.clone(), r#type: key.kind.as_str(), kind: "config" };
        self.metrics.errors.get_or_create(&labels).inc();
        entry.error_kinds.insert("config");
        entry.status.healthy = false;
        entry.status.config_error = true;
        entry.status.last_error = Some(scrub(error, &entry.secrets));
        entry.status.last_error_time = Some(SystemTime::now());
        entry.status.consecutive_failures += 1;
    }

    pub fn view(&self) -> View {
        Self::merged(&self.lock())
    }

    /// The hosts that changed since the last call, each with its current
    /// state, and the time of the oldest change (taken: the next call
    /// reports newer changes only). O(hosts changed × registries).
    pub fn take_changes(&self) -> Changes {
        let mut state = self.lock();
        let dirty = std::mem::take(&mut state.dirty);
        let mut hosts: Vec<(String, HostState)> = dirty
            .into_iter()
            .map(|h| {
                let s = Self::host_state(&state, &h);
                (h, s)
            })
            .collect();
        for (host, s) in &hosts {
            set_shared(&mut state.shared, host, s);
        }
        hosts.sort_by(|a, b| a.0.cmp(&b.0));
        Changes { revision: state.revision, changed_at: state.pending_since.take(), hosts }
    }

    /// Every host, as [`take_changes`](Self::take_changes) would report it
    /// if all had changed; pending changes are taken too. For the first
    /// translation.
    pub fn take_all(&self) -> Changes {
        let mut state = self.lock();
        state.dirty.clear();
        let changed_at = state.pending_since.take();
        let view = Self::merged(&state);
        let changes = view.into_changes();
        state.shared.clear();
        for (host, s) in &changes.hosts {
            set_shared(&mut state.shared, host, s);
        }
        Changes { changed_at, ..changes }
    }

    fn host_state(state: &State, host: &str) -> HostState {
        let mut out = HostState::default();
        for (key, entry) in &state.registries {
            if let Some(svc) = entry.services.get(host) {
                match out.winner {
                    None => out.winner = Some(CachedService { registry: key.clone(), service: svc.clone() }),
                    Some(_) => out.also.push(CachedService { registry: key.clone(), service: svc.clone() }),
                }
            }
        }
        out
    }

    fn merged(state: &State) -> View {
        let mut view = View { revision: state.revision, ..View::default() };
        for (key, entry) in &state.registries {
            for (host, svc) in &entry.services {
                if view.services.contains_key(host) {
                    let c = CachedService { registry: key.clone(), service: svc.clone() };
                    view.also.entry(host.clone()).or_default().push(c);
                    continue;
                }
                view.services.insert(host.clone(), CachedService { registry: key.clone(), service: svc.clone() });
            }
        }
        view
    }

    /// Every registry's key and status, in key order: no per-service work
    /// (the publisher asks on every change, at 10k services).
    /// Counts are in [`registries`](Self::registries).
    pub fn statuses(&self) -> Vec<(RegistryKey, RegistryStatus)> {
        self.lock().registries.iter().map(|(k, e)| (k.clone(), e.status.clone())).collect()
    }

    /// Every registry, in key order, as the admin API reports it.
    pub fn registries(&self) -> Vec<RegistryReport> {
        let state = self.lock();
        state.registries.iter().map(|(k, e)| with_shared(report(k, e), &state.shared)).collect()
    }

    /// One registry's report and services.
    pub fn registry(&self, key: &RegistryKey) -> Option<(RegistryReport, BTreeMap<String, Arc<Service>>)> {
        let state = self.lock();
        state.registries.get(key).map(|e| (with_shared(report(key, e), &state.shared), e.services.clone()))
    }

    /// Services of one registry, by host (the state dump).
    pub fn registry_services(&self, key: &RegistryKey) -> Option<BTreeMap<String, Arc<Service>>> {
        self.lock().registries.get(key).map(|e| e.services.clone())
    }

    fn with_entry(
        &self,
        key: &RegistryKey,
        generation: u64,
        f: impl FnOnce(&mut RegistryEntry, &mut HashSet<String>) -> bool,
    ) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(entry) = state.registries.get_mut(key) else {
            return;
        };
        if entry.generation != generation {
            debug!(registry = %key, "dropping update from a stopped watcher");
            return;
        }
        if f(entry, &mut state.dirty) {
            entry.status.last_change_time = Some(SystemTime::now());
            self.bump(state);
        }
    }
}

/// Keep `shared` in line with one host's state.
fn set_shared(shared: &mut BTreeMap<String, SharedHost>, host: &str, state: &HostState) {
    let Some(winner) = state.winner.as_ref().filter(|_| !state.also.is_empty()) else {
        shared.remove(host);
        return;
    };
    let mut order: Vec<&CachedService> = vec![winner];
    order.extend(state.also.iter());
    let registries = order.iter().map(|c| c.registry.clone()).collect();
    let disagreements = crate::translate::merge::disagreements(&order)
        .into_iter()
        .map(|d| (d.first.clone(), d.other.clone(), format!("host {host}: {d}")))
        .collect();
    shared.insert(host.to_string(), SharedHost { registries, disagreements });
}

/// A report with what its registry shares with others: O(shared hosts).
fn with_shared(mut report: RegistryReport, shared: &BTreeMap<String, SharedHost>) -> RegistryReport {
    for s in shared.values().filter(|s| s.registries.contains(&report.key)) {
        report.shared_services += 1;
        for (a, b, text) in &s.disagreements {
            if (*a == report.key || *b == report.key) && report.conflicts.len() < CONFLICTS_NAMED {
                report.conflicts.push(text.clone());
            }
        }
    }
    report
}

fn report(key: &RegistryKey, e: &RegistryEntry) -> RegistryReport {
    RegistryReport {
        key: key.clone(),
        endpoint: e.endpoint.clone(),
        status: e.status.clone(),
        services: e.services.len(),
        shared_services: 0,
        conflicts: Vec::new(),
        endpoints: e.services.values().map(|s| s.endpoints.len()).sum(),
    }
}

/// `message` with every credential replaced. Watchers already keep
/// credentials out of their errors; this makes sure of it for everything
/// the admin API shows, whatever a client library put in its message.
fn scrub(message: &str, secrets: &[Secret]) -> String {
    let mut out = message.to_string();
    for s in secrets {
        if out.contains(s.expose()) {
            out = out.replace(s.expose(), "<redacted>");
        }
    }
    out
}

/// Apply an update, adding every host whose content changed to `dirty`;
/// true if anything changed. A snapshot costs its own size; an upsert or a
/// removal costs one service.
fn apply(services: &mut BTreeMap<String, Arc<Service>>, update: Update, dirty: &mut HashSet<String>) -> bool {
    match update {
        Update::Snapshot(list) => {
            let mut new: BTreeMap<String, Arc<Service>> = BTreeMap::new();
            let mut changed = false;
            for svc in list {
                // Keep the shared copy of an unchanged service.
                let svc = match services.get(&svc.host) {
                    Some(old) if **old == svc => old.clone(),
                    _ => {
                        changed = true;
                        dirty.insert(svc.host.clone());
                        Arc::new(svc)
                    }
                };
                new.insert(svc.host.clone(), svc);
            }
            for host in services.keys().filter(|h| !new.contains_key(*h)) {
                changed = true;
                dirty.insert(host.clone());
            }
            *services = new;
            changed
        }
        Update::Upsert(svc) => {
            if services.get(&svc.host).is_some_and(|old| **old == svc) {
                return false;
            }
            dirty.insert(svc.host.clone());
            services.insert(svc.host.clone(), Arc::new(svc));
            true
        }
        Update::Remove(host) => {
            let removed = services.remove(&host).is_some();
            if removed {
                dirty.insert(host);
            }
            removed
        }
    }
}

/// The cache's side of [`Sink`] for one watcher generation.
struct RegistrySink {
    cache: Arc<Cache>,
    key: RegistryKey,
    generation: u64,
}

impl RegistrySink {
    /// Record a failed call; an `outage` (the registry, not one part of it)
    /// also starts or continues the unreachable period.
    fn failed(&self, error: &RegistryError, outage: bool) {
        let metrics = &self.cache.metrics;
        self.cache.with_entry(&self.key, self.generation, |entry, _| {
            let kind = error.kind();
            let labels = RegistryErrorLabels { name: self.key.name.clone(), r#type: self.key.kind.as_str(), kind };
            metrics.errors.get_or_create(&labels).inc();
            entry.error_kinds.insert(kind);
            entry.status.healthy = false;
            if outage {
                entry.status.unreachable_since.get_or_insert_with(SystemTime::now);
                entry.status.consecutive_failures += 1;
            }
            entry.status.last_error = Some(scrub(&error.to_string(), &entry.secrets));
            entry.status.last_error_time = Some(SystemTime::now());
            false
        });
    }
}

impl Sink for RegistrySink {
    fn update(&self, update: Update) {
        let full = matches!(update, Update::Snapshot(_));
        let metrics = &self.cache.metrics;
        self.cache.with_entry(&self.key, self.generation, |entry, dirty| {
            metrics.events.get_or_create(&RegistryLabels::from(&self.key)).inc();
            let now = SystemTime::now();
            if full {
                // Present (at 0) from the first snapshot on, so that "no
                // drift" is a value, not a missing series.
                for kind in RepairKind::ALL {
                    let _ = metrics.drift_corrected.get_or_create(&RepairLabels::new(&self.key, kind));
                }
                entry.status.ready = true;
                entry.status.stale = false;
                entry.status.withdrawn = false;
                entry.status.last_sync_time = Some(now);
            }
            entry.status.healthy = true;
            entry.status.unreachable_since = None;
            entry.status.consecutive_failures = 0;
            apply(&mut entry.services, update, dirty)
        });
    }

    fn healthy(&self) {
        self.cache.with_entry(&self.key, self.generation, |entry, _| {
            entry.status.healthy = true;
            if !entry.status.stale {
                entry.status.unreachable_since = None;
            }
            entry.status.consecutive_failures = 0;
            false
        });
    }

    fn error(&self, error: &RegistryError) {
        // The watcher logs the failure itself; this is the cache's side of it.
        debug!(registry = %self.key, kind = error.kind(), %error, "registry call failed; keeping last known services");
        self.failed(error, true);
    }

    /// Not healthy, but the registry answers: no `unreachable_since`, so
    /// `--max-stale` never withdraws a registry for one unreadable service.
    fn degraded(&self, error: &RegistryError) {
        debug!(registry = %self.key, kind = error.kind(), %error, "part of the registry unreadable; keeping its last known state");
        self.failed(error, false);
    }

    fn repaired(&self, kind: RepairKind, hosts: &[String]) {
        let named: Vec<String> = hosts.iter().take(REPAIR_NAMED).cloned().collect();
        warn!(
            registry = %self.key,
            kind = kind.as_str(),
            count = hosts.len(),
            services = ?named,
            "anti-entropy repaired services the watcher's change detection had left wrong"
        );
        let metrics = &self.cache.metrics;
        self.cache.with_entry(&self.key, self.generation, |entry, _| {
            let labels = RepairLabels::new(&self.key, kind);
            metrics.drift_corrected.get_or_create(&labels).inc_by(hosts.len() as u64);
            *entry.status.repairs.entry(kind.as_str()).or_default() += hosts.len() as u64;
            entry.status.last_repair =
                Some(Repair { time: SystemTime::now(), kind, count: hosts.len(), services: named.clone() });
            false
        });
    }

    fn synced(&self, took: Duration) {
        let metrics = &self.cache.metrics;
        self.cache.with_entry(&self.key, self.generation, |_, _| {
            metrics.sync_duration.get_or_create(&RegistryLabels::from(&self.key)).observe(took.as_secs_f64());
            false
        });
    }
}

impl RepairLabels {
    fn new(key: &RegistryKey, kind: RepairKind) -> RepairLabels {
        RepairLabels { name: key.name.clone(), r#type: key.kind.as_str(), kind: kind.as_str() }
    }
}

impl From<&RegistryKey> for RegistryLabels {
    fn from(key: &RegistryKey) -> Self {
        RegistryLabels { name: key.name.clone(), r#type: key.kind.as_str() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshbridge_registries::{Endpoint, Protocol, RegistryKind, ServicePort};

    fn svc(host: &str, addrs: &[&str]) -> Service {
        let eps = addrs
            .iter()
            .map(|a| Endpoint { address: a.to_string(), port: 80, weight: 1, labels: Default::default() })
            .collect();
        Service::new(host, vec![ServicePort { number: 80, protocol: Protocol::Http, name: "http-80".into() }], eps)
    }

    fn key(name: &str) -> RegistryKey {
        RegistryKey::new(RegistryKind::Consul, name)
    }

    #[test]
    fn error_keeps_services_and_answer_replaces_them() {
        let cache = Cache::new();
        let sink = cache.attach(&key("a"));
        sink.update(Update::Snapshot(vec![svc("web.dc1.consul", &["10.0.0.1", "10.0.0.2"])]));
        let rev = cache.view().revision;
        sink.error(&RegistryError::Unreachable { registry: "a".into(), reason: "refused".into() });
        let view = cache.view();
        assert_eq!(view.revision, rev, "an error must not change content");
        assert_eq!(view.services["web.dc1.consul"].service.endpoints.len(), 2);
        let (_, status) = &cache.statuses()[0];
        assert!(!status.healthy);
        assert_eq!(status.consecutive_failures, 1);

        // An authoritative empty answer does empty the service.
        sink.update(Update::Upsert(svc("web.dc1.consul", &[])));
        assert!(cache.view().services["web.dc1.consul"].service.endpoints.is_empty());
    }

    #[test]
    fn equal_updates_do_not_bump_revision() {
        let cache = Cache::new();
        let sink = cache.attach(&key("a"));
        sink.update(Update::Upsert(svc("web.dc1.consul", &["10.0.0.1"])));
        let rev = cache.view().revision;
        sink.update(Update::Upsert(svc("web.dc1.consul", &["10.0.0.1"])));
        sink.update(Update::Snapshot(vec![svc("web.dc1.consul", &["10.0.0.1"])]));
        assert_eq!(cache.view().revision, rev);
    }

    #[test]
    fn restart_keeps_services_and_drops_stale_writer() {
        let cache = Cache::new();
        let old = cache.attach(&key("a"));
        old.update(Update::Snapshot(vec![svc("web.dc1.consul", &["10.0.0.1"])]));
        let new = cache.attach(&key("a"));
        // No flap: the services are still there before the new watcher speaks.
        assert_eq!(cache.view().services.len(), 1);
        old.update(Update::Remove("web.dc1.consul".into()));
        assert_eq!(cache.view().services.len(), 1, "stale generation must be ignored");
        new.update(Update::Snapshot(vec![]));
        assert!(cache.view().services.is_empty());
    }

    #[test]
    fn take_changes_carries_the_changed_hosts_and_the_oldest_change() {
        let cache = Cache::new();
        let sink = cache.attach(&key("a"));
        assert_eq!(cache.take_changes().changed_at, None);
        let before = Instant::now();
        sink.update(Update::Upsert(svc("web.dc1.consul", &["10.0.0.1"])));
        let _ = cache.view(); // does not take it
        let after_first = Instant::now();
        sink.update(Update::Upsert(svc("web.dc1.consul", &["10.0.0.2"])));
        sink.update(Update::Upsert(svc("api.dc1.consul", &["10.0.0.3"])));
        let changes = cache.take_changes();
        let taken = changes.changed_at.expect("a change is pending");
        assert!(taken >= before && taken <= after_first, "the oldest change's time");
        let hosts: Vec<&str> = changes.hosts.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(hosts, ["api.dc1.consul", "web.dc1.consul"]);
        let web = changes.hosts[1].1.winner.as_ref().expect("web is there");
        assert_eq!(web.service.endpoints[0].address, "10.0.0.2");
        let again = cache.take_changes();
        assert_eq!((again.changed_at, again.hosts.len()), (None, 0), "taken once");
        // A status-only call is not a change; a snapshot marks only what differs.
        sink.healthy();
        assert!(cache.take_changes().hosts.is_empty());
        sink.update(Update::Snapshot(vec![svc("web.dc1.consul", &["10.0.0.2"])]));
        let gone = cache.take_changes();
        assert_eq!(gone.hosts.len(), 1);
        assert_eq!(gone.hosts[0], ("api.dc1.consul".to_string(), HostState::default()));
        // Removing a registry marks its hosts.
        cache.remove(&key("a"));
        assert_eq!(cache.take_changes().hosts.len(), 1);
    }

    #[test]
    fn reports_endpoint_and_scrubs_credentials() {
        let cache = Cache::new();
        let k = key("a");
        let mut spec = RegistrySpec::new(RegistryKind::Consul, "a", "consul.local", 8500);
        spec.auth.insert("consulToken".into(), Secret::new("tok-123"));
        spec.auth.insert("nacosUsername".into(), Secret::new("echoed"));
        cache.describe(&k, &spec);
        let sink = cache.attach(&k);
        sink.error(&RegistryError::Unreachable { registry: "a".into(), reason: "echoed tok-123 back".into() });
        let (report, _) = cache.registry(&k).unwrap();
        assert_eq!(report.endpoint, "consul.local:8500");
        assert_eq!(report.status.last_error.as_deref(), Some("a: unreachable: echoed <redacted> back"));
        let labels = RegistryErrorLabels { name: "a".into(), r#type: "consul", kind: "unreachable" };
        assert_eq!(cache.metrics().errors.get_or_create(&labels).get(), 1);
    }

    #[test]
    fn repairs_are_zero_from_the_first_snapshot_and_counted_by_kind() {
        let cache = Cache::new();
        let sink = cache.attach(&key("a"));
        let missed = RepairLabels::new(&key("a"), RepairKind::MissedChange);
        let reset = RepairLabels::new(&key("a"), RepairKind::IndexReset);
        assert!(cache.metrics().drift_corrected.get(&missed).is_none());
        sink.update(Update::Snapshot(vec![]));
        for kind in RepairKind::ALL {
            let labels = RepairLabels::new(&key("a"), kind);
            assert_eq!(cache.metrics().drift_corrected.get(&labels).map(|c| c.get()), Some(0), "{kind} present at 0");
        }
        sink.repaired(RepairKind::MissedChange, &["web.dc1.consul".to_string(), "api.dc1.consul".to_string()]);
        sink.repaired(RepairKind::IndexReset, &["web.dc1.consul".to_string()]);
        assert_eq!(cache.metrics().drift_corrected.get(&missed).map(|c| c.get()), Some(2));
        assert_eq!(cache.metrics().drift_corrected.get(&reset).map(|c| c.get()), Some(1));
        let (report, _) = cache.registry(&key("a")).unwrap();
        let last = report.status.last_repair.expect("the last repair is kept");
        assert_eq!((last.kind, last.count, last.services), (RepairKind::IndexReset, 1, vec!["web.dc1.consul".into()]));
        assert_eq!(report.status.repairs.get("missed_change"), Some(&2));
        cache.remove(&key("a"));
        assert!(cache.metrics().drift_corrected.get(&missed).is_none(), "forgotten with the registry");
        assert!(cache.metrics().drift_corrected.get(&reset).is_none());
    }

    #[test]
    fn counts_events_and_forgets_series_on_removal() {
        let cache = Cache::new();
        let sink = cache.attach(&key("a"));
        sink.update(Update::Snapshot(vec![svc("web.dc1.consul", &["10.0.0.1", "10.0.0.2"])]));
        sink.update(Update::Upsert(svc("web.dc1.consul", &["10.0.0.1", "10.0.0.2"])));
        sink.synced(Duration::from_millis(5));
        sink.error(&RegistryError::Unreachable { registry: "a".into(), reason: "refused".into() });
        let labels = RegistryLabels::from(&key("a"));
        assert_eq!(cache.metrics().events.get_or_create(&labels).get(), 2);
        let reports = cache.registries();
        assert_eq!((reports[0].services, reports[0].endpoints), (1, 2));
        cache.remove(&key("a"));
        assert!(cache.metrics().events.get(&labels).is_none());
        assert!(cache.metrics().sync_duration.get(&labels).is_none());
        let unreachable = RegistryErrorLabels { name: "a".into(), r#type: "consul", kind: "unreachable" };
        assert!(cache.metrics().errors.get(&unreachable).is_none());
    }

    #[test]
    fn a_host_of_several_registries_carries_every_registrys_service() {
        let cache = Cache::new();
        cache.attach(&key("a")).update(Update::Upsert(svc("x.static", &["10.0.0.1"])));
        cache.attach(&key("b")).update(Update::Upsert(svc("x.static", &["10.0.0.2"])));
        let view = cache.view();
        assert_eq!(view.services["x.static"].registry, key("a"));
        let also = &view.also["x.static"];
        assert_eq!(also.len(), 1);
        assert_eq!((&also[0].registry, also[0].service.endpoints[0].address.as_str()), (&key("b"), "10.0.0.2"));
        let changes = cache.take_changes();
        let (_, state) = changes.hosts.iter().find(|(h, _)| h == "x.static").unwrap();
        assert_eq!(state.also.len(), 1);
        let reports = cache.registries();
        assert_eq!(reports.iter().map(|r| r.shared_services).collect::<Vec<_>>(), [1, 1]);
        assert!(reports.iter().all(|r| r.conflicts.is_empty()), "they agree");
        // b now says the port speaks gRPC: both reports name it.
        let mut grpc = svc("x.static", &["10.0.0.2"]);
        grpc.ports[0].protocol = Protocol::Grpc;
        cache.attach(&key("b")).update(Update::Upsert(grpc));
        cache.take_changes();
        let reports = cache.registries();
        for r in &reports {
            assert_eq!(
                r.conflicts,
                ["host x.static: registries consul/a and consul/b disagree on the protocol of port 80 (HTTP vs GRPC)"]
            );
        }
        cache.remove(&key("a"));
        let view = cache.view();
        assert_eq!(view.services["x.static"].registry, key("b"));
        assert!(view.also.is_empty());
        cache.take_changes();
        assert_eq!(cache.registries()[0].shared_services, 0);
    }
}
