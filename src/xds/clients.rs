//! Who is connected, what they subscribed to and what they acknowledged: the
//! data behind the `/debug/xdsz` admin endpoint, and the xDS metrics.
//!
//! Each stream owns a [`ClientHandle`]; the protocol state machines call its
//! hooks (`subscribed`, `sent`, `ack`, `nack`) and nothing else.
//!
//! Push latency is measured from the registry change a config set is the
//! first to carry ([`ConfigSet::changed_at`](crate::translate::ConfigSet))
//! to the response that carries it, and to the ACK of that response (by
//! nonce). Each change is observed once per type and stream, and only for
//! changes made after the stream connected, so the initial fetch of a new
//! client is not counted as latency.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime};

use serde::Serialize;
use tracing::warn;

use super::auth::PeerAuth;
use super::limits::LogLimit;
use super::metrics::{XdsLabels, XdsMetrics};
use super::subscription::{Subscription, no_resources, type_resources};
use super::tracker::Holding;
use crate::resources::TypeResources;
use crate::time;
use crate::translate::ConfigSet;
use crate::translate::envoy::SECRET_TYPE;

/// The type URLs that get their own metric series; any other is `other`,
/// so a client cannot grow `/metrics` by inventing type URLs.
pub fn metric_type_url(type_url: &str) -> &str {
    const ENVOY: [&str; 5] = [
        crate::translate::envoy::CLUSTER_TYPE,
        crate::translate::envoy::ENDPOINT_TYPE,
        crate::translate::envoy::LISTENER_TYPE,
        crate::translate::envoy::ROUTE_TYPE,
        crate::translate::envoy::SECRET_TYPE,
    ];
    const MCP_VERSIONS: [&str; 4] = ["v1", "v1alpha1", "v1alpha3", "v1beta1"];
    const MCP_KINDS: [&str; 13] = [
        "networking.istio.io/ServiceEntry",
        "networking.istio.io/DestinationRule",
        "networking.istio.io/VirtualService",
        "networking.istio.io/Gateway",
        "networking.istio.io/EnvoyFilter",
        "networking.istio.io/Sidecar",
        "networking.istio.io/WorkloadEntry",
        "networking.istio.io/WorkloadGroup",
        "security.istio.io/AuthorizationPolicy",
        "security.istio.io/PeerAuthentication",
        "security.istio.io/RequestAuthentication",
        "telemetry.istio.io/Telemetry",
        "core/MeshConfig",
    ];
    let known = ENVOY.contains(&type_url)
        || type_url.split('/').nth(1).is_some_and(|v| MCP_VERSIONS.contains(&v))
            && crate::translate::mcp::collection(type_url).is_some_and(|c| MCP_KINDS.contains(&c.as_str()));
    if known { type_url } else { "other" }
}

/// Secrets withheld: one WARN per stream, and at most one per 10 s over
/// all of them, so a crowd of unauthenticated clients cannot flood the log.
static REFUSAL_LOG: std::sync::LazyLock<LogLimit> =
    std::sync::LazyLock::new(|| LogLimit::new(std::time::Duration::from_secs(10)));

/// How often a stream logs a NACK at most.
const NACK_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// How much of a NACK's detail is kept for `/debug/xdsz` and logs.
pub const NACK_DETAIL_BYTES: usize = 512;

/// Responses awaiting ACK kept per type for the latency metric; older ones
/// are dropped (a client that never ACKs must not grow the map).
const MAX_PENDING: usize = 16;

/// Per type URL, what happened last on one stream.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeStatus {
    /// The client currently asks for this type (wildcard or some names).
    pub subscribed: bool,
    pub wildcard: bool,
    /// How many names the client asked for explicitly.
    pub resource_names: usize,
    /// SotW: the response's `version_info`; delta: its nonce.
    pub last_sent_version: Option<String>,
    pub last_sent_nonce: Option<String>,
    #[serde(serialize_with = "time::opt_rfc3339")]
    pub last_sent_time: Option<SystemTime>,
    pub last_ack: Option<String>,
    #[serde(serialize_with = "time::opt_rfc3339")]
    pub last_ack_time: Option<SystemTime>,
    pub last_nack: Option<String>,
    pub last_nack_detail: Option<String>,
    #[serde(serialize_with = "time::opt_rfc3339")]
    pub last_nack_time: Option<SystemTime>,
    pub pushes: u64,
    pub nacks: u64,
    /// What the client holds: the holding sent in the response it last
    /// ACKed (the status page asks it for one resource's version).
    #[serde(skip)]
    pub acked: Option<Holding>,
    /// What the response it last NACKed would have given it.
    #[serde(skip)]
    pub nacked: Option<Holding>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientStatus {
    pub id: u64,
    pub node_id: String,
    pub peer: String,
    /// How the connection was authenticated: `loopback`, `mtls`, `tls` or
    /// `plaintext`; only `loopback` and `mtls` clients get Secrets.
    pub auth: &'static str,
    /// The verified client certificate's URI (SPIFFE) or DNS name.
    pub identity: Option<String>,
    /// The client asked for Secrets and was refused: it is not authenticated.
    pub secrets_withheld: bool,
    pub mode: &'static str,
    #[serde(serialize_with = "time::rfc3339_ser")]
    pub connected_at: SystemTime,
    /// Type URLs the client currently subscribes to.
    pub subscribed_types: BTreeSet<String>,
    pub types: BTreeMap<String, TypeStatus>,
}

/// All connected clients.
#[derive(Debug, Default)]
pub struct Clients {
    next_id: AtomicU64,
    streams: Mutex<BTreeMap<u64, ClientStatus>>,
    metrics: XdsMetrics,
    /// Shutting down: no new streams, `/ready` false (see `crate::shutdown`).
    draining: std::sync::atomic::AtomicBool,
    /// Responses built but not yet taken by the transport, all streams.
    pub(super) buffered: AtomicUsize,
}

impl Clients {
    pub fn new() -> Arc<Clients> {
        Arc::new(Clients::default())
    }

    /// Refuse new streams from now on; existing ones are served on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// The counters and histograms the streams record.
    pub fn metrics(&self) -> &XdsMetrics {
        &self.metrics
    }

    /// A stream from an unauthenticated peer (see [`Clients::connect_as`]).
    pub fn connect(self: &Arc<Self>, peer: &str, mode: &'static str) -> ClientHandle {
        self.connect_as(peer, mode, PeerAuth::Plaintext)
    }

    /// A stream from `peer`, authenticated as `auth`.
    pub fn connect_as(self: &Arc<Self>, peer: &str, mode: &'static str, auth: PeerAuth) -> ClientHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let status = ClientStatus {
            id,
            node_id: String::new(),
            peer: peer.to_string(),
            auth: auth.label(),
            identity: auth.identity().map(str::to_string),
            secrets_withheld: false,
            mode,
            connected_at: SystemTime::now(),
            subscribed_types: BTreeSet::new(),
            types: BTreeMap::new(),
        };
        self.lock().insert(id, status);
        ClientHandle {
            clients: self.clone(),
            id,
            mode,
            connected: Instant::now(),
            latency: Mutex::default(),
            nack_log: LogLimit::new(NACK_LOG_EVERY),
            auth,
            secrets_withheld: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, ClientStatus>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn snapshot(&self) -> Vec<ClientStatus> {
        self.lock().values().cloned().collect()
    }

    /// Responses built but not yet taken by the transport, all streams
    /// together: what slow clients cost beyond their subscription state.
    pub fn buffered(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }

    /// Connected streams per mode (`sotw`, `delta`).
    pub fn count_by_mode(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for c in self.lock().values() {
            *out.entry(c.mode).or_default() += 1;
        }
        out
    }
}

/// What [`ClientHandle::sent`] needs to know about a response.
pub trait Pushed: prost::Message {
    fn type_url(&self) -> &str;
    fn nonce(&self) -> &str;
    /// What `/debug/xdsz` shows as the version sent.
    fn version(&self) -> &str;
}

impl Pushed for super::SotwResponse {
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn nonce(&self) -> &str {
        &self.nonce
    }
    fn version(&self) -> &str {
        &self.version_info
    }
}

impl Pushed for super::response::DeltaResponse {
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn nonce(&self) -> &str {
        &self.nonce
    }
    /// Delta responses carry per-resource versions only; the nonce names the
    /// response, and it is what the client's ACK refers to.
    fn version(&self) -> &str {
        &self.nonce
    }
}

/// Bookkeeping of responses awaiting an answer, for one type on one stream.
#[derive(Debug, Default)]
struct Latency {
    /// The change last observed, so each is counted once.
    last_event: Option<Instant>,
    /// (nonce, change time) of responses awaiting ACK, oldest first.
    pending: VecDeque<(String, Instant)>,
    /// (nonce, what the client holds once it applies it), oldest first: an
    /// ACK or NACK moves its holding into [`TypeStatus`].
    holdings: VecDeque<(String, Holding)>,
}

/// One stream's handle; dropping it marks the client disconnected.
#[derive(Debug)]
pub struct ClientHandle {
    clients: Arc<Clients>,
    id: u64,
    mode: &'static str,
    connected: Instant,
    /// Only this stream's task uses it; the lock is never contended.
    latency: Mutex<BTreeMap<String, Latency>>,
    /// When a NACK was last logged, and how many were not since.
    nack_log: LogLimit,
    auth: PeerAuth,
    /// Secrets were withheld from this stream (logged once).
    secrets_withheld: AtomicBool,
}

impl ClientHandle {
    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn auth(&self) -> &PeerAuth {
        &self.auth
    }

    /// The resources of `type_url` this client may be sent: all of them,
    /// but Secrets only for an authenticated client (see [`super::auth`]).
    pub fn visible<'a>(&self, set: &'a ConfigSet, type_url: &str) -> &'a TypeResources {
        if type_url != SECRET_TYPE || self.auth.trusted() {
            return type_resources(set, type_url);
        }
        if !self.secrets_withheld.swap(true, Ordering::Relaxed) {
            self.with(|c| c.secrets_withheld = true);
            if let Some(unlogged) = REFUSAL_LOG.check() {
                warn!(
                    auth = self.auth.label(),
                    unlogged,
                    "xDS client is not authenticated (no verified client certificate, not loopback): \
                     Secrets with TLS private keys are withheld from it, so its TLS listeners cannot serve; \
                     give meshbridge --xds-tls-cert/--xds-tls-key/--xds-client-ca and the client a certificate"
                );
            }
        }
        no_resources()
    }

    fn with(&self, f: impl FnOnce(&mut ClientStatus)) {
        if let Some(c) = self.clients.lock().get_mut(&self.id) {
            f(c)
        }
    }

    fn with_type(&self, type_url: &str, f: impl FnOnce(&mut TypeStatus)) {
        self.with(|c| f(c.types.entry(type_url.to_string()).or_default()))
    }

    fn labels(&self, type_url: &str) -> XdsLabels {
        XdsLabels { type_url: metric_type_url(type_url).to_string(), mode: self.mode }
    }

    /// Whether a NACK should be logged: at most one per [`NACK_LOG_EVERY`]
    /// per stream (a client NACKing in a loop must not flood the log);
    /// returns how many were left unlogged before this one.
    pub fn nack_log(&self) -> Option<u64> {
        self.nack_log.check()
    }

    fn latency(&self) -> MutexGuard<'_, BTreeMap<String, Latency>> {
        self.latency.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take the pending response `nonce` (and the older ones it supersedes)
    /// and return the change time it carried, and the holding it gave.
    fn settle(&self, type_url: &str, nonce: &str) -> (Option<Instant>, Option<Holding>) {
        let mut latency = self.latency();
        let Some(t) = latency.get_mut(type_url) else { return (None, None) };
        let holding = match t.holdings.iter().position(|(n, _)| n == nonce) {
            Some(i) => t.holdings.drain(..=i).next_back().map(|(_, h)| h),
            None => None,
        };
        let at = match t.pending.iter().position(|(n, _)| n == nonce) {
            Some(i) => t.pending.drain(..=i).next_back().map(|(_, at)| at),
            None => None,
        };
        (at, holding)
    }

    pub fn set_node(&self, node_id: &str) {
        self.with(|c| {
            if c.node_id != node_id {
                c.node_id = node_id.to_string();
            }
        })
    }

    /// The client's subscription for `type_url` is now `sub`.
    pub fn subscribed(&self, type_url: &str, sub: &Subscription) {
        let on = sub.wildcard || !sub.names.is_empty();
        self.with(|c| {
            if on {
                c.subscribed_types.insert(type_url.to_string());
            } else {
                c.subscribed_types.remove(type_url);
            }
            let t = c.types.entry(type_url.to_string()).or_default();
            t.subscribed = on;
            t.wildcard = sub.wildcard;
            t.resource_names = sub.names.len();
        })
    }

    /// `resp` is about to be sent; `changed_at` is its config set's, and
    /// `holding` what the client holds once it applies it.
    pub fn sent(&self, resp: &impl Pushed, changed_at: Option<Instant>, holding: Holding) {
        let type_url = resp.type_url();
        let labels = self.labels(type_url);
        let m = &self.clients.metrics;
        m.pushes.get_or_create(&labels).inc();
        m.push_bytes.get_or_create(&labels).inc_by(resp.encoded_len() as u64);
        {
            let mut latency = self.latency();
            let t = latency.entry(type_url.to_string()).or_default();
            if t.holdings.len() == MAX_PENDING {
                t.holdings.pop_front();
            }
            t.holdings.push_back((resp.nonce().to_string(), holding));
            if let Some(at) = changed_at.filter(|at| *at >= self.connected && t.last_event != Some(*at)) {
                t.last_event = Some(at);
                m.event_to_send.get_or_create(&labels).observe(at.elapsed().as_secs_f64());
                if t.pending.len() == MAX_PENDING {
                    t.pending.pop_front();
                }
                t.pending.push_back((resp.nonce().to_string(), at));
            }
        }
        self.with_type(type_url, |t| {
            t.last_sent_version = Some(resp.version().to_string());
            t.last_sent_nonce = Some(resp.nonce().to_string());
            t.last_sent_time = Some(SystemTime::now());
            t.pushes += 1;
        })
    }

    /// The client applied the response `nonce`; `version` is what it says it has.
    pub fn ack(&self, type_url: &str, nonce: &str, version: &str) {
        let (at, holding) = self.settle(type_url, nonce);
        if let Some(at) = at {
            self.clients.metrics.event_to_ack.get_or_create(&self.labels(type_url)).observe(at.elapsed().as_secs_f64());
        }
        self.with_type(type_url, |t| {
            t.last_ack = Some(version.to_string());
            t.last_ack_time = Some(SystemTime::now());
            if holding.is_some() {
                t.acked = holding;
            }
        })
    }

    /// The client rejected the response `nonce` and keeps `version`.
    pub fn nack(&self, type_url: &str, nonce: &str, version: &str, detail: &str) {
        let (_, holding) = self.settle(type_url, nonce);
        self.clients.metrics.nacks.get_or_create(&self.labels(type_url)).inc();
        self.with_type(type_url, |t| {
            if holding.is_some() {
                t.nacked = holding;
            }
            t.last_nack = Some(version.to_string());
            t.last_nack_detail = Some(super::limits::truncate(detail, NACK_DETAIL_BYTES).into_owned());
            t.last_nack_time = Some(SystemTime::now());
            t.nacks += 1;
        })
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        self.clients.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(type_url: &str, nonce: &str) -> crate::xds::SotwResponse {
        crate::xds::SotwResponse {
            type_url: type_url.into(),
            nonce: nonce.into(),
            version_info: "v".into(),
            ..Default::default()
        }
    }

    #[test]
    fn latency_counts_each_change_once_and_settles_by_nonce() {
        let clients = Clients::new();
        let before = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = clients.connect("peer", "sotw");
        c.sent(&resp("t", "1"), Some(before), Holding::default()); // older than the stream: initial fetch
        let at = Instant::now();
        c.sent(&resp("t", "2"), Some(at), Holding::default());
        c.sent(&resp("t", "3"), Some(at), Holding::default()); // same change again: not re-counted
        let labels = XdsLabels { type_url: "other".into(), mode: "sotw" }; // "t" is no type we know
        let pending = |c: &ClientHandle| c.latency().get("t").map(|l| l.pending.len()).unwrap_or(0);
        assert_eq!(pending(&c), 1);
        c.ack("t", "1", "v"); // a nonce that carried no change
        assert_eq!(pending(&c), 1);
        c.ack("t", "2", "v");
        assert_eq!(pending(&c), 0);
        let m = clients.metrics();
        assert_eq!(m.pushes.get_or_create(&labels).get(), 3);
        assert!(m.push_bytes.get_or_create(&labels).get() > 0);

        c.sent(&resp("t", "4"), Some(Instant::now()), Holding::default());
        c.nack("t", "4", "v", "bad");
        assert_eq!(pending(&c), 0);
        assert_eq!(m.nacks.get_or_create(&labels).get(), 1);
        let snap = clients.snapshot();
        assert_eq!(snap[0].types["t"].last_nack_detail.as_deref(), Some("bad"));
        assert_eq!(clients.count_by_mode()["sotw"], 1);
        drop(c);
        assert!(clients.snapshot().is_empty());
    }

    #[test]
    fn unknown_type_urls_share_one_series_and_nacks_are_bounded() {
        let clients = Clients::new();
        let c = clients.connect("peer", "sotw");
        for i in 0..1000 {
            c.sent(&resp(&format!("example.com/v{i}/Widget{}", "x".repeat(100)), "1"), None, Holding::default());
        }
        c.sent(&resp(crate::translate::envoy::CLUSTER_TYPE, "1"), None, Holding::default());
        c.sent(&resp("networking.istio.io/v1alpha3/ServiceEntry", "1"), None, Holding::default());
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("pushes", "", clients.metrics().pushes.clone());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let series: Vec<&str> = text.lines().filter(|l| l.starts_with("pushes_total{")).collect();
        assert_eq!(series.len(), 3, "{series:?}");
        assert!(text.contains(r#"type_url="other""#) && text.contains("} 1000"));

        c.nack("t", "1", "v", &"x".repeat(100_000));
        assert!(clients.snapshot()[0].types["t"].last_nack_detail.as_ref().unwrap().len() < 600);
        assert_eq!(c.nack_log(), Some(0));
        assert_eq!((c.nack_log(), c.nack_log()), (None, None), "rate-limited per stream");
    }

    #[test]
    fn pending_is_bounded() {
        let clients = Clients::new();
        let c = clients.connect("peer", "delta");
        for i in 0..(MAX_PENDING as u64 + 10) {
            let at = Instant::now() + std::time::Duration::from_millis(i + 1);
            c.sent(&resp("t", &i.to_string()), Some(at), Holding::default());
        }
        assert_eq!(c.latency()["t"].pending.len(), MAX_PENDING);
    }

    #[test]
    fn subscription_is_reported() {
        let clients = Clients::new();
        let c = clients.connect("peer", "sotw");
        c.subscribed("cds", &Subscription::from_names("cds", [""; 0], &Default::default()));
        c.subscribed("eds", &Subscription::from_names("eds", ["a", "b"], &Default::default()));
        let s = &clients.snapshot()[0];
        assert_eq!(s.subscribed_types.iter().collect::<Vec<_>>(), ["cds", "eds"]);
        assert!(s.types["cds"].wildcard);
        assert_eq!(s.types["eds"].resource_names, 2);
        c.subscribed("eds", &Subscription::default());
        assert!(!clients.snapshot()[0].subscribed_types.contains("eds"));
    }
}
