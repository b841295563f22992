//! State-of-the-world ADS: one [`SotwStream`] per client stream. It is a
//! plain state machine (request or config change in, responses out) so the
//! protocol rules are unit-testable without gRPC.
//!
//! Rules followed (xDS protocol, "ACK/NACK and resource type instance
//! version"): a request whose `response_nonce` is not the latest one we sent
//! for that type is stale and ignored, but the first request for a type is
//! always answered, whatever nonce it carries; `error_detail` marks a NACK, after
//! which nothing is re-sent until the config changes; Cluster and Listener
//! responses carry every resource, other types only the named ones that
//! changed.
//!
//! One response per type is in flight at a time: a change that comes while
//! the client has not yet answered (ACK or NACK) the latest response of a
//! type waits, and goes out with any later ones as one response of the
//! newest state when the answer comes. go-control-plane's SotW server does
//! the same (a type's next watch opens only with the client's next request
//! for it). A full-state type (an MCP collection to Pilot: megabytes at 10k
//! services) then costs one response per round trip under churn, not one
//! per change; the tracker still holds what the client was last sent, so
//! the newer response misses nothing.
//!
//! A full-state type is also pushed at most once per push window
//! (`--xds-sotw-push-window`): a change that comes sooner after the type's
//! last push waits for the window to end ([`SotwStream::due`]), and then
//! goes out as one response of the newest state. The first change after a
//! quiet window goes out at once, so a lone change is never delayed, and
//! none waits longer than the window. Listeners and routes wait while CDS
//! waits, and go out after it, so a route never names a cluster the client
//! has not been sent. istiod decodes and re-indexes a whole
//! collection per response (3 MB and about 90 ms of its CPU at 10k
//! services), so under churn this bounds what it spends.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::clients::NACK_DETAIL_BYTES;
use super::limits::{short, truncate};
use super::request::SotwRequest;
use super::response::SotwResponse;
use super::tracker::Tracker;
use super::{ClientHandle, Subscription, is_full_state, push_order};
use crate::resources::{Body, EncodedResources, TypeResources};
use crate::translate::ConfigSet;
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};

#[derive(Debug, Default)]
struct TypeState {
    /// The subscription and what the client holds (what it was sent, or
    /// is applying: a NACKed version counts as sent).
    tracker: Tracker,
    /// Latest nonce sent for this type; empty before the first response.
    nonce: String,
    /// The client has not answered the latest response yet.
    awaiting: bool,
    /// The config changed while `awaiting`: bring the type up to date when
    /// the answer comes.
    held: bool,
    /// Clusters re-sent while this (EDS) type was held, whose endpoints
    /// must go with its next response.
    forced: HashSet<Arc<str>>,
    /// When this type's latest response went out.
    pushed_at: Option<Instant>,
    /// A change waits for the push window to end (full-state types only).
    deferred: bool,
    /// Listeners and routes wait while CDS waits for its window: they may
    /// name a cluster it brings (make before break, as in one push).
    behind: bool,
}

/// One SotW stream's protocol state.
#[derive(Debug)]
pub struct SotwStream {
    types: BTreeMap<String, TypeState>,
    next_nonce: u64,
    client: ClientHandle,
    examined: u64,
    /// At most one push of a full-state type per window; zero: no window.
    window: Duration,
}

impl SotwStream {
    /// A stream without a push window: every change goes out as soon as
    /// the client has answered the previous response.
    pub fn new(client: ClientHandle) -> Self {
        SotwStream::with_window(client, Duration::ZERO)
    }

    /// A stream pushing each full-state type at most once per `window`.
    pub fn with_window(client: ClientHandle, window: Duration) -> Self {
        SotwStream { types: BTreeMap::new(), next_nonce: 0, client, examined: 0, window }
    }

    /// When the earliest change waiting for its push window may go out
    /// ([`SotwStream::on_change`] then sends it); `None` if none waits.
    pub fn due(&self) -> Option<Instant> {
        if self.types.values().any(|st| st.behind) && !self.clusters_wait() {
            // CDS went out (answering a request): what waited behind it goes now.
            return Some(Instant::now());
        }
        let waiting = self.types.values().filter(|st| st.deferred && !st.awaiting);
        waiting.filter_map(|st| st.pushed_at).map(|t| t + self.window).min()
    }

    /// CDS has a change waiting for its push window.
    fn clusters_wait(&self) -> bool {
        self.types.get(CLUSTER_TYPE).is_some_and(|st| st.deferred)
    }

    /// Whether a push of `type_url` now would come too soon after its last.
    fn too_soon(&self, type_url: &str, st: &TypeState) -> bool {
        !self.window.is_zero()
            && is_full_state(type_url)
            && st.pushed_at.is_some_and(|t| Instant::now() < t + self.window)
    }

    /// Handle one request from the client, as a plain message (tests, tools).
    pub fn on_request(&mut self, req: &DiscoveryRequest, set: &ConfigSet) -> Vec<SotwResponse> {
        self.handle(&SotwRequest::from(req.clone()), set)
    }

    /// Handle one request from the client, as the server decodes it.
    pub fn handle(&mut self, request: &SotwRequest, set: &ConfigSet) -> Vec<SotwResponse> {
        let (req, names) = (&request.req, &request.names);
        if let Some(node) = &req.node {
            self.client.set_node(&node.id);
        }
        let type_url = req.type_url.clone();
        let st = self.types.entry(type_url.clone()).or_default();
        let first = st.nonce.is_empty();
        // Only a nonce of a type already sent on this stream can be stale.
        // The first request for a type is answered whatever nonce it
        // carries, as Istio's server and go-control-plane do: Istio's ADSC
        // `WatchConfig()` sends `time.Now().String()` as its first nonce, and
        // a client reconnecting to a new server sends its old stream's nonce.
        let stale = !first && !req.response_nonce.is_empty() && req.response_nonce != st.nonce;
        // What the client says it applied is recorded even from a stale
        // request (it is still true); only the latest nonce drives the
        // protocol. A nonce we never sent acknowledges nothing of ours.
        if first && !req.response_nonce.is_empty() {
            debug!(type_url, nonce = %short(&req.response_nonce), "first request carries a nonce from elsewhere: answered");
        } else {
            record_reply(&self.client, &type_url, req, stale);
        }
        if stale {
            debug!(type_url, nonce = %short(&req.response_nonce), latest = st.nonce, "ignoring stale nonce");
            return Vec::new();
        }
        // The client answered the latest response (or spoke afresh).
        st.awaiting = false;
        let held = std::mem::take(&mut st.held);
        // An ACK usually repeats the subscription (Envoy's EDS ACK names
        // every cluster): recognised without rebuilding it.
        let changed = if !first && st.tracker.sub().is_same(&type_url, names.iter()) {
            false
        } else {
            let sub = Subscription::from_names(&type_url, names.iter(), self.client.visible(set, &type_url));
            self.client.subscribed(&type_url, &sub);
            // Names no longer wanted are forgotten, so a later re-subscribe sends them.
            st.tracker.set_sub(sub)
        };
        if req.error_detail.is_some() && !first && !held {
            // Nothing is re-sent until the config changes.
            return Vec::new();
        }
        if !(first || changed || held) {
            return Vec::new();
        }
        if !(first || changed) && self.too_soon(&type_url, &self.types[&type_url]) {
            // A change held for this answer: it goes when the window ends.
            self.types.get_mut(&type_url).expect("listed type").deferred = true;
            return Vec::new();
        }
        let st = self.types.get_mut(&type_url).expect("listed type");
        let full = first || is_full_state(&type_url);
        let force = std::mem::take(&mut st.forced);
        // A held change alone sends only what differs; a new subscription
        // (or the first request) is always answered.
        let always = first || changed && req.error_detail.is_none();
        self.respond(&type_url, set, full, &force, always).map(|(resp, _)| resp).into_iter().collect()
    }

    /// The config changed: push what differs from what each type was sent,
    /// in CDS, EDS, LDS, RDS order.
    pub fn on_change(&mut self, set: &ConfigSet) -> Vec<SotwResponse> {
        let mut out = Vec::new();
        // Clusters re-sent with a new version get their EDS re-sent too, so a
        // warming cluster is never left waiting for endpoints.
        let mut forced = HashSet::new();
        for type_url in push_order(self.types.keys()) {
            let force = if type_url == ENDPOINT_TYPE { std::mem::take(&mut forced) } else { HashSet::new() };
            let too_soon = self.too_soon(&type_url, &self.types[&type_url]);
            let behind = (type_url == LISTENER_TYPE || type_url == ROUTE_TYPE) && self.clusters_wait();
            let st = self.types.get_mut(&type_url).expect("listed type");
            if st.nonce.is_empty() {
                continue;
            }
            if st.awaiting {
                st.held = true;
                st.behind = false;
                st.forced.extend(force);
                continue;
            }
            if behind {
                st.behind = true;
                continue;
            }
            if too_soon {
                // Full-state types take no forced names: they send everything.
                st.deferred = true;
                continue;
            }
            let full = is_full_state(&type_url);
            if let Some((resp, replaced)) = self.respond(&type_url, set, full, &force, false) {
                if type_url == CLUSTER_TYPE {
                    forced.extend(replaced);
                }
                out.push(resp);
            }
        }
        out
    }

    pub fn has_type(&self, type_url: &str) -> bool {
        self.types.contains_key(type_url)
    }

    pub fn type_count(&self) -> usize {
        self.types.len()
    }

    /// Names compared so far on this stream (the work its diffs did).
    pub fn examined(&self) -> u64 {
        self.examined
    }

    /// Bring `type_url` up to date with `set`. When `full`, the response
    /// carries everything subscribed (and any removal calls for one), else
    /// only what is new, changed or forced. Without `always`, nothing is
    /// sent when nothing the client wants differs. Returns the response and
    /// the names it re-sent with a new version.
    fn respond(
        &mut self,
        type_url: &str,
        set: &ConfigSet,
        full: bool,
        force: &HashSet<Arc<str>>,
        always: bool,
    ) -> Option<(SotwResponse, Vec<Arc<str>>)> {
        let st = self.types.get_mut(type_url)?;
        let now = self.client.visible(set, type_url);
        let changes = st.tracker.changes(now, set.revision, force);
        self.examined += changes.examined as u64;
        let send = always || !changes.upserts.is_empty() || full && !changes.removed.is_empty();
        // The whole type, wanted whole, is encoded once per type state and
        // shared by every stream; anything else is encoded here.
        let absent =
            if send && always && type_url == ENDPOINT_TYPE { absent_load_assignments(st, now) } else { Vec::new() };
        let resources = match (send, full) {
            (false, _) => EncodedResources::default(),
            (true, true) if st.tracker.sub().wildcard => now.encoded_all(),
            (true, true) => EncodedResources::encode(
                st.tracker.wanted(now).map(|r| &r.body).chain(&absent).collect::<Vec<&Body>>().into_iter(),
            ),
            (true, false) => EncodedResources::encode(changes.upserts.iter().map(|r| &r.body).chain(&absent)),
        };
        // SotW cannot remove a named resource: the client keeps it.
        let unsent = if send && full { Vec::new() } else { changes.removed };
        st.tracker.commit(now, set.revision, unsent);
        st.deferred = false;
        st.behind = false;
        if !send {
            return None;
        }
        st.pushed_at = Some(Instant::now());
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        st.nonce = nonce.clone();
        st.awaiting = true;
        let version = now.version();
        debug!(type_url, nonce, version, size = resources.len(), "sent response");
        let resp = SotwResponse { version_info: version, resources, type_url: type_url.to_string(), nonce };
        self.client.sent(&resp, set.changed_at, st.tracker.holding());
        Some((resp, changes.replaced))
    }
}

/// An empty `ClusterLoadAssignment` for every cluster an EDS subscription
/// names that the config does not have. Envoy asks for the endpoints of a
/// cluster it was sent and holds that cluster, and with it the ACK of its
/// CDS response, until they come; if the cluster went away in between
/// (added and removed within a round trip), nothing would ever come, and
/// every later cluster change would wait out Envoy's `initial_fetch_timeout`
/// (15 s). Istio answers such a name with no endpoints too. Not recorded as
/// sent: if the cluster comes back, its endpoints are sent as new.
fn absent_load_assignments(st: &TypeState, now: &TypeResources) -> Vec<Body> {
    let sub = st.tracker.sub();
    if sub.wildcard {
        return Vec::new();
    }
    sub.names
        .iter()
        .filter(|name| !now.contains(name))
        .map(|name| {
            let cla = ClusterLoadAssignment { cluster_name: name.to_string(), ..Default::default() };
            Body::new(Any { type_url: ENDPOINT_TYPE.to_string(), value: cla.encode_to_vec() })
        })
        .collect()
}

/// Record the ACK or NACK a request carries, if any.
fn record_reply(client: &ClientHandle, type_url: &str, req: &DiscoveryRequest, stale: bool) {
    match (&req.error_detail, req.response_nonce.is_empty()) {
        (Some(status), _) => {
            if let Some(unlogged) = client.nack_log() {
                warn!(
                    type_url,
                    nonce = %short(&req.response_nonce),
                    version = %short(&req.version_info),
                    detail = %truncate(&status.message, NACK_DETAIL_BYTES),
                    unlogged,
                    stale,
                    "NACK: client kept its last good config"
                );
            }
            client.nack(type_url, &req.response_nonce, &req.version_info, &status.message);
        }
        (None, false) => {
            debug!(type_url, nonce = %short(&req.response_nonce), version = %short(&req.version_info), stale, "ACK");
            client.ack(type_url, &req.response_nonce, &req.version_info);
        }
        (None, true) => {}
    }
}
