//! Eureka registry watcher.
//!
//! Polls the way Eureka's own `DiscoveryClient` does: a full
//! `GET /eureka/apps` first, then every interval `GET /eureka/apps/delta`,
//! applied to our copy of the registry (every status kept). After applying a
//! delta the copy's reconcile hashcode (`DOWN_1_UP_3_`: instance counts per
//! status) must equal the delta's `apps__hashcode`, the server's hashcode of
//! its whole registry; if not, deltas were missed and a full fetch
//! reconciles. Changed apps then go out as [`Update::Upsert`], vanished apps
//! as [`Update::Remove`], and every full fetch as [`Update::Snapshot`] (the
//! first one marks the registry ready).
//!
//! Anti-entropy: every `--anti-entropy-interval` (default 5 min) a round
//! starts with a full `GET /eureka/apps` (one request, read under the same
//! body cap) before its delta. The delta, fetched after it, carries every
//! change of the server's last three minutes, so the full read with that
//! delta applied is the server's registry as of the delta, exactly what the
//! copy with the delta applied must be. Where the two differ (and the
//! hashcode agrees with both), the copy missed a change no delta will
//! deliver again: the full read's version is served and counted as
//! [`RepairKind::MissedChange`]. The hashcode counts statuses only, so this
//! is what catches a missed change of port, address or metadata.
//!
//! The interval is 10 s, so registry health and instance status (a DOWN or
//! OUT_OF_SERVICE instance leaving the endpoints) are at most 10 s old, as
//! the README promises for every registry. Eureka clients'
//! `registryFetchIntervalSeconds` and Higress's full refresh are 30 s; a
//! delta is small (the server's recent changes), so polling it three times
//! as often costs little. McpBridge has no field for it.
//!
//! Failure handling:
//! - `domain` may list several servers; a failed call fails over to the next
//!   (see `client.rs`). The sink hears errors only when every server failed
//!   in that round, one error per server, so a working failover never marks
//!   the registry unhealthy.
//! - A failed delta (including a 403, which is how a server says deltas are
//!   disabled or it is still warming up) falls back to a full fetch.
//! - After any failed round, or when the answering server changed, the next
//!   round is a full fetch: deltas are a server's recent-change queue, held
//!   only three minutes and not shared between servers.
//! - Errors never change what was sent, so the cache keeps the last
//!   endpoints while Eureka is down.

mod client;
pub(crate) mod decode;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use self::client::{APPS, Client, Delta};
use self::decode::{Naming, Registry};
use crate::model::Service;
use crate::repair::RepairKind;
use crate::retry;
use crate::select::{Selection, Selector};
use crate::spec::RegistrySpec;
use crate::watcher::{RegistryError, Sink, Update, Watcher};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const BACKOFF_START: Duration = Duration::from_secs(1);

/// Watches one Eureka cluster. Built by [`crate::watcher_for`].
pub struct EurekaWatcher {
    spec: RegistrySpec,
    client: Client,
    naming: Naming,
    interval: Duration,
    /// How often a round reads everything first (see the module doc).
    anti_entropy: Duration,
    selector: Selector,
    selection: Selection,
}

impl EurekaWatcher {
    pub fn new(spec: RegistrySpec) -> Result<EurekaWatcher, RegistryError> {
        let client = Client::new(&spec)?;
        let naming = Naming::new(&spec);
        let anti_entropy = spec.anti_entropy();
        Ok(EurekaWatcher {
            spec,
            client,
            naming,
            interval: DEFAULT_INTERVAL,
            anti_entropy,
            selector: Selector::all(),
            selection: Selection::all(),
        })
    }

    /// Serve only the apps `selector` selects. Eureka answers with every
    /// app in one body, so all are still fetched and kept (the delta's
    /// hashcode covers the whole registry); only selected apps become
    /// records. A new selection is applied from the copy at once.
    pub fn with_selector(mut self, selector: Selector) -> EurekaWatcher {
        self.selector = selector;
        self
    }

    /// Poll every `interval` (at least 100 ms) instead of 10 s; tests use a
    /// short one. Retries after a failure never wait longer than this.
    pub fn with_interval(mut self, interval: Duration) -> EurekaWatcher {
        self.interval = interval.max(MIN_INTERVAL);
        self
    }
}

impl Watcher for EurekaWatcher {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let span = info_span!("eureka", registry = %self.spec.name);
        Box::pin(self.run_inner(sink).instrument(span))
    }
}

/// What we hold between rounds.
struct State {
    registry: Registry,
    /// Host -> the service last sent.
    sent: BTreeMap<String, Service>,
    /// The server our registry copy came from; `None` forces a full fetch.
    server: Option<usize>,
    /// When the last full read was made.
    last_full: Instant,
    /// The digest of the last delta applied since that read: the server
    /// answers the same delta again until its response cache refreshes
    /// (30 s by default), and the same delta again changes nothing.
    last_delta: Option<u64>,
}

impl EurekaWatcher {
    async fn run_inner(mut self, sink: Arc<dyn Sink>) {
        info!(
            servers = ?self.client.servers(),
            interval = ?self.interval,
            anti_entropy = ?self.anti_entropy,
            selective = !self.selector.is_all(),
            "starting"
        );
        self.selection = self.selector.current();
        let mut st = State {
            registry: Registry::default(),
            sent: BTreeMap::new(),
            server: None,
            last_full: Instant::now(),
            last_delta: None,
        };
        let mut failures: u32 = 0;
        loop {
            let round = match st.server {
                None => self.full(&mut st, &*sink).await,
                Some(server) if st.last_full.elapsed() >= self.anti_entropy => {
                    self.anti_entropy(&mut st, server, &*sink).await
                }
                Some(server) => self.delta(&mut st, server, &*sink, None).await,
            };
            let wait = match round {
                Ok(()) => {
                    failures = 0;
                    sink.healthy();
                    self.interval
                }
                Err(errors) => {
                    for e in &errors {
                        sink.error(e);
                    }
                    st.server = None;
                    failures += 1;
                    retry_wait(self.interval, failures)
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.selector.changed() => {
                    self.selection = self.selector.current();
                    info!("selection changed");
                    if st.server.is_some() {
                        self.publish(&mut st, &*sink);
                    }
                }
            }
        }
    }

    /// A full fetch: the registry copy is replaced and sent as a snapshot.
    async fn full(&mut self, st: &mut State, sink: &dyn Sink) -> Result<(), Vec<RegistryError>> {
        self.full_checked(st, sink, None).await
    }

    /// A full fetch; with `expected` (a delta's hashcode disagreed), the
    /// services that differ from it are reported as drift first.
    async fn full_checked(
        &mut self,
        st: &mut State,
        sink: &dyn Sink,
        expected: Option<BTreeMap<String, Service>>,
    ) -> Result<(), Vec<RegistryError>> {
        let started = Instant::now();
        let (server, apps) = self.client.fetch(APPS).await?;
        self.replace(st, server, Registry::from_full(apps.groups), sink, expected, started);
        Ok(())
    }

    /// The anti-entropy round: a full read, then the delta, which judges
    /// it (see the module doc). A full read from another server than the
    /// copy's, or one whose delta fails, replaces the copy as any full
    /// fetch does.
    async fn anti_entropy(&mut self, st: &mut State, server: usize, sink: &dyn Sink) -> Result<(), Vec<RegistryError>> {
        let started = Instant::now();
        let (answered_by, apps) = self.client.fetch(APPS).await?;
        let read = Registry::from_full(apps.groups);
        if answered_by != server {
            info!(server = %self.client.servers()[answered_by], "another server answered; its registry replaces the copy");
            self.replace(st, answered_by, read, sink, None, started);
            return Ok(());
        }
        st.last_full = Instant::now();
        self.delta(st, server, sink, Some(read)).await
    }

    /// A full read from `server` replaces the copy, sent as a snapshot;
    /// with `expected` (a delta's hashcode disagreed), the services that
    /// differ from it are reported as drift first.
    fn replace(
        &mut self,
        st: &mut State,
        server: usize,
        registry: Registry,
        sink: &dyn Sink,
        expected: Option<BTreeMap<String, Service>>,
        started: Instant,
    ) {
        st.registry = registry;
        st.last_full = Instant::now();
        st.last_delta = None;
        let services = self.naming.services(&st.registry, &st.sent, &self.selection);
        if let Some(expected) = expected {
            let missed = differing_hosts(&expected, &services);
            if !missed.is_empty() {
                sink.repaired(RepairKind::MissedChange, &missed);
            }
        }
        st.sent = services;
        st.server = Some(server);
        let all: Vec<Service> = st.sent.values().cloned().collect();
        info!(
            services = all.len(),
            hashcode = %st.registry.reconcile_hash_code(),
            server = %self.client.servers()[server],
            "full fetch"
        );
        sink.update(Update::Snapshot(all));
        sink.synced(started.elapsed());
    }

    /// A delta round. With `read` (the anti-entropy round's full read,
    /// made just before), the copy is compared with it once the delta
    /// agrees.
    async fn delta(
        &mut self,
        st: &mut State,
        server: usize,
        sink: &dyn Sink,
        read: Option<Registry>,
    ) -> Result<(), Vec<RegistryError>> {
        let started = Instant::now();
        // The anti-entropy round judges its read by the delta: decode it
        // whatever it is. Otherwise a delta byte for byte the last one
        // applied changes nothing, and is not decoded at all.
        let last = if read.is_none() { st.last_delta } else { None };
        let (answered_by, delta) = match self.client.fetch_delta(last).await {
            Ok(answer) => answer,
            Err(errors) => {
                debug!(errors = errors.len(), "delta failed; trying a full fetch");
                if let Some(read) = read {
                    self.replace(st, server, read, sink, None, started);
                    return Ok(());
                }
                return self.full(st, sink).await;
            }
        };
        if answered_by != server {
            info!(server = %self.client.servers()[answered_by], "another server answered; full fetch");
            return self.full(st, sink).await;
        }
        let delta = match delta {
            Delta::Same => {
                debug!("the same delta as the last one applied");
                return Ok(());
            }
            Delta::New(delta) => delta,
        };
        // Applied in place: if the hashcode then disagrees, a full fetch
        // replaces the copy anyway.
        let changed = st.registry.apply_delta(delta.instances());
        let local = st.registry.reconcile_hash_code();
        let remote = delta.hashcode.clone().unwrap_or_default();
        if local != remote {
            let entries = delta.len();
            warn!(client = %local, server = %remote, entries, "reconcile hashcodes differ; full fetch");
            let listed: Vec<String> =
                delta.instances().map(|i| format!("{}/{} {} {:?}", i.app, i.id, i.status, i.action)).collect();
            debug!(entries = ?listed, "the delta that disagreed");
            // What the copy would have served with this delta applied: the
            // full fetch's differences from it are what the deltas missed.
            let expected = self.naming.services(&st.registry, &st.sent, &self.selection);
            return self.full_checked(st, sink, Some(expected)).await;
        }
        match read {
            Some(read) => {
                let held = std::mem::take(&mut st.registry);
                st.registry = self.judge(st, held, read, &delta, &remote, sink);
                self.publish(st, sink);
            }
            None => self.publish_apps(st, sink, &changed),
        }
        st.last_delta = Some(delta.digest);
        Ok(())
    }

    /// The anti-entropy comparison: `read` (a full read made before the
    /// delta) with `delta` applied against the copy `held` with it
    /// applied. Both then stand for the server's registry as of the delta:
    /// the delta holds every change of the last three minutes, in its
    /// newest state, including any made between the two requests. The
    /// hosts that still differ had a change the deltas never delivered and
    /// never will: the read's version is returned and they are counted.
    /// When the read with the delta disagrees with the delta's hashcode
    /// (it is not of the same moment: the server's response cache served
    /// the two from different refreshes), nothing is judged, and the next
    /// pass looks again.
    fn judge(
        &self,
        st: &State,
        held: Registry,
        mut read: Registry,
        delta: &decode::Applications,
        hashcode: &str,
        sink: &dyn Sink,
    ) -> Registry {
        read.apply_delta(delta.instances());
        if read.reconcile_hash_code() != hashcode {
            debug!(read = %read.reconcile_hash_code(), server = %hashcode, "the full read is of another moment than the delta; not judged");
            return held;
        }
        let expected = self.naming.services(&held, &st.sent, &self.selection);
        let truth = self.naming.services(&read, &st.sent, &self.selection);
        let missed = differing_hosts(&expected, &truth);
        if missed.is_empty() {
            debug!("anti-entropy: the copy matches the server");
            return held;
        }
        sink.repaired(RepairKind::MissedChange, &missed);
        read
    }

    /// Send what changed in `apps` (a delta's changed apps): the cost of
    /// those apps, whatever the catalog.
    fn publish_apps(&self, st: &mut State, sink: &dyn Sink, apps: &BTreeSet<String>) {
        for app in apps {
            let host = decode::host_name(app);
            if !self.selection.wants(&host) {
                continue;
            }
            match st.registry.apps.get(app) {
                Some(instances) => {
                    let last_port = st.sent.get(&host).and_then(|s| s.ports.first()).map(|p| p.number);
                    let service = self.naming.service(app, host.clone(), instances.values(), last_port);
                    if st.sent.get(&host) != Some(&service) {
                        debug!(%host, endpoints = service.endpoints.len(), "app changed");
                        sink.update(Update::Upsert(service.clone()));
                        st.sent.insert(host, service);
                    }
                }
                None => {
                    if st.sent.remove(&host).is_some() {
                        info!(%host, "app gone");
                        sink.update(Update::Remove(host));
                    }
                }
            }
        }
    }

    /// Send what changed between the services last sent and the copy's.
    fn publish(&self, st: &mut State, sink: &dyn Sink) {
        let services = self.naming.services(&st.registry, &st.sent, &self.selection);
        for (host, service) in &services {
            if st.sent.get(host) != Some(service) {
                debug!(%host, endpoints = service.endpoints.len(), "app changed");
                sink.update(Update::Upsert(service.clone()));
            }
        }
        for host in st.sent.keys().filter(|h| !services.contains_key(*h)) {
            info!(%host, "app gone");
            sink.update(Update::Remove(host.clone()));
        }
        st.sent = services;
    }
}

/// Hosts present in one of `a` and `b` only, or different in each.
///
/// Drift rule for Eureka (issue 24), outside the anti-entropy pass (see
/// `judge`): a full fetch follows a delta whose reconcile hashcode
/// disagreed with the copy the delta was applied to. The server computes a delta and its
/// hashcode together, so a disagreement proves a change the deltas did not
/// deliver (a missed round, a change older than the delta queue's
/// retention, a delta misapplied). What the full fetch then corrects,
/// compared with the copy *with* that delta applied, is counted. A change
/// made in the milliseconds between the delta and the full fetch is counted
/// too: it cannot be told apart, and it is only ever counted when the
/// hashcode already proved a miss.
fn differing_hosts(a: &BTreeMap<String, Service>, b: &BTreeMap<String, Service>) -> Vec<String> {
    let mut hosts: Vec<String> = a.iter().filter(|(h, s)| b.get(*h) != Some(*s)).map(|(h, _)| h.clone()).collect();
    hosts.extend(b.keys().filter(|h| !a.contains_key(*h)).cloned());
    hosts.sort();
    hosts
}

/// The wait after `failures` failed rounds: 1 s doubling, ±20% so that
/// watchers that lost their servers together do not come back together;
/// faster than the interval while we have nothing yet or just lost the
/// servers, never slower.
fn retry_wait(interval: Duration, failures: u32) -> Duration {
    retry::jittered(BACKOFF_START, interval, failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differing_hosts_names_changed_added_and_removed() {
        let svc = |host: &str, port: u16| {
            let ep = crate::model::Endpoint { address: "10.0.0.1".into(), port, weight: 1, labels: Default::default() };
            (host.to_string(), Service::new(host, vec![], vec![ep]))
        };
        let a: BTreeMap<String, Service> = [svc("same", 1), svc("moved", 1), svc("gone", 1)].into_iter().collect();
        let b: BTreeMap<String, Service> = [svc("same", 1), svc("moved", 2), svc("new", 1)].into_iter().collect();
        assert_eq!(differing_hosts(&a, &b), ["gone", "moved", "new"]);
        assert!(differing_hosts(&a, &a).is_empty());
    }

    #[test]
    fn retries_are_jittered_and_capped_by_the_interval() {
        let interval = Duration::from_secs(30);
        let (lo, hi, distinct) = retry::tests::spread(|| retry_wait(interval, 3));
        assert!(distinct > 20, "delays do not vary: {distinct} distinct in 200");
        assert!(lo >= Duration::from_millis(3200) && hi <= Duration::from_millis(4800), "{lo:?}..{hi:?}");
        let (_, hi, _) = retry::tests::spread(|| retry_wait(interval, 20));
        assert!(hi <= interval, "{hi:?} is slower than the interval");
    }
}
