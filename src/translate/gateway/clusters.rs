//! Route destinations → cluster names, and the subset clusters they need.
//!
//! A destination resolves only to a cluster the Envoy will have: a registry
//! service's `outbound|{port}||{host}` (made by [`envoy::clusters`] for every
//! service) or a subset cluster made here. Anything else is an error the
//! caller turns into a 503 route and a warning.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster::LbPolicy};
use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
use envoy_types::util::pack_any;
use meshbridge_registries::{Service, Tls};
use prost::Message;

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SdsSecretConfig, UpstreamTlsContext,
    common_tls_context::ValidationContextType,
};

use super::fallback;
use super::listeners::{TLS_TRANSPORT_SOCKET, ads, inline, secret_name, tls_secret};
use super::servers::{find_tls, is_pem};
use super::spec::Named;
use crate::model::{CachedService, TlsSecret as GatewayTls};
use crate::resources::Resource;
use crate::translate::model::{
    ClientTlsMode, ClientTlsSettings, ConsistentHash, Destination, DestinationRuleSpec, H2UpgradePolicy, HttpCookie,
    LoadBalancerSettings, PortSelector, SimpleLb,
};
use crate::translate::{envoy, merge};

/// The subset part of the name of a cluster that carries an Ingress
/// DestinationRule's upstream policy for all of a host's endpoints: `_` is
/// never in a subset name (a DNS label), so it cannot clash with one.
pub const POLICY_SUBSET: &str = "_policy";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// Host → registry service (merged across registries, under its primary
/// registry): how the gateway sees the registries.
pub type ServiceLookup<'a> = dyn Fn(&str) -> Option<CachedService> + 'a;

/// Why a route destination has no cluster the standalone Envoy will have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoCluster {
    /// The host is not a service of any registry.
    #[error("host {host} has no cluster in the standalone gateway (not a registry service)")]
    NotRegistryService { host: String },
    /// The host is a Kubernetes Service (`*.svc.cluster.local`) with no
    /// endpoints known: a config directory has none (istiod reads them), and
    /// in `--kube` mode the Service is missing or not read yet.
    #[error(
        "host {host} is a Kubernetes Service the standalone gateway has no endpoints for: it reads them only in \
         --kube mode, from the Service's EndpointSlices (through istiod, istiod serves it); from a config directory, \
         name the backend as a `static` registry instead"
    )]
    KubernetesService { host: String },
    /// The destination names a port the service does not have.
    #[error("host {host} has no port {port}")]
    NoSuchPort { host: String, port: u32 },
    /// The port was given by a name that none of the Service's ports has.
    #[error("host {host} has no port named {name:?}")]
    NoSuchPortName { host: String, name: String },
    /// No port given, and the service has several (or none) to choose from.
    #[error("host {host}: no port given and the service has {ports} ports")]
    AmbiguousPort { host: String, ports: usize },
    /// DestinationRules exist for the host, but none defines the subset.
    #[error("subset {subset:?} of host {host} is not defined by its DestinationRules")]
    UndefinedSubset { host: String, subset: String },
    /// The destination names a subset, and no DestinationRule is for the host.
    #[error("subset {subset:?}: no DestinationRule for host {host}")]
    NoDestinationRule { host: String, subset: String },
    /// A DestinationRule's `MUTUAL` TLS names no usable client certificate
    /// (no such Secret, or verification asked for and no `ca.crt`).
    #[error("host {host}: no client certificate for mutual TLS: {why}")]
    ClientCertificate { host: String, why: String },
    /// The service's own cluster could not be read back to derive a subset
    /// cluster from it (a bug, not bad input).
    #[error("cluster {base} could not be decoded to derive {name}")]
    Undecodable { base: String, name: String },
}

pub struct Clusters<'a> {
    services: &'a ServiceLookup<'a>,
    /// The certificates there are, for `MUTUAL` TLS's `credentialName`.
    tls: &'a [GatewayTls],
    /// The SDS Secrets of the client certificates clusters name, by name.
    secrets: BTreeMap<String, Resource>,
    /// DestinationRules by host, in `namespace/name` order: looked up for
    /// every destination, so not scanned whole each time.
    rules: BTreeMap<&'a str, Vec<&'a Named<'a, DestinationRuleSpec>>>,
    /// Subset clusters made so far, by name, with their load assignments.
    made: BTreeMap<String, (Resource, Option<Resource>)>,
    /// Every destination host asked for, found or not.
    referenced: BTreeSet<String>,
    /// Cluster → the hash its routes must compute (consistent hashing).
    hashes: BTreeMap<String, HashPolicy>,
}

/// What an Ingress DestinationRule asks of a host's cluster on one port.
#[derive(Debug, Clone, Default, PartialEq)]
struct Policy<'a> {
    lb: Option<LoadBalancerSettings>,
    h2: bool,
    tls: Option<ClientTlsSettings>,
    /// The rule's namespace, where a `credentialName` is looked up.
    namespace: &'a str,
}

impl<'a> Clusters<'a> {
    pub fn new(
        services: &'a ServiceLookup<'a>,
        rules: &'a [Named<'a, DestinationRuleSpec>],
        tls: &'a [GatewayTls],
    ) -> Self {
        let mut by_host: BTreeMap<&str, Vec<_>> = BTreeMap::new();
        for rule in rules {
            by_host.entry(rule.spec.host.as_str()).or_default().push(rule);
        }
        Clusters {
            services,
            tls,
            secrets: BTreeMap::new(),
            rules: by_host,
            made: BTreeMap::new(),
            referenced: BTreeSet::new(),
            hashes: BTreeMap::new(),
        }
    }

    /// The cluster a destination goes to, or why there is none.
    pub fn resolve(&mut self, dest: &Destination) -> Result<String, NoCluster> {
        let host = dest.host.as_str();
        self.referenced.insert(host.to_string());
        let Some(CachedService { registry, service: svc }) = (self.services)(host) else {
            let host = host.to_string();
            return Err(if host.to_ascii_lowercase().ends_with(".svc.cluster.local") {
                NoCluster::KubernetesService { host }
            } else {
                NoCluster::NotRegistryService { host }
            });
        };
        let port = match (&dest.port, svc.ports.as_slice()) {
            (Some(p), _) if p.number != 0 => u16::try_from(p.number)
                .ok()
                .filter(|n| svc.ports.iter().any(|sp| sp.number == *n))
                .ok_or_else(|| NoCluster::NoSuchPort { host: host.to_string(), port: p.number })?,
            (_, [only]) => only.number,
            // A Kubernetes Service's port by its name, as kube-proxy finds it.
            (_, ports) => match dest.port_name.as_deref() {
                Some(name) => match ports.iter().find(|p| p.name == name) {
                    Some(p) => p.number,
                    None => {
                        return Err(NoCluster::NoSuchPortName { host: host.to_string(), name: name.to_string() });
                    }
                },
                None => return Err(NoCluster::AmbiguousPort { host: host.to_string(), ports: ports.len() }),
            },
        };
        let subset = dest.subset.as_deref().filter(|s| !s.is_empty());
        let policy = self.policy(host, port);
        if subset.is_none() && policy.is_none() {
            return Ok(envoy::cluster_name(port, "", host));
        }
        let name = envoy::cluster_name(port, subset.unwrap_or(POLICY_SUBSET), host);
        if !self.made.contains_key(&name) {
            let labels = match subset {
                Some(subset) => self.subset_labels(host, subset)?,
                None => &NO_LABELS,
            };
            let client = match policy.as_ref() {
                Some(p) => self.client_certificate(host, p)?,
                None => None,
            };
            let made = subset_cluster(&svc, &registry.name, port, &name, labels, policy.as_ref(), client)?;
            if let Some(LoadBalancerSettings::ConsistentHash(key)) = policy.as_ref().and_then(|p| p.lb.as_ref()) {
                self.hashes.insert(name.clone(), hash_policy(key));
            }
            self.made.insert(name.clone(), made);
        }
        Ok(name)
    }

    /// The cluster of a default backend: as [`Self::resolve`], except that
    /// with no port given a service with several takes its first (lowest),
    /// as Higress takes a Service's first port.
    pub fn resolve_default_backend(&mut self, dest: &Destination) -> Result<String, NoCluster> {
        let first = || (self.services)(&dest.host)?.service.ports.first().map(|p| p.number);
        match (&dest.port, &dest.port_name) {
            (None, None) => match first() {
                Some(n) => self.resolve(&Destination { port: Some(PortSelector { number: n.into() }), ..dest.clone() }),
                None => self.resolve(dest),
            },
            _ => self.resolve(dest),
        }
    }

    /// The aggregate cluster of `primary` then the default backend
    /// `backend` (see `fallback.rs`), made once.
    pub fn with_default_backend(&mut self, primary: &str, backend: &str) -> String {
        let name = fallback::aggregate_name(primary, backend);
        if !self.made.contains_key(&name) {
            self.made.insert(name.clone(), (fallback::aggregate_cluster(primary, backend), None));
        }
        name
    }

    /// The hash a route to `cluster` must compute, when its rule hashes.
    pub fn hash_policy(&self, cluster: &str) -> Option<HashPolicy> {
        self.hashes.get(cluster).cloned()
    }

    /// The upstream policy of `host`'s DestinationRule on `port`, as Istio
    /// applies it: the port's own settings when the rule has some (they
    /// carry the registry's TLS, already on the host's cluster, or an
    /// Ingress's mutual TLS in its place), else the rule's. `None` when it
    /// asks for nothing.
    fn policy(&self, host: &str, port: u16) -> Option<Policy<'a>> {
        let rule = self.rules.get(host)?.iter().find(|r| r.spec.traffic_policy.is_some())?;
        let tp = rule.spec.traffic_policy.as_ref()?;
        let (lb, pool, tls) = match tp.port_level_settings.iter().find(|p| p.port.number == u32::from(port)) {
            Some(p) => (&p.load_balancer, &p.connection_pool, Some(p.tls.clone()).filter(is_mutual)),
            None => (&tp.load_balancer, &tp.connection_pool, tp.tls.clone()),
        };
        let h2 = pool.as_ref().is_some_and(|p| p.http.h2_upgrade_policy == H2UpgradePolicy::Upgrade);
        let namespace = rule.namespace;
        let policy = Policy { lb: lb.clone(), h2, tls, namespace };
        (policy != Policy { namespace, ..Policy::default() }).then_some(policy)
    }

    /// The client certificate of a `MUTUAL` policy, its SDS Secret noted
    /// for the Envoy; `None` for any other policy.
    fn client_certificate(&mut self, host: &str, p: &Policy<'_>) -> Result<Option<&'a GatewayTls>, NoCluster> {
        let Some(tls) = p.tls.as_ref().filter(|t| is_mutual(t)) else { return Ok(None) };
        let why = |why: String| NoCluster::ClientCertificate { host: host.to_string(), why };
        let credential = tls.credential_name.as_deref().unwrap_or_default();
        if credential.is_empty() {
            return Err(why("no credentialName (certificate files are not supported)".into()));
        }
        let cert = find_tls(credential, p.namespace, self.tls).map_err(|e| why(e.to_string()))?;
        if !is_pem(&cert.cert_chain_pem) || !is_pem(cert.private_key_pem.expose()) {
            return Err(why(format!("secret {}/{}: tls.crt or tls.key is not PEM", cert.namespace, cert.name)));
        }
        let verify = tls.insecure_skip_verify != Some(true);
        if verify && !cert.ca_cert_pem.as_deref().is_some_and(is_pem) {
            return Err(why(format!(
                "secret {}/{} has no PEM ca.crt to verify the backend against (proxy-ssl-verify: on)",
                cert.namespace, cert.name
            )));
        }
        self.secrets.entry(secret_name(cert)).or_insert_with(|| tls_secret(cert));
        Ok(Some(cert))
    }

    /// The labels of `subset` for `host`: the first DestinationRule (by
    /// `namespace/name`) for the host that defines it. The standalone Envoy
    /// is one proxy, so the choice cannot depend on who refers to it.
    fn subset_labels(&self, host: &str, subset: &str) -> Result<&'a BTreeMap<String, String>, NoCluster> {
        let mut any_rule = false;
        for rule in self.rules.get(host).into_iter().flatten() {
            any_rule = true;
            if let Some(s) = rule.spec.subsets.iter().find(|s| s.name == subset) {
                return Ok(&s.labels);
            }
        }
        let (host, subset) = (host.to_string(), subset.to_string());
        Err(if any_rule {
            NoCluster::UndefinedSubset { host, subset }
        } else {
            NoCluster::NoDestinationRule { host, subset }
        })
    }

    /// The subset clusters and their load assignments, sorted by name,
    /// every host a destination named, and the SDS Secrets of the client
    /// certificates the clusters name.
    pub fn into_resources(self) -> ClusterResources {
        let (clusters, assignments): (Vec<Resource>, Vec<Option<Resource>>) = self.made.into_values().unzip();
        ClusterResources {
            clusters,
            load_assignments: assignments.into_iter().flatten().collect(),
            referenced: self.referenced,
            secrets: self.secrets,
        }
    }
}

/// What [`Clusters`] made.
pub struct ClusterResources {
    pub clusters: Vec<Resource>,
    pub load_assignments: Vec<Resource>,
    pub referenced: BTreeSet<String>,
    /// By name.
    pub secrets: BTreeMap<String, Resource>,
}

fn is_mutual(t: &ClientTlsSettings) -> bool {
    t.mode == ClientTlsMode::Mutual
}

/// A subset cluster: the service's own cluster for `port` under another name
/// (so it keeps whatever protocol options and TLS that cluster has), with a
/// load assignment of only the endpoints carrying every subset label, and
/// the host's upstream policy.
fn subset_cluster(
    svc: &Service,
    registry: &str,
    port: u16,
    name: &str,
    labels: &BTreeMap<String, String>,
    policy: Option<&Policy<'_>>,
    client: Option<&GatewayTls>,
) -> Result<(Resource, Option<Resource>), NoCluster> {
    let base = envoy::cluster_name(port, "", &svc.host);
    let broken = || NoCluster::Undecodable { base: base.clone(), name: name.to_string() };
    let mut cluster = envoy::clusters(svc)
        .into_iter()
        .find(|r| *r.name == *base)
        .and_then(|r| Cluster::decode(r.body.value()).ok())
        .ok_or_else(broken)?;
    cluster.name = name.to_string();
    if let Some(eds) = cluster.eds_cluster_config.as_mut() {
        // Endpoints are looked up by the cluster's own name.
        eds.service_name.clear();
    }
    if let Some(p) = policy {
        apply(&mut cluster, p, client);
    }

    let matching = Service {
        endpoints: svc
            .endpoints
            .iter()
            .filter(|ep| labels.iter().all(|(k, v)| merge::endpoint_label(ep, registry, k) == Some(v.as_str())))
            .cloned()
            .collect(),
        ..svc.clone()
    };
    let mut cla = envoy::assignment(&matching, port).ok_or_else(broken)?;
    cla.cluster_name = name.to_string();
    if cluster.load_assignment.is_some() {
        // A DNS cluster holds its endpoints: no EDS.
        cluster.load_assignment = Some(cla);
        return Ok((Resource::new(name.to_string(), pack_any(cluster)), None));
    }
    Ok((Resource::new(name.to_string(), pack_any(cluster)), Some(Resource::new(name.to_string(), pack_any(cla)))))
}

/// An upstream policy on a cluster, as Pilot applies a DestinationRule:
/// the balancer (a consistent hash is a ring), HTTP/2, and TLS origination
/// unless the cluster has TLS already (the registry's); mutual TLS with
/// `client`'s certificate in any case.
fn apply(cluster: &mut Cluster, p: &Policy<'_>, client: Option<&GatewayTls>) {
    if let Some(lb) = &p.lb {
        let policy = match lb {
            LoadBalancerSettings::Simple(SimpleLb::LeastConn | SimpleLb::LeastRequest) => LbPolicy::LeastRequest,
            LoadBalancerSettings::Simple(SimpleLb::Random) => LbPolicy::Random,
            LoadBalancerSettings::Simple(_) => LbPolicy::RoundRobin,
            LoadBalancerSettings::ConsistentHash(_) => LbPolicy::RingHash,
        };
        cluster.lb_policy = policy as i32;
    }
    if p.h2 && !envoy::is_http2(cluster) {
        envoy::set_http2(cluster);
    }
    let Some(t) = &p.tls else { return };
    let h2 = envoy::is_http2(cluster);
    if let Some(cert) = client {
        cluster.transport_socket = Some(mutual_tls_socket(t, cert, h2));
    } else if cluster.transport_socket.is_none() {
        cluster.transport_socket = Some(envoy::tls_socket(&Tls { sni: t.sni.clone() }, h2, &[]));
    }
}

/// Mutual TLS as Pilot builds it for a `credentialName`: the certificate by
/// SDS (the cluster carries no key; the xDS server hands the Secret only to
/// authenticated clients), and, unless `insecureSkipVerify`, the Secret's
/// `ca.crt` to verify the backend's chain (inline: it is public). Like
/// Pilot with an `sni` and no `subjectAltNames`, the name is not checked.
fn mutual_tls_socket(t: &ClientTlsSettings, cert: &GatewayTls, h2: bool) -> TransportSocket {
    let validation = cert.ca_cert_pem.as_deref().filter(|_| t.insecure_skip_verify != Some(true)).map(|ca| {
        ValidationContextType::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(inline(ca)),
            ..Default::default()
        })
    });
    let common = CommonTlsContext {
        alpn_protocols: if h2 { vec!["h2".into()] } else { Vec::new() },
        tls_certificate_sds_secret_configs: vec![SdsSecretConfig { name: secret_name(cert), sds_config: Some(ads()) }],
        validation_context_type: validation,
        ..Default::default()
    };
    let context = UpstreamTlsContext {
        sni: t.sni.clone().unwrap_or_default(),
        common_tls_context: Some(common),
        ..Default::default()
    };
    TransportSocket {
        name: TLS_TRANSPORT_SOCKET.into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(context))),
    }
}

/// The route's hash for a consistent-hash rule, as Pilot writes it.
fn hash_policy(key: &ConsistentHash) -> HashPolicy {
    use hash_policy::PolicySpecifier;
    let specifier = match key {
        ConsistentHash::HttpHeaderName(h) => {
            PolicySpecifier::Header(hash_policy::Header { header_name: h.clone(), regex_rewrite: None })
        }
        ConsistentHash::HttpCookie(HttpCookie { name, path, ttl }) => PolicySpecifier::Cookie(hash_policy::Cookie {
            name: name.clone(),
            path: path.clone(),
            ttl: ttl.map(super::policy::duration),
            ..Default::default()
        }),
        ConsistentHash::UseSourceIp(_) => {
            PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties { source_ip: true })
        }
        ConsistentHash::HttpQueryParameterName(q) => {
            PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: q.clone() })
        }
    };
    HashPolicy { policy_specifier: Some(specifier), terminal: false }
}
