//! A FAKE Consul HTTP API, in process, for what a real Consul will not do on
//! request: answer one service's health with garbage, or claim to be
//! Consul Enterprise. Everything else is tested against the real agent
//! (`e2e/src/consul.rs`). It serves the calls the watcher makes, with the
//! JSON shapes of Consul 1.8:
//!
//! - `GET /v1/agent/self`: `{"Config": {"Datacenter": "dc1", "Version": ..}}`;
//! - `GET /v1/status/leader`: a leader address;
//! - `GET /v1/catalog/services`: every service, no tags;
//! - `GET /v1/catalog/nodes`: the one node, `fake`, never changed;
//! - `GET /v1/health/state/:state`: one passing check per service (so
//!   `critical` and `warning` are empty);
//! - `GET /v1/health/service/:name`: one passing instance, or the raw body
//!   set with [`ConsulFake::set_raw_health`].
//!
//! Every answer carries `X-Consul-Index`: one index bumped by each change,
//! except that `/v1/health/service/:name` answers with the index of that
//! service's last change, as Consul keeps one per service. A blocking query
//! (`index` equal to the current one) waits up to its `wait`, at most 1 s,
//! or until a change. `filter` and `tag` are honoured only as "match
//! nothing" (what the watcher's index probes send).
//! Every request line is logged ([`ConsulFake::requests`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

#[derive(Default)]
struct Inner {
    index: u64,
    version: String,
    /// Service -> instance port.
    services: BTreeMap<String, u16>,
    /// Service -> the index of its last change.
    service_index: HashMap<String, u64>,
    /// Service -> raw health answer replacing the good one.
    raw: HashMap<String, String>,
    requests: Vec<String>,
}

#[derive(Clone, Default)]
struct Shared {
    inner: Arc<Mutex<Inner>>,
    changed: Arc<Notify>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub struct ConsulFake {
    pub port: u16,
    shared: Shared,
    task: JoinHandle<()>,
}

impl Drop for ConsulFake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ConsulFake {
    /// Start on a free loopback port, reporting `version` from
    /// `/v1/agent/self` (`1.8.7`, or `1.8.7+ent` for Enterprise).
    pub async fn start(version: &str) -> anyhow::Result<ConsulFake> {
        let shared = Shared::default();
        {
            let mut inner = shared.lock();
            inner.index = 10;
            inner.version = version.to_string();
        }
        let app = Router::new()
            .route("/v1/agent/self", get(agent_self))
            .route("/v1/status/leader", get(|| async { axum::Json("127.0.0.1:8300") }))
            .route("/v1/catalog/services", get(catalog))
            .route("/v1/catalog/nodes", get(nodes))
            .route("/v1/health/state/{state}", get(checks))
            .route("/v1/health/service/{name}", get(health))
            .layer(middleware::from_fn_with_state(shared.clone(), log_request))
            .with_state(shared.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ConsulFake { port, shared, task })
    }

    /// Add (or re-port) a service with one passing instance on 127.0.0.1.
    pub fn add_service(&self, name: &str, port: u16) {
        self.change(name, |inner| {
            inner.services.insert(name.to_string(), port);
        });
    }

    /// Answer `name`'s health with `body` from now on (`None`: the good answer).
    pub fn set_raw_health(&self, name: &str, body: Option<&str>) {
        self.change(name, |inner| match body {
            Some(body) => {
                inner.raw.insert(name.to_string(), body.to_string());
            }
            None => {
                inner.raw.remove(name);
            }
        });
    }

    /// Every request line so far (`GET /path?query`).
    pub fn requests(&self) -> Vec<String> {
        self.shared.lock().requests.clone()
    }

    /// Requests whose line contains `needle`, from the `since`-th on.
    pub fn requests_containing(&self, since: usize, needle: &str) -> usize {
        self.shared.lock().requests.iter().skip(since).filter(|r| r.contains(needle)).count()
    }

    fn change(&self, service: &str, f: impl FnOnce(&mut Inner)) {
        {
            let mut inner = self.shared.lock();
            f(&mut inner);
            inner.index += 1;
            let index = inner.index;
            inner.service_index.insert(service.to_string(), index);
        }
        self.shared.changed.notify_waiters();
    }
}

async fn log_request(State(shared): State<Shared>, req: Request, next: Next) -> Response {
    let line = format!("{} {}", req.method(), req.uri());
    shared.lock().requests.push(line);
    next.run(req).await
}

/// Park a blocking query until a change or its wait (at most 1 s).
async fn block(shared: &Shared, query: &HashMap<String, String>) {
    let Some(index) = query.get("index").and_then(|i| i.parse::<u64>().ok()) else {
        return;
    };
    let wait = query
        .get("wait")
        .and_then(|w| w.strip_suffix("ms"))
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_millis)
        .min(Duration::from_secs(1));
    let changed = shared.changed.notified();
    if shared.lock().index != index {
        return;
    }
    let _ = tokio::time::timeout(wait, changed).await;
}

fn answer(index: u64, body: String) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert("X-Consul-Index", HeaderValue::from(index));
    headers.insert("Content-Type", HeaderValue::from_static("application/json"));
    (StatusCode::OK, headers, body).into_response()
}

async fn agent_self(State(shared): State<Shared>) -> Response {
    let (index, version) = {
        let inner = shared.lock();
        (inner.index, inner.version.clone())
    };
    answer(index, json!({"Config": {"Datacenter": "dc1", "NodeName": "fake", "Version": version}}).to_string())
}

async fn catalog(State(shared): State<Shared>, Query(query): Query<HashMap<String, String>>) -> Response {
    block(&shared, &query).await;
    let inner = shared.lock();
    let body: BTreeMap<&str, Vec<String>> = inner.services.keys().map(|s| (s.as_str(), vec![])).collect();
    answer(inner.index, serde_json::to_string(&body).unwrap_or_default())
}

async fn nodes(State(shared): State<Shared>, Query(query): Query<HashMap<String, String>>) -> Response {
    block(&shared, &query).await;
    let body = json!([{"Node": "fake", "Address": "127.0.0.1", "CreateIndex": 1, "ModifyIndex": 1}]);
    answer(shared.lock().index, body.to_string())
}

/// `/v1/health/state/:state`: every instance's one check passes, so only
/// `any` and `passing` list them.
async fn checks(
    State(shared): State<Shared>,
    Path(state): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    block(&shared, &query).await;
    let inner = shared.lock();
    let passing = matches!(state.as_str(), "any" | "passing");
    let checks: Vec<Value> = inner
        .services
        .keys()
        .filter(|_| passing)
        .map(|s| {
            json!({"Node": "fake", "CheckID": format!("{s}-1"), "ServiceName": s, "ServiceID": format!("{s}-1"),
                   "Status": "passing", "ModifyIndex": inner.index})
        })
        .collect();
    answer(inner.index, Value::from(checks).to_string())
}

async fn health(
    State(shared): State<Shared>,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    block(&shared, &query).await;
    let inner = shared.lock();
    let index = inner.service_index.get(&name).copied().unwrap_or(inner.index);
    if query.contains_key("filter") || query.contains_key("tag") {
        // Its instances carry no tag, and no filter is evaluated here.
        return answer(index, "[]".into());
    }
    if let Some(raw) = inner.raw.get(&name) {
        return answer(index, raw.clone());
    }
    let body = match inner.services.get(&name) {
        Some(port) => json!([{
            "Node": {"Node": "fake", "Address": "127.0.0.1"},
            "Service": {"ID": format!("{name}-1"), "Service": name, "Address": "127.0.0.1", "Port": port},
            "Checks": [{"Status": "passing"}],
        }]),
        None => json!([]),
    };
    answer(index, body.to_string())
}
