//! An Ingress's `default-backend` and `custom-http-errors` on the standalone
//! gateway, from stock Envoy pieces where Higress's gateway uses fields of
//! its own fork (`fallbackClusters`, `internalActiveRedirect`):
//!
//! - **No endpoint.** Each cluster of the route becomes an aggregate
//!   cluster of that cluster then the default backend's: Envoy sends to the
//!   second only while the first has no healthy endpoint, and looks again
//!   on every request, so an endpoint change needs no new route.
//! - **Replaced answers.** The route carries a config of the
//!   `custom_response` filter (every listener runs it, with no policy of
//!   its own, just before the router): an upstream answer with a listed
//!   code makes Envoy send the request again, as a GET to `/` with the same
//!   Host (as Higress's redirect and ingress-nginx's `error_page` do), with
//!   [`FALLBACK_HEADER`] and ingress-nginx's `X-Code`, `X-Format`,
//!   `X-Namespace`, `X-Ingress-Name`, `X-Service-Name`, `X-Service-Port`.
//!   The virtual host's first route takes a request with that header to the
//!   default backend. Envoy keeps the original status code when the
//!   default backend answers 2xx, and passes its answer on untouched when
//!   it is an error or a redirect; it never replaces an answer twice.

use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster::ClusterDiscoveryType, cluster::CustomClusterType};
use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, RedirectAction, Route, RouteAction, RouteMatch, header_matcher::HeaderMatchSpecifier,
    redirect_action::PathRewriteSpecifier, route, route_action, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
use envoy_types::pb::envoy::extensions::filters::http::custom_response::v3::CustomResponse;
use envoy_types::pb::envoy::extensions::http::custom_response::redirect_policy::v3::{
    RedirectPolicy, redirect_policy::RedirectActionSpecifier,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use envoy_types::pb::envoy::r#type::matcher::v3::{HttpResponseStatusCodeMatchInput, StringMatcher};
use envoy_types::pb::google::protobuf::Duration;
use envoy_types::pb::xds::core::v3::TypedExtensionConfig as XdsExtension;
use envoy_types::pb::xds::r#type::matcher::v3::{
    Matcher, StringMatcher as XdsStringMatcher, matcher, matcher::matcher_list, matcher::matcher_list::predicate,
    string_matcher::MatchPattern as XdsPattern,
};
use envoy_types::util::pack_any;

use crate::resources::Resource;

/// The custom response filter's name, the key of its per-route config.
pub const CUSTOM_RESPONSE_FILTER: &str = "envoy.filters.http.custom_response";
/// The request header that takes a replaced answer's second request to
/// the default backend: its value is the default backend's cluster.
pub const FALLBACK_HEADER: &str = "x-meshbridge-default-backend";
const AGGREGATE_CLUSTER: &str = "envoy.clusters.aggregate";

/// The name of the aggregate cluster of `primary`, then `backend`.
pub fn aggregate_name(primary: &str, backend: &str) -> String {
    format!("default-backend|{primary}|{backend}")
}

/// The aggregate cluster of `primary`, then `backend` (no endpoints of its
/// own, so no load assignment).
pub fn aggregate_cluster(primary: &str, backend: &str) -> Resource {
    let name = aggregate_name(primary, backend);
    let config = ClusterConfig { clusters: vec![primary.to_owned(), backend.to_owned()] };
    let cluster = Cluster {
        name: name.clone(),
        // Each member keeps its own timeouts; this one's is required but unused.
        connect_timeout: Some(Duration { seconds: 5, nanos: 0 }),
        lb_policy: LbPolicy::ClusterProvided as i32,
        cluster_discovery_type: Some(ClusterDiscoveryType::ClusterType(CustomClusterType {
            name: AGGREGATE_CLUSTER.into(),
            typed_config: Some(pack_any(config)),
        })),
        ..Default::default()
    };
    Resource::new(name, pack_any(cluster))
}

/// The route, first in its virtual host, that takes a replaced answer's
/// second request to the default backend `cluster`.
pub fn fallback_route(cluster: &str) -> Route {
    let header = HeaderMatcher {
        name: FALLBACK_HEADER.into(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(cluster.to_owned())),
            ..Default::default()
        })),
        ..Default::default()
    };
    Route {
        name: format!("{FALLBACK_HEADER}|{cluster}"),
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Path("/".into())),
            headers: vec![header],
            ..Default::default()
        }),
        action: Some(route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.to_owned())),
            // As the routes Pilot writes: no timeout unless one is set.
            timeout: Some(Duration::default()),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// The custom response config of a route whose answers with `codes` the
/// default backend `cluster` replaces: one redirect policy per code, so
/// that each sends its own `X-Code`. A list, not Envoy's exact-match map,
/// so that the encoding (and the version) is always the same.
pub fn custom_response(codes: &[u16], cluster: &str, headers: &[(String, String)]) -> CustomResponse {
    let status_input =
        XdsExtension { name: "status-code".into(), typed_config: Some(pack_any(HttpResponseStatusCodeMatchInput {})) };
    let matchers = codes
        .iter()
        .map(|code| {
            let predicate = matcher_list::Predicate {
                match_type: Some(predicate::MatchType::SinglePredicate(predicate::SinglePredicate {
                    input: Some(status_input.clone()),
                    matcher: Some(predicate::single_predicate::Matcher::ValueMatch(XdsStringMatcher {
                        match_pattern: Some(XdsPattern::Exact(code.to_string())),
                        ..Default::default()
                    })),
                })),
            };
            let action = XdsExtension {
                name: format!("default-backend-{code}"),
                typed_config: Some(pack_any(redirect_policy(*code, cluster, headers))),
            };
            matcher_list::FieldMatcher {
                predicate: Some(predicate),
                on_match: Some(matcher::OnMatch {
                    on_match: Some(matcher::on_match::OnMatch::Action(action)),
                    keep_matching: false,
                }),
            }
        })
        .collect();
    let list = matcher::MatcherType::MatcherList(matcher::MatcherList { matchers });
    CustomResponse { custom_response_matcher: Some(Matcher { matcher_type: Some(list), on_no_match: None }) }
}

/// The second request of an answer with `code`: `/` on the same Host,
/// with the headers that route it and those ingress-nginx sends.
fn redirect_policy(code: u16, cluster: &str, headers: &[(String, String)]) -> RedirectPolicy {
    let set = |key: &str, value: &str| HeaderValueOption {
        header: Some(HeaderValue { key: key.to_owned(), value: value.to_owned(), ..Default::default() }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    };
    let mut add = vec![set(FALLBACK_HEADER, cluster), set("X-Code", &code.to_string())];
    // The client's Accept; a missing one adds no header.
    add.push(set("X-Format", "%REQ(accept)%"));
    add.extend(headers.iter().map(|(k, v)| set(k, &escape_percent(v))));
    RedirectPolicy {
        redirect_action_specifier: Some(RedirectActionSpecifier::RedirectAction(RedirectAction {
            path_rewrite_specifier: Some(PathRewriteSpecifier::PathRedirect("/".into())),
            ..Default::default()
        })),
        request_headers_to_add: add,
        ..Default::default()
    }
}

/// A literal header value for Envoy's formatter, which reads `%…%`.
fn escape_percent(v: &str) -> String {
    v.replace('%', "%%")
}
