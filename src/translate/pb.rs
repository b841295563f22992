//! The typed model → the generated prost messages of `proto/` (Istio's
//! `istio.networking.v1alpha3` package), encoded with `encode_to_vec`.
//!
//! The messages use ordered maps (`btree_map` in `proto/build.rs`) and
//! prost writes fields by number, so equal specs give equal bytes and MCP
//! versions stay content hashes. Enums carry the proto's numbers as their
//! discriminants.
//!
//! Only two things in the model can fall outside the schema, both in an
//! EnvoyFilter patch: its value is any JSON, where the proto wants a
//! `google.protobuf.Struct`, that is a JSON object; and its match may name
//! more than one kind of object, where the proto has a oneof. Those are
//! the errors here.

use std::collections::BTreeMap;

use meshbridge_proto::istio::networking::v1alpha3 as pb;
use meshbridge_proto::istio::security::v1beta1 as sec;
use pb::envoy_filter as ef;
use prost::Message;
use prost_types::value::Kind;

use super::model::{
    AuthorizationPolicySpec, AuthorizationRule, ClientTlsSettings, ConnectionPoolSettings, ConsistentHash, CorsPolicy,
    Destination, DestinationRuleSpec, EnvoyConfigObjectPatch, EnvoyFilterSpec, GatewaySpec, HeaderOperations, Headers,
    HttpCookie, HttpMatch, HttpPoolSettings, HttpRoute, LoadBalancerSettings, OutlierDetection, Patch, PatchMatch,
    Port, PortSelector, PortTrafficPolicy, ProtoDuration, Redirect, RegexRewrite, Retry, Rewrite, RouteDestination,
    Server, ServerPort, ServerTls, ServiceEntrySpec, Spec, StringMatch, Subset, TrafficPolicy, VirtualServiceSpec,
    WorkloadEntry,
};

/// Why a spec has no protobuf form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PbError {
    /// `configPatches[i].patch.value` is JSON but not an object.
    #[error("configPatches[{index}].patch.value: must be a JSON object (google.protobuf.Struct), got {got}")]
    PatchValueNotObject { index: usize, got: &'static str },
    /// `configPatches[i].match` names more than one of a listener, a route
    /// configuration and a cluster (a oneof in the proto).
    #[error("configPatches[{index}].match: at most one of listener, routeConfiguration and cluster")]
    PatchMatchObjects { index: usize },
}

/// The spec's message, encoded: the `body` of an MCP resource.
pub fn encode(spec: &Spec) -> Result<Vec<u8>, PbError> {
    Ok(match spec {
        Spec::ServiceEntry(s) => pb::ServiceEntry::from(s).encode_to_vec(),
        Spec::DestinationRule(s) => pb::DestinationRule::from(s).encode_to_vec(),
        Spec::Gateway(s) => pb::Gateway::from(s).encode_to_vec(),
        Spec::VirtualService(s) => pb::VirtualService::from(s).encode_to_vec(),
        Spec::EnvoyFilter(s) => pb::EnvoyFilter::try_from(s)?.encode_to_vec(),
        Spec::AuthorizationPolicy(s) => authorization_policy(s).encode_to_vec(),
    })
}

// ---- ServiceEntry ---------------------------------------------------------

impl From<&ServiceEntrySpec> for pb::ServiceEntry {
    fn from(s: &ServiceEntrySpec) -> Self {
        pb::ServiceEntry {
            hosts: s.hosts.clone(),
            ports: s.ports.iter().map(pb::ServicePort::from).collect(),
            location: s.location as i32,
            resolution: s.resolution as i32,
            endpoints: s.endpoints.iter().map(pb::WorkloadEntry::from).collect(),
            ..Default::default()
        }
    }
}

impl From<&Port> for pb::ServicePort {
    fn from(p: &Port) -> Self {
        pb::ServicePort { number: p.number, protocol: p.protocol.clone(), name: p.name.clone(), target_port: 0 }
    }
}

impl From<&WorkloadEntry> for pb::WorkloadEntry {
    fn from(e: &WorkloadEntry) -> Self {
        pb::WorkloadEntry {
            address: e.address.clone(),
            ports: (*e.ports).clone(),
            labels: (*e.labels).clone(),
            weight: e.weight,
            ..Default::default()
        }
    }
}

// ---- DestinationRule ------------------------------------------------------

impl From<&DestinationRuleSpec> for pb::DestinationRule {
    fn from(d: &DestinationRuleSpec) -> Self {
        pb::DestinationRule {
            host: d.host.clone(),
            traffic_policy: d.traffic_policy.as_ref().map(pb::TrafficPolicy::from),
            subsets: d.subsets.iter().map(pb::Subset::from).collect(),
            export_to: Vec::new(),
        }
    }
}

// The impls below destructure the model, so a field added to it is a
// compile error here until it is converted, not a silent default.

impl From<&TrafficPolicy> for pb::TrafficPolicy {
    fn from(t: &TrafficPolicy) -> Self {
        let TrafficPolicy {
            load_balancer,
            connection_pool,
            tls,
            port_level_settings,
            failover_priority,
            outlier_detection,
        } = t;
        let mut lb = load_balancer.as_ref().map(pb::LoadBalancerSettings::from);
        if !failover_priority.is_empty() {
            lb.get_or_insert_with(Default::default).locality_lb_setting = Some(pb::LocalityLoadBalancerSetting {
                failover_priority: failover_priority.clone(),
                enabled: Some(true),
                ..Default::default()
            });
        }
        pb::TrafficPolicy {
            load_balancer: lb,
            connection_pool: connection_pool.as_ref().map(pb::ConnectionPoolSettings::from),
            tls: tls.as_ref().map(pb::ClientTlsSettings::from),
            port_level_settings: port_level_settings.iter().map(pb::traffic_policy::PortTrafficPolicy::from).collect(),
            outlier_detection: outlier_detection.as_ref().map(pb::OutlierDetection::from),
            ..Default::default()
        }
    }
}

impl From<&PortTrafficPolicy> for pb::traffic_policy::PortTrafficPolicy {
    fn from(p: &PortTrafficPolicy) -> Self {
        let PortTrafficPolicy { port, load_balancer, connection_pool, tls } = p;
        pb::traffic_policy::PortTrafficPolicy {
            port: Some((*port).into()),
            load_balancer: load_balancer.as_ref().map(pb::LoadBalancerSettings::from),
            connection_pool: connection_pool.as_ref().map(pb::ConnectionPoolSettings::from),
            tls: Some(pb::ClientTlsSettings::from(tls)),
            outlier_detection: None,
        }
    }
}

impl From<&OutlierDetection> for pb::OutlierDetection {
    fn from(o: &OutlierDetection) -> Self {
        let OutlierDetection { consecutive_5xx_errors, interval, base_ejection_time, max_ejection_percent } = o;
        pb::OutlierDetection {
            consecutive_5xx_errors: Some(*consecutive_5xx_errors),
            interval: Some(prost_types::Duration::from(*interval)),
            base_ejection_time: Some(prost_types::Duration::from(*base_ejection_time)),
            max_ejection_percent: *max_ejection_percent,
            ..Default::default()
        }
    }
}

impl From<&LoadBalancerSettings> for pb::LoadBalancerSettings {
    fn from(l: &LoadBalancerSettings) -> Self {
        use pb::load_balancer_settings::{ConsistentHashLb, LbPolicy, consistent_hash_lb as ch};
        let policy = match l {
            LoadBalancerSettings::Simple(s) => LbPolicy::Simple(*s as i32),
            LoadBalancerSettings::ConsistentHash(key) => {
                let key = match key {
                    ConsistentHash::HttpHeaderName(h) => ch::HashKey::HttpHeaderName(h.clone()),
                    ConsistentHash::HttpCookie(HttpCookie { name, path, ttl }) => {
                        ch::HashKey::HttpCookie(ch::HttpCookie {
                            name: name.clone(),
                            path: path.clone(),
                            ttl: ttl.map(prost_types::Duration::from),
                        })
                    }
                    ConsistentHash::UseSourceIp(b) => ch::HashKey::UseSourceIp(*b),
                    ConsistentHash::HttpQueryParameterName(q) => ch::HashKey::HttpQueryParameterName(q.clone()),
                };
                LbPolicy::ConsistentHash(ConsistentHashLb { hash_key: Some(key), ..Default::default() })
            }
        };
        pb::LoadBalancerSettings { lb_policy: Some(policy), ..Default::default() }
    }
}

impl From<&ConnectionPoolSettings> for pb::ConnectionPoolSettings {
    fn from(c: &ConnectionPoolSettings) -> Self {
        let ConnectionPoolSettings { http: HttpPoolSettings { h2_upgrade_policy } } = c;
        pb::ConnectionPoolSettings {
            tcp: None,
            http: Some(pb::connection_pool_settings::HttpSettings {
                h2_upgrade_policy: *h2_upgrade_policy as i32,
                ..Default::default()
            }),
        }
    }
}

impl From<&ClientTlsSettings> for pb::ClientTlsSettings {
    fn from(t: &ClientTlsSettings) -> Self {
        let ClientTlsSettings { mode, sni, insecure_skip_verify, credential_name } = t;
        pb::ClientTlsSettings {
            mode: *mode as i32,
            sni: sni.clone().unwrap_or_default(),
            insecure_skip_verify: *insecure_skip_verify,
            credential_name: credential_name.clone().unwrap_or_default(),
            ..Default::default()
        }
    }
}

impl From<&Subset> for pb::Subset {
    fn from(s: &Subset) -> Self {
        pb::Subset { name: s.name.clone(), labels: s.labels.clone(), traffic_policy: None }
    }
}

impl From<PortSelector> for pb::PortSelector {
    fn from(p: PortSelector) -> Self {
        pb::PortSelector { number: p.number }
    }
}

// ---- Gateway --------------------------------------------------------------

impl From<&GatewaySpec> for pb::Gateway {
    fn from(g: &GatewaySpec) -> Self {
        pb::Gateway { servers: g.servers.iter().map(pb::Server::from).collect(), selector: g.selector.clone() }
    }
}

impl From<&Server> for pb::Server {
    fn from(s: &Server) -> Self {
        pb::Server {
            port: Some(pb::Port::from(&s.port)),
            hosts: s.hosts.clone(),
            tls: s.tls.as_ref().map(pb::ServerTlsSettings::from),
            ..Default::default()
        }
    }
}

impl From<&ServerPort> for pb::Port {
    fn from(p: &ServerPort) -> Self {
        pb::Port { number: p.number, protocol: p.protocol.clone(), name: p.name.clone() }
    }
}

impl From<&ServerTls> for pb::ServerTlsSettings {
    fn from(t: &ServerTls) -> Self {
        pb::ServerTlsSettings {
            https_redirect: t.https_redirect,
            mode: t.mode.map_or(0, |m| m as i32),
            credential_name: t.credential_name.clone(),
            ..Default::default()
        }
    }
}

// ---- VirtualService -------------------------------------------------------

impl From<&VirtualServiceSpec> for pb::VirtualService {
    fn from(v: &VirtualServiceSpec) -> Self {
        pb::VirtualService {
            hosts: v.hosts.clone(),
            gateways: v.gateways.clone(),
            http: v.http.iter().map(pb::HttpRoute::from).collect(),
            ..Default::default()
        }
    }
}

impl From<&HttpRoute> for pb::HttpRoute {
    fn from(r: &HttpRoute) -> Self {
        pb::HttpRoute {
            name: r.name.clone(),
            r#match: r.matches.iter().map(pb::HttpMatchRequest::from).collect(),
            route: r.route.iter().map(pb::HttpRouteDestination::from).collect(),
            redirect: r.redirect.as_ref().map(pb::HttpRedirect::from),
            rewrite: r.rewrite.as_ref().map(pb::HttpRewrite::from),
            timeout: r.timeout.map(prost_types::Duration::from),
            retries: r.retries.as_ref().map(pb::HttpRetry::from),
            cors_policy: r.cors_policy.as_ref().map(pb::CorsPolicy::from),
            headers: r.headers.as_ref().map(pb::Headers::from),
            mirror: r.mirror.as_ref().map(pb::Destination::from),
            mirror_percentage: r.mirror_percentage.map(|p| pb::Percent { value: p.value }),
            // `source_ranges` has no field in Istio's HTTPRoute: the
            // standalone gateway's only.
            ..Default::default()
        }
    }
}

impl From<&HttpMatch> for pb::HttpMatchRequest {
    fn from(m: &HttpMatch) -> Self {
        pb::HttpMatchRequest {
            uri: m.uri.as_ref().map(pb::StringMatch::from),
            ignore_uri_case: m.ignore_uri_case,
            headers: m.headers.iter().map(|(k, v)| (k.clone(), pb::StringMatch::from(v))).collect(),
            scheme: m.scheme.as_ref().map(pb::StringMatch::from),
            method: m.method.as_ref().map(pb::StringMatch::from),
            query_params: m.query_params.iter().map(|(k, v)| (k.clone(), pb::StringMatch::from(v))).collect(),
            ..Default::default()
        }
    }
}

impl From<&StringMatch> for pb::StringMatch {
    fn from(m: &StringMatch) -> Self {
        use pb::string_match::MatchType;
        let t = match m {
            StringMatch::Exact(s) => MatchType::Exact(s.clone()),
            StringMatch::Prefix(s) => MatchType::Prefix(s.clone()),
            StringMatch::Regex(s) => MatchType::Regex(s.clone()),
        };
        pb::StringMatch { match_type: Some(t) }
    }
}

impl From<&RouteDestination> for pb::HttpRouteDestination {
    fn from(r: &RouteDestination) -> Self {
        pb::HttpRouteDestination {
            destination: Some(pb::Destination::from(&r.destination)),
            // Weights are percentages (at most 100) or an Ingress's share of
            // a total; they fit, and saturate if one ever did not.
            weight: r.weight.map_or(0, |w| i32::try_from(w).unwrap_or(i32::MAX)),
            headers: r.headers.as_ref().map(pb::Headers::from),
        }
    }
}

impl From<&Destination> for pb::Destination {
    fn from(d: &Destination) -> Self {
        pb::Destination {
            host: d.host.clone(),
            subset: d.subset.clone().unwrap_or_default(),
            port: d.port.map(pb::PortSelector::from),
        }
    }
}

impl From<&Rewrite> for pb::HttpRewrite {
    fn from(r: &Rewrite) -> Self {
        pb::HttpRewrite {
            uri: r.uri.clone().unwrap_or_default(),
            authority: r.authority.clone().unwrap_or_default(),
            uri_regex_rewrite: r.uri_regex_rewrite.as_ref().map(pb::RegexRewrite::from),
        }
    }
}

impl From<&RegexRewrite> for pb::RegexRewrite {
    fn from(r: &RegexRewrite) -> Self {
        pb::RegexRewrite { r#match: r.pattern.clone(), rewrite: r.rewrite.clone() }
    }
}

impl From<&Redirect> for pb::HttpRedirect {
    fn from(r: &Redirect) -> Self {
        pb::HttpRedirect {
            uri: r.uri.clone().unwrap_or_default(),
            authority: r.authority.clone().unwrap_or_default(),
            scheme: r.scheme.clone().unwrap_or_default(),
            redirect_code: r.redirect_code.unwrap_or_default(),
            redirect_port: None,
        }
    }
}

impl From<&Retry> for pb::HttpRetry {
    fn from(r: &Retry) -> Self {
        pb::HttpRetry {
            // At most i32::MAX: the parser takes no more.
            attempts: i32::try_from(r.attempts).unwrap_or(i32::MAX),
            per_try_timeout: r.per_try_timeout.map(prost_types::Duration::from),
            retry_on: r.retry_on.clone().unwrap_or_default(),
            retry_remote_localities: None,
        }
    }
}

impl From<&Headers> for pb::Headers {
    fn from(h: &Headers) -> Self {
        pb::Headers {
            request: h.request.as_ref().map(pb::headers::HeaderOperations::from),
            response: h.response.as_ref().map(pb::headers::HeaderOperations::from),
        }
    }
}

impl From<&HeaderOperations> for pb::headers::HeaderOperations {
    fn from(o: &HeaderOperations) -> Self {
        pb::headers::HeaderOperations { set: o.set.clone(), add: o.add.clone(), remove: o.remove.clone() }
    }
}

impl From<&CorsPolicy> for pb::CorsPolicy {
    fn from(c: &CorsPolicy) -> Self {
        pb::CorsPolicy {
            allow_origins: c.allow_origins.iter().map(pb::StringMatch::from).collect(),
            allow_methods: c.allow_methods.clone(),
            allow_headers: c.allow_headers.clone(),
            expose_headers: c.expose_headers.clone(),
            max_age: c.max_age.map(prost_types::Duration::from),
            allow_credentials: c.allow_credentials,
        }
    }
}

impl From<ProtoDuration> for prost_types::Duration {
    fn from(d: ProtoDuration) -> Self {
        // Whole seconds up to 10,000 years (what the parsers take) fit.
        prost_types::Duration {
            seconds: i64::try_from(d.0.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.0.subsec_nanos()).unwrap_or_default(),
        }
    }
}

// ---- AuthorizationPolicy --------------------------------------------------

fn authorization_policy(p: &AuthorizationPolicySpec) -> sec::AuthorizationPolicy {
    let rule = |r: &AuthorizationRule| sec::Rule {
        from: r
            .from
            .iter()
            .map(|f| sec::rule::From {
                source: Some(sec::Source {
                    remote_ip_blocks: f.source.remote_ip_blocks.clone(),
                    not_remote_ip_blocks: f.source.not_remote_ip_blocks.clone(),
                }),
            })
            .collect(),
        to: r
            .to
            .iter()
            .map(|t| sec::rule::To {
                operation: Some(sec::Operation { hosts: t.operation.hosts.clone(), paths: t.operation.paths.clone() }),
            })
            .collect(),
    };
    sec::AuthorizationPolicy {
        selector: Some(meshbridge_proto::istio::r#type::v1beta1::WorkloadSelector {
            match_labels: p.selector.match_labels.clone(),
        }),
        rules: p.rules.iter().map(rule).collect(),
        action: p.action as i32,
    }
}

// ---- EnvoyFilter ----------------------------------------------------------

impl TryFrom<&EnvoyFilterSpec> for pb::EnvoyFilter {
    type Error = PbError;

    fn try_from(f: &EnvoyFilterSpec) -> Result<Self, PbError> {
        let config_patches =
            f.config_patches.iter().enumerate().map(|(i, p)| patch(i, p)).collect::<Result<Vec<_>, _>>()?;
        let workload_selector = f.workload_selector.as_ref().map(|s| pb::WorkloadSelector { labels: s.labels.clone() });
        Ok(pb::EnvoyFilter { workload_selector, config_patches })
    }
}

fn patch(index: usize, p: &EnvoyConfigObjectPatch) -> Result<ef::EnvoyConfigObjectPatch, PbError> {
    use ef::envoy_config_object_match::ObjectTypes;
    let PatchMatch { context, listener, route_configuration, cluster } = &p.matches;
    let listener = listener.as_ref().map(|l| {
        let f = &l.filter_chain.filter;
        ObjectTypes::Listener(ef::ListenerMatch {
            filter_chain: Some(ef::listener_match::FilterChainMatch {
                filter: Some(ef::listener_match::FilterMatch {
                    name: f.name.clone(),
                    sub_filter: f
                        .sub_filter
                        .as_ref()
                        .map(|s| ef::listener_match::SubFilterMatch { name: s.name.clone() }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    let route_configuration = route_configuration.as_ref().map(|r| {
        ObjectTypes::RouteConfiguration(ef::RouteConfigurationMatch {
            vhost: Some(ef::route_configuration_match::VirtualHostMatch {
                route: Some(ef::route_configuration_match::RouteMatch {
                    name: r.vhost.route.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    let cluster =
        cluster.as_ref().map(|c| ObjectTypes::Cluster(ef::ClusterMatch { name: c.name.clone(), ..Default::default() }));
    let mut objects = [listener, route_configuration, cluster].into_iter().flatten();
    let object_types = objects.next();
    if objects.next().is_some() {
        return Err(PbError::PatchMatchObjects { index });
    }
    let Patch { operation, value } = &p.patch;
    let value = match value {
        None => None,
        Some(serde_json::Value::Object(fields)) => Some(to_struct(fields)),
        Some(other) => return Err(PbError::PatchValueNotObject { index, got: json_type(other) }),
    };
    Ok(ef::EnvoyConfigObjectPatch {
        apply_to: p.apply_to as i32,
        r#match: Some(ef::EnvoyConfigObjectMatch { context: *context as i32, proxy: None, object_types }),
        patch: Some(ef::Patch { operation: *operation as i32, value, filter_class: 0 }),
    })
}

fn to_struct(fields: &serde_json::Map<String, serde_json::Value>) -> prost_types::Struct {
    prost_types::Struct { fields: fields.iter().map(|(k, v)| (k.clone(), to_value(v))).collect::<BTreeMap<_, _>>() }
}

/// JSON → `google.protobuf.Value`, as the protobuf JSON mapping reads it:
/// every number becomes a double.
fn to_value(v: &serde_json::Value) -> prost_types::Value {
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(prost_types::ListValue { values: items.iter().map(to_value).collect() }),
        J::Object(fields) => Kind::StructValue(to_struct(fields)),
    };
    prost_types::Value { kind: Some(kind) }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
#[path = "pb_tests.rs"]
mod tests;
