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
mod error;
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
