//! The incremental translator against a fresh whole translation: after
//! every change, both must hold the same resources, objects and warnings;
//! and one change must touch only what it is about.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshbridge_registries::{Endpoint, Migration, Protocol, RegistryKind, Service, ServicePort, Sink, Tls, Update};
use serde_json::json;

use super::*;
use crate::cache::Cache;
use crate::config::{IngressDoc, ProxySpec};
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
use crate::translate::gateway::GatewayOptions;
use crate::translate::ingress::IngressOptions;

fn svc(host: &str, port: u16, addrs: &[&str], version: &str) -> Service {
    let eps = addrs
        .iter()
        .map(|a| Endpoint {
            address: a.to_string(),
            port,
            weight: 1,
            labels: [("version".to_string(), version.to_string())].into(),
        })
        .collect();
    Service::new(host, vec![ServicePort { number: port, protocol: Protocol::Http, name: format!("http-{port}") }], eps)
}

/// An Ingress routing `shop.example.com` to `web.dc1.consul` (80/20 across
/// subsets v1 and v2), mirroring to `x.dc1.consul`, which comes and goes.
fn ingress() -> IngressDoc {
    let object = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "shop", "annotations": {
            "higress.io/destination": "80% web.dc1.consul:8080 v1\n20% web.dc1.consul:8080 v2",
            "higress.io/mirror-target-service": "x.dc1.consul"}},
        "spec": {"ingressClassName": "higress", "rules": [{"host": "shop.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"resource": {
                "apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]}
    });
    IngressDoc::from_json("shop".into(), "shop".into(), &object)
}

fn api_ingress() -> IngressDoc {
    api_ingress_named("api", "api.dc1.consul:9090")
}

fn api_ingress_named(name: &str, destination: &str) -> IngressDoc {
    let object = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": "shop", "annotations": {
            "higress.io/destination": destination}},
        "spec": {"ingressClassName": "higress", "rules": [{"host": "api.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"resource": {
                "apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]}
    });
    IngressDoc::from_json("shop".into(), name.into(), &object)
}

/// `api_ingress` with the destination spelt in upper case.
fn upper_ingress() -> IngressDoc {
    api_ingress_named("upper", "API.DC1.consul:9090")
}

fn proxies() -> Vec<ProxySpec> {
    vec![ProxySpec {
        name: "corp".into(),
        server_address: "10.1.1.1".into(),
        server_port: 3128,
        listener_port: None,
        connect_timeout: None,
    }]
}

fn inputs<'a>(ingresses: &'a [IngressDoc], proxies: &'a [ProxySpec]) -> Inputs<'a> {
    inputs_with(ingresses, proxies, true)
}

fn inputs_with<'a>(ingresses: &'a [IngressDoc], proxies: &'a [ProxySpec], proxied: bool) -> Inputs<'a> {
    inputs_full(ingresses, proxies, proxied, false, 0)
}

/// The `meshbridgeMigration` settings the random walk moves between.
fn migration(which: usize) -> BTreeMap<RegistryKey, Migration> {
    let consul = RegistryKey::new(RegistryKind::Consul, "c");
    let other = RegistryKey::new(RegistryKind::Static, "s");
    let m = |weight: Option<u32>, priority: u32| Migration { weight, priority };
    match which % 5 {
        0 => BTreeMap::new(),
        1 => BTreeMap::from([(consul, m(Some(80), 0)), (other, m(Some(20), 0))]),
        2 => BTreeMap::from([(other, m(None, 1))]),
        3 => BTreeMap::from([(consul, m(Some(0), 0))]),
        _ => BTreeMap::from([(consul, m(Some(30), 2)), (other, m(None, 0))]),
    }
}

fn inputs_full<'a>(
    ingresses: &'a [IngressDoc],
    proxies: &'a [ProxySpec],
    proxied: bool,
    curves: bool,
    migrate: usize,
) -> Inputs<'a> {
    let registry_ecdh_curves = if curves {
        BTreeMap::from([
            (RegistryKey::new(RegistryKind::Dns, "partner"), vec!["P-384".to_string()]),
            (RegistryKey::new(RegistryKind::Consul, "c"), vec!["X25519".to_string()]),
        ])
    } else {
        BTreeMap::new()
    };
    let registry_proxies = if proxied {
        BTreeMap::from([(RegistryKey::new(RegistryKind::Dns, "partner"), "corp".to_string())])
    } else {
        BTreeMap::new()
    };
    Inputs {
        ingresses,
        tls_secrets: &[],
        ca_secrets: &[],
        ingress: IngressOptions {
            ingress_class: Some("higress".into()),
            gateway_namespace: "higress-system".into(),
            gateway_name: "higress-gateway".into(),
            ..Default::default()
        },
        gateway: GatewayOptions { http_ports: vec![10080], https_port: 10443 },
        proxies,
        registry_proxies,
        registry_ecdh_curves,
        registry_migration: migration(migrate),
    }
}

/// Everything a client can see of a set, creation times aside.
type Seen = (BTreeMap<String, Vec<(String, String)>>, Vec<serde_json::Value>, Vec<String>);

fn seen(set: &ConfigSet) -> Seen {
    let mut types = BTreeMap::new();
    for (t, r) in &set.envoy {
        types.insert(t.to_string(), r.iter().map(|r| (r.name.to_string(), r.version.to_string())).collect());
    }
    for (c, r) in &set.mcp {
        types.insert(c.clone(), r.iter().map(|r| (r.name.to_string(), r.version.to_string())).collect());
    }
    types.retain(|_, v: &mut Vec<(String, String)>| !v.is_empty());
    let objects = set.istio.values().map(|o| o.to_json()).collect();
    let warnings = set.warnings().map(ToString::to_string).collect();
    (types, objects, warnings)
}

/// A small deterministic pseudo-random sequence (no clock, no crate).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn incremental_equals_a_fresh_translation_after_every_change() {
    let cache = Cache::new();
    let consul = RegistryKey::new(RegistryKind::Consul, "c");
    let other = RegistryKey::new(RegistryKind::Static, "s");
    let partner = RegistryKey::new(RegistryKind::Dns, "partner");
    let sinks: Vec<(RegistryKey, Arc<dyn Sink>)> =
        [consul, other, partner].into_iter().map(|k| (k.clone(), cache.attach(&k))).collect();
    let ingress_sets = [
        vec![ingress()],
        vec![ingress(), api_ingress()],
        vec![api_ingress()],
        vec![],
        vec![upper_ingress(), ingress()],
    ];
    let mut curves = false;
    let mut migrate = 0;
    let mut which = 0;
    let mut proxied = true;
    let proxies = proxies();
    let mut t = Translator::new();
    t.apply(cache.take_all(), &inputs(&ingress_sets[which], &proxies), true);

    let hosts =
        ["web.dc1.consul", "api.dc1.consul", "API.dc1.consul", "x.dc1.consul", "partner.dns", "ghost.dc1.consul"];
    let mut rng = Lcg(7);
    for step in 0..600 {
        let (key, sink) = &sinks[rng.next(sinks.len() as u64) as usize];
        let host = hosts[rng.next(hosts.len() as u64) as usize];
        let mut inputs_changed = false;
        if key.kind == RegistryKind::Dns && rng.next(4) != 0 {
            // The proxied registry mostly reports its one TLS service.
            let n = rng.next(3) as usize;
            let addrs: Vec<String> = (0..n).map(|i| format!("203.0.113.{i}")).collect();
            let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
            let partner =
                svc("partner.dns", 443, &addrs, "v1").with_tls(Tls { sni: Some("api.partner.example".into()) });
            sink.update(Update::Upsert(partner));
        } else {
            match rng.next(10) {
                0 => sink.update(Update::Remove(host.into())),
                1 => {
                    // The Ingresses, or which registries use a proxy, change now and then.
                    match rng.next(4) {
                        0 => which = (which + 1) % ingress_sets.len(),
                        1 => proxied = !proxied,
                        2 => migrate += 1,
                        _ => curves = !curves,
                    }
                    inputs_changed = true;
                }
                2 => sink.update(Update::Upsert(Service::new(host, vec![], vec![]))),
                3 => {
                    let port = if rng.next(2) == 0 { 8080 } else { 9090 };
                    let tls =
                        Service { ..svc(host, port, &["10.0.0.9"], "v2") }.with_tls(Tls { sni: Some(host.into()) });
                    sink.update(Update::Upsert(tls));
                }
                4 => sink.update(Update::Snapshot(vec![svc(host, 8080, &["10.0.0.1"], "v1")])),
                _ => {
                    let n = rng.next(4) as usize;
                    let addrs: Vec<String> = (0..n).map(|i| format!("10.0.{}.{i}", rng.next(3))).collect();
                    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
                    let port = if host.starts_with("api") { 9090 } else { 8080 };
                    sink.update(Update::Upsert(svc(host, port, &addrs, if rng.next(2) == 0 { "v1" } else { "v2" })));
                }
            }
        }
        let inputs = inputs_full(&ingress_sets[which], &proxies, proxied, curves, migrate);
        let before = t.set().revision;
        let changed = t.apply(cache.take_changes(), &inputs, inputs_changed);
        assert_eq!(t.set().revision, before + u64::from(changed), "step {step}: revision grows with changes");
        let fresh = build(&cache.view(), &inputs);
        assert_eq!(seen(t.set()), seen(&fresh), "step {step}: {key} {host}");
    }
}

#[test]
fn an_endpoint_change_touches_only_its_own_endpoints() {
    let cache = Cache::new();
    let sink = cache.attach(&RegistryKey::new(RegistryKind::Consul, "c"));
    let many: Vec<Service> =
        (0..500).map(|i| svc(&format!("s{i}.dc1.consul"), 8080, &["10.0.0.1", "10.0.0.2"], "v1")).collect();
    sink.update(Update::Snapshot(many));
    sink.update(Update::Upsert(svc("web.dc1.consul", 8080, &["10.0.0.1"], "v1")));
    sink.update(Update::Upsert(svc("api.dc1.consul", 9090, &["10.0.0.1"], "v1")));
    let ingresses = [ingress(), api_ingress()];
    let inputs = inputs(&ingresses, &[]);
    let mut t = Translator::new();
    t.apply(cache.take_all(), &inputs, true);
    let rev = t.set().revision;

    // A routed host without subsets (api) and a plain one change endpoints.
    sink.update(Update::Upsert(svc("s7.dc1.consul", 8080, &["10.0.0.3"], "v1")));
    sink.update(Update::Upsert(svc("api.dc1.consul", 9090, &["10.0.0.4"], "v1")));
    let changes = cache.take_changes();
    assert_eq!(changes.hosts.len(), 2);
    assert!(t.apply(changes, &inputs, false));
    let set = t.set();
    let changed = |type_url: &str| -> Vec<String> {
        let mut names: Vec<String> =
            set.envoy[type_url].changed_since(rev).expect("logged").iter().map(|n| n.to_string()).collect();
        names.sort();
        names
    };
    assert_eq!(changed(ENDPOINT_TYPE), ["outbound|8080||s7.dc1.consul", "outbound|9090||api.dc1.consul"]);
    assert!(changed(CLUSTER_TYPE).is_empty(), "clusters keep their version");
    assert!(changed(LISTENER_TYPE).is_empty() && changed(ROUTE_TYPE).is_empty(), "no gateway rebuild");
    let se = set.mcp["networking.istio.io/ServiceEntry"].changed_since(rev).expect("logged");
    assert_eq!(se.len(), 2, "the two ServiceEntries, nothing else");
}

#[test]
fn a_subset_host_change_reaches_its_subset_endpoints() {
    let cache = Cache::new();
    let sink = cache.attach(&RegistryKey::new(RegistryKind::Consul, "c"));
    sink.update(Update::Upsert(svc("web.dc1.consul", 8080, &["10.0.0.1"], "v1")));
    let ingresses = [ingress()];
    let inputs = inputs(&ingresses, &[]);
    let mut t = Translator::new();
    t.apply(cache.take_all(), &inputs, true);
    assert!(t.set().envoy[ENDPOINT_TYPE].contains("outbound|8080|v1|web.dc1.consul"));
    let rev = t.set().revision;
    sink.update(Update::Upsert(svc("web.dc1.consul", 8080, &["10.0.0.1", "10.0.0.2"], "v1")));
    t.apply(cache.take_changes(), &inputs, false);
    let changed = t.set().envoy[ENDPOINT_TYPE].changed_since(rev).expect("logged");
    assert!(changed.iter().any(|n| &**n == "outbound|8080|v1|web.dc1.consul"), "{changed:?}");
}
