//! Pure translation of Consul answers into neutral records: JSON decoding,
//! the tag filter, host naming, ports and labels. No I/O here, so every rule
//! is unit-tested below.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use serde::Deserialize;

use crate::labels;
use crate::model::{Endpoint, Protocol, Service, ServicePort};
use crate::names::host_part;
use crate::shared::intern;
use crate::spec::RegistrySpec;

/// Consul registers itself as a service; it is never a mesh service.
const CONSUL_SERVICE: &str = "consul";

/// One element of `GET /v1/health/service/:name`. Only the fields we read;
/// everything is optional so that a sparse or odd answer still decodes.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HealthEntry {
    #[serde(default)]
    node: Option<NodeJson>,
    #[serde(default)]
    service: Option<ServiceJson>,
    #[serde(default)]
    checks: Option<Vec<StatusJson>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct NodeJson {
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    address: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StatusJson {
    #[serde(default)]
    status: Option<String>,
}

/// One element of `GET /v1/health/state/:state`: only what tells a change.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CheckJson<'a> {
    #[serde(default, borrow)]
    node: Cow<'a, str>,
    #[serde(default, rename = "CheckID", borrow)]
    check_id: Cow<'a, str>,
    #[serde(default, borrow)]
    service_name: Cow<'a, str>,
    #[serde(default, borrow)]
    status: Cow<'a, str>,
    #[serde(default)]
    modify_index: u64,
}

/// What the failing checks (`/v1/health/state/critical` and `…/warning`)
/// say, folded to one fingerprint per service (its failing checks) and per
/// node (the node's own failing checks, which gate every instance on it).
/// Comparing two of these names the services whose health may have changed
/// (a check that starts or stops failing, or fails otherwise), without
/// keeping the checks themselves. Passing checks are not in it: an instance
/// added or removed with passing checks is a catalog change.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CheckPrints {
    pub services: HashMap<String, u64>,
    pub nodes: HashMap<String, u64>,
}

/// A service's instances as `GET /v1/health/service/:name` (without
/// `passing`) lists them: the endpoints whose checks all pass, and the nodes
/// of every instance, passing or not, so that a node check turning passing
/// is known to concern this service.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Instances {
    pub endpoints: Vec<Endpoint>,
    pub nodes: BTreeSet<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ServiceJson {
    #[serde(default)]
    address: Option<String>,
    #[serde(default)]
    port: Option<i64>,
    #[serde(default)]
    weights: Option<WeightsJson>,
    #[serde(default)]
    meta: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WeightsJson {
    #[serde(default)]
    passing: Option<i64>,
}

/// Decode `GET /v1/catalog/services`: service name -> tags.
pub(crate) fn decode_catalog(body: &[u8]) -> Result<BTreeMap<String, Vec<String>>, serde_json::Error> {
    let raw: BTreeMap<String, Option<Vec<String>>> = serde_json::from_slice(body)?;
    Ok(raw.into_iter().map(|(name, tags)| (name, tags.unwrap_or_default())).collect())
}

/// One element of `GET /v1/catalog/nodes`: its name and the index of its
/// last change (address, tagged addresses, meta, ID).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct NodeIndexJson<'a> {
    #[serde(default, borrow)]
    node: Cow<'a, str>,
    #[serde(default)]
    modify_index: u64,
}

/// Decode `GET /v1/catalog/nodes`: node name -> `ModifyIndex`.
pub(crate) fn decode_nodes(body: &[u8]) -> Result<BTreeMap<String, u64>, serde_json::Error> {
    let nodes: Vec<NodeIndexJson<'_>> = serde_json::from_slice(body)?;
    Ok(nodes.into_iter().map(|n| (n.node.into_owned(), n.modify_index)).collect())
}

/// The nodes that differ between two `GET /v1/catalog/nodes` answers:
/// added, removed, or changed since (a moved `ModifyIndex`).
pub(crate) fn changed_nodes(old: &BTreeMap<String, u64>, new: &BTreeMap<String, u64>) -> BTreeSet<String> {
    let moved = new.iter().filter(|(node, index)| old.get(*node) != Some(*index)).map(|(node, _)| node);
    let gone = old.keys().filter(|node| !new.contains_key(*node));
    moved.chain(gone).cloned().collect()
}

/// Decode `GET /v1/health/service/:name` into endpoints. Addresses may still
/// be host names here; the caller resolves them. Only instances whose checks
/// all pass are endpoints (what `?passing` would filter server-side; a
/// `warning` is not passing). Instances without a usable address or port are
/// dropped: the mesh cannot route to them.
pub(crate) fn decode_health(body: &[u8]) -> Result<Instances, serde_json::Error> {
    let entries: Vec<HealthEntry> = serde_json::from_slice(body)?;
    let mut out = Instances::default();
    for entry in entries {
        if let Some(node) = entry.node.as_ref().and_then(|n| n.node.clone()) {
            out.nodes.insert(node);
        }
        let passing = entry.checks.iter().flatten().all(|c| c.status.as_deref() == Some("passing"));
        if passing && let Some(endpoint) = endpoint_of(entry) {
            out.endpoints.push(endpoint);
        }
    }
    Ok(out)
}

/// Decode a `GET /v1/health/state/:state` answer into fingerprints.
#[cfg(test)]
pub(crate) fn decode_checks(body: &[u8]) -> Result<CheckPrints, serde_json::Error> {
    let mut prints = CheckPrints::default();
    decode_checks_into(&mut prints, body)?;
    Ok(prints)
}

/// Fold a `GET /v1/health/state/:state` answer into `prints`. Strings are
/// borrowed from the body where they can be. A fingerprint is the wrapping
/// sum of its checks' hashes, so it does not depend on Consul's order (or on
/// which of the answers folded in carried a check) and needs no sort.
pub(crate) fn decode_checks_into(prints: &mut CheckPrints, body: &[u8]) -> Result<(), serde_json::Error> {
    let checks: Vec<CheckJson<'_>> = serde_json::from_slice(body)?;
    for c in &checks {
        let mut h = DefaultHasher::new();
        (&*c.node, &*c.check_id, &*c.status, c.modify_index).hash(&mut h);
        let v = h.finish();
        let (map, key) = match &*c.service_name {
            "" => (&mut prints.nodes, &*c.node),
            service => (&mut prints.services, service),
        };
        match map.get_mut(key) {
            Some(sum) => *sum = sum.wrapping_add(v),
            None => {
                map.insert(key.to_string(), v);
            }
        }
    }
    Ok(())
}

/// The services whose health may have changed between two check answers:
/// those whose own checks changed (appeared, went, or moved), and those with
/// an instance on a node whose node checks changed. `nodes` gives each
/// watched service's nodes.
pub(crate) fn dirty_services<'a>(
    old: &CheckPrints,
    new: &CheckPrints,
    nodes: impl Iterator<Item = (&'a str, &'a BTreeSet<String>)>,
) -> BTreeSet<String> {
    fn changed<'m>(a: &'m HashMap<String, u64>, b: &'m HashMap<String, u64>) -> impl Iterator<Item = &'m String> {
        let moved = a.iter().filter(move |(k, v)| b.get(*k) != Some(*v)).map(|(k, _)| k);
        moved.chain(b.keys().filter(move |k| !a.contains_key(*k)))
    }
    let mut dirty: BTreeSet<String> = changed(&old.services, &new.services).cloned().collect();
    let moved_nodes: HashSet<&String> = changed(&old.nodes, &new.nodes).collect();
    if !moved_nodes.is_empty() {
        let on_moved = nodes.filter(|(_, ns)| ns.iter().any(|n| moved_nodes.contains(n)));
        dirty.extend(on_moved.map(|(name, _)| name.to_string()));
    }
    dirty
}

fn endpoint_of(entry: HealthEntry) -> Option<Endpoint> {
    let service = entry.service?;
    // Consul's own rule: an empty Service.Address means "the node's address".
    // A blank one (" ") is no address either; surrounding blanks are dropped.
    let usable = |a: String| {
        let trimmed = a.trim();
        if trimmed.is_empty() {
            None
        } else if trimmed.len() == a.len() {
            Some(a)
        } else {
            Some(trimmed.to_string())
        }
    };
    let address = service.address.and_then(usable).or_else(|| entry.node.and_then(|n| n.address).and_then(usable))?;
    let port = u16::try_from(service.port?).ok().filter(|p| *p != 0)?;
    let weight = match service.weights.and_then(|w| w.passing) {
        Some(w) if w > 0 => u32::try_from(w).unwrap_or(u32::MAX),
        _ => 1,
    };
    let (labels, _) = labels::keep_valid(service.meta.unwrap_or_default());
    Some(Endpoint { address, port, weight, labels: intern(labels) })
}

/// The services to watch: every catalog entry but Consul itself, and when a
/// tag filter is set, only those with a tag equal to it ignoring case.
pub(crate) fn select_services(catalog: &BTreeMap<String, Vec<String>>, tag: Option<&str>) -> BTreeSet<String> {
    let tag = tag.map(str::to_lowercase);
    catalog
        .iter()
        .filter(|(name, _)| name.as_str() != CONSUL_SERVICE)
        .filter(|(_, tags)| match &tag {
            None => true,
            Some(want) => tags.iter().any(|t| t.to_lowercase() == *want),
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Mesh host of a Consul service: `{service}.{datacenter}.consul`, lowercase
/// and with `_` replaced, as Higress names it.
pub(crate) fn host_name(service: &str, datacenter: &str) -> String {
    host_part(&format!("{service}.{datacenter}.consul")).to_lowercase()
}

/// Everything needed to turn a service name and its endpoints into a
/// [`Service`]. Fixed for the life of a watcher.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    pub datacenter: String,
    pub protocol: Protocol,
    spec: RegistrySpec,
}

impl Naming {
    pub fn new(spec: &RegistrySpec, datacenter: &str) -> Naming {
        let protocol = spec.protocol.as_deref().and_then(Protocol::parse).unwrap_or(Protocol::Http);
        Naming { datacenter: datacenter.to_string(), protocol, spec: spec.clone() }
    }

    pub fn host(&self, service: &str) -> String {
        host_name(service, &self.datacenter)
    }

    /// The service record for `name`. The port is the configured vport, else
    /// the lowest instance port, else (no instances) the port we last
    /// reported so the service keeps its shape while empty. With none of
    /// these there is no port at all: 0 is never a valid service port.
    pub fn service(&self, name: &str, endpoints: Vec<Endpoint>, last_port: Option<u16>) -> Service {
        let number = self
            .spec
            .vport_for(&self.host(name))
            .or_else(|| endpoints.iter().map(|e| e.port).min())
            .or(last_port)
            .filter(|p| *p != 0);
        let ports = number
            .map(|number| {
                let name = format!("{}-{number}", self.protocol.as_str().to_lowercase());
                vec![ServicePort { number, protocol: self.protocol, name }]
            })
            .unwrap_or_default();
        Service::new(self.host(name), ports, endpoints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RegistryKind;

    #[test]
    fn nodes_decode_and_diff_by_modify_index() {
        let body = br#"[{"ID": "", "Node": "n1", "Address": "10.0.0.1", "TaggedAddresses": null, "Meta": null,
                          "CreateIndex": 13, "ModifyIndex": 13},
                         {"Node": "n2", "Address": "10.0.0.9", "ModifyIndex": 16}]"#;
        let old = decode_nodes(body).unwrap();
        assert_eq!(old, BTreeMap::from([("n1".to_string(), 13), ("n2".to_string(), 16)]));
        assert!(changed_nodes(&old, &old).is_empty());
        let new = BTreeMap::from([("n2".to_string(), 17), ("n3".to_string(), 18)]);
        let names: Vec<String> = changed_nodes(&old, &new).into_iter().collect();
        assert_eq!(names, ["n1", "n2", "n3"], "gone, moved, new");
        assert!(decode_nodes(b"{").is_err());
    }

    const HEALTH: &str = r#"[
      {"Node": {"Node": "n1", "Address": "10.0.0.1"},
       "Service": {"ID": "web-1", "Service": "web", "Address": "", "Port": 8081,
                   "Weights": {"Passing": 5, "Warning": 1},
                   "Meta": {"version": "v1", "_private": "x", "note": "has space"}},
       "Checks": [{"Status": "passing"}]},
      {"Node": {"Node": "n2", "Address": "10.0.0.2"},
       "Service": {"ID": "web-2", "Service": "web", "Address": "10.1.0.2", "Port": 8080,
                   "Weights": {"Passing": 0, "Warning": 1}, "Meta": null}},
      {"Node": {"Address": "10.0.0.3"}, "Service": {"Port": 0}},
      {"Node": {"Address": "10.0.0.4"}, "Service": {"Port": 70000}},
      {"Node": {"Address": ""}, "Service": {"Address": "", "Port": 80}},
      {"Node": {"Node": "n5", "Address": "10.0.0.5"}, "Service": {"Address": " \t", "Port": 81}},
      {"Node": {"Node": "n6", "Address": "  "}, "Service": {"Address": " ", "Port": 82}},
      {"Node": {"Node": "n7", "Address": "10.0.0.7"}, "Service": {"Address": " 10.1.0.7 ", "Port": 83}},
      {"Node": null, "Service": null}
    ]"#;

    fn spec() -> RegistrySpec {
        RegistrySpec::new(RegistryKind::Consul, "c", "127.0.0.1", 8500)
    }

    #[test]
    fn health_answer_decodes_to_endpoints() {
        let decoded = decode_health(HEALTH.as_bytes()).unwrap();
        let nodes = ["n1", "n2", "n5", "n6", "n7"].map(String::from);
        assert_eq!(decoded.nodes, BTreeSet::from(nodes));
        let eps = decoded.endpoints;
        assert_eq!(eps.len(), 4, "{eps:?}");
        // A blank Service.Address is no address: the node's is used; a
        // blank node address too and the instance is dropped (n6).
        assert_eq!((eps[2].address.as_str(), eps[2].port), ("10.0.0.5", 81));
        assert_eq!((eps[3].address.as_str(), eps[3].port), ("10.1.0.7", 83), "blanks around it are dropped");
        // Empty Service.Address falls back to the node's.
        assert_eq!(eps[0].address, "10.0.0.1");
        assert_eq!(eps[0].port, 8081);
        assert_eq!(eps[0].weight, 5);
        // Keys or values Kubernetes would reject are dropped, not the endpoint.
        assert_eq!(*eps[0].labels, BTreeMap::from([("version".to_string(), "v1".to_string())]));
        assert_eq!(eps[1].address, "10.1.0.2");
        assert_eq!(eps[1].weight, 1, "a zero passing weight means 1");
        assert!(eps[1].labels.is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for body in ["", "{", "null", "{}", "[1,2]", r#"[{"Service": {"Port": "x"}}]"#, "\u{0}"] {
            assert!(decode_health(body.as_bytes()).is_err(), "{body:?}");
        }
        for body in ["", "[]", r#"{"web": "x"}"#, r#"{"web": [1]}"#] {
            assert!(decode_catalog(body.as_bytes()).is_err(), "{body:?}");
        }
        assert_eq!(decode_health(b"[]").unwrap(), Instances::default());
        for body in ["", "{", "[{\"ServiceName\": 1}]", "{}"] {
            assert!(decode_checks(body.as_bytes()).is_err(), "{body:?}");
        }
    }

    #[test]
    fn only_instances_whose_checks_all_pass_are_endpoints() {
        let body = r#"[
          {"Node": {"Node": "n1", "Address": "10.0.0.1"}, "Service": {"Port": 80},
           "Checks": [{"Status": "passing"}, {"Status": "warning"}]},
          {"Node": {"Node": "n2", "Address": "10.0.0.2"}, "Service": {"Port": 80},
           "Checks": [{"Status": "passing"}, {"Status": "critical"}]},
          {"Node": {"Node": "n3", "Address": "10.0.0.3"}, "Service": {"Port": 80}, "Checks": []},
          {"Node": {"Node": "n4", "Address": "10.0.0.4"}, "Service": {"Port": 80},
           "Checks": [{"Status": "passing"}]}
        ]"#;
        let decoded = decode_health(body.as_bytes()).unwrap();
        let addrs: Vec<&str> = decoded.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addrs, vec!["10.0.0.3", "10.0.0.4"]);
        assert_eq!(decoded.nodes.len(), 4, "failing instances still name their node");
    }

    #[test]
    fn check_prints_change_only_for_what_changed() {
        let check = |node: &str, id: &str, service: &str, status: &str, index: u64| {
            serde_json::json!({"Node": node, "CheckID": id, "ServiceName": service, "Status": status,
                               "ModifyIndex": index, "Output": "ignored"})
        };
        let a = serde_json::json!([
            check("n1", "serfHealth", "", "passing", 5),
            check("n1", "web-1", "web", "passing", 7),
            check("n2", "web-2", "web", "passing", 8),
            check("n1", "api-1", "api", "passing", 9),
        ]);
        let before = decode_checks(a.to_string().as_bytes()).unwrap();
        assert_eq!(before.services.len(), 2);
        assert_eq!(before.nodes.len(), 1);
        // Same checks in another order: same prints.
        let mut shuffled = a.as_array().unwrap().clone();
        shuffled.reverse();
        assert_eq!(decode_checks(serde_json::Value::from(shuffled).to_string().as_bytes()).unwrap(), before);

        let b = serde_json::json!([
            check("n1", "serfHealth", "", "passing", 5),
            check("n1", "web-1", "web", "critical", 12),
            check("n2", "web-2", "web", "passing", 8),
            check("n1", "api-1", "api", "passing", 9),
        ]);
        let after = decode_checks(b.to_string().as_bytes()).unwrap();
        assert_ne!(after.services["web"], before.services["web"]);
        assert_eq!(after.services["api"], before.services["api"]);
        assert_eq!(after.nodes, before.nodes);

        let nodes = BTreeMap::from([
            ("web".to_string(), BTreeSet::from(["n1".to_string(), "n2".to_string()])),
            ("api".to_string(), BTreeSet::from(["n1".to_string()])),
            ("db".to_string(), BTreeSet::from(["n3".to_string()])),
        ]);
        let of = || nodes.iter().map(|(k, v)| (k.as_str(), v));
        let names = |set: BTreeSet<String>| set.into_iter().collect::<Vec<_>>();
        assert_eq!(names(dirty_services(&before, &after, of())), vec!["web"]);
        assert_eq!(names(dirty_services(&before, &before, of())), Vec::<String>::new());

        // n1's node check fails: every service with an instance on n1.
        let c = serde_json::json!([
            check("n1", "serfHealth", "", "critical", 13),
            check("n1", "web-1", "web", "passing", 7),
            check("n2", "web-2", "web", "passing", 8),
            check("n1", "api-1", "api", "passing", 9),
            check("n3", "db-1", "db", "passing", 10),
        ]);
        let node_down = decode_checks(c.to_string().as_bytes()).unwrap();
        assert_eq!(names(dirty_services(&before, &node_down, of())), vec!["api", "db", "web"], "db's check is new");
        let d = serde_json::json!([
            check("n1", "serfHealth", "", "passing", 14),
            check("n1", "web-1", "web", "passing", 7),
            check("n2", "web-2", "web", "passing", 8),
            check("n1", "api-1", "api", "passing", 9),
            check("n3", "db-1", "db", "passing", 10),
        ]);
        let node_up = decode_checks(d.to_string().as_bytes()).unwrap();
        assert_eq!(names(dirty_services(&node_down, &node_up, of())), vec!["api", "web"]);
        // A service whose checks all went (its instances deregistered).
        assert_eq!(names(dirty_services(&node_up, &CheckPrints::default(), of())), vec!["api", "db", "web"]);
    }

    #[test]
    fn catalog_decodes_null_tags() {
        let cat = decode_catalog(br#"{"consul": [], "web": null, "api": ["a", "b"]}"#).unwrap();
        assert_eq!(cat["web"], Vec::<String>::new());
        assert_eq!(cat["api"], vec!["a", "b"]);
    }

    #[test]
    fn tag_filter_is_case_insensitive_and_skips_consul() {
        let cat = BTreeMap::from([
            ("consul".to_string(), vec!["Mesh".to_string()]),
            ("web".to_string(), vec!["MESH".to_string(), "x".to_string()]),
            ("api".to_string(), vec!["meshy".to_string()]),
            ("db".to_string(), vec![]),
        ]);
        let all: Vec<_> = select_services(&cat, None).into_iter().collect();
        assert_eq!(all, vec!["api", "db", "web"]);
        let tagged: Vec<_> = select_services(&cat, Some("mesh")).into_iter().collect();
        assert_eq!(tagged, vec!["web"]);
    }

    #[test]
    fn host_names_follow_higress() {
        assert_eq!(host_name("web", "dc1"), "web.dc1.consul");
        assert_eq!(host_name("Pay_API", "DC_East"), "pay-api.dc-east.consul");
    }

    fn ep(port: u16) -> Endpoint {
        Endpoint { address: "10.0.0.1".into(), port, weight: 1, labels: Default::default() }
    }

    #[test]
    fn service_port_rules() {
        let mut spec = spec();
        spec.protocol = Some("grpc".into());
        let naming = Naming::new(&spec, "dc1");
        let svc = naming.service("web", vec![ep(9090), ep(8080)], Some(7000));
        assert_eq!(svc.host, "web.dc1.consul");
        assert_eq!(svc.ports, vec![ServicePort { number: 8080, protocol: Protocol::Grpc, name: "grpc-8080".into() }]);
        // No instances: keep the last known port, else no port at all.
        assert_eq!(naming.service("web", vec![], Some(7000)).ports[0].number, 7000);
        assert_eq!(naming.service("web", vec![], None).ports, vec![]);

        spec.protocol = Some("bogus".into());
        spec.vport_default = Some(80);
        spec.vport_services.insert("api.dc1.consul".into(), 9000);
        let naming = Naming::new(&spec, "dc1");
        assert_eq!(naming.service("web", vec![ep(8080)], None).ports[0].name, "http-80");
        assert_eq!(naming.service("api", vec![], None).ports[0].name, "http-9000");
    }
}
