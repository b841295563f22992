//! Incremental (delta) ADS: one [`DeltaStream`] per client stream.
//!
//! The client tells us what it has (`initial_resource_versions` on a
//! reconnect) and what it wants (`resource_names_subscribe` /
//! `_unsubscribe`, with `*` for wildcard). We send only resources whose
//! version differs from what the client has, and name the ones that went
//! away in `removed_resources`. A NACK is logged and recorded; the rejected
//! versions count as sent, so they are not pushed again until they change.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as XdsResource,
};
use tracing::{debug, warn};

use super::sotw::subscribed;
use super::{ClientHandle, Subscription, push_order};
use crate::translate::ConfigSet;
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};

#[derive(Debug, Default)]
struct TypeState {
    sub: Subscription,
    /// name → version the client has (or is applying).
    sent: BTreeMap<String, String>,
    started: bool,
}

#[derive(Debug)]
pub struct DeltaStream {
    types: BTreeMap<String, TypeState>,
    next_nonce: u64,
    client: ClientHandle,
}

impl DeltaStream {
    pub fn new(client: ClientHandle) -> Self {
        DeltaStream { types: BTreeMap::new(), next_nonce: 0, client }
    }

    pub fn on_request(&mut self, req: &DeltaDiscoveryRequest, set: &ConfigSet) -> Vec<DeltaDiscoveryResponse> {
        if let Some(node) = &req.node {
            self.client.set_node(&node.id);
        }
        let type_url = req.type_url.clone();
        let st = self.types.entry(type_url.clone()).or_default();
        let first = !st.started;
        if first {
            st.started = true;
            st.sub = Subscription::from_names(&type_url, &req.resource_names_subscribe);
            // What the client already has after a reconnect: not re-sent if
            // unchanged, and reported removed if gone.
            st.sent = req.initial_resource_versions.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        } else {
            for name in &req.resource_names_subscribe {
                if !st.sub.add(name) {
                    continue;
                }
                // An explicit (re)subscribe always gets the resource.
                st.sent.remove(name);
            }
            for name in &req.resource_names_unsubscribe {
                st.sub.remove(name);
            }
            let sub = st.sub.clone();
            st.sent.retain(|n, _| sub.wants(n));
        }
        self.client.subscribed(&type_url, &st.sub);
        // The first request for a type is answered whatever nonce it carries
        // (a client reconnecting from another server sends its old stream's
        // nonce); such a nonce acknowledges nothing sent on this stream.
        if !req.response_nonce.is_empty() && !first {
            match &req.error_detail {
                Some(status) => {
                    warn!(
                        type_url,
                        nonce = req.response_nonce,
                        detail = status.message,
                        "NACK: client kept its last good config"
                    );
                    self.client.nack(&type_url, &req.response_nonce, &req.response_nonce, &status.message);
                }
                None => {
                    debug!(type_url, nonce = req.response_nonce, "ACK");
                    self.client.ack(&type_url, &req.response_nonce, &req.response_nonce);
                }
            }
        }
        // The first request is always answered, even with nothing, so the
        // client's initial fetch completes.
        self.respond(&type_url, set, first, &BTreeSet::new()).into_iter().collect()
    }

    pub fn on_change(&mut self, set: &ConfigSet) -> Vec<DeltaDiscoveryResponse> {
        let mut out = Vec::new();
        let mut forced = BTreeSet::new();
        for type_url in push_order(self.types.keys()) {
            let force = if type_url == ENDPOINT_TYPE { forced.clone() } else { BTreeSet::new() };
            let before = self.types[&type_url].sent.clone();
            if let Some(resp) = self.respond(&type_url, set, false, &force) {
                if type_url == CLUSTER_TYPE {
                    forced
                        .extend(resp.resources.iter().filter(|r| before.contains_key(&r.name)).map(|r| r.name.clone()));
                }
                out.push(resp);
            }
        }
        out
    }

    fn respond(
        &mut self,
        type_url: &str,
        set: &ConfigSet,
        always: bool,
        force: &BTreeSet<String>,
    ) -> Option<DeltaDiscoveryResponse> {
        let st = self.types.get_mut(type_url)?;
        let current = subscribed(set, type_url, &st.sub);
        let resources: Vec<XdsResource> = current
            .values()
            .filter(|r| st.sent.get(&*r.name).map(String::as_str) != Some(&*r.version) || force.contains(&*r.name))
            .map(|r| XdsResource {
                name: r.name.to_string(),
                version: r.version.to_string(),
                resource: Some(r.body.clone()),
                ..Default::default()
            })
            .collect();
        let removed: Vec<String> = st.sent.keys().filter(|n| !current.contains_key(n.as_str())).cloned().collect();
        if resources.is_empty() && removed.is_empty() && !always {
            return None;
        }
        for n in &removed {
            st.sent.remove(n);
        }
        for r in &resources {
            st.sent.insert(r.name.clone(), r.version.clone());
        }
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        debug!(type_url, nonce, size = resources.len(), removed = removed.len(), "sent delta response");
        let resp = DeltaDiscoveryResponse {
            resources,
            type_url: type_url.to_string(),
            removed_resources: removed,
            nonce,
            ..Default::default()
        };
        self.client.sent(&resp, set.changed_at);
        Some(resp)
    }
}
