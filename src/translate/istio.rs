//! Registry services → Istio ServiceEntry and (for services reached over
//! TLS) DestinationRule, in the typed model of [`super::model`].

use std::collections::BTreeMap;

use meshbridge_registries::Service;

use super::merge::RegistryLabels;
use super::model::{
    ClientTlsMode, ClientTlsSettings, DestinationRuleSpec, IstioObject, LABEL_PRIORITY, LABEL_REGISTRY_NAME,
    LABEL_REGISTRY_TYPE, Location, NAMESPACE, ObjectMeta, OutlierDetection, Port, PortMap, PortSelector,
    PortTrafficPolicy, Resolution, ServiceEntrySpec, Spec, TrafficPolicy, WorkloadEntry,
};
use super::names::object_name;
use super::shared::intern;
use super::warning::{Reason, Warning};
use crate::model::RegistryKey;

fn meta(registry: &RegistryKey, svc: &Service) -> ObjectMeta {
    // The same for every service of the registry: one shared copy.
    let labels = intern(BTreeMap::from([
        (LABEL_REGISTRY_TYPE.to_string(), registry.kind.to_string()),
        (LABEL_REGISTRY_NAME.to_string(), registry.name.clone()),
    ]));
    ObjectMeta { name: object_name(&svc.host), namespace: NAMESPACE.into(), labels, ..Default::default() }
}

/// One ServiceEntry per service host. A service without ports cannot be
/// expressed and is left out with a reason.
pub fn service_entry(registry: &RegistryKey, svc: &Service) -> Result<IstioObject, Warning> {
    if svc.host.is_empty() {
        return Err(Warning::new(
            format!("registry {registry}"),
            Reason::EmptyHost,
            "service with an empty host left out",
        ));
    }
    if svc.ports.is_empty() {
        return Err(Warning::new(format!("ServiceEntry {}", svc.host), Reason::NoPort, "no port known yet; left out"));
    }
    let ports = svc
        .ports
        .iter()
        .map(|p| Port { number: p.number.into(), protocol: p.protocol.to_string(), name: p.name.clone() })
        .collect::<Vec<_>>();
    // Endpoints on the same port share one port map (so do services).
    let mut shared: Option<(u16, PortMap)> = None;
    let mut registry_labels = RegistryLabels::new(&registry.name);
    let endpoints = svc
        .endpoints
        .iter()
        .map(|ep| {
            let map = match &shared {
                Some((port, map)) if *port == ep.port => map.clone(),
                _ => {
                    let map: PortMap = intern(ports.iter().map(|p| (p.name.clone(), u32::from(ep.port))).collect());
                    shared = Some((ep.port, map.clone()));
                    map
                }
            };
            let labels = registry_labels.of(&ep.labels);
            WorkloadEntry { address: ep.address.clone(), ports: map, labels, weight: ep.weight }
        })
        .collect();
    let spec = ServiceEntrySpec {
        hosts: vec![svc.host.clone()],
        ports,
        location: Location::MeshInternal,
        resolution: Resolution::Static,
        endpoints,
    };
    Ok(IstioObject { metadata: meta(registry, svc), spec: Spec::ServiceEntry(spec) })
}

/// The DestinationRule of a registry service, named after its host like
/// the ServiceEntry, for a service reached over TLS (each port's TLS) or a
/// host whose registries have several priorities (`preferred`: the
/// preferred one's value; Istio's failover by the endpoints'
/// [`LABEL_PRIORITY`], which needs outlier detection). `None` for a plain
/// service of one priority, and for services without ports (their
/// ServiceEntry is left out too).
pub fn destination_rule(registry: &RegistryKey, svc: &Service, preferred: Option<u32>) -> Option<IstioObject> {
    if (svc.tls.is_none() && preferred.is_none()) || svc.host.is_empty() || svc.ports.is_empty() {
        return None;
    }
    let port_level_settings = match &svc.tls {
        None => Vec::new(),
        Some(tls) => svc
            .ports
            .iter()
            .map(|p| PortTrafficPolicy {
                port: PortSelector { number: p.number.into() },
                load_balancer: None,
                connection_pool: None,
                tls: ClientTlsSettings {
                    mode: ClientTlsMode::Simple,
                    sni: tls.sni.clone(),
                    insecure_skip_verify: None,
                    credential_name: None,
                },
            })
            .collect(),
    };
    let mut policy = TrafficPolicy { port_level_settings, ..TrafficPolicy::default() };
    if let Some(p) = preferred {
        policy.failover_priority = vec![format!("{LABEL_PRIORITY}={p}")];
        policy.outlier_detection = Some(OutlierDetection::for_failover());
    }
    let spec = DestinationRuleSpec { host: svc.host.clone(), traffic_policy: Some(policy), subsets: Vec::new() };
    Some(IstioObject { metadata: meta(registry, svc), spec: Spec::DestinationRule(spec) })
}
