//! Snapshot tests of the translation: the exact Istio objects and Envoy
//! resources a given set of registry services turns into.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshbridge_registries::{Endpoint, Protocol, RegistryKind, Service, ServicePort, Tls};
use prost::Message;

use super::*;
use crate::cache::{CachedService, RegistryKey, View};

fn endpoint(addr: &str, port: u16, weight: u32, labels: &[(&str, &str)]) -> Endpoint {
    Endpoint {
        address: addr.into(),
        port,
        weight,
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

fn port(number: u16, protocol: Protocol) -> ServicePort {
    ServicePort { number, protocol, name: format!("{}-{number}", protocol.as_str().to_lowercase()) }
}

fn view(services: Vec<(RegistryKey, Service)>) -> View {
    View {
        revision: 7,
        services: services
            .into_iter()
            .map(|(k, s)| (s.host.clone(), CachedService { registry: k, service: Arc::new(s) }))
            .collect(),
        also: Default::default(),
    }
}

/// Inputs with `ingresses`, read as Higress's gateway reads them.
fn higress_inputs(ingresses: &[crate::config::IngressDoc]) -> Inputs<'_> {
    Inputs {
        ingresses,
        ingress: ingress::IngressOptions {
            ingress_class: Some("higress".into()),
            gateway_namespace: "higress-system".into(),
            gateway_name: "higress-gateway".into(),
            ..Default::default()
        },
        ..Inputs::default()
    }
}

fn consul() -> RegistryKey {
    RegistryKey::new(RegistryKind::Consul, "consul-local")
}

fn web() -> Service {
    Service::new(
        "web.dc1.consul",
        vec![port(8080, Protocol::Http)],
        vec![endpoint("10.0.0.2", 8081, 3, &[("version", "v2")]), endpoint("10.0.0.1", 8080, 1, &[("version", "v1")])],
    )
}

fn grpc() -> Service {
    Service::new("orders.dc1.consul", vec![port(9090, Protocol::Grpc)], vec![endpoint("10.0.1.1", 9090, 1, &[])])
}

#[test]
fn service_entry_json() {
    let set = config_set(&view(vec![(consul(), web()), (consul(), grpc())]));
    insta::assert_json_snapshot!(set.objects("ServiceEntry").collect::<Vec<_>>());
}

#[test]
fn envoy_clusters() {
    let set = config_set(&view(vec![(consul(), web()), (consul(), grpc())]));
    let clusters: BTreeMap<&str, Cluster> =
        set.envoy[envoy::CLUSTER_TYPE].iter().map(|r| (&*r.name, Cluster::decode(r.body.value()).unwrap())).collect();
    insta::assert_debug_snapshot!(clusters);
}

#[test]
fn envoy_load_assignments_keep_each_endpoint_port_and_weight() {
    let set = config_set(&view(vec![(consul(), web())]));
    let cla = &set.envoy[envoy::ENDPOINT_TYPE]["outbound|8080||web.dc1.consul"];
    let cla = ClusterLoadAssignment::decode(cla.body.value()).unwrap();
    insta::assert_debug_snapshot!(cla);
}

#[test]
fn versions_are_content_hashes() {
    let a = config_set(&view(vec![(consul(), web())]));
    let b = config_set(&view(vec![(consul(), web())]));
    let name = "outbound|8080||web.dc1.consul";
    assert_eq!(a.envoy[envoy::ENDPOINT_TYPE][name].version, b.envoy[envoy::ENDPOINT_TYPE][name].version);
    let mut changed = web();
    changed.endpoints[0].weight = 5;
    let c = config_set(&view(vec![(consul(), changed)]));
    assert_ne!(a.envoy[envoy::ENDPOINT_TYPE][name].version, c.envoy[envoy::ENDPOINT_TYPE][name].version);
    // The cluster does not depend on endpoints, so its version holds.
    assert_eq!(a.envoy[envoy::CLUSTER_TYPE][name].version, c.envoy[envoy::CLUSTER_TYPE][name].version);
}

#[test]
fn service_without_ports_is_left_out_with_a_reason() {
    let empty = Service::new("ghost.dc1.consul", vec![], vec![]);
    let set = config_set(&view(vec![(consul(), empty), (consul(), web())]));
    assert_eq!(set.objects("ServiceEntry").count(), 1);
    assert!(set.envoy[envoy::CLUSTER_TYPE].keys().all(|k| !k.contains("ghost")));
    let warnings: Vec<String> = set.warnings().map(ToString::to_string).collect();
    assert_eq!(warnings, vec!["ServiceEntry ghost.dc1.consul: no port known yet; left out".to_string()]);
    assert_eq!(set.warnings().next().map(|w| w.reason), Some(Reason::NoPort));
}

/// A `dns` registry with `protocol: grpcs` (SNI: its one host) and a
/// `static` one with `https` and no SNI, beside a plain service.
fn tls_services() -> Vec<(RegistryKey, Service)> {
    let dns = RegistryKey::new(RegistryKind::Dns, "payments");
    let pay = Service::new("payments.dns", vec![port(443, Protocol::Grpc)], vec![endpoint("10.0.2.1", 443, 1, &[])])
        .with_tls(Tls { sni: Some("api.payments.example".into()) });
    let fixed = RegistryKey::new(RegistryKind::Static, "legacy");
    let legacy =
        Service::new("legacy.static", vec![port(80, Protocol::Https)], vec![endpoint("10.0.3.1", 8443, 1, &[])])
            .with_tls(Tls { sni: None });
    vec![(dns, pay), (fixed, legacy), (consul(), web())]
}

#[test]
fn tls_services_get_a_destination_rule_and_a_tls_socket() {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;

    let set = config_set(&view(tls_services()));
    insta::assert_json_snapshot!("tls_destination_rules", set.objects("DestinationRule").collect::<Vec<_>>());

    // Cluster -> transport socket name and its decoded TLS context.
    let sockets: BTreeMap<&str, Option<(String, UpstreamTlsContext)>> = set.envoy[envoy::CLUSTER_TYPE]
        .iter()
        .map(|r| {
            let n = &*r.name;
            let socket = Cluster::decode(r.body.value()).unwrap().transport_socket;
            let tls = socket.map(|s| {
                let Some(ConfigType::TypedConfig(any)) = s.config_type else { panic!("{n}: no typed config") };
                assert_eq!(
                    any.type_url,
                    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
                );
                (s.name, UpstreamTlsContext::decode(any.value.as_slice()).unwrap())
            });
            (n, tls)
        })
        .collect();
    assert_eq!(sockets["outbound|8080||web.dc1.consul"], None, "plain stays plain");
    insta::assert_debug_snapshot!("tls_cluster_transport_sockets", sockets);
}

#[test]
fn destination_hosts_match_service_hosts_ignoring_case() {
    use envoy_types::pb::envoy::config::route::v3::{
        RouteConfiguration, route::Action, route_action::ClusterSpecifier,
    };
    // Higress users write Eureka apps as Eureka shows them (upper case);
    // meshbridge lowercases Eureka hosts, Nacos keeps the registered case.
    let eureka = RegistryKey::new(RegistryKind::Eureka, "eureka");
    let nacos = RegistryKey::new(RegistryKind::Nacos2, "nacos");
    let orders =
        Service::new("orders.eureka", vec![port(8080, Protocol::Http)], vec![endpoint("10.0.0.1", 8080, 1, &[])]);
    let users = Service::new(
        "UserService.DEFAULT-GROUP.public.nacos",
        vec![port(8080, Protocol::Http)],
        vec![endpoint("10.0.0.2", 8080, 1, &[])],
    );
    let yaml = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: default
  annotations:
    higress.io/destination: |
      60% ORDERS.eureka:8080
      40% userservice.default-group.PUBLIC.nacos
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - path: /
            pathType: Prefix
            backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}
"#;
    let ingresses = crate::config::ingress_docs(yaml);
    let inputs = higress_inputs(&ingresses);
    let set = build(&view(vec![(eureka, orders), (nacos, users)]), &inputs);
    assert_eq!(set.warnings().map(ToString::to_string).collect::<Vec<_>>(), Vec::<String>::new());
    let vs = set.objects("VirtualService").next().expect("a VirtualService").spec.to_json();
    let hosts: Vec<&str> =
        vs["http"][0]["route"].as_array().unwrap().iter().map(|r| r["destination"]["host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["orders.eureka", "UserService.DEFAULT-GROUP.public.nacos"], "routes name the services as spelt");

    // The standalone gateway routes to both clusters (no 503).
    let route = set.envoy[envoy::ROUTE_TYPE].iter().next().expect("a route configuration");
    let route = RouteConfiguration::decode(route.body.value()).unwrap();
    let Some(Action::Route(action)) = &route.virtual_hosts[0].routes[0].action else {
        panic!("not a route: {route:?}")
    };
    let Some(ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier else { panic!("{action:?}") };
    let clusters: Vec<&str> = w.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(clusters, ["outbound|8080||orders.eureka", "outbound|8080||UserService.DEFAULT-GROUP.public.nacos"]);
}

/// The DestinationRule of a registry service reached over TLS: per-port
/// SIMPLE TLS.
fn registry_tls_rule() -> model::DestinationRuleSpec {
    let set = config_set(&view(tls_services()));
    set.objects("DestinationRule")
        .find_map(|o| match &o.spec {
            model::Spec::DestinationRule(d) if !d.traffic_policy.as_ref().unwrap().port_level_settings.is_empty() => {
                Some(d.clone())
            }
            _ => None,
        })
        .expect("a registry rule with per-port TLS")
}

/// Istio takes a port's settings instead of the rule's: when an Ingress
/// rule with an upstream policy takes a registry rule's per-port TLS, each
/// port keeps the Ingress's load balancing and pool beside that TLS.
#[test]
fn an_ingress_policy_reaches_the_registry_rules_ports() {
    use crate::translate::model::{
        ConnectionPoolSettings, ConsistentHash, DestinationRuleSpec, H2UpgradePolicy, HttpPoolSettings,
        LoadBalancerSettings, TrafficPolicy,
    };
    let registry = registry_tls_rule();
    let lb = LoadBalancerSettings::ConsistentHash(ConsistentHash::UseSourceIp(true));
    let pool = ConnectionPoolSettings { http: HttpPoolSettings { h2_upgrade_policy: H2UpgradePolicy::Upgrade } };
    let mut ingress = DestinationRuleSpec {
        host: registry.host.clone(),
        traffic_policy: Some(TrafficPolicy {
            load_balancer: Some(lb.clone()),
            connection_pool: Some(pool.clone()),
            ..TrafficPolicy::default()
        }),
        subsets: vec![],
    };
    ingress.fill_unset(&registry);
    let policy = ingress.traffic_policy.unwrap();
    assert_eq!(policy.load_balancer.as_ref(), Some(&lb));
    let ports = &policy.port_level_settings;
    assert_eq!(ports.len(), registry.traffic_policy.unwrap().port_level_settings.len());
    for p in ports {
        assert_eq!((p.load_balancer.as_ref(), p.connection_pool.as_ref()), (Some(&lb), Some(&pool)), "{p:?}");
        assert_eq!(p.tls.mode, model::ClientTlsMode::Simple);
    }
}

/// An Ingress's mutual TLS (`proxy-ssl-secret`) replaces a registry rule's
/// per-port SIMPLE TLS, keeping the registry's SNI when it has none, since
/// the backend asks for the certificate.
#[test]
fn an_ingress_client_certificate_replaces_the_registry_rules_tls() {
    use crate::translate::model::{ClientTlsMode, ClientTlsSettings, DestinationRuleSpec, TrafficPolicy};
    let registry = registry_tls_rule();
    let mutual = ClientTlsSettings {
        mode: ClientTlsMode::Mutual,
        sni: None,
        insecure_skip_verify: Some(true),
        credential_name: Some("client".into()),
    };
    let mut ingress = DestinationRuleSpec {
        host: registry.host.clone(),
        traffic_policy: Some(TrafficPolicy { tls: Some(mutual.clone()), ..TrafficPolicy::default() }),
        subsets: vec![],
    };
    ingress.fill_unset(&registry);
    let registry_ports = registry.traffic_policy.unwrap().port_level_settings;
    let ports = ingress.traffic_policy.unwrap().port_level_settings;
    assert_eq!(ports.len(), registry_ports.len());
    for (p, r) in ports.iter().zip(&registry_ports) {
        assert_eq!(p.tls, ClientTlsSettings { sni: r.tls.sni.clone(), ..mutual.clone() }, "{p:?}");
    }
}

/// An Ingress whose backend is a Kubernetes Service: istiod is sent the
/// Gateway and the VirtualService naming `web.shop.svc.cluster.local`, and
/// nothing for the Service itself (istiod reads Services from the cluster);
/// the standalone gateway answers 503 and says why (issue 35).
#[test]
fn a_service_backend_sends_istiod_nothing_new_and_the_gateway_says_why() {
    let yaml = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 8080}}}}
"#;
    let ingresses = crate::config::ingress_docs(yaml);
    let inputs = higress_inputs(&ingresses);
    let set = build(&view(vec![(consul(), web())]), &inputs);
    let mut kinds: Vec<(String, String)> =
        set.istio.values().map(|o| (o.kind().to_string(), o.metadata.name.clone())).collect();
    kinds.sort();
    let for_service: Vec<&(String, String)> = kinds.iter().filter(|(_, n)| n.contains("svc")).collect();
    assert!(for_service.is_empty(), "nothing named after the Service: {kinds:?}");
    assert_eq!(set.objects("ServiceEntry").count(), 1, "only the registry's own: {kinds:?}");
    let vs = set.objects("VirtualService").next().expect("a VirtualService").spec.to_json();
    assert_eq!(vs["http"][0]["route"][0]["destination"]["host"], "web.shop.svc.cluster.local");
    let warnings: Vec<String> = set.warnings().map(ToString::to_string).collect();
    assert!(
        warnings.iter().any(
            |w| w.contains("web.shop.svc.cluster.local is a Kubernetes Service") && w.contains("`static` registry")
        ),
        "{warnings:?}"
    );
}

/// A backend port given by name on a Service with several ports: istiod gets
/// a route without a port (and a warning); the standalone gateway finds the
/// port by the Service's port name, as kube-proxy does (issue 35).
#[test]
fn a_named_backend_port_is_the_services_port_of_that_name_on_the_gateway() {
    use envoy_types::pb::envoy::config::route::v3::{
        RouteConfiguration, route::Action, route_action::ClusterSpecifier,
    };
    let yaml = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
          - {path: /admin, pathType: Prefix, backend: {service: {name: web, port: {name: admin}}}}
"#;
    let kubernetes = RegistryKey::new(RegistryKind::Kubernetes, "kubernetes");
    let named = |number, name: &str| ServicePort { number, protocol: Protocol::Http, name: name.into() };
    let web = Service::new(
        "web.shop.svc.cluster.local",
        vec![named(9100, "metrics"), named(8080, "http")],
        vec![endpoint("10.0.0.1", 8080, 1, &[])],
    );
    let ingresses = crate::config::ingress_docs(yaml);
    let inputs = higress_inputs(&ingresses);
    let set = build(&view(vec![(kubernetes, web)]), &inputs);
    let vs = set.objects("VirtualService").next().expect("a VirtualService").spec.to_json();
    assert_eq!(vs["http"][0]["route"][0]["destination"], serde_json::json!({"host": "web.shop.svc.cluster.local"}));
    let warnings: Vec<String> = set.warnings().map(ToString::to_string).collect();
    assert!(warnings.iter().any(|w| w.contains("has no port named \"admin\"")), "{warnings:?}");
    let route = set.envoy[envoy::ROUTE_TYPE].iter().next().expect("a route configuration");
    let route = RouteConfiguration::decode(route.body.value()).unwrap();
    let root = route.virtual_hosts[0].routes.iter().find(|r| format!("{:?}", r.r#match).contains("\"/\"")).unwrap();
    let Some(Action::Route(action)) = &root.action else { panic!("{route:?}") };
    assert_eq!(
        action.cluster_specifier,
        Some(ClusterSpecifier::Cluster("outbound|8080||web.shop.svc.cluster.local".into())),
        "{:?}",
        set.warnings().map(ToString::to_string).collect::<Vec<_>>()
    );
}

/// `create_time` is the same on every replica and across restarts: a
/// VirtualService is as old as its host's oldest Ingress, the Gateway as
/// the oldest of all, a registry's objects the Unix epoch (issue 37).
#[test]
fn create_times_come_from_the_sources_not_the_clock() {
    use meshbridge_proto::istio::mcp::v1alpha1 as mcp;
    let yaml = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: newer
  namespace: shop
  creationTimestamp: "2025-03-04T05:06:07Z"
  annotations: {higress.io/destination: web.dc1.consul:8080}
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /new, pathType: Prefix, backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}}
    - host: only-new.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: older
  namespace: shop
  creationTimestamp: "2024-01-02T03:04:05Z"
  annotations: {higress.io/destination: web.dc1.consul:8080}
spec:
  ingressClassName: higress
  rules:
    - host: shop.example.com
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}}
"#;
    let (older, newer) = (1_704_164_645, 1_741_064_767);
    let ingresses = crate::config::ingress_docs(yaml);
    let inputs = higress_inputs(&ingresses);
    let times = |set: &ConfigSet| -> BTreeMap<String, i64> {
        set.mcp
            .values()
            .flat_map(|t| t.iter())
            .map(|r| {
                let res = mcp::Resource::decode(r.body.value()).unwrap();
                let meta = res.metadata.unwrap();
                (meta.name, meta.create_time.unwrap().seconds)
            })
            .collect()
    };
    let set = build(&view(vec![(consul(), web())]), &inputs);
    let got = times(&set);
    let vs = |host: &str| {
        let obj = set.objects("VirtualService").find(|o| o.spec.to_json()["hosts"][0] == host).unwrap();
        got[&obj.key()]
    };
    assert_eq!(vs("shop.example.com"), older, "{got:?}");
    assert_eq!(vs("only-new.example.com"), newer, "{got:?}");
    let gateway = set.objects("Gateway").next().unwrap().key();
    assert_eq!(got[&gateway], older);
    let entry = set.objects("ServiceEntry").next().unwrap().key();
    assert_eq!(got[&entry], 0, "a registry's objects: the epoch");

    // Another replica, or a restart: the same resources, byte for byte.
    let again = build(&view(vec![(consul(), web())]), &inputs);
    for (collection, resources) in &set.mcp {
        let other = &again.mcp[collection];
        for r in resources.iter() {
            assert_eq!(other.get(&r.name).map(|o| o.body.value()), Some(r.body.value()), "{}", r.name);
        }
    }
}
