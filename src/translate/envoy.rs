//! Registry services → Envoy clusters and endpoint assignments.
//!
//! Cluster names follow Istio: `outbound|{port}|{subset}|{host}`. A
//! cluster is EDS over ADS, so an endpoint change is an EDS push alone;
//! a service whose endpoints are all DNS names (a Kubernetes `ExternalName`
//! Service) is a STRICT_DNS cluster instead, as Istio makes it, since EDS
//! takes IP addresses only.

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, OutlierDetection as EnvoyOutlierDetection,
    cluster::{ClusterDiscoveryType, DiscoveryType, DnsLookupFamily, EdsClusterConfig, LbPolicy},
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, Http2ProtocolOptions, SocketAddress, TransportSocket,
    address::Address as AddressKind, config_source::ConfigSourceSpecifier, socket_address::PortSpecifier,
    transport_socket::ConfigType,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, TlsParameters, UpstreamTlsContext,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig},
};
use envoy_types::pb::google::protobuf::{Duration, UInt32Value};
use envoy_types::util::pack_any;
use meshbridge_registries::{Protocol, Service, ServicePort, Tls};

use super::model::{LABEL_PRIORITY, LABEL_SERVICE_PORT, OutlierDetection};
use crate::resources::Resource;

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// SDS: certificates and private keys, served only to authenticated
/// clients (see `xds::auth`).
pub const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

/// Istio's outbound cluster name.
pub fn cluster_name(port: u16, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

/// One EDS cluster per service port.
pub fn clusters(svc: &Service) -> Vec<Resource> {
    clusters_with(svc, &[])
}

/// One EDS cluster per service port; a TLS one offers `ecdh_curves`
/// (McpBridge `ecdhCurves`; empty: Envoy's default curves).
pub fn clusters_with(svc: &Service, ecdh_curves: &[String]) -> Vec<Resource> {
    svc.ports.iter().map(|p| cluster(svc, p, ecdh_curves)).map(|c| Resource::new(c.name.clone(), pack_any(c))).collect()
}

/// Whether Envoy resolves the service's endpoints itself: every one is a
/// DNS name, none an IP address.
pub fn resolves_by_dns(svc: &Service) -> bool {
    !svc.endpoints.is_empty() && svc.endpoints.iter().all(|e| e.address.parse::<std::net::IpAddr>().is_err())
}

fn cluster(svc: &Service, port: &ServicePort, ecdh_curves: &[String]) -> Cluster {
    let mut cluster = Cluster {
        name: cluster_name(port.number, "", &svc.host),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig { eds_config: Some(ads()), service_name: String::new() }),
        connect_timeout: Some(Duration { seconds: 5, nanos: 0 }),
        lb_policy: LbPolicy::RoundRobin as i32,
        ..Default::default()
    };
    if resolves_by_dns(svc) {
        // Istio's DNS cluster: the names in the cluster itself, IPv4 first,
        // resolved again at Envoy's default rate.
        cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::StrictDns as i32));
        cluster.eds_cluster_config = None;
        cluster.load_assignment = Some(load_assignment(svc, port));
        cluster.dns_lookup_family = DnsLookupFamily::V4Preferred as i32;
    }
    if svc.endpoints.iter().any(|ep| ep.labels.contains_key(LABEL_PRIORITY)) {
        // Registry failover: a level whose instances fail is ejected and
        // its traffic goes on to the next, as istiod does with the
        // DestinationRule's outlierDetection. Set while the host's
        // registries have several priorities, even when one level has no
        // endpoint now, so that failing over is an EDS push alone.
        cluster.outlier_detection = Some(failover_outlier_detection());
    }
    let h2 = matches!(port.protocol, Protocol::Grpc | Protocol::Http2);
    if let Some(tls) = &svc.tls {
        cluster.transport_socket = Some(tls_socket(tls, h2, ecdh_curves));
    }
    if h2 {
        set_http2(&mut cluster);
    }
    cluster
}

/// [`OutlierDetection::for_failover`] as Envoy's.
fn failover_outlier_detection() -> EnvoyOutlierDetection {
    let o = OutlierDetection::for_failover();
    let duration = |d: std::time::Duration| Duration { seconds: d.as_secs() as i64, nanos: 0 };
    EnvoyOutlierDetection {
        consecutive_5xx: Some(UInt32Value { value: o.consecutive_5xx_errors }),
        interval: Some(duration(o.interval.0)),
        base_ejection_time: Some(duration(o.base_ejection_time.0)),
        max_ejection_percent: Some(UInt32Value { value: o.max_ejection_percent.unsigned_abs() }),
        ..Default::default()
    }
}

/// HTTP/2 to the endpoints (prior knowledge, or by ALPN over TLS).
pub fn set_http2(cluster: &mut Cluster) {
    let opts = HttpProtocolOptions {
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions::default())),
        })),
        ..Default::default()
    };
    cluster.typed_extension_protocol_options.insert(HTTP_PROTOCOL_OPTIONS.into(), pack_any(opts));
}

/// Whether the cluster speaks HTTP/2 to its endpoints.
pub fn is_http2(cluster: &Cluster) -> bool {
    cluster.typed_extension_protocol_options.contains_key(HTTP_PROTOCOL_OPTIONS)
}

/// TLS origination to the endpoints. HTTP/2 must be negotiated by ALPN over
/// TLS, and gRPC servers refuse a TLS connection that did not. No
/// validation context: the upstream's certificate is not checked.
pub fn tls_socket(tls: &Tls, h2: bool, ecdh_curves: &[String]) -> TransportSocket {
    let alpn_protocols = if h2 { vec!["h2".into()] } else { Vec::new() };
    let tls_params =
        (!ecdh_curves.is_empty()).then(|| TlsParameters { ecdh_curves: ecdh_curves.to_vec(), ..Default::default() });
    let common =
        (h2 || tls_params.is_some()).then(|| CommonTlsContext { alpn_protocols, tls_params, ..Default::default() });
    let context = UpstreamTlsContext {
        sni: tls.sni.clone().unwrap_or_default(),
        common_tls_context: common,
        ..Default::default()
    };
    TransportSocket { name: TLS_TRANSPORT_SOCKET.into(), config_type: Some(ConfigType::TypedConfig(pack_any(context))) }
}

/// One ClusterLoadAssignment per EDS cluster (none for a DNS one). Each
/// endpoint keeps its own port.
pub fn load_assignments(svc: &Service) -> Vec<Resource> {
    if resolves_by_dns(svc) {
        return Vec::new();
    }
    svc.ports
        .iter()
        .map(|p| {
            let cla = load_assignment(svc, p);
            Resource::new(cla.cluster_name.clone(), pack_any(cla))
        })
        .collect()
}

/// The priority levels of a service's endpoints, from [`LABEL_PRIORITY`]
/// (set when the host's registries have several priorities): the distinct
/// values, preferred (lowest) first. Empty: one level.
fn priority_levels(svc: &Service) -> Vec<u32> {
    let mut levels: Vec<u32> =
        svc.endpoints.iter().filter_map(|ep| ep.labels.get(LABEL_PRIORITY)?.parse().ok()).collect();
    levels.sort_unstable();
    levels.dedup();
    if levels.len() > 1 { levels } else { Vec::new() }
}

/// Envoy's priority of an endpoint: its level's index (Envoy wants them
/// from 0 without gaps).
fn priority_of(ep: &meshbridge_registries::Endpoint, levels: &[u32]) -> u32 {
    let value = ep.labels.get(LABEL_PRIORITY).and_then(|v| v.parse::<u32>().ok());
    let rank = value.and_then(|v| levels.iter().position(|l| *l == v)).unwrap_or(0);
    u32::try_from(rank).unwrap_or(u32::MAX)
}

/// The endpoints of `svc`'s cluster for port `number`, whether Envoy gets
/// them over EDS or in the cluster (DNS).
pub fn assignment(svc: &Service, number: u16) -> Option<ClusterLoadAssignment> {
    svc.ports.iter().find(|p| p.number == number).map(|p| load_assignment(svc, p))
}

fn load_assignment(svc: &Service, port: &ServicePort) -> ClusterLoadAssignment {
    let levels = priority_levels(svc);
    let mut by_priority: Vec<Vec<LbEndpoint>> = vec![Vec::new(); levels.len().max(1)];
    let number = port.number.to_string();
    let serves = |ep: &&meshbridge_registries::Endpoint| ep.labels.get(LABEL_SERVICE_PORT).is_none_or(|p| *p == number);
    for ep in svc.endpoints.iter().filter(serves) {
        let lb = LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(AddressKind::SocketAddress(SocketAddress {
                        address: ep.address.clone(),
                        port_specifier: Some(PortSpecifier::PortValue(ep.port.into())),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            load_balancing_weight: Some(UInt32Value { value: ep.weight.max(1) }),
            ..Default::default()
        };
        let at = usize::try_from(priority_of(ep, &levels)).unwrap_or(0).min(by_priority.len() - 1);
        by_priority[at].push(lb);
    }
    // A level left empty stays, so that the levels keep their numbers and
    // Envoy goes on to the next one.
    let endpoints = if svc.endpoints.is_empty() {
        Vec::new()
    } else {
        by_priority
            .into_iter()
            .enumerate()
            .map(|(priority, lb_endpoints)| LocalityLbEndpoints {
                lb_endpoints,
                priority: u32::try_from(priority).unwrap_or(u32::MAX),
                ..Default::default()
            })
            .collect()
    };
    ClusterLoadAssignment { cluster_name: cluster_name(port.number, "", &svc.host), endpoints, ..Default::default() }
}
