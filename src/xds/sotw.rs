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

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tracing::{debug, warn};

use super::{ClientHandle, Subscription, is_full_state, push_order};
use crate::resources::{Resource, content_hash};
use crate::translate::ConfigSet;

#[derive(Debug, Default)]
struct TypeState {
    sub: Subscription,
    /// name → version last sent (what the client has, or is applying).
    sent: BTreeMap<String, String>,
    /// Latest nonce sent for this type; empty before the first response.
    nonce: String,
}

/// One SotW stream's protocol state.
#[derive(Debug)]
pub struct SotwStream {
    types: BTreeMap<String, TypeState>,
    next_nonce: u64,
    client: ClientHandle,
}

impl SotwStream {
    pub fn new(client: ClientHandle) -> Self {
        SotwStream { types: BTreeMap::new(), next_nonce: 0, client }
    }

    /// Handle one request from the client.
    pub fn on_request(&mut self, req: &DiscoveryRequest, set: &ConfigSet) -> Vec<DiscoveryResponse> {
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
            debug!(type_url, nonce = req.response_nonce, "first request carries a nonce from elsewhere: answered");
        } else {
            record_reply(&self.client, &type_url, req, stale);
        }
        if stale {
            debug!(type_url, nonce = req.response_nonce, latest = st.nonce, "ignoring stale nonce");
            return Vec::new();
        }
        let sub = Subscription::from_names(&type_url, &req.resource_names);
        self.client.subscribed(&type_url, &sub);
        if req.error_detail.is_some() && !first {
            // Nothing is re-sent until the config changes.
            st.sub = sub;
            return Vec::new();
        }
        let changed = sub != st.sub;
        st.sub = sub;
        // Names no longer wanted are forgotten, so a later re-subscribe sends them.
        let wanted = st.sub.clone();
        st.sent.retain(|name, _| wanted.wants(name));
        if !(first || changed) {
            return Vec::new();
        }
        let full = first || is_full_state(&type_url);
        self.respond(&type_url, set, full, &BTreeSet::new()).into_iter().collect()
    }

    /// The config changed: push what differs from what each type was sent,
    /// in CDS, EDS, LDS, RDS order.
    pub fn on_change(&mut self, set: &ConfigSet) -> Vec<DiscoveryResponse> {
        let mut out = Vec::new();
        // Clusters re-sent with a new version get their EDS re-sent too, so a
        // warming cluster is never left waiting for endpoints.
        let mut forced = BTreeSet::new();
        let types: Vec<String> = push_order(self.types.keys());
        for type_url in types {
            if self.types[&type_url].nonce.is_empty() {
                continue;
            }
            let full = is_full_state(&type_url);
            let force =
                if type_url == crate::translate::envoy::ENDPOINT_TYPE { forced.clone() } else { BTreeSet::new() };
            let before = self.types[&type_url].sent.clone();
            if let Some(resp) = self.respond_if_changed(&type_url, set, full, &force) {
                if type_url == crate::translate::envoy::CLUSTER_TYPE {
                    let now = &self.types[&type_url].sent;
                    forced.extend(
                        now.iter().filter(|(n, v)| before.get(*n).is_some_and(|old| old != *v)).map(|(n, _)| n.clone()),
                    );
                }
                out.push(resp);
            }
        }
        out
    }

    fn respond_if_changed(
        &mut self,
        type_url: &str,
        set: &ConfigSet,
        full: bool,
        force: &BTreeSet<String>,
    ) -> Option<DiscoveryResponse> {
        let st = &self.types[type_url];
        let current = subscribed(set, type_url, &st.sub);
        let dirty =
            current.iter().any(|(n, r)| st.sent.get(*n).map(String::as_str) != Some(&*r.version) || force.contains(*n));
        let removed = st.sent.keys().any(|n| !current.contains_key(n.as_str()));
        if !(dirty || full && removed) {
            return None;
        }
        self.respond(type_url, set, full, force)
    }

    /// Build the response for `type_url`: everything subscribed when `full`,
    /// else only what is new, changed or forced.
    fn respond(
        &mut self,
        type_url: &str,
        set: &ConfigSet,
        full: bool,
        force: &BTreeSet<String>,
    ) -> Option<DiscoveryResponse> {
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        let st = self.types.get_mut(type_url)?;
        let current = subscribed(set, type_url, &st.sub);
        let version = type_version(&current);
        let resources: Vec<&Resource> = current
            .values()
            .copied()
            .filter(|r| {
                full || st.sent.get(&*r.name).map(String::as_str) != Some(&*r.version) || force.contains(&*r.name)
            })
            .collect();
        if !full {
            st.sent.retain(|n, _| current.contains_key(n.as_str()));
        } else {
            st.sent.clear();
        }
        for r in &resources {
            st.sent.insert(r.name.to_string(), r.version.to_string());
        }
        st.nonce = nonce.clone();
        debug!(type_url, nonce, version, size = resources.len(), "sent response");
        let resp = DiscoveryResponse {
            version_info: version,
            resources: resources.iter().map(|r| r.body.clone()).collect(),
            type_url: type_url.to_string(),
            nonce,
            ..Default::default()
        };
        self.client.sent(&resp, set.changed_at);
        Some(resp)
    }
}

/// The resources of one type that a subscription asks for.
pub(super) fn subscribed<'a>(
    set: &'a ConfigSet,
    type_url: &str,
    sub: &Subscription,
) -> BTreeMap<&'a str, &'a Resource> {
    set.resources(type_url)
        .map(|m| m.iter().filter(|r| sub.wants(&r.name)).map(|r| (&*r.name, &**r)).collect())
        .unwrap_or_default()
}

/// A type's version: a hash over the names and versions it holds.
fn type_version(current: &BTreeMap<&str, &Resource>) -> String {
    let mut buf = Vec::new();
    for (n, r) in current {
        buf.extend_from_slice(n.as_bytes());
        buf.push(0);
        buf.extend_from_slice(r.version.as_bytes());
        buf.push(0);
    }
    content_hash(&buf)
}

/// Record the ACK or NACK a request carries, if any.
fn record_reply(client: &ClientHandle, type_url: &str, req: &DiscoveryRequest, stale: bool) {
    match (&req.error_detail, req.response_nonce.is_empty()) {
        (Some(status), _) => {
            warn!(
                type_url,
                nonce = req.response_nonce,
                version = req.version_info,
                detail = status.message,
                stale,
                "NACK: client kept its last good config"
            );
            client.nack(type_url, &req.response_nonce, &req.version_info, &status.message);
        }
        (None, false) => {
            debug!(type_url, nonce = req.response_nonce, version = req.version_info, stale, "ACK");
            client.ack(type_url, &req.response_nonce, &req.version_info);
        }
        (None, true) => {}
    }
}
