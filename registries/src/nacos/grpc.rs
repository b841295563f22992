//! Nacos 2.x/3.x over gRPC (`type: nacos2`, `nacos3`): our own client on
//! one HTTP/2 connection (see `wire.rs` for the protocol).
//!
//! A client holds one connection to one of its servers at a time, and one
//! supervisor task: it watches the connection (the bi-stream's end, and a
//! `HealthCheckRequest` every [`HEALTH_EVERY`]), and when it breaks,
//! connects again with our backoff, cut short once a server that refused
//! connections accepts them again (`retry::wait_or_reopened`), then
//! subscribes every service again ([`RESUBSCRIBE_CONCURRENCY`] at once) and
//! queues each with the instances the answer carried, so changes missed
//! during the outage are read. Pushes go into the watcher's [`Pushed`]
//! queue from the connection's one reader task: nothing per service.
//!
//! Calls made while the client is not connected fail at once (they do not
//! wait for a connection). Dropping the client aborts its tasks, which
//! closes the connection.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{StreamExt, stream};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tracing::{Instrument, debug, info};

use super::api::{Api, PROBE_PAGE, Probe, is_auth_error, list_all, refused_read};
use super::auth::{ACCESS_TOKEN, Auth};
use super::decode::{Instance, PUBLIC_NAMESPACE, ServiceKey};
use super::pushed::Pushed;
use super::servers::grpc_addr;
use super::wire::{Conn, Headers, Push, PushSink, ServiceInfo};
use crate::retry::{Backoff, wait_or_reopened};
use crate::tls::RegistryTls;
use crate::watcher::RegistryError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a connection is checked with a `HealthCheckRequest`.
const HEALTH_EVERY: Duration = Duration::from_secs(5);
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);
/// Subscriptions renewed at once after a reconnect.
const RESUBSCRIBE_CONCURRENCY: usize = 16;

pub(crate) struct GrpcApi {
    shared: Arc<Shared>,
    supervisor: tokio::task::JoinHandle<()>,
}

struct Shared {
    registry: String,
    servers: Vec<String>,
    tls: Option<RegistryTls>,
    /// The namespace id as the server knows it (`public` for the default).
    namespace: String,
    auth: Arc<Auth>,
    /// Deadline of each call (`nacosTimeout`, else [`CALL_TIMEOUT`]).
    call_timeout: Mutex<Duration>,
    /// The live connection; `None` while reconnecting.
    conn: watch::Sender<Option<Arc<Conn>>>,
    /// Why the last connect failed.
    last_error: Mutex<Option<String>>,
    subscribed: Mutex<HashSet<ServiceKey>>,
    /// Where pushes of subscribed services go (set by the first subscribe).
    pushed: Mutex<Option<Arc<Pushed>>>,
}

impl Drop for GrpcApi {
    fn drop(&mut self) {
        self.supervisor.abort();
        self.shared.conn.send_replace(None);
    }
}

impl GrpcApi {
    pub async fn connect(
        registry: &str,
        servers: Vec<String>,
        namespace_id: &str,
        auth: Arc<Auth>,
        tls: Option<&RegistryTls>,
    ) -> Result<GrpcApi, RegistryError> {
        // Log in first so that a refused login is reported as such rather
        // than as requests refused later.
        auth.ensure(&servers).await?;
        let namespace = if namespace_id.is_empty() { PUBLIC_NAMESPACE } else { namespace_id };
        let shared = Arc::new(Shared {
            registry: registry.to_string(),
            servers,
            tls: tls.cloned(),
            namespace: namespace.to_string(),
            auth,
            call_timeout: Mutex::new(CALL_TIMEOUT),
            conn: watch::Sender::new(None),
            last_error: Mutex::default(),
            subscribed: Mutex::default(),
            pushed: Mutex::default(),
        });
        let first = shared.connect_any(0).await?;
        shared.conn.send_replace(Some(first.clone()));
        let supervisor = tokio::spawn(supervise(Arc::downgrade(&shared), first).in_current_span());
        Ok(GrpcApi { shared, supervisor })
    }

    /// Each call's deadline, `nacosTimeout` when set.
    pub fn with_call_timeout(self, timeout: Option<Duration>) -> GrpcApi {
        *self.shared.call_timeout.lock().unwrap_or_else(PoisonError::into_inner) = timeout.unwrap_or(CALL_TIMEOUT);
        self
    }

    /// The server address of the live connection, if any (tests).
    #[cfg(test)]
    pub fn connected_to(&self) -> Option<String> {
        self.shared.conn.borrow().as_ref().map(|c| c.addr.clone())
    }
}

impl Shared {
    fn call_timeout(&self) -> Duration {
        *self.call_timeout.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connect to the first server that answers, starting at `start`.
    async fn connect_any(self: &Arc<Self>, start: usize) -> Result<Arc<Conn>, RegistryError> {
        let mut reasons = Vec::new();
        let n = self.servers.len();
        for i in 0..n {
            let server = &self.servers[(start + i) % n];
            let Some(addr) = grpc_addr(server) else {
                reasons.push(format!("{server}: no port"));
                continue;
            };
            let weak = Arc::downgrade(self);
            let sink: PushSink = Arc::new(move |push: Push| {
                if let Some(shared) = weak.upgrade() {
                    shared.on_push(push);
                }
            });
            let tls = self.tls.as_ref();
            match Conn::connect(&self.registry, &addr, tls, &self.namespace, CONNECT_TIMEOUT, self.headers(None), sink)
                .await
            {
                Ok(conn) => return Ok(Arc::new(conn)),
                Err(e @ RegistryError::Config { .. }) => return Err(e),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        let reason = reasons.join("; ");
        *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason.clone());
        Err(RegistryError::Unreachable { registry: self.registry.clone(), reason })
    }

    fn on_push(&self, push: Push) {
        if !self.subscribed.lock().unwrap_or_else(PoisonError::into_inner).contains(&push.key) {
            return;
        }
        if let Some(pushed) = self.pushed.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            pushed.mark(&push.key, Some(push.instances));
        }
    }

    /// The token and the AK/SK signature for a call on `resource`.
    fn headers(&self, resource: Option<&str>) -> Headers {
        let mut headers = Vec::new();
        if let Some(token) = self.auth.token() {
            headers.push((ACCESS_TOKEN, token.expose().to_string()));
        }
        headers.extend(self.auth.signature(resource).into_iter().flatten());
        headers
    }

    /// One request on the live connection, with a fresh token and a deadline.
    async fn call(
        &self,
        kind: &str,
        body: serde_json::Value,
        resource: Option<&str>,
        deadline: Duration,
    ) -> Result<bytes::Bytes, RegistryError> {
        self.auth.ensure(&self.servers).await?;
        let Some(conn) = self.conn.borrow().clone().filter(|c| !c.is_closed()) else {
            let why = self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone();
            return Err(RegistryError::Unreachable {
                registry: self.registry.clone(),
                reason: format!(
                    "{}: not connected ({})",
                    kind.trim_end_matches("Request"),
                    why.unwrap_or("reconnecting".into())
                ),
            });
        };
        let result = conn.request(kind, body, self.headers(resource), deadline).await;
        if let Err(e) = &result
            && is_auth_error(e)
        {
            self.auth.invalidate();
        }
        result.map_err(|e| refused_read(e, &self.namespace))
    }

    async fn subscribe_on(&self, key: &ServiceKey) -> Result<Vec<Instance>, RegistryError> {
        let body = json!({
            "namespace": self.namespace,
            "serviceName": key.name,
            "groupName": key.group,
            "subscribe": true,
            "clusters": "",
        });
        let grouped = format!("{}@@{}", key.group, key.name);
        let bytes = self.call("SubscribeServiceRequest", body, Some(&grouped), self.call_timeout()).await?;
        service_hosts(&self.registry, "SubscribeService", &bytes)
    }
}

/// Watch the connection; replace it when it breaks, then subscribe again.
async fn supervise(weak: std::sync::Weak<Shared>, mut conn: Arc<Conn>) {
    let mut backoff = Backoff::default();
    let mut start = 0;
    let mut resubscribed = true;
    loop {
        // Wait for the connection to break (at once when a resubscription
        // failed: a subscription the server lost would never push).
        if resubscribed {
            loop {
                tokio::select! {
                    () = conn.closed() => break,
                    () = tokio::time::sleep(HEALTH_EVERY) => {
                        let Some(shared) = weak.upgrade() else { return };
                        let check = conn.request("HealthCheckRequest", json!({}), shared.headers(None), HEALTH_TIMEOUT).await;
                        if let Err(e) = check {
                            debug!(error = %e, "nacos health check failed");
                            break;
                        }
                    }
                }
            }
        }
        let Some(shared) = weak.upgrade() else { return };
        shared.conn.send_replace(None);
        info!(server = %conn.addr, resubscribed, "nacos connection lost, reconnecting");
        drop(conn);
        let addrs: Vec<String> = shared.servers.iter().filter_map(|s| grpc_addr(s)).collect();
        drop(shared);
        if !resubscribed {
            wait_or_reopened(&mut backoff, &addrs).await;
        }
        conn = loop {
            let Some(shared) = weak.upgrade() else { return };
            start += 1;
            match shared.connect_any(start).await {
                Ok(conn) => break conn,
                Err(e) => debug!(error = %e, "nacos reconnect failed"),
            }
            drop(shared);
            wait_or_reopened(&mut backoff, &addrs).await;
        };
        let Some(shared) = weak.upgrade() else { return };
        shared.conn.send_replace(Some(conn.clone()));
        info!(server = %conn.addr, "nacos reconnected");
        resubscribed = resubscribe(&shared).await;
        if resubscribed {
            backoff.reset();
        }
    }
}

/// Subscribe every service again on a new connection; each is queued for
/// its reader with the instances the answer carried (and read, when the
/// subscription failed). Whether every subscription was made.
async fn resubscribe(shared: &Arc<Shared>) -> bool {
    let keys: Vec<ServiceKey> =
        shared.subscribed.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect();
    let pushed = shared.pushed.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let results: Vec<_> = stream::iter(keys)
        .map(|key| async move {
            let r = shared.subscribe_on(&key).await;
            (key, r)
        })
        .buffer_unordered(RESUBSCRIBE_CONCURRENCY)
        .collect()
        .await;
    let mut all = true;
    for (key, result) in results {
        match (result, &pushed) {
            (Ok(instances), Some(pushed)) => pushed.mark(&key, Some(instances)),
            (Ok(_), None) => {}
            // Its reader reads it; the next full read covers it too.
            (Err(e), Some(pushed)) => {
                debug!(service = %key, error = %e, "resubscribe failed");
                pushed.mark(&key, None);
                all = false;
            }
            (Err(_), None) => all = false,
        }
    }
    all
}

/// The instances in a `ServiceQueryResponse` or `SubscribeServiceResponse`.
pub(super) fn service_hosts(registry: &str, what: &str, bytes: &[u8]) -> Result<Vec<Instance>, RegistryError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Answer {
        #[serde(default)]
        service_info: Option<ServiceInfo>,
    }
    let answer: Answer = serde_json::from_slice(bytes).map_err(|e| RegistryError::BadResponse {
        registry: registry.to_string(),
        what: what.to_string(),
        reason: e.to_string(),
    })?;
    Ok(answer.service_info.and_then(|i| i.hosts).unwrap_or_default())
}

impl GrpcApi {
    /// One page of `group`'s service names, and how many services the
    /// server counts in all.
    async fn service_page(&self, group: &str, page: usize, size: usize) -> Result<(Vec<String>, usize), RegistryError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Page {
            #[serde(default)]
            count: i64,
            #[serde(default)]
            service_names: Option<Vec<String>>,
        }
        let s = &self.shared;
        let body = json!({
            "namespace": s.namespace, "groupName": group, "serviceName": "",
            "pageNo": page, "pageSize": size, "selector": "",
        });
        let bytes = s.call("ServiceListRequest", body, None, s.call_timeout()).await?;
        let page: Page = serde_json::from_slice(&bytes).map_err(|e| RegistryError::BadResponse {
            registry: s.registry.clone(),
            what: "ServiceList".into(),
            reason: e.to_string(),
        })?;
        Ok((page.service_names.unwrap_or_default(), usize::try_from(page.count).unwrap_or(0)))
    }
}

impl Api for GrpcApi {
    async fn list_services(&self, group: &str) -> Result<Vec<String>, RegistryError> {
        list_all(|page, size| self.service_page(group, page, size)).await
    }

    async fn instances(&self, key: &ServiceKey) -> Result<Vec<Instance>, RegistryError> {
        let s = &self.shared;
        let body = json!({
            "namespace": s.namespace, "serviceName": key.name, "groupName": key.group,
            "cluster": "", "healthyOnly": false, "udpPort": 0,
        });
        let grouped = format!("{}@@{}", key.group, key.name);
        let bytes = s.call("ServiceQueryRequest", body, Some(&grouped), s.call_timeout()).await?;
        service_hosts(&s.registry, "ServiceQuery", &bytes)
    }

    async fn probe(&self, group: &str) -> Result<Probe, RegistryError> {
        self.service_page(group, 1, PROBE_PAGE).await.map(|(names, count)| Probe::new(count, names))
    }

    /// 64 on the one connection: Nacos 3.1 read 10k services in 1.3 s so,
    /// against 2.3 s 8 at a time, and rnacos (one thread) in 2.3 s against
    /// 10 s, spending less CPU per read (BENCHMARKS.md, "The real Nacos
    /// server at scale").
    const READS_IN_FLIGHT: usize = 64;

    const PUSH: bool = true;

    async fn subscribe(&self, key: &ServiceKey, pushed: Arc<Pushed>) -> Result<(), RegistryError> {
        let s = &self.shared;
        s.pushed.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(pushed.clone());
        if !s.subscribed.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone()) {
            return Ok(());
        }
        match s.subscribe_on(key).await {
            // The answer carries the instances: the reader compares them
            // with what was sent and reads only if they differ.
            Ok(instances) => {
                pushed.mark(key, Some(instances));
                Ok(())
            }
            Err(e) => {
                s.subscribed.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
                Err(e)
            }
        }
    }

    async fn unsubscribe(&self, key: &ServiceKey) {
        let s = &self.shared;
        if !s.subscribed.lock().unwrap_or_else(PoisonError::into_inner).remove(key) {
            return;
        }
        let body = json!({
            "namespace": s.namespace, "serviceName": key.name, "groupName": key.group,
            "subscribe": false, "clusters": "",
        });
        let grouped = format!("{}@@{}", key.group, key.name);
        if let Err(e) = s.call("SubscribeServiceRequest", body, Some(&grouped), s.call_timeout()).await {
            debug!(service = %key, error = %e, "unsubscribe failed");
        }
    }

    async fn reachable_again(&self) {
        // Resolves when the supervisor has a new connection after a loss.
        let mut rx = self.shared.conn.subscribe();
        if rx.borrow_and_update().is_some() && rx.wait_for(Option::is_none).await.is_err() {
            return std::future::pending().await;
        }
        if rx.wait_for(Option::is_some).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Whether some server accepts a TCP connection on its gRPC port.
pub(crate) async fn grpc_reachable(registry: &str, servers: &[String], timeout: Duration) -> Result<(), RegistryError> {
    let mut reasons = Vec::new();
    for server in servers {
        let Some(addr) = grpc_addr(server) else {
            reasons.push(format!("{server}: no port"));
            continue;
        };
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => reasons.push(format!("{addr}: {e}")),
            Err(_) => reasons.push(format!("{addr}: timed out")),
        }
    }
    Err(RegistryError::Unreachable {
        registry: registry.to_string(),
        reason: format!("gRPC connect: {}", reasons.join("; ")),
    })
}

#[cfg(test)]
#[path = "grpc_tests.rs"]
mod tests;
