//! Proxies: listener port assignment, the Envoy resources and EnvoyFilters a
//! proxied service turns into, and bad proxies staying local.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter, listener_filter};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use meshbridge_registries::{Endpoint, Protocol, RegistryKind, Service, ServicePort, Tls};
use prost::Message;

use super::*;
use crate::cache::{CachedService, RegistryKey, View};
use crate::translate::model::Spec;
use crate::translate::{ConfigSet, Reason, build, config_set, envoy as envoy_res};

fn spec(name: &str, address: &str, listener_port: Option<u16>) -> ProxySpec {
    ProxySpec {
        name: name.into(),
        server_address: address.into(),
        server_port: 3128,
        listener_port,
        connect_timeout: None,
    }
}

fn ports(specs: &[ProxySpec], reserved: &[u16]) -> BTreeMap<String, Result<u16, PortError>> {
    listener_ports(specs, &reserved.iter().copied().collect())
}

#[test]
fn listener_ports_come_from_the_name_and_stay_put() {
    let specs =
        [spec("corp", "10.0.0.1", None), spec("edge", "10.0.0.2", None), spec("pinned", "10.0.0.3", Some(50100))];
    let got = ports(&specs, &[80, 443]);
    let corp = got["corp"].clone().unwrap();
    let edge = got["edge"].clone().unwrap();
    assert_eq!(got["pinned"], Ok(50100));
    assert!(LISTENER_PORTS.contains(&corp) && LISTENER_PORTS.contains(&edge), "{got:?}");
    assert_ne!(corp, edge);

    // Pure: the same specs in any order give the same ports (a restart
    // keeps them), and another proxy joining does not move them unless it
    // takes the very port.
    let mut reversed = specs.to_vec();
    reversed.reverse();
    assert_eq!(ports(&reversed, &[80, 443]), got);
    let more = [specs.to_vec(), vec![spec("third", "10.0.0.4", None)]].concat();
    let with_third = ports(&more, &[80, 443]);
    assert_eq!((&with_third["corp"], &with_third["edge"]), (&Ok(corp), &Ok(edge)));

    // A pinned port on the hashed one pushes the unpinned proxy to the next
    // free port, wrapping at the end of the range; reserved ports are skipped.
    let clash = [spec("corp", "10.0.0.1", None), spec("pin", "10.0.0.3", Some(corp))];
    let next = if corp == *LISTENER_PORTS.end() { *LISTENER_PORTS.start() } else { corp + 1 };
    assert_eq!(ports(&clash, &[]), BTreeMap::from([("corp".into(), Ok(next)), ("pin".into(), Ok(corp))]));
    assert_eq!(ports(&specs[..1], &[corp])["corp"], Ok(next));
}

#[test]
fn listener_port_errors_name_the_port_and_the_owner() {
    let specs =
        [spec("a", "10.0.0.1", Some(50001)), spec("b", "10.0.0.2", Some(50001)), spec("gw", "10.0.0.3", Some(80))];
    let got = ports(&specs, &[80]);
    assert_eq!(got["a"], Ok(50001));
    assert_eq!(got["b"], Err(PortError::Taken { port: 50001, owner: "a".into() }));
    assert_eq!(got["b"].clone().unwrap_err().to_string(), "50001 already used by proxy \"a\"");
    assert_eq!(got["gw"], Err(PortError::Reserved(80)));
    assert_eq!(got["gw"].clone().unwrap_err().to_string(), "80 is a gateway listener port");

    // Every port of the range taken: the unpinned proxy gets none.
    let reserved: Vec<u16> = LISTENER_PORTS.collect();
    assert_eq!(
        ports(&[spec("late", "10.0.0.1", None)], &reserved)["late"],
        Err(PortError::RangeFull { first: 50001, last: 50999 })
    );
    assert_eq!(
        PortError::RangeFull { first: 50001, last: 50999 }.to_string(),
        "unset, and no port in 50001..=50999 is free"
    );
}

fn service(host: &str, protocol: Protocol, port: u16, addrs: &[&str], sni: Option<Option<&str>>) -> Service {
    let name = format!("{}-{port}", protocol.as_str().to_lowercase());
    let eps = addrs
        .iter()
        .map(|a| Endpoint { address: a.to_string(), port, weight: 1, labels: Default::default() })
        .collect();
    let svc = Service::new(host, vec![ServicePort { number: port, protocol, name }], eps);
    match sni {
        Some(sni) => svc.with_tls(Tls { sni: sni.map(str::to_string) }),
        None => svc,
    }
}

fn view(services: Vec<(RegistryKey, Service)>) -> View {
    View {
        revision: 3,
        services: services
            .into_iter()
            .map(|(k, s)| (s.host.clone(), CachedService { registry: k, service: Arc::new(s) }))
            .collect(),
        also: Default::default(),
    }
}

fn dns(name: &str) -> RegistryKey {
    RegistryKey::new(RegistryKind::Dns, name)
}

/// `partner` (dns, https, SNI from its one host) through `corp` (an IP);
/// `ledger` (static, grpcs, `sni` set) through `edge` (a name, pinned port,
/// its own connect timeout); a plain Consul service beside them.
fn proxied_view() -> (View, Vec<ProxySpec>, BTreeMap<RegistryKey, String>) {
    let ledger_key = RegistryKey::new(RegistryKind::Static, "ledger");
    let consul = RegistryKey::new(RegistryKind::Consul, "c");
    let services = vec![
        (
            dns("partner"),
            service("partner.dns", Protocol::Https, 443, &["203.0.113.7"], Some(Some("api.partner.example"))),
        ),
        (
            ledger_key.clone(),
            service("ledger.static", Protocol::Grpc, 8443, &["198.51.100.2"], Some(Some("ledger.example"))),
        ),
        (consul, service("web.dc1.consul", Protocol::Http, 8080, &["10.0.0.1"], None)),
    ];
    let mut edge = spec("edge", "proxy.corp.example", Some(50200));
    edge.connect_timeout = Some(Duration::from_millis(500));
    let proxies = vec![spec("corp", "10.1.1.1", None), edge];
    let registry_proxies = BTreeMap::from([(dns("partner"), "corp".to_string()), (ledger_key, "edge".to_string())]);
    (view(services), proxies, registry_proxies)
}

fn translate_all(view: &View, proxies: &[ProxySpec], registry_proxies: BTreeMap<RegistryKey, String>) -> ConfigSet {
    let inputs = Inputs { proxies, registry_proxies, ..Inputs::default() };
    build(view, &inputs)
}

fn decoded<M: Message + Default>(set: &ConfigSet, type_url: &str, names: &[&str]) -> BTreeMap<String, M> {
    names.iter().map(|n| (n.to_string(), M::decode(set.envoy[type_url][*n].body.value()).unwrap())).collect()
}

#[test]
fn envoy_filters_for_pilot() {
    let (view, proxies, registry_proxies) = proxied_view();
    let set = translate_all(&view, &proxies, registry_proxies);
    assert!(set.warnings.is_empty(), "{:?}", set.warnings().collect::<Vec<_>>());
    let filters: Vec<_> = set.objects("EnvoyFilter").collect();
    insta::assert_json_snapshot!("envoy_filters", filters);
    // Every one fits Istio's schema and goes to Pilot.
    let served: Vec<&str> = set.mcp["networking.istio.io/EnvoyFilter"].keys().map(|n| &**n).collect();
    assert_eq!(
        served,
        [
            "higress-system/istio-autogenerated-k8s-ingress-proxy-corp",
            "higress-system/istio-autogenerated-k8s-ingress-proxy-edge",
            "higress-system/istio-autogenerated-k8s-ingress-service-proxy",
        ]
    );
    // The ServiceEntries and DestinationRules stay as they are: Pilot still
    // builds the service clusters, and the EnvoyFilter replaces them.
    assert_eq!(set.objects("ServiceEntry").count(), 3);
    assert_eq!(set.objects("DestinationRule").count(), 2);
}

#[test]
fn envoy_resources_for_the_standalone_gateway() {
    let (view, proxies, registry_proxies) = proxied_view();
    let set = translate_all(&view, &proxies, registry_proxies);
    let corp_port = listener_ports(&proxies, &[80, 443].into())["corp"].clone().unwrap();
    let proxy_clusters: BTreeMap<String, Cluster> =
        decoded(&set, envoy_res::CLUSTER_TYPE, &["outbound|3128||corp.proxy", "outbound|3128||edge.proxy"]);
    insta::assert_debug_snapshot!("proxy_clusters", proxy_clusters);
    let listeners: BTreeMap<String, Listener> = decoded(
        &set,
        envoy_res::LISTENER_TYPE,
        &["istio-autogenerated-proxy-listener-corp", "istio-autogenerated-proxy-listener-edge"],
    );
    // The listener with its typed configs decoded, so the snapshot reads.
    let readable: BTreeMap<&String, (String, Vec<&str>, Vec<TcpProxy>)> = listeners
        .iter()
        .map(|(name, l)| {
            let address = format!("{:?}", l.address.as_ref().and_then(|a| a.address.as_ref()));
            let listener_filters = l
                .listener_filters
                .iter()
                .map(|f| match &f.config_type {
                    Some(listener_filter::ConfigType::TypedConfig(any)) => any.type_url.as_str(),
                    other => panic!("{name}: {other:?}"),
                })
                .collect();
            let tcp = l.filter_chains[0]
                .filters
                .iter()
                .map(|f| match &f.config_type {
                    Some(filter::ConfigType::TypedConfig(any)) => {
                        assert_eq!(
                            any.type_url,
                            "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"
                        );
                        TcpProxy::decode(any.value.as_slice()).unwrap()
                    }
                    other => panic!("{name}: {other:?}"),
                })
                .collect();
            (name, (address, listener_filters, tcp))
        })
        .collect();
    insta::assert_debug_snapshot!("tunnel_listeners", readable);
    let endpoints: BTreeMap<String, ClusterLoadAssignment> = decoded(
        &set,
        envoy_res::ENDPOINT_TYPE,
        &["outbound|443||partner.dns", "outbound|8443||ledger.static", "outbound|8080||web.dc1.consul"],
    );
    insta::assert_debug_snapshot!("proxied_load_assignments", endpoints);
    let port_of = |cla: &ClusterLoadAssignment| format!("{:?}", cla.endpoints[0].lb_endpoints[0].host_identifier);
    assert!(port_of(&endpoints["outbound|443||partner.dns"]).contains(&format!("PortValue({corp_port})")));
    assert!(port_of(&endpoints["outbound|8443||ledger.static"]).contains("PortValue(50200)"));
    assert!(port_of(&endpoints["outbound|8080||web.dc1.consul"]).contains("10.0.0.1"), "unproxied: untouched");
}

#[test]
fn a_proxy_toggles_endpoints_only() {
    // Adding or removing proxyName leaves the service cluster (EDS, TLS,
    // SNI) as it was; only its endpoints move, so Envoy gets an EDS push.
    let (view, proxies, registry_proxies) = proxied_view();
    let on = translate_all(&view, &proxies, registry_proxies);
    let off = translate_all(&view, &proxies, BTreeMap::new());
    let cluster = "outbound|443||partner.dns";
    assert_eq!(on.envoy[envoy_res::CLUSTER_TYPE][cluster], off.envoy[envoy_res::CLUSTER_TYPE][cluster]);
    assert_ne!(on.envoy[envoy_res::ENDPOINT_TYPE][cluster], off.envoy[envoy_res::ENDPOINT_TYPE][cluster]);
    let direct = config_set(&view);
    assert_eq!(off.envoy[envoy_res::ENDPOINT_TYPE][cluster], direct.envoy[envoy_res::ENDPOINT_TYPE][cluster]);
    // The proxies themselves stay, as in Higress: they do not depend on use.
    assert!(off.envoy[envoy_res::LISTENER_TYPE].contains_key("istio-autogenerated-proxy-listener-corp"));
    assert!(!off.istio.values().any(|o| o.metadata.name.ends_with("service-proxy")));
}

#[test]
fn bad_proxies_and_unproxiable_services_are_routed_directly() {
    let consul = RegistryKey::new(RegistryKind::Consul, "c");
    let services = vec![
        (dns("good"), service("good.dns", Protocol::Https, 443, &["203.0.113.1"], Some(Some("good.example")))),
        (dns("badaddr"), service("badaddr.dns", Protocol::Https, 443, &["203.0.113.2"], Some(Some("b.example")))),
        (dns("gwport"), service("gwport.dns", Protocol::Https, 443, &["203.0.113.3"], Some(Some("g.example")))),
        (dns("ghost"), service("ghost.dns", Protocol::Https, 443, &["203.0.113.4"], Some(Some("h.example")))),
        (dns("plain"), service("plain.dns", Protocol::Http, 80, &["203.0.113.5"], None)),
        (dns("nosni"), service("nosni.dns", Protocol::Https, 443, &["203.0.113.6"], Some(None))),
        (consul.clone(), service("web.dc1.consul", Protocol::Https, 8443, &["10.0.0.1"], Some(Some("web")))),
    ];
    let proxies =
        vec![spec("ok", "10.1.1.1", None), spec("bad", "http://proxy", None), spec("gw", "10.1.1.2", Some(80))];
    let registry_proxies = BTreeMap::from([
        (dns("good"), "ok".to_string()),
        (dns("badaddr"), "bad".to_string()),
        (dns("gwport"), "gw".to_string()),
        (dns("ghost"), "nope".to_string()),
        (dns("plain"), "ok".to_string()),
        (dns("nosni"), "ok".to_string()),
        (consul, "ok".to_string()),
    ]);
    let view = view(services);
    let set = translate_all(&view, &proxies, registry_proxies);
    let warnings: Vec<String> = set.warnings().map(ToString::to_string).collect();
    assert!(set.warnings().all(|w| w.reason == Reason::ProxyUnusable));
    assert_eq!(
        warnings,
        [
            "proxy \"bad\": serverAddress: \"http://proxy\" is not an IP address or DNS name; its services are routed directly",
            "proxy \"gw\": listenerPort: 80 is a gateway listener port; its services are routed directly",
            "registry dns/badaddr: proxy \"bad\": not usable; routing badaddr.dns directly",
            "registry dns/ghost: proxy \"nope\": not found; routing ghost.dns directly",
            "registry dns/gwport: proxy \"gw\": not usable; routing gwport.dns directly",
            "registry dns/nosni: proxy \"ok\": no TLS server name to CONNECT to; set sni; routing nosni.dns directly",
            "registry dns/plain: proxy \"ok\": the tunnel carries TLS only; set protocol https or grpcs; routing plain.dns directly",
            "registry consul/c: proxy \"ok\": only dns and static registries can use a proxy; routing web.dc1.consul directly",
        ]
    );
    // Only the good proxy and the good service made it; everything else is
    // exactly what it would be without proxies.
    let direct = config_set(&view);
    let proxied = "outbound|443||good.dns";
    for r in direct.envoy[envoy_res::ENDPOINT_TYPE].iter() {
        let name = &*r.name;
        assert_eq!(name == proxied, set.envoy[envoy_res::ENDPOINT_TYPE][name] != **r, "{name}");
    }
    let listeners: Vec<&str> = set.envoy[envoy_res::LISTENER_TYPE].keys().map(|n| &**n).collect();
    assert_eq!(listeners, ["http.80", "istio-autogenerated-proxy-listener-ok"]);
    let filters: BTreeSet<&str> = set.objects("EnvoyFilter").map(|o| o.metadata.name.as_str()).collect();
    assert_eq!(
        filters,
        BTreeSet::from(["istio-autogenerated-k8s-ingress-proxy-ok", "istio-autogenerated-k8s-ingress-service-proxy"])
    );
    let service_filter = set.objects("EnvoyFilter").find(|o| o.metadata.name.ends_with("service-proxy")).unwrap();
    let Spec::EnvoyFilter(filter) = &service_filter.spec else { panic!("an EnvoyFilter") };
    assert_eq!(filter.config_patches.len(), 2, "REMOVE and ADD for good.dns");
}

#[test]
fn ecdh_curves_are_offered_by_tls_clusters_and_proxied_ones() {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;

    let (view, proxies, registry_proxies) = proxied_view();
    let curves = vec!["P-384".to_string(), "P-256".to_string()];
    let registry_ecdh_curves = BTreeMap::from([(dns("partner"), curves.clone())]);
    let inputs = Inputs { proxies: &proxies, registry_proxies, registry_ecdh_curves, ..Inputs::default() };
    let set = build(&view, &inputs);
    assert!(set.warnings.is_empty(), "{:?}", set.warnings().collect::<Vec<_>>());

    // Over ADS: the TLS context of partner's cluster, not of ledger's.
    let offered = |name: &str| {
        let cluster: Cluster = decoded(&set, envoy_res::CLUSTER_TYPE, &[name]).remove(name).unwrap();
        let Some(ConfigType::TypedConfig(any)) = cluster.transport_socket.unwrap().config_type else { panic!() };
        let ctx = UpstreamTlsContext::decode(any.value.as_slice()).unwrap();
        ctx.common_tls_context.and_then(|c| c.tls_params).map(|p| p.ecdh_curves).unwrap_or_default()
    };
    assert_eq!(offered("outbound|443||partner.dns"), curves);
    assert_eq!(offered("outbound|8443||ledger.static"), Vec::<String>::new());

    // To Pilot: the proxied cluster Higress's EnvoyFilter adds back.
    let filter = set.objects("EnvoyFilter").find(|o| o.metadata.name.ends_with("-service-proxy")).unwrap();
    let spec = filter.spec.to_json();
    let added: Vec<&serde_json::Value> = spec["configPatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["patch"]["operation"] == "ADD")
        .map(|p| &p["patch"]["value"])
        .collect();
    let partner = added.iter().find(|c| c["name"] == "outbound|443||partner.dns").unwrap();
    let tls = &partner["transport_socket"]["typed_config"]["common_tls_context"];
    assert_eq!(tls["tls_params"]["ecdh_curves"], serde_json::json!(["P-384", "P-256"]));
    let ledger = added.iter().find(|c| c["name"] == "outbound|8443||ledger.static").unwrap();
    let tls = &ledger["transport_socket"]["typed_config"]["common_tls_context"];
    assert_eq!((tls.get("tls_params"), &tls["alpn_protocols"]), (None, &serde_json::json!(["h2"])));
    // Still valid for Pilot.
    assert!(set.mcp["networking.istio.io/EnvoyFilter"].keys().any(|k| k.ends_with("-service-proxy")));
}
