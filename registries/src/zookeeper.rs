//! ZooKeeper registry watcher: Dubbo providers under `/dubbo` and Spring
//! Cloud Zookeeper (Curator) instances under `/services` and every
//! `zkServicesPath`, named as Higress names them (see [`tree`]).
//!
//! # Watches: one persistent recursive watch per root
//!
//! Each root gets one `addWatch(root, PERSISTENT_RECURSIVE)` (ZooKeeper 3.6+);
//! with a selective watch (`meshbridgeWatch`), a root gets a `PERSISTENT`
//! watch of its own children instead and each selected service a recursive
//! one (`watches.rs`).
//! The alternative, a oneshot child watch per root and per service re-armed
//! after every event (what Higress and Dubbo itself do), was rejected:
//! - it costs one watch per service and a task to re-arm each; ours costs one
//!   per root, whatever the size of the registry;
//! - a child watch misses data changes, and Curator changes an instance in
//!   place (`updateService`, e.g. Spring's `OUT_OF_SERVICE` status); a
//!   recursive watch reports `NodeDataChanged` with the instance's path;
//! - every event names the full path, so [`tree::Tree::classify`] maps it
//!   straight to the one service to re-read (or to nothing: consumers,
//!   routers and config nodes are filtered there, cheaply).
//!
//! The price: servers older than 3.6 answer `Unimplemented` (reported as a
//! config-like error on every retry; 3.5 is end-of-life), and events during a
//! reconnection can be lost (ZOOKEEPER-4698). That second one is covered the
//! same way the first start is: every (re)connection ends with a full re-list.
//!
//! # Flow
//!
//! One task. A session loop connects, adds the watches, and runs a full sync
//! (list every root, read every service) sent as an [`Update::Snapshot`].
//! Then events mark services dirty; each dirty service is re-read and sent as
//! an [`Update::Upsert`] if it changed, or [`Update::Remove`] for each of its
//! hosts if its node is gone. A provider or instance node gone just leaves
//! the service with fewer endpoints, down to an authoritative empty service
//! that keeps its last port. A full sync runs again after a reconnect, after
//! a session expiry (a new session), after any failure, and every
//! anti-entropy interval ([`crate::repair::interval`], 5 min by default),
//! where what differs from what was sent and no watch event named is
//! counted as a missed change ([`missed`]). The resync periods between
//! (30 s by default; Higress has none for ZooKeeper) only verify what was
//! sent: list again, check each Dubbo interface's `providers` node against
//! the `pzxid` it was read with, re-read the rest, and send only what
//! differs ([`verify`]).
//!
//! # Memory
//!
//! The watcher keeps no copy of what it sent: per host a digest, its last
//! port and TLS ([`tree::Sent`]); the cache holds the services. A full sync
//! renders each service as its read arrives (at most 8 reads in flight), so
//! its peak is the rendered snapshot, not every raw read besides it.
//!
//! # Outages
//!
//! Losing the session or the connection reaches [`Sink::error`]: nothing is
//! emitted, so the cache keeps the last known endpoints, and a full sync is
//! retried with backoff until ZooKeeper answers. A service ZooKeeper answers
//! for but that cannot be read (a `providers` node with a digest ACL and no
//! world READ answers `NoAuth`) fails alone (`failing.rs`): it keeps its
//! last state, or its absence, is reported as degraded
//! ([`Sink::degraded`]) and read again with backoff, while every other
//! service goes on updating and a full sync still succeeds. Once it reads,
//! what differs from what was sent is counted as an `unreadable` repair. A
//! malformed provider or instance node is skipped with a warning (once per
//! node) and counted in [`ZookeeperStats`]; the rest of its service is still
//! served.

pub(crate) mod dubbo;
mod failing;
mod read;
pub(crate) mod spring;
mod tree;
mod watches;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::net::Ipv6Addr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tracing::{Instrument, debug, info, info_span, warn};
use zookeeper_client as zk;

use self::failing::Failing;
use self::read::{Read, Reader, is_outage};
use self::tree::{Naming, Sent, SentHosts, ServiceKey, Touch, Tree};
use self::watches::Watches;
use crate::health::Health;
use crate::model::Service;
use crate::repair::RepairKind;
use crate::retry::{Backoff, wait_or_reopened};
use crate::select::{Selection, Selector};
use crate::spec::RegistrySpec;
use crate::watcher::{RegistryError, Sink, Update, Watcher};

/// How often what was sent is verified (see [`verify`]); a full sync runs
/// every anti-entropy interval instead.
const DEFAULT_RESYNC: Duration = Duration::from_secs(30);
const MIN_RESYNC: Duration = Duration::from_millis(100);
/// Higress's ZooKeeper timeout (`DEFAULT_REG_TIMEOUT`). The server may
/// negotiate it down (to at most 20 ticks).
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a periodic sync that found differences lets the watch
/// forwarders pass on events ZooKeeper had already delivered (see
/// [`missed`]).
const FORWARD_GRACE: Duration = Duration::from_millis(50);

/// Watches one ZooKeeper ensemble. Built by [`crate::watcher_for`].
pub struct ZookeeperWatcher {
    spec: RegistrySpec,
    tree: Tree,
    connect: String,
    resync: Duration,
    stats: Arc<ZookeeperStats>,
    selector: Selector,
}

/// Counters a running watcher keeps; get them with
/// [`ZookeeperWatcher::stats`] before running it.
#[derive(Debug, Default)]
pub struct ZookeeperStats {
    malformed: AtomicU64,
    dropped_labels: AtomicU64,
}

impl ZookeeperStats {
    /// Provider or instance nodes skipped because they could not be read,
    /// counted at every read (a node that stays bad counts again each time
    /// its service is read: full syncs, and verifies where it changed).
    pub fn malformed(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    /// Metadata entries (Dubbo URL parameters, Curator metadata) not kept as
    /// labels: not valid Kubernetes labels, or repeated. Counted per read.
    pub fn dropped_labels(&self) -> u64 {
        self.dropped_labels.load(Ordering::Relaxed)
    }
}

impl ZookeeperWatcher {
    pub fn new(spec: RegistrySpec) -> Result<ZookeeperWatcher, RegistryError> {
        let tree = Tree::new(&spec.name, &spec.zk_services_path)?;
        let connect = connect_string(&spec)?;
        Ok(ZookeeperWatcher {
            spec,
            tree,
            connect,
            resync: DEFAULT_RESYNC,
            stats: Arc::default(),
            selector: Selector::all(),
        })
    }

    /// Read and watch only the services `selector` selects: each root gets a
    /// watch of its own children, each selected service a recursive watch
    /// (see `watches.rs`). A Dubbo interface's hosts name its providers' versions and
    /// groups, so an interface is read when some referenced host is one of
    /// its (or an `include` pattern is set), and only selected hosts of it
    /// are served.
    pub fn with_selector(mut self, selector: Selector) -> ZookeeperWatcher {
        self.selector = selector;
        self
    }

    /// Verify what was sent this often (at least 100 ms); tests use a short
    /// one. The full sync's period is the spec's anti-entropy interval.
    pub fn with_resync(mut self, every: Duration) -> ZookeeperWatcher {
        self.resync = every.max(MIN_RESYNC);
        self
    }

    /// The counters this watcher will keep once running.
    pub fn stats(&self) -> Arc<ZookeeperStats> {
        self.stats.clone()
    }
}

/// `host:port` for each host in `domain` (comma-separated), IPv6 bracketed.
fn connect_string(spec: &RegistrySpec) -> Result<String, RegistryError> {
    let config = |reason: String| RegistryError::Config { registry: spec.name.clone(), field: "domain".into(), reason };
    let mut hosts = Vec::new();
    for host in spec.domain.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<Ipv6Addr>().is_ok() {
            hosts.push(format!("[{bare}]:{}", spec.port));
        } else if host.contains([':', '/', '[', ']']) || host.contains(char::is_whitespace) {
            return Err(config(format!("{host:?} is not a host name or IP (the port goes in `port`)")));
        } else {
            hosts.push(format!("{host}:{}", spec.port));
        }
    }
    if hosts.is_empty() {
        return Err(config("required".into()));
    }
    Ok(hosts.join(","))
}

impl Watcher for ZookeeperWatcher {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let span = info_span!("zookeeper", registry = %self.spec.name);
        Box::pin(self.run_inner(sink).instrument(span))
    }
}

/// What the session loop shares with its helpers.
struct Ctx {
    registry: String,
    tree: Tree,
    resync: Duration,
    /// How often a full sync reads everything ([`crate::repair::interval`]).
    anti_entropy: Duration,
    health: Health,
}

impl ZookeeperWatcher {
    async fn run_inner(mut self, sink: Arc<dyn Sink>) {
        let roots: Vec<&str> = self.tree.roots().iter().map(|r| r.path.as_str()).collect();
        let selective = !self.selector.is_all();
        let anti_entropy = crate::repair::interval(&self.spec);
        info!(endpoint = %self.connect, ?roots, resync = ?self.resync, ?anti_entropy, selective, "starting");
        let mut view = View {
            selection: self.selector.current(),
            sink: sink.clone(),
            naming: Naming::new(&self.spec),
            stats: self.stats,
            sent: BTreeMap::new(),
            malformed_seen: HashSet::new(),
            failing: Failing::default(),
        };
        let ctx = Ctx {
            registry: self.spec.name,
            tree: self.tree,
            resync: self.resync,
            anti_entropy,
            health: Health::new(sink, "zookeeper"),
        };
        let mut backoff = Backoff::default();
        // After a long outage the backoff is at its cap (10 s): a server that
        // comes back is retried as soon as its port accepts instead.
        let hosts: Vec<String> = self.connect.split(',').map(String::from).collect();
        loop {
            let client = match connect(&self.connect, &ctx.registry).await {
                Ok(client) => client,
                Err(e) => {
                    ctx.health.fail(&e);
                    wait_or_reopened(&mut backoff, &hosts).await;
                    continue;
                }
            };
            info!(session = %client.session_id(), timeout = ?client.session_timeout(), "session established");
            let (end, synced) = run_session(&ctx, &mut view, &client, &mut self.selector).await;
            let reason = format!("session ended ({end:?}), starting a new one");
            ctx.health.fail(&RegistryError::Unreachable { registry: ctx.registry.clone(), reason });
            if synced {
                backoff.reset();
            }
            wait_or_reopened(&mut backoff, &hosts).await;
        }
    }
}

async fn connect(addr: &str, registry: &str) -> Result<zk::Client, RegistryError> {
    // Fail fast when every host refuses: our own backoff does the retrying.
    let connector = zk::Client::connector().with_session_timeout(SESSION_TIMEOUT).with_fail_eagerly();
    let reason = match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(addr)).await {
        Ok(Ok(client)) => return Ok(client),
        Ok(Err(e)) => format!("connect {addr}: {e}"),
        Err(_) => format!("connect {addr}: no session after {CONNECT_TIMEOUT:?}"),
    };
    Err(RegistryError::Unreachable { registry: registry.to_string(), reason })
}

/// Serve one session until it ends (expired, closed, auth failed). Returns
/// the final state and whether any full sync succeeded.
async fn run_session(
    ctx: &Ctx,
    view: &mut View,
    client: &zk::Client,
    selector: &mut Selector,
) -> (zk::SessionState, bool) {
    let reader = Reader { client, tree: &ctx.tree, registry: &ctx.registry };
    let mut states = client.state_watcher();
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Dropped on return, which stops the forwarders.
    let mut watches = Watches::new(ctx.tree.roots().len(), !view.selection.is_all(), tx);
    let mut backoff = Backoff::default();
    let mut synced = false;
    let mut need_sync = true;
    // The next sync sends a snapshot; else it verifies what was sent.
    let mut full = true;
    // The pending sync is a periodic one (a tick's), whose differences from
    // what was sent are judged for drift; others follow a gap or a failure.
    let mut periodic = false;
    // When the next periodic full sync (the anti-entropy pass) is due.
    let mut full_at = tokio::time::Instant::now() + ctx.anti_entropy;
    let mut retry_at = tokio::time::Instant::now();
    let mut dirty = Dirty::default();
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + ctx.resync, ctx.resync);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if need_sync && tokio::time::Instant::now() >= retry_at {
            let started = Instant::now();
            let result = if full {
                full_sync(&reader, view, &mut watches).await.map(Ok)
            } else {
                verify(&reader, view, &mut watches).await.map(Err)
            };
            match result {
                Ok(mut done) => {
                    // Events from before the sync began are covered by it;
                    // later ones (still in `rx`) are not.
                    let mut noticed = std::mem::take(&mut dirty);
                    let mut suspects = match &done {
                        Ok(sync) if periodic => view.differing(sync),
                        Ok(_) => Vec::new(),
                        Err(deferred) => deferred.iter().map(|(key, _)| key.clone()).collect(),
                    };
                    // A service read again after failing was no missed
                    // change: it is counted as unreadable where it is sent.
                    suspects.retain(|key| !view.failing.contains(key));
                    if !suspects.is_empty() {
                        tokio::time::sleep(FORWARD_GRACE).await;
                        while let Ok((root, event)) = rx.try_recv() {
                            dirty.note(&ctx.tree, root, &event);
                        }
                        noticed.services.extend(dirty.services.iter().cloned());
                        noticed.roots.extend(dirty.roots.iter().copied());
                        let missed = missed(suspects, &noticed);
                        let hosts = view.hosts_of(&missed, &done);
                        if !hosts.is_empty() {
                            view.sink.repaired(RepairKind::MissedChange, &hosts);
                        }
                    }
                    if let Ok(sync) = &mut done {
                        view.failing.replace(std::mem::take(&mut sync.failed));
                    }
                    // Healthy before the updates, as a call that answered,
                    // unless a service fails.
                    view.failing.settle(&ctx.health);
                    ctx.health.ok();
                    match done {
                        Ok(sync) => {
                            view.finish(sync);
                            full_at = tokio::time::Instant::now() + ctx.anti_entropy;
                        }
                        Err(deferred) => {
                            for (key, read) in deferred {
                                if matches!(read, Read::Gone) {
                                    watches.forget(&key);
                                }
                                view.apply(&ctx.tree, key, read);
                            }
                        }
                    }
                    view.failing.report(&ctx.health, true);
                    view.sink.synced(started.elapsed());
                    (need_sync, full, synced, periodic) = (false, false, true, false);
                    backoff.reset();
                    ticker.reset();
                    if !dirty.is_empty() {
                        // Events drained while judging drift: read them
                        // now, not when the next event or tick wakes the
                        // loop (a burst during a periodic sync otherwise
                        // waited that long).
                        continue;
                    }
                }
                Err(e) => {
                    // A verify may have sent part of its changes: the retry
                    // sends everything.
                    ctx.health.fail(&e);
                    (full, periodic) = (true, false);
                    retry_at = tokio::time::Instant::now() + backoff.next();
                }
            }
        } else if !need_sync && !dirty.is_empty() {
            match refresh(&reader, view, &mut watches, std::mem::take(&mut dirty)).await {
                Ok(sent) => {
                    view.failing.report(&ctx.health, sent);
                    ctx.health.ok();
                }
                Err(e) => {
                    // Some services were not re-read: a full sync will.
                    ctx.health.fail(&e);
                    (need_sync, full, periodic) = (true, true, false);
                    retry_at = tokio::time::Instant::now() + backoff.next();
                }
            }
        }
        tokio::select! {
            biased;
            state = states.changed() => match state {
                s if s.is_terminated() => return (s, synced),
                zk::SessionState::Disconnected => {
                    let reason = "connection lost, reconnecting".to_string();
                    ctx.health.fail(&RegistryError::Unreachable { registry: ctx.registry.clone(), reason });
                    (full, periodic) = (true, false);
                    if !need_sync {
                        need_sync = true;
                        retry_at = tokio::time::Instant::now() + backoff.next();
                    }
                }
                // Back on the same session. Events during the gap may be lost
                // (ZOOKEEPER-4698), so re-list everything now.
                _ => {
                    info!(?state, "reconnected, resyncing");
                    (need_sync, full, periodic) = (true, true, false);
                    retry_at = tokio::time::Instant::now();
                }
            },
            Some((root, event)) = rx.recv() => {
                dirty.note(&ctx.tree, root, &event);
                while let Ok((root, event)) = rx.try_recv() {
                    dirty.note(&ctx.tree, root, &event);
                }
            }
            () = selector.changed() => {
                // Re-list and read the selected services: the snapshot drops
                // the ones no longer selected.
                view.selection = selector.current();
                info!("selection changed, resyncing");
                (need_sync, full, periodic) = (true, true, false);
                retry_at = tokio::time::Instant::now();
            }
            Some(Err(e)) = watches.join_next() => {
                if e.is_panic() {
                    warn!(error = %e, "watch forwarder panicked; resyncing");
                    (need_sync, full, periodic) = (true, true, false);
                }
            }
            () = tokio::time::sleep_until(full_at), if !need_sync => {
                (need_sync, full, periodic) = (true, true, true);
                retry_at = tokio::time::Instant::now();
            }
            _ = ticker.tick(), if !need_sync => {
                (need_sync, full, periodic) = (true, false, true);
                retry_at = tokio::time::Instant::now();
            }
            // Services that could not be read are read again; the others
            // are not held up meanwhile.
            () = sleep_until_some(view.failing.retry_at()), if !need_sync => {
                dirty.services.extend(view.failing.due());
            }
            () = tokio::time::sleep_until(retry_at), if need_sync => {}
        }
    }
}

/// Sleep until `at`; never, with none.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// List every root and read every selected service, gathered for one
/// [`Update::Snapshot`]. Each service is rendered as its read arrives: at
/// most `CONCURRENCY` raw reads are held, never the whole catalog. Only
/// losing the session or the connection fails it: a service that cannot be
/// read keeps what was sent of it (see [`View::keep`]).
async fn full_sync(reader: &Reader<'_>, view: &View, watches: &mut Watches) -> Result<Sync, RegistryError> {
    let keys = list_and_watch(reader, view, watches).await?;
    let mut sync = Sync::default();
    let mut reads = std::pin::pin!(reader.reads(keys.into_iter().map(|key| (key, None)).collect()));
    while let Some((key, read)) = reads.next().await {
        match read {
            Ok(Some(read)) => view.add(&mut sync, reader.tree, key, read),
            Ok(None) => {}
            Err(e) if is_outage(&e) => return Err(e),
            Err(e) => view.keep(&mut sync, key, e),
        }
    }
    Ok(sync)
}

/// A periodic resync that sends only what differs from what was sent:
/// services no longer listed are removed, a Dubbo interface whose
/// `providers` node has the `pzxid` it was read with is not read again (one
/// `exists` call), every other service is read and sent if it changed. At
/// 10k interfaces it costs 10k small calls instead of reading and parsing
/// 100k provider URLs and re-sending the whole catalog. Only valid while
/// the cache holds what was sent: any failure makes the next sync a full one.
///
/// Reads that differ from what was sent are not applied here but returned,
/// so that the caller can judge them for drift ([`missed`]) before sending
/// them; reads that match are recorded at once.
async fn verify(
    reader: &Reader<'_>,
    view: &mut View,
    watches: &mut Watches,
) -> Result<Vec<(ServiceKey, Read)>, RegistryError> {
    let keys = list_and_watch(reader, view, watches).await?;
    let listed: HashSet<&ServiceKey> = keys.iter().collect();
    let mut deferred: Vec<(ServiceKey, Read)> =
        view.sent.keys().filter(|k| !listed.contains(k)).map(|k| (k.clone(), Read::Gone)).collect();
    let checks = keys
        .into_iter()
        .map(|key| {
            let version = view.sent.get(&key).and_then(|kept| kept.version);
            (key, version)
        })
        .collect();
    read_into(reader, view, watches, checks, Some(&mut deferred)).await?;
    Ok(deferred)
}

/// Watches first, so that nothing changing during the listing (or after a
/// service's read) goes unseen; then every selected service.
async fn list_and_watch(
    reader: &Reader<'_>,
    view: &View,
    watches: &mut Watches,
) -> Result<Vec<ServiceKey>, RegistryError> {
    watches.roots(reader).await?;
    let keys = reader.list_all(|key| may_select(reader.tree, &view.selection, key)).await?;
    watches.services(reader, &keys, true).await?;
    Ok(keys)
}

/// What changed since the last read.
#[derive(Default)]
struct Dirty {
    roots: BTreeSet<usize>,
    services: BTreeSet<ServiceKey>,
}

impl Dirty {
    fn note(&mut self, tree: &Tree, root: usize, event: &zk::WatchedEvent) {
        if event.event_type == zk::EventType::Session {
            return; // the state watcher handles those
        }
        match tree.classify(root, &event.path) {
            Touch::Root(root) => {
                self.roots.insert(root);
            }
            Touch::Service(key) => {
                debug!(path = %event.path, event = ?event.event_type, service = %key.name, "changed");
                self.services.insert(key);
            }
            Touch::Nothing => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.roots.is_empty() && self.services.is_empty()
    }

    fn names(&self, key: &ServiceKey) -> bool {
        self.services.contains(key) || self.roots.contains(&key.root)
    }
}

/// Of the services a periodic sync found different from what was sent, the
/// ones no watch event named: drift (issue 24).
///
/// The rule: ZooKeeper delivers a watch event before any read answer that
/// shows the change (its ordering guarantee, per session), so a change that
/// raced the sync's read has its event in the client by the time that
/// answer arrived. Our watches pass events on through forwarder tasks, so
/// the caller gives them [`FORWARD_GRACE`] and drains them into `noticed`
/// (which also holds the events that came before the sync) first. A
/// difference whose service (or root) no event named then is one the
/// watches delivered but the watcher lost, or never got: counted. One that
/// an event named is a change in flight, not counted, and sent as usual.
fn missed(suspects: Vec<ServiceKey>, noticed: &Dirty) -> Vec<ServiceKey> {
    suspects.into_iter().filter(|key| !noticed.names(key)).collect()
}

/// Re-read what changed and send what differs; says whether it sent
/// anything. Answers are applied even if another read failed: each is
/// authoritative for its own service.
async fn refresh(
    reader: &Reader<'_>,
    view: &mut View,
    watches: &mut Watches,
    dirty: Dirty,
) -> Result<bool, RegistryError> {
    let tree = reader.tree;
    let mut keys = dirty.services;
    for root in dirty.roots {
        keys.extend(reader.list_root(root).await?);
        keys.extend(view.sent.keys().filter(|k| k.root == root).cloned());
    }
    keys.retain(|key| may_select(tree, &view.selection, key));
    let keys: Vec<ServiceKey> = keys.into_iter().collect();
    watches.services(reader, &keys, false).await?;
    read_into(reader, view, watches, keys.into_iter().map(|key| (key, None)).collect(), None).await
}

/// Read (or check) `keys` and send what differs, as each answer arrives;
/// with `defer`, answers that differ from what was sent are put there
/// instead, unsent. A service that cannot be read is noted as failing; only
/// an outage fails the whole. Says whether it sent anything.
async fn read_into(
    reader: &Reader<'_>,
    view: &mut View,
    watches: &mut Watches,
    keys: Vec<(ServiceKey, Option<i64>)>,
    mut defer: Option<&mut Vec<(ServiceKey, Read)>>,
) -> Result<bool, RegistryError> {
    let (mut first_error, mut sent) = (None, false);
    let mut reads = std::pin::pin!(reader.reads(keys));
    while let Some((key, read)) = reads.next().await {
        match read {
            Ok(None) => {}
            Ok(Some(read)) => {
                if let Some(deferred) = defer.as_deref_mut()
                    && view.differs(reader.tree, &key, &read)
                {
                    deferred.push((key, read));
                    continue;
                }
                if matches!(read, Read::Gone) {
                    watches.forget(&key);
                }
                sent |= view.apply(reader.tree, key, read);
            }
            Err(e) if is_outage(&e) => {
                first_error.get_or_insert(e);
            }
            Err(e) => view.failing.fail(key, e),
        }
    }
    first_error.map_or(Ok(sent), Err)
}

/// Whether `key` may hold a selected host, known before reading it: a
/// Spring service has one host, a Dubbo interface one per version and group.
fn may_select(tree: &Tree, selection: &Selection, key: &ServiceKey) -> bool {
    if selection.is_all() {
        return true;
    }
    match tree.kind(key) {
        tree::Kind::Spring => selection.wants(&tree.spring_host(key)),
        tree::Kind::Dubbo => selection.may_want_prefix(&format!("providers:{}:", key.name)),
    }
}

/// What was sent to the sink, per ZooKeeper service and host.
struct View {
    /// Which services are read and served.
    selection: Selection,
    sink: Arc<dyn Sink>,
    naming: Naming,
    stats: Arc<ZookeeperStats>,
    /// A digest, last port and TLS per host sent, not the services: the
    /// cache holds those (see [`Sent`]).
    sent: BTreeMap<ServiceKey, Kept>,
    /// Malformed nodes already warned about (a resync keeps only those
    /// still there), so a bad node warns once, not every resync.
    malformed_seen: HashSet<String>,
    /// Services that cannot be read, and when to try them again.
    failing: Failing,
}

/// What is kept of one ZooKeeper service once sent.
struct Kept {
    hosts: SentHosts,
    /// See `Read::Present::version`.
    version: Option<i64>,
}

/// A full sync being gathered, one service at a time.
#[derive(Default)]
struct Sync {
    sent: BTreeMap<ServiceKey, Kept>,
    all: Vec<Service>,
    seen: HashSet<String>,
    /// Services that could not be read.
    failed: Vec<(ServiceKey, RegistryError)>,
    /// Some of `failed` had been sent: they are in `sent` as they were,
    /// but not in `all`.
    kept_failing: bool,
    /// Services that were failing and have been read.
    recovered: Vec<ServiceKey>,
}

impl View {
    /// Render one service read by a full sync into `sync`.
    fn add(&self, sync: &mut Sync, tree: &Tree, key: ServiceKey, read: Read) {
        // Listed, then deleted before its read: not there.
        let Read::Present { members, malformed, dropped_labels, version } = read else { return };
        if self.failing.contains(&key) {
            sync.recovered.push(key.clone());
        }
        self.count(malformed, dropped_labels, &mut sync.seen);
        let hosts = self.render(tree, &key, members, self.sent.get(&key).map(|k| &k.hosts));
        let kept = hosts.iter().map(|(host, service)| (host.clone(), Sent::of(service))).collect();
        sync.all.extend(hosts.into_values());
        sync.sent.insert(key, Kept { hosts: kept, version });
    }

    /// One service a full sync could not read keeps what was sent of it,
    /// if anything (read again in full: no version).
    fn keep(&self, sync: &mut Sync, key: ServiceKey, e: RegistryError) {
        if let Some(kept) = self.sent.get(&key) {
            sync.kept_failing |= kept.hosts.hosts().next().is_some();
            sync.sent.insert(key.clone(), Kept { hosts: kept.hosts.clone(), version: None });
        }
        sync.failed.push((key, e));
    }

    /// Whether `read` would change what was sent for `key`.
    fn differs(&self, tree: &Tree, key: &ServiceKey, read: &Read) -> bool {
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
    fn differing(&self, sync: &Sync) -> Vec<ServiceKey> {
        let changed = sync.sent.iter().filter(|(key, kept)| self.sent.get(*key).map(|k| &k.hosts) != Some(&kept.hosts));
        let gone = self.sent.keys().filter(|key| !sync.sent.contains_key(*key));
        changed.map(|(key, _)| key.clone()).chain(gone.cloned()).collect()
    }

    /// Every host of `keys`, as sent and as `done` has them.
    fn hosts_of(&self, keys: &[ServiceKey], done: &Result<Sync, Vec<(ServiceKey, Read)>>) -> Vec<String> {
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
    fn finish(&mut self, mut sync: Sync) {
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
    /// the hosts that went are removed.
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
        info!(services = all.len(), "full sync, sent service by service: a service sent before cannot be read");
        for service in all {
            self.sink.update(Update::Upsert(service));
        }
    }

    /// Send a gathered full sync as one snapshot.
    fn snapshot(&mut self, sync: Sync) {
        let Sync { sent, mut all, seen, .. } = sync;
        self.malformed_seen = seen;
        self.sent = sent;
        all.sort();
        info!(services = all.len(), "full sync");
        self.sink.update(Update::Snapshot(all));
    }

    /// Send what `read` changes of `key`; says whether it sent anything.
    /// A service that was failing and now reads differently from what was
    /// sent is counted as an unreadable repair first.
    fn apply(&mut self, tree: &Tree, key: ServiceKey, read: Read) -> bool {
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
    use crate::spec::RegistryKind;

    fn spec(domain: &str) -> RegistrySpec {
        RegistrySpec::new(RegistryKind::Zookeeper, "zk", domain, 2181)
    }

    #[test]
    fn connect_strings() {
        assert_eq!(connect_string(&spec("zk.example.com")).unwrap(), "zk.example.com:2181");
        assert_eq!(connect_string(&spec("10.0.0.1, 10.0.0.2")).unwrap(), "10.0.0.1:2181,10.0.0.2:2181");
        assert_eq!(connect_string(&spec("::1")).unwrap(), "[::1]:2181");
        assert_eq!(connect_string(&spec("[fe80::1]")).unwrap(), "[fe80::1]:2181");
        for bad in ["", " , ", "zk:2181", "zk/chroot", "a b"] {
            let err = connect_string(&spec(bad)).unwrap_err();
            assert!(err.to_string().starts_with("zk: domain: "), "{bad:?}: {err}");
        }
    }

    #[test]
    fn drift_is_a_difference_no_event_named() {
        let key = |root, name: &str| ServiceKey { root, name: name.into() };
        let mut noticed = Dirty::default();
        noticed.services.insert(key(0, "com.foo.Raced"));
        noticed.roots.insert(1);
        let suspects = vec![key(0, "com.foo.Raced"), key(0, "com.foo.Lost"), key(1, "orders")];
        assert_eq!(missed(suspects.clone(), &noticed), [key(0, "com.foo.Lost")]);
        assert_eq!(missed(suspects.clone(), &Dirty::default()), suspects, "no event at all: every one");
        assert!(missed(Vec::new(), &noticed).is_empty());
    }

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
        let spec = spec("127.0.0.1");
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

    #[test]
    fn new_checks_services_paths() {
        let mut s = spec("127.0.0.1");
        s.zk_services_path = vec!["relative".into()];
        assert!(ZookeeperWatcher::new(s).is_err());
        let w = ZookeeperWatcher::new(spec("127.0.0.1")).unwrap().with_resync(Duration::ZERO);
        assert_eq!(w.resync, MIN_RESYNC);
        assert_eq!(w.stats().malformed(), 0);
    }
}
