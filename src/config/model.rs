//! The documents a config source holds, and the serde shapes of Higress's
//! `McpBridge` entries (`api/networking/v1/mcp_bridge.proto`, field names as
//! in the CRD, so a Higress user's YAML loads unchanged).
//!
//! Registry and proxy entries stay raw JSON in [`McpBridgeDoc`]: each entry is
//! deserialized on its own in `validate`, so one bad entry cannot sink its
//! neighbours.

use std::collections::BTreeMap;
use std::fmt;

pub use crate::model::IngressDoc;
use meshbridge_registries::Secret;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::Value;

/// One Kubernetes-style object read from a config source.
#[derive(Debug, Clone, PartialEq)]
pub enum Document {
    McpBridge(McpBridgeDoc),
    Secret(SecretDoc),
    Ingress(IngressDoc),
}

/// A `networking.higress.io/v1` `McpBridge`, with its entries not yet validated.
#[derive(Debug, Clone, PartialEq)]
pub struct McpBridgeDoc {
    pub namespace: String,
    pub name: String,
    /// `spec.registries[]`, one raw entry each.
    pub registries: Vec<RawEntry>,
    /// `spec.proxies[]`, one raw entry each.
    pub proxies: Vec<RawEntry>,
}

impl McpBridgeDoc {
    /// `namespace/name`, as used in error messages.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A `v1` `Secret`, `data` already base64-decoded and merged with `stringData`.
#[derive(Debug, Clone, PartialEq)]
pub struct SecretDoc {
    pub namespace: String,
    pub name: String,
    pub data: BTreeMap<String, Secret>,
}

/// A raw `spec.registries[]` or `spec.proxies[]` entry. Its `Debug` hides the
/// values of credential fields, so a document can be logged safely.
#[derive(Clone, PartialEq)]
pub struct RawEntry(pub Value);

/// Entry fields that carry credentials and must never be printed.
const CREDENTIAL_FIELDS: [&str; 2] = ["nacosAccessKey", "nacosSecretKey"];

impl fmt::Debug for RawEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.clone();
        if let Value::Object(map) = &mut shown {
            for field in CREDENTIAL_FIELDS {
                if let Some(v) = map.get_mut(field) {
                    *v = Value::String("<redacted>".into());
                }
            }
        }
        write!(f, "RawEntry({shown})")
    }
}

/// `RegistryConfig` from `mcp_bridge.proto`. proto3 scalars default to their
/// zero value, and zero means "unset" (an empty string, port 0, interval 0).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct RegistryConfig {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub domain: String,
    pub port: u32,
    pub nacos_address_server: String,
    #[serde(deserialize_with = "credential")]
    pub nacos_access_key: Option<Secret>,
    #[serde(deserialize_with = "credential")]
    pub nacos_secret_key: Option<Secret>,
    pub nacos_namespace_id: String,
    pub nacos_namespace: String,
    pub nacos_groups: Vec<String>,
    /// Nanoseconds.
    #[serde(deserialize_with = "int64")]
    pub nacos_refresh_interval: i64,
    pub consul_namespace: String,
    pub zk_services_path: Vec<String>,
    pub consul_datacenter: String,
    pub consul_service_tag: String,
    /// Nanoseconds.
    #[serde(deserialize_with = "int64")]
    pub consul_refresh_interval: i64,
    pub auth_secret_name: String,
    pub protocol: String,
    pub sni: String,
    pub proxy_name: String,
    pub vport: Option<VPort>,
    /// Milliseconds (newer Higress `mcp_bridge.proto`, field 28).
    #[serde(deserialize_with = "int64")]
    pub nacos_timeout: i64,
    /// Newer Higress `mcp_bridge.proto`, field 29: `repeated string`.
    pub ecdh_curves: Vec<String>,
    /// meshbridge only (not in Higress's `mcp_bridge.proto`, which has no
    /// field of this name): selective watch, `{mode, include}`. Checked
    /// field by field in `validate`.
    pub meshbridge_watch: Option<serde_json::Value>,
    /// meshbridge only, not in Higress's `mcp_bridge.proto`: the registry's
    /// weight and priority on hosts other registries publish too,
    /// `{weight, priority}`. Checked field by field in `validate`.
    pub meshbridge_migration: Option<serde_json::Value>,
    /// meshbridge only, not in Higress's `mcp_bridge.proto`: https to the
    /// registry itself (Higress's `protocol` and `sni` are about the
    /// registry's services). Absent: plain HTTP, as Higress.
    pub registry_tls: Option<RegistryTlsConfig>,
}

/// `registryTls`: TLS to the registry (meshbridge only).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub(crate) struct RegistryTlsConfig {
    /// Opt in: https (Consul, Nacos HTTP, login and address server, Eureka)
    /// and TLS gRPC (nacos2/nacos3).
    pub enabled: bool,
    /// Key of the `authSecretName` Secret holding a PEM CA bundle to trust
    /// instead of the default roots (e.g. `ca.crt`).
    pub ca_key: String,
    /// Name to verify the registry's certificate against, when `domain`
    /// (an IP, an alias) is not in it.
    pub server_name: String,
}

/// Every `RegistryConfig` field we read.
pub(crate) const REGISTRY_FIELDS: &[&str] = &[
    "type",
    "name",
    "domain",
    "port",
    "nacosAddressServer",
    "nacosAccessKey",
    "nacosSecretKey",
    "nacosNamespaceId",
    "nacosNamespace",
    "nacosGroups",
    "nacosRefreshInterval",
    "consulNamespace",
    "zkServicesPath",
    "consulDatacenter",
    "consulServiceTag",
    "consulRefreshInterval",
    "authSecretName",
    "protocol",
    "sni",
    "proxyName",
    "vport",
    "nacosTimeout",
    "ecdhCurves",
    "meshbridgeWatch",
    "meshbridgeMigration",
    "registryTls",
];

/// `RegistryConfig` fields for Higress's MCP server feature, which meshbridge
/// does not implement: accepted so Higress YAML loads, and ignored.
pub(crate) const REGISTRY_IGNORED_FIELDS: &[&str] = &[
    "mcpServerExportDomains",
    "mcpServerBaseUrl",
    "enableMCPServer",
    "enableScopeMcpServers",
    "allowMcpServers",
    "metadata",
];

/// `RegistryConfig.VPort`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct VPort {
    pub default: u32,
    pub services: Vec<VPortService>,
}

/// `RegistryConfig.VPort.Services`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct VPortService {
    pub name: String,
    pub value: u32,
}

/// `ProxyConfig` from `mcp_bridge.proto`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ProxyConfig {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: String,
    pub server_address: String,
    pub server_port: u32,
    pub listener_port: u32,
    /// Milliseconds.
    pub connect_timeout: u32,
}

/// Every `ProxyConfig` field.
pub(crate) const PROXY_FIELDS: &[&str] =
    &["type", "name", "serverAddress", "serverPort", "listenerPort", "connectTimeout"];

/// An `int64` as protobuf JSON writes it: a number or a numeric string.
fn int64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    struct Int64;
    impl Visitor<'_> for Int64 {
        type Value = i64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an integer (a number or a numeric string)")
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i64, E> {
            Ok(v)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i64, E> {
            i64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<i64, E> {
            v.trim().parse().map_err(|_| E::invalid_value(de::Unexpected::Str(v), &self))
        }
    }
    d.deserialize_any(Int64)
}

/// A credential string. A wrong type is reported without echoing the value,
/// which serde's own "invalid type: integer `123`" message would do.
fn credential<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Secret>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some(Secret::new(s))),
        _ => Err(de::Error::custom("must be a string")),
    }
}
