//! Services and EndpointSlices → the service the gateway serves, as
//! kube-proxy reads them.

use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use meshbridge_registries::Protocol;
use serde_json::{Value, json};

use super::*;

fn service(spec: Value) -> KubeService {
    serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec})).unwrap()
}

fn slice(name: &str, ports: Value, endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "web"}},
        "addressType": "IPv4", "ports": ports, "endpoints": endpoints,
    }))
    .unwrap()
}

fn ep(ip: &str, conditions: Value) -> Value {
    json!({"addresses": [ip], "conditions": conditions})
}

/// (address, port, the service port label) of every endpoint.
fn endpoints(s: &Service) -> Vec<(String, u16, Option<String>)> {
    s.endpoints.iter().map(|e| (e.address.clone(), e.port, e.labels.get(LABEL_SERVICE_PORT).cloned())).collect()
}

#[test]
fn ready_endpoints_only_and_never_terminating_ones() {
    let svc = service(json!({"ports": [{"port": 8080, "targetPort": 9000}]}));
    let s = slice(
        "web-a",
        json!([{"port": 9000, "protocol": "TCP"}]),
        json!([
            ep("10.1.0.1", json!({"ready": true})),
            ep("10.1.0.2", json!({})),
            ep("10.1.0.3", json!({"ready": false})),
            ep("10.1.0.4", json!({"ready": false, "serving": true, "terminating": true})),
            ep("10.1.0.5", json!({"ready": true, "terminating": true})),
        ]),
    );
    let got = service_of(&svc, [&s]).unwrap();
    assert_eq!(got.host, "web.shop.svc.cluster.local");
    assert_eq!(got.ports.iter().map(|p| (p.number, p.protocol)).collect::<Vec<_>>(), [(8080, Protocol::Http)]);
    assert_eq!(
        endpoints(&got),
        [("10.1.0.1".into(), 9000, None), ("10.1.0.2".into(), 9000, None)],
        "an unset condition is ready and not terminating"
    );
}

#[test]
fn several_ports_map_by_name_each_to_its_own_target() {
    let svc = service(json!({"ports": [
        {"name": "http", "port": 80, "targetPort": "web"},
        {"name": "grpc-api", "port": 9090, "targetPort": 50051},
        {"name": "dns", "port": 53, "protocol": "UDP"},
    ]}));
    // The controller resolved the named target port per slice: two pods
    // serve `web` on different numbers.
    let a = slice(
        "web-a",
        json!([{"name": "http", "port": 8080}, {"name": "grpc-api", "port": 50051}]),
        json!([ep("10.1.0.1", json!({"ready": true}))]),
    );
    let b = slice(
        "web-b",
        json!([{"name": "http", "port": 8081}, {"name": "grpc-api", "port": 50051}]),
        json!([ep("10.1.0.2", json!({"ready": true}))]),
    );
    let got = service_of(&svc, [&a, &b]).unwrap();
    let ports: Vec<(u16, Protocol)> = got.ports.iter().map(|p| (p.number, p.protocol)).collect();
    assert_eq!(ports, [(80, Protocol::Http), (9090, Protocol::Grpc)], "UDP left out; grpc- names gRPC");
    let at = |n: &str| Some(n.to_string());
    assert_eq!(
        endpoints(&got),
        [
            ("10.1.0.1".into(), 8080, at("80")),
            ("10.1.0.1".into(), 50051, at("9090")),
            ("10.1.0.2".into(), 8081, at("80")),
            ("10.1.0.2".into(), 50051, at("9090")),
        ]
    );
    // Each port's load assignment takes its own endpoints.
    let clas = crate::translate::envoy::load_assignments(&got);
    let decoded: Vec<envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment> =
        clas.iter().map(|r| prost::Message::decode(r.body.value()).unwrap()).collect();
    let count: Vec<(String, usize)> = decoded
        .iter()
        .map(|c| (c.cluster_name.clone(), c.endpoints.iter().map(|l| l.lb_endpoints.len()).sum()))
        .collect();
    assert_eq!(
        count,
        [
            ("outbound|80||web.shop.svc.cluster.local".to_string(), 2),
            ("outbound|9090||web.shop.svc.cluster.local".to_string(), 2)
        ]
    );
}

#[test]
fn fqdn_slices_give_no_endpoints_and_duplicates_count_once() {
    let svc = service(json!({"ports": [{"port": 80, "appProtocol": "kubernetes.io/h2c"}]}));
    let mut fqdn = slice("web-f", json!([{"port": 80}]), json!([ep("api.example.com", json!({}))]));
    fqdn.address_type = "FQDN".into();
    let a = slice("web-a", json!([{"port": 80}]), json!([ep("10.1.0.1", json!({}))]));
    let moving = slice("web-b", json!([{"port": 80}]), json!([ep("10.1.0.1", json!({}))]));
    let got = service_of(&svc, [&fqdn, &a, &moving]).unwrap();
    assert_eq!(got.ports[0].protocol, Protocol::Http2, "appProtocol kubernetes.io/h2c");
    assert_eq!(endpoints(&got), [("10.1.0.1".into(), 80, None)]);
}

#[test]
fn referenced_services_are_the_backends_mirrors_and_default_backends_of_the_ingresses() {
    let yaml = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
  annotations:
    higress.io/mirror-target-service: audit/recorder:8080
    nginx.ingress.kubernetes.io/default-backend: errors
spec:
  defaultBackend: {service: {name: fallback, port: {number: 80}}}
  rules:
    - http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}
          - {path: /mcp, pathType: Prefix, backend: {resource: {apiGroup: networking.higress.io, kind: McpBridge, name: default}}}
"#;
    let got = referenced(&crate::config::ingress_docs(yaml));
    let flat: Vec<(String, String)> =
        got.into_iter().flat_map(|(ns, names)| names.into_iter().map(move |n| (ns.clone(), n))).collect();
    assert_eq!(
        flat,
        [
            ("audit".to_string(), "recorder".to_string()),
            ("shop".to_string(), "errors".to_string()),
            ("shop".to_string(), "fallback".to_string()),
            ("shop".to_string(), "web".to_string())
        ]
    );
}

fn owned(name: &str, service: &str) -> EndpointSlice {
    let mut s = slice(name, json!([{"port": 80}]), json!([ep("10.1.0.1", json!({}))]));
    s.metadata.labels = Some([(SERVICE_NAME_LABEL.to_owned(), service.to_owned())].into());
    s
}

fn names<'a>(slices: impl Iterator<Item = &'a EndpointSlice>) -> BTreeSet<String> {
    slices.map(|s| s.name_any()).collect()
}

#[test]
fn slices_are_indexed_by_service_and_a_relabelled_slice_moves() {
    let mut slices = Slices::default();
    let mut touched = BTreeSet::new();
    slices.apply(owned("web-a", "web"), &mut touched);
    slices.apply(owned("web-b", "web"), &mut touched);
    slices.apply(owned("api-a", "api"), &mut touched);
    assert_eq!(touched, BTreeSet::from(["web".into(), "api".into()]));
    assert_eq!(names(slices.of("web")), BTreeSet::from(["web-a".into(), "web-b".into()]));

    // A slice whose label now names another Service changes both.
    let mut touched = BTreeSet::new();
    slices.apply(owned("web-b", "api"), &mut touched);
    assert_eq!(touched, BTreeSet::from(["web".into(), "api".into()]));
    assert_eq!(names(slices.of("web")), BTreeSet::from(["web-a".into()]));
    assert_eq!(names(slices.of("api")), BTreeSet::from(["api-a".into(), "web-b".into()]));

    let mut touched = BTreeSet::new();
    slices.delete("web-a", &mut touched);
    slices.delete("gone", &mut touched);
    assert_eq!(touched, BTreeSet::from(["web".into()]));
    assert_eq!(slices.of("web").count(), 0);
    assert!(!slices.by_service.contains_key("web"), "a Service with no slice left is dropped from the index");
}

#[test]
fn an_external_name_service_is_its_name_on_each_port_in_a_dns_cluster() {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
    use prost::Message;

    let external = service(json!({"type": "ExternalName", "externalName": "api.example.com.", "ports": [
        {"name": "https", "port": 443}, {"name": "http", "port": 80, "targetPort": 8080}]}));
    // Slices are not read for it (a controller writes none).
    let stray = slice("web-a", json!([{"name": "http", "port": 8080}]), json!([ep("10.1.0.1", json!({}))]));
    let got = service_of(&external, [&stray]).unwrap();
    assert_eq!(
        endpoints(&got),
        [("api.example.com".into(), 80, Some("80".into())), ("api.example.com".into(), 443, Some("443".into()))],
        "the name on each Service port, the trailing dot dropped; no target port"
    );

    let clusters = crate::translate::envoy::clusters(&got);
    assert_eq!(clusters.len(), 2);
    for r in &clusters {
        let c = Cluster::decode(r.body.value()).unwrap();
        assert_eq!(c.cluster_discovery_type, Some(ClusterDiscoveryType::Type(DiscoveryType::StrictDns as i32)));
        assert!(c.eds_cluster_config.is_none());
        let cla = c.load_assignment.expect("the endpoints in the cluster");
        let lb: Vec<_> = cla.endpoints.iter().flat_map(|l| &l.lb_endpoints).collect();
        assert_eq!(lb.len(), 1, "{}: one endpoint, this port's", c.name);
    }
    assert!(crate::translate::envoy::load_assignments(&got).is_empty(), "no EDS for a DNS cluster");

    // No ports, or a name that is not a DNS name: nothing to serve.
    let no_ports = service(json!({"type": "ExternalName", "externalName": "api.example.com"}));
    assert_eq!(service_of(&no_ports, []), None);
    let bad = service(json!({"type": "ExternalName", "externalName": "api_example..com", "ports": [{"port": 80}]}));
    assert_eq!(service_of(&bad, []), None);
}

#[test]
fn a_headless_service_is_read_from_its_slices_like_any_other() {
    let headless = service(json!({"clusterIP": "None", "ports": [{"name": "http", "port": 80}]}));
    let s = slice("web-a", json!([{"name": "http", "port": 8080}]), json!([ep("10.1.0.1", json!({"ready": true}))]));
    let got = service_of(&headless, [&s]).unwrap();
    assert_eq!(endpoints(&got), [("10.1.0.1".into(), 8080, None)]);
    assert_eq!(crate::translate::envoy::load_assignments(&got).len(), 1, "EDS, as for a ClusterIP Service");
}
