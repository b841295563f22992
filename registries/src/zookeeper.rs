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
//! anti-entropy interval ([`RegistrySpec::anti_entropy`], 5 min by default),
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
//!
//! [`Update::Snapshot`]: crate::Update::Snapshot
//! [`Update::Upsert`]: crate::Update::Upsert
//! [`Update::Remove`]: crate::Update::Remove

pub(crate) mod dubbo;
mod failing;
mod read;
pub(crate) mod spring;
mod stats;
mod tree;
mod view;
mod watches;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::future::Future;
use std::net::Ipv6Addr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tracing::{Instrument, debug, info, info_span, warn};
use zookeeper_client as zk;

use self::failing::Failing;
use self::read::{Read, Reader, is_outage};
pub use self::stats::ZookeeperStats;
use self::tree::{Naming, ServiceKey, Touch, Tree};
use self::view::{Sync, View};
use self::watches::Watches;
use crate::health::Health;
use crate::repair::RepairKind;
use crate::retry::{Backoff, wait_or_reopened};
use crate::select::{Selection, Selector};
use crate::spec::RegistrySpec;
use crate::watcher::{RegistryError, Sink, Watcher};

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
    /// How often a full sync reads everything ([`RegistrySpec::anti_entropy`]).
    anti_entropy: Duration,
    health: Health,
}

impl ZookeeperWatcher {
    async fn run_inner(mut self, sink: Arc<dyn Sink>) {
        let roots: Vec<&str> = self.tree.roots().iter().map(|r| r.path.as_str()).collect();
        let selective = !self.selector.is_all();
        let anti_entropy = self.spec.anti_entropy();
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
            let mut mid = MidPass::new(&mut rx, &ctx.tree);
            let result = if full {
                full_sync(&reader, view, &mut watches, &mut mid).await.map(Ok)
            } else {
                verify(&reader, view, &mut watches, &mut mid).await.map(Err)
            };
            let during = mid.noticed;
            match result {
                Ok(mut done) => {
                    // Events from before the sync began are covered by it,
                    // and so are those it read again as they came; later
                    // ones (still in `rx`) are not.
                    let mut noticed = std::mem::take(&mut dirty);
                    noticed.services.extend(during.services);
                    noticed.roots.extend(during.roots);
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
                                send(view, &mut watches, &ctx.tree, key, read);
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
///
/// [`Update::Snapshot`]: crate::Update::Snapshot
async fn full_sync(
    reader: &Reader<'_>,
    view: &mut View,
    watches: &mut Watches,
    mid: &mut MidPass<'_>,
) -> Result<Sync, RegistryError> {
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
        mid.serve(reader, view, watches, Pass::Full(&mut sync)).await?;
    }
    Ok(sync)
}

/// The watch events that come while a pass over the whole catalog (a full
/// sync or a verify) runs. The services they name are read and sent at
/// once, between two of the pass's answers, so that a change waits for a
/// few reads, not for the pass: at 100k services a verify takes seconds and
/// a full sync longer (BENCHMARKS.md, "100k services").
///
/// What the pass had already read of such a service is older than this
/// read, and is replaced by it ([`Pass`]); what the pass reads of it later
/// is newer still, and is kept. ZooKeeper answers one session in order, so
/// "later" is the order of the answers.
struct MidPass<'a> {
    rx: &'a mut mpsc::UnboundedReceiver<(usize, zk::WatchedEvent)>,
    tree: &'a Tree,
    /// Every event taken during the pass: the drift judgement ([`missed`])
    /// counts them as noticed.
    noticed: Dirty,
}

/// What a pass has gathered so far, for [`MidPass::serve`] to bring up to
/// date.
enum Pass<'a> {
    Full(&'a mut Sync),
    /// A verify's reads that differ from what was sent, not sent yet.
    Verify(&'a mut Vec<(ServiceKey, Read)>),
}

impl<'a> MidPass<'a> {
    fn new(rx: &'a mut mpsc::UnboundedReceiver<(usize, zk::WatchedEvent)>, tree: &'a Tree) -> MidPass<'a> {
        MidPass { rx, tree, noticed: Dirty::default() }
    }

    /// Read and send the services named by the events that came so far,
    /// if any; only an outage fails it.
    async fn serve(
        &mut self,
        reader: &Reader<'_>,
        view: &mut View,
        watches: &mut Watches,
        mut pass: Pass<'_>,
    ) -> Result<(), RegistryError> {
        let mut dirty = Dirty::default();
        while let Ok((root, event)) = self.rx.try_recv() {
            dirty.note(self.tree, root, &event);
        }
        if dirty.is_empty() {
            return Ok(());
        }
        self.noticed.services.extend(dirty.services.iter().cloned());
        self.noticed.roots.extend(dirty.roots.iter().copied());
        let keys = dirty_keys(reader, view, watches, dirty).await?;
        let mut reads = std::pin::pin!(reader.reads(keys.into_iter().map(|key| (key, None)).collect()));
        while let Some((key, read)) = reads.next().await {
            match read {
                Ok(None) => {}
                Ok(Some(mut read)) => {
                    if let Pass::Full(sync) = &mut pass {
                        sync.failed.retain(|(k, _)| k != &key);
                    }
                    match (&mut pass, &mut read) {
                        (Pass::Full(sync), Read::Gone) => View::drop_read(sync, &key),
                        (Pass::Full(sync), Read::Present { members, malformed, dropped_labels, version }) => {
                            // The sync counts the malformed nodes and
                            // keeps them as seen; the send below must not
                            // count them again.
                            let gathered = Read::Present {
                                members: members.clone(),
                                malformed: std::mem::take(malformed),
                                dropped_labels: std::mem::take(dropped_labels),
                                version: *version,
                            };
                            view.add(sync, reader.tree, key.clone(), gathered);
                        }
                        (Pass::Verify(deferred), _) => deferred.retain(|(k, _)| k != &key),
                    }
                    send(view, watches, reader.tree, key, read);
                }
                Err(e) if is_outage(&e) => return Err(e),
                Err(e) => view.failing.fail(key, e),
            }
        }
        Ok(())
    }
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
    mid: &mut MidPass<'_>,
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
    read_into(reader, view, watches, checks, Some((&mut deferred, mid))).await?;
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
    let keys = dirty_keys(reader, view, watches, dirty).await?;
    read_into(reader, view, watches, keys.into_iter().map(|key| (key, None)).collect(), None).await
}

/// The selected services `dirty` names, watched before they are read: each
/// service, and every service of a root that changed (listed again, and
/// those sent).
async fn dirty_keys(
    reader: &Reader<'_>,
    view: &View,
    watches: &mut Watches,
    dirty: Dirty,
) -> Result<Vec<ServiceKey>, RegistryError> {
    let mut keys = dirty.services;
    for root in dirty.roots {
        keys.extend(reader.list_root(root).await?);
        keys.extend(view.sent.keys().filter(|k| k.root == root).cloned());
    }
    keys.retain(|key| may_select(reader.tree, &view.selection, key));
    let keys: Vec<ServiceKey> = keys.into_iter().collect();
    watches.services(reader, &keys, false).await?;
    Ok(keys)
}

/// Send what `read` changes of `key` (a service gone is no longer
/// watched); says whether it sent anything.
fn send(view: &mut View, watches: &mut Watches, tree: &Tree, key: ServiceKey, read: Read) -> bool {
    if matches!(read, Read::Gone) {
        watches.forget(&key);
    }
    view.apply(tree, key, read)
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
    mut defer: Option<(&mut Vec<(ServiceKey, Read)>, &mut MidPass<'_>)>,
) -> Result<bool, RegistryError> {
    let (mut first_error, mut sent) = (None, false);
    let mut reads = std::pin::pin!(reader.reads(keys));
    while let Some((key, read)) = reads.next().await {
        match read {
            Ok(None) => {}
            Ok(Some(read)) => {
                if let Some((deferred, _)) = defer.as_mut()
                    && view.differs(reader.tree, &key, &read)
                {
                    deferred.push((key, read));
                } else {
                    sent |= send(view, watches, reader.tree, key, read);
                }
            }
            Err(e) if is_outage(&e) => {
                first_error.get_or_insert(e);
            }
            Err(e) => view.failing.fail(key, e),
        }
        if let Some((deferred, mid)) = defer.as_mut()
            && first_error.is_none()
        {
            mid.serve(reader, view, watches, Pass::Verify(deferred)).await?;
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
