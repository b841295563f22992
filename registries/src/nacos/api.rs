//! What a Nacos watcher reads, whichever protocol carries it: the seam
//! between the watcher loops (`nacos.rs`) and the gRPC and HTTP clients.

use std::future::Future;
use std::sync::Arc;

use super::decode::{Instance, ServiceKey};
use super::pushed::Pushed;
use crate::watcher::RegistryError;

/// What a watcher reads from Nacos, whichever protocol carries it.
pub(crate) trait Api: Send + Sync + 'static {
    /// Every service name in `group` (all pages).
    fn list_services(&self, group: &str) -> impl Future<Output = Result<Vec<String>, RegistryError>> + Send;
    /// Every instance of a service, healthy or not.
    fn instances(&self, key: &ServiceKey) -> impl Future<Output = Result<Vec<Instance>, RegistryError>> + Send;
    /// A cheap real call, to tell whether the server answers, and whether
    /// `group`'s services changed: the first [`PROBE_PAGE`] names and the
    /// count, as the server lists them ([`Probe::new`]).
    fn probe(&self, group: &str) -> impl Future<Output = Result<Probe, RegistryError>> + Send;

    /// A full read's instance reads in flight at once. Over HTTP each one
    /// holds a pooled connection to the server of its own, so few; the
    /// gRPC client multiplexes them on its one connection.
    const READS_IN_FLIGHT: usize = 8;
    /// Whether the server pushes changes to subscribers.
    const PUSH: bool = false;
    /// Queue `key` in `pushed` whenever the server pushes a change of it.
    fn subscribe(
        &self,
        _key: &ServiceKey,
        _pushed: Arc<Pushed>,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        async { Ok(()) }
    }
    fn unsubscribe(&self, _key: &ServiceKey) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Resolves once the client has a connection again after losing it
    /// (gRPC only: its supervisor reconnects); never otherwise.
    fn reachable_again(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// How many names a probe asks for: enough that a service swapped for
/// another (the count unchanged) shows in most groups, few enough that
/// the call stays small (a few kilobytes every probe period).
pub(crate) const PROBE_PAGE: usize = 100;

/// What a probe saw of one group: its service count and a digest of the
/// names on its first page. Nacos announces neither a new service nor a
/// deleted one, so a probe that differs from the last listing's lists
/// again. The names are sorted before hashing: only which names the page
/// holds counts, not the server's order within it. A swap beyond the first
/// page of a group larger than [`PROBE_PAGE`] changes neither and waits
/// for the refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe {
    pub count: usize,
    pub names: u64,
}

impl Probe {
    pub fn new(count: usize, mut names: Vec<String>) -> Probe {
        names.sort_unstable();
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&names, &mut h);
        Probe { count, names: std::hash::Hasher::finish(&h) }
    }
}

/// A request refused for its credentials.
pub(crate) fn is_auth_error(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Status { status: 401 | 403, .. })
}

/// A read refused for its credentials, naming the namespace: Nacos lets a
/// user log in and then refuses every read of a namespace its roles do not
/// cover (`403 authorization failed!`), so that is the likely cause.
pub(crate) fn refused_read(e: RegistryError, namespace: &str) -> RegistryError {
    match e {
        RegistryError::Status { registry, what, status: status @ (401 | 403) } => RegistryError::Status {
            registry,
            what: format!("{what} (namespace {namespace}: not readable with these credentials)"),
            status,
        },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_read_names_the_namespace_and_stays_an_auth_error() {
        let status = |status| RegistryError::Status { registry: "n".into(), what: "ServiceList".into(), status };
        let e = refused_read(status(403), "ns-b");
        assert_eq!(e.to_string(), "n: ServiceList (namespace ns-b: not readable with these credentials): status 403");
        assert!(is_auth_error(&e));
        assert_eq!(refused_read(status(500), "ns-b").to_string(), "n: ServiceList: status 500");
    }
}
