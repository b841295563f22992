//! Incremental (delta) ADS: one [`DeltaStream`] per client stream.
//!
//! The client tells us what it has (`initial_resource_versions` on a
//! reconnect) and what it wants (`resource_names_subscribe` /
//! `_unsubscribe`, with `*` for wildcard). We send only resources whose
//! version differs from what the client has, and name the ones that went
//! away in `removed_resources`. A NACK is logged and recorded; the rejected
//! versions count as sent, so they are not pushed again until they change.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use tracing::{debug, warn};

use super::clients::NACK_DETAIL_BYTES;
use super::limits::{short, truncate};
use super::response::DeltaResponse;
use super::tracker::Tracker;
use super::{ClientHandle, Subscription, push_order};
use crate::translate::ConfigSet;
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};

#[derive(Debug, Default)]
struct TypeState {
    /// The subscription and what the client has (or is applying).
    tracker: Tracker,
    started: bool,
}

#[derive(Debug)]
pub struct DeltaStream {
    types: BTreeMap<String, TypeState>,
    next_nonce: u64,
    client: ClientHandle,
    examined: u64,
}

impl DeltaStream {
    pub fn new(client: ClientHandle) -> Self {
        DeltaStream { types: BTreeMap::new(), next_nonce: 0, client, examined: 0 }
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

    pub fn on_request(&mut self, req: &DeltaDiscoveryRequest, set: &ConfigSet) -> Vec<DeltaResponse> {
        if let Some(node) = &req.node {
            self.client.set_node(&node.id);
        }
        let type_url = req.type_url.clone();
        let st = self.types.entry(type_url.clone()).or_default();
        let first = !st.started;
        let known = self.client.visible(set, &type_url);
        if first {
            st.started = true;
            let sub = Subscription::from_names(&type_url, &req.resource_names_subscribe, known);
            // What the client already has after a reconnect: not re-sent if
            // unchanged, and reported removed if gone.
            let name = |n: &str| known.get(n).map(|r| r.name.clone()).unwrap_or_else(|| n.into());
            st.tracker.start(sub, req.initial_resource_versions.iter().map(|(k, v)| (name(k), Arc::from(v.as_str()))));
        } else {
            for name in &req.resource_names_subscribe {
                // An explicit (re)subscribe always gets the resource.
                st.tracker.subscribe(name, known);
            }
            for name in &req.resource_names_unsubscribe {
                st.tracker.unsubscribe(name);
            }
            if !req.resource_names_subscribe.is_empty() || !req.resource_names_unsubscribe.is_empty() {
                st.tracker.share_sub();
            }
        }
        self.client.subscribed(&type_url, st.tracker.sub());
        // The first request for a type is answered whatever nonce it carries
        // (a client reconnecting from another server sends its old stream's
        // nonce); such a nonce acknowledges nothing sent on this stream.
        if !req.response_nonce.is_empty() && !first {
            match &req.error_detail {
                Some(status) => {
                    if let Some(unlogged) = self.client.nack_log() {
                        warn!(
                                type_url,
                                nonce = %short(&req.response_nonce),
                                detail = %truncate(&status.message, NACK_DETAIL_BYTES),
                        unlogged,
                                "NACK: client kept its last good config"
                            );
                    }
                    self.client.nack(&type_url, &req.response_nonce, &req.response_nonce, &status.message);
                }
                None => {
                    debug!(type_url, nonce = %short(&req.response_nonce), "ACK");
                    self.client.ack(&type_url, &req.response_nonce, &req.response_nonce);
                }
            }
        }
        // The first request is always answered, even with nothing, so the
        // client's initial fetch completes.
        self.respond(&type_url, set, first, &HashSet::new()).map(|(resp, _)| resp).into_iter().collect()
    }

    pub fn on_change(&mut self, set: &ConfigSet) -> Vec<DeltaResponse> {
        let mut out = Vec::new();
        let mut forced = HashSet::new();
        for type_url in push_order(self.types.keys()) {
            let force = if type_url == ENDPOINT_TYPE { std::mem::take(&mut forced) } else { HashSet::new() };
            if let Some((resp, replaced)) = self.respond(&type_url, set, false, &force) {
                if type_url == CLUSTER_TYPE {
                    forced.extend(replaced);
                }
                out.push(resp);
            }
        }
        out
    }

    /// Send what differs from what the client has (and, when `always`, an
    /// empty response if nothing does). Returns the response and the names
    /// it re-sent with a new version.
    fn respond(
        &mut self,
        type_url: &str,
        set: &ConfigSet,
        always: bool,
        force: &HashSet<Arc<str>>,
    ) -> Option<(DeltaResponse, Vec<Arc<str>>)> {
        let st = self.types.get_mut(type_url)?;
        let now = self.client.visible(set, type_url);
        let changes = st.tracker.changes(now, set.revision, force);
        self.examined += changes.examined as u64;
        st.tracker.commit(now, set.revision, Vec::new());
        if changes.is_empty() && !always {
            return None;
        }
        let removed: Vec<String> = changes.removed.iter().map(|(n, _)| n.to_string()).collect();
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        debug!(type_url, nonce, size = changes.upserts.len(), removed = removed.len(), "sent delta response");
        // The published resources themselves: encoded from them, not copied.
        let resp = DeltaResponse {
            resources: changes.upserts,
            type_url: type_url.to_string(),
            removed_resources: removed,
            nonce,
        };
        self.client.sent(&resp, set.changed_at, st.tracker.holding());
        Some((resp, changes.replaced))
    }
}
