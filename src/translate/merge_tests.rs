//! One host in several registries: what the merged host serves, as Envoy
//! and istiod receive it.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshbridge_registries::{Endpoint, Migration, Protocol, RegistryKind, Service, ServicePort, Tls, Update};
use prost::Message;
use serde_json::Value;

use crate::cache::Cache;
use crate::model::RegistryKey;
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};
use crate::translate::{ConfigSet, Inputs, Reason, build};

const HOST: &str = "orders.DEFAULT-GROUP.public.nacos";

fn key(kind: RegistryKind, name: &str) -> RegistryKey {
    RegistryKey::new(kind, name)
}

fn old() -> RegistryKey {
    key(RegistryKind::Nacos, "nacos1")
}

fn new() -> RegistryKey {
    key(RegistryKind::Nacos2, "nacos2")
}

fn service(port: u16, protocol: Protocol, addrs: &[&str]) -> Service {
    let eps = addrs
        .iter()
        .map(|a| Endpoint { address: a.to_string(), port, weight: 1, labels: Default::default() })
        .collect();
    let p = ServicePort { number: port, protocol, name: format!("{}-{port}", protocol.as_str().to_lowercase()) };
    Service::new(HOST, vec![p], eps)
}

/// Translate with `old` reporting `a` and `new` reporting `b`.
fn translate(a: Service, b: Service, migration: &[(RegistryKey, Migration)]) -> ConfigSet {
    let cache = Cache::new();
    cache.attach(&old()).update(Update::Upsert(a));
    cache.attach(&new()).update(Update::Upsert(b));
    let inputs = Inputs { registry_migration: migration.iter().cloned().collect(), ..Inputs::default() };
    build(&cache.view(), &inputs)
}

fn cla(set: &ConfigSet, port: u16) -> ClusterLoadAssignment {
    let r = set.envoy[ENDPOINT_TYPE].get(&format!("outbound|{port}||{HOST}")).expect("load assignment");
    ClusterLoadAssignment::decode(r.body.value()).unwrap()
}

fn cluster(set: &ConfigSet, port: u16) -> Cluster {
    let r = set.envoy[CLUSTER_TYPE].get(&format!("outbound|{port}||{HOST}")).expect("cluster");
    Cluster::decode(r.body.value()).unwrap()
}

fn object(set: &ConfigSet, kind: &str) -> Option<Value> {
    set.istio.values().find(|o| o.kind() == kind).map(|o| o.to_json())
}

/// Address → (priority, weight) as Envoy gets them.
fn served(set: &ConfigSet, port: u16) -> BTreeMap<String, (u32, u32)> {
    let mut out = BTreeMap::new();
    for group in cla(set, port).endpoints {
        for lb in group.lb_endpoints {
            let Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) =
                lb.host_identifier
            else {
                panic!("no endpoint")
            };
            let Some(envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(sa)) =
                ep.address.unwrap().address
            else {
                panic!("no address")
            };
            out.insert(sa.address, (group.priority, lb.load_balancing_weight.unwrap().value));
        }
    }
    out
}

fn m(weight: Option<u32>, priority: u32) -> Migration {
    Migration { weight, priority }
}

#[test]
fn both_registries_endpoints_are_served_in_one_service_entry_labelled_by_registry() {
    let set = translate(
        service(8080, Protocol::Http, &["10.0.0.1"]),
        service(8080, Protocol::Http, &["10.0.1.1", "10.0.1.2"]),
        &[],
    );
    let served = served(&set, 8080);
    assert_eq!(served.len(), 3, "{served:?}");
    assert!(served.values().all(|(p, w)| (*p, *w) == (0, 1)), "one level, the registries' own weights: {served:?}");
    let se = object(&set, "ServiceEntry").expect("one ServiceEntry");
    assert_eq!(set.istio.values().filter(|o| o.kind() == "ServiceEntry").count(), 1);
    let registries: Vec<(&str, &str)> = se["spec"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["address"].as_str().unwrap(), e["labels"]["meshbridge.io/registry"].as_str().unwrap()))
        .collect();
    assert_eq!(registries, [("10.0.0.1", "nacos1"), ("10.0.1.1", "nacos2"), ("10.0.1.2", "nacos2")]);
    assert_eq!(
        set.warnings().count(),
        0,
        "agreeing registries are no conflict: {:?}",
        set.warnings().collect::<Vec<_>>()
    );
    assert!(object(&set, "DestinationRule").is_none(), "one priority, no TLS: no rule");
}

#[test]
fn disagreements_are_reported_naming_both_registries_and_the_field() {
    let a = service(8080, Protocol::Http, &["10.0.0.1"]);
    let mut b = service(8080, Protocol::Grpc, &["10.0.1.1"]);
    b.ports.push(ServicePort { number: 20880, protocol: Protocol::Tcp, name: "tcp-20880".into() });
    let b = b.with_tls(Tls { sni: Some("orders.internal".into()) });
    let set = translate(a, b, &[]);
    let text: Vec<String> = set.warnings().map(ToString::to_string).collect();
    assert!(set.warnings().all(|w| w.reason == Reason::HostConflict), "{text:?}");
    let has = |needle: &str| {
        text.iter().any(|t| t.contains(needle) && t.contains("nacos/nacos1") && t.contains("nacos2/nacos2"))
    };
    assert!(has("the protocol of port 8080 (HTTP vs GRPC)"), "{text:?}");
    assert!(has("the service ports (vport) ([8080] vs [8080, 20880])"), "{text:?}");
    assert!(has("TLS (protocol/sni)"), "{text:?}");
    // The first registry's attributes, and the union of the ports.
    assert!(!crate::translate::envoy::is_http2(&cluster(&set, 8080)));
    assert!(cluster(&set, 8080).transport_socket.is_none());
    assert_eq!(served(&set, 20880).len(), 2, "every endpoint on every port");
}

#[test]
fn a_weight_share_divides_traffic_whatever_the_instance_counts() {
    let a = service(8080, Protocol::Http, &["10.0.0.1"]);
    let b = service(8080, Protocol::Http, &["10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.4"]);
    let set = translate(a, b, &[(old(), m(Some(80), 0)), (new(), m(Some(20), 0))]);
    let got = served(&set, 8080);
    let share = |prefix: &str| -> u64 {
        got.iter().filter(|(a, _)| a.starts_with(prefix)).map(|(_, (_, w))| u64::from(*w)).sum()
    };
    let (o, n) = (share("10.0.0."), share("10.0.1."));
    assert_eq!(o * 100 / (o + n), 80, "{got:?}");
    // The same weights reach istiod in the ServiceEntry.
    let se = object(&set, "ServiceEntry").unwrap();
    let total: u64 = se["spec"]["endpoints"].as_array().unwrap().iter().map(|e| e["weight"].as_u64().unwrap()).sum();
    assert_eq!(total, o + n);

    // Unset counts as 100 once another registry at the level sets one.
    let set = translate(
        service(8080, Protocol::Http, &["10.0.0.1"]),
        service(8080, Protocol::Http, &["10.0.1.1"]),
        &[(old(), m(Some(25), 0))],
    );
    let served = served(&set, 8080);
    assert_eq!((served["10.0.0.1"].1, served["10.0.1.1"].1), (200_000, 800_000));
}

#[test]
fn weight_zero_leaves_a_registry_out_but_never_a_host_it_alone_serves() {
    let set = translate(
        service(8080, Protocol::Http, &["10.0.0.1"]),
        service(8080, Protocol::Http, &["10.0.1.1"]),
        &[(old(), m(Some(0), 0)), (new(), m(Some(100), 0))],
    );
    assert_eq!(served(&set, 8080).keys().collect::<Vec<_>>(), ["10.0.1.1"]);

    let cache = Cache::new();
    cache.attach(&old()).update(Update::Upsert(service(8080, Protocol::Http, &["10.0.0.1"])));
    let inputs = Inputs { registry_migration: [(old(), m(Some(0), 0))].into(), ..Inputs::default() };
    let set = build(&cache.view(), &inputs);
    assert_eq!(served(&set, 8080).keys().collect::<Vec<_>>(), ["10.0.0.1"]);
}

#[test]
fn a_priority_makes_levels_for_envoy_and_a_failover_rule_for_istiod() {
    let set = translate(
        service(8080, Protocol::Http, &["10.0.0.1", "10.0.0.2"]),
        service(8080, Protocol::Http, &["10.0.1.1"]),
        &[(old(), m(None, 10))],
    );
    let served = served(&set, 8080);
    assert_eq!(served["10.0.1.1"].0, 0, "the preferred registry is Envoy's priority 0: {served:?}");
    assert_eq!((served["10.0.0.1"].0, served["10.0.0.2"].0), (1, 1));
    let od = cluster(&set, 8080).outlier_detection.expect("failover needs outlier detection");
    assert_eq!(od.max_ejection_percent.unwrap().value, 100);
    let se = object(&set, "ServiceEntry").unwrap();
    let priorities: Vec<&str> = se["spec"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["labels"]["meshbridge.io/priority"].as_str().unwrap())
        .collect();
    assert_eq!(priorities, ["10", "10", "0"]);
    let dr = object(&set, "DestinationRule").expect("a failover rule");
    let policy = &dr["spec"]["trafficPolicy"];
    assert_eq!(policy["loadBalancer"]["localityLbSetting"]["failoverPriority"][0], "meshbridge.io/priority=0");
    assert_eq!(policy["loadBalancer"]["localityLbSetting"]["enabled"], true);
    assert_eq!(policy["outlierDetection"]["consecutive5xxErrors"], 5);
    // It is served over MCP (the encoding is checked against the reflected
    // one from this JSON in test builds).
    assert!(set.mcp["networking.istio.io/DestinationRule"].iter().count() == 1);

    // The preferred level empty: Envoy keeps the level and goes on.
    let set = translate(
        service(8080, Protocol::Http, &["10.0.0.1"]),
        service(8080, Protocol::Http, &[]),
        &[(old(), m(None, 1))],
    );
    let cla = cla(&set, 8080);
    assert_eq!(cla.endpoints.len(), 1, "only the registry with endpoints has a level: {cla:?}");
    assert!(cluster(&set, 8080).outlier_detection.is_some(), "the cluster stays as it was: failover is EDS alone");
}

#[test]
fn a_migration_step_touches_only_the_hosts_the_registries_share() {
    let cache = Cache::new();
    let (a, b) = (cache.attach(&old()), cache.attach(&new()));
    a.update(Update::Upsert(service(8080, Protocol::Http, &["10.0.0.1"])));
    b.update(Update::Upsert(service(8080, Protocol::Http, &["10.0.1.1"])));
    let mut only_old: Vec<Service> = Vec::new();
    for i in 0..200 {
        let mut s = service(8080, Protocol::Http, &["10.0.2.1"]);
        s.host = format!("s{i}.DEFAULT-GROUP.public.nacos");
        only_old.push(s);
    }
    for s in only_old {
        a.update(Update::Upsert(s));
    }
    let mut t = crate::translate::Translator::new();
    t.apply(cache.take_all(), &Inputs::default(), true);
    let rev = t.set().revision;
    let step =
        Inputs { registry_migration: [(old(), m(Some(90), 0)), (new(), m(Some(10), 0))].into(), ..Inputs::default() };
    assert!(t.apply(cache.take_changes(), &step, true));
    let changed = t.set().envoy[ENDPOINT_TYPE].changed_since(rev).expect("logged");
    assert_eq!(changed.iter().map(|n| n.to_string()).collect::<Vec<_>>(), [format!("outbound|8080||{HOST}")]);
    let served = served(t.set(), 8080);
    assert_eq!((served["10.0.0.1"].1, served["10.0.1.1"].1), (900_000, 100_000));
}

#[test]
fn one_registrys_outage_and_withdrawal_touch_only_its_own_endpoints() {
    use meshbridge_registries::RegistryError;
    let cache = Cache::new();
    let (a, b) = (cache.attach(&old()), cache.attach(&new()));
    a.update(Update::Upsert(service(8080, Protocol::Http, &["10.0.0.1"])));
    b.update(Update::Upsert(service(8080, Protocol::Http, &["10.0.1.1"])));
    // The old registry goes away: its last endpoints stay (outage rule).
    a.error(&RegistryError::Unreachable { registry: "nacos1".into(), reason: "connection refused".into() });
    let set = build(&cache.view(), &Inputs::default());
    assert_eq!(served(&set, 8080).keys().collect::<Vec<_>>(), ["10.0.0.1", "10.0.1.1"]);
    // `--max-stale` withdraws them; the other registry's stay served.
    cache.withdraw(&old());
    let set = build(&cache.view(), &Inputs::default());
    assert_eq!(served(&set, 8080).keys().collect::<Vec<_>>(), ["10.0.1.1"]);
    let se = object(&set, "ServiceEntry").unwrap();
    assert_eq!(se["spec"]["endpoints"][0]["labels"]["meshbridge.io/registry"], "nacos2");
}

#[test]
fn an_instance_in_both_registries_is_served_once_as_the_first_has_it() {
    // Double registration: 10.0.0.1 is in both; the new registry preferred.
    let set = translate(
        service(8080, Protocol::Http, &["10.0.0.1", "10.0.0.2"]),
        service(8080, Protocol::Http, &["10.0.0.1"]),
        &[(old(), m(None, 1))],
    );
    let got = served(&set, 8080);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got["10.0.0.1"].0, 0, "in the preferred level, as the preferred registry lists it: {got:?}");
    assert_eq!(got["10.0.0.2"].0, 1);
    let se = object(&set, "ServiceEntry").unwrap();
    let eps = se["spec"]["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 2);
    let first = eps.iter().find(|e| e["address"] == "10.0.0.1").unwrap();
    assert_eq!(first["labels"]["meshbridge.io/registry"], "nacos2");
}
