//! The fake's watch streams and selectors.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{BOOKMARK_EVERY, Shared, Target, status};

/// Whether `object` is in `target`'s scope and matches the selectors.
pub(super) fn matches(object: &Value, target: &Target, query: &HashMap<String, String>) -> bool {
    if let Some(ns) = &target.namespace
        && object["metadata"]["namespace"].as_str() != Some(ns)
    {
        return false;
    }
    let labels = &object["metadata"]["labels"];
    let label_ok = query.get("labelSelector").is_none_or(|sel| {
        sel.split(',').filter(|t| !t.trim().is_empty()).all(|term| {
            let term = term.trim();
            if let Some((k, v)) = term.split_once("!=") {
                labels[k.trim()].as_str() != Some(v.trim())
            } else if let Some((k, v)) = term.split_once('=') {
                labels[k.trim().trim_end_matches('=')].as_str() == Some(v.trim().trim_start_matches('='))
            } else if let Some(k) = term.strip_prefix('!') {
                labels.get(k).is_none()
            } else {
                labels.get(term).is_some()
            }
        })
    });
    let field_ok = query.get("fieldSelector").is_none_or(|sel| {
        sel.split(',').filter(|t| !t.trim().is_empty()).all(|term| {
            let field =
                |path: &str| path.trim().split('.').fold(object, |v, k| &v[k]).as_str().unwrap_or_default().to_owned();
            if let Some((k, v)) = term.split_once("!=") {
                field(k) != v.trim()
            } else if let Some((k, v)) = term.split_once('=') {
                field(k.trim_end_matches('=')) == v.trim().trim_start_matches('=')
            } else {
                false
            }
        })
    });
    label_ok && field_ok
}

/// A watch: events after the asked-for resourceVersion, then live ones,
/// bookmarks when idle, until `timeoutSeconds`, a 410, or the client leaves.
pub(super) fn watch_stream(shared: Arc<Shared>, target: Target, query: HashMap<String, String>) -> Response {
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = query.get("timeoutSeconds").and_then(|t| t.parse().ok()).unwrap_or(1800u64);
    let from: Option<u64> = query.get("resourceVersion").and_then(|v| v.parse().ok()).filter(|&v| v > 0);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(1024);
    let mut changes = shared.changed.subscribe();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        let send = |v: Value| {
            let mut line = serde_json::to_vec(&v).unwrap_or_default();
            line.push(b'\n');
            tx.try_send(Ok(Bytes::from(line))).is_ok()
        };
        let (mut pos, epoch, mut initial) = {
            let store = shared.lock();
            match from {
                Some(rv) if rv < store.compacted => {
                    send(expired(rv, store.compacted));
                    return;
                }
                Some(rv) => (rv, store.epoch, Vec::new()),
                // No resourceVersion: the current state as ADDED events first.
                None => {
                    let now: Vec<Value> = store
                        .objects
                        .get(&target.res.key())
                        .into_iter()
                        .flat_map(|m| m.values())
                        .filter(|o| matches(o, &target, &query))
                        .map(|o| json!({"type": "ADDED", "object": o}))
                        .collect();
                    (store.rv, store.epoch, now)
                }
            }
        };
        for e in initial.drain(..) {
            if !send(e) {
                return;
            }
        }
        loop {
            let (events, expired_now, rv) = {
                let store = shared.lock();
                let events: Vec<Value> = store
                    .history
                    .iter()
                    .filter(|e| e.rv > pos && e.res == target.res.key() && matches(&e.object, &target, &query))
                    .map(|e| json!({"type": e.kind, "object": e.object}))
                    .collect();
                (events, store.epoch != epoch, store.rv)
            };
            if expired_now {
                send(expired(pos, rv));
                return;
            }
            for e in events {
                if !send(e) {
                    return;
                }
            }
            pos = rv;
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                () = tokio::time::sleep(BOOKMARK_EVERY) => {
                    if bookmarks && !send(json!({"type": "BOOKMARK", "object": {
                        "kind": target.res.kind, "apiVersion": target.res.api_version(),
                        "metadata": {"resourceVersion": pos.to_string()}}})) {
                        return;
                    }
                }
                () = tokio::time::sleep_until(deadline) => return,
                () = tx.closed() => return,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| status(500, "InternalError", "watch".into()))
}

fn expired(asked: u64, oldest: u64) -> Value {
    json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too old resource version: {asked} ({oldest})"), "reason": "Expired", "code": 410,
    }})
}
