//! The policy fields of an Istio HTTPRoute as Pilot writes them into an
//! Envoy route: `redirect` (a redirect action), `timeout` and `retries` (of
//! the route action), `headers` (headers to add and remove) and
//! `corsPolicy` (per-route config of the CORS filter, which every listener
//! of the standalone gateway runs before the router); and the source ranges,
//! which are no Istio field, as per-route config of the RBAC filter (run
//! first); and Higress's local rate limit, no Istio field either, as
//! per-route config of the local rate limit filter.

use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::config::core::v3::{
    CidrRange, HeaderValue, HeaderValueOption, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac as RbacRules, permission, principal, principal::Identifier, rbac,
};
use envoy_types::pb::envoy::config::route::v3::{
    RedirectAction, RetryPolicy, Route, redirect_action::PathRewriteSpecifier, redirect_action::RedirectResponseCode,
    redirect_action::SchemeRewriteSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as EnvoyCors;
use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit as EnvoyLocalRateLimit;
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::{Rbac, RbacPerRoute};
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::{
    FractionalPercent, HttpStatus, StatusCode, TokenBucket, fractional_percent::DenominatorType,
};
use envoy_types::pb::google::protobuf::{BoolValue, Duration, UInt32Value};
use envoy_types::util::pack_any;

use crate::translate::model::{
    Cidr, CorsPolicy, HeaderOperations, Headers, HttpRoute, LocalRateLimit, ProtoDuration, Redirect, Retry,
    SourceRanges, StringMatch,
};
use crate::translate::warning::{Reason, Warning};

/// The CORS filter's name, the key of its per-route config.
pub const CORS_FILTER: &str = "envoy.filters.http.cors";
pub const RBAC_FILTER: &str = "envoy.filters.http.rbac";
pub const LOCAL_RATE_LIMIT_FILTER: &str = "envoy.filters.http.local_ratelimit";

/// A route with the headers and CORS policy of `http` (and the header
/// operations of its one destination, after the route's) and nothing else:
/// the base each of its Envoy routes is made from.
pub fn route_base(http: &HttpRoute, destination: Option<&Headers>) -> Route {
    let mut route = Route::default();
    for h in http.headers.iter().chain(destination) {
        let ops = HeaderFields::of(h);
        route.request_headers_to_add.extend(ops.request_add);
        route.request_headers_to_remove.extend(ops.request_remove);
        route.response_headers_to_add.extend(ops.response_add);
        route.response_headers_to_remove.extend(ops.response_remove);
    }
    if let Some(cors) = &http.cors_policy {
        route.typed_per_filter_config.insert(CORS_FILTER.into(), pack_any(cors_policy(cors)));
    }
    if let Some(ranges) = &http.source_ranges {
        route.typed_per_filter_config.insert(RBAC_FILTER.into(), pack_any(source_rbac(ranges)));
    }
    if let Some(limit) = &http.local_rate_limit {
        route.typed_per_filter_config.insert(LOCAL_RATE_LIMIT_FILTER.into(), pack_any(local_rate_limit(limit)));
    }
    route
}

/// The local rate limit filter as every listener runs it: with no token
/// bucket of its own it passes every request; a route's config
/// ([`local_rate_limit`]) turns it on for that route.
pub fn inert_local_rate_limit() -> EnvoyLocalRateLimit {
    EnvoyLocalRateLimit { stat_prefix: "local_rate_limit".into(), ..Default::default() }
}

/// The local rate limit filter's config for one route: its own token
/// bucket (per route, per Envoy), enabled and enforced for every request,
/// 429 when empty, as Higress answers. istiod's gateway gets the same, by
/// an EnvoyFilter (`ingress/limit.rs`).
pub fn local_rate_limit(limit: &LocalRateLimit) -> EnvoyLocalRateLimit {
    let all = || RuntimeFractionalPercent {
        default_value: Some(FractionalPercent { numerator: 100, denominator: DenominatorType::Hundred as i32 }),
        runtime_key: String::new(),
    };
    EnvoyLocalRateLimit {
        stat_prefix: "route_local_rate_limit".into(),
        status: Some(HttpStatus { code: StatusCode::TooManyRequests as i32 }),
        token_bucket: Some(TokenBucket {
            max_tokens: limit.max_tokens,
            tokens_per_fill: Some(UInt32Value { value: limit.tokens_per_fill }),
            fill_interval: Some(Duration { seconds: limit.fill_interval_secs.into(), nanos: 0 }),
        }),
        filter_enabled: Some(all()),
        filter_enforced: Some(all()),
        ..Default::default()
    }
}

/// The RBAC filter's policy for a route with source ranges: allow the
/// clients (the peer address: the listeners do not trust X-Forwarded-For)
/// in `allow`, if set, and not in `deny`; anyone else gets a 403.
fn source_rbac(ranges: &SourceRanges) -> RbacPerRoute {
    let ip = |c: &Cidr| Principal {
        identifier: Some(Identifier::RemoteIp(CidrRange {
            address_prefix: c.address.to_string(),
            prefix_len: Some(UInt32Value { value: c.prefix_len.into() }),
        })),
    };
    let any_of = |list: &[Cidr]| Principal {
        identifier: Some(Identifier::OrIds(principal::Set { ids: list.iter().map(ip).collect() })),
    };
    let mut all = Vec::new();
    if let Some(allow) = &ranges.allow {
        all.push(any_of(allow));
    }
    if !ranges.deny.is_empty() {
        all.push(Principal { identifier: Some(Identifier::NotId(Box::new(any_of(&ranges.deny)))) });
    }
    // An allow list with no entry: an empty `or_ids`, which nothing matches.
    let principal = match all.len() {
        1 => all.remove(0),
        _ => Principal { identifier: Some(Identifier::AndIds(principal::Set { ids: all })) },
    };
    let policy = Policy {
        permissions: vec![Permission { rule: Some(permission::Rule::Any(true)) }],
        principals: vec![principal],
        ..Default::default()
    };
    let rules = RbacRules {
        action: rbac::Action::Allow as i32,
        policies: [("source-range".to_owned(), policy)].into_iter().collect(),
        ..Default::default()
    };
    RbacPerRoute { rbac: Some(Rbac { rules: Some(rules), ..Default::default() }) }
}

/// Istio's `Headers` as the four lists a route (or a weighted cluster)
/// has.
#[derive(Debug, Default)]
pub struct HeaderFields {
    pub request_add: Vec<HeaderValueOption>,
    pub request_remove: Vec<String>,
    pub response_add: Vec<HeaderValueOption>,
    pub response_remove: Vec<String>,
}

impl HeaderFields {
    pub fn of(h: &Headers) -> HeaderFields {
        let mut out = HeaderFields::default();
        if let Some(req) = &h.request {
            out.request_add = header_options(req);
            out.request_remove = req.remove.clone();
        }
        if let Some(resp) = &h.response {
            out.response_add = header_options(resp);
            out.response_remove = resp.remove.clone();
        }
        out
    }
}

/// `set` overwrites, `add` appends (Istio's meaning of each).
fn header_options(ops: &HeaderOperations) -> Vec<HeaderValueOption> {
    let option = |(key, value): (&String, &String), action: HeaderAppendAction| HeaderValueOption {
        header: Some(HeaderValue { key: key.clone(), value: value.clone(), ..Default::default() }),
        append_action: action as i32,
        ..Default::default()
    };
    let set = ops.set.iter().map(|kv| option(kv, HeaderAppendAction::OverwriteIfExistsOrAdd));
    let add = ops.add.iter().map(|kv| option(kv, HeaderAppendAction::AppendIfExistsOrAdd));
    set.chain(add).collect()
}

fn cors_policy(c: &CorsPolicy) -> EnvoyCors {
    EnvoyCors {
        allow_origin_string_match: c.allow_origins.iter().map(string_matcher).collect(),
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c.max_age.map(|d| d.0.as_secs().to_string()).unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|value| BoolValue { value }),
        ..Default::default()
    }
}

fn string_matcher(m: &StringMatch) -> StringMatcher {
    let pattern = match m {
        StringMatch::Exact(v) => MatchPattern::Exact(v.clone()),
        StringMatch::Prefix(v) => MatchPattern::Prefix(v.clone()),
        StringMatch::Regex(r) => MatchPattern::SafeRegex(RegexMatcher { regex: r.clone(), engine_type: None }),
    };
    StringMatcher { match_pattern: Some(pattern), ..Default::default() }
}

/// Istio's redirect: unset parts keep the request's. A code Envoy cannot
/// send becomes 301, as Pilot does, with a warning.
pub fn redirect_action(r: &Redirect, at: &str, warnings: &mut Vec<Warning>) -> RedirectAction {
    let code = match r.redirect_code {
        None | Some(301) => RedirectResponseCode::MovedPermanently,
        Some(302) => RedirectResponseCode::Found,
        Some(303) => RedirectResponseCode::SeeOther,
        Some(307) => RedirectResponseCode::TemporaryRedirect,
        Some(308) => RedirectResponseCode::PermanentRedirect,
        Some(other) => {
            warnings.push(Warning::new(
                at,
                Reason::Unservable,
                format!("redirect code {other} not supported; 301 sent"),
            ));
            RedirectResponseCode::MovedPermanently
        }
    };
    RedirectAction {
        host_redirect: r.authority.clone().unwrap_or_default(),
        response_code: code as i32,
        scheme_rewrite_specifier: r.scheme.clone().map(SchemeRewriteSpecifier::SchemeRedirect),
        path_rewrite_specifier: r.uri.clone().map(PathRewriteSpecifier::PathRedirect),
        ..Default::default()
    }
}

/// Istio's retries: `attempts: 0` is none at all; a bare status code in
/// `retryOn` is a retriable status code.
pub fn retry_policy(r: &Retry) -> Option<RetryPolicy> {
    if r.attempts == 0 {
        return None;
    }
    let mut on: Vec<&str> = Vec::new();
    let mut codes: Vec<u32> = Vec::new();
    for part in r.retry_on.as_deref().unwrap_or_default().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(code) => codes.push(code),
            Err(_) => on.push(part),
        }
    }
    if !codes.is_empty() && !on.contains(&"retriable-status-codes") {
        on.push("retriable-status-codes");
    }
    Some(RetryPolicy {
        retry_on: on.join(","),
        num_retries: Some(UInt32Value { value: r.attempts }),
        per_try_timeout: r.per_try_timeout.map(duration),
        retriable_status_codes: codes,
        ..Default::default()
    })
}

pub fn duration(d: ProtoDuration) -> Duration {
    Duration {
        seconds: i64::try_from(d.0.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.0.subsec_nanos()).unwrap_or(0),
    }
}
