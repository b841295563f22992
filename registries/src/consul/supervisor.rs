//! The Consul watcher's one decision-maker: it owns what was sent per
//! service, turns detector answers into targeted reads, runs sweeps and
//! resyncs, and is the only place that emits to the sink, so no answer can
//! race another into the cache.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, debug, info};

use super::client::Indexed;
use super::ctx::{Ctx, FullSync, Read, is_outage};
use super::decode::{CheckPrints, dirty_services};
use crate::model::Service;
use crate::retry::Backoff;
use crate::select::{Selection, Selector};
use crate::watcher::{RegistryError, Update};
use crate::worker::{last_port, on_worker_exit};

/// How long a catalog change no read has accounted for waits for the
/// health detector and its reads before a sweep looks for it. Registering
/// an instance with checks moves the catalog and the checks at the same
/// index; this leaves that targeted read time to arrive first. It ends
/// early once the health detector answered at or past that index and no
/// read is pending, and a sweep that starts anyway stops as soon as a
/// targeted read accounts for its index, so it can be short.
const EXPLAIN_GRACE: Duration = Duration::from_millis(50);
/// Index probes pipelined per request batch on one connection. Small
/// enough that the batches in flight when a sweep finds its change (one
/// per part) waste few probes, large enough to cut the per-request work.
const PROBE_BATCH: usize = 16;
/// Services that changed most recently, probed first by a sweep for an
/// unnamed change (rolling deploys and autoscalers touch the same service
/// again and again).
const RECENT_CHANGED: usize = 32;
/// A far-away instant for timers that are off.
const NEVER: Duration = Duration::from_secs(86_400 * 365);

/// What the loops tell the supervisor.
pub(crate) enum Event {
    /// The catalog detector's answer (tag filter applied).
    Catalog(Indexed<BTreeMap<String, Vec<String>>>),
    /// The health detector's answer.
    Checks(Indexed<CheckPrints>),
    /// A read finished; `targeted` ones were started by [`Supervisor::want_read`].
    Read { read: Read, targeted: bool },
    /// A sweep finished; `periodic` sweeps end with a snapshot.
    SweepDone { periodic: bool, ok: bool },
}

/// One watched service.
#[derive(Default)]
struct Tracked {
    tags: Vec<String>,
    /// What was last sent; `None` until a read succeeds.
    sent: Option<Service>,
    /// `X-Consul-Index` of the last read applied (0: none).
    index: u64,
    /// Nodes of its instances, passing or not.
    nodes: BTreeSet<String>,
    /// Sequence number of the last read applied.
    seq: u64,
    /// The last read's answer could not be used.
    failing: Option<RegistryError>,
}

/// How soon a catalog index that went backwards is followed by a resync.
const INDEX_RESET_RESYNC: Duration = Duration::from_millis(200);

pub(crate) struct Supervisor {
    ctx: Arc<Ctx>,
    /// The selected services of the catalog.
    services: BTreeMap<String, Tracked>,
    /// The last catalog answer (tag filter applied), selected or not, so a
    /// new selection is applied without asking Consul.
    catalog: BTreeMap<String, Vec<String>>,
    selector: Selector,
    selection: Selection,
    catalog_index: u64,
    /// The catalog index of the last full sync until a detector answer
    /// reaches it: a detector answer older than the sync was asked before
    /// it, and must not undo it.
    sync_floor: u64,
    prints: CheckPrints,
    /// Reads and sweeps. Dropping the supervisor aborts them.
    tasks: JoinSet<()>,
    /// Targeted reads in flight, and whether another is wanted after.
    in_flight: HashMap<String, bool>,
    queue: VecDeque<String>,
    queued: HashSet<String>,
    /// The highest index a read returned since the last catalog answer.
    read_max_index: u64,
    /// A catalog index no read has accounted for, and when to sweep for it.
    unexplained: Option<(u64, Instant)>,
    sweeping: bool,
    sweep_again: bool,
    /// When the running sweep started, and when a sweep for an unnamed
    /// change may start: sweeps rest at least as long as the last one took,
    /// so churn of check-less instances costs Consul at most half its time
    /// in index probes.
    sweep_started: Instant,
    sweep_not_before: Instant,
    /// A sweep for an unnamed change is due at this instant.
    sweep_due: Option<Instant>,
    /// The running sweep for an unnamed change: the index it looks for and
    /// how to stop it once a targeted read has accounted for that index.
    sweep_cancel: Option<(u64, Arc<Notify>)>,
    /// The index of the health detector's last answer.
    checks_index: u64,
    /// Services with an update sent most recently, newest first.
    recent: VecDeque<String>,
    /// The newest catalog index an unnamed-change sweep looks for: it stops
    /// once a probe finds a service at least this new (the rule that names
    /// a change for targeted reads too). `None`: sweep everything.
    sweep_target: Option<u64>,
    /// When failing services are read again.
    retry_at: Option<Instant>,
    retry_backoff: Backoff,
    /// A recovery resync is wanted, not before this instant.
    resync_at: Option<Instant>,
    resync_backoff: Backoff,
    tx: mpsc::Sender<Event>,
}

impl Supervisor {
    pub fn new(ctx: Arc<Ctx>, tx: mpsc::Sender<Event>, selector: Selector, selection: Selection) -> Supervisor {
        Supervisor {
            ctx,
            services: BTreeMap::new(),
            catalog: BTreeMap::new(),
            selector,
            selection,
            catalog_index: 0,
            sync_floor: 0,
            prints: CheckPrints::default(),
            tasks: JoinSet::new(),
            in_flight: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            read_max_index: 0,
            unexplained: None,
            sweeping: false,
            sweep_again: false,
            sweep_started: Instant::now(),
            sweep_not_before: Instant::now(),
            sweep_due: None,
            sweep_cancel: None,
            checks_index: 0,
            recent: VecDeque::new(),
            sweep_target: None,
            retry_at: None,
            retry_backoff: Backoff::default(),
            resync_at: None,
            resync_backoff: Backoff::default(),
            tx,
        }
    }

    pub async fn run(mut self, mut rx: mpsc::Receiver<Event>, refresh: Duration, mut background: JoinSet<()>) {
        let start = Instant::now() + refresh;
        let mut ticker = tokio::time::interval_at(start, refresh);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let timer = self.next_timer();
            tokio::select! {
                Some(event) = rx.recv() => self.on_event(event),
                () = self.selector.changed() => self.on_selection(),
                _ = ticker.tick() => self.start_sweep(true),
                () = self.ctx.health.recovered.notified() => {
                    info!("consul answers again, resyncing");
                    self.resync_at.get_or_insert_with(Instant::now);
                }
                () = tokio::time::sleep_until(timer) => self.on_timer().await,
                Some(done) = self.tasks.join_next() => on_worker_exit("consul", done),
                Some(done) = background.join_next() => on_worker_exit("consul", done),
            }
        }
    }

    fn next_timer(&self) -> Instant {
        [self.unexplained.map(|(_, at)| at), self.retry_at, self.resync_at, self.sweep_due]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or_else(|| Instant::now() + NEVER)
    }

    async fn on_timer(&mut self) {
        let now = Instant::now();
        if self.resync_at.is_some_and(|at| at <= now) {
            self.resync().await;
        }
        if self.retry_at.is_some_and(|at| at <= now) {
            self.retry_at = None;
            let failing: Vec<String> =
                self.services.iter().filter(|(_, t)| t.failing.is_some()).map(|(n, _)| n.clone()).collect();
            debug!(services = failing.len(), "reading failing services again");
            failing.into_iter().for_each(|name| self.want_read(name));
        }
        if let Some((index, at)) = self.unexplained
            && at <= now
        {
            if !self.in_flight.is_empty() || !self.queue.is_empty() {
                self.unexplained = Some((index, now + EXPLAIN_GRACE));
            } else {
                debug!(index, "catalog changed with no service named: sweeping");
                self.unexplained = None;
                self.sweep_target = Some(self.sweep_target.map_or(index, |t| t.max(index)));
                self.want_sweep();
            }
        }
        if self.sweep_due.is_some_and(|at| at <= now) {
            self.sweep_due = None;
            self.start_sweep(false);
        }
    }

    /// A sweep for an unnamed change, as soon as the pacing allows.
    fn want_sweep(&mut self) {
        if self.sweeping {
            self.sweep_again = true;
        } else {
            let at = self.sweep_not_before.max(Instant::now());
            self.sweep_due = Some(self.sweep_due.map_or(at, |due| due.min(at)));
        }
    }

    /// The recovery resync: a full sync, paced by the backoff so that a
    /// flapping Consul costs at most one full sync per backoff step.
    async fn resync(&mut self) {
        match self.ctx.full_sync(&self.selection).await {
            Ok(sync) => {
                self.resync_backoff.reset();
                self.resync_at = None;
                self.apply_sync(sync);
                // This snapshot already is the resync a failure during it
                // would ask for.
                let _ = futures::FutureExt::now_or_never(self.ctx.health.recovered.notified());
            }
            Err(e) => {
                self.ctx.health.fail(&e);
                self.resync_at = Some(Instant::now() + self.resync_backoff.next());
            }
        }
    }

    pub fn apply_sync(&mut self, sync: FullSync) {
        let FullSync { catalog, checks, reads } = sync;
        let mut old = std::mem::take(&mut self.services);
        for (name, tags) in self.ctx.selected(&catalog.value, &self.selection) {
            let mut tracked = old.remove(name).unwrap_or_default();
            tracked.tags = tags.clone();
            self.services.insert(name.clone(), tracked);
        }
        self.catalog = catalog.value;
        for read in reads {
            self.apply_read(read, false);
        }
        self.catalog_index = catalog.index;
        self.sync_floor = catalog.index;
        self.prints = checks.value;
        self.read_max_index = 0;
        self.unexplained = None;
        let mut all: Vec<Service> = self.services.values().filter_map(|t| t.sent.clone()).collect();
        all.sort();
        info!(services = all.len(), index = self.catalog_index, "full sync");
        self.after_reads();
        self.ctx.sink.update(Update::Snapshot(all));
        self.report_failing();
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Catalog(answer) => self.on_catalog(answer),
            Event::Checks(answer) => self.on_checks(answer),
            Event::Read { read, targeted } => {
                if targeted && self.in_flight.remove(&read.name) == Some(true) {
                    self.want_read(read.name.clone());
                }
                let emitted = self.apply_read(read, true);
                self.after_reads();
                if emitted && self.ctx.health.is_degraded() {
                    // The update marked the registry healthy in the cache.
                    if let Some(e) = self.services.values().find_map(|t| t.failing.as_ref()) {
                        self.ctx.health.fail_part(e);
                    }
                }
                self.start_reads();
            }
            Event::SweepDone { periodic, ok } => {
                self.sweeping = false;
                self.sweep_cancel = None;
                let now = Instant::now();
                self.sweep_not_before = now + now.duration_since(self.sweep_started);
                if periodic && ok {
                    let mut all: Vec<Service> = self.services.values().filter_map(|t| t.sent.clone()).collect();
                    all.sort();
                    debug!(services = all.len(), "periodic snapshot");
                    self.ctx.sink.update(Update::Snapshot(all));
                    self.report_failing();
                }
                if std::mem::take(&mut self.sweep_again) {
                    self.want_sweep();
                }
            }
        }
    }

    fn on_catalog(&mut self, answer: Indexed<BTreeMap<String, Vec<String>>>) {
        if answer.index < self.sync_floor {
            // Either an answer that was in flight during the last sync, or
            // Consul's index went backwards (a restarted agent, a new
            // cluster: Consul's blocking-query rules say to reset). Both are
            // settled by a full sync, which the backoff paces.
            debug!(index = answer.index, floor = self.sync_floor, "catalog answer older than the last sync: resyncing");
            let soon = Instant::now() + INDEX_RESET_RESYNC;
            self.resync_at = Some(self.resync_at.map_or(soon, |at| at.min(soon)));
            return;
        }
        self.sync_floor = 0;
        self.catalog = answer.value;
        let named = self.set_members("service left the catalog");
        if !named && answer.index != self.catalog_index && self.read_max_index < answer.index {
            let at = Instant::now() + EXPLAIN_GRACE;
            self.unexplained = Some((answer.index, at));
            self.grace_over_if_checks_answered();
        }
        self.catalog_index = answer.index;
        self.read_max_index = 0;
        self.update_degraded();
    }

    /// Track exactly the selected services of the last catalog: remove the
    /// others (sending a removal for what was sent, saying `why`), read the
    /// new and retagged ones. Returns whether any service was named.
    fn set_members(&mut self, why: &str) -> bool {
        let selected: BTreeMap<&String, &Vec<String>> = self.ctx.selected(&self.catalog, &self.selection).collect();
        let gone: Vec<String> = self.services.keys().filter(|n| !selected.contains_key(n)).cloned().collect();
        let mut named = !gone.is_empty();
        for name in gone {
            if let Some(Tracked { sent: Some(service), .. }) = self.services.remove(&name) {
                info!(service = %name, host = %service.host, "{why}");
                self.ctx.sink.update(Update::Remove(service.host));
            }
        }
        let mut read = Vec::new();
        for (name, tags) in selected {
            match self.services.get_mut(name) {
                Some(tracked) if tracked.tags == *tags => {}
                Some(tracked) => {
                    tracked.tags = tags.clone();
                    read.push(name.clone());
                }
                None => {
                    self.services.insert(name.clone(), Tracked { tags: tags.clone(), ..Tracked::default() });
                    read.push(name.clone());
                }
            }
        }
        named |= !read.is_empty();
        read.into_iter().for_each(|name| self.want_read(name));
        named
    }

    /// The referenced set changed: read the newly selected services now,
    /// drop the ones no longer selected; the others are left alone.
    fn on_selection(&mut self) {
        self.selection = self.selector.current();
        let before = self.services.len();
        self.set_members("service no longer selected");
        info!(before, after = self.services.len(), "selection changed");
        self.update_degraded();
    }

    fn on_checks(&mut self, answer: Indexed<CheckPrints>) {
        let old = std::mem::replace(&mut self.prints, answer.value);
        let nodes = self.services.iter().map(|(name, t)| (name.as_str(), &t.nodes));
        let dirty = dirty_services(&old, &self.prints, nodes);
        debug!(index = answer.index, services = dirty.len(), "checks changed");
        self.checks_index = answer.index;
        for name in dirty {
            if self.services.contains_key(&name) {
                self.want_read(name);
            }
        }
        self.grace_over_if_checks_answered();
    }

    /// The health detector answered at or past the unexplained catalog
    /// index and no read is pending: no targeted read is coming to account
    /// for it, so the sweep need not wait out the grace.
    fn grace_over_if_checks_answered(&mut self) {
        if let Some((index, at)) = self.unexplained
            && self.checks_index >= index
            && self.in_flight.is_empty()
            && self.queue.is_empty()
        {
            self.unexplained = Some((index, at.min(Instant::now())));
        }
    }

    /// Read `name` soon: at once if a slot is free, after the read in
    /// flight for it if there is one (it may predate the change).
    fn want_read(&mut self, name: String) {
        if let Some(again) = self.in_flight.get_mut(&name) {
            *again = true;
        } else if self.queued.insert(name.clone()) {
            self.queue.push_back(name);
        }
        self.start_reads();
    }

    fn start_reads(&mut self) {
        while self.in_flight.len() < self.ctx.read_slots {
            let Some(name) = self.queue.pop_front() else { break };
            self.queued.remove(&name);
            self.in_flight.insert(name.clone(), false);
            let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
            self.tasks.spawn(
                async move {
                    let read = ctx.read(name).await;
                    let _ = tx.send(Event::Read { read, targeted: true }).await;
                }
                .in_current_span(),
            );
        }
    }

    /// Apply one read. `emit`: send a changed record now (not during a full
    /// sync, whose snapshot carries it). Returns whether it sent an update.
    fn apply_read(&mut self, read: Read, emit: bool) -> bool {
        let Some(tracked) = self.services.get_mut(&read.name) else {
            return false; // left the catalog meanwhile
        };
        if read.seq <= tracked.seq {
            return false; // a later-started read was applied already
        }
        tracked.seq = read.seq;
        match read.result {
            Ok(answer) => {
                self.read_max_index = self.read_max_index.max(answer.index);
                tracked.index = answer.index;
                tracked.nodes = answer.value.nodes;
                tracked.failing = None;
                let service =
                    self.ctx.naming.service(&read.name, answer.value.endpoints, last_port(tracked.sent.as_ref()));
                if tracked.sent.as_ref() != Some(&service) {
                    tracked.sent = Some(service.clone());
                    if emit {
                        self.recent.retain(|n| n != &read.name);
                        self.recent.push_front(read.name.clone());
                        self.recent.truncate(RECENT_CHANGED);
                        debug!(service = %read.name, index = answer.index, endpoints = service.endpoints.len(), "changed");
                        self.ctx.sink.update(Update::Upsert(service));
                        return true;
                    }
                }
                false
            }
            Err(e) if is_outage(&e) => {
                // Consul itself failed: the recovery resync reads it again.
                self.ctx.health.fail(&e);
                false
            }
            Err(e) => {
                // This service's answer is unusable: keep what was sent, if
                // anything, and say so.
                if emit {
                    self.ctx.health.fail_part(&e);
                }
                tracked.failing = Some(e);
                false
            }
        }
    }

    /// After reads: account for a pending catalog change, keep `degraded`
    /// true while any service fails, and schedule their retry.
    fn after_reads(&mut self) {
        if let Some((index, _)) = self.unexplained
            && self.read_max_index >= index
        {
            self.unexplained = None;
        }
        if let Some((target, cancel)) = &self.sweep_cancel
            && self.read_max_index >= *target
        {
            debug!(target, "a read accounted for the sweep's change: stopping it");
            cancel.notify_one();
            self.sweep_cancel = None;
        }
        self.update_degraded();
    }

    fn update_degraded(&mut self) {
        let failing = self.services.values().any(|t| t.failing.is_some());
        let was = self.ctx.health.is_degraded();
        self.ctx.health.set_degraded(failing);
        if failing {
            if self.retry_at.is_none() {
                self.retry_at = Some(Instant::now() + self.retry_backoff.next());
            }
        } else {
            self.retry_at = None;
            self.retry_backoff.reset();
            if was {
                self.ctx.health.ok();
            }
        }
    }

    /// Tell the sink about every failing service again: an update marks the
    /// registry healthy in the cache, and it is not while one fails.
    fn report_failing(&self) {
        for e in self.services.values().filter_map(|t| t.failing.as_ref()) {
            self.ctx.health.fail_part(e);
        }
    }

    /// Ask every service for its index and read those that moved.
    fn start_sweep(&mut self, periodic: bool) {
        if self.sweeping {
            self.sweep_again = true;
            return;
        }
        // A periodic sweep probes every service, whatever it finds.
        let target = if periodic { None } else { self.sweep_target };
        self.sweep_target = None;
        self.sweeping = true;
        self.sweep_started = Instant::now();
        let cancel = Arc::new(Notify::new());
        self.sweep_cancel = target.map(|t| (t, cancel.clone()));
        let (order, first) = self.sweep_order(periodic);
        let sweep = sweep(self.ctx.clone(), self.tx.clone(), order, first, target, periodic, cancel);
        self.tasks.spawn(sweep.in_current_span());
    }

    /// What a sweep probes, in order, and how many of the first are the
    /// services changed most recently (for an unnamed change only; then
    /// the others in catalog order).
    fn sweep_order(&self, periodic: bool) -> (Vec<(String, u64)>, usize) {
        let mut order = Vec::with_capacity(self.services.len());
        if !periodic {
            for name in &self.recent {
                if let Some(t) = self.services.get(name) {
                    order.push((name.clone(), t.index));
                }
            }
        }
        let first = order.len();
        let recent: HashSet<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
        let rest: Vec<(String, u64)> = self
            .services
            .iter()
            .filter(|(n, _)| !recent.contains(n.as_str()))
            .map(|(n, t)| (n.clone(), t.index))
            .collect();
        order.extend(rest);
        (order, first)
    }
}

/// A sweep: probe `order` in batches of [`PROBE_BATCH`] pipelined probes,
/// on up to the read slots less one (left for targeted reads) connections
/// at once, and read the services whose index moved. Its first `first`
/// services (the recently changed) go alone in one batch before the rest.
/// Stops at an outage, when `cancel` is notified, or once a probe finds an
/// index at least `target`; the batches still in flight are then dropped
/// (their connections closed, so Consul stops answering them) before the
/// change is read.
async fn sweep(
    ctx: Arc<Ctx>,
    tx: mpsc::Sender<Event>,
    order: Vec<(String, u64)>,
    first: usize,
    target: Option<u64>,
    periodic: bool,
    cancel: Arc<Notify>,
) {
    let parts = ctx.read_slots.saturating_sub(1).max(1);
    let first = first.min(order.len());
    let head = (first > 0).then(|| order[..first].to_vec());
    let rest: Vec<Vec<(String, u64)>> = order[first..].chunks(PROBE_BATCH).map(<[_]>::to_vec).collect();
    let probe = |batch| probe_batch(ctx.clone(), batch, target);
    let head = futures::stream::iter(head).map(probe).buffer_unordered(1);
    let rest = futures::stream::iter(rest).map(probe).buffer_unordered(parts);
    let mut probes = head.chain(rest);
    let mut ok = true;
    let mut reads = 0usize;
    let mut found = Vec::new();
    loop {
        let next = tokio::select! {
            biased;
            () = cancel.notified() => break,
            next = probes.next() => next,
        };
        let Some(result) = next else { break };
        let moved = match result {
            Ok(moved) => moved,
            Err(e) => {
                ctx.health.fail(&e);
                ok = false;
                break;
            }
        };
        if moved.iter().any(|(_, is_target)| *is_target) {
            debug!(target, "sweep found the change");
            found = moved;
            break;
        }
        // An older change: read it while the batches in flight wait.
        if !read_moved(&ctx, &tx, moved, &mut reads).await {
            return;
        }
    }
    drop(probes);
    if !read_moved(&ctx, &tx, found, &mut reads).await {
        return;
    }
    debug!(reads, ok, periodic, "sweep done");
    let _ = tx.send(Event::SweepDone { periodic, ok }).await;
}

/// Read the `moved` services, the change looked for first, and hand each
/// read to the supervisor. False once the supervisor is gone.
async fn read_moved(ctx: &Ctx, tx: &mpsc::Sender<Event>, mut moved: Vec<(String, bool)>, reads: &mut usize) -> bool {
    moved.sort_by_key(|(_, is_target)| !is_target);
    for (name, _) in moved {
        *reads += 1;
        let read = ctx.read(name).await;
        if tx.send(Event::Read { read, targeted: false }).await.is_err() {
            return false;
        }
    }
    true
}

/// Probe one batch: the services whose index moved, each with whether it
/// is the change a sweep looks for (an index at least `target`). A refused
/// probe counts as moved (its read says what is wrong); an outage fails
/// the batch.
async fn probe_batch(
    ctx: Arc<Ctx>,
    batch: Vec<(String, u64)>,
    target: Option<u64>,
) -> Result<Vec<(String, bool)>, RegistryError> {
    let names: Vec<&str> = batch.iter().map(|(n, _)| n.as_str()).collect();
    let indexes = ctx.client.service_indexes(&names).await;
    let mut moved = Vec::new();
    for ((name, known), result) in batch.iter().zip(indexes) {
        match result {
            Ok(now) if now == *known => {}
            Ok(now) => moved.push((name.clone(), target.is_some_and(|t| now >= t))),
            Err(e) if is_outage(&e) => return Err(e),
            Err(_) => moved.push((name.clone(), false)),
        }
    }
    Ok(moved)
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
