//! A FAKE Eureka server, in process, for the cases a real server
//! (`crate::eureka`) cannot be made to produce on demand: a wrong delta
//! hashcode, deltas refused with 403, the legacy one-element-object JSON, a
//! delta queue that forgets at once, and a request log to count full
//! fetches by. `e2e/README.md` lists which tests use it and why. It follows
//! the Eureka REST API (JSON only) for what a discovery client and our tests
//! use:
//!
//! - `GET /eureka/apps`: the full registry, every status;
//! - `GET /eureka/apps/delta`: the recently-changed queue (changes of the last
//!   [`DEFAULT_RETENTION`], oldest first, each with its `actionType`);
//! - `POST /eureka/apps/{app}` with `{"instance": {..}}`: register (204);
//! - `DELETE /eureka/apps/{app}/{id}`: cancel (200, 404 if unknown);
//! - `PUT /eureka/apps/{app}/{id}/status?value=OUT_OF_SERVICE`: set the
//!   overridden status (200, 404 if unknown);
//! - `DELETE /eureka/apps/{app}/{id}/status?value=UP`: drop the override;
//! - `PUT /eureka/apps/{app}/{id}`: heartbeat (200, 404 if unknown).
//!
//! Both answers carry `apps__hashcode`, computed as Eureka's
//! `Applications.getReconcileHashCode`: instances counted per `status`,
//! statuses sorted, `STATUS_count_` each (`DOWN_1_UP_2_`).
//!
//! Where it differs from a real server, on purpose:
//! - registration stores `status` and `overriddenstatus` as sent, without
//!   the server's override rules, so a test can send any combination;
//! - queue entries are snapshots taken at the change (a real server queues
//!   the live lease, so older entries show the newest state); replaying the
//!   queue in order ends in the same state either way;
//! - no leases expire, no response cache, no replication between fakes;
//! - a request without `Accept: application/json` gets 406, where a real
//!   server would answer XML;
//! - every answer says `Connection: close`, so that [`EurekaFake::stop`]
//!   really cuts clients off (no kept-alive connection outlives it).
//!
//! Test knobs: [`EurekaFake::corrupt_delta_hashcode`],
//! [`EurekaFake::refuse_deltas`] (403, as a server with deltas disabled),
//! [`EurekaFake::single_as_object`] (the legacy one-element-object JSON), and
//! a request log ([`EurekaFake::requests`]).

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::eureka::EurekaApi;

/// Eureka's `retentionTimeInMSInDeltaQueue` default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(180);

#[derive(Default)]
struct Registry {
    /// App (upper case) -> instance id -> instance JSON.
    apps: BTreeMap<String, BTreeMap<String, Value>>,
    /// (when, instance JSON with its actionType at that moment).
    recent: VecDeque<(Instant, Value)>,
    retention: Option<Duration>,
    versions_delta: u64,
    corrupt_hashcode: bool,
    refuse_deltas: bool,
    single_as_object: bool,
    /// `METHOD /path?query`, in arrival order.
    requests: Vec<String>,
}

type Shared = Arc<Mutex<Registry>>;

fn lock(s: &Shared) -> MutexGuard<'_, Registry> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running fake; stops serving when dropped.
pub struct EurekaFake {
    pub addr: SocketAddr,
    /// The REST API a client calls, at this fake.
    pub api: EurekaApi,
    state: Shared,
    task: Option<JoinHandle<()>>,
}

impl Drop for EurekaFake {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl EurekaFake {
    /// Serve on a free loopback port.
    pub async fn start() -> anyhow::Result<EurekaFake> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind 127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Shared::default();
        let task = Some(tokio::spawn(serve(listener, state.clone())));
        Ok(EurekaFake { addr, api: EurekaApi::new(&addr.to_string()), state, task })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `127.0.0.1:port`, as a registry `domain` entry.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// Stop listening: new connections are refused. The registry is kept.
    pub fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }

    /// Serve again on the same port, with the same registry.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        // The aborted task drops its listener at its next poll; retry briefly.
        let deadline = Instant::now() + Duration::from_secs(5);
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => return Err(e).context(format!("rebind {}", self.addr)),
            }
        };
        self.task = Some(tokio::spawn(serve(listener, self.state.clone())));
        Ok(())
    }

    /// Answer deltas with a wrong `apps__hashcode`, as a server would after
    /// changes the client's deltas missed.
    pub fn corrupt_delta_hashcode(&self, on: bool) {
        lock(&self.state).corrupt_hashcode = on;
    }

    /// Answer deltas with 403, as a server with `disableDelta` does.
    pub fn refuse_deltas(&self, on: bool) {
        lock(&self.state).refuse_deltas = on;
    }

    /// Write a one-element `application` or `instance` list as a bare
    /// object, as old XStream/Jettison servers did.
    pub fn single_as_object(&self, on: bool) {
        lock(&self.state).single_as_object = on;
    }

    /// Keep delta queue entries this long instead of [`DEFAULT_RETENTION`].
    pub fn set_delta_retention(&self, retention: Duration) {
        lock(&self.state).retention = Some(retention);
    }

    /// Every request so far, `METHOD /path?query`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).requests.clone()
    }

    /// The full registry's reconcile hashcode, as served.
    pub fn hashcode(&self) -> String {
        reconcile_hash_code(&lock(&self.state).apps)
    }
}

async fn serve(listener: TcpListener, state: Shared) {
    let app = Router::new()
        .route("/eureka/apps", get(full))
        .route("/eureka/apps/delta", get(delta))
        .route("/eureka/apps/{app}", post(register))
        .route("/eureka/apps/{app}/{id}", put(heartbeat).delete(cancel))
        .route("/eureka/apps/{app}/{id}/status", put(set_status).delete(delete_status))
        .layer(middleware::from_fn_with_state(state.clone(), log_and_close))
        .with_state(state);
    let _ = axum::serve(listener, app).await;
}

async fn log_and_close(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let line = format!("{} {}", req.method(), req.uri());
    lock(&state).requests.push(line);
    let wants_json =
        req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("application/json"));
    let mut resp = if req.method() == axum::http::Method::GET && !wants_json {
        (StatusCode::NOT_ACCEPTABLE, "this fake Eureka speaks JSON only: send Accept: application/json").into_response()
    } else {
        next.run(req).await
    };
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

fn now_millis() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `Applications.getReconcileHashCode` over the whole registry.
fn reconcile_hash_code(apps: &BTreeMap<String, BTreeMap<String, Value>>) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in apps.values().flat_map(|a| a.values()) {
        *counts.entry(i["status"].as_str().unwrap_or("UP").to_uppercase()).or_default() += 1;
    }
    counts.iter().map(|(status, n)| format!("{status}_{n}_")).collect()
}

fn applications(reg: &Registry, apps: Vec<(String, Vec<Value>)>, version: u64, hashcode: String) -> Value {
    let list = |mut items: Vec<Value>| {
        if reg.single_as_object && items.len() == 1 { items.remove(0) } else { Value::Array(items) }
    };
    let application: Vec<Value> =
        apps.into_iter().map(|(name, instances)| json!({"name": name, "instance": list(instances)})).collect();
    json!({"applications": {
        "versions__delta": version.to_string(),
        "apps__hashcode": hashcode,
        "application": list(application),
    }})
}

async fn full(State(state): State<Shared>) -> Response {
    let reg = lock(&state);
    let apps = reg.apps.iter().map(|(name, m)| (name.clone(), m.values().cloned().collect())).collect();
    let hashcode = reconcile_hash_code(&reg.apps);
    axum::Json(applications(&reg, apps, 1, hashcode)).into_response()
}

async fn delta(State(state): State<Shared>) -> Response {
    let mut reg = lock(&state);
    if reg.refuse_deltas {
        return StatusCode::FORBIDDEN.into_response();
    }
    let retention = reg.retention.unwrap_or(DEFAULT_RETENTION);
    while reg.recent.front().is_some_and(|(at, _)| at.elapsed() > retention) {
        reg.recent.pop_front();
    }
    // Grouped by app, each app's entries in queue order.
    let mut order: Vec<String> = Vec::new();
    let mut by_app: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (_, i) in &reg.recent {
        let app = i["app"].as_str().unwrap_or_default().to_string();
        if !by_app.contains_key(&app) {
            order.push(app.clone());
        }
        by_app.entry(app).or_default().push(i.clone());
    }
    let apps = order.into_iter().map(|a| (a.clone(), by_app.remove(&a).unwrap_or_default())).collect();
    let mut hashcode = reconcile_hash_code(&reg.apps);
    if reg.corrupt_hashcode {
        hashcode.push_str("CORRUPT_1_");
    }
    reg.versions_delta += 1;
    let version = reg.versions_delta;
    axum::Json(applications(&reg, apps, version, hashcode)).into_response()
}

fn changed(reg: &mut Registry, instance: &Value, action: &str) {
    let mut entry = instance.clone();
    entry["actionType"] = json!(action);
    reg.recent.push_back((Instant::now(), entry));
}

async fn register(State(state): State<Shared>, Path(app): Path<String>, body: axum::body::Bytes) -> Response {
    let Ok(Value::Object(mut wrapper)) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "expected {\"instance\": {..}}").into_response();
    };
    let Some(mut instance) = wrapper.remove("instance").filter(Value::is_object) else {
        return (StatusCode::BAD_REQUEST, "expected {\"instance\": {..}}").into_response();
    };
    let app = app.to_uppercase();
    // InstanceInfo.Builder upper-cases appName; the server rejects a mismatch.
    let declared = instance["app"].as_str().unwrap_or_default().to_uppercase();
    if declared != app {
        return (StatusCode::BAD_REQUEST, format!("Mismatched appName, expecting {app} but was {declared}"))
            .into_response();
    }
    let id = ["instanceId", "hostName"]
        .iter()
        .find_map(|k| instance[*k].as_str().filter(|s| !s.is_empty()).map(str::to_string));
    let Some(id) = id else {
        return (StatusCode::BAD_REQUEST, "Missing instanceId and hostName").into_response();
    };
    if instance["ipAddr"].as_str().is_none_or(str::is_empty) {
        return (StatusCode::BAD_REQUEST, "Missing ip address").into_response();
    }
    let now = now_millis().to_string();
    instance["app"] = json!(app);
    if instance.get("overriddenstatus").is_none() && instance.get("overriddenStatus").is_none() {
        instance["overriddenstatus"] = json!("UNKNOWN");
    }
    instance["lastUpdatedTimestamp"] = json!(now);
    instance["lastDirtyTimestamp"] = json!(now);
    let mut reg = lock(&state);
    changed(&mut reg, &instance, "ADDED");
    instance["actionType"] = json!("ADDED");
    reg.apps.entry(app).or_default().insert(id, instance);
    StatusCode::NO_CONTENT.into_response()
}

async fn cancel(State(state): State<Shared>, Path((app, id)): Path<(String, String)>) -> Response {
    let app = app.to_uppercase();
    let mut reg = lock(&state);
    let Some(instance) = reg.apps.get_mut(&app).and_then(|m| m.remove(&id)) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if reg.apps.get(&app).is_some_and(BTreeMap::is_empty) {
        reg.apps.remove(&app);
    }
    changed(&mut reg, &instance, "DELETED");
    StatusCode::OK.into_response()
}

async fn heartbeat(State(state): State<Shared>, Path((app, id)): Path<(String, String)>) -> Response {
    let known = lock(&state).apps.get(&app.to_uppercase()).is_some_and(|m| m.contains_key(&id));
    if known { StatusCode::OK } else { StatusCode::NOT_FOUND }.into_response()
}

/// `statusUpdate`: status and override both become `value`; a no-op when
/// the status is already that.
async fn set_status(
    State(state): State<Shared>,
    Path((app, id)): Path<(String, String)>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let Some(value) = q.get("value").map(|v| v.to_uppercase()) else {
        return (StatusCode::BAD_REQUEST, "missing value").into_response();
    };
    update_status(&state, &app, &id, &value, &value)
}

/// `deleteStatusOverride`: the override goes, status becomes `value`
/// (UNKNOWN when absent).
async fn delete_status(
    State(state): State<Shared>,
    Path((app, id)): Path<(String, String)>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let value = q.get("value").map_or("UNKNOWN".to_string(), |v| v.to_uppercase());
    update_status(&state, &app, &id, &value, "UNKNOWN")
}

fn update_status(state: &Shared, app: &str, id: &str, status: &str, overridden: &str) -> Response {
    let mut reg = lock(state);
    let Some(instance) = reg.apps.get_mut(&app.to_uppercase()).and_then(|m| m.get_mut(id)) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if instance["status"] == status && instance["overriddenstatus"] == overridden {
        return StatusCode::OK.into_response();
    }
    instance["status"] = json!(status);
    instance["overriddenstatus"] = json!(overridden);
    if let Some(o) = instance.as_object_mut() {
        o.remove("overriddenStatus");
    }
    instance["actionType"] = json!("MODIFIED");
    instance["lastUpdatedTimestamp"] = json!(now_millis().to_string());
    let snapshot = instance.clone();
    changed(&mut reg, &snapshot, "MODIFIED");
    StatusCode::OK.into_response()
}
