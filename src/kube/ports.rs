//! Proxy `listenerPort` write-back, as Higress does: a proxy without a
//! `listenerPort` gets one from translation (50001–50999); the leader writes
//! that port into `spec.proxies[].listenerPort` so it stays the same for good,
//! whatever other proxies come and go later.
//!
//! The write is a JSON patch that first `test`s `spec.proxies` against the
//! list it was computed from, then replaces it: if someone edited the
//! proxies meanwhile the API server rejects it (422) and the next observation
//! tries again, while unrelated changes (a status write) do not get in the
//! way, as a `resourceVersion` precondition would. Once written, the entry
//! has a port and is never patched again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::FIELD_MANAGER;
use super::watch::{Observed, ObservedBridge, mcpbridge_resource};
use crate::config::ProxySpec;
use crate::translate::proxy::{PortError, listener_ports};

/// Retry failed patches this often even when nothing changes.
const RETRY: Duration = Duration::from_secs(10);

pub(super) struct PortPinner {
    client: Client,
    reserved: BTreeSet<u16>,
    /// Per McpBridge, the `spec.proxies` our last applied patch replaced.
    patched: HashMap<(String, String), Vec<Value>>,
}

impl PortPinner {
    pub(super) fn new(client: Client, reserved: BTreeSet<u16>) -> Self {
        PortPinner { client, reserved, patched: HashMap::new() }
    }

    pub(super) async fn run(mut self, mut observed: watch::Receiver<Arc<Observed>>, mut leader: watch::Receiver<bool>) {
        let mut retry = tokio::time::interval(RETRY);
        loop {
            if *leader.borrow_and_update() {
                let current = observed.borrow_and_update().clone();
                for (bridge, proxies) in pins(&current, &self.reserved) {
                    // Until the watch shows our patch, the observation is
                    // stale: patching it again would only be rejected.
                    let key = (bridge.namespace.clone(), bridge.name.clone());
                    if self.patched.get(&key) == Some(&bridge.proxies) {
                        continue;
                    }
                    if self.patch(&bridge, proxies).await {
                        self.patched.insert(key, bridge.proxies.clone());
                    }
                }
            }
            tokio::select! {
                r = observed.changed() => if r.is_err() { return },
                r = leader.changed() => if r.is_err() { return },
                _ = retry.tick() => {}
            }
        }
    }

    /// Whether the patch was applied.
    async fn patch(&self, bridge: &ObservedBridge, proxies: Vec<Value>) -> bool {
        let ar = mcpbridge_resource();
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &bridge.namespace, &ar);
        let ops = json!([
            { "op": "test", "path": "/spec/proxies", "value": bridge.proxies },
            { "op": "replace", "path": "/spec/proxies", "value": proxies },
        ]);
        let patch: json_patch::Patch = match serde_json::from_value(ops) {
            Ok(p) => p,
            Err(error) => {
                warn!(%error, "cannot build the listenerPort patch");
                return false;
            }
        };
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match api.patch(&bridge.name, &params, &Patch::<()>::Json(patch)).await {
            Ok(_) => {
                info!(mcpbridge = %bridge.id(), "pinned proxy listener ports");
                return true;
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 422 => {
                debug!(mcpbridge = %bridge.id(), "proxies changed meanwhile; pinning on the next observation")
            }
            Err(error) => warn!(mcpbridge = %bridge.id(), %error, "cannot pin proxy listener ports"),
        }
        false
    }
}

/// For each McpBridge with a proxy that has no `listenerPort` yet but was
/// given one, its `spec.proxies` with those ports filled in. A proxy name
/// declared by several McpBridges is a config error and is left alone.
pub(crate) fn pins(observed: &Observed, reserved: &BTreeSet<u16>) -> Vec<(ObservedBridge, Vec<Value>)> {
    let unpinned: Vec<ProxySpec> =
        observed.desired.proxies.iter().filter(|p| p.listener_port.is_none()).cloned().collect();
    if unpinned.is_empty() {
        return Vec::new();
    }
    // Assigned among all proxies, exactly as translation assigns them.
    let assigned: BTreeMap<String, Result<u16, PortError>> = listener_ports(&observed.desired.proxies, reserved);
    let mut declared: HashMap<&str, usize> = HashMap::new();
    for bridge in &observed.bridges {
        for entry in &bridge.proxies {
            if let Some(name) = entry.get("name").and_then(Value::as_str) {
                *declared.entry(name).or_default() += 1;
            }
        }
    }
    let mut out = Vec::new();
    for bridge in &observed.bridges {
        let mut proxies = bridge.proxies.clone();
        let mut changed = false;
        for entry in &mut proxies {
            let Some(name) = entry.get("name").and_then(Value::as_str).map(str::to_owned) else { continue };
            let has_port = entry.get("listenerPort").and_then(Value::as_u64).is_some_and(|p| p != 0);
            if has_port || declared.get(name.as_str()) != Some(&1) || !unpinned.iter().any(|p| p.name == name) {
                continue;
            }
            if let Some(Ok(port)) = assigned.get(&name) {
                entry["listenerPort"] = json!(port);
                changed = true;
            }
        }
        if changed {
            out.push((bridge.clone(), proxies));
        }
    }
    out
}
