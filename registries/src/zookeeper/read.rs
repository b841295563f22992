//! Reading services out of ZooKeeper: list a root, read one service's
//! members, add a root's watch. Every call has a deadline, and every failure
//! becomes a [`RegistryError`] naming the call and path (never a provider
//! URL, which may hold credentials). `NoNode` is an answer, not a failure.

use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use tracing::{debug, warn};
use zookeeper_client as zk;

use super::dubbo;
use super::spring;
use super::tree::{Kind, Member, ServiceKey, Tree, join};
use crate::resolve::Unresolved;
use crate::watcher::RegistryError;

/// Deadline of one ZooKeeper call. While the session is disconnected, calls
/// wait for it to come back; this turns that wait into an error we report.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Services, or instance nodes of one service, read at once.
const CONCURRENCY: usize = 8;

/// One service as ZooKeeper answered for it.
#[derive(Debug)]
pub(crate) enum Read {
    /// The service node does not exist (any more).
    Gone,
    /// The service node exists; these are its usable members.
    Present {
        members: Vec<Member>,
        /// Member nodes skipped: (path for logs, reason).
        malformed: Vec<(String, String)>,
        /// Metadata entries not kept as labels, over all members.
        dropped_labels: usize,
        /// The `pzxid` of a Dubbo interface's `providers` node as read:
        /// while it stays the same, so do the providers (a provider is its
        /// node's name). `None` for Spring services (Curator changes an
        /// instance's data in place) and for providers that name a host
        /// (its addresses may change).
        version: Option<i64>,
    },
}

pub(crate) struct Reader<'a> {
    pub client: &'a zk::Client,
    pub tree: &'a Tree,
    pub registry: &'a str,
}

impl Reader<'_> {
    /// One persistent watch on `path` (which need not exist): recursive,
    /// or on the node and its children only.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<zk::PersistentWatcher, RegistryError> {
        let mode = if recursive { zk::AddWatchMode::PersistentRecursive } else { zk::AddWatchMode::Persistent };
        let watch = self.client.watch(path, mode);
        let watcher = self.call("watch", path, watch).await?;
        // `watch` never answers NoNode; treat it as the server being odd.
        watcher.ok_or_else(|| bad(self.registry, "watch", path, "no node"))
    }

    /// Every service under every root that `keep` keeps. Any failure fails
    /// the whole.
    pub async fn list_all(&self, keep: impl Fn(&ServiceKey) -> bool) -> Result<Vec<ServiceKey>, RegistryError> {
        let mut keys = Vec::new();
        for root in 0..self.tree.roots().len() {
            keys.extend(self.list_root(root).await?);
        }
        keys.retain(|key| keep(key));
        Ok(keys)
    }

    /// The services of root `root`; none when the root does not exist.
    pub async fn list_root(&self, root: usize) -> Result<Vec<ServiceKey>, RegistryError> {
        let Some(r) = self.tree.roots().get(root) else { return Ok(Vec::new()) };
        let children = self.call("list", &r.path, self.client.list_children(&r.path)).await?.unwrap_or_default();
        let services = children.into_iter().filter(|c| self.tree.is_service(root, c));
        Ok(services.map(|name| ServiceKey { root, name }).collect())
    }

    /// Read `keys`, [`CONCURRENCY`] at a time, answering each as it comes:
    /// a full sync handles one service at a time and never holds every
    /// read at once. A key given with a version is first checked against
    /// it, and answers `None` (not read) if its providers are the same.
    pub fn reads(
        &self,
        keys: Vec<(ServiceKey, Option<i64>)>,
    ) -> impl Stream<Item = (ServiceKey, Result<Option<Read>, RegistryError>)> + '_ {
        stream::iter(keys)
            .map(move |(key, version)| async move {
                let read = match version {
                    Some(version) => match self.unchanged(&key, version).await {
                        Ok(true) => Ok(None),
                        Ok(false) => self.read(&key).await.map(Some),
                        Err(e) => Err(e),
                    },
                    None => self.read(&key).await.map(Some),
                };
                (key, read)
            })
            .buffer_unordered(CONCURRENCY)
    }

    /// Whether the members node of `key` still has the `pzxid` it was read
    /// with: one small call, no member read or parsed.
    async fn unchanged(&self, key: &ServiceKey, version: i64) -> Result<bool, RegistryError> {
        let path = self.tree.members_path(key);
        let stat = self.call("stat", &path, self.client.check_stat(&path)).await?.flatten();
        Ok(stat.is_some_and(|stat| stat.pzxid == version))
    }

    pub async fn read(&self, key: &ServiceKey) -> Result<Read, RegistryError> {
        let read = match self.tree.kind(key) {
            Kind::Dubbo => self.read_dubbo(key).await?,
            Kind::Spring => self.read_spring(key).await?,
        };
        Ok(match read {
            Read::Present { members, malformed, dropped_labels, version } => {
                let (members, all_ips) = resolve(members).await;
                Read::Present { members, malformed, dropped_labels, version: version.filter(|_| all_ips) }
            }
            gone => gone,
        })
    }

    async fn read_dubbo(&self, key: &ServiceKey) -> Result<Read, RegistryError> {
        let providers = self.tree.members_path(key);
        let Some((nodes, stat)) = self.call("list", &providers, self.client.get_children(&providers)).await? else {
            // No providers node: the interface exists (empty) or is gone.
            let path = self.tree.service_path(key);
            let stat = self.call("stat", &path, self.client.check_stat(&path)).await?.flatten();
            return Ok(if stat.is_some() { present(Vec::new(), Vec::new(), 0, None) } else { Read::Gone });
        };
        let (mut members, mut malformed, mut dropped) = (Vec::new(), Vec::new(), 0);
        for node in nodes {
            match dubbo::provider(&key.name, &node) {
                Ok(p) if !p.serving => debug!(service = key.name, "provider disabled (enabled=false or disabled=true)"),
                Ok(p) => {
                    dropped += p.dropped_labels;
                    members.push(Member { host: p.host, endpoint: p.endpoint, protocol: None, tls: false });
                }
                // A provider of another protocol (Dubbo 3 registers
                // `tri://` beside or instead of `dubbo://`) is well formed,
                // just not served here, as in Higress: not a malformed node.
                Err(dubbo::UrlError::Scheme(scheme)) => {
                    debug!(service = key.name, scheme, "provider of another protocol than dubbo skipped");
                }
                Err(e) => malformed.push((join(&providers, &dubbo::redact(&node)), e.to_string())),
            }
        }
        Ok(present(members, malformed, dropped, Some(stat.pzxid)))
    }

    async fn read_spring(&self, key: &ServiceKey) -> Result<Read, RegistryError> {
        let dir = self.tree.members_path(key);
        let Some(ids) = self.call("list", &dir, self.client.list_children(&dir)).await? else {
            return Ok(Read::Gone);
        };
        let host = self.tree.spring_host(key);
        let datas: Vec<_> = stream::iter(ids)
            .map(|id| {
                let path = join(&dir, &id);
                async move {
                    let data = self.call("get", &path, self.client.get_data(&path)).await;
                    (path, data)
                }
            })
            .buffered(CONCURRENCY)
            .collect()
            .await;
        let (mut members, mut malformed, mut dropped) = (Vec::new(), Vec::new(), 0);
        for (path, data) in datas {
            // Gone between the list and the read: deleted, skip it.
            let Some((data, _)) = data? else { continue };
            match spring::parse_instance(&data) {
                Ok(i) if !i.serving => debug!(path, "instance not UP (payload.metadata.instance_status)"),
                Ok(i) => {
                    dropped += i.dropped_labels;
                    members.push(Member { host: host.clone(), endpoint: i.endpoint, protocol: i.protocol, tls: i.tls });
                }
                Err(e) => malformed.push((path, e.to_string())),
            }
        }
        Ok(present(members, malformed, dropped, None))
    }

    /// Run one call with a deadline; `NoNode` is `Ok(None)`.
    async fn call<T>(
        &self,
        op: &str,
        path: &str,
        call: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<Option<T>, RegistryError> {
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(value)) => Ok(Some(value)),
            Ok(Err(zk::Error::NoNode)) => Ok(None),
            Ok(Err(e)) => Err(zk_error(self.registry, op, path, &e)),
            Err(_) => Err(RegistryError::Unreachable {
                registry: self.registry.to_string(),
                reason: format!("{op} {path}: no answer in {CALL_TIMEOUT:?}"),
            }),
        }
    }
}

fn present(
    members: Vec<Member>,
    malformed: Vec<(String, String)>,
    dropped_labels: usize,
    version: Option<i64>,
) -> Read {
    Read::Present { members, malformed, dropped_labels, version }
}

fn bad(registry: &str, op: &str, path: &str, reason: &str) -> RegistryError {
    RegistryError::BadResponse { registry: registry.to_string(), what: format!("{op} {path}"), reason: reason.into() }
}

/// The one place that sorts ZooKeeper errors: losing the server, the
/// session or its authentication (or a server throttling every call) is
/// `Unreachable`, the whole registry's failure; anything else the server
/// said (`NoAuth` on a node with a digest ACL, `MarshallingError`) is a
/// `BadResponse` about that one node (see [`is_outage`]).
pub(crate) fn zk_error(registry: &str, op: &str, path: &str, e: &zk::Error) -> RegistryError {
    match e {
        zk::Error::ConnectionLoss
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed
        | zk::Error::NoHosts
        | zk::Error::Timeout
        | zk::Error::AuthFailed
        | zk::Error::Throttled => {
            RegistryError::Unreachable { registry: registry.to_string(), reason: format!("{op} {path}: {e}") }
        }
        zk::Error::Unimplemented if op == "watch" => bad(
            registry,
            op,
            path,
            "the server does not implement persistent recursive watches (addWatch): ZooKeeper 3.6 or later is required",
        ),
        other => bad(registry, op, path, &other.to_string()),
    }
}

/// Whether a failed call fails the whole registry (the session or the
/// connection: every other call would fail too), not just the service it
/// read, which keeps its last state and is read again (`failing.rs`).
pub(crate) fn is_outage(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Unreachable { .. })
}

/// Registries may name hosts; the mesh needs IPs. A name becomes one member
/// per address it resolves to; one that does not resolve is left out. Also
/// says whether every member named an IP.
async fn resolve(members: Vec<Member>) -> (Vec<Member>, bool) {
    let mut out = Vec::with_capacity(members.len());
    let mut all_ips = true;
    for m in members {
        // Most members name an IP: kept (written the canonical way), not
        // copied with its labels.
        if let Ok(ip) = m.endpoint.address.parse::<IpAddr>() {
            let mut m = m;
            let canonical = ip.to_string();
            if canonical != m.endpoint.address {
                m.endpoint.address = canonical;
            }
            out.push(m);
            continue;
        }
        all_ips = false;
        match crate::resolve::lookup(&m.endpoint.address, m.endpoint.port).await {
            Ok(ips) => out.extend(ips.into_iter().map(|ip| {
                let mut member = m.clone();
                member.endpoint.address = ip.to_string();
                member
            })),
            Err(Unresolved::Failed(e)) => {
                warn!(host = %m.host, address = %m.endpoint.address, error = %e, "address does not resolve")
            }
            Err(Unresolved::TimedOut) => {
                warn!(host = %m.host, address = %m.endpoint.address, "address lookup timed out")
            }
        }
    }
    (out, all_ips)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_by_kind() {
        let kind = |op: &str, e: zk::Error| zk_error("zk", op, "/dubbo", &e).kind();
        for e in [zk::Error::ConnectionLoss, zk::Error::SessionExpired, zk::Error::NoHosts, zk::Error::Timeout] {
            assert_eq!(kind("list", e), "unreachable");
        }
        assert_eq!(kind("list", zk::Error::NoAuth), "bad_response");
        let outage = |e: zk::Error| is_outage(&zk_error("zk", "list", "/dubbo/a/providers", &e));
        for e in [zk::Error::ConnectionLoss, zk::Error::SessionExpired, zk::Error::AuthFailed, zk::Error::Throttled] {
            assert!(outage(e.clone()), "{e}: the whole registry");
        }
        for e in [zk::Error::NoAuth, zk::Error::MarshallingError, zk::Error::UnexpectedErrorCode(-99)] {
            assert!(!outage(e.clone()), "{e}: one service");
        }
        let timeout = RegistryError::Unreachable { registry: "zk".into(), reason: "no answer".into() };
        assert!(is_outage(&timeout), "a call that got no answer");
        let old = zk_error("zk", "watch", "/dubbo", &zk::Error::Unimplemented);
        assert!(old.to_string().contains("3.6"), "{old}");
    }

    #[tokio::test]
    async fn resolve_keeps_ips_and_expands_names() {
        let m = |a: &str| Member {
            host: "h".into(),
            endpoint: crate::model::Endpoint { address: a.into(), port: 80, weight: 1, labels: Default::default() },
            protocol: None,
            tls: false,
        };
        let (ips, all_ips) = resolve(vec![m("10.0.0.1"), m("0:0::1")]).await;
        assert!(all_ips);
        assert_eq!(ips[1].endpoint.address, "::1", "written the canonical way");
        let (out, all_ips) = resolve(vec![m("10.0.0.1"), m("::1"), m("localhost"), m("no-such-host.invalid")]).await;
        assert!(!all_ips);
        assert_eq!(out[0].endpoint.address, "10.0.0.1");
        assert_eq!(out[1].endpoint.address, "::1");
        assert!(out[2..].iter().all(|m| m.endpoint.address.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())));
        assert!(out.iter().all(|m| m.endpoint.address != "no-such-host.invalid"));
    }
}
