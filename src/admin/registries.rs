//! Per-registry health and contents: `/v1/registries…` and Higress's
//! `/registry/watcherStatus`.
//!
//! Field names are camelCase and stable; times are RFC 3339 (UTC) or
//! `null`. `endpoint` is the spec's `domain:port` and never carries
//! credentials; `lastError` has every credential of the spec scrubbed.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Json;
use meshbridge_registries::{RegistryKind, Service, Tls};
use serde::{Deserialize, Serialize};

use super::{AdminState, ApiError};
use crate::cache::RegistryReport;
use crate::time;

/// One registry, as `GET /v1/registries` lists it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistryView {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `domain:port`, no credentials.
    pub endpoint: String,
    /// The most recent call to the registry (list, watch or probe) succeeded.
    pub healthy: bool,
    /// The first full sync has completed.
    pub ready: bool,
    pub services: usize,
    pub endpoints: usize,
    /// Of its services, those other registries report too: they are served
    /// merged (docs/src/migration.md).
    pub shared_services: usize,
    /// Where it disagrees with those registries (the first 10), as the
    /// `host_conflict` warnings of `/v1/config` say it.
    pub conflicts: Vec<String>,
    pub last_sync_time: Option<String>,
    pub last_change_time: Option<String>,
    pub last_error: Option<String>,
    pub last_error_time: Option<String>,
    pub consecutive_failures: u64,
    /// Serving services loaded from the state dump; the registry has not
    /// answered since the start.
    pub stale: bool,
    /// The served config lacks this registry: it has neither answered nor
    /// been loaded from the dump (after `--initial-sync-timeout`, or added
    /// since the start).
    pub missing: bool,
    /// `--max-stale` withdrew its endpoints.
    pub withdrawn: bool,
    /// Unreachable (or stale) since.
    pub unreachable_since: Option<String>,
    /// Services the anti-entropy pass repaired since the watcher started,
    /// by kind (`missed_change`, `stale_read`, `index_reset`,
    /// `name_resolution`, `unreadable`); every kind is listed, 0 or not.
    pub repairs: std::collections::BTreeMap<&'static str, u64>,
    /// The last repair: when, why, how many services, and the first of them.
    pub last_repair: Option<RepairView>,
    /// Only with `?services=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_list: Option<Vec<ServiceSummary>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairView {
    pub time: String,
    pub kind: &'static str,
    pub count: usize,
    pub services: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSummary {
    pub host: String,
    pub ports: Vec<PortView>,
    pub endpoints: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortView {
    pub number: u16,
    pub protocol: String,
    pub name: String,
}

/// `GET /v1/registries/{name}/services/{host}`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceDetail {
    pub registry: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub host: String,
    pub ports: Vec<PortView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsView>,
    pub endpoints: Vec<EndpointView>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsView {
    pub sni: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    pub address: String,
    pub port: u16,
    pub weight: u32,
    pub labels: meshbridge_registries::Labels,
    /// Why this instance counts as healthy, per registry type.
    pub health_source: &'static str,
}

/// Higress's `RegistryWatcherStatus` (`registry/reconcile/reconcile.go`),
/// field for field.
#[derive(Debug, Serialize)]
pub struct WatcherStatus {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub healthy: bool,
    pub ready: bool,
}

#[derive(Debug, Default, Deserialize)]
pub struct RegistryQuery {
    /// Include the service list.
    #[serde(default)]
    services: bool,
    /// Registry type, when several types use the same name.
    #[serde(rename = "type")]
    kind: Option<String>,
}

/// What each registry's watchers treat as a healthy instance; instances
/// that are not are never endpoints.
pub fn health_source(kind: RegistryKind) -> &'static str {
    match kind {
        RegistryKind::Consul => "consul: all checks passing",
        RegistryKind::Nacos | RegistryKind::Nacos2 | RegistryKind::Nacos3 => "nacos: healthy and enabled",
        RegistryKind::Eureka => "eureka: status UP",
        RegistryKind::Zookeeper => "zookeeper: provider registered",
        RegistryKind::Static => "static: listed in the McpBridge (not health checked)",
        RegistryKind::Dns => "dns: resolved address (not health checked)",
        RegistryKind::Kubernetes => "kubernetes: ready and not terminating in the Service's EndpointSlices",
    }
}

fn when(t: Option<SystemTime>) -> Option<String> {
    t.map(time::rfc3339)
}

/// `domain:port` with anything before an `@` dropped: the spec has no
/// credentials there, and we make sure none are ever shown.
pub(super) fn public_endpoint(endpoint: &str) -> String {
    endpoint.rsplit_once('@').map_or(endpoint, |(_, rest)| rest).to_string()
}

fn ports(svc: &Service) -> Vec<PortView> {
    svc.ports
        .iter()
        .map(|p| PortView { number: p.number, protocol: p.protocol.to_string(), name: p.name.clone() })
        .collect()
}

fn view(r: &RegistryReport) -> RegistryView {
    let st = &r.status;
    RegistryView {
        name: r.key.name.clone(),
        kind: r.key.kind.as_str(),
        endpoint: public_endpoint(&r.endpoint),
        healthy: st.healthy,
        ready: st.ready,
        services: r.services,
        endpoints: r.endpoints,
        shared_services: r.shared_services,
        conflicts: r.conflicts.clone(),
        last_sync_time: when(st.last_sync_time),
        last_change_time: when(st.last_change_time),
        last_error: st.last_error.clone(),
        last_error_time: when(st.last_error_time),
        consecutive_failures: st.consecutive_failures,
        stale: st.stale,
        missing: !crate::startup::counts(st),
        withdrawn: st.withdrawn,
        unreachable_since: when(st.unreachable_since),
        repairs: meshbridge_registries::RepairKind::ALL
            .iter()
            .map(|k| (k.as_str(), st.repairs.get(k.as_str()).copied().unwrap_or(0)))
            .collect(),
        last_repair: st.last_repair.as_ref().map(|r| RepairView {
            time: time::rfc3339(r.time),
            kind: r.kind.as_str(),
            count: r.count,
            services: r.services.clone(),
        }),
        service_list: None,
    }
}

/// The registry called `name`: of type `kind` if given, else the first
/// (in type order) when several types share the name.
fn find(s: &AdminState, name: &str, kind: Option<&str>) -> Result<RegistryReport, ApiError> {
    let kind = match kind {
        Some(k) => Some(RegistryKind::parse(k).ok_or_else(|| {
            let known: Vec<&str> = RegistryKind::ALL.iter().map(|k| k.as_str()).collect();
            ApiError::new(StatusCode::BAD_REQUEST, format!("unknown registry type {k:?}; one of {}", known.join(", ")))
        })?),
        None => None,
    };
    s.cache.registries().into_iter().find(|r| r.key.name == name && kind.is_none_or(|k| r.key.kind == k)).ok_or_else(
        || match kind {
            Some(k) => ApiError::not_found(format!("no registry named {name:?} of type {k}")),
            None => ApiError::not_found(format!("no registry named {name:?}")),
        },
    )
}

fn query(q: Result<Query<RegistryQuery>, QueryRejection>) -> Result<RegistryQuery, ApiError> {
    q.map(|Query(q)| q).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))
}

fn path<T>(p: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(p)| p).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))
}

/// `GET /v1/registries`
pub async fn list(State(s): State<AdminState>) -> Json<Vec<RegistryView>> {
    Json(s.cache.registries().iter().map(view).collect())
}

/// `GET /v1/registries/{name}[?services=true][&type=…]`
pub async fn one(
    State(s): State<AdminState>,
    name: Result<Path<String>, PathRejection>,
    q: Result<Query<RegistryQuery>, QueryRejection>,
) -> Result<Json<RegistryView>, ApiError> {
    let (name, q) = (path(name)?, query(q)?);
    let report = find(&s, &name, q.kind.as_deref())?;
    let mut v = view(&report);
    if q.services {
        let services = s.cache.registry(&report.key).map(|(_, svcs)| svcs).unwrap_or_default();
        v.service_list = Some(
            services
                .values()
                .map(|svc| ServiceSummary { host: svc.host.clone(), ports: ports(svc), endpoints: svc.endpoints.len() })
                .collect(),
        );
    }
    Ok(Json(v))
}

/// `GET /v1/registries/{name}/services/{host}[?type=…]`
pub async fn service(
    State(s): State<AdminState>,
    p: Result<Path<(String, String)>, PathRejection>,
    q: Result<Query<RegistryQuery>, QueryRejection>,
) -> Result<Json<ServiceDetail>, ApiError> {
    let ((name, host), q) = (path(p)?, query(q)?);
    let report = find(&s, &name, q.kind.as_deref())?;
    let svc: Arc<Service> = s
        .cache
        .registry(&report.key)
        .and_then(|(_, mut svcs)| svcs.remove(&host))
        .ok_or_else(|| ApiError::not_found(format!("registry {}: no service {host:?}", report.key)))?;
    let health = health_source(report.key.kind);
    Ok(Json(ServiceDetail {
        registry: report.key.name.clone(),
        kind: report.key.kind.as_str(),
        host: svc.host.clone(),
        ports: ports(&svc),
        tls: svc.tls.as_ref().map(|Tls { sni }| TlsView { sni: sni.clone() }),
        endpoints: svc
            .endpoints
            .iter()
            .map(|ep| EndpointView {
                address: ep.address.clone(),
                port: ep.port,
                weight: ep.weight,
                labels: ep.labels.clone(),
                health_source: health,
            })
            .collect(),
    }))
}

/// `GET /registry/watcherStatus`: Higress's shape, a bare array. (Higress
/// answers `null` when it has no watchers; we answer `[]`.)
pub async fn watcher_status(State(s): State<AdminState>) -> Json<Vec<WatcherStatus>> {
    Json(
        s.cache
            .registries()
            .into_iter()
            .map(|r| WatcherStatus {
                name: r.key.name,
                kind: r.key.kind.as_str(),
                healthy: r.status.healthy,
                ready: r.status.ready,
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_health_source() {
        for kind in RegistryKind::ALL {
            assert!(health_source(kind).starts_with(kind.as_str().trim_end_matches(['2', '3'])), "{kind}");
        }
    }

    #[test]
    fn endpoint_never_shows_userinfo() {
        assert_eq!(public_endpoint("127.0.0.1:8500"), "127.0.0.1:8500");
        assert_eq!(public_endpoint("user:pw@consul:8500"), "consul:8500");
    }
}
