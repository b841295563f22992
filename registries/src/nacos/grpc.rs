//! Nacos 2.x/3.x over gRPC (`type: nacos2`, `nacos3`) through nacos-sdk,
//! with its side effects contained:
//!
//! - `env_first(false)`: `NACOS_CLIENT_*` variables do not override the
//!   spec (server, namespace, credentials, cache dir, empty protection).
//!   nacos-sdk still runs `dotenvy::dotenv()` once per process, the first time
//!   it parses a server list, which loads a `.env` file from the working
//!   directory into the environment; nothing here can stop that.
//! - Its disk cache goes to a directory of our own, removed with the client,
//!   and is never loaded at start.
//! - `naming_push_empty_protection(false)`: an empty instance list is an
//!   answer, not noise. Outage protection is ours: errors never emit updates.
//! - Its own login plugin is replaced by ours (see `auth.rs`).
//! - It dials loopback relays of ours, never the servers (see `relay.rs`):
//!   dropping them is the one way to close a client's connection. With
//!   `registryTls` they carry its gRPC to the servers over verified TLS (its
//!   own TLS cannot be configured per client), and our login plugin logs in
//!   to the real servers over https.
//! - Every call has a deadline: nacos-sdk retries internally and may
//!   otherwise wait on a dead connection.
//!
//! nacos-sdk spawns tasks on its own runtime that outlive a client: a
//! subscription's poller holds the client until unsubscribed, a redo loop
//! and a login loop run for ever, and the task reading its stream keeps the
//! connection open for ever (it answers the server's checks), which only
//! dropping our relays ends. So a client
//! unsubscribes everything when it goes, also when dropped mid-call, and is
//! rebuilt only when needed (new server list, a token refused right after a
//! fresh login, a server back from an outage that this client has not
//! reconnected to), never in a loop while the servers are down.
//!
//! **Reconnecting after an outage.** nacos-sdk reconnects on its own, but on
//! a schedule of its own: 2, 4, 8, 16, 32 and then every 64 s. After a
//! 60 s outage its next attempt came 32 s after rnacos was back (measured:
//! RELIABILITY.md). So the probe remembers that the server was unreachable
//! (its gRPC port refused or timed out a TCP connect); once the port
//! accepts again (tried every [`REACHABLE_POLL`] between probes), the
//! client gets one short call ([`RECOVERY_PROBE_TIMEOUT`])
//! and, if that fails, is reported stale ([`Api::stale`]): the watcher builds a
//! new client, which connects at once, and retires the old one. A server
//! that hangs (its port accepts, nothing answers) never looked unreachable,
//! so it does not cause a rebuild: a rebuild could not help, and each one
//! leaves tasks behind.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::pushed::Pushed;
use nacos_sdk::api::error::Error as SdkError;
use nacos_sdk::api::naming::{NamingChangeEvent, NamingEventListener, NamingService, NamingServiceBuilder};
use nacos_sdk::api::props::ClientProps;
use tracing::{debug, warn};

use super::api::{Api, is_auth_error};
use super::auth::{Auth, SdkAuth};
use super::decode::{Instance, PUBLIC_NAMESPACE, ServiceKey};
use super::relay::Relays;
use super::servers::grpc_addr;
use crate::tls::RegistryTls;
use crate::watcher::RegistryError;

/// nacos-sdk's connect sends a health check and logs in.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The deadline of a probe's call once the server accepts connections again
/// after an outage: a connected client answers in milliseconds.
const RECOVERY_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the gRPC port of a server found unreachable is tried between
/// probes.
const REACHABLE_POLL: Duration = Duration::from_millis(500);
/// Unsubscribing on the way out: best effort, bounded.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
const PAGE_SIZE: i32 = 500;
const MAX_PAGES: i32 = 1000;

pub(crate) struct GrpcApi {
    naming: NamingService,
    registry: String,
    servers: Vec<String>,
    auth: Arc<Auth>,
    /// Deadline of each call (`nacosTimeout`, else [`CALL_TIMEOUT`]).
    call_timeout: Duration,
    /// Live subscriptions; their listeners are needed to unsubscribe.
    subscribed: Mutex<HashMap<ServiceKey, Arc<dyn NamingEventListener>>>,
    /// The probe found the gRPC port unreachable since the last answer.
    was_down: AtomicBool,
    /// The port accepts again, but this client's call still failed.
    stale: AtomicBool,
    /// Held for its `Drop`, which removes the directory.
    _cache_dir: CacheDir,
    /// The relays nacos-sdk connects through; dropped, they close its
    /// connection.
    _relays: Relays,
}

impl GrpcApi {
    pub async fn connect(
        registry: &str,
        servers: Vec<String>,
        namespace_id: &str,
        auth: Arc<Auth>,
        tls: Option<&RegistryTls>,
    ) -> Result<GrpcApi, RegistryError> {
        // nacos-sdk talks to our loopback relays (see relay.rs).
        let relays = Relays::start(registry, &servers, tls).await?;
        relays.check().await?;
        let sdk_servers = relays.local_servers().join(",");
        let cache_dir = CacheDir::new(registry);
        let unreachable = |reason: String| RegistryError::Unreachable {
            registry: registry.to_string(),
            reason: format!("connect: {reason}"),
        };
        // The public namespace is the empty id to nacos-sdk (it sends "public").
        let namespace = if namespace_id == PUBLIC_NAMESPACE { "" } else { namespace_id };
        let props = ClientProps::new()
            .env_first(false)
            .server_addr(sdk_servers)
            .namespace(namespace)
            .app_name("meshbridge")
            .naming_push_empty_protection(false)
            .naming_load_cache_at_start(false)
            .cache_dir(cache_dir.path.clone());
        let builder = NamingServiceBuilder::new(props)
            .with_auth_plugin(Arc::new(SdkAuth { auth: auth.clone(), servers: servers.clone() }));
        // Log in first so that a refused login is reported as such rather
        // than as requests refused later.
        auth.ensure(&servers).await?;
        // A relay failure (a certificate that changed since `check`) says
        // more than nacos-sdk's own error.
        let relay_error = || relays.last_error().map(unreachable);
        let naming = match tokio::time::timeout(CONNECT_TIMEOUT, builder.build()).await {
            Ok(Ok(naming)) => naming,
            Ok(Err(e)) => return Err(relay_error().unwrap_or_else(|| classify(registry, "connect", &e))),
            Err(_) => {
                return Err(
                    relay_error().unwrap_or_else(|| unreachable(format!("timed out after {CONNECT_TIMEOUT:?}")))
                );
            }
        };
        Ok(GrpcApi {
            naming,
            registry: registry.to_string(),
            servers,
            auth,
            call_timeout: CALL_TIMEOUT,
            subscribed: Mutex::default(),
            was_down: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            _cache_dir: cache_dir,
            _relays: relays,
        })
    }

    /// Each call's deadline, `nacosTimeout` when set.
    pub fn with_call_timeout(mut self, timeout: Option<Duration>) -> GrpcApi {
        self.call_timeout = timeout.unwrap_or(CALL_TIMEOUT);
        self
    }

    /// Run one nacos-sdk call with a fresh token and a deadline.
    async fn call<T>(&self, what: &str, call: impl Future<Output = Result<T, SdkError>>) -> Result<T, RegistryError> {
        self.call_within(what, self.call_timeout, call).await
    }

    async fn call_within<T>(
        &self,
        what: &str,
        deadline: Duration,
        call: impl Future<Output = Result<T, SdkError>>,
    ) -> Result<T, RegistryError> {
        self.auth.ensure(&self.servers).await?;
        let result = match tokio::time::timeout(deadline, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(&self.registry, what, &e)),
            Err(_) => Err(RegistryError::Unreachable {
                registry: self.registry.clone(),
                reason: format!("{what}: timed out after {deadline:?}"),
            }),
        };
        if let Err(e) = &result
            && is_auth_error(e)
        {
            self.auth.invalidate();
        }
        result
    }

    fn subscriptions(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceKey, Arc<dyn NamingEventListener>>> {
        self.subscribed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Unsubscribe everything, which stops nacos-sdk's pollers and redo
    /// tasks so that the client can go when dropped. `false` when some
    /// unsubscribe failed (the client is not connected): they are kept for
    /// the next `close`, since nacos-sdk would otherwise subscribe them again
    /// once this client reconnects, and poll them for ever.
    pub async fn close(&self) -> bool {
        let subs: Vec<_> = self.subscriptions().drain().collect();
        let failed = unsubscribe_all(self.naming.clone(), subs).await;
        let clean = failed.is_empty();
        self.subscriptions().extend(failed);
        clean
    }
}

type Subscription = (ServiceKey, Arc<dyn NamingEventListener>);

/// Unsubscribe each (in parallel, each within [`CLOSE_TIMEOUT`]); the ones
/// that failed.
async fn unsubscribe_all(naming: NamingService, subs: Vec<Subscription>) -> Vec<Subscription> {
    let all = futures::future::join_all(subs.into_iter().map(|(key, listener)| {
        let naming = naming.clone();
        async move {
            let call = naming.unsubscribe(key.name.clone(), Some(key.group.clone()), vec![], listener.clone());
            match tokio::time::timeout(CLOSE_TIMEOUT, call).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => {
                    debug!(service = %key, error = %e, "unsubscribe failed");
                    Some((key, listener))
                }
                Err(_) => Some((key, listener)),
            }
        }
    }));
    all.await.into_iter().flatten().collect()
}

impl Drop for GrpcApi {
    fn drop(&mut self) {
        // Dropped without `close` (the watcher's task was aborted): finish the
        // job on the current runtime if there is one.
        let subs: Vec<_> = self.subscriptions().drain().collect();
        if subs.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let naming = self.naming.clone();
            rt.spawn(async move { drop(unsubscribe_all(naming, subs).await) });
        }
    }
}

impl Api for GrpcApi {
    async fn list_services(&self, group: &str) -> Result<Vec<String>, RegistryError> {
        let mut all = Vec::new();
        for page in 1..=MAX_PAGES {
            let call = self.naming.get_service_list(page, PAGE_SIZE, Some(group.to_string()));
            let (names, count) = self.call("get_service_list", call).await?;
            let last = names.len() < PAGE_SIZE as usize;
            all.extend(names);
            if last || all.len() >= usize::try_from(count).unwrap_or(0) {
                break;
            }
        }
        Ok(all)
    }

    async fn instances(&self, key: &ServiceKey) -> Result<Vec<Instance>, RegistryError> {
        // `subscribe: false` asks the server; `true` would answer from
        // nacos-sdk's cache.
        let call = self.naming.get_all_instances(key.name.clone(), Some(key.group.clone()), vec![], false);
        let instances = self.call("get_all_instances", call).await?;
        Ok(instances.into_iter().map(Instance::from).collect())
    }

    async fn probe(&self, group: &str) -> Result<(), RegistryError> {
        // While the server is down nacos-sdk's calls wait for a connection
        // until our deadline; a refused TCP connect says so at once.
        if let Err(e) = grpc_reachable(&self.registry, &self.servers, PROBE_CONNECT_TIMEOUT).await {
            self.was_down.store(true, Ordering::SeqCst);
            return Err(e);
        }
        let recovering = self.was_down.load(Ordering::SeqCst);
        let deadline = if recovering { RECOVERY_PROBE_TIMEOUT.min(self.call_timeout) } else { self.call_timeout };
        let call = self.naming.get_service_list(1, 1, Some(group.to_string()));
        match self.call_within("get_service_list", deadline, call).await {
            Ok(_) => {
                self.was_down.store(false, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                if recovering && matches!(e, RegistryError::Unreachable { .. }) {
                    self.stale.store(true, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    const PUSH: bool = true;

    async fn subscribe(&self, key: &ServiceKey, pushed: Arc<Pushed>) -> Result<(), RegistryError> {
        if self.subscriptions().contains_key(key) {
            return Ok(());
        }
        let listener: Arc<dyn NamingEventListener> = Arc::new(PushListener { key: key.clone(), pushed });
        let call = self.naming.subscribe(key.name.clone(), Some(key.group.clone()), vec![], listener.clone());
        self.call("subscribe", call).await?;
        self.subscriptions().insert(key.clone(), listener);
        Ok(())
    }

    fn stale(&self) -> bool {
        self.stale.load(Ordering::SeqCst)
    }

    async fn reachable_again(&self) {
        if !self.was_down.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        // A TCP connect every so often while the server is down is cheap,
        // and says it is back at once; it is not logged.
        while grpc_reachable(&self.registry, &self.servers, PROBE_CONNECT_TIMEOUT).await.is_err() {
            tokio::time::sleep(REACHABLE_POLL).await;
        }
    }

    async fn unsubscribe(&self, key: &ServiceKey) {
        let Some(listener) = self.subscriptions().remove(key) else {
            return;
        };
        let call = self.naming.unsubscribe(key.name.clone(), Some(key.group.clone()), vec![], listener);
        if let Err(e) = self.call("unsubscribe", call).await {
            debug!(service = %key, error = %e, "unsubscribe failed");
        }
    }
}

/// A push only queues the service for a reader, which asks the server
/// unless the instances the push announces are the ones it already has:
/// nacos-sdk delivers each event from its own task, so two pushes may arrive
/// out of order, and the answer to a question asked later cannot be older.
struct PushListener {
    key: ServiceKey,
    pushed: Arc<Pushed>,
}

impl NamingEventListener for PushListener {
    fn event(&self, event: Arc<NamingChangeEvent>) {
        let hint = event.instances.as_ref().map(|hosts| hosts.iter().cloned().map(Instance::from).collect());
        self.pushed.mark(&self.key, hint);
    }
}

/// Classify a nacos-sdk error: the only place its error texts are read.
/// A refused request comes back as `ErrResponse` (an `ErrorResponse`
/// payload) or as `ErrResult` text `"... error_code=403, message=..."`.
pub(crate) fn classify(registry: &str, what: &str, e: &SdkError) -> RegistryError {
    let registry = registry.to_string();
    let status = |code: i32| RegistryError::Status {
        registry: registry.clone(),
        what: what.to_string(),
        status: u16::try_from(code).ok().filter(|c| (100..600).contains(c)).unwrap_or(500),
    };
    match e {
        SdkError::ErrResponse(_, _, code, _) => status(*code),
        SdkError::ErrResult(text) => status(error_code(text).unwrap_or(500)),
        SdkError::Serialization(err) => {
            RegistryError::BadResponse { registry, what: what.to_string(), reason: err.to_string() }
        }
        SdkError::InvalidParam(param, _) => {
            RegistryError::BadResponse { registry, what: what.to_string(), reason: format!("invalid {param}") }
        }
        other => RegistryError::Unreachable { registry, reason: format!("{what}: {other}") },
    }
}

fn error_code(text: &str) -> Option<i32> {
    let rest = &text[text.find("error_code=")? + "error_code=".len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
    digits.parse().ok()
}

/// nacos-sdk's disk cache, one directory per client, removed with it.
struct CacheDir {
    path: PathBuf,
}

impl CacheDir {
    fn new(registry: &str) -> CacheDir {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let safe: String = registry.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = format!("meshbridge-nacos-{}-{safe}-{seq}", std::process::id());
        let path = std::env::temp_dir().join(name);
        CacheDir { path }
    }
}

impl Drop for CacheDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(path = %self.path.display(), error = %e, "cannot remove the nacos-sdk cache dir");
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
mod tests {
    use super::*;

    #[test]
    fn sdk_errors_are_classified() {
        let refused = SdkError::ErrResponse(None, 500, 403, Some("unknown user!".into()));
        assert!(matches!(classify("n", "w", &refused), RegistryError::Status { status: 403, .. }));
        let text = SdkError::ErrResult(
            "handle get_service_list failed: result_code=500, error_code=403, message=token invalid!".into(),
        );
        assert!(matches!(classify("n", "w", &text), RegistryError::Status { status: 403, .. }));
        let odd = SdkError::ErrResult("handle x failed: result_code=500, error_code=70000, message=".into());
        assert!(matches!(classify("n", "w", &odd), RegistryError::Status { status: 500, .. }));
        let down = SdkError::ClientUnhealthy("closed".into());
        let err = classify("n", "get_all_instances", &down);
        assert!(matches!(&err, RegistryError::Unreachable { reason, .. } if reason.starts_with("get_all_instances")));
        assert!(matches!(classify("n", "w", &SdkError::NoAvailableServer), RegistryError::Unreachable { .. }));
        assert_eq!(error_code("error_code=-1, x"), Some(-1));
        assert_eq!(error_code("nothing"), None);
    }

    #[test]
    fn cache_dirs_are_private_and_removed() {
        let a = CacheDir::new("my nacos/1");
        let b = CacheDir::new("my nacos/1");
        assert_ne!(a.path, b.path);
        let name = a.path.file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with(&format!("meshbridge-nacos-{}-my_nacos_1-", std::process::id())), "{name}");
        std::fs::create_dir_all(a.path.join("naming")).unwrap();
        let path = a.path.clone();
        drop(a);
        assert!(!path.exists());
    }
}
