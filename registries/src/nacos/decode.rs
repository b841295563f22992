//! Pure translation of Nacos answers into neutral records: host naming,
//! service and instance filters, instance → endpoint rules, ports, labels and
//! the JSON of the 1.x open API. No I/O here, so every rule is unit-tested
//! below.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Deserialize;

use crate::labels;
use crate::model::{Endpoint, Protocol, Service, ServicePort};
use crate::names::host_part;
use crate::shared::intern;
use crate::spec::RegistrySpec;

pub(crate) const DEFAULT_GROUP: &str = "DEFAULT_GROUP";
/// The default namespace. Nacos 1.x naming, Nacos 2.x/3.x and rnacos all
/// treat an empty namespace id as this one.
pub(crate) const PUBLIC_NAMESPACE: &str = "public";
/// Higress marks what it registers into Nacos itself with this metadata;
/// reading it back would loop.
const LOOP_GUARD: (&str, &str) = ("register-resource", "mcp-bridge");
/// Dubbo registers consumers as services; they have no endpoints to route to.
const CONSUMERS_PREFIX: &str = "consumers:";
/// Instance metadata naming the port's protocol, as Higress reads it.
const PROTOCOL_KEY: &str = "protocol";

/// A service within the watched namespace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ServiceKey {
    pub group: String,
    pub name: String,
}

impl ServiceKey {
    pub fn new(group: impl Into<String>, name: impl Into<String>) -> ServiceKey {
        ServiceKey { group: group.into(), name: name.into() }
    }
}

impl fmt::Display for ServiceKey {
    /// Nacos's own grouped name, `group@@service`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@@{}", self.group, self.name)
    }
}

/// Whether a listed service is watched: Dubbo consumers and nameless
/// entries are not (Higress's `shouldSubscribe`).
pub(crate) fn is_watched(name: &str) -> bool {
    !name.is_empty() && !name.starts_with(CONSUMERS_PREFIX)
}

/// One instance as Nacos reports it, whichever API it came from.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Instance {
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    pub port: i64,
    #[serde(default = "one")]
    pub weight: f64,
    #[serde(default = "yes")]
    pub healthy: bool,
    #[serde(default = "yes", deserialize_with = "bool_or_null")]
    pub enabled: bool,
    #[serde(default, deserialize_with = "string_map")]
    pub metadata: BTreeMap<String, String>,
}

fn one() -> f64 {
    1.0
}

fn yes() -> bool {
    true
}

/// rnacos sends `"enabled": null` for instances registered without it.
fn bool_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(true))
}

/// Metadata is a string map in Nacos, but a non-string value must not make
/// the whole answer unreadable: it is kept as its JSON text.
fn string_map<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let raw = Option::<BTreeMap<String, serde_json::Value>>::deserialize(d)?.unwrap_or_default();
    Ok(raw
        .into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect())
}

/// `GET /nacos/v1/ns/service/list`.
#[derive(Debug, Deserialize)]
pub(crate) struct ServiceList {
    #[serde(default)]
    pub count: i64,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub doms: Vec<String>,
}

/// `GET /nacos/v1/ns/instance/list`.
#[derive(Debug, Deserialize)]
pub(crate) struct InstanceList {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub hosts: Vec<Instance>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

pub(crate) fn decode_service_list(body: &[u8]) -> Result<ServiceList, serde_json::Error> {
    object(body)
}

pub(crate) fn decode_instance_list(body: &[u8]) -> Result<Vec<Instance>, serde_json::Error> {
    object::<InstanceList>(body).map(|l| l.hosts)
}

/// serde would also read a struct from a JSON array (`[]` as "no hosts"),
/// which would turn a broken answer into an authoritative empty one.
fn object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, serde_json::Error> {
    let value: serde_json::Value = serde_json::from_slice(body)?;
    if !value.is_object() {
        return Err(serde::de::Error::custom("expected a JSON object"));
    }
    serde_json::from_value(value)
}

/// What became of a service's instances on the way to endpoints.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Endpoints {
    /// Addresses may still be host names; the caller resolves them.
    pub endpoints: Vec<Endpoint>,
    /// The protocol most of the endpoints' `protocol` metadata names.
    pub protocol: Option<Protocol>,
    /// Instances left out: unhealthy, disabled, loop guard, no usable port.
    pub skipped: usize,
    /// Metadata entries that are not valid Kubernetes labels, dropped.
    pub dropped_labels: usize,
}

/// Turn Nacos instances into endpoints. Only instances both healthy and
/// enabled serve traffic (Higress routes to all of them). A weight is
/// rounded, and anything not positive becomes 1 (Envoy rejects 0).
pub(crate) fn endpoints(instances: Vec<Instance>) -> Endpoints {
    let mut out = Endpoints::default();
    let mut protocols: HashMap<Protocol, usize> = HashMap::new();
    for instance in instances {
        let guarded = instance.metadata.get(LOOP_GUARD.0).is_some_and(|v| v == LOOP_GUARD.1);
        let port = u16::try_from(instance.port).ok().filter(|p| *p != 0);
        let address = instance.ip.trim();
        let (Some(port), true, false, false) =
            (port, instance.healthy && instance.enabled, guarded, address.is_empty())
        else {
            out.skipped += 1;
            continue;
        };
        if let Some(p) = instance.metadata.get(PROTOCOL_KEY).and_then(|p| Protocol::parse(p.trim())) {
            *protocols.entry(p).or_default() += 1;
        }
        let (labels, dropped) = labels::keep_valid(instance.metadata);
        out.dropped_labels += dropped;
        out.endpoints.push(Endpoint {
            address: address.to_string(),
            port,
            weight: weight(instance.weight),
            labels: intern(labels),
        });
    }
    // Most votes wins; a tie goes to the lowest protocol, so the result does
    // not depend on the order Nacos listed the instances in.
    out.protocol = protocols.into_iter().max_by(|(pa, na), (pb, nb)| na.cmp(nb).then(pb.cmp(pa))).map(|(p, _)| p);
    out
}

fn weight(w: f64) -> u32 {
    let w = w.round();
    if w.is_nan() || w < 1.0 {
        1
    } else if w >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        w as u32
    }
}

/// Everything needed to turn a service and its endpoints into a
/// [`Service`]. Fixed for the life of a watcher.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    /// The namespace part of host names.
    namespace: String,
    /// The registry's `protocol`, used when instances name none.
    protocol: Option<Protocol>,
    spec: RegistrySpec,
}

impl Naming {
    pub fn new(spec: &RegistrySpec) -> Naming {
        // Higress names hosts after `nacosNamespace` when set, else the id.
        let namespace = spec
            .nacos_namespace
            .clone()
            .or_else(|| spec.nacos_namespace_id.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| PUBLIC_NAMESPACE.to_string());
        let protocol = spec.protocol.as_deref().and_then(Protocol::parse);
        Naming { namespace, protocol, spec: spec.clone() }
    }

    /// `{service}.{group}.{namespace}.nacos`, with `_` replaced by `-` in all
    /// but the service name (Higress's `getSubscribeCallback`): Dubbo names
    /// such as `providers:com.foo.Api:1.0.0:` stay as they are.
    pub fn host(&self, key: &ServiceKey) -> String {
        let suffix = host_part(&format!("{}.{}.nacos", key.group, self.namespace));
        format!("{}.{suffix}", key.name)
    }

    /// The service record. The port is the configured vport, else the lowest
    /// endpoint port, else (no endpoints) the port last reported so that the
    /// service keeps its shape while empty; without any of these, no port.
    pub fn service(&self, key: &ServiceKey, decoded: Endpoints, last_port: Option<u16>) -> Service {
        let number = self
            .spec
            .vport_for(&self.host(key))
            .or_else(|| decoded.endpoints.iter().map(|e| e.port).min())
            .or(last_port)
            .filter(|p| *p != 0);
        let protocol = decoded.protocol.or(self.protocol).unwrap_or(Protocol::Http);
        let ports = number
            .map(|number| {
                let name = format!("{}-{number}", protocol.as_str().to_lowercase());
                vec![ServicePort { number, protocol, name }]
            })
            .unwrap_or_default();
        Service::new(self.host(key), ports, decoded.endpoints)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RegistryKind;

    fn spec() -> RegistrySpec {
        RegistrySpec::new(RegistryKind::Nacos2, "n", "127.0.0.1", 8848)
    }

    fn instance(ip: &str, port: i64) -> Instance {
        Instance { ip: ip.into(), port, weight: 1.0, healthy: true, enabled: true, metadata: BTreeMap::new() }
    }

    #[test]
    fn host_names_follow_higress() {
        let naming = Naming::new(&spec());
        assert_eq!(naming.host(&ServiceKey::new(DEFAULT_GROUP, "web")), "web.DEFAULT-GROUP.public.nacos");
        // `_` is replaced in the group and namespace only; case is kept.
        let mut s = spec();
        s.nacos_namespace_id = Some("dev_ns".into());
        let naming = Naming::new(&s);
        assert_eq!(naming.host(&ServiceKey::new("my_group", "Pay_API")), "Pay_API.my-group.dev-ns.nacos");
        let dubbo = ServiceKey::new(DEFAULT_GROUP, "providers:com.foo.Api:1.0.0:");
        assert_eq!(naming.host(&dubbo), "providers:com.foo.Api:1.0.0:.DEFAULT-GROUP.dev-ns.nacos");
        // nacosNamespace (a display name) wins over the id, as in Higress.
        s.nacos_namespace = Some("Team_A".into());
        assert_eq!(Naming::new(&s).host(&ServiceKey::new("g", "web")), "web.g.Team-A.nacos");
    }

    #[test]
    fn consumers_and_empty_names_are_not_watched() {
        assert!(is_watched("web"));
        assert!(is_watched("providers:com.foo.Api:1.0.0:"));
        assert!(!is_watched("consumers:com.foo.Api:1.0.0:"));
        assert!(!is_watched(""));
    }

    #[test]
    fn only_healthy_enabled_instances_with_a_port_are_endpoints() {
        let mut unhealthy = instance("10.0.0.2", 80);
        unhealthy.healthy = false;
        let mut disabled = instance("10.0.0.3", 80);
        disabled.enabled = false;
        let mut guarded = instance("10.0.0.4", 80);
        guarded.metadata.insert("register-resource".into(), "mcp-bridge".into());
        let got = endpoints(vec![
            instance("10.0.0.1", 80),
            unhealthy,
            disabled,
            guarded,
            instance("10.0.0.5", 0),
            instance("10.0.0.6", 70000),
            instance(" ", 80),
        ]);
        let addrs: Vec<&str> = got.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addrs, vec!["10.0.0.1"]);
        assert_eq!(got.skipped, 6);
    }

    #[test]
    fn weights_round_and_never_drop_below_one() {
        let w = |x: f64| {
            let mut i = instance("10.0.0.1", 80);
            i.weight = x;
            endpoints(vec![i]).endpoints[0].weight
        };
        assert_eq!(w(2.4), 2);
        assert_eq!(w(2.5), 3);
        assert_eq!(w(0.0), 1);
        assert_eq!(w(0.4), 1);
        assert_eq!(w(-3.0), 1);
        assert_eq!(w(f64::NAN), 1);
        assert_eq!(w(1e12), u32::MAX);
    }

    #[test]
    fn metadata_becomes_labels_and_invalid_ones_are_counted() {
        let mut i = instance("10.0.0.1", 80);
        i.metadata = BTreeMap::from([
            ("version".into(), "v1".into()),
            ("methods".into(), "get,put".into()),
            ("_private".into(), "x".into()),
            ("app.kubernetes.io/name".into(), "web".into()),
        ]);
        let got = endpoints(vec![i]);
        let want = BTreeMap::from([("app.kubernetes.io/name".into(), "web".into()), ("version".into(), "v1".into())]);
        assert_eq!(*got.endpoints[0].labels, want);
        assert_eq!(got.dropped_labels, 2);
    }

    #[test]
    fn protocol_comes_from_instance_metadata() {
        let with = |ip: &str, p: &str| {
            let mut i = instance(ip, 20880);
            i.metadata.insert("protocol".into(), p.into());
            i
        };
        let naming = Naming::new(&spec());
        let key = ServiceKey::new(DEFAULT_GROUP, "svc");
        let port = |instances: Vec<Instance>| naming.service(&key, endpoints(instances), None).ports[0].clone();
        assert_eq!(port(vec![with("10.0.0.1", "dubbo")]).name, "tcp-20880");
        assert_eq!(port(vec![with("10.0.0.1", "tri")]).protocol, Protocol::Grpc);
        assert_eq!(port(vec![with("10.0.0.1", "triple")]).protocol, Protocol::Grpc);
        assert_eq!(port(vec![with("10.0.0.1", "HTTPS")]).name, "https-20880");
        // Majority wins; a tie goes to the lowest protocol whatever the order.
        let two_grpc = vec![with("10.0.0.1", "grpc"), with("10.0.0.2", "http"), with("10.0.0.3", "grpc")];
        assert_eq!(port(two_grpc).protocol, Protocol::Grpc);
        assert_eq!(port(vec![with("10.0.0.1", "tcp"), with("10.0.0.2", "http")]).protocol, Protocol::Http);
        assert_eq!(port(vec![with("10.0.0.2", "http"), with("10.0.0.1", "tcp")]).protocol, Protocol::Http);
        // Unknown or absent: the registry's protocol, else HTTP.
        assert_eq!(port(vec![with("10.0.0.1", "bogus")]).name, "http-20880");
        let mut s = spec();
        s.protocol = Some("grpc".into());
        let naming = Naming::new(&s);
        assert_eq!(naming.service(&key, endpoints(vec![instance("10.0.0.1", 9)]), None).ports[0].name, "grpc-9");
    }

    #[test]
    fn service_port_rules() {
        let mut s = spec();
        // vport names are hosts (lowercased by config), as in Higress.
        s.vport_services.insert("api.default-group.public.nacos".into(), 9000);
        s.vport_services.insert("web".into(), 9001);
        let naming = Naming::new(&s);
        let web = ServiceKey::new(DEFAULT_GROUP, "web");
        let svc = naming.service(&web, endpoints(vec![instance("10.0.0.1", 8081), instance("10.0.0.2", 8080)]), None);
        assert_eq!(svc.host, "web.DEFAULT-GROUP.public.nacos");
        let lowest = ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() };
        assert_eq!(svc.ports, vec![lowest], "a bare service name is not a host");
        assert_eq!(svc.endpoints.len(), 2);
        assert_eq!(naming.service(&web, Endpoints::default(), Some(7000)).ports[0].number, 7000);
        assert_eq!(naming.service(&web, Endpoints::default(), None).ports, vec![]);
        let api = ServiceKey::new(DEFAULT_GROUP, "api");
        assert_eq!(naming.service(&api, Endpoints::default(), None).ports[0].name, "http-9000");
    }

    #[test]
    fn open_api_answers_decode() {
        let list = decode_service_list(br#"{"count": 3, "doms": ["a", "b"]}"#).unwrap();
        assert_eq!((list.count, list.doms), (3, vec!["a".to_string(), "b".to_string()]));
        assert_eq!(decode_service_list(br#"{"count": 0, "doms": null}"#).unwrap().doms, Vec::<String>::new());
        let hosts = decode_instance_list(
            br#"{"name": "DEFAULT_GROUP@@web", "hosts": [
                 {"ip": "10.0.0.1", "port": 8080, "weight": 2.0, "healthy": true, "enabled": null,
                  "metadata": {"version": "v1", "n": 3}},
                 {"ip": "10.0.0.2", "port": 8081, "healthy": false}]}"#,
        )
        .unwrap();
        assert_eq!(hosts.len(), 2);
        assert!(hosts[0].enabled, "null enabled means enabled");
        assert_eq!(hosts[0].metadata["n"], "3");
        assert_eq!((hosts[1].weight, hosts[1].enabled, hosts[1].healthy), (1.0, true, false));
        for bad in ["", "[]", r#"{"hosts": [{"port": "x"}]}"#, r#"{"hosts": 1}"#] {
            assert!(decode_instance_list(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(decode_service_list(br#"{"doms": [1]}"#).is_err());
    }
}
