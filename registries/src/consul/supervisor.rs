//! The Consul watcher's one decision-maker: it owns what was sent per
//! service, turns detector answers into targeted reads, runs sweeps and
//! resyncs, and is the only place that emits to the sink, so no answer can
//! race another into the cache.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, debug, info};

use super::client::{CheckState, Indexed};
use super::ctx::{Ctx, Event, FullSync, Read, is_outage};
use super::decode::{CheckPrints, changed_nodes, dirty_services};
#[cfg(test)]
use super::sweep::PROBE_BATCH;
use super::sweep::{SweepCtl, sweep};
use super::verify::{Found, Verifier, judge};
use crate::model::Service;
use crate::repair::RepairKind;
use crate::retry::Backoff;
use crate::select::{Selection, Selector};
use crate::watcher::{RegistryError, Update};
use crate::worker::{last_port, on_worker_exit};

/// A catalog change waits this long for the next one before its sweep
/// starts, so that the changes of one burst (a rollout, a transaction
/// sent as several calls) share one sweep.
const SWEEP_QUIET: Duration = Duration::from_millis(50);
/// ...but no longer than this after the first change no sweep has covered,
/// so that steady churn still gets swept.
const SWEEP_MAX_DEFER: Duration = Duration::from_millis(250);
/// Services that changed most recently, probed first by a sweep (rolling
/// deploys and autoscalers touch the same service again and again).
const RECENT_CHANGED: usize = 32;
/// How long after a detector reported an index every detector is taken to
/// have seen the writes up to it: a periodic sweep counts a service that
/// moved at or before an index seen this long before the watcher last had
/// nothing pending as drift (a change detection missed).
const SETTLE: Duration = Duration::from_secs(2);
/// Detector indexes remembered for [`Supervisor::settled`].
const SEEN_MAX: usize = 4096;
/// A far-away instant for timers that are off.
const NEVER: Duration = Duration::from_secs(86_400 * 365);
/// How soon a catalog index that went backwards is followed by a resync.
const INDEX_RESET_RESYNC: Duration = Duration::from_millis(200);

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
    /// Some instance registered a host name: read again at every periodic
    /// tick, since no index moves when the name's addresses do.
    named: bool,
    /// Read again soon (with the retry backoff), and why: an answer older
    /// than the change that asked for it was refused (`StaleRead`), or a
    /// name did not resolve (`NameResolution`).
    recheck: Option<RepairKind>,
}

/// The sweep running now.
struct Running {
    started: Instant,
    /// It ends with a snapshot and counts drift.
    periodic: bool,
    /// Services that moved at or before this index should have been read
    /// already ([`Supervisor::settled`] when the sweep started).
    settled: u64,
    /// It started right after the previous sweep, with no rest.
    follows: bool,
    /// How far it goes; shared with the sweep task.
    ctl: Arc<std::sync::Mutex<SweepCtl>>,
    /// Services in its order.
    len: usize,
    /// [`Supervisor::members`] when it started: a service added since is
    /// not in its order, so it cannot be extended to cover it.
    members: u64,
}

pub(crate) struct Supervisor {
    ctx: Arc<Ctx>,
    /// The selected services of the catalog.
    services: BTreeMap<String, Tracked>,
    /// The last catalog answer (tag filter applied), selected or not, so a
    /// new selection is applied without asking Consul.
    catalog: BTreeMap<String, Vec<String>>,
    /// The catalog detector's answer body `catalog` was decoded from
    /// (`None`: it came from elsewhere, a full sync or a listing). An
    /// instance added or removed leaves the body as it was: no decoding,
    /// no comparing of members then.
    catalog_body: Option<Vec<u8>>,
    selector: Selector,
    selection: Selection,
    catalog_index: u64,
    /// The catalog index of the last full sync until a detector answer
    /// reaches it: a detector answer older than the sync was asked before
    /// it, and must not undo it.
    sync_floor: u64,
    /// The last answer of each health detector, by [`CheckState::ALL`].
    prints: [CheckPrints; 2],
    /// The last nodes answer: node -> `ModifyIndex`.
    nodes: BTreeMap<String, u64>,
    /// Reads and sweeps. Dropping the supervisor aborts them.
    tasks: JoinSet<()>,
    /// Reads in flight, and whether another is wanted after.
    in_flight: HashMap<String, bool>,
    queue: VecDeque<String>,
    queued: HashSet<String>,
    /// A catalog change no sweep has covered yet: when the first came, and
    /// when the sweep for it is due.
    unswept: Option<(Instant, Instant)>,
    running: Option<Running>,
    /// A catalog change came while a sweep ran and it could not be
    /// extended: sweep again after it.
    sweep_again: bool,
    /// Counts services added to the tracked set.
    members: u64,
    /// A periodic sweep is owed (its tick came while a sweep ran).
    periodic_owed: bool,
    /// When the next sweep may start: a sweep that followed another with
    /// no rest rests as long as it took, so steady churn costs Consul at
    /// most two thirds of its time in probes.
    sweep_not_before: Instant,
    /// When the last sweep ended, and how long it took.
    last_sweep: Option<(Instant, Duration)>,
    /// A sweep is due at this instant (pacing).
    sweep_due: Option<Instant>,
    /// Services with an update sent most recently, newest first.
    recent: VecDeque<String>,
    /// Detector answers' indexes (rising) with when they came, for
    /// [`Supervisor::settled`].
    seen: VecDeque<(Instant, u64)>,
    /// Every change at or before this index has been read.
    settled: u64,
    /// Services a periodic sweep found moved at or before its settled
    /// index, read now: a changed answer is drift.
    suspects: HashSet<String>,
    /// When failing services are read again.
    retry_at: Option<Instant>,
    retry_backoff: Backoff,
    /// A recovery resync is wanted, not before this instant.
    resync_at: Option<Instant>,
    resync_backoff: Backoff,
    /// The next resync repairs a reset of Consul's index: what it finds
    /// different is counted as such.
    resync_kind: Option<RepairKind>,
    /// The anti-entropy pass.
    verifier: Verifier,
    /// The index a sweep's probe saw, per service to read: an answer below
    /// it is stale.
    min_wanted: HashMap<String, u64>,
    tx: mpsc::Sender<Event>,
}

impl Supervisor {
    pub fn new(
        ctx: Arc<Ctx>,
        tx: mpsc::Sender<Event>,
        selector: Selector,
        selection: Selection,
        anti_entropy: Duration,
    ) -> Supervisor {
        Supervisor {
            ctx,
            services: BTreeMap::new(),
            catalog: BTreeMap::new(),
            catalog_body: None,
            selector,
            selection,
            catalog_index: 0,
            sync_floor: 0,
            prints: Default::default(),
            nodes: BTreeMap::new(),
            tasks: JoinSet::new(),
            in_flight: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            unswept: None,
            running: None,
            sweep_again: false,
            members: 0,
            periodic_owed: false,
            sweep_not_before: Instant::now(),
            last_sweep: None,
            sweep_due: None,
            recent: VecDeque::new(),
            seen: VecDeque::new(),
            settled: 0,
            suspects: HashSet::new(),
            retry_at: None,
            retry_backoff: Backoff::default(),
            resync_at: None,
            resync_backoff: Backoff::default(),
            resync_kind: None,
            verifier: Verifier::new(anti_entropy),
            min_wanted: HashMap::new(),
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
                _ = ticker.tick() => {
                    // Settle first: the sweep this tick asks for is pending
                    // work, and what was idle until now is settled.
                    self.note_if_idle();
                    self.periodic_owed = true;
                    self.want_sweep();
                    self.recheck_names();
                }
                () = self.ctx.health.recovered.notified() => {
                    info!("consul answers again, resyncing");
                    self.resync_at.get_or_insert_with(Instant::now);
                }
                () = tokio::time::sleep_until(timer) => self.on_timer().await,
                Some(done) = self.tasks.join_next() => on_worker_exit("consul", done),
                Some(done) = background.join_next() => on_worker_exit("consul", done),
            }
            self.note_if_idle();
        }
    }

    fn next_timer(&self) -> Instant {
        [
            self.unswept.map(|(_, due)| due),
            self.retry_at,
            self.resync_at,
            self.sweep_due,
            Some(self.verifier.next_timer()),
        ]
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
            let failing: Vec<String> = self
                .services
                .iter()
                .filter(|(_, t)| t.failing.is_some() || t.recheck.is_some())
                .map(|(n, _)| n.clone())
                .collect();
            debug!(services = failing.len(), "reading failing services again");
            failing.into_iter().for_each(|name| self.want_read(name));
        }
        let due = self.verifier.due(now);
        if due.list {
            info!(pass = self.verifier.passes(), services = self.services.len(), "anti-entropy pass");
            let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
            self.tasks.spawn(
                async move {
                    let listed = ctx.client.catalog_services(0, ctx.wait).await;
                    let listed = listed.map(|a| Indexed { value: ctx.watched(a.value), index: a.index });
                    let _ = tx.send(Event::Listed(listed)).await;
                }
                .in_current_span(),
            );
        }
        for name in due.read {
            self.want_check(name);
        }
        if self.unswept.is_some_and(|(_, due)| due <= now) {
            self.unswept = None;
            self.want_sweep();
        }
        if self.sweep_due.is_some_and(|at| at <= now) {
            self.sweep_due = None;
            self.start_sweep();
        }
    }

    /// A sweep as soon as the pacing allows (after the running one).
    fn want_sweep(&mut self) {
        if self.running.is_some() {
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
                let kind = self.resync_kind.take();
                self.apply_sync(sync, kind);
                // The detectors may block on an index Consul no longer has,
                // or sleep out a backoff: both ask again from here.
                self.ctx.rebase.send_modify(|generation| *generation += 1);
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

    /// Replace everything with a full sync. `judge`: count every service
    /// it finds different from what was sent as a repair of that kind.
    pub fn apply_sync(&mut self, sync: FullSync, judge: Option<RepairKind>) {
        let FullSync { catalog, nodes, checks, reads } = sync;
        // What was sent, kept only when the sync is judged (an index reset):
        // a recovery resync at 10k services need not copy every record.
        let before: Option<HashMap<String, Service>> =
            judge.map(|_| self.services.values().filter_map(|t| t.sent.clone()).map(|s| (s.host.clone(), s)).collect());
        let mut old = std::mem::take(&mut self.services);
        self.members += 1;
        for (name, tags) in self.ctx.selected(&catalog.value, &self.selection) {
            let mut tracked = old.remove(name).unwrap_or_default();
            tracked.tags = tags.clone();
            self.services.insert(name.clone(), tracked);
        }
        self.catalog = catalog.value;
        self.catalog_body = None;
        for read in reads {
            self.apply_read(read, false);
        }
        self.catalog_index = catalog.index;
        self.sync_floor = catalog.index;
        let check_index = checks.iter().map(|c| c.index).min().unwrap_or(0);
        self.prints = checks.map(|c| c.value);
        self.nodes = nodes.value;
        self.unswept = None;
        self.suspects.clear();
        // Every change up to what the sync read is in it; a later sweep
        // must not count those as missed.
        self.seen.clear();
        self.settled = self.settled.max(catalog.index.min(nodes.index).min(check_index));
        let mut all: Vec<Service> = self.services.values().filter_map(|t| t.sent.clone()).collect();
        all.sort();
        info!(services = all.len(), index = self.catalog_index, "full sync");
        if let (Some(kind), Some(before)) = (judge, &before) {
            self.judge_sync(kind, before, &all);
        }
        self.update_degraded();
        self.ctx.sink.update(Update::Snapshot(all));
        self.report_failing();
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Catalog(answer) => self.on_catalog(answer),
            Event::Checks(state, answer) => self.on_checks(state, answer),
            Event::Nodes(answer) => self.on_nodes(answer),
            Event::Read(read) => {
                if self.in_flight.remove(&read.name) == Some(true) {
                    self.want_read(read.name.clone());
                }
                let emitted = self.apply_read(read, true);
                self.update_degraded();
                if emitted && self.ctx.health.is_degraded() {
                    // The update marked the registry healthy in the cache.
                    if let Some(e) = self.services.values().find_map(|t| t.failing.as_ref()) {
                        self.ctx.health.fail_part(e);
                    }
                }
                self.start_reads();
            }
            Event::Moved(moved) => self.on_moved(moved),
            Event::SweepDone { ok } => self.on_sweep_done(ok),
            Event::Listed(listed) => self.on_listed(listed),
            Event::Reset => self.on_reset(),
        }
    }

    fn on_catalog(&mut self, answer: Indexed<Vec<u8>>) {
        if answer.index < self.catalog_index && self.sync_floor == 0 {
            info!(index = answer.index, was = self.catalog_index, "consul's catalog index went back");
            self.on_reset();
            return;
        }
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
        if self.catalog_body.as_ref() != Some(&answer.value) {
            match self.ctx.client.decode_catalog(&answer.value) {
                Ok(catalog) => {
                    self.catalog = self.ctx.watched(catalog);
                    self.catalog_body = Some(answer.value);
                    self.set_members("service left the catalog");
                }
                Err(e) => {
                    // Unusable: what was sent stays, and a full sync reads
                    // the catalog again (paced by its backoff).
                    self.ctx.health.fail(&e);
                    self.resync_at.get_or_insert_with(Instant::now);
                    return;
                }
            }
        }
        if answer.index != self.catalog_index {
            // One answer can stand for many writes (a burst, a transaction,
            // a node deregistered), and the catalog names none of the
            // services whose instances they changed: only a sweep of every
            // service finds them all.
            self.catalog_moved();
        }
        self.catalog_index = answer.index;
        self.note_seen(answer.index);
        self.update_degraded();
    }

    /// Schedule the sweep for a catalog change. The first change after a
    /// quiet spell starts it at once (a lone change waits for nothing; the
    /// rest of a burst extends the running sweep). Otherwise after
    /// [`SWEEP_QUIET`] with no other change, at most [`SWEEP_MAX_DEFER`]
    /// after the first; at once after the running sweep, if one runs.
    fn catalog_moved(&mut self) {
        if let Some(run) = &self.running {
            // The sweep running now probes what it has not reached yet
            // after the change: extend it by a lap from there, the
            // services changed most recently first.
            let extended = run.members == self.members && {
                let urgent = self.recent_order();
                run.ctl.lock().unwrap_or_else(|e| e.into_inner()).extend(run.len, urgent)
            };
            self.sweep_again |= !extended;
            return;
        }
        let now = Instant::now();
        let quiet = self.unswept.is_none()
            && self.sweep_due.is_none()
            && self.last_sweep.is_none_or(|(ended, _)| now.duration_since(ended) >= SWEEP_QUIET);
        if quiet {
            self.want_sweep();
            return;
        }
        let first = self.unswept.map_or(now, |(first, _)| first);
        self.unswept = Some((first, (now + SWEEP_QUIET).min(first + SWEEP_MAX_DEFER)));
    }

    /// Track exactly the selected services of the last catalog: remove the
    /// others (sending a removal for what was sent, saying `why`), read the
    /// new and retagged ones.
    fn set_members(&mut self, why: &str) {
        let selected: BTreeMap<&String, &Vec<String>> = self.ctx.selected(&self.catalog, &self.selection).collect();
        let gone: Vec<String> = self.services.keys().filter(|n| !selected.contains_key(n)).cloned().collect();
        for name in gone {
            self.suspects.remove(&name);
            self.verifier.forget(&name);
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
                    self.members += 1;
                    read.push(name.clone());
                }
            }
        }
        read.into_iter().for_each(|name| self.want_read(name));
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

    fn on_checks(&mut self, state: CheckState, answer: Indexed<CheckPrints>) {
        let prints = &mut self.prints[state as usize];
        let old = std::mem::replace(prints, answer.value);
        let nodes = self.services.iter().map(|(name, t)| (name.as_str(), &t.nodes));
        let dirty = dirty_services(&old, prints, nodes);
        debug!(state = state.name(), index = answer.index, services = dirty.len(), "checks changed");
        if !dirty.is_empty() {
            self.again_in_flight();
        }
        for name in dirty {
            if self.services.contains_key(&name) {
                self.want_read(name);
            }
        }
        self.note_seen(answer.index);
    }

    /// A node's address, tagged addresses or meta changed, or a node came
    /// or went: read every service with an instance on it. Consul moves
    /// those services' indexes but not the catalog's, so nothing else
    /// would name them.
    fn on_nodes(&mut self, answer: Indexed<BTreeMap<String, u64>>) {
        let changed = changed_nodes(&self.nodes, &answer.value);
        self.nodes = answer.value;
        if !changed.is_empty() {
            let hit: Vec<String> = self
                .services
                .iter()
                .filter(|(_, t)| !t.nodes.is_disjoint(&changed))
                .map(|(name, _)| name.clone())
                .collect();
            debug!(index = answer.index, nodes = changed.len(), services = hit.len(), "nodes changed");
            self.again_in_flight();
            hit.into_iter().for_each(|name| self.want_read(name));
        }
        self.note_seen(answer.index);
    }

    /// A sweep found these services moved: read them. A periodic sweep's
    /// find at or before the index every detector had already covered is a
    /// drift suspect: its read, if it changes anything, was a missed change.
    fn on_moved(&mut self, moved: Vec<(String, u64)>) {
        let settled = self.running.as_ref().filter(|r| r.periodic).map(|r| r.settled);
        for (name, index) in moved {
            let Some(tracked) = self.services.get(&name) else { continue };
            if index != 0 && index == tracked.index && tracked.failing.is_none() {
                continue; // read at that index since the sweep began
            }
            // Any other index is worth a read, a lower one too: Consul's
            // index for it went back (a restored snapshot).
            let min = self.min_wanted.entry(name.clone()).or_default();
            *min = (*min).max(index);
            if let Some(settled) = settled
                && index > tracked.index
                && index <= settled
                && tracked.failing.is_none()
            {
                self.suspects.insert(name.clone());
            }
            self.want_read(name);
        }
    }

    fn on_sweep_done(&mut self, ok: bool) {
        let Some(run) = self.running.take() else { return };
        let now = Instant::now();
        let took = now.duration_since(run.started);
        self.last_sweep = Some((now, took));
        self.sweep_not_before = if run.follows { now + took } else { now };
        if !ok {
            // Consul failed: the recovery resync reads everything again.
            self.sweep_again = false;
            return;
        }
        if run.periodic {
            let mut all: Vec<Service> = self.services.values().filter_map(|t| t.sent.clone()).collect();
            all.sort();
            debug!(services = all.len(), ?took, "periodic snapshot");
            self.ctx.sink.update(Update::Snapshot(all));
            self.report_failing();
        }
        if std::mem::take(&mut self.sweep_again) || self.periodic_owed {
            self.want_sweep();
        }
    }

    /// Remember that a detector reported `index` now.
    fn note_seen(&mut self, index: u64) {
        if self.seen.back().is_none_or(|(_, last)| index > *last) {
            self.seen.push_back((Instant::now(), index));
        }
        // Churn with never a moment idle: forget the oldest, which only
        // makes the drift count more cautious.
        if self.seen.len() > SEEN_MAX {
            self.seen.pop_front();
        }
    }

    /// With nothing pending (no change unswept, no sweep, no read), every
    /// change a detector reported at least [`SETTLE`] ago has been read.
    fn note_if_idle(&mut self) {
        let idle = self.unswept.is_none()
            && self.running.is_none()
            && self.sweep_due.is_none()
            && self.in_flight.is_empty()
            && self.queue.is_empty()
            && self.resync_at.is_none();
        if !idle {
            return;
        }
        let Some(before) = Instant::now().checked_sub(SETTLE) else { return };
        while let Some(&(at, index)) = self.seen.front()
            && at <= before
        {
            self.settled = self.settled.max(index);
            self.seen.pop_front();
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
            let min_index = self.min_wanted.remove(&name).unwrap_or(0);
            let (ctx, tx) = (self.ctx.clone(), self.tx.clone());
            self.tasks.spawn(
                async move {
                    let read = ctx.read(name, min_index).await;
                    let _ = tx.send(Event::Read(read)).await;
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
        let asked = self.verifier.answered(&read.name);
        match read.result {
            Ok(answer) if answer.index < read.min_index => {
                // Older than the index the sweep's probe saw: a stale read
                // (a follower, a lagging server). Keep what was sent and
                // read it again.
                debug!(service = %read.name, index = answer.index, wanted = read.min_index, "stale answer; reading again");
                tracked.recheck = Some(RepairKind::StaleRead);
                self.min_wanted.insert(read.name.clone(), read.min_index);
                false
            }
            Ok(answer) => {
                let suspect = self.suspects.remove(&read.name);
                let (prev_index, was_failing) = (tracked.index, tracked.failing.is_some());
                let hint = tracked.recheck.take();
                tracked.index = answer.index;
                tracked.nodes = answer.value.nodes;
                tracked.failing = None;
                tracked.named = read.named;
                if read.unresolved > 0 {
                    // Read again with the backoff until the name resolves.
                    tracked.recheck = Some(RepairKind::NameResolution);
                }
                let service =
                    self.ctx.naming.service(&read.name, answer.value.endpoints, last_port(tracked.sent.as_ref()));
                let differs = tracked.sent.as_ref() != Some(&service);
                let found =
                    Found { differs, was_failing, hint, asked, prev_index, index: answer.index, named: read.named };
                let repair = if suspect && differs { Some(RepairKind::MissedChange) } else { judge(found) };
                if differs {
                    tracked.sent = Some(service.clone());
                    if emit {
                        if let Some(kind) = repair {
                            self.ctx.sink.repaired(kind, std::slice::from_ref(&service.host));
                        }
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

    fn update_degraded(&mut self) {
        let failing = self.services.values().any(|t| t.failing.is_some());
        let recheck = failing || self.services.values().any(|t| t.recheck.is_some());
        let was = self.ctx.health.is_degraded();
        self.ctx.health.set_degraded(failing);
        if recheck {
            if self.retry_at.is_none() {
                self.retry_at = Some(Instant::now() + self.retry_backoff.next());
            }
        } else {
            self.retry_at = None;
            self.retry_backoff.reset();
        }
        if !failing && was {
            self.ctx.health.ok();
        }
    }

    /// Tell the sink about every failing service again: an update marks the
    /// registry healthy in the cache, and it is not while one fails.
    fn report_failing(&self) {
        for e in self.services.values().filter_map(|t| t.failing.as_ref()) {
            self.ctx.health.fail_part(e);
        }
    }

    /// Probe every service for its index and read those that moved. Every
    /// sweep is whole: it cannot know how many services one catalog answer
    /// stands for. The one that pays off a periodic tick ends with a
    /// snapshot and counts drift.
    fn start_sweep(&mut self) {
        if self.running.is_some() {
            self.sweep_again = true;
            return;
        }
        let now = Instant::now();
        let periodic = std::mem::take(&mut self.periodic_owed);
        // Any catalog change so far is covered by this sweep.
        self.unswept = None;
        let follows = self.last_sweep.is_some_and(|(end, took)| now < end + took);
        let (order, first) = self.sweep_order();
        let ctl = Arc::new(std::sync::Mutex::new(SweepCtl::new(order.len())));
        self.running = Some(Running {
            started: now,
            periodic,
            settled: self.settled,
            follows,
            ctl: ctl.clone(),
            len: order.len(),
            members: self.members,
        });
        let sweep = sweep(self.ctx.clone(), self.tx.clone(), order, first, ctl);
        self.tasks.spawn(sweep.in_current_span());
    }

    /// The services changed most recently, newest first, with their index.
    fn recent_order(&self) -> Vec<(String, u64)> {
        self.recent.iter().filter_map(|name| Some((name.clone(), self.services.get(name)?.index))).collect()
    }

    /// What a sweep probes, in order, and how many of the first are the
    /// services changed most recently; then the others in catalog order.
    fn sweep_order(&self) -> (Vec<(String, u64)>, usize) {
        let mut order = Vec::with_capacity(self.services.len());
        order.extend(self.recent_order());
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

// The anti-entropy side of the supervisor: its listing, its checks, what
// a resync after an index reset repairs.
#[path = "repairs.rs"]
mod repairs;

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
