//! The shape of the ZooKeeper tree we read, and how its nodes become mesh
//! services. Pure: no I/O, so every rule is unit-tested below.
//!
//! Roots, as Higress lays them out:
//! - `/dubbo`: children are interfaces; `/dubbo/{interface}/providers/{url}`
//!   are providers (see [`super::dubbo`]). `consumers`, `configurators` and
//!   `routers` are ignored.
//! - `/services` and every `zkServicesPath`: children are Spring Cloud
//!   services; `{root}/{service}/{id}` hold Curator JSON (see [`super::spring`]).
//!
//! Under every root, children named `config`, `mapping` or `metadata` are not
//! services (Dubbo 2.7+ keeps its config center and metadata there).

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::model::{Endpoint, Protocol, Service, ServicePort, Tls};
use crate::spec::RegistrySpec;
use crate::watcher::RegistryError;

pub(crate) const DUBBO_ROOT: &str = "/dubbo";
pub(crate) const SPRING_ROOT: &str = "/services";
pub(crate) const PROVIDERS: &str = "providers";
/// Every host this registry names ends in `.zookeeper` (Higress's suffix).
pub(crate) const HOST_SUFFIX: &str = "zookeeper";
const NOT_SERVICES: [&str; 3] = ["config", "mapping", "metadata"];
/// ZooKeeper's own subtree, visible when a services path is `/`.
const SYSTEM_NODE: &str = "/zookeeper";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Dubbo,
    Spring,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Root {
    pub kind: Kind,
    /// Absolute, without a trailing `/` (except `/` itself).
    pub path: String,
    /// Host part for Spring services: the path without its leading `/`,
    /// other `/` as `-` (`/services` -> `services`, `/` -> empty).
    label: String,
}

/// A service as ZooKeeper holds it: one node under one root.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ServiceKey {
    pub root: usize,
    pub name: String,
}

/// What a watch event on some path means for us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Touch {
    /// A root node itself appeared or went: re-list its services.
    Root(usize),
    /// Something in one service changed: re-read it.
    Service(ServiceKey),
    /// Not ours (consumers, routers, config, deeper nodes).
    Nothing,
}

/// All roots of one registry, `/dubbo` first.
#[derive(Debug, Clone)]
pub(crate) struct Tree {
    roots: Vec<Root>,
}

impl Tree {
    /// `/dubbo`, `/services`, then each `zkServicesPath` that is neither of
    /// those (Higress skips them too). Paths must be absolute ZooKeeper paths;
    /// two paths that would give the same host names are an error.
    pub fn new(registry: &str, services_paths: &[String]) -> Result<Tree, RegistryError> {
        let mut roots = vec![
            Root { kind: Kind::Dubbo, path: DUBBO_ROOT.into(), label: String::new() },
            Root { kind: Kind::Spring, path: SPRING_ROOT.into(), label: label_of(SPRING_ROOT) },
        ];
        for (i, raw) in services_paths.iter().enumerate() {
            let config = |reason: String| RegistryError::Config {
                registry: registry.to_string(),
                field: format!("zkServicesPath[{i}]"),
                reason,
            };
            let path = normalize(raw).ok_or_else(|| config(format!("{raw:?} is not an absolute ZooKeeper path")))?;
            if roots.iter().any(|r| r.path == path) {
                continue;
            }
            let label = label_of(&path);
            if let Some(other) = roots.iter().find(|r| r.kind == Kind::Spring && r.label == label) {
                return Err(config(format!("{raw:?} gives the same host names as {:?}", other.path)));
            }
            roots.push(Root { kind: Kind::Spring, path, label });
        }
        Ok(Tree { roots })
    }

    pub fn roots(&self) -> &[Root] {
        &self.roots
    }

    /// Whether `child` of root `root` is a service.
    pub fn is_service(&self, root: usize, child: &str) -> bool {
        let Some(r) = self.roots.get(root) else { return false };
        if child.is_empty() || NOT_SERVICES.contains(&child) {
            return false;
        }
        // A child that is (or holds) another root belongs to that root.
        let path = join(&r.path, child);
        let nested = self.roots.iter().any(|o| o.path == path || o.path.starts_with(&format!("{path}/")));
        !nested && path != SYSTEM_NODE
    }

    /// What an event on `path`, seen by root `root`'s watch, means.
    pub fn classify(&self, root: usize, path: &str) -> Touch {
        let Some(r) = self.roots.get(root) else { return Touch::Nothing };
        let rel = if path == r.path {
            return Touch::Root(root);
        } else if r.path == "/" {
            path.strip_prefix('/')
        } else {
            path.strip_prefix(r.path.as_str()).and_then(|p| p.strip_prefix('/'))
        };
        let Some(rel) = rel else { return Touch::Nothing };
        let segments: Vec<&str> = rel.split('/').collect();
        let service = match (r.kind, segments.as_slice()) {
            (Kind::Dubbo, [name]) | (Kind::Dubbo, [name, PROVIDERS]) | (Kind::Dubbo, [name, PROVIDERS, _]) => name,
            (Kind::Spring, [name]) | (Kind::Spring, [name, _]) => name,
            _ => return Touch::Nothing,
        };
        if self.is_service(root, service) {
            Touch::Service(ServiceKey { root, name: service.to_string() })
        } else {
            Touch::Nothing
        }
    }

    pub fn kind(&self, key: &ServiceKey) -> Kind {
        self.roots.get(key.root).map_or(Kind::Spring, |r| r.kind)
    }

    /// The node whose existence is the service's: `/dubbo/{interface}` or
    /// `{root}/{service}`.
    pub fn service_path(&self, key: &ServiceKey) -> String {
        let root = self.roots.get(key.root).map_or("/", |r| r.path.as_str());
        join(root, &key.name)
    }

    /// The node whose children are the service's instances.
    pub fn members_path(&self, key: &ServiceKey) -> String {
        match self.kind(key) {
            Kind::Dubbo => join(&self.service_path(key), PROVIDERS),
            Kind::Spring => self.service_path(key),
        }
    }

    /// `{service}.{root label}.zookeeper`, or `{service}.zookeeper` for `/`.
    pub fn spring_host(&self, key: &ServiceKey) -> String {
        match self.roots.get(key.root).map(|r| r.label.as_str()).filter(|l| !l.is_empty()) {
            Some(label) => format!("{}.{label}.{HOST_SUFFIX}", key.name),
            None => format!("{}.{HOST_SUFFIX}", key.name),
        }
    }
}

/// `parent/child` for ZooKeeper paths.
pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent == "/" { format!("/{child}") } else { format!("{parent}/{child}") }
}

/// An absolute path without trailing `/`, with no empty, `.` or `..` parts.
fn normalize(raw: &str) -> Option<String> {
    let trimmed = raw.trim();
    if !trimmed.starts_with('/') {
        return None;
    }
    let path = trimmed.trim_end_matches('/');
    if path.is_empty() {
        return Some("/".into());
    }
    let ok = path[1..].split('/').all(|s| !s.is_empty() && s != "." && s != ".." && !s.contains('\0'));
    ok.then(|| path.to_string())
}

fn label_of(path: &str) -> String {
    path.trim_start_matches('/').replace('/', "-")
}

/// One endpoint read from ZooKeeper and the host it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub host: String,
    pub endpoint: Endpoint,
    /// The protocol the instance states, if any (Spring only).
    pub protocol: Option<Protocol>,
    /// The instance speaks TLS (Spring only; see [`super::spring::Instance`]).
    pub tls: bool,
}

/// What the watcher keeps of a host it sent: enough to tell whether a new
/// read differs, and to render the host once it has no members (its last
/// port and whether it was reached over TLS). Not the endpoints: the cache
/// holds those, and a second copy of every endpoint and its labels was the
/// watcher's largest memory cost at 10k services (BENCHMARKS.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sent {
    /// Two 64-bit hashes of the whole service: a change that hashes the
    /// same as what was sent (odds about 2^-128) would go unsent until the
    /// next change or full sync.
    digest: (u64, u64),
    port: Option<ServicePort>,
    tls: bool,
}

impl Sent {
    pub fn of(service: &Service) -> Sent {
        Sent { digest: digest(service), port: service.ports.first().cloned(), tls: service.tls.is_some() }
    }
}

/// What was sent of one ZooKeeper service, per host, in host order. A
/// sorted list rather than a map: a service has one host or a few, and a
/// `BTreeMap`'s first node alone takes about 1 KB (10 MB at 10k services,
/// heaptrack; BENCHMARKS.md).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SentHosts(Box<[(String, Sent)]>);

impl SentHosts {
    pub fn get(&self, host: &str) -> Option<&Sent> {
        self.0.binary_search_by(|(h, _)| h.as_str().cmp(host)).ok().map(|i| &self.0[i].1)
    }

    pub fn hosts(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(h, _)| h)
    }

    pub fn into_hosts(self) -> impl Iterator<Item = String> {
        self.0.into_iter().map(|(h, _)| h)
    }
}

/// The last entry of a host named twice wins, as in a map.
impl FromIterator<(String, Sent)> for SentHosts {
    fn from_iter<I: IntoIterator<Item = (String, Sent)>>(iter: I) -> SentHosts {
        let mut all: Vec<(String, Sent)> = iter.into_iter().collect();
        all.reverse();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.dedup_by(|later, earlier| later.0 == earlier.0);
        SentHosts(all.into_boxed_slice())
    }
}

fn digest(service: &Service) -> (u64, u64) {
    let (mut a, mut b) = (DefaultHasher::new(), DefaultHasher::new());
    b.write_u8(0x5a);
    service.hash(&mut a);
    service.hash(&mut b);
    (a.finish(), b.finish())
}

/// Turns members into services. Fixed for the life of a watcher.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    spec: RegistrySpec,
    /// For Spring instances that state no protocol: the registry's
    /// `protocol`, else HTTP (Higress's default); and whether it means TLS.
    spring_default: (Protocol, bool),
    /// SNI when originating TLS: the registry's `sni`, if set.
    sni: Option<String>,
}

impl Naming {
    pub fn new(spec: &RegistrySpec) -> Naming {
        let named = spec.protocol.as_deref();
        let protocol = named.and_then(Protocol::parse).unwrap_or(Protocol::Http);
        let tls = named.is_some_and(super::spring::is_tls_protocol);
        let sni = spec.sni.clone().filter(|s| !s.is_empty());
        Naming { spec: spec.clone(), spring_default: (protocol, tls), sni }
    }

    /// The services of ZooKeeper service `key`, given its members and what
    /// was last sent for it. A host seen before stays, empty, for as long as
    /// its service node exists: no members is an authoritative "none". A
    /// Dubbo interface yields one host per version and group among its
    /// providers; a Spring service always has its one host.
    pub fn render(
        &self,
        tree: &Tree,
        key: &ServiceKey,
        members: Vec<Member>,
        last: Option<&SentHosts>,
    ) -> BTreeMap<String, Service> {
        let kind = tree.kind(key);
        let mut by_host: BTreeMap<String, Vec<Member>> = BTreeMap::new();
        if kind == Kind::Spring {
            by_host.entry(tree.spring_host(key)).or_default();
        }
        for host in last.into_iter().flat_map(SentHosts::hosts) {
            by_host.entry(host.clone()).or_default();
        }
        for m in members {
            by_host.entry(m.host.clone()).or_default().push(m);
        }
        by_host
            .into_iter()
            .map(|(host, members)| {
                let previous = last.and_then(|l| l.get(&host));
                let service = self.service(kind, &host, members, previous);
                (host, service)
            })
            .collect()
    }

    fn service(&self, kind: Kind, host: &str, mut members: Vec<Member>, last: Option<&Sent>) -> Service {
        let last_port = last.and_then(|s| s.port.as_ref());
        // Instances are expected to agree; if they do not, the one with the
        // lowest port (then address) decides, so the choice is stable.
        members.sort_by(|a, b| (a.endpoint.port, &a.endpoint.address).cmp(&(b.endpoint.port, &b.endpoint.address)));
        let (protocol, tls) = match kind {
            // Higress gives Dubbo ports protocol "Dubbo", which Istio does not
            // know and proxies as opaque TCP; `Protocol::parse("dubbo")` agrees.
            Kind::Dubbo => (Protocol::Tcp, false),
            Kind::Spring if members.is_empty() => match (last_port, last) {
                (Some(p), Some(s)) => (p.protocol, s.tls),
                _ => self.spring_default,
            },
            // An instance that speaks TLS always states a protocol too.
            Kind::Spring => members.iter().find_map(|m| m.protocol.map(|p| (p, m.tls))).unwrap_or(self.spring_default),
        };
        let number = self
            .spec
            .vport_for(host)
            .or_else(|| members.iter().map(|m| m.endpoint.port).min())
            .or(last_port.map(|p| p.number))
            .filter(|p| *p != 0);
        let ports = number
            .map(|number| {
                let name = format!("{}-{number}", protocol.as_str().to_lowercase());
                vec![ServicePort { number, protocol, name }]
            })
            .unwrap_or_default();
        let service = Service::new(host, ports, members.into_iter().map(|m| m.endpoint).collect());
        if tls { service.with_tls(Tls { sni: self.sni.clone() }) } else { service }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RegistryKind;

    fn tree(custom: &[&str]) -> Tree {
        Tree::new("zk", &custom.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn key(root: usize, name: &str) -> ServiceKey {
        ServiceKey { root, name: name.into() }
    }

    #[test]
    fn roots_follow_higress() {
        let t = tree(&["/dubbo", "/services/", "/custom/apps/", "/"]);
        let paths: Vec<&str> = t.roots().iter().map(|r| r.path.as_str()).collect();
        assert_eq!(paths, ["/dubbo", "/services", "/custom/apps", "/"]);
        assert_eq!(t.spring_host(&key(1, "orders")), "orders.services.zookeeper");
        assert_eq!(t.spring_host(&key(2, "billing")), "billing.custom-apps.zookeeper");
        assert_eq!(t.spring_host(&key(3, "top")), "top.zookeeper");

        for bad in ["services", "/a//b", "/a/./b", "/a/..", ""] {
            let err = Tree::new("zk", &[bad.to_string()]).unwrap_err();
            assert!(err.to_string().starts_with("zk: zkServicesPath[0]: "), "{err}");
        }
        let clash = Tree::new("zk", &["/a/b".into(), "/a-b".into()]).unwrap_err();
        assert!(clash.to_string().contains("same host names"), "{clash}");
    }

    #[test]
    fn dubbo_events() {
        let t = tree(&[]);
        let greeter = Touch::Service(key(0, "com.foo.Greeter"));
        assert_eq!(t.classify(0, "/dubbo"), Touch::Root(0));
        assert_eq!(t.classify(0, "/dubbo/com.foo.Greeter"), greeter);
        assert_eq!(t.classify(0, "/dubbo/com.foo.Greeter/providers"), greeter);
        assert_eq!(t.classify(0, "/dubbo/com.foo.Greeter/providers/dubbo%3A%2F%2Fx"), greeter);
        for ignored in [
            "/dubbo/com.foo.Greeter/consumers/consumer%3A%2F%2Fx",
            "/dubbo/com.foo.Greeter/configurators",
            "/dubbo/com.foo.Greeter/routers/x",
            "/dubbo/com.foo.Greeter/providers/x/deeper",
            "/dubbo/config/dubbo/app.configurators",
            "/dubbo/metadata/com.foo.Greeter/provider/app",
            "/dubbo/mapping",
            "/dubbox/y",
            "/elsewhere",
        ] {
            assert_eq!(t.classify(0, ignored), Touch::Nothing, "{ignored}");
        }
        assert_eq!(t.members_path(&key(0, "com.foo.Greeter")), "/dubbo/com.foo.Greeter/providers");
    }

    #[test]
    fn spring_events_and_nested_roots() {
        let t = tree(&["/services/inner", "/"]);
        assert_eq!(t.classify(1, "/services"), Touch::Root(1));
        assert_eq!(t.classify(1, "/services/orders"), Touch::Service(key(1, "orders")));
        assert_eq!(t.classify(1, "/services/orders/5f0c"), Touch::Service(key(1, "orders")));
        assert_eq!(t.classify(1, "/services/orders/5f0c/x"), Touch::Nothing);
        assert_eq!(t.classify(1, "/services/inner/x"), Touch::Nothing, "belongs to the nested root");
        assert_eq!(t.classify(2, "/services/inner/x"), Touch::Service(key(2, "x")));
        // The `/` root sees every top-level node but the other roots and
        // ZooKeeper's own.
        assert_eq!(t.classify(3, "/"), Touch::Root(3));
        assert_eq!(t.classify(3, "/top/i1"), Touch::Service(key(3, "top")));
        for ignored in ["/dubbo/x", "/services/orders", "/zookeeper/quota", "/config/x"] {
            assert_eq!(t.classify(3, ignored), Touch::Nothing, "{ignored}");
        }
        assert_eq!(t.members_path(&key(3, "top")), "/top");
        assert_eq!(t.classify(9, "/x"), Touch::Nothing);
    }

    fn sent(hosts: &BTreeMap<String, Service>) -> SentHosts {
        hosts.iter().map(|(host, s)| (host.clone(), Sent::of(s))).collect()
    }

    #[test]
    fn sent_hosts_find_each_host_and_the_last_of_a_repeat() {
        let of = |port| Sent::of(&Service::new("h", vec![], vec![ep("10.0.0.1", port)]));
        let hosts: SentHosts =
            [("b".to_string(), of(1)), ("a".to_string(), of(2)), ("b".to_string(), of(3))].into_iter().collect();
        assert_eq!(hosts.hosts().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(hosts.get("a"), Some(&of(2)));
        assert_eq!(hosts.get("b"), Some(&of(3)), "the last wins, as in a map");
        assert_eq!(hosts.get("c"), None);
        assert_eq!(SentHosts::default().get("a"), None);
        assert_eq!(hosts.into_hosts().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn sent_tells_a_change() {
        let svc = Service::new("h", vec![], vec![ep("10.0.0.1", 80)]);
        let kept = Sent::of(&svc);
        assert_eq!(kept, Sent::of(&svc.clone()));
        assert_ne!(kept, Sent::of(&Service::new("h", vec![], vec![ep("10.0.0.1", 81)])));
        let mut labelled = ep("10.0.0.1", 80);
        labelled.labels.insert("version".into(), "2".into());
        assert_ne!(kept, Sent::of(&Service::new("h", vec![], vec![labelled])));
        assert_ne!(kept, Sent::of(&svc.clone().with_tls(Tls { sni: None })));
    }

    fn ep(address: &str, port: u16) -> Endpoint {
        Endpoint { address: address.into(), port, weight: 1, labels: Default::default() }
    }

    fn member(host: &str, address: &str, port: u16, protocol: Option<Protocol>) -> Member {
        Member { host: host.into(), endpoint: ep(address, port), protocol, tls: false }
    }

    #[test]
    fn dubbo_render_keeps_seen_hosts_empty() {
        let t = tree(&[]);
        let naming = Naming::new(&RegistrySpec::new(RegistryKind::Zookeeper, "zk", "h", 2181));
        let k = key(0, "com.foo.Greeter");
        let (v1, v2) = ("providers:com.foo.Greeter:1.0.0:.zookeeper", "providers:com.foo.Greeter:2.0.0:g.zookeeper");
        assert!(naming.render(&t, &k, vec![], None).is_empty(), "an interface with no providers yet");

        let first =
            naming.render(&t, &k, vec![member(v1, "10.0.0.2", 20881, None), member(v1, "10.0.0.1", 20880, None)], None);
        let svc = &first[v1];
        assert_eq!(svc.ports, vec![ServicePort { number: 20880, protocol: Protocol::Tcp, name: "tcp-20880".into() }]);
        assert_eq!(svc.endpoints.len(), 2);

        let second = naming.render(&t, &k, vec![member(v2, "10.0.0.3", 20990, None)], Some(&sent(&first)));
        assert_eq!(second.keys().collect::<Vec<_>>(), [v1, v2]);
        assert!(second[v1].endpoints.is_empty(), "authoritative empty");
        assert_eq!(second[v1].ports[0].number, 20880, "keeps its last port");
    }

    #[test]
    fn spring_render_protocol_and_vport() {
        let t = tree(&[]);
        let mut spec = RegistrySpec::new(RegistryKind::Zookeeper, "zk", "h", 2181);
        let naming = Naming::new(&spec);
        let k = key(1, "orders");
        let host = "orders.services.zookeeper";
        let empty = naming.render(&t, &k, vec![], None);
        assert_eq!(empty[host].ports, vec![], "no port known yet");

        let grpc = vec![member(host, "10.0.0.2", 9000, None), member(host, "10.0.0.1", 9001, Some(Protocol::Grpc))];
        let got = naming.render(&t, &k, grpc, Some(&sent(&empty)));
        assert_eq!(got[host].ports[0].name, "grpc-9000", "the lowest-port instance stating one decides");
        let gone = naming.render(&t, &k, vec![], Some(&sent(&got)));
        assert_eq!(gone[host].ports[0].name, "grpc-9000", "an empty service keeps its last port");

        spec.protocol = Some("http2".into());
        spec.vport_services.insert("orders.services.zookeeper".into(), 80);
        spec.vport_services.insert("billing".into(), 81);
        let naming = Naming::new(&spec);
        let got = naming.render(&t, &k, vec![member(host, "10.0.0.1", 9000, None)], None);
        assert_eq!(got[host].ports[0].name, "http2-80", "vport by service host, registry protocol");
        let billing = naming.render(&t, &key(1, "billing"), vec![], None);
        assert_eq!(billing["billing.services.zookeeper"].ports, vec![], "a bare service name is not a host");
    }

    #[test]
    fn spring_tls() {
        let t = tree(&[]);
        let mut spec = RegistrySpec::new(RegistryKind::Zookeeper, "zk", "h", 2181);
        spec.sni = Some("orders.example".into());
        let naming = Naming::new(&spec);
        let (k, host) = (key(1, "orders"), "orders.services.zookeeper");
        let ssl = Member { tls: true, ..member(host, "10.0.0.1", 8443, Some(Protocol::Https)) };
        let got = naming.render(&t, &k, vec![ssl], None);
        assert_eq!(got[host].ports[0].name, "https-8443");
        assert_eq!(got[host].tls, Some(Tls { sni: Some("orders.example".into()) }));
        let empty = naming.render(&t, &k, vec![], Some(&sent(&got)));
        assert!(empty[host].tls.is_some(), "an empty service keeps how it was reached");
        let plain = naming.render(&t, &k, vec![member(host, "10.0.0.1", 8080, None)], Some(&sent(&got)));
        assert_eq!((plain[host].ports[0].name.as_str(), plain[host].tls.is_none()), ("http-8080", true));
        let dubbo =
            naming.render(&t, &key(0, "i"), vec![member("providers:i:0.0.0:.zookeeper", "10.0.0.1", 1, None)], None);
        assert!(dubbo.values().all(|s| s.tls.is_none()));
    }
}
