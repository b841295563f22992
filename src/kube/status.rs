//! `McpBridge.status`: conditions, per-registry health from the cache, and
//! the config errors that concern the object, written by the leader with
//! server-side apply under one field manager.
//!
//! Writes are rate-limited (one pass per `--status-interval`) and happen only
//! when the content differs from both what the API server shows and what we
//! last wrote, so a steady state causes no writes at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use meshbridge_registries::RegistryKind;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::crd::CrdFields;
use super::watch::{Observed, ObservedBridge, mcpbridge_resource};
use crate::cache::{Cache, RegistryKey, RegistryReport};
use crate::config::Desired;
use crate::time::rfc3339_secs;

/// The field manager of every write meshbridge makes.
pub const FIELD_MANAGER: &str = "meshbridge";

/// The `status` of one McpBridge, as JSON ready to apply.
pub type BridgeStatus = Value;

/// Compute the status of `bridge`. `previous` (what we or the API server
/// last had) keeps each condition's `lastTransitionTime` while its status
/// stays the same.
pub fn bridge_status(
    bridge: &ObservedBridge,
    desired: &Desired,
    reports: &[RegistryReport],
    previous: Option<&Value>,
    now: SystemTime,
) -> BridgeStatus {
    let id = bridge.id();
    let errors = errors_of(&desired.errors, &id);
    let mut registries = Vec::new();
    let mut not_ready = Vec::new();
    let mut unhealthy = Vec::new();
    for (i, entry) in bridge.registries.iter().enumerate() {
        let text = |field: &str| entry.get(field).and_then(Value::as_str).unwrap_or_default().to_owned();
        let (name, kind) = (text("name"), text("type"));
        let at = format!("spec.registries[{i}]");
        let entry_errors = entry_errors(&errors, &at);
        let running = RegistryKind::parse(&kind)
            .map(|k| RegistryKey::new(k, name.clone()))
            .filter(|key| desired.registries.iter().any(|s| s.kind == key.kind && s.name == key.name));
        let report = running.as_ref().and_then(|key| reports.iter().find(|r| &r.key == key));
        let mut item = json!({
            "name": name,
            "type": kind,
            "healthy": report.is_some_and(|r| r.status.healthy),
            "ready": report.is_some_and(|r| r.status.ready),
            "services": report.map_or(0, |r| r.services),
            "endpoints": report.map_or(0, |r| r.endpoints),
        });
        if let Some(t) = report.and_then(|r| r.status.last_sync_time) {
            item["lastSyncTime"] = Value::String(rfc3339_secs(t));
        }
        // Hosts other registries report too are merged; where they
        // disagree is named here as on /v1/config.
        if let Some(r) = report.filter(|r| r.shared_services > 0) {
            item["sharedServices"] = json!(r.shared_services);
            if !r.conflicts.is_empty() {
                item["conflicts"] = json!(r.conflicts);
            }
        }
        let message = if !entry_errors.is_empty() {
            Some(entry_errors.join("; "))
        } else if report.is_none() {
            Some("not running".to_owned())
        } else {
            report.filter(|r| !r.status.healthy).and_then(|r| r.status.last_error.clone())
        };
        if let Some(m) = message {
            item["message"] = Value::String(m);
        }
        if !report.is_some_and(|r| r.status.ready) {
            not_ready.push(name.clone());
        }
        if report.is_some_and(|r| !r.status.healthy) {
            unhealthy.push(name.clone());
        }
        registries.push(item);
    }

    let generation = bridge.generation.unwrap_or_default();
    let (ready, ready_reason, ready_message) = if not_ready.is_empty() {
        (true, "Synced", "every registry has completed its first sync".to_owned())
    } else {
        (false, "NotSynced", format!("not synced yet: {}", not_ready.join(", ")))
    };
    let (degraded, degraded_reason, degraded_message) = if !errors.is_empty() {
        (true, "ConfigErrors", format!("{} config error(s), see status.errors", errors.len()))
    } else if !unhealthy.is_empty() {
        (true, "RegistryUnhealthy", format!("unhealthy: {}", unhealthy.join(", ")))
    } else {
        (false, "AsExpected", "no config errors and every registry healthy".to_owned())
    };
    let conditions = vec![
        condition("Ready", truth(ready), ready_reason, &ready_message, generation, previous, now),
        condition("Degraded", truth(degraded), degraded_reason, &degraded_message, generation, previous, now),
    ];
    json!({
        "observedGeneration": generation,
        "conditions": conditions,
        "registries": registries,
        "errors": errors,
    })
}

fn truth(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// Add the `FieldsPreserved` condition: whether the installed CRD keeps
/// every field meshbridge reads (`crd.rs`).
pub fn with_fields_condition(
    mut status: BridgeStatus,
    fields: &CrdFields,
    previous: Option<&Value>,
    now: SystemTime,
) -> BridgeStatus {
    let generation = status["observedGeneration"].as_i64().unwrap_or_default();
    let (state, reason, message) = super::crd::condition(fields);
    let c = condition("FieldsPreserved", state, reason, &message, generation, previous, now);
    if let Some(list) = status["conditions"].as_array_mut() {
        list.push(c);
    }
    status
}

fn condition(
    kind: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: i64,
    previous: Option<&Value>,
    now: SystemTime,
) -> Value {
    let kept = previous
        .and_then(|p| p.get("conditions")?.as_array()?.iter().find(|c| c.get("type") == Some(&json!(kind))))
        .filter(|c| c.get("status") == Some(&json!(status)))
        .and_then(|c| c.get("lastTransitionTime").cloned());
    json!({
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": kept.unwrap_or_else(|| Value::String(rfc3339_secs(now))),
    })
}

/// The config errors about McpBridge `id`, without the object prefix: the
/// one place that reads the `"McpBridge {id}: "` form `config` writes.
pub(crate) fn errors_of(errors: &[String], id: &str) -> Vec<String> {
    let prefix = format!("McpBridge {id}: ");
    errors.iter().filter_map(|e| e.strip_prefix(&prefix)).map(str::to_owned).collect()
}

/// The errors of the entry at `at` (`spec.registries[2]`): its own path or
/// one of its fields.
fn entry_errors<'a>(errors: &'a [String], at: &str) -> Vec<&'a str> {
    errors
        .iter()
        .filter(|e| e.strip_prefix(at).is_some_and(|rest| rest.starts_with('.') || rest.starts_with(':')))
        .map(String::as_str)
        .collect()
}

/// Writes status for the leader.
pub(super) struct StatusWriter {
    client: Client,
    cache: Arc<Cache>,
    interval: Duration,
    /// What we last applied, per (namespace, name).
    written: HashMap<(String, String), Value>,
    /// What the installed CRD keeps.
    fields: watch::Receiver<CrdFields>,
}

impl StatusWriter {
    pub(super) fn new(
        client: Client,
        cache: Arc<Cache>,
        interval: Duration,
        fields: watch::Receiver<CrdFields>,
    ) -> Self {
        StatusWriter { client, cache, interval, written: HashMap::new(), fields }
    }

    pub(super) async fn run(mut self, observed: watch::Receiver<Arc<Observed>>, leader: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !*leader.borrow() {
                // A new term starts from what the API server shows.
                self.written.clear();
                continue;
            }
            let observed = observed.borrow().clone();
            let reports = self.cache.registries();
            self.written.retain(|(ns, name), _| observed.bridges.iter().any(|b| &b.namespace == ns && &b.name == name));
            for bridge in &observed.bridges {
                let key = (bridge.namespace.clone(), bridge.name.clone());
                let previous = self.written.get(&key).or(bridge.status.as_ref());
                let now = SystemTime::now();
                let status = bridge_status(bridge, &observed.desired, &reports, previous, now);
                let status = with_fields_condition(status, &self.fields.borrow(), previous, now);
                if bridge.status.as_ref() == Some(&status) || self.written.get(&key) == Some(&status) {
                    continue;
                }
                // The lease may have gone while we computed.
                if !*leader.borrow() {
                    break;
                }
                match self.apply(bridge, &status).await {
                    Ok(()) => {
                        info!(mcpbridge = %bridge.id(), "status written");
                        self.written.insert(key, status);
                    }
                    Err(error) => {
                        warn!(mcpbridge = %bridge.id(), %error, "status write failed; retrying next interval")
                    }
                }
            }
        }
    }

    async fn apply(&self, bridge: &ObservedBridge, status: &Value) -> Result<(), kube::Error> {
        let ar = mcpbridge_resource();
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), &bridge.namespace, &ar);
        let patch = json!({ "apiVersion": ar.api_version, "kind": ar.kind, "status": status });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        api.patch_status(&bridge.name, &params, &Patch::Apply(&patch)).await?;
        debug!(mcpbridge = %bridge.id(), "applied status");
        Ok(())
    }
}
