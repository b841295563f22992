//! A proxy's Envoy resources for the standalone gateway over ADS: the proxy
//! cluster, the tunnel listener, and the endpoint a proxied service's EDS
//! cluster gets instead of its own.

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType, DnsLookupFamily},
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, SocketAddress, address::Address as AddressKind, socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy,
    tcp_proxy::{ClusterSpecifier, TunnelingConfig},
};
use envoy_types::pb::google::protobuf::Duration;
use envoy_types::util::pack_any;

use super::types::{CONNECT_TARGET, Proxy};

pub(super) const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
pub(super) const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
/// The tunnel listener binds loopback only: it is the gateway's own way out.
pub(super) const LOCAL: &str = "127.0.0.1";

fn socket(address: &str, port: u16) -> Address {
    Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port.into())),
            ..Default::default()
        })),
    }
}

fn one_endpoint(cluster_name: &str, address: &str, port: u16) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket(address, port)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The proxy server: STATIC for an IP, STRICT_DNS (IPv4, as Higress) for a
/// name, with the proxy's connect timeout.
pub fn proxy_cluster(proxy: &Proxy) -> Cluster {
    let kind = if proxy.is_static() { DiscoveryType::Static } else { DiscoveryType::StrictDns };
    let name = proxy.cluster_name();
    let timeout = proxy.connect_timeout;
    Cluster {
        load_assignment: Some(one_endpoint(&name, &proxy.server_address, proxy.server_port)),
        name,
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(kind as i32)),
        connect_timeout: Some(Duration { seconds: timeout.as_secs() as i64, nanos: timeout.subsec_nanos() as i32 }),
        dns_lookup_family: DnsLookupFamily::V4Only as i32,
        ..Default::default()
    }
}

/// `127.0.0.1:{listenerPort}`: TLS streams in, `CONNECT {SNI}:443` to the
/// proxy out, the bytes relayed untouched.
pub fn tunnel_listener(proxy: &Proxy) -> Listener {
    let tcp = TcpProxy {
        stat_prefix: format!("tcpproxy.{}", proxy.name),
        cluster_specifier: Some(ClusterSpecifier::Cluster(proxy.cluster_name())),
        tunneling_config: Some(TunnelingConfig { hostname: CONNECT_TARGET.into(), ..Default::default() }),
        ..Default::default()
    };
    Listener {
        name: proxy.listener_name(),
        address: Some(socket(LOCAL, proxy.listener_port)),
        // The SNI is only known once the ClientHello has been read.
        listener_filters: vec![ListenerFilter {
            name: TLS_INSPECTOR.into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(TlsInspector::default()))),
            ..Default::default()
        }],
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: TCP_PROXY.into(),
                config_type: Some(filter::ConfigType::TypedConfig(pack_any(tcp))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The one endpoint of a proxied service's cluster: the tunnel listener.
pub fn local_endpoint(cluster_name: &str, listener_port: u16) -> ClusterLoadAssignment {
    one_endpoint(cluster_name, LOCAL, listener_port)
}
