//! Nacos registry watcher: `type: nacos` over the 1.x HTTP open API,
//! `type: nacos2` and `nacos3` over gRPC with our own client (`nacos/grpc.rs`,
//! `nacos/wire.rs`: one HTTP/2 connection, no task per service).
//!
//! Both read the same things through one small trait, [`Api`], and share one
//! loop (a [`Session`] per client):
//!
//! - a full sync: list the services of every group in `nacosGroups` (default
//!   `DEFAULT_GROUP`) of the namespace `nacosNamespaceId` (default `public`),
//!   then read every service's instances, and send it all as one
//!   [`Update::Snapshot`] (the first one is the ready signal), after an
//!   [`Update::Remove`] for each service that left. It runs at start, when
//!   Nacos answers again after a failure and, over HTTP (no pushes), every
//!   `nacosRefreshInterval` (default 30 s, at least 1 s);
//! - with gRPC, every `nacosRefreshInterval` lists the services again and
//!   reads only the new ones and those without a subscription (an
//!   [`Update::Upsert`] for each that changed, a [`Update::Remove`] for each
//!   that left). Nacos pushes every change of a subscribed service; every
//!   anti-entropy interval (`--anti-entropy-interval`, [`RegistrySpec::anti_entropy`])
//!   a full read of every service is the safety net for one it does not
//!   push (rnacos does not push a health change made by a heartbeat), its
//!   differences judged by [`missed_push`]. Re-reading 10,000 services every
//!   30 s cost 10,000 requests and a 10,000-service snapshot each time
//!   (BENCHMARKS.md "Nacos at 10k"). The client does not poll subscribed
//!   services (nacos-sdk, used before, polled each every 60 s);
//! - with a [`Selector`] (`meshbridgeWatch`), only the selected services of
//!   the listing are read and subscribed to; a new selection lists again at
//!   once and reads only the newly selected services, removing and
//!   unsubscribing from those no longer selected;
//! - with gRPC, a subscription per service whose pushes queue that service
//!   for one of [`CONCURRENCY`] workers, which asks the server again unless
//!   the push announced the very endpoints already sent (see
//!   [`pushed`]): no task per service. A read that fails queues the
//!   service again after a backoff;
//! - a service whose read a sync refuses keeps its last record (the error
//!   is reported); a later sync that reads it changed counts a
//!   [`RepairKind::Unreadable`] repair;
//! - a health probe, a real service list call per group for its first
//!   [`api::PROBE_PAGE`] names (for gRPC after a TCP connect to the gRPC
//!   port, which fails at once while the server is down), every
//!   [`PROBE_EVERY`] (500 ms) and before every listing. Each group's count
//!   and a digest of those names ([`Probe`]) other than the last listing's
//!   probe lists again and reads only the new services, so a new service in
//!   any group, or one swapped for another, is served within a probe period
//!   and a listing, not a refresh interval
//!   (Nacos pushes nothing for a new service; a swap beyond the first page
//!   of a larger group waits for the refresh). The gRPC
//!   client also checks its connection itself and reconnects on its own,
//!   and a reconnect triggers a probe (and so the recovery resync) at once;
//! - with `nacosAddressServer`, the server list is re-read every refresh
//!   interval; a new list means a new client.
//!
//! Errors only ever reach [`Sink::error`]: while Nacos is unreachable the
//! cache keeps the last known endpoints. An answer, even an empty one,
//! replaces them. Answers are numbered when asked for, so an older answer
//! never overwrites a newer one (a push-triggered read racing a full sync).

mod api;
mod auth;
pub(crate) mod decode;
mod grpc;
mod health;
mod http;
mod pushed;
mod servers;
#[cfg(feature = "testing")]
pub mod testing;
mod wire;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, stream};
use tokio::task::JoinSet;
use tracing::{Instrument, debug, info, info_span, warn};

use self::api::{Api, Probe, is_auth_error};
use self::auth::Auth;
use self::decode::{DEFAULT_GROUP, Endpoints, Instance, Naming, PUBLIC_NAMESPACE, ServiceKey, endpoints, is_watched};
use self::grpc::{GrpcApi, grpc_reachable};
use self::health::Health;
use self::http::HttpApi;
use self::pushed::Pushed;
use self::servers::Servers;
use crate::model::Service;
use crate::repair::{self, RepairKind};
use crate::retry::Backoff;
use crate::select::{Selection, Selector};
use crate::spec::{RegistryKind, RegistrySpec};
use crate::watcher::{RegistryError, Sink, Update, Watcher};
use crate::worker::{last_port, on_worker_exit};

const DEFAULT_REFRESH: Duration = Duration::from_secs(30);
const MIN_REFRESH: Duration = Duration::from_secs(1);
/// How often the health probe asks each group for its count and first
/// names. Nacos announces no new service, so this period is how late a new
/// service can be: a probe costs one small call per group (a page of
/// [`api::PROBE_PAGE`] names), and the server pages its name set for it.
const PROBE_EVERY: Duration = Duration::from_millis(500);
/// Subscriptions in flight at once, and readers of pushed services (a
/// full read's reads in flight are its [`Api::READS_IN_FLIGHT`]).
const CONCURRENCY: usize = 8;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Calls refused for credentials this many times in a row, although every
/// one was made with a token just obtained: the client gets rebuilt.
const AUTH_FAILURES_BEFORE_RECONNECT: u32 = 2;
/// A client that lasted this long resets the backoff between clients.
const SESSION_RESETS_BACKOFF: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Nacos 1.x open API.
    Http,
    /// Nacos 2.x/3.x gRPC, our own client (`nacos/grpc.rs`).
    Grpc,
}

/// Watches one Nacos namespace. Built by [`crate::watcher_for`].
pub struct NacosWatcher {
    spec: RegistrySpec,
    protocol: Protocol,
    refresh: Duration,
    /// Push clients read every service again at this interval
    /// (`--anti-entropy-interval`); see the module doc.
    anti_entropy: Duration,
    groups: Vec<String>,
    namespace_id: String,
    http: reqwest::Client,
    servers: Servers,
    auth: Auth,
    selector: Selector,
}

impl NacosWatcher {
    pub fn new(spec: RegistrySpec) -> Result<NacosWatcher, RegistryError> {
        let protocol = match spec.kind {
            RegistryKind::Nacos => Protocol::Http,
            RegistryKind::Nacos2 | RegistryKind::Nacos3 => Protocol::Grpc,
            other => {
                return Err(RegistryError::Config {
                    registry: spec.name.clone(),
                    field: "type".into(),
                    reason: format!("{other} is not a Nacos registry"),
                });
            }
        };
        let http = crate::tls::http_client(&spec.name, spec.tls.as_ref())?
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| RegistryError::Config {
                registry: spec.name.clone(),
                field: "type".into(),
                reason: format!("HTTP client: {e}"),
            })?;
        let mut groups: Vec<String> = Vec::new();
        for g in spec.nacos_groups.iter().map(|g| g.trim()).filter(|g| !g.is_empty()) {
            if !groups.iter().any(|have| have == g) {
                groups.push(g.to_string());
            }
        }
        if groups.is_empty() {
            groups.push(DEFAULT_GROUP.to_string());
        }
        let namespace_id = spec
            .nacos_namespace_id
            .clone()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| PUBLIC_NAMESPACE.to_string());
        Ok(NacosWatcher {
            refresh: spec.nacos_refresh_interval.unwrap_or(DEFAULT_REFRESH).max(MIN_REFRESH),
            anti_entropy: spec.anti_entropy(),
            servers: Servers::new(&spec, http.clone())?,
            auth: Auth::new(&spec, http.clone())?,
            protocol,
            groups,
            namespace_id,
            http,
            spec,
            selector: Selector::all(),
        })
    }

    /// Read and subscribe to only the services `selector` selects (the
    /// service lists are still read whole: they are names only).
    pub fn with_selector(mut self, selector: Selector) -> NacosWatcher {
        self.selector = selector;
        self
    }
}

impl Watcher for NacosWatcher {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let span = info_span!("nacos", registry = %self.spec.name, kind = %self.spec.kind);
        Box::pin(self.run_inner(sink).instrument(span))
    }
}

/// Why a session ended.
enum End {
    /// The address server lists other servers.
    Servers(Vec<String>),
    /// The client is beyond repair (tokens refused right after login).
    Reconnect,
}

impl NacosWatcher {
    async fn run_inner(mut self, sink: Arc<dyn Sink>) {
        info!(
            servers = %self.spec.nacos_address_server.as_deref().map_or_else(|| self.spec.endpoint(), String::from),
            namespace = %self.namespace_id,
            groups = ?self.groups,
            login = self.auth.has_login(),
            access_key = self.auth.has_signer(),
            refresh = ?self.refresh,
            anti_entropy = ?self.anti_entropy,
            selective = !self.selector.is_all(),
            "starting"
        );
        let ctx = Arc::new(Ctx {
            naming: Naming::new(&self.spec),
            groups: self.groups.clone(),
            refresh: self.refresh,
            anti_entropy: self.anti_entropy,
            health: Health::new(sink.clone()),
            sink,
            state: Mutex::default(),
            seq: AtomicU64::new(0),
            selection: Mutex::new(self.selector.current()),
        });
        let auth = Arc::new(self.auth);
        let registry = self.spec.name.clone();
        let mut backoff = Backoff::default();
        let mut next: Option<Vec<String>> = None;
        loop {
            let list = match next.take() {
                Some(list) => list,
                None => match self.servers.fetch().await {
                    Ok(list) => list,
                    Err(e) => {
                        ctx.health.fail(&e);
                        tokio::time::sleep(backoff.next()).await;
                        continue;
                    }
                },
            };
            let end = match self.protocol {
                Protocol::Http => {
                    let api = HttpApi::new(
                        self.http.clone(),
                        list.clone(),
                        self.namespace_id.clone(),
                        registry.clone(),
                        auth.clone(),
                    )
                    .with_timeout(self.spec.nacos_timeout)
                    .with_tls(self.spec.tls.is_some());
                    Session::new(api, ctx.clone()).run(&self.servers, &list, &mut self.selector).await
                }
                Protocol::Grpc => {
                    let tls = self.spec.tls.as_ref();
                    let api = match connect(&registry, &list, &self.namespace_id, &auth, tls).await {
                        Ok(api) => api.with_call_timeout(self.spec.nacos_timeout),
                        Err(e) => {
                            ctx.health.fail(&e);
                            tokio::time::sleep(backoff.next()).await;
                            continue;
                        }
                    };
                    info!(servers = ?list, "connected");
                    let started = Instant::now();
                    let api = Arc::new(api);
                    let end = Session::new_shared(api.clone(), ctx.clone())
                        .run(&self.servers, &list, &mut self.selector)
                        .await;
                    // Dropping the client closes its connection and ends its
                    // tasks.
                    drop(api);
                    if started.elapsed() > SESSION_RESETS_BACKOFF {
                        backoff.reset();
                    }
                    end
                }
            };
            match end {
                End::Servers(list) => {
                    info!(servers = ?list, "the address server lists other servers: new client");
                    backoff.reset();
                    next = Some(list);
                }
                End::Reconnect => {
                    warn!("credentials refused right after login: new client");
                    tokio::time::sleep(backoff.next()).await;
                }
            }
        }
    }
}

/// Connect over gRPC, once some server accepts TCP on its gRPC port (a
/// refused port fails fast, with a plain reason).
async fn connect(
    registry: &str,
    servers: &[String],
    namespace_id: &str,
    auth: &Arc<Auth>,
    tls: Option<&crate::tls::RegistryTls>,
) -> Result<GrpcApi, RegistryError> {
    grpc_reachable(registry, servers, CONNECT_TIMEOUT).await?;
    GrpcApi::connect(registry, servers.to_vec(), namespace_id, auth.clone(), tls).await
}

/// What every loop of a watcher shares, across clients.
struct Ctx {
    naming: Naming,
    groups: Vec<String>,
    refresh: Duration,
    anti_entropy: Duration,
    sink: Arc<dyn Sink>,
    health: Health,
    state: Mutex<State>,
    /// Numbers answers in the order they were asked for.
    seq: AtomicU64,
    /// Which services are read and subscribed to.
    selection: Mutex<Selection>,
}

#[derive(Default)]
struct State {
    services: HashMap<ServiceKey, Tracked>,
    /// The newest listing applied ([`Read::listed_at`]). A full read takes
    /// seconds at 10k services and the probes' listings go on beside it, so
    /// a listing can end after a newer one: it then adds and removes no
    /// service (the newer one saw what came and went since), and only
    /// updates the services still tracked.
    listed_at: u64,
    /// What the probe saw of every group (in `groups` order) just before
    /// that listing: a probe that sees otherwise lists again at once, so a
    /// new service in any group is read within a probe period, not a
    /// refresh interval. `None` before any listing.
    probed: Option<Vec<Probe>>,
}

/// A watched service: the record last sent and the number of the answer it
/// came from.
struct Tracked {
    seq: u64,
    sent: Service,
    /// What the last push a reader took announced (push clients; see
    /// [`missed_push`]).
    announced: Option<Announced>,
    /// Its last read in a sync was refused (it kept this record): a later
    /// sync's read that differs is counted as [`RepairKind::Unreadable`].
    unreadable: bool,
}

/// A push's announcement, as a digest of the service it makes and the
/// number it was taken as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Announced {
    digest: u64,
    seq: u64,
}

fn digest(service: &Service) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(service, &mut h);
    std::hash::Hasher::finish(&h)
}

/// Drift rule for the push clients (issue 24): a periodic full read found
/// `read` (asked for as number `read_seq`) where the watcher had sent
/// something else. That is a miss only when a push announcing exactly
/// `read` was taken by a reader before the full read asked, and that
/// service is neither queued nor being read now: the watcher received the
/// change and did not apply it. Anything else may be a change the server
/// has not pushed yet (a race with the read), or one it never pushes
/// (rnacos does not push a health change made by a heartbeat; that is what
/// the full read is the safety net for), and is not counted.
fn missed_push(announced: Option<Announced>, read: &Service, read_seq: u64, pending: bool) -> bool {
    !pending && announced.is_some_and(|a| a.seq < read_seq && a.digest == digest(read))
}

/// One service's answer in a full sync; `None` when the server refused that
/// service alone or it was not read (it keeps its last record).
type Answer = (ServiceKey, u64, Option<Endpoints>);

/// What a sync read.
struct Read {
    /// A number taken after its probe and before it listed ([`State::listed_at`]).
    listed_at: u64,
    /// Its probe, taken just before it listed ([`State::probed`]).
    probed: Vec<Probe>,
    answers: Vec<Answer>,
}

/// Which of the services already tracked a sync keeps without reading.
type Keep<'a> = dyn Fn(&ServiceKey) -> bool + Sync + 'a;

impl Ctx {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// List every group, then read every service. Unreachable and credential
    /// failures fail the whole sync; any other refusal of one service keeps
    /// that service as it was, so one odd service cannot stop the rest.
    /// Services already tracked for which `keep` says so are not read again
    /// (their answer is `None`: kept as they are).
    async fn full_sync<A: Api>(&self, api: &A, keep: &Keep<'_>) -> Result<Read, RegistryError> {
        // The probe fails fast while the server is down, rather than every
        // read failing on its own. Taken before the listing, so a change
        // made after it shows at the next probe.
        let probed = self.probe(api).await?;
        let listed_at = self.next_seq();
        let mut keys = BTreeSet::new();
        let selection = self.selection.lock().unwrap_or_else(PoisonError::into_inner).clone();
        for group in &self.groups {
            let names = api.list_services(group).await?;
            let listed = names.into_iter().filter(|n| is_watched(n)).map(|n| ServiceKey::new(group.clone(), n));
            keys.extend(listed.filter(|key| selection.is_all() || selection.wants(&self.naming.host(key))));
        }
        let mut out = Vec::with_capacity(keys.len());
        {
            let st = self.state();
            keys.retain(|key| {
                let kept = st.services.contains_key(key) && keep(key);
                if kept {
                    out.push((key.clone(), 0, None));
                }
                !kept
            });
        }
        let answers: Vec<(ServiceKey, u64, Result<Endpoints, RegistryError>)> = stream::iter(keys)
            .map(|key| async move {
                let seq = self.next_seq();
                let answer = match api.instances(&key).await {
                    Ok(instances) => Ok(resolve(endpoints(instances)).await),
                    Err(e) => Err(e),
                };
                (key, seq, answer)
            })
            .buffer_unordered(A::READS_IN_FLIGHT)
            .collect()
            .await;
        for (key, seq, answer) in answers {
            match answer {
                Ok(decoded) => out.push((key, seq, Some(decoded))),
                Err(e @ (RegistryError::Unreachable { .. } | RegistryError::Config { .. })) => return Err(e),
                Err(e) if is_auth_error(&e) => return Err(e),
                Err(e) => {
                    warn!(service = %key, error = %e, "keeping the last known state of this service");
                    self.health.fail(&e);
                    if let Some(tracked) = self.state().services.get_mut(&key) {
                        tracked.unreadable = true;
                    }
                    out.push((key, seq, None));
                }
            }
        }
        self.health.ok();
        Ok(Read { listed_at, probed, answers: out })
    }

    /// Probe every group, in `groups` order.
    async fn probe<A: Api>(&self, api: &A) -> Result<Vec<Probe>, RegistryError> {
        futures::future::try_join_all(self.groups.iter().map(|group| api.probe(group))).await
    }

    /// Whether `probes` saw the groups as the last listing's probe did.
    fn probed_as_listed(&self, probes: &[Probe]) -> bool {
        self.state().probed.as_deref() == Some(probes)
    }

    /// A full sync, applied: one [`Update::Snapshot`], after an
    /// [`Update::Remove`] for each service that left the registry.
    /// With `judge` (a periodic full read of a push client), services that
    /// differ from what was sent are judged for drift ([`missed_push`]).
    async fn sync<A: Api>(&self, api: &A, judge: Option<&Pushed>) -> Result<(), RegistryError> {
        let started = Instant::now();
        let answers = self.full_sync(api, &|_| false).await?;
        let read = answers.answers.len();
        self.apply_sync(answers, true, judge);
        debug!(services = read, took = ?started.elapsed(), "full sync");
        self.sink.synced(started.elapsed());
        Ok(())
    }

    /// List again and read only the services not tracked yet and those for
    /// which `keep` says no; send only what changed.
    async fn refresh<A: Api>(&self, api: &A, keep: &Keep<'_>) -> Result<(), RegistryError> {
        let started = Instant::now();
        let answers = self.full_sync(api, keep).await?;
        let read = answers.answers.iter().filter(|(_, _, a)| a.is_some()).count();
        self.apply_sync(answers, false, None);
        debug!(read, took = ?started.elapsed(), "listed again");
        Ok(())
    }

    /// A new selection: list again, read only the newly selected services,
    /// remove the ones no longer selected; the others are kept unread.
    async fn reselect<A: Api>(&self, api: &A) -> Result<(), RegistryError> {
        let answers = self.full_sync(api, &|_| true).await?;
        self.apply_sync(answers, true, None);
        Ok(())
    }

    /// Apply the answers of a sync: services not answered for leave, unless
    /// a newer listing was applied already ([`State::listed_at`]). With
    /// `snapshot`, all are sent as one [`Update::Snapshot`]; otherwise only
    /// the ones that changed, one [`Update::Upsert`] each.
    fn apply_sync(&self, read: Read, snapshot: bool, judge: Option<&Pushed>) {
        let Read { listed_at, probed, answers } = read;
        let mut st = self.state();
        let newest = listed_at > st.listed_at;
        if newest {
            st.listed_at = listed_at;
            st.probed = Some(probed);
        }
        let mut old = std::mem::take(&mut st.services);
        let (mut skipped, mut dropped_labels) = (0, 0);
        let mut changed = Vec::new();
        let mut drifted = Vec::new();
        let mut unreadable = Vec::new();
        for (key, seq, decoded) in answers {
            let prev = old.remove(&key);
            if prev.is_none() && !newest {
                continue;
            }
            let tracked = match (prev, decoded) {
                // A newer answer (from a push) already arrived, or the server
                // refused this service just now: keep what we have.
                (Some(prev), Some(_)) if prev.seq > seq => prev,
                (Some(prev), None) => prev,
                (None, None) => continue,
                (prev, Some(decoded)) => {
                    skipped += decoded.skipped;
                    dropped_labels += decoded.dropped_labels;
                    let last = last_port(prev.as_ref().map(|p| &p.sent));
                    let sent = self.naming.service(&key, decoded, last);
                    let announced = prev.as_ref().and_then(|p| p.announced);
                    if let Some(prev) = &prev
                        && repair::differs(Some(&prev.sent), Some(&sent))
                    {
                        if prev.unreadable {
                            unreadable.push(sent.host.clone());
                        } else if let Some(pushed) = judge
                            && missed_push(announced, &sent, seq, pushed.pending(&key))
                        {
                            drifted.push(sent.host.clone());
                        }
                    }
                    if !snapshot && prev.is_none_or(|p| p.sent != sent) {
                        changed.push(sent.clone());
                    }
                    Tracked { seq, sent, announced, unreadable: false }
                }
            };
            st.services.insert(key, tracked);
        }
        if !drifted.is_empty() {
            drifted.sort();
            self.sink.repaired(RepairKind::MissedChange, &drifted);
        }
        if !unreadable.is_empty() {
            unreadable.sort();
            self.sink.repaired(RepairKind::Unreadable, &unreadable);
        }
        for (key, gone) in old {
            if !newest {
                st.services.insert(key, gone);
                continue;
            }
            info!(service = %key, host = %gone.sent.host, "service left the registry");
            self.sink.update(Update::Remove(gone.sent.host));
        }
        if !snapshot {
            debug!(changed = changed.len(), skipped, dropped_labels, "changed services");
            for service in changed {
                self.sink.update(Update::Upsert(service));
            }
            return;
        }
        let mut all: Vec<Service> = st.services.values().map(|t| t.sent.clone()).collect();
        all.sort();
        debug!(services = all.len(), skipped, dropped_labels, "snapshot");
        self.sink.update(Update::Snapshot(all));
    }

    /// Whether the instances a push announced make exactly the service
    /// already sent. If so, that counts as an answer asked for now: a read
    /// asked for earlier and answered later is older and is not applied.
    /// Host names are never compared (they must be resolved: read).
    fn already_sent(&self, key: &ServiceKey, announced: Vec<Instance>) -> bool {
        let decoded = endpoints(announced);
        if decoded.endpoints.iter().any(|e| e.address.parse::<IpAddr>().is_err()) {
            return false;
        }
        let mut st = self.state();
        let Some(tracked) = st.services.get_mut(key) else {
            return false;
        };
        let service = self.naming.service(key, decoded, last_port(Some(&tracked.sent)));
        let seq = self.next_seq();
        tracked.announced = Some(Announced { digest: digest(&service), seq });
        if service != tracked.sent {
            return false;
        }
        tracked.seq = seq;
        true
    }

    /// One service's answer, asked for as number `seq`.
    fn apply_one(&self, key: &ServiceKey, seq: u64, decoded: Endpoints) {
        let mut st = self.state();
        let Some(tracked) = st.services.get_mut(key) else {
            return;
        };
        if tracked.seq > seq {
            return;
        }
        let service = self.naming.service(key, decoded, last_port(Some(&tracked.sent)));
        tracked.seq = seq;
        tracked.unreadable = false;
        if tracked.sent != service {
            debug!(service = %key, endpoints = service.endpoints.len(), "instances changed");
            tracked.sent = service.clone();
            self.sink.update(Update::Upsert(service));
        }
    }

    fn keys(&self) -> BTreeSet<ServiceKey> {
        self.state().services.keys().cloned().collect()
    }

    fn tracks(&self, key: &ServiceKey) -> bool {
        self.state().services.contains_key(key)
    }
}

/// A full read in progress ([`Session::full_read`]).
type FullRead = Pin<Box<dyn Future<Output = Result<(), RegistryError>> + Send>>;

/// One client's life: the loops of one [`Api`].
struct Session<A: Api> {
    api: Arc<A>,
    ctx: Arc<Ctx>,
    /// The push readers (push clients only). Dropping the session aborts them.
    workers: JoinSet<()>,
    /// Services pushed as changed, for the workers.
    pushed: Arc<Pushed>,
    /// Watched services (push clients only) and whether each is subscribed yet.
    subscribed: HashMap<ServiceKey, bool>,
}

impl<A: Api> Session<A> {
    fn new(api: A, ctx: Arc<Ctx>) -> Session<A> {
        Session::new_shared(Arc::new(api), ctx)
    }

    fn new_shared(api: Arc<A>, ctx: Arc<Ctx>) -> Session<A> {
        Session { api, ctx, workers: JoinSet::new(), pushed: Arc::default(), subscribed: HashMap::new() }
    }

    async fn run(mut self, servers: &Servers, current: &[String], selector: &mut Selector) -> End {
        let ctx = self.ctx.clone();
        let mut backoff = Backoff::default();
        loop {
            match ctx.sync(&*self.api, None).await {
                Ok(()) => break,
                Err(e) => {
                    // A client that never worked is not rebuilt: that cannot
                    // fix a missing permission, and each build leaves tasks.
                    ctx.health.fail(&e);
                    tokio::select! {
                        () = tokio::time::sleep(backoff.next()) => {}
                        Some(end) = check_servers(servers, current, &ctx.health) => return end,
                    }
                }
            }
        }
        self.reconcile().await;
        // A recovery signalled during the first sync is already covered.
        let _ = ctx.health.recovered().notified().now_or_never();

        let every = |period: Duration| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        };
        let mut resync = every(ctx.refresh);
        // Push clients: the anti-entropy pass (HTTP's every refresh is one).
        let mut full = every(ctx.anti_entropy);
        let mut probe = every(ctx.refresh.min(PROBE_EVERY));
        let mut address = every(ctx.refresh);
        // The periodic full read runs beside the loop, not in it: at 10k
        // services it takes seconds (over HTTP 10,000 reads, 8 at a time),
        // and the probes go on meanwhile, so a new service is not kept
        // waiting for it. Anything that makes it stale drops it.
        let mut reading: Option<FullRead> = None;
        loop {
            tokio::select! {
                _ = resync.tick(), if reading.is_none() => {
                    if A::PUSH {
                        if let Some(end) = self.refresh(false).await {
                            return end;
                        }
                    } else {
                        reading = Some(self.full_read());
                    }
                }
                _ = full.tick(), if A::PUSH && reading.is_none() => reading = Some(self.full_read()),
                result = async { reading.as_mut().expect("guarded by is_some").await }, if reading.is_some() => {
                    reading = None;
                    if let Some(end) = self.synced(result).await {
                        return end;
                    }
                    // It listed and read everything a refresh would.
                    if A::PUSH {
                        resync.reset();
                    }
                }
                _ = probe.tick() => {
                    if let Some(end) = self.probe().await {
                        return end;
                    }
                }
                // Down at the last probe and accepting connections again:
                // probe now rather than at the next tick.
                () = self.api.reachable_again() => {
                    if let Some(end) = self.probe().await {
                        return end;
                    }
                    probe.reset();
                }
                () = ctx.health.recovered().notified() => {
                    info!("nacos answers again, resyncing");
                    // This resync starts after the recovery; one begun before
                    // it may have failed halfway.
                    reading = None;
                    if let Some(end) = self.resync().await {
                        return end;
                    }
                    resync.reset();
                    full.reset();
                }
                _ = address.tick(), if servers.is_dynamic() => {
                    if let Some(end) = check_servers(servers, current, &ctx.health).await {
                        return end;
                    }
                }
                () = selector.changed() => {
                    // List the services again and read only the newly
                    // selected ones; unselected ones are removed and
                    // unsubscribed from, the others stay as they are.
                    *ctx.selection.lock().unwrap_or_else(PoisonError::into_inner) = selector.current();
                    info!("selection changed");
                    // A full read in progress listed with the old selection:
                    // it starts again after the reselection.
                    let restart = reading.take().is_some();
                    match ctx.reselect(&*self.api).await {
                        Ok(()) => {
                            self.reconcile().await;
                            if restart {
                                reading = Some(self.full_read());
                            }
                        }
                        Err(e) => {
                            ctx.health.fail(&e);
                            if let Some(end) = self.resync().await {
                                return end;
                            }
                        }
                    }
                }
                Some(done) = self.workers.join_next() => on_worker_exit("nacos", done),
            }
        }
    }

    /// Probe every group: a count or first page other than the last
    /// listing's lists again.
    async fn probe(&mut self) -> Option<End> {
        match self.ctx.probe(&*self.api).await {
            Ok(probes) => {
                self.ctx.health.ok();
                if self.ctx.probed_as_listed(&probes) {
                    return None;
                }
                // Services came or went: list again and read only the new
                // ones (Nacos announces neither). That listing's own probe
                // is the one the next probes compare with.
                debug!(?probes, "a group's services changed, listing again");
                self.refresh(true).await
            }
            Err(e) => {
                self.ctx.health.fail(&e);
                self.replace_client()
            }
        }
    }

    /// List again, read the services not tracked yet, drop the ones gone.
    /// With `only_new` (the probe's count moved) every tracked service is
    /// kept unread; otherwise (push clients between full reads) the
    /// unsubscribed ones are read too.
    async fn refresh(&mut self, only_new: bool) -> Option<End> {
        let subscribed = &self.subscribed;
        let keep = |key: &ServiceKey| only_new || subscribed.get(key) == Some(&true);
        match self.ctx.refresh(&*self.api, &keep).await {
            Ok(()) => {
                self.reconcile().await;
                None
            }
            Err(e) => {
                self.ctx.health.fail(&e);
                self.replace_client()
            }
        }
    }

    /// A full read, run inline (after a recovery or a failed reselection,
    /// when nothing else is worth doing meanwhile), not judged for drift:
    /// what it repairs is the outage's.
    async fn resync(&mut self) -> Option<End> {
        let result = self.ctx.sync(&*self.api, None).await;
        self.synced(result).await
    }

    /// The periodic full read, to run beside the session's loop: a push
    /// client's is judged for drift.
    fn full_read(&self) -> FullRead {
        let (ctx, api, pushed) = (self.ctx.clone(), self.api.clone(), self.pushed.clone());
        Box::pin(async move { ctx.sync(&*api, A::PUSH.then_some(&*pushed)).await })
    }

    /// After a full read.
    async fn synced(&mut self, result: Result<(), RegistryError>) -> Option<End> {
        match result {
            Ok(()) => {
                // This sync already is the recovery resync a failure during
                // it would ask for.
                let _ = self.ctx.health.recovered().notified().now_or_never();
                self.reconcile().await;
                None
            }
            Err(e) => {
                self.ctx.health.fail(&e);
                self.replace_client()
            }
        }
    }

    /// Whether a client that worked must be replaced (push clients only;
    /// the HTTP client has no state beyond the token). Called after the first
    /// sync only.
    /// - Its credentials are refused again and again although each call
    ///   logged in afresh: its own state is stale.
    fn replace_client(&self) -> Option<End> {
        let refused = self.ctx.health.auth_failures.load(Ordering::SeqCst) >= AUTH_FAILURES_BEFORE_RECONNECT;
        (A::PUSH && refused).then_some(End::Reconnect)
    }

    /// Push clients: [`CONCURRENCY`] readers of pushed services, and exactly
    /// one subscription per service.
    async fn reconcile(&mut self) {
        if !A::PUSH {
            return;
        }
        // A reader that ended (it panicked) is replaced.
        while self.workers.len() < CONCURRENCY {
            let reader = read_pushed(self.ctx.clone(), self.api.clone(), self.pushed.clone());
            self.workers.spawn(reader.in_current_span());
        }
        let keys = self.ctx.keys();
        let gone: Vec<ServiceKey> = self.subscribed.keys().filter(|k| !keys.contains(*k)).cloned().collect();
        for key in gone {
            self.subscribed.remove(&key);
            self.api.unsubscribe(&key).await;
        }
        for key in &keys {
            self.subscribed.entry(key.clone()).or_insert(false);
        }
        let pending: Vec<ServiceKey> =
            self.subscribed.iter().filter(|(_, done)| !**done).map(|(k, _)| k.clone()).collect();
        if pending.is_empty() {
            return;
        }
        let started = Instant::now();
        let asked = pending.len();
        let (api, pushed) = (&self.api, &self.pushed);
        let results: Vec<(ServiceKey, Result<(), RegistryError>)> = stream::iter(pending)
            .map(|key| async move {
                let result = api.subscribe(&key, pushed.clone()).await;
                (key, result)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        for (key, result) in results {
            match result {
                Ok(()) => {
                    if let Some(done) = self.subscribed.get_mut(&key) {
                        *done = true;
                    }
                }
                // Retried at the next sync; the periodic reads cover it.
                Err(e) => {
                    warn!(service = %key, error = %e, "subscribe failed");
                    self.ctx.health.fail(&e);
                }
            }
        }
        // At 10k services this takes seconds (one call each): the server's
        // time and ours, after every full read and reconnect.
        debug!(services = asked, took = ?started.elapsed(), "subscribed");
    }
}

/// Re-read the address server: `Some` when it lists other servers.
async fn check_servers(servers: &Servers, current: &[String], health: &Health) -> Option<End> {
    if !servers.is_dynamic() {
        return std::future::pending().await;
    }
    match servers.fetch().await {
        Ok(list) if list != current => Some(End::Servers(list)),
        Ok(_) => None,
        Err(e) => {
            health.fail(&e);
            None
        }
    }
}

/// A push-client reader: each pushed service is asked for again, unless the
/// push announced exactly what was sent last (a subscription's answer, and
/// a resubscription after a reconnect, are queued with the instances they
/// carried). Pushes that arrive while it waits fold into one read (see
/// [`Pushed`]); a service no longer watched is ignored by `Ctx::apply_one`.
async fn read_pushed<A: Api>(ctx: Arc<Ctx>, api: Arc<A>, pushed: Arc<Pushed>) {
    loop {
        let (key, announced) = pushed.next().await;
        if let Some(announced) = announced
            && ctx.already_sent(&key, announced)
        {
            pushed.done(&key);
            continue;
        }
        let seq = ctx.next_seq();
        match api.instances(&key).await {
            Ok(instances) => {
                ctx.health.ok();
                let decoded = resolve(endpoints(instances)).await;
                ctx.apply_one(&key, seq, decoded);
                pushed.done(&key);
            }
            Err(e) => {
                ctx.health.fail(&e);
                // The push announced a change nobody has read: read it again
                // after a backoff. A full read's success must not stand for
                // it (its own read of the service may predate the push).
                if ctx.tracks(&key) {
                    debug!(service = %key, error = %e, "pushed service unread; retrying");
                    pushed.failed(&key);
                } else {
                    pushed.done(&key);
                }
            }
        }
    }
}

/// Endpoints must carry IP addresses: an instance registered with a host
/// name becomes one endpoint per address the name resolves to. A name that
/// does not resolve drops that instance alone (with a warning); the next
/// read tries again.
async fn resolve(mut decoded: Endpoints) -> Endpoints {
    if decoded.endpoints.iter().all(|e| e.address.parse::<IpAddr>().is_ok()) {
        return decoded;
    }
    let (endpoints, dropped) = crate::resolve::endpoints(std::mem::take(&mut decoded.endpoints)).await;
    decoded.endpoints = endpoints;
    decoded.skipped += dropped;
    decoded
}

#[cfg(test)]
#[path = "nacos/nacos_tests.rs"]
mod tests;
