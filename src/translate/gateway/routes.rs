//! VirtualServices bound to Gateways → Envoy virtual hosts and routes.
//!
//! Each VirtualService's `http[]` is translated once, in order (the Ingress
//! translation has already ordered it), then placed in the virtual host of
//! every host it serves on a listener side. Two VirtualServices on the same
//! host are merged into one virtual host, in `namespace/name` order, because
//! Envoy rejects a whole RouteConfiguration with a domain given twice.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, QueryParameterMatcher, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost, WeightedCluster, header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier, route, route_action, route_match::PathSpecifier,
    virtual_host::TlsRequirementType, weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher::MatchPattern,
};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use envoy_types::util::pack_any;

use super::clusters::Clusters;
use super::fallback;
use super::policy::{HeaderFields, duration, redirect_action, retry_policy, route_base};
use super::servers::{BoundServer, Side, intersect};
use super::spec::{Named, Specs};
use crate::translate::model::{Headers, HttpMatch, HttpRoute, Percent, StringMatch, VirtualServiceSpec};
use crate::translate::warning::{Reason, Warning};

/// A VirtualService bound to at least one existing Gateway, translated.
#[derive(Debug)]
pub struct BoundVs<'a> {
    pub vs: &'a Named<'a, VirtualServiceSpec>,
    /// Keys (`namespace/name`) of the Gateways it names that exist.
    pub gateways: BTreeSet<String>,
    pub routes: Vec<Route>,
    /// The default backends' clusters whose answers replace others: each
    /// needs its route first in every virtual host of this VirtualService.
    pub fallbacks: BTreeSet<String>,
}

/// Translate every VirtualService that names an existing Gateway. Those
/// naming only `mesh` (or nothing, which means `mesh`) are not ours.
pub fn bind<'a>(specs: &'a Specs<'a>, clusters: &mut Clusters<'_>, warnings: &mut Vec<Warning>) -> Vec<BoundVs<'a>> {
    let mut out = Vec::new();
    for vs in &specs.virtual_services {
        let mut gateways = BTreeSet::new();
        for reference in &vs.spec.gateways {
            if reference == "mesh" {
                continue;
            }
            let (ns, name) = reference.split_once('/').unwrap_or((vs.namespace, reference));
            match specs.gateway(ns, name) {
                Some(gw) => {
                    gateways.insert(gw.key());
                }
                None => warnings.push(Warning::new(
                    format!("VirtualService {}", vs.key()),
                    Reason::Unservable,
                    format!("gateway {ns}/{name} not found"),
                )),
            }
        }
        if gateways.is_empty() {
            continue;
        }
        let (routes, fallbacks) = translate(vs, clusters, warnings);
        out.push(BoundVs { vs, gateways, routes, fallbacks });
    }
    out
}

/// The hosts a VirtualService serves on one listener side, each with
/// whether a server asks for an HTTPS redirect.
pub fn served_hosts(bound: &BoundVs<'_>, servers: &[&BoundServer<'_>], side: Side) -> BTreeMap<String, bool> {
    let mut out: BTreeMap<String, bool> = BTreeMap::new();
    let servers = servers.iter().filter(|s| s.side == side && bound.gateways.contains(&s.gateway.key()));
    for server in servers {
        for sh in server.hosts.iter().filter(|sh| sh.admits(bound.vs.namespace)) {
            for host in &bound.vs.spec.hosts {
                if let Some(h) = intersect(&sh.host, &host.to_ascii_lowercase()) {
                    *out.entry(h).or_default() |= server.https_redirect;
                }
            }
        }
    }
    out
}

/// The RouteConfiguration of one listener (or of some of its filter
/// chains): a virtual host per host `servers` serve.
pub fn route_configuration(
    name: String,
    bound: &[BoundVs<'_>],
    servers: &[&BoundServer<'_>],
    side: Side,
) -> RouteConfiguration {
    let mut hosts: BTreeMap<String, (Vec<Route>, bool, BTreeSet<&str>)> = BTreeMap::new();
    for b in bound {
        for (host, redirect) in served_hosts(b, servers, side) {
            let entry = hosts.entry(host).or_default();
            entry.0.extend(b.routes.iter().cloned());
            entry.1 |= redirect;
            entry.2.extend(b.fallbacks.iter().map(String::as_str));
        }
    }
    let virtual_hosts = hosts
        .into_iter()
        .map(|(host, (routes, redirect, fallbacks))| VirtualHost {
            domains: domains(&host),
            name: host,
            // The second requests of replaced answers match before anything.
            routes: fallbacks.into_iter().map(fallback::fallback_route).chain(routes).collect(),
            require_tls: if redirect { TlsRequirementType::All as i32 } else { TlsRequirementType::None as i32 },
            ..Default::default()
        })
        .collect();
    RouteConfiguration {
        name,
        virtual_hosts,
        // The listener's own port (10080, 10443, …) is not the one clients
        // may put in Host, and a `*.suffix:*` domain cannot be written (a
        // leading `*` makes the rest a literal suffix), so match hosts alone.
        ignore_port_in_host_matching: true,
        ..Default::default()
    }
}

fn domains(host: &str) -> Vec<String> {
    if host.starts_with('*') { vec![host.to_string()] } else { vec![host.to_string(), format!("{host}:*")] }
}

/// One VirtualService's `http[]` → routes, one per match, in order, and
/// the default backends whose answers replace others.
fn translate(
    vs: &Named<'_, VirtualServiceSpec>,
    clusters: &mut Clusters<'_>,
    warnings: &mut Vec<Warning>,
) -> (Vec<Route>, BTreeSet<String>) {
    let mut routes = Vec::new();
    let mut fallbacks = BTreeSet::new();
    for (i, http) in vs.spec.http.iter().enumerate() {
        let at = if http.name.is_empty() {
            format!("VirtualService {}: http[{i}]", vs.key())
        } else {
            format!("VirtualService {}: http[{i}] ({})", vs.key(), http.name)
        };
        let (action, destination_headers, replacing) = match &http.redirect {
            Some(r) => (route::Action::Redirect(redirect_action(r, &at, warnings)), None, None),
            None if http.route.is_empty() => {
                warnings.push(Warning::new(at, Reason::Unservable, "no route; left out"));
                continue;
            }
            None => action(http, &at, clusters, warnings),
        };
        let mut base = route_base(http, destination_headers);
        if let (Some(cluster), Some(d)) = (replacing, &http.default_backend) {
            let config = fallback::custom_response(&d.codes, &cluster, &d.headers);
            base.typed_per_filter_config.insert(fallback::CUSTOM_RESPONSE_FILTER.into(), pack_any(config));
            fallbacks.insert(cluster);
        }
        let matches: Vec<RouteMatch> = if http.matches.is_empty() {
            vec![prefix_match("/")]
        } else {
            http.matches.iter().map(route_match).collect()
        };
        routes.extend(matches.into_iter().map(|m| Route {
            name: http.name.clone(),
            r#match: Some(m),
            action: Some(action.clone()),
            ..base.clone()
        }));
    }
    (routes, fallbacks)
}

fn prefix_match(prefix: &str) -> RouteMatch {
    RouteMatch { path_specifier: Some(PathSpecifier::Prefix(prefix.to_string())), ..Default::default() }
}

fn regex(pattern: &str) -> RegexMatcher {
    // No engine_type: RE2 is Envoy's default, and `google_re2` is deprecated.
    RegexMatcher { regex: pattern.to_string(), engine_type: None }
}

fn route_match(m: &HttpMatch) -> RouteMatch {
    let path = match &m.uri {
        None => PathSpecifier::Prefix("/".into()),
        Some(StringMatch::Exact(p)) => PathSpecifier::Path(p.clone()),
        Some(StringMatch::Prefix(p)) => PathSpecifier::Prefix(p.clone()),
        Some(StringMatch::Regex(r)) => PathSpecifier::SafeRegex(regex(r)),
    };
    RouteMatch {
        path_specifier: Some(path),
        // Istio: "the case will be ignored only in the case of exact and
        // prefix URI matches"; Envoy likewise ignores it for safe_regex.
        case_sensitive: m.ignore_uri_case.then_some(BoolValue { value: false }),
        // Pilot matches `scheme` on the `:scheme` pseudo-header, which Envoy
        // sets from the downstream connection, and the method on `:method`.
        headers: m
            .headers
            .iter()
            .map(|(name, value)| header_matcher(name, value))
            .chain(m.scheme.as_ref().map(|s| header_matcher(":scheme", s)))
            .chain(m.method.as_ref().map(|s| header_matcher(":method", s)))
            .collect(),
        query_parameters: m
            .query_params
            .iter()
            .map(|(name, value)| QueryParameterMatcher {
                name: name.clone(),
                query_parameter_match_specifier: Some(QueryParameterMatchSpecifier::StringMatch(string_matcher(value))),
            })
            .collect(),
        ..Default::default()
    }
}

/// An Istio string match as an Envoy one. Envoy's `safe_regex` must match
/// the whole value, as Istio's `regex` is documented to.
fn string_matcher(value: &StringMatch) -> StringMatcher {
    let pattern = match value {
        StringMatch::Exact(v) => MatchPattern::Exact(v.clone()),
        StringMatch::Prefix(v) => MatchPattern::Prefix(v.clone()),
        StringMatch::Regex(r) => MatchPattern::SafeRegex(regex(r)),
    };
    StringMatcher { match_pattern: Some(pattern), ..Default::default() }
}

/// An Istio header match as Pilot writes it: a `string_match` on the
/// header. Envoy's `safe_regex` must match the whole value, as Istio's
/// `regex` is documented to.
fn header_matcher(name: &str, value: &StringMatch) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(HeaderMatchSpecifier::StringMatch(string_matcher(value))),
        ..Default::default()
    }
}

/// Copies of the requests to `cluster`, of `share` of them when set (as
/// Pilot writes it: a runtime fraction per million).
fn mirror_policy(cluster: String, share: Option<Percent>) -> route_action::RequestMirrorPolicy {
    let runtime_fraction = share.map(|p| RuntimeFractionalPercent {
        default_value: Some(FractionalPercent {
            numerator: (p.value.clamp(0.0, 100.0) * 10_000.0).round() as u32,
            denominator: fractional_percent::DenominatorType::Million as i32,
        }),
        runtime_key: String::new(),
    });
    route_action::RequestMirrorPolicy { cluster, runtime_fraction, ..Default::default() }
}

/// The action of an `http[]` entry, the header operations of its one
/// destination when it has one (they go on the route, as Pilot puts them),
/// and the default backend's cluster when it replaces the route's answers
/// with codes. Destinations without a cluster are left out so that no route
/// names a cluster the Envoy lacks; with none left the route goes to its
/// default backend, or answers 503. With a default backend each cluster is
/// the aggregate of it and the default backend's.
fn action<'h>(
    http: &'h HttpRoute,
    at: &str,
    clusters: &mut Clusters<'_>,
    warnings: &mut Vec<Warning>,
) -> (route::Action, Option<&'h Headers>, Option<String>) {
    // Istio: one destination takes all traffic whatever its weight; with
    // several, a zero weight takes none, and all unset means an even split.
    let weighted = http.route.len() > 1 && http.route.iter().any(|d| d.weight.unwrap_or(0) > 0);
    let mut targets: Vec<(String, u32, Option<&Headers>)> = Vec::new();
    let mut missing = Vec::new();
    for rd in &http.route {
        let weight = if weighted { rd.weight.unwrap_or(0) } else { 1 };
        if weight == 0 {
            continue;
        }
        match clusters.resolve(&rd.destination) {
            // Two destinations on one cluster: one entry with both weights
            // (and the first one's header operations).
            Ok(name) => match targets.iter_mut().find(|(n, _, _)| *n == name) {
                Some((_, w, _)) => *w = w.saturating_add(weight),
                None => targets.push((name, weight, rd.headers.as_ref())),
            },
            Err(reason) => missing.push(reason),
        }
    }
    let default_backend = http.default_backend.as_ref().and_then(|d| {
        clusters
            .resolve_default_backend(&d.destination)
            .map_err(|reason| {
                let detail = format!("default backend: {reason}; left out");
                warnings.push(Warning::new(at, Reason::NoCluster, detail));
            })
            .ok()
    });
    // A consistent-hash rule on a target's host hashes on the route.
    let hash_policy: Vec<_> = targets.iter().find_map(|(name, _, _)| clusters.hash_policy(name)).into_iter().collect();
    let mut replacing = None;
    if targets.is_empty() {
        let Some(backend) = &default_backend else {
            for reason in missing {
                warnings.push(Warning::new(at, Reason::NoCluster, format!("{reason}; answering 503")));
            }
            let answer = DirectResponseAction { status: 503, ..Default::default() };
            return (route::Action::DirectResponse(answer), None, None);
        };
        // Nothing else to send to: ingress-nginx's "no endpoints" case.
        for reason in missing {
            warnings.push(Warning::new(at, Reason::NoCluster, format!("{reason}; the default backend answers")));
        }
        targets.push((backend.clone(), 1, None));
    } else {
        for reason in missing {
            warnings.push(Warning::new(at, Reason::NoCluster, format!("{reason}; left out of the weighted route")));
        }
        if let Some(backend) = &default_backend {
            // A route to the default backend itself has nothing to fall back from.
            for (name, _, _) in targets.iter_mut().filter(|(name, _, _)| name != backend) {
                *name = clusters.with_default_backend(name, backend);
            }
            replacing = http.default_backend.as_ref().filter(|d| !d.codes.is_empty()).map(|_| backend.clone());
        }
    }
    let mut single_headers = None;
    let cluster_specifier = if let [(name, _, headers)] = targets.as_slice() {
        single_headers = *headers;
        route_action::ClusterSpecifier::Cluster(name.clone())
    } else {
        route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: targets
                .into_iter()
                .map(|(name, weight, headers)| {
                    let mut cw =
                        ClusterWeight { name, weight: Some(UInt32Value { value: weight }), ..Default::default() };
                    if let Some(h) = headers {
                        let ops = HeaderFields::of(h);
                        cw.request_headers_to_add = ops.request_add;
                        cw.request_headers_to_remove = ops.request_remove;
                        cw.response_headers_to_add = ops.response_add;
                        cw.response_headers_to_remove = ops.response_remove;
                    }
                    cw
                })
                .collect(),
            ..Default::default()
        })
    };
    let mut ra = RouteAction {
        cluster_specifier: Some(cluster_specifier),
        // Pilot: no `timeout` is none at all (0s), not Envoy's 15 s default.
        timeout: Some(http.timeout.map(duration).unwrap_or_default()),
        retry_policy: http.retries.as_ref().and_then(retry_policy),
        hash_policy,
        ..Default::default()
    };
    if let Some(mirror) = &http.mirror {
        match clusters.resolve(mirror) {
            Ok(cluster) => ra.request_mirror_policies = vec![mirror_policy(cluster, http.mirror_percentage)],
            Err(reason) => warnings.push(Warning::new(at, Reason::NoCluster, format!("{reason}; mirror left out"))),
        }
    }
    if let Some(rw) = &http.rewrite {
        let uri = rw.uri.as_deref().unwrap_or_default();
        ra.prefix_rewrite = uri.to_string();
        if let Some(rr) = &rw.uri_regex_rewrite {
            if uri.is_empty() {
                ra.regex_rewrite = Some(RegexMatchAndSubstitute {
                    pattern: Some(regex(&rr.pattern)),
                    substitution: rr.rewrite.clone(),
                });
            } else {
                // Envoy rejects a route with both.
                warnings.push(Warning::new(
                    at,
                    Reason::Unservable,
                    "rewrite has both uri and uriRegexRewrite; uriRegexRewrite ignored",
                ));
            }
        }
        if let Some(authority) = rw.authority.as_deref().filter(|a| !a.is_empty()) {
            ra.host_rewrite_specifier = Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(authority.into()));
        }
    }
    (route::Action::Route(ra), single_headers, replacing)
}
