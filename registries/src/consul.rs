//! Consul registry watcher, on a bounded number of connections whatever the
//! catalog size.
//!
//! A thin client on hyper (the HTTP stack reqwest already brings, with our
//! own pool so that the connection cap is a hard bound, and direct control
//! over blocking-query `index`/`wait`) drives:
//!
//! - four **change detectors**, blocking queries on `/v1/catalog/services`
//!   (which services exist, with their tags; its index moves on every write
//!   to any service's instances), `/v1/catalog/nodes` (every node with the
//!   index of its last change), `/v1/health/state/critical` and
//!   `/v1/health/state/warning` (Consul wakes each only for checks entering
//!   or leaving its state): only the checks that fail, folded into one
//!   fingerprint per service and per node, so a check change costs bytes in
//!   proportion to the failing checks, not to every check in the
//!   datacenter;
//! - **targeted reads** of `/v1/health/service/:name` for the services a
//!   detector named: new or retagged services, services whose checks
//!   started or stopped failing, the services on a node whose node checks
//!   did, and the services on a node that changed (address, tagged
//!   addresses, meta), came or went;
//! - a **sweep** after every move of the catalog index: one answer can
//!   stand for many writes (a burst, a `/v1/txn`, a node deregistered) and
//!   names none of the services whose instances changed, so the sweep asks
//!   every service for its index alone (an empty answer) and reads all
//!   those that moved, as it finds them. Consul keeps one index per
//!   service; Consul 1.8 offers nothing narrower: its `filter` has no
//!   `ModifyIndex`, `/v1/catalog/services` ignores `filter`, and no
//!   endpoint gives several services' indexes at once. The probes go in
//!   batches pipelined on one connection each (HTTP/1.1 pipelining: one
//!   write, the answers' heads parsed in order; anything odd falls back to
//!   one request at a time), on up to the read slots less one connections
//!   at once, the services that changed most recently first. The changes
//!   of a burst share a sweep (it starts once the catalog is quiet for
//!   50 ms, at most 250 ms after the first); a change during a sweep gets
//!   one more right after it, and a sweep that followed another with no
//!   rest rests as long as it took. Every `consulRefreshInterval` a sweep
//!   ends with a snapshot, and counts as drift ([`Sink::drift`]) each
//!   service it found changed although the detectors had seen past the
//!   change (none, in a correct watcher);
//! - with a [`Selector`] (`meshbridgeWatch`), only the selected services are
//!   tracked, read and swept; the detectors still see every name, so a
//!   service that becomes selected (a new route) is read at once, and one
//!   that stops being selected is removed, without a restart;
//! - a **full sync** (catalog, checks and every service) at startup, sent as
//!   an [`Update::Snapshot`] (the ready signal), and again when Consul
//!   answers after a failure, paced by the jittered backoff.
//!
//! Every call borrows one connection of a pool of at most the connection
//! cap ([`DEFAULT_MAX_CONNS`], `MESHBRIDGE_CONSUL_MAX_CONNS`), so the watcher
//! never holds more connections than that: the four detectors hold four,
//! and reads and sweeps share the rest. Consul's default `limits.http_max_conns_per_client`
//! is 200, shared by every client on this host.
//!
//! With `registryTls` the pool's connections are TLS (tokio-rustls, ALPN
//! `http/1.1`), verified as `crate::tls` says; nothing else changes.
//!
//! Errors only ever reach [`Sink::error`]: the cache keeps the last known
//! endpoints while Consul is down. A service whose answer cannot be read is
//! skipped and reported, and retried with backoff; while one is, the
//! registry is not reported healthy.

mod budget;
mod client;
mod ctx;
pub(crate) mod decode;
mod pipeline;
mod pool;
mod supervisor;
mod sweep;
mod verify;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info, info_span, warn};

use self::client::{CheckState, Client, Indexed, next_index};
pub use self::client::{answers_read, requests_resent};
use self::ctx::{Ctx, Event};
use self::decode::{CheckPrints, Naming};
use self::supervisor::Supervisor;
use crate::health::Health;
use crate::retry::Backoff;
use crate::select::Selector;
use crate::spec::RegistrySpec;
use crate::watcher::{RegistryError, Sink, Watcher};

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
/// The connection cap unless configured: 4 detectors and 6 reads, far under
/// Consul's default 200 per client address.
pub const DEFAULT_MAX_CONNS: usize = 10;
/// The smallest usable cap: 4 detectors and 1 read.
pub const MIN_MAX_CONNS: usize = 5;
/// Environment variable that sets the connection cap when the spec does not.
pub const MAX_CONNS_ENV: &str = "MESHBRIDGE_CONSUL_MAX_CONNS";
/// Connections the four detectors hold.
const DETECTORS: usize = 4;

/// Watches one Consul datacenter. Built by [`crate::watcher_for`].
pub struct ConsulWatcher {
    spec: RegistrySpec,
    client: Client,
    wait: Duration,
    refresh: Duration,
    max_conns: usize,
    selector: Selector,
    /// The anti-entropy pass's interval ([`RegistrySpec::anti_entropy`]).
    anti_entropy: Duration,
}

impl ConsulWatcher {
    pub fn new(spec: RegistrySpec) -> Result<ConsulWatcher, RegistryError> {
        let max_conns = match spec.consul_max_conns {
            Some(n) => n,
            None => max_conns_from_env(&spec.name)?,
        }
        .max(MIN_MAX_CONNS);
        let client = Client::new(&spec, max_conns)?;
        let refresh = spec.consul_refresh_interval.unwrap_or(DEFAULT_REFRESH).max(MIN_REFRESH);
        let anti_entropy = spec.anti_entropy();
        Ok(ConsulWatcher {
            spec,
            client,
            wait: DEFAULT_WAIT,
            refresh,
            max_conns,
            selector: Selector::all(),
            anti_entropy,
        })
    }

    /// Use another blocking-query `wait` (at least 100 ms); tests use a short
    /// one. The HTTP timeout follows it.
    pub fn with_wait(mut self, wait: Duration) -> ConsulWatcher {
        self.wait = wait.max(MIN_WAIT);
        self
    }

    /// Read only the services `selector` selects (the detectors still see
    /// every name).
    pub fn with_selector(mut self, selector: Selector) -> ConsulWatcher {
        self.selector = selector;
        self
    }

    /// Probe service indexes one request at a time instead of pipelined:
    /// for the bench, to measure what pipelining gains the sweeps.
    pub fn without_pipelining(mut self) -> ConsulWatcher {
        self.client.set_pipelining(false);
        self
    }

    /// The most connections this watcher holds to Consul.
    pub fn max_conns(&self) -> usize {
        self.max_conns
    }
}

/// [`MAX_CONNS_ENV`], else [`DEFAULT_MAX_CONNS`].
fn max_conns_from_env(registry: &str) -> Result<usize, RegistryError> {
    parse_max_conns(registry, std::env::var(MAX_CONNS_ENV).ok())
}

fn parse_max_conns(registry: &str, value: Option<String>) -> Result<usize, RegistryError> {
    match value {
        None => Ok(DEFAULT_MAX_CONNS),
        Some(v) => {
            v.trim().parse::<usize>().ok().filter(|n| *n >= MIN_MAX_CONNS).ok_or_else(|| RegistryError::Config {
                registry: registry.to_string(),
                field: MAX_CONNS_ENV.to_string(),
                reason: format!("must be a whole number of at least {MIN_MAX_CONNS}"),
            })
        }
    }
}

impl Watcher for ConsulWatcher {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let span = info_span!("consul", registry = %self.spec.name);
        Box::pin(self.run_inner(sink).instrument(span))
    }
}

impl ConsulWatcher {
    async fn run_inner(mut self, sink: Arc<dyn Sink>) {
        let spec = &self.spec;
        let tag = spec.consul_service_tag.clone().filter(|t| !t.is_empty());
        let namespace = spec.consul_namespace.clone().filter(|n| !n.is_empty());
        info!(
            endpoint = %spec.endpoint(),
            datacenter = spec.consul_datacenter.as_deref().unwrap_or("(from agent)"),
            namespace = namespace.as_deref().unwrap_or(""),
            tag = tag.as_deref().unwrap_or(""),
            token = spec.auth.contains_key("consulToken"),
            wait = ?self.wait,
            refresh = ?self.refresh,
            anti_entropy = ?self.anti_entropy,
            max_conns = self.max_conns,
            selective = !self.selector.is_all(),
            "starting"
        );
        let health = Health::new(sink.clone(), "consul");
        let given_dc = spec.consul_datacenter.clone().filter(|d| !d.is_empty());
        let datacenter = match (&given_dc, &namespace) {
            (Some(dc), None) => dc.clone(),
            _ => {
                let agent = discover_agent(&self.client, &health).await;
                if namespace.is_some() {
                    self.client.set_namespace(namespace_for(&agent, namespace.clone()));
                }
                given_dc.clone().unwrap_or(agent.datacenter)
            }
        };
        let ctx = Arc::new(Ctx {
            naming: Naming::new(&self.spec, &datacenter),
            client: self.client,
            tag,
            wait: self.wait,
            read_slots: self.max_conns.saturating_sub(DETECTORS).max(1),
            sink,
            health,
            seq: AtomicU64::new(0),
            rebase: tokio::sync::watch::Sender::new(0),
        });
        // Dropping the watcher's future drops this set, which stops the
        // probe and the detectors.
        let mut background = JoinSet::new();
        background.spawn(probe_leader(ctx.clone()).in_current_span());

        let mut selector = self.selector;
        let selection = selector.current();
        let mut backoff = Backoff::default();
        let first = loop {
            match ctx.full_sync(&selection).await {
                Ok(sync) => break sync,
                Err(e) => {
                    ctx.health.fail(&e);
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        };
        let (tx, rx) = mpsc::channel(64);
        background.spawn(watch_catalog(ctx.clone(), first.catalog.index, tx.clone()).in_current_span());
        for (state, checks) in CheckState::ALL.into_iter().zip(&first.checks) {
            background.spawn(watch_checks(ctx.clone(), state, checks.index, tx.clone()).in_current_span());
        }
        background.spawn(watch_nodes(ctx.clone(), first.nodes.index, tx.clone()).in_current_span());
        let mut sup = Supervisor::new(ctx.clone(), tx, selector, selection, self.anti_entropy);
        sup.apply_sync(first, None);
        // Failures before the first snapshot need no recovery resync.
        let _ = futures::FutureExt::now_or_never(ctx.health.recovered.notified());
        sup.run(rx, self.refresh, background).await;
    }
}

/// The namespace to send: the spec's against Consul Enterprise; none against
/// Consul CE, which has no namespaces and answers `ns` with 400
/// (hashicorp/consul#17610), so it is ignored there (as Higress does), with
/// one warning per watcher start.
fn namespace_for(agent: &client::Agent, namespace: Option<String>) -> Option<String> {
    let ns = namespace?;
    if agent.is_enterprise() {
        return Some(ns);
    }
    warn!(namespace = %ns, version = %agent.version, "consulNamespace ignored: namespaces need Consul Enterprise");
    None
}

async fn discover_agent(client: &Client, health: &Health) -> client::Agent {
    let mut backoff = Backoff::default();
    loop {
        match client.agent().await {
            Ok(agent) => {
                health.ok();
                info!(datacenter = %agent.datacenter, version = %agent.version, "agent");
                return agent;
            }
            Err(e) => {
                health.fail(&e);
                tokio::time::sleep(backoff.next()).await;
            }
        }
    }
}

/// A blocking query loop: `query(index)` until the index moves, then `send`
/// the answer. Index rules from Consul's "Blocking Queries".
async fn detect<T, Q, F>(ctx: Arc<Ctx>, what: &str, mut index: u64, tx: mpsc::Sender<Event>, query: Q, wrap: F)
where
    Q: Fn(Arc<Ctx>, u64) -> Answer<T>,
    F: Fn(Indexed<T>) -> Event,
{
    let mut backoff = Backoff::default();
    let mut rebase = ctx.rebase.subscribe();
    // The last index Consul answered: one below it is a reset (a restored
    // snapshot, a rebuilt cluster), whatever the index asked with.
    let mut seen = index;
    loop {
        let started = tokio::time::Instant::now();
        let answer = tokio::select! {
            answer = query(ctx.clone(), index) => answer,
            Ok(()) = rebase.changed() => {
                // A resync: ask again from 0 (see `Ctx::rebase`).
                (index, seen) = (0, 0);
                backoff.reset();
                continue;
            }
        };
        match answer {
            Ok(answer) => {
                ctx.health.ok();
                backoff.reset();
                let prev = index;
                if prev != 0 && answer.index == prev && started.elapsed() < ctx.wait / 2 {
                    // Consul ends a blocking query early, with the index it
                    // was given, when its state store is replaced (a
                    // snapshot restore: `AbandonCh`); the new store's index
                    // may be far below, where this query would block for a
                    // whole `wait`. Ask for the current index once: a lower
                    // one is a reset the supervisor acts on.
                    debug!(what, index, "blocking query ended early with no change; asking from 0");
                    index = 0;
                    tokio::time::sleep_until(started + MIN_QUERY_GAP).await;
                    continue;
                }
                if answer.index < seen {
                    info!(what, index = answer.index, was = seen, "consul's index went back: a reset");
                    if tx.send(Event::Reset).await.is_err() {
                        return;
                    }
                }
                seen = answer.index;
                index = next_index(prev, answer.index);
                if answer.index != prev {
                    debug!(what, index = answer.index, "changed");
                    if tx.send(wrap(answer)).await.is_err() {
                        return;
                    }
                }
                if index <= prev {
                    tokio::time::sleep_until(started + MIN_QUERY_GAP).await;
                }
            }
            Err(e) => {
                ctx.health.fail(&e);
                tokio::select! {
                    () = tokio::time::sleep(backoff.next()) => {}
                    Ok(()) = rebase.changed() => {
                        (index, seen) = (0, 0);
                        backoff.reset();
                    }
                }
            }
        }
    }
}

/// A boxed answer of one detector query.
type Answer<T> = Pin<Box<dyn Future<Output = Result<Indexed<T>, RegistryError>> + Send>>;

async fn watch_catalog(ctx: Arc<Ctx>, index: u64, tx: mpsc::Sender<Event>) {
    let query = |ctx: Arc<Ctx>, index: u64| -> Answer<Vec<u8>> {
        Box::pin(async move { ctx.client.catalog_services_body(index, ctx.wait).await })
    };
    detect(ctx, "catalog", index, tx, query, Event::Catalog).await;
}

async fn watch_checks(ctx: Arc<Ctx>, state: CheckState, index: u64, tx: mpsc::Sender<Event>) {
    let query = move |ctx: Arc<Ctx>, index: u64| -> Answer<CheckPrints> {
        Box::pin(async move { ctx.client.checks_in(state, index, ctx.wait).await })
    };
    detect(ctx, state.name(), index, tx, query, move |answer| Event::Checks(state, answer)).await;
}

async fn watch_nodes(ctx: Arc<Ctx>, index: u64, tx: mpsc::Sender<Event>) {
    let query = |ctx: Arc<Ctx>, index: u64| -> Answer<BTreeMap<String, u64>> {
        Box::pin(async move { ctx.client.catalog_nodes(index, ctx.wait).await })
    };
    detect(ctx, "nodes", index, tx, query, Event::Nodes).await;
}

/// Ask Consul for its leader every [`PROBE_EVERY`], so that health is fresh
/// even while both detectors are parked. A success after a failure also
/// triggers the recovery resync.
async fn probe_leader(ctx: Arc<Ctx>) {
    let mut ticker = tokio::time::interval(PROBE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match ctx.client.leader().await {
            Ok(_) => {
                ctx.health.ok();
            }
            Err(e) => ctx.health.fail(&e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_cap_from_the_environment() {
        assert_eq!(parse_max_conns("c", None), Ok(DEFAULT_MAX_CONNS));
        assert_eq!(parse_max_conns("c", Some(" 16 ".into())), Ok(16));
        for bad in ["4", "0", "-1", "many", ""] {
            let err = parse_max_conns("c", Some(bad.into())).unwrap_err();
            assert!(err.to_string().contains(MAX_CONNS_ENV), "{err}");
        }
        let mut spec = RegistrySpec::new(crate::RegistryKind::Consul, "c", "127.0.0.1", 8500);
        spec.consul_max_conns = Some(1);
        assert_eq!(ConsulWatcher::new(spec).unwrap().max_conns(), MIN_MAX_CONNS, "raised to the minimum");
    }
}
