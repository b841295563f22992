//! A FAKE kube-apiserver, in process, for what the real one
//! (`apiserver.rs`, `tests/kube_apiserver.rs`) cannot be made to do on
//! demand: a 410 at a chosen moment, a log of every request, millisecond
//! Lease timing (e2e/README.md lists the cases). It speaks the real REST
//! protocol for what meshbridge and `kubectl` use, over plain HTTP:
//!
//! - discovery: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/{group}/{version}`;
//! - list with `resourceVersion` in the list metadata, `labelSelector`
//!   (`k=v`, `k!=v`, `k`, `!k`) and `fieldSelector` (`path=v`, `path!=v`);
//! - `?watch=true` streaming newline-delimited JSON events (`ADDED`,
//!   `MODIFIED`, `DELETED`, `BOOKMARK` when `allowWatchBookmarks`), from the
//!   `resourceVersion` asked for; one older than the retained history gets
//!   an `ERROR` event carrying a `Status` with code 410 (`Expired`), as etcd
//!   compaction causes;
//! - create (POST, 409 `AlreadyExists`), get, replace (PUT, 409 `Conflict`
//!   on a stale `metadata.resourceVersion`), delete;
//! - PATCH: `application/merge-patch+json` (RFC 7386, with a
//!   `metadata.resourceVersion` precondition), `application/json-patch+json`
//!   (RFC 6902 `test`/`add`/`replace`/`remove`; a failed `test` is 422) and
//!   `application/apply-patch+yaml` (server-side apply), on the object and on
//!   its `/status` subresource;
//! - `metadata.generation` bumps when anything but metadata and status
//!   changes; the main resource ignores status changes and `/status` ignores
//!   everything else, as for a CRD with the status subresource;
//! - CustomResourceDefinitions: creating one serves its resource.
//!
//! Where it differs from a real server, on purpose:
//! - server-side apply merges the applied object into the stored one (maps
//!   recursively, lists replaced) and on `/status` replaces `status`
//!   wholesale; there are no managed fields and no conflicts between field
//!   managers;
//! - no authentication, admission, defaulting, schema validation or pruning;
//!   strategic merge patch is treated as a JSON merge patch;
//! - one resourceVersion counter for everything, and lists are never paged.
//!
//! Test knobs: [`KubeFake::expire_watches`] (cut every open watch with a 410
//! and forget the history), [`KubeFake::requests`] (a log of every request).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;

mod patch;
mod stream;

use patch::{json_patch_into, merge_into};
use stream::{matches, watch_stream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bookmarks go out this often on an idle watch.
const BOOKMARK_EVERY: Duration = Duration::from_millis(500);
/// Events kept for watches to resume from.
const HISTORY: usize = 10_000;
/// Request bodies larger than this are refused.
const MAX_BODY: usize = 4 << 20;

/// A served resource type.
#[derive(Debug, Clone)]
struct ResType {
    group: String,
    version: String,
    plural: String,
    singular: String,
    kind: String,
    namespaced: bool,
    short_names: Vec<String>,
}

impl ResType {
    fn new(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        ResType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            short_names: Vec::new(),
        }
    }
    fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }
    fn key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }
}

/// One watch event as stored.
#[derive(Debug, Clone)]
struct Event {
    rv: u64,
    res: String,
    kind: &'static str,
    object: Value,
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct LoggedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
}

#[derive(Default)]
struct Store {
    types: Vec<ResType>,
    /// Resource key → (namespace, name) → object.
    objects: HashMap<String, BTreeMap<(String, String), Value>>,
    rv: u64,
    history: Vec<Event>,
    /// Watches from before this resourceVersion get 410: the history
    /// holds every event after it.
    compacted: u64,
    /// Bumped by [`KubeFake::expire_watches`]: open watches end with 410.
    epoch: u64,
    requests: Vec<LoggedRequest>,
    uid: u64,
}

struct Shared {
    store: Mutex<Store>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The fake API server. Dropping it stops it.
pub struct KubeFake {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl KubeFake {
    /// Serve on a free loopback port, with Secrets, Namespaces, Ingresses,
    /// IngressClasses, Leases and CRDs (add the McpBridge CRD to serve
    /// McpBridges, or use [`KubeFake::with_mcpbridge`]).
    pub async fn start() -> anyhow::Result<KubeFake> {
        let types = vec![
            ResType::new("", "v1", "namespaces", "Namespace", false),
            ResType::new("", "v1", "secrets", "Secret", true),
            ResType::new("networking.k8s.io", "v1", "ingresses", "Ingress", true),
            ResType::new("networking.k8s.io", "v1", "ingressclasses", "IngressClass", false),
            ResType::new("coordination.k8s.io", "v1", "leases", "Lease", true),
            ResType::new("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", false),
        ];
        let shared =
            Arc::new(Shared { store: Mutex::new(Store { types, ..Default::default() }), changed: watch::channel(0).0 });
        let listener = TcpListener::bind("127.0.0.1:0").await.context("bind kube fake")?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(KubeFake { addr, shared, task })
    }

    /// [`KubeFake::start`] with the McpBridge resource already served.
    pub async fn with_mcpbridge() -> anyhow::Result<KubeFake> {
        let fake = KubeFake::start().await?;
        fake.shared.lock().types.push(ResType::new("networking.higress.io", "v1", "mcpbridges", "McpBridge", true));
        Ok(fake)
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Create or replace an object (status included), as a test's
    /// `kubectl apply` would, bumping `generation` when the spec changed.
    pub fn put(&self, object: Value) -> Value {
        let mut store = self.shared.lock();
        let res = store.type_of(&object).unwrap_or_else(|| panic!("kube fake: no type for {object}"));
        let (ns, name) = ids(&object, &res);
        let old = store.objects.get(&res.key()).and_then(|m| m.get(&(ns.clone(), name.clone()))).cloned();
        let out = match old {
            Some(old) => store.write(&res, &ns, &name, object, Some(&old)),
            None => store.write(&res, &ns, &name, object, None),
        };
        drop(store);
        self.shared.changed.send_modify(|v| *v += 1);
        out
    }

    /// The stored object, if any. `resource` is `group/plural` (`/secrets`
    /// for the core group).
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let store = self.shared.lock();
        store.objects.get(resource)?.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> bool {
        let mut store = self.shared.lock();
        let gone = store.remove(resource, namespace, name).is_some();
        drop(store);
        self.shared.changed.send_modify(|v| *v += 1);
        gone
    }

    /// End every open watch with a 410 and forget the event history, so a
    /// client must list again; changes made meanwhile are only in the list.
    pub fn expire_watches(&self) {
        let mut store = self.shared.lock();
        store.epoch += 1;
        store.compacted = store.rv;
        store.history.clear();
        drop(store);
        self.shared.changed.send_modify(|v| *v += 1);
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.shared.lock().requests.clone()
    }
}

impl Drop for KubeFake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn ids(object: &Value, res: &ResType) -> (String, String) {
    let meta = &object["metadata"];
    let ns = if res.namespaced { meta["namespace"].as_str().unwrap_or("default").to_owned() } else { String::new() };
    (ns, meta["name"].as_str().unwrap_or_default().to_owned())
}

impl Store {
    fn type_of(&self, object: &Value) -> Option<ResType> {
        let (api_version, kind) = (object["apiVersion"].as_str()?, object["kind"].as_str()?);
        self.types.iter().find(|t| t.api_version() == api_version && t.kind == kind).cloned()
    }

    fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<ResType> {
        self.types.iter().find(|t| t.group == group && t.version == version && t.plural == plural).cloned()
    }

    /// Store `object` as the new version, with server-set metadata, and
    /// record the event.
    fn write(&mut self, res: &ResType, ns: &str, name: &str, mut object: Value, old: Option<&Value>) -> Value {
        self.rv += 1;
        let generation = match old {
            None => 1,
            Some(old) => {
                let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
                if strip(old) != strip(&object) { g + 1 } else { g }
            }
        };
        let uid = match old {
            Some(old) => old["metadata"]["uid"].clone(),
            None => {
                self.uid += 1;
                json!(format!("00000000-0000-0000-0000-{:012}", self.uid))
            }
        };
        let created = old.map_or_else(|| json!("2026-01-01T00:00:00Z"), |o| o["metadata"]["creationTimestamp"].clone());
        let obj = object.as_object_mut().expect("object");
        obj.insert("apiVersion".into(), json!(res.api_version()));
        obj.insert("kind".into(), json!(res.kind));
        let meta = obj.entry("metadata").or_insert_with(|| json!({}));
        meta["name"] = json!(name);
        if res.namespaced {
            meta["namespace"] = json!(ns);
        }
        meta["resourceVersion"] = json!(self.rv.to_string());
        meta["generation"] = json!(generation);
        meta["uid"] = uid;
        meta["creationTimestamp"] = created;
        if res.kind == "CustomResourceDefinition" {
            self.serve_crd(&object);
        }
        self.objects.entry(res.key()).or_default().insert((ns.to_owned(), name.to_owned()), object.clone());
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.record(res.key(), kind, object.clone());
        object
    }

    fn remove(&mut self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let mut object = self.objects.get_mut(resource)?.remove(&(ns.to_owned(), name.to_owned()))?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        self.record(resource.to_owned(), "DELETED", object.clone());
        Some(object)
    }

    fn record(&mut self, res: String, kind: &'static str, object: Value) {
        self.history.push(Event { rv: self.rv, res, kind, object });
        if self.history.len() > HISTORY {
            let drop = self.history.len() - HISTORY;
            self.compacted = self.history[drop].rv - 1;
            self.history.drain(..drop);
        }
    }

    fn serve_crd(&mut self, crd: &Value) {
        let spec = &crd["spec"];
        let names = &spec["names"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        for version in spec["versions"].as_array().into_iter().flatten() {
            if version["served"] == json!(false) {
                continue;
            }
            let mut res = ResType::new(
                &text(&spec["group"]),
                &text(&version["name"]),
                &text(&names["plural"]),
                &text(&names["kind"]),
                spec["scope"] != json!("Cluster"),
            );
            if let Some(s) = names["singular"].as_str() {
                res.singular = s.to_owned();
            }
            res.short_names = names["shortNames"].as_array().into_iter().flatten().map(text).collect();
            self.types.retain(|t| !(t.group == res.group && t.version == res.version && t.plural == res.plural));
            self.types.push(res);
        }
    }
}

/// Everything but metadata and status: what `generation` counts.
fn strip(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code < 400 { "Success" } else { "Failure" },
        "message": message, "reason": reason, "code": code,
    });
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

fn json_response(value: Value) -> Response {
    axum::Json(value).into_response()
}

/// The parsed request path of a resource request.
struct Target {
    res: ResType,
    /// From the path; `None` for all namespaces or a cluster-scoped type.
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query: HashMap<String, String> =
        req.uri().query().map(|q| url_decode_pairs(q).into_iter().collect()).unwrap_or_default();
    let content_type =
        req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    shared.lock().requests.push(LoggedRequest {
        method: method.to_string(),
        path: path.clone(),
        query: req.uri().query().unwrap_or_default().to_owned(),
        content_type: content_type.clone(),
    });
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return status(413, "RequestEntityTooLarge", "request body too large".into()),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["version"] => {
            return json_response(
                json!({"major": "1", "minor": "35", "gitVersion": "v1.35.0-meshbridge-fake", "platform": "linux/amd64"}),
            );
        }
        ["api"] => {
            return json_response(json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}));
        }
        ["apis"] => return json_response(group_list(&shared.lock())),
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return status(404, "NotFound", format!("the server could not find the requested resource ({path})")),
    };
    if rest.is_empty() {
        return match resource_list(&shared.lock(), group, version) {
            Some(list) => json_response(list),
            None => status(404, "NotFound", format!("no group version {group}/{version}")),
        };
    }
    let (namespace, rest) = match rest {
        ["namespaces", ns, more @ ..] if !more.is_empty() => (Some((*ns).to_owned()), more),
        other => (None, other),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some((*name).to_owned()), None),
        [plural, name, sub] => (*plural, Some((*name).to_owned()), Some(*sub)),
        _ => return status(404, "NotFound", format!("bad path {path}")),
    };
    let Some(res) = shared.lock().find_type(group, version, plural) else {
        return status(404, "NotFound", format!("the server could not find the requested resource ({path})"));
    };
    if sub.is_some_and(|s| s != "status") {
        return status(404, "NotFound", format!("no subresource {sub:?}"));
    }
    let target = Target { res, namespace, name, status: sub.is_some() };
    match (method, target.name.is_some()) {
        (Method::GET, false) if query.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch_stream(shared, target, query)
        }
        (Method::GET, false) => list(&shared, &target, &query),
        (Method::GET, true) => get_one(&shared, &target),
        (Method::POST, false) => create(&shared, &target, &body),
        (Method::PUT, true) => replace(&shared, &target, &body),
        (Method::PATCH, true) => patch(&shared, &target, &content_type, &body),
        (Method::DELETE, true) => delete(&shared, &target),
        (m, _) => status(405, "MethodNotAllowed", format!("{m} not allowed here")),
    }
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn group_list(store: &Store) -> Value {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for t in store.types.iter().filter(|t| !t.group.is_empty()) {
        let versions = groups.entry(&t.group).or_default();
        if !versions.contains(&t.version.as_str()) {
            versions.push(&t.version);
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> =
                vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(store: &Store, group: &str, version: &str) -> Option<Value> {
    let types: Vec<&ResType> = store.types.iter().filter(|t| t.group == group && t.version == version).collect();
    if types.is_empty() {
        return None;
    }
    let verbs = ["create", "delete", "get", "list", "patch", "update", "watch"];
    let mut resources = Vec::new();
    for t in types {
        resources.push(json!({"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind, "verbs": verbs, "shortNames": t.short_names}));
        resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"]}));
    }
    let gv = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

fn list(shared: &Shared, target: &Target, query: &HashMap<String, String>) -> Response {
    let store = shared.lock();
    let items: Vec<Value> = store
        .objects
        .get(&target.res.key())
        .into_iter()
        .flat_map(|m| m.values())
        .filter(|o| matches(o, target, query))
        .cloned()
        .collect();
    json_response(json!({
        "kind": format!("{}List", target.res.kind),
        "apiVersion": target.res.api_version(),
        "metadata": {"resourceVersion": store.rv.to_string()},
        "items": items,
    }))
}

fn key_of(target: &Target) -> (String, String) {
    (target.namespace.clone().unwrap_or_default(), target.name.clone().unwrap_or_default())
}

fn get_one(shared: &Shared, target: &Target) -> Response {
    let store = shared.lock();
    match store.objects.get(&target.res.key()).and_then(|m| m.get(&key_of(target))) {
        Some(o) => json_response(o.clone()),
        None => not_found(target),
    }
}

fn not_found(target: &Target) -> Response {
    let name = target.name.clone().unwrap_or_default();
    status(404, "NotFound", format!("{}.{} {name:?} not found", target.res.plural, target.res.group))
}

// The error is the answer to send, built once per request.
#[allow(clippy::result_large_err)]
fn parse_body(body: &Bytes) -> Result<Value, Response> {
    let text = std::str::from_utf8(body).map_err(|_| status(400, "BadRequest", "body is not UTF-8".into()))?;
    serde_json::from_str(text)
        .or_else(|_| serde_saphyr::from_str::<Value>(text))
        .map_err(|e| status(400, "BadRequest", format!("body: {e}")))
}

fn changed(shared: &Shared) {
    shared.changed.send_modify(|v| *v += 1);
}

fn create(shared: &Shared, target: &Target, body: &Bytes) -> Response {
    let object = match parse_body(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(422, "Invalid", "metadata.name: Required value".into());
    };
    let ns = if target.res.namespaced {
        target
            .namespace
            .clone()
            .or_else(|| object["metadata"]["namespace"].as_str().map(str::to_owned))
            .unwrap_or_default()
    } else {
        String::new()
    };
    let mut store = shared.lock();
    if store.objects.get(&target.res.key()).is_some_and(|m| m.contains_key(&(ns.clone(), name.clone()))) {
        return status(
            409,
            "AlreadyExists",
            format!("{}.{} {name:?} already exists", target.res.plural, target.res.group),
        );
    }
    let out = store.write(&target.res, &ns, &name, object, None);
    drop(store);
    changed(shared);
    (StatusCode::CREATED, axum::Json(out)).into_response()
}

/// Keep the old status on the main resource, the old everything-else on
/// `/status`.
fn scope_write(target: &Target, old: &Value, mut new: Value) -> Value {
    if target.status {
        let mut out = old.clone();
        out["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        out
    } else {
        if let Some(m) = new.as_object_mut() {
            match old.get("status") {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.remove("status"),
            };
        }
        new
    }
}

// The error is the answer to send, built once per request.
#[allow(clippy::result_large_err)]
fn precondition(old: &Value, new: &Value, target: &Target) -> Result<(), Response> {
    match new["metadata"]["resourceVersion"].as_str() {
        Some(rv) if Some(rv) != old["metadata"]["resourceVersion"].as_str() => Err(status(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {}.{} {:?}: the object has been modified; please apply your changes to the latest version and try again",
                target.res.plural,
                target.res.group,
                target.name.clone().unwrap_or_default()
            ),
        )),
        _ => Ok(()),
    }
}

fn replace(shared: &Shared, target: &Target, body: &Bytes) -> Response {
    let new = match parse_body(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let mut store = shared.lock();
    let Some(old) = store.objects.get(&target.res.key()).and_then(|m| m.get(&key_of(target))).cloned() else {
        return not_found(target);
    };
    if let Err(r) = precondition(&old, &new, target) {
        return r;
    }
    let new = scope_write(target, &old, new);
    let (ns, name) = key_of(target);
    let out = store.write(&target.res, &ns, &name, new, Some(&old));
    drop(store);
    changed(shared);
    json_response(out)
}

fn patch(shared: &Shared, target: &Target, content_type: &str, body: &Bytes) -> Response {
    let patch = match parse_body(body) {
        Ok(o) => o,
        Err(r) => return r,
    };
    let apply = content_type.starts_with("application/apply-patch");
    let merge = content_type.starts_with("application/merge-patch")
        || content_type.starts_with("application/strategic-merge-patch");
    let json_patch = content_type.starts_with("application/json-patch");
    if !apply && !merge && !json_patch {
        return status(415, "UnsupportedMediaType", format!("the fake does not take {content_type:?} patches"));
    }
    let mut store = shared.lock();
    let (ns, name) = key_of(target);
    let old = store.objects.get(&target.res.key()).and_then(|m| m.get(&(ns.clone(), name.clone()))).cloned();
    let out = match old {
        None if apply && !target.status => store.write(&target.res, &ns, &name, patch, None),
        None => return not_found(target),
        Some(old) => {
            if merge && let Err(r) = precondition(&old, &patch, target) {
                return r;
            }
            let mut new = old.clone();
            if json_patch {
                if let Err(r) = json_patch_into(&mut new, &patch) {
                    return r;
                }
            } else if apply && target.status {
                new["status"] = patch.get("status").cloned().unwrap_or(Value::Null);
            } else {
                merge_into(&mut new, &patch, merge);
            }
            let new = scope_write(target, &old, new);
            if new == old {
                return json_response(old);
            }
            store.write(&target.res, &ns, &name, new, Some(&old))
        }
    };
    drop(store);
    changed(shared);
    json_response(out)
}

fn delete(shared: &Shared, target: &Target) -> Response {
    let (ns, name) = key_of(target);
    let removed = shared.lock().remove(&target.res.key(), &ns, &name);
    match removed {
        Some(o) => {
            changed(shared);
            json_response(o)
        }
        None => not_found(target),
    }
}
