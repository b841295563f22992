//! The validated registry configuration a watcher is built from. The binary
//! turns a Higress `McpBridge` registry entry into this; the reconciler
//! compares specs to decide whether a watcher must restart.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::tls::RegistryTls;

/// Registry types, spelled as in Higress's `McpBridge.spec.registries[].type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RegistryKind {
    Nacos,
    Nacos2,
    Nacos3,
    Consul,
    Zookeeper,
    Eureka,
    Static,
    Dns,
    /// Not an McpBridge type: the Kubernetes Services that `--kube` mode
    /// reads from EndpointSlices for the standalone gateway's Service
    /// backends (never sent to istiod, which reads Services itself).
    Kubernetes,
}

impl RegistryKind {
    /// Every McpBridge type (not [`RegistryKind::Kubernetes`]).
    pub const ALL: [RegistryKind; 8] = [
        RegistryKind::Nacos,
        RegistryKind::Nacos2,
        RegistryKind::Nacos3,
        RegistryKind::Consul,
        RegistryKind::Zookeeper,
        RegistryKind::Eureka,
        RegistryKind::Static,
        RegistryKind::Dns,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RegistryKind::Nacos => "nacos",
            RegistryKind::Nacos2 => "nacos2",
            RegistryKind::Nacos3 => "nacos3",
            RegistryKind::Consul => "consul",
            RegistryKind::Zookeeper => "zookeeper",
            RegistryKind::Eureka => "eureka",
            RegistryKind::Static => "static",
            RegistryKind::Dns => "dns",
            RegistryKind::Kubernetes => "kubernetes",
        }
    }

    pub fn parse(s: &str) -> Option<RegistryKind> {
        RegistryKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for RegistryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A secret value. Its `Debug` never shows the value, so a spec can be
/// logged or put in an error without leaking credentials.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    /// The value itself, for the one place that sends it to the registry.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Everything a watcher needs, already validated.
#[derive(Debug, Clone, PartialEq)]
pub struct RegistrySpec {
    pub kind: RegistryKind,
    pub name: String,
    /// Address (host name, IP, or comma list for static/dns/eureka).
    pub domain: String,
    pub port: u16,
    /// `protocol` field: the default protocol of the registry's services.
    pub protocol: Option<String>,
    pub sni: Option<String>,
    pub proxy_name: Option<String>,
    /// `ecdhCurves`: the curves offered in TLS handshakes with the
    /// registry's services (Envoy `tls_params.ecdh_curves`); empty is
    /// Envoy's default.
    pub ecdh_curves: Vec<String>,
    /// `vport`: the service port to expose instead of the instances' port.
    pub vport_default: Option<u16>,
    /// `vport.services[]`: lowercased service host → port.
    pub vport_services: BTreeMap<String, u16>,

    pub nacos_address_server: Option<String>,
    pub nacos_access_key: Option<Secret>,
    pub nacos_secret_key: Option<Secret>,
    pub nacos_namespace_id: Option<String>,
    pub nacos_namespace: Option<String>,
    pub nacos_groups: Vec<String>,
    pub nacos_refresh_interval: Option<Duration>,
    /// `nacosTimeout`: the deadline of each request to Nacos.
    pub nacos_timeout: Option<Duration>,

    pub consul_namespace: Option<String>,
    pub consul_datacenter: Option<String>,
    pub consul_service_tag: Option<String>,
    pub consul_refresh_interval: Option<Duration>,
    /// meshbridge only, not in Higress's McpBridge: the most connections the
    /// Consul watcher holds (`None`: `MESHBRIDGE_CONSUL_MAX_CONNS`, else
    /// [`crate::consul::DEFAULT_MAX_CONNS`]). Set by the binary's
    /// `--consul-max-conns`.
    pub consul_max_conns: Option<usize>,

    /// meshbridge only, not in Higress's McpBridge: how often the watcher's
    /// anti-entropy pass reads the registry's whole truth
    /// ([`crate::repair`]; `None`: [`crate::repair::DEFAULT_INTERVAL`]). Set
    /// by the binary's `--anti-entropy-interval`.
    pub anti_entropy_interval: Option<Duration>,

    pub zk_services_path: Vec<String>,

    /// meshbridge only, not in Higress's McpBridge (`meshbridgeWatch`):
    /// read only some services (see [`crate::Selector`]); `None` reads all.
    pub watch: Option<crate::select::WatchSpec>,

    /// Data of the Secret named by `authSecretName`, resolved by the binary.
    /// Keys as in Higress: `consulToken`, `nacosUsername`, `nacosPassword`.
    pub auth: BTreeMap<String, Secret>,

    /// meshbridge only, not in Higress's McpBridge (`registryTls`): https to
    /// the registry. `None`: plain HTTP, as Higress always does.
    pub tls: Option<RegistryTls>,

    /// meshbridge only, not in Higress's McpBridge (`meshbridgeMigration`):
    /// this registry's share and priority on hosts that other registries
    /// publish too. Read by translation alone: a change never restarts the
    /// watcher (see [`RegistrySpec::same_watcher`]).
    pub migration: Migration,
}

/// `meshbridgeMigration`: how a host that several registries publish
/// divides its traffic between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Migration {
    /// Relative weight among the registries that serve the same host at
    /// the same priority (0..=100). `None`: 100 when another of them sets
    /// one; when none does, traffic spreads over the instances.
    pub weight: Option<u32>,
    /// Lower is preferred (0..=100, default 0): a registry is used for a
    /// host only while every registry with a lower value has no endpoint.
    pub priority: u32,
}

/// The largest `meshbridgeMigration.weight` and `.priority`.
pub const MIGRATION_MAX: u32 = 100;

impl RegistrySpec {
    /// A spec with only the common fields set; the rest default.
    pub fn new(kind: RegistryKind, name: impl Into<String>, domain: impl Into<String>, port: u16) -> Self {
        RegistrySpec {
            kind,
            name: name.into(),
            domain: domain.into(),
            port,
            protocol: None,
            sni: None,
            proxy_name: None,
            ecdh_curves: Vec::new(),
            vport_default: None,
            vport_services: BTreeMap::new(),
            nacos_address_server: None,
            nacos_access_key: None,
            nacos_secret_key: None,
            nacos_namespace_id: None,
            nacos_namespace: None,
            nacos_groups: Vec::new(),
            nacos_refresh_interval: None,
            nacos_timeout: None,
            consul_namespace: None,
            consul_datacenter: None,
            consul_service_tag: None,
            consul_refresh_interval: None,
            consul_max_conns: None,
            anti_entropy_interval: None,
            zk_services_path: Vec::new(),
            watch: None,
            auth: BTreeMap::new(),
            tls: None,
            migration: Migration::default(),
        }
    }

    /// Whether a watcher started for `self` serves `other` unchanged: the
    /// specs differ at most in what translation alone reads
    /// (`meshbridgeMigration`).
    pub fn same_watcher(&self, other: &RegistrySpec) -> bool {
        RegistrySpec { migration: other.migration, ..self.clone() } == *other
    }

    /// The anti-entropy interval ([`crate::repair`]): the spec's, else
    /// [`crate::repair::DEFAULT_INTERVAL`]; never below
    /// [`crate::repair::MIN_INTERVAL`].
    pub fn anti_entropy(&self) -> Duration {
        self.anti_entropy_interval.unwrap_or(crate::repair::DEFAULT_INTERVAL).max(crate::repair::MIN_INTERVAL)
    }

    /// The service port to expose for the service `host`: the
    /// `vport.services[]` entry named as that host, ignoring case (as
    /// Higress's `GetServiceVport` matches), else the registry default, else
    /// `None` (use the instances'). Keys of `vport_services` are lowercase.
    pub fn vport_for(&self, host: &str) -> Option<u16> {
        let found = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            self.vport_services.get(&host.to_ascii_lowercase())
        } else {
            self.vport_services.get(host)
        };
        found.copied().or(self.vport_default)
    }

    /// Every credential in the spec (the `authSecretName` data but user
    /// names, the Nacos access and secret keys), non-empty ones only: what
    /// must be scrubbed from anything shown, such as an error a registry
    /// echoed. User names are not secret, and scrubbing one (often a plain
    /// word such as `nacos`) would garble messages.
    pub fn secrets(&self) -> Vec<&Secret> {
        let auth = self.auth.iter().filter(|(k, _)| !k.to_ascii_lowercase().contains("username")).map(|(_, v)| v);
        let keys = [&self.nacos_access_key, &self.nacos_secret_key];
        auth.chain(keys.into_iter().flatten()).filter(|s| !s.expose().is_empty()).collect()
    }

    /// The credentials the watcher sends to the registry, by name (never
    /// the value): the non-empty `consulToken`, `nacosUsername`/`nacosPassword`
    /// and `nacosAccessKey`/`nacosSecretKey` that this registry type uses.
    pub fn credential_names(&self) -> Vec<&'static str> {
        let set = |key: &str| self.auth.get(key).is_some_and(|s| !s.expose().is_empty());
        let mut out = Vec::new();
        match self.kind {
            RegistryKind::Consul if set("consulToken") => out.push("consulToken"),
            RegistryKind::Nacos | RegistryKind::Nacos2 | RegistryKind::Nacos3 => {
                if set("nacosPassword") {
                    out.push("nacosPassword");
                }
                if self.nacos_secret_key.as_ref().is_some_and(|s| !s.expose().is_empty()) {
                    // Only a signature made with it travels, but that
                    // signature can be replayed as long as it is fresh.
                    out.push("nacosSecretKey");
                }
            }
            _ => {}
        }
        out
    }

    /// `domain:port` without credentials, for logs and the admin API;
    /// `https://domain:port` with `registryTls`, so the admin API shows
    /// whether TLS is in force. A static registry's `domain` already lists
    /// each endpoint with its own port, so it is shown alone.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https://" } else { "" };
        match self.kind {
            RegistryKind::Static => format!("{scheme}{}", self.domain),
            _ => format!("{scheme}{}:{}", self.domain, self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_registry_shows_its_endpoints_with_their_own_ports() {
        let fixed = RegistrySpec::new(RegistryKind::Static, "s", "127.0.0.1:10081,[::1]:9000", 80);
        assert_eq!(fixed.endpoint(), "127.0.0.1:10081,[::1]:9000");
        assert_eq!(RegistrySpec::new(RegistryKind::Consul, "c", "127.0.0.1", 8500).endpoint(), "127.0.0.1:8500");
    }

    #[test]
    fn secrets_lists_every_credential_once_set() {
        let mut spec = RegistrySpec::new(RegistryKind::Nacos, "n", "127.0.0.1", 8848);
        assert!(spec.secrets().is_empty());
        spec.auth.insert("nacosUsername".into(), Secret::new("user"));
        spec.auth.insert("nacosPassword".into(), Secret::new("pw"));
        spec.auth.insert("consulToken".into(), Secret::new(""));
        spec.nacos_access_key = Some(Secret::new("ak"));
        spec.nacos_secret_key = Some(Secret::new("sk"));
        let mut got: Vec<&str> = spec.secrets().into_iter().map(Secret::expose).collect();
        got.sort();
        assert_eq!(got, vec!["ak", "pw", "sk"], "user names are not secret");
    }
}
