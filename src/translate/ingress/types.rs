//! The Istio specs the Ingress translation writes, typed, in the protobuf JSON
//! mapping (`networking.istio.io/v1`): camelCase field names, enums as
//! strings, unset fields left out. They are serialised into
//! [`IstioObject::spec`](crate::translate::istio::IstioObject).

use std::collections::BTreeMap;

use serde::Serialize;

/// `Gateway.spec`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GatewaySpec {
    pub selector: BTreeMap<String, String>,
    pub servers: Vec<Server>,
}

/// `Gateway.spec.servers[]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Server {
    pub port: ServerPort,
    pub hosts: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
}

/// `Port` of a Gateway server. Istio requires port names to be unique
/// among a Gateway's servers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerPort {
    pub number: u32,
    pub protocol: &'static str,
    pub name: String,
}

/// `ServerTLSSettings`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerTls {
    /// Always `SIMPLE`: Ingress TLS terminates at the gateway.
    pub mode: &'static str,
    pub credential_name: String,
}

/// `VirtualService.spec`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VirtualServiceSpec {
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
    pub http: Vec<HttpRoute>,
}

/// `HTTPRoute`. A route without `match` matches every request (the default
/// backend); Istio wants it last, which the ordering guarantees.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HttpRoute {
    pub name: String,
    #[serde(rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpMatch>,
    pub route: Vec<RouteDestination>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<Rewrite>,
}

/// `HTTPMatchRequest`, reduced to the URI.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatch {
    pub uri: StringMatch,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ignore_uri_case: bool,
}

/// `StringMatch`: a oneof, so exactly one key in JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
}

/// `HTTPRouteDestination`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct RouteDestination {
    pub destination: Destination,
    /// Left out for a single destination (Istio then sends it everything).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// `Destination`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Destination {
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// `None` for a Service backend given by port name: Istio then uses the
    /// Service's only port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

/// `PortSelector`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PortSelector {
    pub number: u32,
}

/// `HTTPRewrite`: `uri` replaces the matched prefix (or the whole path for
/// an exact match); `uriRegexRewrite` substitutes a regex match.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rewrite {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// `RegexRewrite`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegexRewrite {
    #[serde(rename = "match")]
    pub pattern: String,
    pub rewrite: String,
}

/// `DestinationRule.spec`, reduced to subsets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DestinationRuleSpec {
    pub host: String,
    pub subsets: Vec<Subset>,
}

/// `Subset`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Subset {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}
