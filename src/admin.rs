//! Admin HTTP on `--admin-addr`: probes, per-registry health, debug views
//! and Prometheus metrics. Every answer is JSON (metrics aside), errors
//! included (`{"error": "…"}`), and none ever contains a credential.
//!
//! | path | what |
//! | --- | --- |
//! | `/healthz`, `/ready` | liveness; readiness (open even when a token is required) |
//! | `/v1/registries[/{name}[/services/{host}]]` | registry health and contents ([`registries`]) |
//! | `/registry/watcherStatus` | Higress-compatible registry status |
//! | `/debug/configz`, `/debug/xdsz` | the Istio config set; connected xDS clients |
//! | `/metrics` | Prometheus ([`crate::metrics`]) |

mod auth;
pub mod registries;
mod serve;
pub mod time;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::json;
use tokio::sync::watch;

pub use auth::{Auth, ct_eq};
pub use serve::{AdminLimits, serve};

use crate::cache::Cache;
use crate::metrics::{self, Metrics};
use crate::translate::ConfigSet;
use crate::xds::Clients;

#[derive(Clone)]
pub struct AdminState {
    pub cache: Arc<Cache>,
    pub config: watch::Receiver<Arc<ConfigSet>>,
    pub clients: Arc<Clients>,
    pub metrics: Arc<Metrics>,
    pub auth: Auth,
}

/// An error answer: `{"error": message}` with a status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into() }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.message}))).into_response()
    }
}

pub fn router(state: AdminState) -> Router {
    let auth = state.auth.clone();
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/v1/registries", get(registries::list))
        .route("/v1/registries/{name}", get(registries::one))
        .route("/v1/registries/{name}/services/{host}", get(registries::service))
        .route("/registry/watcherStatus", get(registries::watcher_status))
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

/// Ready once every registry has finished its first sync or has failed it:
/// a dead registry is reported, it does not hold startup hostage.
async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    let waiting: Vec<String> = s
        .cache
        .statuses()
        .into_iter()
        .filter(|(_, st, ..)| !st.ready && st.last_error.is_none())
        .map(|(k, ..)| k.to_string())
        .collect();
    if waiting.is_empty() {
        (StatusCode::OK, Json(json!({"ready": true})))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"ready": false, "waitingFor": waiting})))
    }
}

/// The current Istio objects, as a Kubernetes `List`.
async fn configz(State(s): State<AdminState>) -> impl IntoResponse {
    let set = s.config.borrow().clone();
    let items = &set.istio;
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
