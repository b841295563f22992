//! Route destinations → cluster names, and the subset clusters they need.
//!
//! A destination resolves only to a cluster the Envoy will have: a registry
//! service's `outbound|{port}||{host}` (made by [`envoy::clusters`] for every
//! service) or a subset cluster made here. Anything else is an error the
//! caller turns into a 503 route and a warning.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::util::pack_any;
use meshbridge_registries::Service;
use prost::Message;

use super::spec::{Destination, DestinationRuleSpec, Named};
use crate::resources::Resource;
use crate::translate::envoy;

pub struct Clusters<'a> {
    services: &'a BTreeMap<String, Arc<Service>>,
    rules: &'a [Named<DestinationRuleSpec>],
    /// Subset clusters made so far, by name, with their load assignments.
    made: BTreeMap<String, (Resource, Resource)>,
}

impl<'a> Clusters<'a> {
    pub fn new(services: &'a BTreeMap<String, Arc<Service>>, rules: &'a [Named<DestinationRuleSpec>]) -> Self {
        Clusters { services, rules, made: BTreeMap::new() }
    }

    /// The cluster a destination goes to, or why there is none.
    pub fn resolve(&mut self, dest: &Destination) -> Result<String, String> {
        let host = dest.host.as_str();
        let Some(svc) = self.services.get(host) else {
            return Err(format!("host {host} has no cluster in the standalone gateway (not a registry service)"));
        };
        let port = match (&dest.port, svc.ports.as_slice()) {
            (Some(p), _) if p.number != 0 => u16::try_from(p.number)
                .ok()
                .filter(|n| svc.ports.iter().any(|sp| sp.number == *n))
                .ok_or_else(|| format!("host {host} has no port {}", p.number))?,
            (_, [only]) => only.number,
            (_, ports) => {
                return Err(format!("host {host}: no port given and the service has {} ports", ports.len()));
            }
        };
        if dest.subset.is_empty() {
            return Ok(envoy::cluster_name(port, "", host));
        }
        let name = envoy::cluster_name(port, &dest.subset, host);
        if !self.made.contains_key(&name) {
            let labels = self.subset_labels(host, &dest.subset)?;
            let made = subset_cluster(svc, port, &name, labels)?;
            self.made.insert(name.clone(), made);
        }
        Ok(name)
    }

    /// The labels of `subset` for `host`: the first DestinationRule (by
    /// `namespace/name`) for the host that defines it. The standalone Envoy
    /// is one proxy, so the choice cannot depend on who refers to it.
    fn subset_labels(&self, host: &str, subset: &str) -> Result<&'a BTreeMap<String, String>, String> {
        let mut any_rule = false;
        for rule in self.rules.iter().filter(|r| r.spec.host == host) {
            any_rule = true;
            if let Some(s) = rule.spec.subsets.iter().find(|s| s.name == subset) {
                return Ok(&s.labels);
            }
        }
        Err(if any_rule {
            format!("subset {subset:?} of host {host} is not defined by its DestinationRules")
        } else {
            format!("subset {subset:?}: no DestinationRule for host {host}")
        })
    }

    /// The subset clusters and their load assignments, sorted by name.
    pub fn into_resources(self) -> (Vec<Resource>, Vec<Resource>) {
        self.made.into_values().unzip()
    }
}

/// A subset cluster: the service's own cluster for `port` under another name
/// (so it keeps whatever protocol options and TLS that cluster has), with a
/// load assignment of only the endpoints carrying every subset label.
fn subset_cluster(
    svc: &Service,
    port: u16,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(Resource, Resource), String> {
    let base = envoy::cluster_name(port, "", &svc.host);
    let broken = || format!("cluster {base} could not be decoded to derive {name}");
    let mut cluster = envoy::clusters(svc)
        .into_iter()
        .find(|r| *r.name == *base)
        .and_then(|r| Cluster::decode(r.body.value.as_slice()).ok())
        .ok_or_else(broken)?;
    cluster.name = name.to_string();
    if let Some(eds) = cluster.eds_cluster_config.as_mut() {
        // Endpoints are looked up by the cluster's own name.
        eds.service_name.clear();
    }

    let matching = Service {
        endpoints: svc
            .endpoints
            .iter()
            .filter(|ep| labels.iter().all(|(k, v)| ep.labels.get(k) == Some(v)))
            .cloned()
            .collect(),
        ..svc.clone()
    };
    let mut cla = envoy::load_assignments(&matching)
        .into_iter()
        .find(|r| *r.name == *base)
        .and_then(|r| ClusterLoadAssignment::decode(r.body.value.as_slice()).ok())
        .ok_or_else(broken)?;
    cla.cluster_name = name.to_string();

    Ok((Resource::new(name.to_string(), pack_any(cluster)), Resource::new(name.to_string(), pack_any(cla))))
}
