//! Consul registry watcher.
//!
//! A thin client on the binary's reqwest (one HTTP stack, rustls without
//! OpenSSL, and direct control over blocking-query `index`/`wait` and
//! `passing`) drives three kinds of loops, all children of one task:
//!
//! - a blocking query on `/v1/catalog/services`, whose changes start and stop
//!   the per-service loops (a service gone is an [`Update::Remove`]);
//! - one blocking query per service on `/v1/health/service/:name?passing`,
//!   each answer an [`Update::Upsert`] when it differs from what was sent;
//! - a periodic full resync (catalog plus every service, non-blocking) sent as
//!   an [`Update::Snapshot`], also run at startup (the ready signal) and when
//!   Consul answers again after a failure.
//!
//! Errors only ever reach [`Sink::error`]: the cache keeps the last known
//! endpoints while Consul is down. Every emission happens under one lock,
//! after checking that the service's loop is still the current one, so a
//! service removed from the catalog cannot come back from a late answer.

mod client;
pub(crate) mod decode;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, TryStreamExt, stream};
use tokio::sync::{Notify, mpsc};
use tokio::task::{AbortHandle, JoinError, JoinSet};
use tracing::{Instrument, debug, error, info, info_span};

use self::client::{Client, next_index};
use self::decode::{Naming, select_services};
use crate::retry::Backoff;
use crate::{Endpoint, RegistryError, RegistrySpec, Service, Sink, Update, Watcher, health, resolve};

/// Blocking-query `wait`. Consul's own default is 5 minutes; 30 s keeps
/// idle connections well inside common proxy and load-balancer timeouts.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);
const MIN_WAIT: Duration = Duration::from_millis(100);
const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// Consul docs, "Rate limit": a loop whose index did not advance waits at
/// least this long between queries, so a misbehaving server cannot make us
/// spin.
const MIN_QUERY_GAP: Duration = Duration::from_millis(50);
/// How often the probe asks Consul for its leader. Blocking queries can sit
/// for `wait` without a word from Consul, so without the probe an outage
/// could go unnoticed (and `healthy` stay stale) for that long.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// Health calls in flight at once during a full sync.
const SYNC_CONCURRENCY: usize = 8;

/// Watches one Consul datacenter. Built by [`crate::watcher_for`].
pub struct ConsulWatcher {
    spec: RegistrySpec,
    client: Client,
    wait: Duration,
    refresh: Duration,
}

impl ConsulWatcher {
    pub fn new(spec: RegistrySpec) -> Result<ConsulWatcher, RegistryError> {
        let client = Client::new(&spec)?;
        let refresh = spec.consul_refresh_interval.unwrap_or(DEFAULT_REFRESH).max(MIN_REFRESH);
        Ok(ConsulWatcher { spec, client, wait: DEFAULT_WAIT, refresh })
    }

    /// Use another blocking-query `wait` (at least 100 ms); tests use a short
    /// one. The HTTP timeout follows it.
    pub fn with_wait(mut self, wait: Duration) -> ConsulWatcher {
        self.wait = wait.max(MIN_WAIT);
        self
    }
}

impl Watcher for ConsulWatcher {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let span = info_span!("consul", registry = %self.spec.name);
        Box::pin(self.run_inner(sink).instrument(span))
    }
}

impl ConsulWatcher {
    async fn run_inner(self, sink: Arc<dyn Sink>) {
        let spec = &self.spec;
        let tag = spec.consul_service_tag.clone().filter(|t| !t.is_empty());
        info!(
            endpoint = %spec.endpoint(),
            datacenter = spec.consul_datacenter.as_deref().unwrap_or("(from agent)"),
            namespace = spec.consul_namespace.as_deref().unwrap_or(""),
            tag = tag.as_deref().unwrap_or(""),
            token = spec.auth.contains_key("consulToken"),
            wait = ?self.wait,
            refresh = ?self.refresh,
            "starting"
        );
        let health = Health::new(sink.clone());
        let datacenter = match spec.consul_datacenter.clone().filter(|d| !d.is_empty()) {
            Some(dc) => dc,
            None => discover_datacenter(&self.client, &health).await,
        };
        let ctx = Arc::new(Ctx {
            naming: Naming::new(spec, &datacenter),
            client: self.client,
            tag,
            wait: self.wait,
            sink,
            health,
            state: Mutex::default(),
        });
        // Dropping the watcher's future drops this set, which stops the probe.
        let mut probe = JoinSet::new();
        probe.spawn(probe_leader(ctx.clone()).in_current_span());

        let mut backoff = Backoff::default();
        let first = loop {
            match ctx.full_sync().await {
                Ok(sync) => break sync,
                Err(e) => {
                    ctx.health.fail(&e);
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        };
        let (tx, mut rx) = mpsc::channel(16);
        let mut sup = Supervisor {
            ctx: ctx.clone(),
            workers: JoinSet::new(),
            services: HashMap::new(),
            catalog: None,
            catalog_seen: 0,
            generation: 0,
            tx,
        };
        sup.apply_sync(first);
        ctx.health.ready.store(true, Ordering::SeqCst);

        let start = tokio::time::Instant::now() + self.refresh;
        let mut ticker = tokio::time::interval_at(start, self.refresh);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                Some(change) = rx.recv() => sup.on_catalog(change),
                _ = ticker.tick() => sup.resync().await,
                () = ctx.health.recovered.notified() => {
                    info!("consul answers again, resyncing");
                    sup.resync().await;
                    ticker.reset();
                }
                Some(done) = sup.workers.join_next() => on_worker_exit(done),
            }
        }
    }
}

async fn discover_datacenter(client: &Client, health: &Health) -> String {
    let mut backoff = Backoff::default();
    loop {
        match client.agent_datacenter().await {
            Ok(dc) => {
                health.ok();
                info!(datacenter = %dc, "datacenter from the agent");
                return dc;
            }
            Err(e) => {
                health.fail(&e);
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

fn on_worker_exit(done: Result<(), JoinError>) {
    // Aborted loops are the normal way services stop. A panic is a bug; the
    // next resync restarts the loop (see `Supervisor::reconcile`).
    if let Err(e) = done
        && e.is_panic()
    {
        error!(error = %e, "consul watch loop panicked");
    }
}

/// What every loop shares.
struct Ctx {
    client: Client,
    naming: Naming,
    tag: Option<String>,
    wait: Duration,
    sink: Arc<dyn Sink>,
    health: Health,
    state: Mutex<State>,
}

/// What was sent, and which loop may send for which service.
#[derive(Default)]
struct State {
    /// Service name -> generation of the health loop allowed to emit for it.
    active: HashMap<String, u64>,
    /// Service name -> the record last sent to the sink.
    sent: HashMap<String, Service>,
}

/// The result of a full, non-blocking read of the catalog and every service.
struct FullSync {
    catalog_index: u64,
    /// Name, endpoints, and the health query's `X-Consul-Index`.
    services: Vec<(String, Vec<Endpoint>, u64)>,
}

/// The filtered service set, as the catalog loop saw it at `index`.
struct CatalogChange {
    index: u64,
    names: BTreeSet<String>,
}

impl Ctx {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn full_sync(&self) -> Result<FullSync, RegistryError> {
        let started = Instant::now();
        let catalog = self.client.catalog_services(0, self.wait).await?;
        let names = select_services(&catalog.value, self.tag.as_deref());
        let services = stream::iter(names)
            .map(|name| async move {
                let answer = self.client.health_service(&name, 0, self.wait).await?;
                Ok::<_, RegistryError>((name, resolve::endpoints(answer.value).await.0, answer.index))
            })
            .buffer_unordered(SYNC_CONCURRENCY)
            .try_collect()
            .await?;
        self.health.ok();
        self.sink.synced(started.elapsed());
        Ok(FullSync { catalog_index: catalog.index, services })
    }

    /// A health answer for `name` from loop `generation`: send it if that
    /// loop is still current and the record changed. An answer that raced a
    /// resync may land after that resync's snapshot; it cannot stick, since
    /// the loop's next query (at the older index) returns at once with the
    /// newer state.
    fn apply(&self, name: &str, generation: u64, endpoints: Vec<Endpoint>, index: u64) {
        let mut st = self.state();
        if st.active.get(name) != Some(&generation) {
            return;
        }
        let service = self.naming.service(name, endpoints, last_port(st.sent.get(name)));
        if st.sent.get(name) == Some(&service) {
            return;
        }
        debug!(service = %name, index, endpoints = service.endpoints.len(), "health changed");
        st.sent.insert(name.to_string(), service.clone());
        self.sink.update(Update::Upsert(service));
    }

    /// `name` left the catalog: silence its loop and remove its host.
    fn forget(&self, name: &str) {
        let mut st = self.state();
        st.active.remove(name);
        if let Some(service) = st.sent.remove(name) {
            info!(service = %name, host = %service.host, "service left the catalog");
            self.sink.update(Update::Remove(service.host));
        }
    }
}

fn last_port(service: Option<&Service>) -> Option<u16> {
    service.and_then(|s| s.ports.first()).map(|p| p.number)
}

/// Owns the loops: the catalog loop and one health loop per service.
struct Supervisor {
    ctx: Arc<Ctx>,
    /// Dropping the watcher's future drops this set, which aborts every loop.
    workers: JoinSet<()>,
    services: HashMap<String, AbortHandle>,
    catalog: Option<AbortHandle>,
    /// Index of the catalog state last applied, to ignore a change the
    /// catalog loop queued before a newer resync was applied.
    catalog_seen: u64,
    generation: u64,
    tx: mpsc::Sender<CatalogChange>,
}

impl Supervisor {
    async fn resync(&mut self) {
        match self.ctx.full_sync().await {
            Ok(sync) => {
                self.apply_sync(sync);
                // This snapshot already is the recovery resync a failure
                // during it would ask for.
                let _ = self.ctx.health.recovered.notified().now_or_never();
            }
            Err(e) => self.ctx.health.fail(&e),
        }
    }

    fn apply_sync(&mut self, sync: FullSync) {
        let names: BTreeSet<String> = sync.services.iter().map(|(n, _, _)| n.clone()).collect();
        {
            let mut st = self.ctx.state();
            st.active.retain(|name, _| names.contains(name));
            let mut sent = HashMap::with_capacity(sync.services.len());
            for (name, endpoints, _) in &sync.services {
                let last = last_port(st.sent.get(name));
                sent.insert(name.clone(), self.ctx.naming.service(name, endpoints.clone(), last));
            }
            st.sent = sent;
            let mut all: Vec<Service> = st.sent.values().cloned().collect();
            all.sort();
            info!(services = all.len(), index = sync.catalog_index, "full sync");
            self.ctx.sink.update(Update::Snapshot(all));
        }
        self.catalog_seen = sync.catalog_index;
        let start: HashMap<&str, u64> = sync.services.iter().map(|(n, _, i)| (n.as_str(), *i)).collect();
        self.reconcile(&names, |name| start.get(name).copied().unwrap_or(0));
        if self.catalog.as_ref().is_none_or(AbortHandle::is_finished) {
            let loop_ = watch_catalog(self.ctx.clone(), sync.catalog_index, names, self.tx.clone());
            self.catalog = Some(self.workers.spawn(loop_.in_current_span()));
        }
    }

    fn on_catalog(&mut self, change: CatalogChange) {
        if change.index < self.catalog_seen {
            debug!(index = change.index, seen = self.catalog_seen, "older catalog change ignored");
            return;
        }
        self.catalog_seen = change.index;
        for name in self.services.keys().filter(|n| !change.names.contains(*n)) {
            self.ctx.forget(name);
        }
        self.reconcile(&change.names, |_| 0);
    }

    /// Run exactly one health loop per name in `names`; new loops start at
    /// `start(name)` (0: a first, non-blocking answer).
    fn reconcile(&mut self, names: &BTreeSet<String>, start: impl Fn(&str) -> u64) {
        self.services.retain(|name, handle| {
            let keep = names.contains(name);
            if !keep {
                handle.abort();
            }
            keep
        });
        for name in names {
            if self.services.get(name).is_some_and(|h| !h.is_finished()) {
                continue;
            }
            self.generation += 1;
            self.ctx.state().active.insert(name.clone(), self.generation);
            let span = info_span!("service", service = %name);
            let loop_ = watch_service(self.ctx.clone(), name.clone(), self.generation, start(name));
            let handle = self.workers.spawn(loop_.instrument(span));
            self.services.insert(name.clone(), handle);
        }
    }
}

async fn watch_catalog(ctx: Arc<Ctx>, mut index: u64, mut last: BTreeSet<String>, tx: mpsc::Sender<CatalogChange>) {
    let mut backoff = Backoff::default();
    loop {
        let started = tokio::time::Instant::now();
        match ctx.client.catalog_services(index, ctx.wait).await {
            Ok(answer) => {
                ctx.health.ok();
                backoff.reset();
                let prev = index;
                index = next_index(prev, answer.index);
                let names = select_services(&answer.value, ctx.tag.as_deref());
                if names != last {
                    debug!(index = answer.index, services = names.len(), "catalog changed");
                    last = names.clone();
                    if tx.send(CatalogChange { index: answer.index, names }).await.is_err() {
                        return;
                    }
                }
                if index <= prev {
                    tokio::time::sleep_until(started + MIN_QUERY_GAP).await;
                }
            }
            Err(e) => {
                ctx.health.fail(&e);
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

async fn watch_service(ctx: Arc<Ctx>, name: String, generation: u64, mut index: u64) {
    let mut backoff = Backoff::default();
    loop {
        let started = tokio::time::Instant::now();
        match ctx.client.health_service(&name, index, ctx.wait).await {
            Ok(answer) => {
                ctx.health.ok();
                backoff.reset();
                let prev = index;
                index = next_index(prev, answer.index);
                let (endpoints, _) = resolve::endpoints(answer.value).await;
                ctx.apply(&name, generation, endpoints, answer.index);
                if index <= prev {
                    tokio::time::sleep_until(started + MIN_QUERY_GAP).await;
                }
            }
            Err(e) => {
                ctx.health.fail(&e);
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

/// Ask Consul for its leader every [`PROBE_EVERY`], so that health is fresh
/// even while every blocking query is parked. A success after a failure
/// also triggers the recovery resync.
async fn probe_leader(ctx: Arc<Ctx>) {
    let mut ticker = tokio::time::interval(PROBE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match ctx.client.leader().await {
            Ok(_) => ctx.health.ok(),
            Err(e) => ctx.health.fail(&e),
        }
    }
}

/// Reports health to the sink and notices recovery.
struct Health {
    report: health::Health,
    /// Set once the startup snapshot is out; before that, recovery needs no
    /// extra resync.
    ready: AtomicBool,
    /// Signalled when a call succeeds after a failure.
    recovered: Notify,
}

impl Health {
    fn new(sink: Arc<dyn Sink>) -> Health {
        Health { report: health::Health::new(sink, "consul"), ready: AtomicBool::new(false), recovered: Notify::new() }
    }

    fn ok(&self) {
        if self.report.ok() && self.ready.load(Ordering::SeqCst) {
            self.recovered.notify_one();
        }
    }

    fn fail(&self, e: &RegistryError) {
        self.report.fail(e);
    }
}
