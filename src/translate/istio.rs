//! Registry services → Istio ServiceEntry, in Istio's own JSON field names
//! (what `kubectl get serviceentry -o json` shows).

use std::collections::BTreeMap;

use meshbridge_registries::Service;
use serde::Serialize;

use crate::cache::RegistryKey;

/// Namespace of generated objects, as in Higress.
pub const NAMESPACE: &str = "mcp";
pub const LABEL_REGISTRY_TYPE: &str = "higress-registry-type";
pub const LABEL_REGISTRY_NAME: &str = "higress-registry-name";

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntry {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: ServiceEntrySpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ObjectMeta {
    pub name: String,
    pub namespace: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceEntrySpec {
    pub hosts: Vec<String>,
    pub ports: Vec<Port>,
    pub location: &'static str,
    pub resolution: &'static str,
    pub endpoints: Vec<WorkloadEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Port {
    pub number: u32,
    pub protocol: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadEntry {
    pub address: String,
    /// Port name → the endpoint's own port.
    pub ports: BTreeMap<String, u32>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    pub weight: u32,
}

/// One ServiceEntry per service host. A service without ports cannot be
/// expressed and is left out with a reason.
pub fn service_entry(registry: &RegistryKey, svc: &Service) -> Result<ServiceEntry, String> {
    if svc.host.is_empty() {
        return Err(format!("registry {registry}: service with an empty host left out"));
    }
    if svc.ports.is_empty() {
        return Err(format!("ServiceEntry {}: no port known yet; left out", svc.host));
    }
    let labels = BTreeMap::from([
        (LABEL_REGISTRY_TYPE.to_string(), registry.kind.to_string()),
        (LABEL_REGISTRY_NAME.to_string(), registry.name.clone()),
    ]);
    let ports = svc
        .ports
        .iter()
        .map(|p| Port { number: p.number.into(), protocol: p.protocol.to_string(), name: p.name.clone() })
        .collect::<Vec<_>>();
    let endpoints = svc
        .endpoints
        .iter()
        .map(|ep| WorkloadEntry {
            address: ep.address.clone(),
            ports: ports.iter().map(|p| (p.name.clone(), u32::from(ep.port))).collect(),
            labels: ep.labels.clone(),
            weight: ep.weight,
        })
        .collect();
    Ok(ServiceEntry {
        api_version: "networking.istio.io/v1",
        kind: "ServiceEntry",
        metadata: ObjectMeta {
            name: object_name(&svc.host),
            namespace: NAMESPACE.into(),
            labels,
            ..Default::default()
        },
        spec: ServiceEntrySpec {
            hosts: vec![svc.host.clone()],
            ports,
            location: "MESH_INTERNAL",
            resolution: "STATIC",
            endpoints,
        },
    })
}

/// A Kubernetes object name for a service host. Hosts such as Dubbo's
/// `providers:com.example.Greeter:1.0.0:.zookeeper` are not valid names, and
/// Pilot drops invalid objects without a word; such hosts are lowercased,
/// every other character becomes `-`, and a hash of the host keeps two
/// hosts that sanitise alike apart.
pub fn object_name(host: &str) -> String {
    if super::mcp::is_dns1123_subdomain(host) {
        return host.to_string();
    }
    let mut name: String = host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c.to_ascii_lowercase() } else { '-' })
        .collect();
    name = name.split('.').map(|l| l.trim_matches('-')).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(".");
    name.truncate(200);
    let name = name.trim_end_matches(['-', '.']);
    let hash = &crate::resources::content_hash(host.as_bytes())[..8];
    if name.is_empty() { format!("host-{hash}") } else { format!("{name}-{hash}") }
}

/// Any Istio object in its Kubernetes JSON form. Typed builders (ServiceEntry
/// above, the Ingress translation, …) serialise into this, so the config set,
/// the MCP encoder and `/debug/configz` deal with one shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IstioObject {
    /// e.g. `networking.istio.io/v1`
    pub api_version: String,
    /// e.g. `VirtualService`
    pub kind: String,
    pub metadata: ObjectMeta,
    /// The spec in Istio's JSON field names (protobuf JSON mapping).
    pub spec: serde_json::Value,
}

impl IstioObject {
    /// `namespace/name`, the MCP resource name.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }
}

impl From<ServiceEntry> for IstioObject {
    fn from(se: ServiceEntry) -> Self {
        IstioObject {
            api_version: se.api_version.into(),
            kind: se.kind.into(),
            metadata: se.metadata,
            spec: serde_json::to_value(se.spec).unwrap_or_default(),
        }
    }
}

/// Fill what `primary` leaves unset from `fallback`, recursively through
/// objects: how a registry-derived DestinationRule completes one written for
/// an Ingress without overriding anything it says.
pub fn fill_unset(primary: &mut serde_json::Value, fallback: &serde_json::Value) {
    use serde_json::Value;
    match (primary, fallback) {
        (Value::Object(p), Value::Object(f)) => {
            for (k, fv) in f {
                match p.get_mut(k) {
                    Some(Value::Null) | None => {
                        p.insert(k.clone(), fv.clone());
                    }
                    Some(pv) => fill_unset(pv, fv),
                }
            }
        }
        (p @ Value::Null, f) => *p = f.clone(),
        _ => {}
    }
}

/// A DestinationRule that makes the mesh originate TLS to a service's
/// endpoints (`kubectl get destinationrule -o json` form).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRule {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: DestinationRuleSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    pub host: String,
    pub traffic_policy: TrafficPolicy,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    pub port_level_settings: Vec<PortTrafficPolicy>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortTrafficPolicy {
    pub port: PortSelector,
    pub tls: ClientTlsSettings,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortSelector {
    pub number: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientTlsSettings {
    /// `SIMPLE`: TLS to the upstream, no client certificate.
    pub mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
}

/// The DestinationRule for a service reached over TLS, named after its host
/// like the ServiceEntry; `None` for plain services and for services without
/// ports (their ServiceEntry is left out too).
pub fn destination_rule(registry: &RegistryKey, svc: &Service) -> Option<DestinationRule> {
    let tls = svc.tls.as_ref()?;
    if svc.host.is_empty() || svc.ports.is_empty() {
        return None;
    }
    let labels = BTreeMap::from([
        (LABEL_REGISTRY_TYPE.to_string(), registry.kind.to_string()),
        (LABEL_REGISTRY_NAME.to_string(), registry.name.clone()),
    ]);
    let port_level_settings = svc
        .ports
        .iter()
        .map(|p| PortTrafficPolicy {
            port: PortSelector { number: p.number.into() },
            tls: ClientTlsSettings { mode: "SIMPLE", sni: tls.sni.clone() },
        })
        .collect();
    Some(DestinationRule {
        api_version: "networking.istio.io/v1",
        kind: "DestinationRule",
        metadata: ObjectMeta {
            name: object_name(&svc.host),
            namespace: NAMESPACE.into(),
            labels,
            ..Default::default()
        },
        spec: DestinationRuleSpec { host: svc.host.clone(), traffic_policy: TrafficPolicy { port_level_settings } },
    })
}

impl From<DestinationRule> for IstioObject {
    fn from(dr: DestinationRule) -> Self {
        IstioObject {
            api_version: dr.api_version.into(),
            kind: dr.kind.into(),
            metadata: dr.metadata,
            spec: serde_json::to_value(dr.spec).unwrap_or_default(),
        }
    }
}
