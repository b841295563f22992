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

/// How many names a listing asks for a page. Nacos 2.x and 3.x build the
/// namespace's whole name set for every page they serve (both protocols),
/// and rnacos walks its list to the page, so a page costs the server about
/// what the whole group costs: a few large pages are far cheaper than many
/// small ones. A group of up to this many is one call, and so one
/// snapshot. 10k names stay well under the read cap (`MAX_MESSAGE_BYTES`,
/// `MAX_BODY_BYTES`).
pub(crate) const LIST_PAGE: usize = 10_000;

/// The most names one listing reads: a server whose `count` keeps growing,
/// or whose pages never run short, cannot keep us paging forever.
pub(crate) const MAX_LISTED: usize = 1_000_000;

/// Every name of a group, read page by page with `page(number, size)`,
/// which answers the names of that page and the group's count. A server
/// that serves fewer names than asked on the first page, while the count
/// says there are more, pages at that size from then on: the first page
/// is the same at either size, and every later offset is its own.
pub(crate) async fn list_all<F, Fut>(mut page: F) -> Result<Vec<String>, RegistryError>
where
    F: FnMut(usize, usize) -> Fut,
    Fut: Future<Output = Result<(Vec<String>, usize), RegistryError>>,
{
    let mut size = LIST_PAGE;
    let mut all: Vec<String> = Vec::new();
    let mut number = 1;
    while all.len() < MAX_LISTED {
        let (names, count) = page(number, size).await?;
        if number == 1 && !names.is_empty() && names.len() < size && names.len() < count {
            size = names.len();
        }
        let last = names.len() < size;
        all.extend(names);
        if last || all.len() >= count {
            break;
        }
        number += 1;
    }
    Ok(all)
}

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

    /// A server's paging as Nacos does it: `(number - 1) * size` names
    /// skipped, then at most `size`, or at most `cap` if it caps pages.
    /// Counts the calls and the page sizes asked.
    struct Server {
        n: usize,
        cap: Option<usize>,
        count_grows: bool,
        calls: std::sync::Mutex<Vec<(usize, usize)>>,
    }

    impl Server {
        fn new(n: usize) -> Server {
            Server { n, cap: None, count_grows: false, calls: Default::default() }
        }

        fn names(&self) -> Vec<String> {
            (0..self.n).map(|i| format!("svc-{i}")).collect()
        }

        async fn page(&self, number: usize, size: usize) -> Result<(Vec<String>, usize), RegistryError> {
            self.calls.lock().unwrap().push((number, size));
            let size = self.cap.map_or(size, |cap| size.min(cap));
            let from = (number - 1) * size;
            let page = (from..self.n.min(from + size)).map(|i| format!("svc-{i}")).collect();
            let count = if self.count_grows { usize::MAX } else { self.n };
            Ok((page, count))
        }

        fn calls(&self) -> Vec<(usize, usize)> {
            self.calls.lock().unwrap().clone()
        }
    }

    #[tokio::test]
    async fn a_group_of_up_to_a_page_is_one_call_and_larger_ones_few() {
        for (n, calls) in [(0, 1), (1, 1), (LIST_PAGE, 1), (LIST_PAGE + 1, 2), (25_000, 3)] {
            let server = Server::new(n);
            let all = list_all(|number, size| server.page(number, size)).await.unwrap();
            assert_eq!(all, server.names(), "{n} services");
            assert_eq!(server.calls().len(), calls, "{n} services");
            assert!(server.calls().iter().all(|&(_, size)| size == LIST_PAGE));
        }
    }

    #[tokio::test]
    async fn a_server_that_caps_its_pages_is_read_whole_at_its_size() {
        let server = Server { cap: Some(500), ..Server::new(1_750) };
        let all = list_all(|number, size| server.page(number, size)).await.unwrap();
        assert_eq!(all, server.names());
        assert_eq!(server.calls(), [(1, LIST_PAGE), (2, 500), (3, 500), (4, 500)]);
    }

    #[tokio::test]
    async fn a_count_that_never_stops_growing_stops_the_listing_at_the_bound() {
        let server = Server { count_grows: true, ..Server::new(usize::MAX) };
        let all = list_all(|number, size| server.page(number, size)).await.unwrap();
        assert_eq!(all.len(), MAX_LISTED);
        assert_eq!(server.calls().len(), MAX_LISTED / LIST_PAGE);
    }

    #[tokio::test]
    async fn a_failed_page_fails_the_listing() {
        let mut calls = 0;
        let result = list_all(|number, _| {
            calls += 1;
            async move {
                if number == 2 {
                    Err(RegistryError::Status { registry: "n".into(), what: "ServiceList".into(), status: 500 })
                } else {
                    Ok(((0..LIST_PAGE).map(|i| i.to_string()).collect(), 3 * LIST_PAGE))
                }
            }
        })
        .await;
        assert!(result.is_err());
        assert_eq!(calls, 2);
    }
}
