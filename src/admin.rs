//! Admin HTTP on `--admin-addr`: probes, per-registry health, debug views,
//! Prometheus metrics and a status page. Every answer is JSON (metrics and
//! the page aside), errors included (`{"error": "…"}`), and none ever
//! contains a credential.
//!
//! | path | what |
//! | --- | --- |
//! | `/`, `/ui/…` | the status page, HTML for a browser ([`page`]) |
//! | `/healthz`, `/ready` | liveness; readiness (open even when a token is required) |
//! | `/v1/registries[/{name}[/services/{host}]]` | registry health and contents ([`registries`]) |
//! | `/registry/watcherStatus` | Higress-compatible registry status |
//! | `/v1/config` | config files, errors and translation warnings |
//! | `/debug/configz`, `/debug/xdsz` | the Istio config set; connected xDS clients |
//! | `/metrics` | Prometheus ([`crate::metrics`]) |

mod auth;
mod error;
mod page;
pub mod registries;
mod serve;
mod state;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::json;

pub use auth::{Auth, ct_eq};
pub use error::ApiError;
pub use serve::{AdminLimits, serve};
pub use state::AdminState;

use crate::metrics;
use crate::translate::model::IstioObject;

pub fn router(state: AdminState) -> Router {
    let auth = state.auth.clone();
    Router::new()
        .route("/", get(page::index))
        .route("/ui/registries/{kind}/{name}", get(page::registry))
        .route("/ui/registries/{kind}/{name}/services/{host}", get(page::service))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/v1/registries", get(registries::list))
        .route("/v1/registries/{name}", get(registries::one))
        .route("/v1/registries/{name}/services/{host}", get(registries::service))
        .route("/registry/watcherStatus", get(registries::watcher_status))
        .route("/v1/config", get(config_status))
        .route("/debug/configz", get(configz))
        .route("/debug/xdsz", get(xdsz))
        .route("/metrics", get(prometheus))
        .fallback(|uri: Uri| async move { ApiError::not_found(format!("no such endpoint: {}", uri.path())) })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "the admin API is read-only: use GET")
        })
        .layer(axum::middleware::from_fn_with_state(auth, auth::require))
        .with_state(state)
}

/// Ready when the set being served is complete: every registry has
/// answered, been loaded from the state dump (stale, listed), or cannot
/// start (a bad spec is reported, it does not hold readiness). Not ready
/// while shutting down, so a load balancer stops sending new clients first.
async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    if s.clients.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"ready": false, "draining": true})));
    }
    let waiting: Vec<String> = crate::startup::missing(&s.cache).iter().map(|k| k.to_string()).collect();
    let set = s.config.borrow().clone();
    if waiting.is_empty() && !set.readiness.incomplete {
        let stale: Vec<String> =
            s.cache.registries().into_iter().filter(|r| r.status.stale).map(|r| r.key.to_string()).collect();
        (StatusCode::OK, Json(json!({"ready": true, "stale": stale})))
    } else {
        // `serving`: the startup wait timed out and clients are being sent
        // the incomplete set.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"ready": false, "waitingFor": waiting, "serving": !set.readiness.held})),
        )
    }
}

/// The config as it stands: each file's state, every current config error
/// (file, document and field path in its text), and every translation
/// warning with the object it concerns and its reason.
async fn config_status(State(s): State<AdminState>) -> impl IntoResponse {
    let set = s.config.borrow().clone();
    let warnings: Vec<serde_json::Value> =
        set.warnings().map(|w| json!({"object": w.object, "reason": w.reason.as_str(), "detail": w.detail})).collect();
    Json(json!({
        "revision": set.revision,
        "files": &*set.config.files,
        "errors": &*set.config.errors,
        "warnings": warnings,
    }))
}

/// The current Istio objects, as a Kubernetes `List`.
async fn configz(State(s): State<AdminState>) -> impl IntoResponse {
    let set = s.config.borrow().clone();
    let items: Vec<&IstioObject> = set.istio.values().map(|o| &**o).collect();
    Json(json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": set.revision.to_string()},
        "items": items,
    }))
}

async fn xdsz(State(s): State<AdminState>) -> impl IntoResponse {
    Json(json!({"clients": s.clients.snapshot()}))
}

async fn prometheus(State(s): State<AdminState>) -> Result<Response, ApiError> {
    let body = s
        .metrics
        .render()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}")))?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response())
}
