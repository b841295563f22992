//! Route configurations encoded the same way every time.
//!
//! A route's `typed_per_filter_config` (CORS, RBAC, the local rate limit,
//! the custom response policy) is a protobuf map, which envoy-types holds
//! as a std `HashMap`: prost writes its entries in the map's iteration
//! order, which differs between two maps of the same entries. The bytes, and
//! so the content-hash version, of an unchanged route table would then
//! change from one translation to the next and differ between replicas: a
//! needless RDS push each time, and replicas that disagree. Here every such
//! map is written last in its message, in key order. Protobuf parsers
//! accept fields in any order, and map entries are plain `(key = 1,
//! value = 2)` messages on the map's field number, so the result decodes
//! to the same message.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use crate::translate::envoy::ROUTE_TYPE;

/// `RouteConfiguration.typed_per_filter_config`.
const ROUTE_CONFIGURATION_FILTER_CONFIGS: u32 = 16;
/// `RouteConfiguration.virtual_hosts`.
const ROUTE_CONFIGURATION_VIRTUAL_HOSTS: u32 = 2;
/// `VirtualHost.typed_per_filter_config`.
const VIRTUAL_HOST_FILTER_CONFIGS: u32 = 15;
/// `VirtualHost.routes`.
const VIRTUAL_HOST_ROUTES: u32 = 3;
/// `Route.typed_per_filter_config`.
const ROUTE_FILTER_CONFIGS: u32 = 13;

/// One map entry as protobuf writes it.
#[derive(Clone, PartialEq, Message)]
struct MapEntry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(message, optional, tag = "2")]
    value: Option<Any>,
}

/// `rc` packed as an `Any`, its per-filter config maps in key order.
pub(crate) fn route_configuration_any(mut rc: RouteConfiguration) -> Any {
    let hosts = std::mem::take(&mut rc.virtual_hosts);
    let configs = std::mem::take(&mut rc.typed_per_filter_config);
    let mut buf = rc.encode_to_vec();
    for host in hosts {
        prost::encoding::bytes::encode(ROUTE_CONFIGURATION_VIRTUAL_HOSTS, &virtual_host(host), &mut buf);
    }
    sorted_entries(ROUTE_CONFIGURATION_FILTER_CONFIGS, configs, &mut buf);
    Any { type_url: ROUTE_TYPE.into(), value: buf }
}

fn virtual_host(mut host: VirtualHost) -> Vec<u8> {
    let routes = std::mem::take(&mut host.routes);
    let configs = std::mem::take(&mut host.typed_per_filter_config);
    let mut buf = host.encode_to_vec();
    for route in routes {
        prost::encoding::bytes::encode(VIRTUAL_HOST_ROUTES, &self::route(route), &mut buf);
    }
    sorted_entries(VIRTUAL_HOST_FILTER_CONFIGS, configs, &mut buf);
    buf
}

fn route(mut route: Route) -> Vec<u8> {
    let configs = std::mem::take(&mut route.typed_per_filter_config);
    let mut buf = route.encode_to_vec();
    sorted_entries(ROUTE_FILTER_CONFIGS, configs, &mut buf);
    buf
}

fn sorted_entries(tag: u32, map: HashMap<String, Any>, buf: &mut Vec<u8>) {
    let mut entries: Vec<(String, Any)> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, value) in entries {
        prost::encoding::message::encode(tag, &MapEntry { key, value: Some(value) }, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str) -> Any {
        Any { type_url: format!("type.googleapis.com/{name}"), value: name.as_bytes().to_vec() }
    }

    /// A table whose route, host and table each carry four filter configs,
    /// put into a fresh map (a new `RandomState`) in the order given.
    fn table(order: &[&str]) -> RouteConfiguration {
        let map = || order.iter().map(|n| (n.to_string(), config(n))).collect::<HashMap<String, Any>>();
        let route = Route { name: "r".into(), typed_per_filter_config: map(), ..Default::default() };
        let other = Route { name: "s".into(), ..Default::default() };
        let host = VirtualHost {
            name: "h".into(),
            domains: vec!["a.example".into()],
            routes: vec![route, other],
            typed_per_filter_config: map(),
            ..Default::default()
        };
        RouteConfiguration {
            name: "http.80".into(),
            virtual_hosts: vec![host.clone(), VirtualHost { name: "g".into(), ..host }],
            typed_per_filter_config: map(),
            ..Default::default()
        }
    }

    #[test]
    fn the_same_table_encodes_to_the_same_bytes_and_decodes_unchanged() {
        let names = ["envoy.filters.http.cors", "envoy.filters.http.rbac", "envoy.filters.http.local_ratelimit", "x"];
        let first = route_configuration_any(table(&names));
        assert_eq!(first.type_url, ROUTE_TYPE);
        let reversed: Vec<&str> = names.iter().rev().copied().collect();
        // Twenty fresh maps each way: their iteration orders differ, the bytes must not.
        for i in 0..20 {
            let order = if i % 2 == 0 { &names[..] } else { &reversed[..] };
            assert_eq!(route_configuration_any(table(order)).value, first.value, "round {i}");
        }
        let decoded = RouteConfiguration::decode(first.value.as_slice()).expect("decodes");
        assert_eq!(decoded, table(&names));
        assert_eq!(decoded.virtual_hosts[0].routes.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["r", "s"]);
    }
}
