//! The data that inputs, the cache and translation share: a leaf that
//! imports nothing of this crate, so `translate` (pure) reads its inputs
//! without depending on the modules that produce them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshbridge_registries::{RegistryKind, Secret, Service};
use serde_json::Value;

pub mod ingress;

/// Registries are keyed by (type, name), as the reconciler diffs them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegistryKey {
    pub kind: RegistryKind,
    pub name: String,
}

impl RegistryKey {
    pub fn new(kind: RegistryKind, name: impl Into<String>) -> Self {
        RegistryKey { kind, name: name.into() }
    }
}

impl fmt::Display for RegistryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// A service with the registry that reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedService {
    pub registry: RegistryKey,
    pub service: Arc<Service>,
}

/// A merged view of the cache at one revision (O(catalog): for tests and
/// whole-state consumers, never per change).
#[derive(Debug, Clone, Default)]
pub struct View {
    pub revision: u64,
    /// Services by host, as the first registry in key order reports it;
    /// the other registries that report the host are in `also`.
    pub services: BTreeMap<String, CachedService>,
    /// Host → the services of the other registries that report it too, in
    /// key order (translation merges them).
    pub also: BTreeMap<String, Vec<CachedService>>,
}

/// One host as the merged view has it now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostState {
    /// The service the first registry (in key order) reports; `None` once
    /// no registry reports the host.
    pub winner: Option<CachedService>,
    /// The same host as the other registries report it, in key order:
    /// translation merges them with `winner` (see `translate::merge`).
    pub also: Vec<CachedService>,
}

/// What changed since the last take: each changed host's current state.
#[derive(Debug, Clone, Default)]
pub struct Changes {
    pub revision: u64,
    /// When the oldest of these changes happened, for the latency metrics.
    pub changed_at: Option<Instant>,
    pub hosts: Vec<(String, HostState)>,
}

impl View {
    /// The view as one batch of changes: every host.
    pub fn into_changes(self) -> Changes {
        let mut also_by_host = self.also;
        let hosts = self
            .services
            .into_iter()
            .map(|(host, winner)| {
                let also = also_by_host.remove(&host).unwrap_or_default();
                (host, HostState { winner: Some(winner), also })
            })
            .collect();
        Changes { revision: self.revision, changed_at: None, hosts }
    }
}

/// A `networking.k8s.io/v1` `Ingress`, parsed once where it came in
/// ([`ingress`]). `Err` when it does not have the shape of one: the
/// translator reports that and leaves it out.
#[derive(Debug, Clone, PartialEq)]
pub struct IngressDoc {
    pub namespace: String,
    pub name: String,
    pub ingress: Result<Arc<ingress::Ingress>, ingress::InvalidIngress>,
}

impl IngressDoc {
    /// An Ingress from its JSON form (a file's YAML document).
    pub fn from_json(namespace: String, name: String, object: &Value) -> IngressDoc {
        IngressDoc { namespace, name, ingress: ingress::parse(object).map(Arc::new) }
    }
}

/// A certificate from a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`,
/// and `ca.crt` when it has one), named by Gateway servers' and
/// DestinationRules' `credentialName`. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsSecret {
    pub namespace: String,
    pub name: String,
    pub cert_chain_pem: String,
    pub private_key_pem: Secret,
    /// `ca.crt`: what a client certificate's upstream is verified against
    /// (`proxy-ssl-verify`).
    pub ca_cert_pem: Option<String>,
}

impl fmt::Debug for TlsSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("cert_chain_pem", &format_args!("<{} bytes>", self.cert_chain_pem.len()))
            .field("private_key_pem", &self.private_key_pem)
            .field("ca_cert_pem", &self.ca_cert_pem.as_ref().map(|c| format!("<{} bytes>", c.len())))
            .finish()
    }
}

/// The CA certificates of a Secret (its `cacert`, else its `ca.crt`, the
/// keys Istio reads in that order), whatever else it holds: what an
/// Ingress's `auth-tls-secret` names, to verify client certificates
/// against. Certificates only, public: no key is kept here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaSecret {
    pub namespace: String,
    pub name: String,
    pub ca_cert_pem: String,
}

/// A validated `McpBridge.spec.proxies[]` entry: an HTTP CONNECT proxy that
/// registries with a matching `proxyName` are reached through.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxySpec {
    pub name: String,
    pub server_address: String,
    pub server_port: u16,
    /// `None` when the entry leaves it 0: translation then picks one from
    /// 50001–50999 ([`crate::translate::proxy::listener_ports`]). Two proxies
    /// with the same port are an error here.
    pub listener_port: Option<u16>,
    /// `None` when unset; Higress then uses [`DEFAULT_PROXY_CONNECT_TIMEOUT`].
    pub connect_timeout: Option<Duration>,
}

/// Higress's connect timeout for a proxy without `connectTimeout`.
pub const DEFAULT_PROXY_CONNECT_TIMEOUT: Duration = Duration::from_millis(1200);
