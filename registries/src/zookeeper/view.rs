//! What the watcher sent to its sink, per ZooKeeper service and host (a
//! digest, not the services: see [`Sent`]), and how a read or a gathered
//! full sync becomes updates: only what differs is sent, a service that
//! cannot be read keeps what was sent of it, and one read again after
//! failing is counted as an unreadable repair when it differs.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::{debug, info, warn};

use super::failing::Failing;
use super::read::Read;
use super::stats::ZookeeperStats;
use super::tree::{self, Naming, Sent, SentHosts, ServiceKey, Tree};
use crate::model::Service;
use crate::repair::RepairKind;
use crate::select::Selection;
use crate::watcher::{RegistryError, Sink, Update};

/// What was sent to the sink, per ZooKeeper service and host.
pub(super) struct View {
    /// Which services are read and served.
    pub(super) selection: Selection,
    pub(super) sink: Arc<dyn Sink>,
    pub(super) naming: Naming,
    pub(super) stats: Arc<ZookeeperStats>,
    /// A digest, last port and TLS per host sent, not the services: the
    /// cache holds those (see [`Sent`]).
    pub(super) sent: BTreeMap<ServiceKey, Kept>,
    /// Malformed nodes already warned about (a resync keeps only those
    /// still there), so a bad node warns once, not every resync.
    pub(super) malformed_seen: HashSet<String>,
    /// Services that cannot be read, and when to try them again.
    pub(super) failing: Failing,
}

/// What is kept of one ZooKeeper service once sent.
pub(super) struct Kept {
    pub(super) hosts: SentHosts,
    /// See `Read::Present::version`.
    pub(super) version: Option<i64>,
}

/// A full sync being gathered, one service at a time.
#[derive(Default)]
pub(super) struct Sync {
    pub(super) sent: BTreeMap<ServiceKey, Kept>,
    /// The rendered services, per ZooKeeper service: a service read again
    /// during the sync (a watch event named it) replaces its earlier read.
    pub(super) all: BTreeMap<ServiceKey, Vec<Service>>,
    pub(super) seen: HashSet<String>,
    /// Services that could not be read.
    pub(super) failed: Vec<(ServiceKey, RegistryError)>,
    /// Some of `failed` had been sent: they are in `sent` as they were,
    /// but not in `all`.
    pub(super) kept_failing: bool,
    /// Services that were failing and have been read.
    pub(super) recovered: Vec<ServiceKey>,
}

impl View {
    /// Render one service read by a full sync into `sync`.
    pub(super) fn add(&self, sync: &mut Sync, tree: &Tree, key: ServiceKey, read: Read) {
        // Listed, then deleted before its read: not there.
        let Read::Present { members, malformed, dropped_labels, version } = read else { return };
        if self.failing.contains(&key) {
            sync.recovered.push(key.clone());
        }
        self.count(malformed, dropped_labels, &mut sync.seen);
        let hosts = self.render(tree, &key, members, self.sent.get(&key).map(|k| &k.hosts));
        let kept = hosts.iter().map(|(host, service)| (host.clone(), Sent::of(service))).collect();
        sync.all.insert(key.clone(), hosts.into_values().collect());
        sync.sent.insert(key, Kept { hosts: kept, version });
    }

    /// A service gone during a full sync, after the sync had read it.
    pub(super) fn drop_read(sync: &mut Sync, key: &ServiceKey) {
        sync.all.remove(key);
        sync.sent.remove(key);
    }

    /// One service a full sync could not read keeps what was sent of it,
    /// if anything (read again in full: no version).
    pub(super) fn keep(&self, sync: &mut Sync, key: ServiceKey, e: RegistryError) {
        if let Some(kept) = self.sent.get(&key) {
            sync.kept_failing |= kept.hosts.hosts().next().is_some();
            sync.sent.insert(key.clone(), Kept { hosts: kept.hosts.clone(), version: None });
        }
        sync.failed.push((key, e));
    }

    /// Whether `read` would change what was sent for `key`.
    pub(super) fn differs(&self, tree: &Tree, key: &ServiceKey, read: &Read) -> bool {
        match read {
            Read::Gone => self.sent.contains_key(key),
            Read::Present { members, .. } => {
                let old = self.sent.get(key).map(|k| &k.hosts);
                let new = self.render(tree, key, members.clone(), old);
                new.iter().any(|(host, service)| old.and_then(|o| o.get(host)) != Some(&Sent::of(service)))
            }
        }
    }

    /// The services a gathered full sync renders differently from what was
    /// sent, or no longer has.
    pub(super) fn differing(&self, sync: &Sync) -> Vec<ServiceKey> {
        let changed = sync.sent.iter().filter(|(key, kept)| self.sent.get(*key).map(|k| &k.hosts) != Some(&kept.hosts));
        let gone = self.sent.keys().filter(|key| !sync.sent.contains_key(*key));
        changed.map(|(key, _)| key.clone()).chain(gone.cloned()).collect()
    }

    /// Every host of `keys`, as sent and as `done` has them.
    pub(super) fn hosts_of(&self, keys: &[ServiceKey], done: &Result<Sync, Vec<(ServiceKey, Read)>>) -> Vec<String> {
        let mut hosts = BTreeSet::new();
        for key in keys {
            hosts.extend(self.sent.get(key).into_iter().flat_map(|k| k.hosts.hosts().cloned()));
            match done {
                Ok(sync) => hosts.extend(sync.sent.get(key).into_iter().flat_map(|k| k.hosts.hosts().cloned())),
                Err(deferred) => {
                    for (_, read) in deferred.iter().filter(|(k, _)| k == key) {
                        if let Read::Present { members, .. } = read {
                            hosts.extend(members.iter().map(|m| m.host.clone()));
                        }
                    }
                }
            }
        }
        hosts.into_iter().collect()
    }

    /// Send a gathered full sync (its failures already taken into
    /// `failing`): the services read again after failing that differ from
    /// what was sent are counted as unreadable repairs first. As one
    /// snapshot, unless a service that had been sent cannot be read now
    /// (see [`View::resend`]).
    pub(super) fn finish(&mut self, mut sync: Sync) {
        let recovered = std::mem::take(&mut sync.recovered);
        if !recovered.is_empty() {
            let changed: HashSet<ServiceKey> = self.differing(&sync).into_iter().collect();
            let mut hosts = BTreeSet::new();
            for key in recovered.iter().filter(|key| changed.contains(*key)) {
                hosts.extend(self.sent.get(key).into_iter().flat_map(|k| k.hosts.hosts().cloned()));
                hosts.extend(sync.sent.get(key).into_iter().flat_map(|k| k.hosts.hosts().cloned()));
            }
            if !hosts.is_empty() {
                self.sink.repaired(RepairKind::Unreadable, &hosts.into_iter().collect::<Vec<_>>());
            }
        }
        if sync.kept_failing { self.resend(sync) } else { self.snapshot(sync) }
    }

    /// Send a gathered full sync while a service that was sent cannot be
    /// read: a snapshot would drop it, and the watcher keeps no copy of it
    /// (only a digest), so every service read is sent alone instead (the
    /// cache skips the unchanged ones, as it does in a snapshot), and only
    /// the hosts that went are removed. The registry's own flags a snapshot
    /// sets (ready, no longer stale or `--max-stale` withdrawn) wait for the
    /// next one, once every service reads.
    fn resend(&mut self, sync: Sync) {
        let Sync { sent, all, seen, .. } = sync;
        self.malformed_seen = seen;
        for (key, kept) in &self.sent {
            for host in kept.hosts.hosts() {
                if sent.get(key).is_none_or(|k| k.hosts.get(host).is_none()) {
                    self.sink.update(Update::Remove(host.clone()));
                }
            }
        }
        self.sent = sent;
        let all: Vec<Service> = all.into_values().flatten().collect();
        info!(services = all.len(), "full sync, sent service by service: a service sent before cannot be read");
        for service in all {
            self.sink.update(Update::Upsert(service));
        }
    }

    /// Send a gathered full sync as one snapshot.
    fn snapshot(&mut self, sync: Sync) {
        let Sync { sent, all, seen, .. } = sync;
        self.malformed_seen = seen;
        self.sent = sent;
        let mut all: Vec<Service> = all.into_values().flatten().collect();
        all.sort();
        info!(services = all.len(), "full sync");
        self.sink.update(Update::Snapshot(all));
    }

    /// Send what `read` changes of `key`; says whether it sent anything.
    /// A service that was failing and now reads differently from what was
    /// sent is counted as an unreadable repair first.
    pub(super) fn apply(&mut self, tree: &Tree, key: ServiceKey, read: Read) -> bool {
        let was_failing = self.failing.read(&key);
        match read {
            Read::Gone => {
                let mut sent = false;
                for host in self.sent.remove(&key).into_iter().flat_map(|kept| kept.hosts.into_hosts()) {
                    info!(service = %key.name, %host, "service node gone");
                    self.sink.update(Update::Remove(host));
                    sent = true;
                }
                sent
            }
            Read::Present { members, malformed, dropped_labels, version } => {
                let mut seen = std::mem::take(&mut self.malformed_seen);
                self.count(malformed, dropped_labels, &mut seen);
                self.malformed_seen = seen;
                let old = self.sent.get(&key).map(|k| &k.hosts);
                let new = self.render(tree, &key, members, old);
                let mut kept = Vec::with_capacity(new.len());
                let mut changed = Vec::new();
                for (host, service) in new {
                    let sent = Sent::of(&service);
                    if old.and_then(|o| o.get(&host)) != Some(&sent) {
                        changed.push(service);
                    }
                    kept.push((host, sent));
                }
                if was_failing && !changed.is_empty() {
                    let hosts: Vec<String> = changed.iter().map(|s| s.host.clone()).collect();
                    self.sink.repaired(RepairKind::Unreadable, &hosts);
                }
                self.sent.insert(key, Kept { hosts: kept.into_iter().collect(), version });
                let sent = !changed.is_empty();
                for service in changed {
                    debug!(host = %service.host, endpoints = service.endpoints.len(), "service changed");
                    self.sink.update(Update::Upsert(service));
                }
                sent
            }
        }
    }

    /// The selected hosts of one service.
    fn render(
        &self,
        tree: &Tree,
        key: &ServiceKey,
        members: Vec<tree::Member>,
        last: Option<&SentHosts>,
    ) -> BTreeMap<String, Service> {
        let mut hosts = self.naming.render(tree, key, members, last);
        if !self.selection.is_all() {
            hosts.retain(|host, _| self.selection.wants(host));
        }
        hosts
    }

    fn count(&self, malformed: Vec<(String, String)>, dropped_labels: usize, seen: &mut HashSet<String>) {
        self.stats.malformed.fetch_add(malformed.len() as u64, Ordering::Relaxed);
        self.stats.dropped_labels.fetch_add(dropped_labels as u64, Ordering::Relaxed);
        for (path, reason) in malformed {
            if self.malformed_seen.contains(&path) || seen.contains(&path) {
                debug!(%path, %reason, "malformed node skipped");
            } else {
                warn!(%path, %reason, "malformed node skipped");
            }
            seen.insert(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::Selector;
    use crate::spec::{RegistryKind, RegistrySpec};

    /// The sink calls a [`View`] makes, in order.
    #[derive(Default)]
    struct Calls(std::sync::Mutex<Vec<String>>);

    impl Sink for Calls {
        fn update(&self, update: Update) {
            let line = match update {
                Update::Snapshot(all) => {
                    format!("snapshot {:?}", all.iter().map(|s| s.endpoints.len()).collect::<Vec<_>>())
                }
                Update::Upsert(s) => format!("upsert {} {}", s.host, s.endpoints.len()),
                Update::Remove(host) => format!("remove {host}"),
            };
            self.0.lock().unwrap().push(line);
        }
        fn healthy(&self) {}
        fn error(&self, _: &RegistryError) {}
        fn repaired(&self, kind: RepairKind, hosts: &[String]) {
            self.0.lock().unwrap().push(format!("repaired {kind} {}", hosts.join(",")));
        }
    }

    impl Calls {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    fn providers(interface: &str, ips: &[&str]) -> Read {
        let host = format!("providers:{interface}:0.0.0:.zookeeper");
        let members = ips
            .iter()
            .map(|ip| tree::Member {
                host: host.clone(),
                endpoint: crate::model::Endpoint {
                    address: ip.to_string(),
                    port: 20880,
                    weight: 1,
                    labels: Default::default(),
                },
                protocol: None,
                tls: false,
            })
            .collect();
        Read::Present { members, malformed: Vec::new(), dropped_labels: 0, version: Some(1) }
    }

    fn no_auth(interface: &str) -> RegistryError {
        let what = format!("list /dubbo/{interface}/providers");
        RegistryError::BadResponse { registry: "zk".into(), what, reason: "NoAuth".into() }
    }

    /// Issue 33: a service that cannot be read is left as it was (absent,
    /// or as sent), the others are sent, and once it reads what it holds
    /// is counted as an unreadable repair before it is sent.
    #[test]
    fn an_unreadable_service_keeps_its_state_and_is_repaired_once_read() {
        let calls = Arc::new(Calls::default());
        let spec = RegistrySpec::new(RegistryKind::Zookeeper, "zk", "127.0.0.1", 2181);
        let tree = Tree::new("zk", &[]).unwrap();
        let mut view = View {
            selection: Selector::all().current(),
            sink: calls.clone(),
            naming: Naming::new(&spec),
            stats: Arc::default(),
            sent: BTreeMap::new(),
            malformed_seen: HashSet::new(),
            failing: Failing::default(),
        };
        let (open, secure) =
            (ServiceKey { root: 0, name: "a.Open".into() }, ServiceKey { root: 0, name: "a.Secure".into() });
        let secure_host = "providers:a.Secure:0.0.0:.zookeeper";

        // At start: a snapshot of the rest; the failing one is absent.
        let mut sync = Sync::default();
        view.add(&mut sync, &tree, open.clone(), providers("a.Open", &["10.0.0.1"]));
        view.keep(&mut sync, secure.clone(), no_auth("a.Secure"));
        view.failing.replace(std::mem::take(&mut sync.failed));
        view.finish(sync);
        assert_eq!(calls.take(), ["snapshot [1]"]);
        assert!(view.failing.contains(&secure));

        // Read at last: counted, then sent.
        assert!(view.apply(&tree, secure.clone(), providers("a.Secure", &["10.0.0.9"])));
        assert_eq!(calls.take(), [format!("repaired unreadable {secure_host}"), format!("upsert {secure_host} 1")]);
        assert!(view.failing.is_empty());

        // Unreadable again at a full sync: what was sent of it stays (no
        // snapshot, which would drop it), the rest is sent service by service.
        let mut sync = Sync::default();
        view.add(&mut sync, &tree, open.clone(), providers("a.Open", &["10.0.0.1", "10.0.0.2"]));
        view.keep(&mut sync, secure.clone(), no_auth("a.Secure"));
        assert_eq!(view.differing(&sync), std::slice::from_ref(&open), "what is kept of it does not differ");
        view.failing.replace(std::mem::take(&mut sync.failed));
        view.finish(sync);
        assert_eq!(calls.take(), ["upsert providers:a.Open:0.0.0:.zookeeper 2"]);
        assert!(view.sent.contains_key(&secure), "its digest is kept");

        // Readable and unchanged: nothing to repair; changed: repaired.
        let mut sync = Sync::default();
        view.add(&mut sync, &tree, open.clone(), providers("a.Open", &["10.0.0.1", "10.0.0.2"]));
        view.add(&mut sync, &tree, secure.clone(), providers("a.Secure", &["10.0.0.9"]));
        view.failing.replace(std::mem::take(&mut sync.failed));
        view.finish(sync);
        assert_eq!(calls.take(), ["snapshot [2, 1]"]);
        view.failing.fail(secure.clone(), no_auth("a.Secure"));
        let mut sync = Sync::default();
        view.add(&mut sync, &tree, secure.clone(), providers("a.Secure", &["10.0.0.8"]));
        view.add(&mut sync, &tree, open.clone(), providers("a.Open", &["10.0.0.1", "10.0.0.2"]));
        view.failing.replace(std::mem::take(&mut sync.failed));
        view.finish(sync);
        assert_eq!(calls.take(), [format!("repaired unreadable {secure_host}"), "snapshot [2, 1]".to_string()]);
        assert!(view.failing.is_empty());
    }
}
