//! Admin HTTP: readiness, liveness and debug views, on `--admin-addr`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde_json::json;
use tokio::sync::watch;

use crate::cache::Cache;
use crate::translate::ConfigSet;
use crate::xds::Clients;

#[derive(Clone)]
pub struct AdminState {
    pub cache: Arc<Cache>,
    pub config: watch::Receiver<Arc<ConfigSet>>,
    pub clients: Arc<Clients>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .route("/debug/configz", get(configz))
        .route("/debug/xdsz", get(xdsz))
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
    Json(json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": set.revision.to_string()},
        "items": set.service_entries,
    }))
}

async fn xdsz(State(s): State<AdminState>) -> impl IntoResponse {
    Json(json!({"clients": s.clients.snapshot()}))
}
