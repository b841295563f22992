//! Envoy listeners of the standalone gateway: plain HTTP on each configured
//! port, and HTTPS with one SNI filter chain per served Gateway server. Every
//! listener takes its routes by RDS over ADS, from a RouteConfiguration of
//! the listener's own name.
//!
//! A chain names its certificate and takes it by SDS over ADS: a listener
//! carries no key material, and the xDS server hands the Secret (which does)
//! only to authenticated clients (see `xds::auth`).

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, SocketAddress, TransportSocket,
    address::Address as AddressKind, config_source::ConfigSourceSpecifier, data_source::Specifier,
    socket_address::PortSpecifier, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::custom_response::v3::CustomResponse;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::CodecType,
    http_connection_manager::RouteSpecifier, http_filter,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, Secret, TlsCertificate,
    common_tls_context::ValidationContextType, secret,
};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::util::pack_any;

use super::fallback::CUSTOM_RESPONSE_FILTER;
use super::policy::{CORS_FILTER, LOCAL_RATE_LIMIT_FILTER, RBAC_FILTER, inert_local_rate_limit};
use super::servers::{BoundServer, ClientCerts, Side};
use crate::model::TlsSecret as GatewayTls;
use crate::resources::Resource;
use crate::translate::warning::{Reason, Warning};

pub const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";
pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

pub(super) fn ads() -> ConfigSource {
    ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    }
}

fn any_address(port: u16) -> Address {
    Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: "0.0.0.0".into(),
            port_specifier: Some(PortSpecifier::PortValue(port.into())),
            ..Default::default()
        })),
    }
}

/// An HTTP connection manager routing by RDS `route_config`.
fn hcm(route_config: &str) -> Filter {
    let hcm = HttpConnectionManager {
        stat_prefix: route_config.to_string(),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: Some(ads()),
            route_config_name: route_config.to_string(),
        })),
        // RBAC, CORS and the rate limit act only on routes that carry a
        // policy for them;
        // RBAC first, so that a client it denies gets no CORS answer.
        http_filters: vec![
            HttpFilter {
                name: RBAC_FILTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(Rbac::default()))),
                ..Default::default()
            },
            HttpFilter {
                name: CORS_FILTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(Cors::default()))),
                ..Default::default()
            },
            // After CORS, so that a preflight it answers takes no token.
            // With no token bucket of its own it passes every request; a
            // route's config turns it on for that route.
            HttpFilter {
                name: LOCAL_RATE_LIMIT_FILTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(inert_local_rate_limit()))),
                ..Default::default()
            },
            // Last before the router, so that the answers it replaces are
            // the upstream's (or the router's own); with no policy of its
            // own it passes every answer, a route's config turns it on.
            HttpFilter {
                name: CUSTOM_RESPONSE_FILTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(CustomResponse::default()))),
                ..Default::default()
            },
            HttpFilter {
                name: ROUTER_FILTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(Router::default()))),
                ..Default::default()
            },
        ],
        // An edge proxy: the peer address is the client's, so X-Forwarded-For
        // is appended to rather than trusted.
        use_remote_address: Some(BoolValue { value: true }),
        ..Default::default()
    };
    Filter { name: HCM_FILTER.into(), config_type: Some(filter::ConfigType::TypedConfig(pack_any(hcm))) }
}

/// `http.{port}`: the listener and its RouteConfiguration share the name.
pub fn http_listener(name: &str, port: u16) -> Listener {
    Listener {
        name: name.to_string(),
        address: Some(any_address(port)),
        filter_chains: vec![FilterChain { filters: vec![hcm(name)], ..Default::default() }],
        ..Default::default()
    }
}

/// The SDS name of a certificate: its Secret's `namespace/name`.
pub fn secret_name(tls: &GatewayTls) -> String {
    format!("{}/{}", tls.namespace, tls.name)
}

/// The SDS Secret a chain names: the only resource that carries a key.
pub fn tls_secret(tls: &GatewayTls) -> Resource {
    let name = secret_name(tls);
    let body = Secret {
        name: name.clone(),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(&tls.cert_chain_pem)),
            private_key: Some(inline(tls.private_key_pem.expose())),
            ..Default::default()
        })),
    };
    Resource::new(name, pack_any(body))
}

/// The HTTPS filter chains, one per HTTPS server, in Gateway order, each
/// routing by the RouteConfiguration `route_config` names for its server.
/// An SNI name already taken by an earlier server is left out of later
/// ones, since Envoy rejects the whole listener when two chains match
/// alike. The Secrets the chains name are added to `secrets`, by name. A
/// server asking for client certificates without a CA to verify them
/// makes no chain.
pub fn https_chains(
    servers: &[BoundServer<'_>],
    route_config: impl Fn(&BoundServer<'_>) -> String,
    secrets: &mut BTreeMap<String, Resource>,
    warnings: &mut Vec<Warning>,
) -> Vec<FilterChain> {
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut catch_all_taken = false;
    let mut chains = Vec::new();
    for server in servers.iter().filter(|s| s.side == Side::Https && s.client_certs != ClientCerts::NoCa) {
        let Some(secret) = server.tls else { continue };
        // `*` means any SNI, including none: a chain without server_names.
        let catch_all = server.hosts.iter().any(|h| h.host == "*");
        let server_names: Vec<String> = if catch_all {
            if catch_all_taken {
                warnings.push(Warning::new(
                    format!("Gateway {}", server.label()),
                    Reason::Unservable,
                    "host * already served by an earlier server; left out",
                ));
                continue;
            }
            catch_all_taken = true;
            Vec::new()
        } else {
            let mut names = Vec::new();
            for h in &server.hosts {
                if taken.contains(&h.host) {
                    if !names.contains(&h.host) {
                        warnings.push(Warning::new(
                            format!("Gateway {}", server.label()),
                            Reason::Unservable,
                            format!("SNI {} already served by an earlier server; left out of this one", h.host),
                        ));
                    }
                } else {
                    taken.insert(h.host.clone());
                    names.push(h.host.clone());
                }
            }
            if names.is_empty() {
                continue;
            }
            names
        };
        let name = secret_name(secret);
        secrets.entry(name.clone()).or_insert_with(|| tls_secret(secret));
        // The CA is public: inline, as istiod's SDS would serve it.
        let (require, validation) = match server.client_certs {
            ClientCerts::Verified(ca) => (
                Some(BoolValue { value: true }),
                Some(ValidationContextType::ValidationContext(CertificateValidationContext {
                    trusted_ca: Some(inline(&ca.ca_cert_pem)),
                    ..Default::default()
                })),
            ),
            ClientCerts::NotAsked | ClientCerts::NoCa => (None, None),
        };
        let tls = DownstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                tls_certificate_sds_secret_configs: vec![SdsSecretConfig { name, sds_config: Some(ads()) }],
                alpn_protocols: vec!["h2".into(), "http/1.1".into()],
                validation_context_type: validation,
                ..Default::default()
            }),
            require_client_certificate: require,
            ..Default::default()
        };
        chains.push(FilterChain {
            name: server.label(),
            filter_chain_match: Some(FilterChainMatch { server_names, ..Default::default() }),
            filters: vec![hcm(&route_config(server))],
            transport_socket: Some(TransportSocket {
                name: TLS_TRANSPORT_SOCKET.into(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(pack_any(tls))),
            }),
            ..Default::default()
        });
    }
    chains
}

pub(super) fn inline(pem: &str) -> DataSource {
    DataSource { specifier: Some(Specifier::InlineString(pem.to_string())), ..Default::default() }
}

/// `https.{port}`, reading SNI with the TLS inspector to pick a chain.
pub fn https_listener(name: &str, port: u16, filter_chains: Vec<FilterChain>) -> Listener {
    Listener {
        name: name.to_string(),
        address: Some(any_address(port)),
        listener_filters: vec![ListenerFilter {
            name: TLS_INSPECTOR.into(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(pack_any(TlsInspector::default()))),
            ..Default::default()
        }],
        filter_chains,
        ..Default::default()
    }
}
