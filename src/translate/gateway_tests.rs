//! Snapshot tests of the standalone gateway translation: the exact listeners,
//! routes and subset clusters a set of Istio objects turns into.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    address::Address as AddressKind, socket_address::PortSpecifier, transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint::HostIdentifier};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter, listener_filter};
use envoy_types::pb::envoy::config::route::v3::{
    RouteConfiguration, VirtualHost, route, route_action::ClusterSpecifier, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use meshbridge_registries::{Endpoint, Protocol, Secret, Service, ServicePort};
use prost::Message;
use serde_json::{Value, json};

use super::*;
use crate::model::{CachedService, RegistryKey};
use crate::translate::envoy;
use crate::translate::model::{IstioObject, Spec};
use crate::translate::warning::Warning;

const GW_NS: &str = "higress-system";
const CERT: &str = "-----BEGIN CERTIFICATE-----\nTESTCERT\n-----END CERTIFICATE-----\n";
const KEY: &str = "-----BEGIN PRIVATE KEY-----\nTESTKEY-do-not-log\n-----END PRIVATE KEY-----\n";

/// An object from its spec in Istio's JSON, read into the typed model.
fn obj(kind: &str, namespace: &str, name: &str, spec: Value) -> IstioObject {
    let spec = Spec::from_json(kind, spec).unwrap_or_else(|e| panic!("{namespace}/{name}: {e}"));
    IstioObject::new(name, namespace, spec)
}

fn texts(warnings: &[Warning]) -> Vec<String> {
    warnings.iter().map(ToString::to_string).collect()
}

/// An HTTP Gateway on every host, as the Ingress translation makes.
fn http_gateway() -> IstioObject {
    obj(
        "Gateway",
        GW_NS,
        "gw",
        json!({"servers": [{"port": {"number": 80, "protocol": "HTTP", "name": "http-80"}, "hosts": ["*"]}]}),
    )
}

fn https_gateway(hosts: &[&str], credential: &str) -> IstioObject {
    obj(
        "Gateway",
        GW_NS,
        "gw",
        json!({"servers": [
            {"port": {"number": 80, "protocol": "HTTP", "name": "http-80"}, "hosts": hosts},
            {"port": {"number": 443, "protocol": "HTTPS", "name": "https-443"}, "hosts": hosts,
             "tls": {"mode": "SIMPLE", "credentialName": credential}}
        ]}),
    )
}

fn vs(name: &str, hosts: &[&str], http: Value) -> IstioObject {
    obj("VirtualService", "default", name, json!({"hosts": hosts, "gateways": [format!("{GW_NS}/gw")], "http": http}))
}

fn dest(host: &str, port: u16) -> Value {
    json!({"destination": {"host": host, "port": {"number": port}}})
}

fn endpoint(addr: &str, port: u16, labels: &[(&str, &str)]) -> Endpoint {
    Endpoint {
        address: addr.into(),
        port,
        weight: 1,
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

fn services() -> BTreeMap<String, Arc<Service>> {
    let web = Service::new(
        "web.dc1.consul",
        vec![ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() }],
        vec![
            endpoint("10.0.0.1", 8080, &[("version", "v1"), ("zone", "a")]),
            endpoint("10.0.0.2", 8080, &[("version", "v2"), ("zone", "a")]),
            endpoint("10.0.0.3", 8080, &[("version", "v2"), ("zone", "b")]),
        ],
    );
    let api = Service::new(
        "api.dc1.consul",
        vec![ServicePort { number: 9090, protocol: Protocol::Grpc, name: "grpc-9090".into() }],
        vec![endpoint("10.0.1.1", 9090, &[])],
    );
    [web, api].into_iter().map(|s| (s.host.clone(), Arc::new(s))).collect()
}

fn opts() -> GatewayOptions {
    GatewayOptions { http_ports: vec![10080], https_port: 10443 }
}

fn tls(namespace: &str, name: &str) -> GatewayTls {
    GatewayTls {
        namespace: namespace.into(),
        name: name.into(),
        cert_chain_pem: CERT.into(),
        private_key_pem: Secret::new(KEY),
        ca_cert_pem: None,
    }
}

fn lookup(services: BTreeMap<String, Arc<Service>>) -> impl Fn(&str) -> Option<CachedService> {
    let registry = RegistryKey::new(meshbridge_registries::RegistryKind::Static, "gw");
    move |host| services.get(host).map(|s| CachedService { registry: registry.clone(), service: s.clone() })
}

fn gateway(objects: &[IstioObject], secrets: &[GatewayTls]) -> GatewayOutput {
    envoy_gateway(objects, &lookup(services()), secrets, &[], &opts())
}

fn run(objects: &[IstioObject]) -> GatewayOutput {
    let out = gateway(objects, &[]);
    assert_routes_resolve(&out);
    out
}

fn decode<M: Message + Default>(r: &Resource) -> M {
    M::decode(r.body.value()).unwrap()
}

fn route_config(out: &GatewayOutput, name: &str) -> RouteConfiguration {
    decode(out.routes.iter().find(|r| &*r.name == name).unwrap_or_else(|| panic!("no route config {name}")))
}

fn vhost(out: &GatewayOutput, listener: &str, host: &str) -> VirtualHost {
    let rc = route_config(out, listener);
    rc.virtual_hosts.into_iter().find(|v| v.name == host).unwrap_or_else(|| panic!("no vhost {host}"))
}

/// The invariant: every cluster a route names is one the Envoy has.
fn assert_routes_resolve(out: &GatewayOutput) {
    let mut known: BTreeSet<String> =
        services().values().flat_map(|s| envoy::clusters(s)).map(|r| r.name.to_string()).collect();
    known.extend(out.clusters.iter().map(|r| r.name.to_string()));
    for rc in &out.routes {
        let rc: RouteConfiguration = decode(rc);
        for route in rc.virtual_hosts.iter().flat_map(|v| &v.routes) {
            if let Some(route::Action::Route(ra)) = &route.action {
                let mut names: Vec<String> = match ra.cluster_specifier.as_ref().unwrap() {
                    ClusterSpecifier::Cluster(c) => vec![c.clone()],
                    ClusterSpecifier::WeightedClusters(w) => w.clusters.iter().map(|c| c.name.clone()).collect(),
                    other => panic!("unexpected {other:?}"),
                };
                names.extend(ra.request_mirror_policies.iter().map(|m| m.cluster.clone()));
                for n in names {
                    assert!(known.contains(&n), "route {} names unknown cluster {n}", rc.name);
                }
            }
        }
    }
}

/// A listener with its typed configs decoded beside it (their bytes emptied
/// in the listener), so the snapshot reads as configuration.
#[derive(Debug)]
#[allow(dead_code)]
struct ListenerView {
    listener: Listener,
    hcm: Vec<HttpConnectionManager>,
    tls: Vec<Option<DownstreamTlsContext>>,
}

fn view_listener(r: &Resource) -> ListenerView {
    let mut listener: Listener = decode(r);
    let mut hcm = Vec::new();
    let mut tls = Vec::new();
    for lf in &mut listener.listener_filters {
        if let Some(listener_filter::ConfigType::TypedConfig(any)) = &mut lf.config_type {
            any.value.clear();
        }
    }
    for chain in &mut listener.filter_chains {
        for f in &mut chain.filters {
            if let Some(filter::ConfigType::TypedConfig(any)) = &mut f.config_type {
                hcm.push(HttpConnectionManager::decode(any.value.as_slice()).unwrap());
                any.value.clear();
            }
        }
        tls.push(chain.transport_socket.as_mut().map(|ts| match &mut ts.config_type {
            Some(transport_socket::ConfigType::TypedConfig(any)) => {
                let ctx = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
                any.value.clear();
                ctx
            }
            None => panic!("transport socket without config"),
        }));
    }
    ListenerView { listener, hcm, tls }
}

#[test]
fn prefix_exact_and_regex_matches_in_order() {
    let out = run(&[
        http_gateway(),
        vs(
            "web",
            &["web.example.com"],
            json!([
                {"name": "health", "match": [{"uri": {"exact": "/healthz"}}], "route": [dest("web.dc1.consul", 8080)]},
                {"name": "versioned", "match": [{"uri": {"regex": "/v[0-9]+/.*"}}], "route": [dest("api.dc1.consul", 9090)]},
                {"name": "root", "match": [{"uri": {"prefix": "/"}}], "route": [dest("web.dc1.consul", 8080)]}
            ]),
        ),
    ]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    insta::assert_debug_snapshot!(route_config(&out, "http.10080"));
}

#[test]
fn weighted_80_20_across_two_destinations() {
    let mut a = dest("web.dc1.consul", 8080);
    a["weight"] = json!(80);
    let mut b = dest("api.dc1.consul", 9090);
    b["weight"] = json!(20);
    let out = run(&[http_gateway(), vs("split", &["split.example.com"], json!([{"route": [a, b]}]))]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let routes = vhost(&out, "http.10080", "split.example.com").routes;
    insta::assert_debug_snapshot!(routes);
}

#[test]
fn subsets_make_subset_clusters_with_filtered_endpoints() {
    let dr = obj(
        "DestinationRule",
        "default",
        "web",
        json!({"host": "web.dc1.consul", "subsets": [
            {"name": "v1", "labels": {"version": "v1"}},
            {"name": "v2", "labels": {"version": "v2"}},
            {"name": "v2-b", "labels": {"version": "v2", "zone": "b"}},
            {"name": "unused", "labels": {"version": "v9"}}
        ]}),
    );
    let sub = |subset: &str, weight: u32| json!({"destination": {"host": "web.dc1.consul", "subset": subset}, "weight": weight});
    let out = run(&[
        http_gateway(),
        dr,
        vs(
            "canary",
            &["web.example.com"],
            json!([
                {"match": [{"uri": {"prefix": "/b"}}], "route": [sub("v2-b", 100)]},
                {"route": [sub("v1", 90), sub("v2", 10)]}
            ]),
        ),
    ]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let names: Vec<&str> = out.clusters.iter().map(|r| &*r.name).collect();
    assert_eq!(
        names,
        ["outbound|8080|v1|web.dc1.consul", "outbound|8080|v2-b|web.dc1.consul", "outbound|8080|v2|web.dc1.consul"]
    );
    let addresses = |r: &Resource| -> Vec<String> {
        let cla: ClusterLoadAssignment = decode(r);
        cla.endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .map(|e| match &e.host_identifier {
                Some(HostIdentifier::Endpoint(ep)) => match &ep.address.as_ref().unwrap().address {
                    Some(AddressKind::SocketAddress(sa)) => match sa.port_specifier {
                        Some(PortSpecifier::PortValue(p)) => format!("{}:{p}", sa.address),
                        _ => unreachable!(),
                    },
                    _ => unreachable!(),
                },
                _ => unreachable!(),
            })
            .collect()
    };
    let by_cluster: BTreeMap<&str, Vec<String>> =
        out.load_assignments.iter().map(|r| (&*r.name, addresses(r))).collect();
    assert_eq!(by_cluster["outbound|8080|v1|web.dc1.consul"], ["10.0.0.1:8080"]);
    assert_eq!(by_cluster["outbound|8080|v2|web.dc1.consul"], ["10.0.0.2:8080", "10.0.0.3:8080"]);
    assert_eq!(by_cluster["outbound|8080|v2-b|web.dc1.consul"], ["10.0.0.3:8080"]);

    let clusters: BTreeMap<&str, Cluster> = out.clusters.iter().map(|r| (&*r.name, decode(r))).collect();
    let cla: BTreeMap<&str, ClusterLoadAssignment> =
        out.load_assignments.iter().map(|r| (&*r.name, decode(r))).collect();
    insta::assert_debug_snapshot!("subset_clusters", clusters);
    insta::assert_debug_snapshot!("subset_load_assignments", cla);
    insta::assert_debug_snapshot!("subset_routes", vhost(&out, "http.10080", "web.example.com").routes);
}

#[test]
fn subset_cluster_keeps_the_service_cluster_options() {
    // api is gRPC: its cluster speaks HTTP/2 upstream, and so must its subsets.
    let dr = obj("DestinationRule", "default", "api", json!({"host": "api.dc1.consul", "subsets": [{"name": "all"}]}));
    let out = run(&[
        http_gateway(),
        dr,
        vs(
            "api",
            &["api.example.com"],
            json!([{"route": [{"destination": {"host": "api.dc1.consul", "subset": "all"}}]}]),
        ),
    ]);
    let base: Cluster = decode(&envoy::clusters(&services()["api.dc1.consul"])[0]);
    let mut subset: Cluster = decode(&out.clusters[0]);
    assert_eq!(subset.name, "outbound|9090|all|api.dc1.consul");
    subset.name = base.name.clone();
    assert_eq!(subset, base);
    let cla: ClusterLoadAssignment = decode(&out.load_assignments[0]);
    assert_eq!(cla.endpoints[0].lb_endpoints.len(), 1);
}

#[test]
fn rewrite_uri_and_authority() {
    let out = run(&[
        http_gateway(),
        vs(
            "rw",
            &["rw.example.com"],
            json!([{"match": [{"uri": {"prefix": "/api/"}}], "rewrite": {"uri": "/", "authority": "web.internal"},
                    "route": [dest("web.dc1.consul", 8080)]}]),
        ),
    ]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    insta::assert_debug_snapshot!(vhost(&out, "http.10080", "rw.example.com").routes);
}

#[test]
fn ignore_uri_case_makes_the_match_case_insensitive() {
    let out = run(&[
        http_gateway(),
        vs(
            "ci",
            &["ci.example.com"],
            json!([{"match": [{"uri": {"prefix": "/Docs"}, "ignoreUriCase": true}, {"uri": {"exact": "/Exact"}}],
                    "route": [dest("web.dc1.consul", 8080)]}]),
        ),
    ]);
    let matches: Vec<_> =
        vhost(&out, "http.10080", "ci.example.com").routes.into_iter().map(|r| r.r#match.unwrap()).collect();
    assert_eq!(matches[0].case_sensitive.map(|b| b.value), Some(false));
    assert_eq!(matches[1].case_sensitive, None);
    insta::assert_debug_snapshot!(matches);
}

#[test]
fn destination_without_cluster_answers_503_and_warns() {
    let mut web = dest("web.dc1.consul", 8080);
    web["weight"] = json!(80);
    let mut k8s = dest("legacy.default.svc.cluster.local", 80);
    k8s["weight"] = json!(20);
    let out = run(&[
        http_gateway(),
        vs(
            "mixed",
            &["mixed.example.com"],
            json!([
                {"name": "k8s", "match": [{"uri": {"prefix": "/legacy"}}], "route": [dest("legacy.default.svc.cluster.local", 80)]},
                {"name": "wrong-port", "match": [{"uri": {"prefix": "/port"}}], "route": [dest("web.dc1.consul", 9999)]},
                {"name": "subset", "match": [{"uri": {"prefix": "/subset"}}],
                 "route": [{"destination": {"host": "web.dc1.consul", "subset": "nope"}}]},
                {"name": "split", "route": [web, k8s]}
            ]),
        ),
    ]);
    let routes = vhost(&out, "http.10080", "mixed.example.com").routes;
    let actions: Vec<String> = routes
        .iter()
        .map(|r| match r.action.as_ref().unwrap() {
            route::Action::DirectResponse(d) => format!("{}: direct {}", r.name, d.status),
            route::Action::Route(ra) => format!("{}: {:?}", r.name, ra.cluster_specifier.as_ref().unwrap()),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        actions,
        [
            "k8s: direct 503",
            "wrong-port: direct 503",
            "subset: direct 503",
            "split: Cluster(\"outbound|8080||web.dc1.consul\")"
        ]
    );
    assert!(out.clusters.is_empty());
    insta::assert_json_snapshot!(out.warnings);
}

#[test]
fn missing_port_uses_the_only_port() {
    let out = run(&[
        http_gateway(),
        vs("np", &["np.example.com"], json!([{"route": [{"destination": {"host": "web.dc1.consul"}}]}])),
    ]);
    let routes = vhost(&out, "http.10080", "np.example.com").routes;
    match routes[0].action.as_ref().unwrap() {
        route::Action::Route(ra) => {
            assert_eq!(ra.cluster_specifier, Some(ClusterSpecifier::Cluster("outbound|8080||web.dc1.consul".into())))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn https_listener_with_a_known_secret() {
    let objects = [
        https_gateway(&["web.example.com", "*.shop.example.com"], "web-cert"),
        vs("web", &["web.example.com", "a.shop.example.com"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
    ];
    let secrets = [tls("other", "web-cert"), tls(GW_NS, "web-cert")];
    let out = envoy_gateway(&objects, &lookup(services()), &secrets, &[], &opts());
    assert_routes_resolve(&out);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let names: Vec<&str> = out.listeners.iter().map(|r| &*r.name).collect();
    assert_eq!(names, ["http.10080", "https.10443"]);
    let https = route_config(&out, "https.10443");
    let hosts: Vec<&str> = https.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(hosts, ["a.shop.example.com", "web.example.com"]);
    insta::assert_debug_snapshot!(view_listener(&out.listeners[1]));
    // The listener names the Secret of the Gateway's namespace; only that
    // Secret (served over SDS to authenticated clients) carries the key,
    // and nothing that could be logged does.
    assert!(!format!("{secrets:?}").contains("TESTKEY"));
    let has_key = |r: &Resource| r.body.value().windows(KEY.len()).any(|w| w == KEY.as_bytes());
    assert!(!out.listeners.iter().any(has_key), "a key in a listener");
    let names: Vec<&str> = out.secrets.iter().map(|r| &*r.name).collect();
    assert_eq!(names, [format!("{GW_NS}/web-cert")]);
    assert!(has_key(&out.secrets[0]), "the key is in the SDS Secret");
    let secret: envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret = decode(&out.secrets[0]);
    assert_eq!(secret.name, format!("{GW_NS}/web-cert"));
    assert!(!texts(&out.warnings).join("\n").contains("TESTKEY"));
}

#[test]
fn https_listener_sni_names_are_not_claimed_twice() {
    let second = obj(
        "Gateway",
        GW_NS,
        "gw-tls-2",
        json!({"servers": [{"port": {"number": 443, "protocol": "HTTPS", "name": "https"},
            "hosts": ["web.example.com", "b.example.com"], "tls": {"mode": "SIMPLE", "credentialName": "higress-system/b-cert"}}]}),
    );
    let objects = [https_gateway(&["web.example.com"], "web-cert"), second];
    let out =
        envoy_gateway(&objects, &lookup(services()), &[tls(GW_NS, "web-cert"), tls(GW_NS, "b-cert")], &[], &opts());
    let listener = view_listener(out.listeners.iter().find(|l| &*l.name == "https.10443").unwrap()).listener;
    let sni: Vec<Vec<String>> =
        listener.filter_chains.iter().map(|c| c.filter_chain_match.clone().unwrap().server_names).collect();
    assert_eq!(sni, [vec!["web.example.com".to_string()], vec!["b.example.com".to_string()]]);
    assert_eq!(
        texts(&out.warnings),
        [
            "Gateway higress-system/gw-tls-2 servers[0]: SNI web.example.com already served by an earlier server; left out of this one"
        ]
    );
}

#[test]
fn https_server_with_a_missing_secret_gets_no_chain() {
    let objects = [
        https_gateway(&["web.example.com"], "missing-cert"),
        vs("web", &["web.example.com"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
    ];
    let out = envoy_gateway(&objects, &lookup(services()), &[tls(GW_NS, "web-cert")], &[], &opts());
    let names: Vec<&str> = out.listeners.iter().map(|r| &*r.name).collect();
    assert_eq!(names, ["http.10080"]);
    assert_eq!(out.routes.len(), 1);
    // Plain HTTP still serves the host.
    assert_eq!(vhost(&out, "http.10080", "web.example.com").routes.len(), 1);
    insta::assert_json_snapshot!(out.warnings);
}

#[test]
fn unservable_entries_warn_and_the_rest_go() {
    let objects = [
        http_gateway(),
        obj(
            "VirtualService",
            "default",
            "odd",
            json!({"hosts": ["z.example.com"], "gateways": ["gw.higress-system", "higress-system/gw"],
            "http": [{"name": "empty", "route": []}, {"route": [dest("web.dc1.consul", 8080)]}]}),
        ),
        vs("good", &["good.example.com"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
    ];
    let out = run(&objects);
    assert_eq!(vhost(&out, "http.10080", "good.example.com").routes.len(), 1);
    assert_eq!(vhost(&out, "http.10080", "z.example.com").routes.len(), 1);
    assert_eq!(
        texts(&out.warnings),
        [
            "VirtualService default/odd: gateway default/gw.higress-system not found",
            "VirtualService default/odd: http[0] (empty): no route; left out",
        ]
    );
    assert!(out.warnings.iter().all(|w| w.reason == crate::translate::Reason::Unservable));
}

#[test]
fn virtual_services_on_one_host_merge_and_hosts_follow_the_servers() {
    let gw = obj(
        "Gateway",
        GW_NS,
        "gw",
        json!({"servers": [
            {"port": {"number": 80, "protocol": "HTTP"}, "hosts": ["*.example.com", "default/only-default.org"],
             "tls": {"httpsRedirect": true}},
            {"port": {"number": 8080, "protocol": "HTTP"}, "hosts": ["other/*"]}
        ]}),
    );
    let objects = [
        gw,
        vs(
            "b",
            &["a.example.com"],
            json!([{"match": [{"uri": {"prefix": "/b"}}], "route": [dest("web.dc1.consul", 8080)]}]),
        ),
        vs(
            "a",
            &["A.example.com", "*", "only-default.org"],
            json!([{"match": [{"uri": {"prefix": "/a"}}], "route": [dest("api.dc1.consul", 9090)]}]),
        ),
        vs("c", &["not-served.org"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
    ];
    let out = run(&objects);
    let rc = route_config(&out, "http.10080");
    let summary: Vec<(String, Vec<String>, Vec<String>, i32)> = rc
        .virtual_hosts
        .iter()
        .map(|v| {
            let prefixes = v
                .routes
                .iter()
                .map(|r| match r.r#match.as_ref().unwrap().path_specifier.as_ref().unwrap() {
                    PathSpecifier::Prefix(p) => p.clone(),
                    other => format!("{other:?}"),
                })
                .collect();
            (v.name.clone(), v.domains.clone(), prefixes, v.require_tls)
        })
        .collect();
    insta::assert_debug_snapshot!(summary);
    assert!(rc.ignore_port_in_host_matching);
    assert_eq!(
        texts(&out.warnings),
        ["VirtualService default/c: no host matches a served server of its gateways; not routed"]
    );
}

#[test]
fn listener_rds_names_match_route_configurations() {
    let objects = [
        https_gateway(&["web.example.com"], "web-cert"),
        vs("web", &["web.example.com"], json!([{"route": [dest("web.dc1.consul", 8080)]}])),
    ];
    let o = GatewayOptions { http_ports: vec![10080, 80, 10080], https_port: 10443 };
    let out = envoy_gateway(&objects, &lookup(services()), &[tls(GW_NS, "web-cert")], &[], &o);
    let route_names: Vec<&str> = out.routes.iter().map(|r| &*r.name).collect();
    assert_eq!(route_names, ["http.10080", "http.80", "https.10443"]);
    for r in &out.listeners {
        assert_eq!(r.body.type_url(), envoy::LISTENER_TYPE);
        let listener: Listener = decode(r);
        assert_eq!(listener.name, *r.name);
        assert!(!listener.filter_chains.is_empty());
        for chain in &listener.filter_chains {
            let [f] = chain.filters.as_slice() else { panic!("one filter expected") };
            assert_eq!(f.name, "envoy.filters.network.http_connection_manager");
            let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else { panic!("typed_config expected") };
            assert_eq!(
                any.type_url,
                "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
            );
            let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
            let Some(RouteSpecifier::Rds(rds)) = &hcm.route_specifier else { panic!("RDS expected") };
            assert_eq!(rds.route_config_name, *r.name);
            assert!(route_names.contains(&rds.route_config_name.as_str()));
            let rc = route_config(&out, &rds.route_config_name);
            assert_eq!(rc.name, rds.route_config_name);
            // RBAC, CORS, the local rate limit and custom responses, which
            // act only on routes with a policy for them, then the router.
            let [rbac, cors, limit, custom, router] = hcm.http_filters.as_slice() else {
                panic!("five http filters expected")
            };
            let Some(http_filter::ConfigType::TypedConfig(any)) = &custom.config_type else { panic!() };
            assert_eq!(
                any.type_url,
                "type.googleapis.com/envoy.extensions.filters.http.custom_response.v3.CustomResponse"
            );
            assert!(any.value.is_empty(), "the listener's custom response policy replaces nothing");
            let Some(http_filter::ConfigType::TypedConfig(any)) = &limit.config_type else { panic!() };
            assert_eq!(
                any.type_url,
                "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
            );
            let Some(http_filter::ConfigType::TypedConfig(any)) = &rbac.config_type else { panic!() };
            assert_eq!(any.type_url, "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC");
            assert!(
                RbacFilter::decode(any.value.as_slice()).unwrap().rules.is_none(),
                "the listener's RBAC enforces nothing"
            );
            let Some(http_filter::ConfigType::TypedConfig(any)) = &cors.config_type else { panic!() };
            assert_eq!(any.type_url, "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors");
            let Some(http_filter::ConfigType::TypedConfig(any)) = &router.config_type else { panic!() };
            assert_eq!(any.type_url, "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router");
        }
    }
    for r in &out.routes {
        assert_eq!(r.body.type_url(), envoy::ROUTE_TYPE);
    }
}

#[test]
fn same_input_same_versions_whatever_the_order() {
    let dr = obj(
        "DestinationRule",
        "default",
        "web",
        json!({"host": "web.dc1.consul", "subsets": [
        {"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
    );
    let sub = |s: &str, w: u32| json!({"destination": {"host": "web.dc1.consul", "subset": s}, "weight": w});
    let mut objects = vec![
        https_gateway(&["web.example.com", "api.example.com"], "web-cert"),
        dr,
        vs("web", &["web.example.com"], json!([{"route": [sub("v1", 50), sub("v2", 50)]}])),
        vs(
            "api",
            &["api.example.com"],
            json!([{"match": [{"uri": {"regex": "/x.*"}}], "route": [dest("api.dc1.consul", 9090)]}]),
        ),
    ];
    let secrets = [tls(GW_NS, "web-cert")];
    let versions = |out: &GatewayOutput| -> Vec<(String, String)> {
        [&out.listeners, &out.routes, &out.clusters, &out.load_assignments]
            .into_iter()
            .flatten()
            .map(|r| (r.name.to_string(), r.version.to_string()))
            .collect()
    };
    let first = gateway(&objects, &secrets);
    objects.reverse();
    let second = gateway(&objects, &secrets);
    assert_eq!(versions(&first), versions(&second));
    assert_eq!(first.warnings, second.warnings);
    assert_eq!(versions(&first).len(), 2 + 2 + 2 + 2);
    for (a, b) in [&first.listeners, &first.routes]
        .into_iter()
        .flatten()
        .zip([&second.listeners, &second.routes].into_iter().flatten())
    {
        assert_eq!(a.body, b.body);
    }
}

#[test]
fn tls_debug_never_shows_the_key() {
    let t = tls(GW_NS, "web-cert");
    let shown = format!("{t:?}");
    assert!(!shown.contains("TESTKEY"), "{shown}");
    assert!(shown.contains("web-cert"));
}

#[test]
fn header_matches_become_string_matchers_in_order() {
    use envoy_types::pb::envoy::config::route::v3::header_matcher::HeaderMatchSpecifier;
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
    let out = run(&[
        http_gateway(),
        vs(
            "canary",
            &["shop.example.com"],
            json!([
                {"name": "by-header", "match": [{"uri": {"prefix": "/"}, "headers": {"x-canary": {"exact": "always"}, "x-user": {"regex": ".*(?:bob).*"}}}], "route": [dest("api.dc1.consul", 9090)]},
                {"name": "by-cookie", "match": [{"uri": {"prefix": "/"}, "headers": {"cookie": {"regex": "(.*;\\s*)?beta=always(;.*)?"}}}], "route": [dest("api.dc1.consul", 9090)]},
                {"name": "main", "match": [{"uri": {"prefix": "/"}}], "route": [dest("web.dc1.consul", 8080)]}
            ]),
        ),
    ]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let routes = vhost(&out, "http.10080", "shop.example.com").routes;
    let seen: Vec<(String, Vec<(String, String)>)> = routes
        .iter()
        .map(|r| {
            let headers = r.r#match.as_ref().unwrap().headers.iter().map(|h| {
                let Some(HeaderMatchSpecifier::StringMatch(sm)) = &h.header_match_specifier else {
                    panic!("not a string_match: {h:?}")
                };
                let value = match sm.match_pattern.as_ref().unwrap() {
                    MatchPattern::Exact(v) => format!("exact {v}"),
                    MatchPattern::SafeRegex(re) => format!("regex {}", re.regex),
                    other => panic!("unexpected {other:?}"),
                };
                (h.name.clone(), value)
            });
            (r.name.clone(), headers.collect())
        })
        .collect();
    let owned = |v: &[(&str, &str)]| v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
    assert_eq!(
        seen,
        [
            ("by-header".to_owned(), owned(&[("x-canary", "exact always"), ("x-user", "regex .*(?:bob).*")])),
            ("by-cookie".to_owned(), owned(&[("cookie", r"regex (.*;\s*)?beta=always(;.*)?")])),
            ("main".to_owned(), vec![]),
        ]
    );
}

#[test]
fn route_policy_redirects_timeouts_retries_headers_and_cors() {
    use envoy_types::pb::envoy::config::route::v3::redirect_action::{
        PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier,
    };
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    let out = run(&[
        http_gateway(),
        vs(
            "policy",
            &["policy.example.com"],
            json!([
                {"name": "ssl", "match": [{"uri": {"prefix": "/a/"}, "scheme": {"exact": "http"}}],
                 "redirect": {"scheme": "https", "redirectCode": 308}},
                {"name": "moved", "match": [{"uri": {"exact": "/old"}}],
                 "redirect": {"uri": "/new", "authority": "new.example.com", "scheme": "https", "redirectCode": 302}},
                {"name": "odd", "match": [{"uri": {"exact": "/odd"}}], "redirect": {"uri": "/x", "redirectCode": 305}},
                {"name": "main", "match": [{"uri": {"prefix": "/a/"}}], "route": [dest("web.dc1.consul", 8080)],
                 "timeout": "5s",
                 "retries": {"attempts": 2, "perTryTimeout": "0.5s", "retryOn": "5xx,retriable-status-codes,502"},
                 "headers": {"request": {"set": {"x-a": "1"}, "add": {"x-b": "2"}, "remove": ["x-c"]},
                             "response": {"set": {"x-d": "4"}, "remove": ["server"]}},
                 "corsPolicy": {"allowOrigins": [{"exact": "https://app.example.com"}, {"regex": "https://[^/]+\\.example\\.org"}],
                                "allowMethods": ["GET", "POST"], "allowHeaders": ["x-token"], "exposeHeaders": ["x-id"],
                                "maxAge": "60s", "allowCredentials": false}},
                {"name": "off", "match": [{"uri": {"exact": "/off"}}], "route": [dest("web.dc1.consul", 8080)],
                 "retries": {"attempts": 0}}
            ]),
        ),
    ]);
    assert_eq!(
        texts(&out.warnings),
        ["VirtualService default/policy: http[2] (odd): redirect code 305 not supported; 301 sent"]
    );
    let routes = vhost(&out, "http.10080", "policy.example.com").routes;
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["ssl", "moved", "odd", "main", "off"]);

    let Some(route::Action::Redirect(ssl)) = &routes[0].action else { panic!("{:?}", routes[0]) };
    assert_eq!(ssl.scheme_rewrite_specifier, Some(SchemeRewriteSpecifier::SchemeRedirect("https".into())));
    assert_eq!(ssl.response_code, RedirectResponseCode::PermanentRedirect as i32);
    let scheme = &routes[0].r#match.as_ref().unwrap().headers;
    assert_eq!(scheme.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(), [":scheme"]);
    let Some(route::Action::Redirect(moved)) = &routes[1].action else { panic!() };
    assert_eq!(
        (moved.host_redirect.as_str(), &moved.path_rewrite_specifier, moved.response_code),
        (
            "new.example.com",
            &Some(PathRewriteSpecifier::PathRedirect("/new".into())),
            RedirectResponseCode::Found as i32
        )
    );

    let main = &routes[3];
    let Some(route::Action::Route(ra)) = &main.action else { panic!() };
    assert_eq!(ra.timeout.as_ref().map(|d| (d.seconds, d.nanos)), Some((5, 0)));
    let retry = ra.retry_policy.as_ref().unwrap();
    assert_eq!(
        (retry.retry_on.as_str(), retry.num_retries.as_ref().map(|n| n.value), retry.retriable_status_codes.as_slice()),
        ("5xx,retriable-status-codes", Some(2), &[502][..])
    );
    assert_eq!(retry.per_try_timeout.as_ref().map(|d| (d.seconds, d.nanos)), Some((0, 500_000_000)));
    let header = |o: &envoy_types::pb::envoy::config::core::v3::HeaderValueOption| {
        let h = o.header.as_ref().unwrap();
        (h.key.clone(), h.value.clone(), o.append_action)
    };
    assert_eq!(
        main.request_headers_to_add.iter().map(header).collect::<Vec<_>>(),
        [("x-a".to_owned(), "1".to_owned(), 2), ("x-b".to_owned(), "2".to_owned(), 0)]
    );
    assert_eq!(
        (main.request_headers_to_remove.as_slice(), main.response_headers_to_remove.as_slice()),
        (&["x-c".to_owned()][..], &["server".to_owned()][..])
    );
    assert_eq!(
        main.response_headers_to_add.iter().map(header).collect::<Vec<_>>(),
        [("x-d".to_owned(), "4".to_owned(), 2)]
    );
    let any = &main.typed_per_filter_config["envoy.filters.http.cors"];
    let cors = CorsPolicy::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        (cors.allow_methods.as_str(), cors.allow_headers.as_str(), cors.expose_headers.as_str(), cors.max_age.as_str()),
        ("GET,POST", "x-token", "x-id", "60")
    );
    assert_eq!(
        (cors.allow_origin_string_match.len(), cors.allow_credentials.as_ref().map(|b| b.value)),
        (2, Some(false))
    );

    let Some(route::Action::Route(off)) = &routes[4].action else { panic!() };
    assert_eq!(off.retry_policy, None);
    // No timeout: none at all, as Pilot writes it, not Envoy's 15 s.
    assert_eq!(off.timeout.as_ref().map(|d| (d.seconds, d.nanos)), Some((0, 0)));
}

#[test]
fn destination_headers_go_on_the_weighted_cluster_or_the_route() {
    let side = |s: &str| json!({"response": {"set": {"x-side": s}}});
    let out = run(&[
        http_gateway(),
        vs(
            "split",
            &["split.example.com"],
            json!([
                {"name": "split", "match": [{"uri": {"prefix": "/"}}],
                 "route": [{"destination": {"host": "web.dc1.consul", "port": {"number": 8080}}, "weight": 75, "headers": side("main")},
                           {"destination": {"host": "api.dc1.consul", "port": {"number": 9090}}, "weight": 25, "headers": side("canary")}]},
                {"name": "one", "match": [{"uri": {"exact": "/one"}}],
                 "headers": {"response": {"set": {"x-route": "1"}}},
                 "route": [{"destination": {"host": "web.dc1.consul", "port": {"number": 8080}}, "headers": side("only")}]}
            ]),
        ),
    ]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let routes = vhost(&out, "http.10080", "split.example.com").routes;
    let value =
        |o: &envoy_types::pb::envoy::config::core::v3::HeaderValueOption| o.header.as_ref().unwrap().value.clone();
    let one = routes.iter().find(|r| r.name == "one").unwrap();
    assert_eq!(one.response_headers_to_add.iter().map(value).collect::<Vec<_>>(), ["1", "only"]);
    let split = routes.iter().find(|r| r.name == "split").unwrap();
    assert!(split.response_headers_to_add.is_empty());
    let Some(route::Action::Route(ra)) = &split.action else { panic!() };
    let Some(ClusterSpecifier::WeightedClusters(wc)) = &ra.cluster_specifier else { panic!("{ra:?}") };
    let sides: Vec<Vec<String>> =
        wc.clusters.iter().map(|c| c.response_headers_to_add.iter().map(value).collect()).collect();
    assert_eq!(sides, [["main"], ["canary"]]);
}

#[test]
fn mirror_is_a_request_mirror_policy_with_its_share_per_million() {
    let out = run(&[
        http_gateway(),
        vs(
            "mirrored",
            &["m.example.com"],
            json!([
                {"name": "some", "match": [{"uri": {"prefix": "/some"}}], "route": [dest("web.dc1.consul", 8080)],
                 "mirror": {"host": "api.dc1.consul", "port": {"number": 9090}}, "mirrorPercentage": {"value": 25.0}},
                {"name": "all", "match": [{"uri": {"prefix": "/all"}}], "route": [dest("web.dc1.consul", 8080)],
                 "mirror": {"host": "api.dc1.consul"}},
                {"name": "gone", "route": [dest("web.dc1.consul", 8080)], "mirror": {"host": "gone.dc1.consul"}}
            ]),
        ),
    ]);
    assert_routes_resolve(&out);
    let routes = vhost(&out, "http.10080", "m.example.com").routes;
    let mirrors = |name: &str| {
        let r = routes.iter().find(|r| r.name == name).unwrap();
        let Some(route::Action::Route(ra)) = &r.action else { panic!("{r:?}") };
        ra.request_mirror_policies
            .iter()
            .map(|m| {
                (
                    m.cluster.clone(),
                    m.runtime_fraction.as_ref().and_then(|f| f.default_value).map(|v| (v.numerator, v.denominator)),
                )
            })
            .collect::<Vec<_>>()
    };
    let million = envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType::Million as i32;
    assert_eq!(mirrors("some"), [("outbound|9090||api.dc1.consul".to_owned(), Some((250_000, million)))]);
    assert_eq!(mirrors("all"), [("outbound|9090||api.dc1.consul".to_owned(), None)]);
    assert_eq!(mirrors("gone"), []);
    assert_eq!(texts(&out.warnings).len(), 1, "{:?}", texts(&out.warnings));
    assert!(texts(&out.warnings)[0].contains("gone.dc1.consul") && texts(&out.warnings)[0].contains("mirror left out"));
}

use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as RbacFilter;

#[test]
fn source_ranges_are_the_rbac_filter_config_of_their_routes() {
    use crate::translate::model::{Cidr, SourceRanges, Spec};
    use envoy_types::pb::envoy::config::rbac::v3::principal::Identifier;
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::RbacPerRoute;
    let mut object = vs(
        "ranged",
        &["r.example.com"],
        json!([
            {"name": "both", "match": [{"uri": {"prefix": "/both"}}], "route": [dest("web.dc1.consul", 8080)]},
            {"name": "open", "route": [dest("web.dc1.consul", 8080)]}
        ]),
    );
    let Spec::VirtualService(spec) = &mut object.spec else { panic!() };
    let cidr = |a: &str, prefix_len| Cidr { address: a.parse().unwrap(), prefix_len };
    spec.http[0].source_ranges =
        Some(SourceRanges { allow: Some(vec![cidr("127.0.0.0", 8)]), deny: vec![cidr("127.0.0.2", 32)] });
    let out = run(&[http_gateway(), object]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let routes = vhost(&out, "http.10080", "r.example.com").routes;
    let rbac = |name: &str| {
        let r = routes.iter().find(|r| r.name == name).unwrap();
        r.typed_per_filter_config
            .get("envoy.filters.http.rbac")
            .map(|a| RbacPerRoute::decode(a.value.as_slice()).unwrap())
    };
    assert!(rbac("open").is_none());
    let rules = rbac("both").unwrap().rbac.unwrap().rules.unwrap();
    let policy = &rules.policies["source-range"];
    let Some(Identifier::AndIds(and)) = &policy.principals[0].identifier else { panic!("{policy:?}") };
    let text = |p: &envoy_types::pb::envoy::config::rbac::v3::Principal| format!("{:?}", p.identifier);
    assert!(text(&and.ids[0]).starts_with("Some(OrIds") && text(&and.ids[0]).contains("\"127.0.0.0\""), "{and:?}");
    assert!(text(&and.ids[1]).starts_with("Some(NotId") && text(&and.ids[1]).contains("\"127.0.0.2\""), "{and:?}");
    // Every listener runs the RBAC filter before CORS, the rate limit,
    // custom responses and the router.
    for l in &out.listeners {
        let view = view_listener(l);
        let names: Vec<&str> = view.hcm.iter().flat_map(|h| &h.http_filters).map(|f| f.name.as_str()).collect();
        let want = [
            "envoy.filters.http.rbac",
            "envoy.filters.http.cors",
            "envoy.filters.http.local_ratelimit",
            "envoy.filters.http.custom_response",
            "envoy.filters.http.router",
        ];
        assert_eq!(names[..5], want);
    }
}

/// Higress's local rate limit: the route's own token bucket, as per-route
/// config of the local rate limit filter, enabled and enforced for every
/// request, 429 when empty; a route without one carries none.
#[test]
fn a_local_rate_limit_is_the_filter_config_of_its_route() {
    use crate::translate::model::{LocalRateLimit, Spec};
    use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit as Envoy;
    let mut object = vs(
        "limited",
        &["l.example.com"],
        json!([
            {"name": "slow", "match": [{"uri": {"prefix": "/slow"}}], "route": [dest("web.dc1.consul", 8080)]},
            {"name": "open", "route": [dest("web.dc1.consul", 8080)]}
        ]),
    );
    let Spec::VirtualService(spec) = &mut object.spec else { panic!() };
    spec.http[0].local_rate_limit =
        Some(LocalRateLimit { max_tokens: 50, tokens_per_fill: 10, fill_interval_secs: 60 });
    let out = run(&[http_gateway(), object]);
    assert_eq!(texts(&out.warnings), Vec::<String>::new());
    let routes = vhost(&out, "http.10080", "l.example.com").routes;
    let limit = |name: &str| {
        let r = routes.iter().find(|r| r.name == name).unwrap();
        r.typed_per_filter_config
            .get("envoy.filters.http.local_ratelimit")
            .map(|a| Envoy::decode(a.value.as_slice()).unwrap())
    };
    assert!(limit("open").is_none());
    let l = limit("slow").expect("the limited route's config");
    let bucket = l.token_bucket.unwrap();
    assert_eq!(
        (bucket.max_tokens, bucket.tokens_per_fill.map(|n| n.value), bucket.fill_interval.map(|d| d.seconds)),
        (50, Some(10), Some(60))
    );
    assert_eq!(l.status.map(|s| s.code), Some(429));
    for fraction in [l.filter_enabled, l.filter_enforced] {
        let f = fraction.and_then(|f| f.default_value).unwrap();
        assert_eq!((f.numerator, f.denominator), (100, 0), "100 per hundred");
    }
}

#[path = "gateway/fallback_tests.rs"]
mod fallback_tests;

#[path = "gateway_mtls_tests.rs"]
mod mtls;

#[path = "gateway_client_cert_tests.rs"]
mod client_certs;
