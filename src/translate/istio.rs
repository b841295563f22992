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

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectMeta {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
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
        metadata: ObjectMeta { name: svc.host.clone(), namespace: NAMESPACE.into(), labels },
        spec: ServiceEntrySpec {
            hosts: vec![svc.host.clone()],
            ports,
            location: "MESH_INTERNAL",
            resolution: "STATIC",
            endpoints,
        },
    })
}
