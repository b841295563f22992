//! The route policy annotations of an Ingress, as Higress reads them
//! (`pkg/ingress/kube/annotations/`: `redirect.go`, `timeout.go`,
//! `retry.go`, `header_control.go`, `rewrite.go`, `cors.go`), each becoming
//! a field of the Ingress's HTTPRoutes:
//!
//! | annotations | prefixes | field |
//! | --- | --- | --- |
//! | `ssl-redirect`, `force-ssl-redirect` | both | a `redirect` (308 to `https`) on plain HTTP only |
//! | `temporal-redirect` (302), `permanent-redirect` with `permanent-redirect-code` (301) | both | `redirect` |
//! | `app-root` | both | a `redirect` (302) of `/` on the host |
//! | `timeout` | `higress.io/` | `timeout` |
//! | `proxy-next-upstream-tries`, `-timeout`, `proxy-next-upstream` | both | `retries` |
//! | `request-header-control-*`, `response-header-control-*` | `higress.io/` | `headers` |
//! | `upstream-vhost` | both | `rewrite.authority` |
//! | `enable-cors`, `cors-*` | both | `corsPolicy` |
//!
//! A value Higress would drop or replace by its default is dropped or
//! replaced here too, with a warning naming the annotation.

use std::collections::BTreeMap;

use meshbridge_registries::clip;

use super::fallback::{Fallback, read_fallback};
use super::syntax::{is_token, parse_bool, whole_number};
use super::traffic::{Mirror, read_mirror, read_source_ranges};
use crate::translate::model::{
    CorsPolicy, HeaderOperations, Headers, HttpMatch, HttpRoute, LocalRateLimit, ProtoDuration, Redirect, Retry,
    Rewrite, SourceRanges, StringMatch,
};

const SSL_REDIRECT: &str = "ssl-redirect";
const FORCE_SSL_REDIRECT: &str = "force-ssl-redirect";
const TEMPORAL_REDIRECT: &str = "temporal-redirect";
const PERMANENT_REDIRECT: &str = "permanent-redirect";
const PERMANENT_REDIRECT_CODE: &str = "permanent-redirect-code";
const APP_ROOT: &str = "app-root";
const TIMEOUT: &str = "timeout";
const RETRY_TRIES: &str = "proxy-next-upstream-tries";
const RETRY_TIMEOUT: &str = "proxy-next-upstream-timeout";
const RETRY_ON: &str = "proxy-next-upstream";
const REQUEST_ADD: &str = "request-header-control-add";
const REQUEST_UPDATE: &str = "request-header-control-update";
const REQUEST_REMOVE: &str = "request-header-control-remove";
const RESPONSE_ADD: &str = "response-header-control-add";
const RESPONSE_UPDATE: &str = "response-header-control-update";
const RESPONSE_REMOVE: &str = "response-header-control-remove";
const UPSTREAM_VHOST: &str = "upstream-vhost";
const ENABLE_CORS: &str = "enable-cors";
const CORS_ALLOW_ORIGIN: &str = "cors-allow-origin";
const CORS_ALLOW_METHODS: &str = "cors-allow-methods";
const CORS_ALLOW_HEADERS: &str = "cors-allow-headers";
const CORS_EXPOSE_HEADERS: &str = "cors-expose-headers";
const CORS_ALLOW_CREDENTIALS: &str = "cors-allow-credentials";
const CORS_MAX_AGE: &str = "cors-max-age";
const LIMIT_RPM: &str = "higress.io/route-limit-rpm";
const LIMIT_RPS: &str = "higress.io/route-limit-rps";
const LIMIT_BURST: &str = "higress.io/route-limit-burst-multiplier";
/// Higress's default `route-limit-burst-multiplier`.
const DEFAULT_BURST_MULTIPLIER: u32 = 5;

/// Higress's defaults (and ingress-nginx's).
const DEFAULT_PERMANENT_CODE: u32 = 301;
const TEMPORAL_CODE: u32 = 302;
const SSL_REDIRECT_CODE: u32 = 308;
const APP_ROOT_CODE: u32 = 302;
const DEFAULT_RETRY_ATTEMPTS: u32 = 3;
const DEFAULT_RETRY_ON: &str = "5xx";
const DEFAULT_CORS_METHODS: &str = "GET, PUT, POST, DELETE, PATCH, OPTIONS";
const DEFAULT_CORS_HEADERS: &str = "DNT,X-CustomHeader,Keep-Alive,User-Agent,X-Requested-With,If-Modified-Since,Cache-Control,Content-Type,Authorization";
const DEFAULT_CORS_MAX_AGE: u64 = 1_728_000;
/// The largest `google.protobuf.Duration` (10,000 years).
const MAX_SECONDS: u64 = 315_576_000_000;

/// Looks an annotation up (defined beside the traffic group, which this
/// module reads too).
pub use super::traffic::Lookup;

/// What the policy annotations of one Ingress say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutePolicy {
    /// `temporal-redirect` or `permanent-redirect`: every route redirects
    /// instead of routing.
    pub redirect: Option<Redirect>,
    /// `ssl-redirect` or `force-ssl-redirect`: plain HTTP requests are sent
    /// to `https` with a 308 (Higress's code; ingress-nginx's too).
    pub ssl_redirect: bool,
    /// `app-root`: a request for `/` on the Ingress's hosts is sent here.
    pub app_root: Option<String>,
    pub timeout: Option<ProtoDuration>,
    pub retries: Option<Retry>,
    pub headers: Option<Headers>,
    /// `upstream-vhost`: the Host (authority) sent upstream.
    pub authority: Option<String>,
    pub cors: Option<CorsPolicy>,
    /// `mirror-target-service` or `mirror-target-fqdn`, with
    /// `mirror-percentage` (see `traffic.rs`).
    pub mirror: Option<Mirror>,
    /// `whitelist-source-range`, `denylist-source-range`: the standalone
    /// gateway's only (see `traffic.rs`).
    pub source_ranges: Option<SourceRanges>,
    /// `route-limit-rpm` / `-rps` with `-burst-multiplier` (for istiod, see
    /// `limit.rs`).
    pub rate_limit: Option<LocalRateLimit>,
    /// `default-backend` with `custom-http-errors`: the standalone
    /// gateway's only (see `fallback.rs`).
    pub default_backend: Option<Fallback>,
}

impl RoutePolicy {
    /// The app-root redirect: Higress's code, 302, and only the path.
    pub fn app_root_redirect(path: &str) -> Redirect {
        Redirect { uri: Some(path.to_owned()), redirect_code: Some(APP_ROOT_CODE), ..Default::default() }
    }

    /// Set the route's fields from the policy. A URL redirect replaces the
    /// route's destinations, rewrite, timeout and retries: Istio accepts
    /// none of them beside a redirect, and Pilot would ignore them.
    pub fn apply(&self, route: &mut HttpRoute) {
        route.timeout = self.timeout;
        route.retries = self.retries.clone();
        route.headers = self.headers.clone();
        route.cors_policy = self.cors.clone();
        route.source_ranges = self.source_ranges.clone();
        route.local_rate_limit = self.rate_limit;
        if let Some(authority) = &self.authority {
            let rewrite = route.rewrite.get_or_insert(Rewrite { uri: None, authority: None, uri_regex_rewrite: None });
            rewrite.authority = Some(authority.clone());
        }
        if let Some(redirect) = &self.redirect {
            route.redirect = Some(redirect.clone());
            route.route.clear();
            route.rewrite = None;
            route.timeout = None;
            route.retries = None;
        }
    }

    /// The HTTPS redirect of `main`: its matches, for `http` requests only,
    /// answered with a 308 to `https`. Higress sets the redirect on the
    /// route itself, which sends HTTPS requests round again; a route of its
    /// own before the main one lets them through, on Pilot and on the
    /// standalone gateway alike. It keeps `main`'s headers and CORS, which
    /// Envoy applies to the redirect too.
    pub fn https_redirect_of(main: &HttpRoute) -> HttpRoute {
        let matches = main
            .matches
            .iter()
            .map(|m| HttpMatch { scheme: Some(StringMatch::Exact("http".into())), ..m.clone() })
            .collect();
        let redirect =
            Redirect { scheme: Some("https".into()), redirect_code: Some(SSL_REDIRECT_CODE), ..Default::default() };
        HttpRoute {
            name: format!("{}-ssl-redirect", main.name),
            matches,
            redirect: Some(redirect),
            headers: main.headers.clone(),
            cors_policy: main.cors_policy.clone(),
            source_ranges: main.source_ranges.clone(),
            local_rate_limit: main.local_rate_limit,
            ..Default::default()
        }
    }
}

/// Why a policy annotation's value (or a part of it) was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Not a boolean as Go's `strconv.ParseBool` reads them.
    #[error("{0:?} is not a boolean")]
    Bool(String),
    /// Not a whole number of seconds from 0 to 315576000000.
    #[error("{0:?} is not a whole number of seconds (0 or more)")]
    Seconds(String),
    /// Not a whole number above 0 (a rate or a multiplier).
    #[error("{0:?} is not a whole number above 0")]
    Count(String),
    /// Not a whole number of tries from 0 to 2147483647.
    #[error("{0:?} is not a whole number of tries (0 or more)")]
    Tries(String),
    /// Not `http://` or `https://` followed by a host.
    #[error("{0:?} is not an http or https URL with a host")]
    Url(String),
    /// A redirect code other than 301, 302, 303, 307 or 308.
    #[error("{0:?} is not a redirect code Envoy can send (301, 302, 303, 307 or 308)")]
    RedirectCode(String),
    /// Not an absolute path.
    #[error("{0:?} is not a path starting with '/'")]
    Path(String),
    /// A header line without a value.
    #[error("line {line}: {text:?} is not a header name and a value")]
    HeaderLine { line: usize, text: String },
    /// Not an RFC 7230 token.
    #[error("{0:?} is not a header name")]
    HeaderName(String),
    /// `host` (or `:authority`): Envoy rejects a route that changes it.
    #[error("header {0:?} cannot be changed by header control (upstream-vhost sets the Host)")]
    HostHeader(String),
    /// A header value with a control character.
    #[error("the value of header {0} has a control character")]
    HeaderValue(String),
    /// Not `host[:port]`.
    #[error("{0:?} is not a host with an optional port")]
    Authority(String),
    /// Not one of ingress-nginx's `proxy_next_upstream` conditions.
    #[error(
        "{0:?} is not a condition of proxy-next-upstream (error, timeout, invalid_header, http_NNN, non_idempotent, off)"
    )]
    RetryCondition(String),
    /// An origin that is neither `*` nor `http[s]://host[:port]`, with `*.`
    /// at most at the start of the host.
    #[error("origin {0:?} is not * or http[s]://host[:port] (the host may start with *.)")]
    Origin(String),
    /// `cors-allow-origin` with no usable origin at all.
    #[error("none of the origins given is usable")]
    NoOrigin,
    /// A method or header name that is not a token.
    #[error("{0:?} is not a name")]
    Name(String),
}

/// Read the policy annotations; bad values go to `warnings`, each naming
/// its annotation and what was done instead.
pub fn read(get: &mut Lookup<'_>, warnings: &mut Vec<String>) -> RoutePolicy {
    let mut out = RoutePolicy::default();
    let mut warn = |key: &str, e: PolicyError, then: &str| warnings.push(format!("annotation {key}: {e}; {then}"));

    for key in [SSL_REDIRECT, FORCE_SSL_REDIRECT] {
        if let Some((key, v)) = get(key, true) {
            match bool_value(&v) {
                Ok(b) => out.ssl_redirect |= b,
                Err(e) => warn(&key, e, "taken as false"),
            }
        }
    }
    // Higress: a valid temporal-redirect wins, then permanent-redirect.
    let temporal = get(TEMPORAL_REDIRECT, true);
    let permanent = get(PERMANENT_REDIRECT, true);
    let code = get(PERMANENT_REDIRECT_CODE, true);
    if let Some((key, v)) = temporal.filter(|(_, v)| !v.trim().is_empty()) {
        match redirect_url(&v) {
            Ok(r) => out.redirect = Some(Redirect { redirect_code: Some(TEMPORAL_CODE), ..r }),
            Err(e) => warn(&key, e, "ignored"),
        }
    }
    if let Some((key, v)) = permanent.filter(|(_, v)| !v.trim().is_empty()) {
        match redirect_url(&v) {
            Ok(r) if out.redirect.is_none() => {
                let code = match &code {
                    None => DEFAULT_PERMANENT_CODE,
                    Some((key, c)) => redirect_code(c).unwrap_or_else(|e| {
                        warn(key, e, "301 used");
                        DEFAULT_PERMANENT_CODE
                    }),
                };
                out.redirect = Some(Redirect { redirect_code: Some(code), ..r });
            }
            Ok(_) => {}
            Err(e) => warn(&key, e, "ignored"),
        }
    }
    if let Some((key, v)) = get(APP_ROOT, true).filter(|(_, v)| !v.trim().is_empty()) {
        match path(v.trim()) {
            Ok(p) => out.app_root = Some(p),
            Err(e) => warn(&key, e, "ignored"),
        }
    }

    // Higress reads `timeout` under `higress.io/` only.
    if let Some((key, v)) = get(&format!("higress.io/{TIMEOUT}"), false) {
        match seconds(&v) {
            Ok(0) => {}
            Ok(s) => out.timeout = Some(ProtoDuration::from_secs(s)),
            Err(e) => warn(&key, e, "no timeout set"),
        }
    }

    out.retries = read_retries(get, &mut warn);
    out.headers = read_headers(get, &mut warn);

    if let Some((key, v)) = get(UPSTREAM_VHOST, true).filter(|(_, v)| !v.trim().is_empty()) {
        match authority(v.trim()) {
            Ok(a) => out.authority = Some(a),
            Err(e) => warn(&key, e, "ignored"),
        }
    }

    out.cors = read_cors(get, &mut warn);
    out.rate_limit = read_rate_limit(get, &mut warn);
    out.mirror = read_mirror(get, warnings);
    out.source_ranges = read_source_ranges(get, warnings);
    out.default_backend = read_fallback(get, warnings);
    out
}

/// Higress's local rate limit (`higress.io/` only): `route-limit-rpm`, or
/// else `route-limit-rps`, tokens a minute or a second, and at most that
/// times `route-limit-burst-multiplier` (default 5) kept.
fn read_rate_limit(get: &mut Lookup<'_>, warn: &mut Warn<'_>) -> Option<LocalRateLimit> {
    let (rpm, rps, burst) = (get(LIMIT_RPM, false), get(LIMIT_RPS, false), get(LIMIT_BURST, false));
    let multiplier = match burst {
        None => DEFAULT_BURST_MULTIPLIER,
        Some((key, v)) => rate(&v).unwrap_or_else(|| {
            warn(&key, PolicyError::Count(clip(&v).into_owned()), "5 used");
            DEFAULT_BURST_MULTIPLIER
        }),
    };
    for (found, interval) in [(rpm, 60), (rps, 1)] {
        let Some((key, v)) = found else { continue };
        let Some(n) = rate(&v) else {
            warn(&key, PolicyError::Count(clip(&v).into_owned()), "ignored");
            continue;
        };
        let Some(max_tokens) = n.checked_mul(multiplier) else {
            warn(&key, PolicyError::Count(clip(&v).into_owned()), "too large with its burst multiplier; ignored");
            continue;
        };
        return Some(LocalRateLimit { max_tokens, tokens_per_fill: n, fill_interval_secs: interval });
    }
    None
}

/// A rate or a multiplier: a whole number from 1 to 4294967295.
fn rate(v: &str) -> Option<u32> {
    whole_number(v).and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0)
}

type Warn<'w> = dyn FnMut(&str, PolicyError, &str) + 'w;

/// Higress's retry: any of the three annotations makes a retry policy of 3
/// attempts on `5xx`, which they then change.
fn read_retries(get: &mut Lookup<'_>, warn: &mut Warn<'_>) -> Option<Retry> {
    let (tries, per_try, on) = (get(RETRY_TRIES, true), get(RETRY_TIMEOUT, true), get(RETRY_ON, true));
    if tries.is_none() && per_try.is_none() && on.is_none() {
        return None;
    }
    let mut retry =
        Retry { attempts: DEFAULT_RETRY_ATTEMPTS, per_try_timeout: None, retry_on: Some(DEFAULT_RETRY_ON.into()) };
    if let Some((key, v)) = tries {
        match self::tries(&v) {
            Ok(n) => retry.attempts = n,
            Err(e) => warn(&key, e, "3 used"),
        }
    }
    if let Some((key, v)) = per_try {
        match seconds(&v) {
            Ok(0) => {}
            Ok(s) => retry.per_try_timeout = Some(ProtoDuration::from_secs(s)),
            Err(e) => warn(&key, e, "no per-try timeout set"),
        }
    }
    if let Some((key, v)) = on {
        let (on, bad) = retry_on(&v);
        for b in bad {
            warn(&key, b, "left out");
        }
        match on {
            RetryOn::Off => retry = Retry { attempts: 0, per_try_timeout: None, retry_on: None },
            RetryOn::Conditions(c) if c.is_empty() => {}
            RetryOn::Conditions(c) => retry.retry_on = Some(c),
        }
    }
    Some(retry)
}

/// Higress's header control, read under `higress.io/` only. A line or name
/// that cannot be used is left out; the rest apply.
fn read_headers(get: &mut Lookup<'_>, warn: &mut Warn<'_>) -> Option<Headers> {
    let mut side = |add: &str, update: &str, remove: &str, request: bool| {
        let mut ops = HeaderOperations::default();
        for (name, into) in [(add, &mut ops.add), (update, &mut ops.set)] {
            if let Some((key, v)) = get(&format!("higress.io/{name}"), false) {
                let (map, bad) = header_lines(&v, request);
                for b in bad {
                    warn(&key, b, "line left out");
                }
                *into = map;
            }
        }
        if let Some((key, v)) = get(&format!("higress.io/{remove}"), false) {
            let (names, bad) = header_names(&v, request);
            for b in bad {
                warn(&key, b, "left out");
            }
            ops.remove = names;
        }
        (ops != HeaderOperations::default()).then_some(ops)
    };
    let request = side(REQUEST_ADD, REQUEST_UPDATE, REQUEST_REMOVE, true);
    let response = side(RESPONSE_ADD, RESPONSE_UPDATE, RESPONSE_REMOVE, false);
    (request.is_some() || response.is_some()).then_some(Headers { request, response })
}

/// Higress's CORS: only with `enable-cors` true, then its defaults for what
/// the other annotations leave unset.
fn read_cors(get: &mut Lookup<'_>, warn: &mut Warn<'_>) -> Option<CorsPolicy> {
    let (key, v) = get(ENABLE_CORS, true)?;
    match bool_value(&v) {
        Ok(true) => {}
        Ok(false) => return None,
        Err(e) => {
            warn(&key, e, "taken as false");
            return None;
        }
    }
    let mut names = |annotation: &str, default: &str| -> Vec<String> {
        let (key, v) = get(annotation, true).unwrap_or_else(|| (String::new(), default.to_owned()));
        let (list, bad) = name_list(&v);
        for b in bad {
            warn(&key, b, "left out");
        }
        list
    };
    let allow_methods = names(CORS_ALLOW_METHODS, DEFAULT_CORS_METHODS);
    let allow_headers = names(CORS_ALLOW_HEADERS, DEFAULT_CORS_HEADERS);
    let expose_headers = names(CORS_EXPOSE_HEADERS, "");
    let mut cors = CorsPolicy {
        allow_origins: vec![StringMatch::Regex(".*".into())],
        allow_methods,
        allow_headers,
        expose_headers,
        max_age: Some(ProtoDuration::from_secs(DEFAULT_CORS_MAX_AGE)),
        allow_credentials: Some(true),
    };
    if let Some((key, v)) = get(CORS_ALLOW_ORIGIN, true) {
        let (origins, bad) = origins(&v);
        for b in bad {
            warn(&key, b, "left out");
        }
        if origins.is_empty() {
            warn(&key, PolicyError::NoOrigin, "no origin is allowed");
        }
        cors.allow_origins = origins;
    }
    if let Some((key, v)) = get(CORS_ALLOW_CREDENTIALS, true) {
        match bool_value(&v) {
            Ok(b) => cors.allow_credentials = Some(b),
            Err(e) => warn(&key, e, "true used"),
        }
    }
    if let Some((key, v)) = get(CORS_MAX_AGE, true) {
        match seconds(&v) {
            Ok(s) => cors.max_age = Some(ProtoDuration::from_secs(s)),
            Err(e) => warn(&key, e, "1728000 used"),
        }
    }
    Some(cors)
}

fn bool_value(v: &str) -> Result<bool, PolicyError> {
    parse_bool(v.trim()).ok_or_else(|| PolicyError::Bool(clip(v).into_owned()))
}

/// A whole number of seconds, as Higress's `strconv.Atoi`, but never
/// negative (Istio rejects a negative duration).
pub fn seconds(v: &str) -> Result<u64, PolicyError> {
    whole_number(v).filter(|s| *s <= MAX_SECONDS).ok_or_else(|| PolicyError::Seconds(clip(v).into_owned()))
}

/// `proxy-next-upstream-tries`: Istio's `attempts` (an int32).
pub fn tries(v: &str) -> Result<u32, PolicyError> {
    whole_number(v)
        .filter(|n| *n <= i32::MAX as u64)
        .map(|n| n as u32)
        .ok_or_else(|| PolicyError::Tries(clip(v).into_owned()))
}

/// `http[s]://authority[/path][?query][#fragment]` → the redirect of
/// scheme, authority and path (Higress's `HTTPRedirect{Scheme, Authority,
/// Uri: Path}`; the query is not kept, and no path keeps the request's).
pub fn redirect_url(v: &str) -> Result<Redirect, PolicyError> {
    let bad = || PolicyError::Url(clip(v).into_owned());
    let t = v.trim();
    let (scheme, rest) = t.split_once("://").ok_or_else(bad)?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(bad());
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (host, tail) = rest.split_at(end);
    let host = authority(host).map_err(|_| bad())?;
    let path = &tail[..tail.find(['?', '#']).unwrap_or(tail.len())];
    if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(bad());
    }
    Ok(Redirect {
        uri: (!path.is_empty()).then(|| path.to_owned()),
        authority: Some(host),
        scheme: Some(scheme),
        redirect_code: None,
    })
}

/// `permanent-redirect-code`: Higress takes 300–308 and falls back to 301;
/// Envoy can only send these five.
pub fn redirect_code(v: &str) -> Result<u32, PolicyError> {
    match v.trim().parse::<u32>() {
        Ok(c @ (301 | 302 | 303 | 307 | 308)) if !v.trim().starts_with('+') => Ok(c),
        _ => Err(PolicyError::RedirectCode(clip(v).into_owned())),
    }
}

/// An absolute path without spaces or control characters.
pub fn path(v: &str) -> Result<String, PolicyError> {
    let ok = v.starts_with('/') && !v.bytes().any(|b| b.is_ascii_control() || b == b' ');
    ok.then(|| v.to_owned()).ok_or_else(|| PolicyError::Path(clip(v).into_owned()))
}

/// `host[:port]`: a DNS name or IPv4 address (letters, digits, `.`, `-`,
/// `_`) or a bracketed IPv6 address, and a port from 1 to 65535.
pub fn authority(v: &str) -> Result<String, PolicyError> {
    let bad = || PolicyError::Authority(clip(v).into_owned());
    let (host_ok, port) = match v.strip_prefix('[') {
        Some(rest) => {
            let (ip, after) = rest.split_once(']').ok_or_else(bad)?;
            let ip_ok = !ip.is_empty() && ip.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
            let port = match after {
                "" => None,
                a => Some(a.strip_prefix(':').ok_or_else(bad)?),
            };
            (ip_ok, port)
        }
        None => {
            let (host, port) = match v.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (v, None),
            };
            let ok = !host.is_empty()
                && host.len() <= 253
                && !host.starts_with(['.', '-'])
                && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
            (ok, port)
        }
    };
    let port_ok = port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok_and(|n| n > 0));
    (host_ok && port_ok).then(|| v.to_owned()).ok_or_else(bad)
}

/// What `proxy-next-upstream` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryOn {
    /// `off`: no retries at all.
    Off,
    /// Envoy's `retry_on`, as Higress builds it: `error`, `timeout` and
    /// `invalid_header` become `5xx`, `http_NNN` a retriable status code.
    /// Empty when nothing usable was given (the default `5xx` stays).
    Conditions(String),
}

/// Split as Higress does (on commas when there is one, else on spaces) and
/// translate each condition. `non_idempotent` is accepted and needs
/// nothing: Envoy retries requests whatever their method.
pub fn retry_on(v: &str) -> (RetryOn, Vec<PolicyError>) {
    let parts: Vec<&str> =
        if v.contains(',') { v.split(',').map(str::trim).collect() } else { v.split_whitespace().collect() };
    let mut five_xx = false;
    let mut codes: Vec<String> = Vec::new();
    let mut bad = Vec::new();
    for p in parts.into_iter().filter(|p| !p.is_empty()) {
        match p {
            "off" => return (RetryOn::Off, bad),
            "error" | "timeout" | "invalid_header" => five_xx = true,
            "non_idempotent" => {}
            _ => match p.strip_prefix("http_").and_then(|c| c.parse::<u16>().ok().filter(|c| (100..600).contains(c))) {
                Some(code) if p.len() == 8 => {
                    if !codes.contains(&code.to_string()) {
                        codes.push(code.to_string());
                    }
                }
                _ => bad.push(PolicyError::RetryCondition(clip(p).into_owned())),
            },
        }
    }
    let mut on: Vec<String> = Vec::new();
    if five_xx {
        on.push(DEFAULT_RETRY_ON.into());
    }
    if !codes.is_empty() {
        on.push("retriable-status-codes".into());
        on.extend(codes);
    }
    (RetryOn::Conditions(on.join(",")), bad)
}

/// Header lines, `name value` each (split at the first run of spaces;
/// quotes around either are dropped, as Higress does). Names are
/// lowercased; a later line for the same name wins.
pub fn header_lines(v: &str, request: bool) -> (BTreeMap<String, String>, Vec<PolicyError>) {
    let mut out = BTreeMap::new();
    let mut bad = Vec::new();
    for (i, line) in v.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((name, value)) = line.split_once(|c: char| c.is_whitespace()) else {
            bad.push(PolicyError::HeaderLine { line: i + 1, text: clip(line).into_owned() });
            continue;
        };
        let name = match header_name(trim_quotes(name.trim()), request) {
            Ok(n) => n,
            Err(e) => {
                bad.push(e);
                continue;
            }
        };
        let value = trim_quotes(value.trim());
        if value.chars().any(char::is_control) {
            bad.push(PolicyError::HeaderValue(clip(&name).into_owned()));
            continue;
        }
        out.insert(name, value.to_owned());
    }
    (out, bad)
}

/// Comma-separated header names to remove.
pub fn header_names(v: &str, request: bool) -> (Vec<String>, Vec<PolicyError>) {
    let mut out: Vec<String> = Vec::new();
    let mut bad = Vec::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match header_name(name, request) {
            Ok(n) if !out.contains(&n) => out.push(n),
            Ok(_) => {}
            Err(e) => bad.push(e),
        }
    }
    (out, bad)
}

fn header_name(name: &str, request: bool) -> Result<String, PolicyError> {
    let lower = name.to_ascii_lowercase();
    if request && (lower == "host" || lower == ":authority") {
        return Err(PolicyError::HostHeader(clip(name).into_owned()));
    }
    if !is_token(&lower) {
        return Err(PolicyError::HeaderName(clip(name).into_owned()));
    }
    Ok(lower)
}

fn trim_quotes(s: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    s
}

/// A comma-separated list of names (methods, headers); `*` anywhere makes
/// it `*` alone, as in Higress.
pub fn name_list(v: &str) -> (Vec<String>, Vec<PolicyError>) {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item == "*" {
            return (vec!["*".into()], Vec::new());
        }
        if is_token(item) {
            out.push(item.to_owned());
        } else {
            bad.push(PolicyError::Name(clip(item).into_owned()));
        }
    }
    (out, bad)
}

/// `cors-allow-origin`: comma-separated; `*` allows every origin, an exact
/// origin allows itself, and `scheme://*.example.com` any subdomain of
/// `example.com` with that scheme (Higress's regex leaves the scheme out).
pub fn origins(v: &str) -> (Vec<StringMatch>, Vec<PolicyError>) {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item == "*" {
            return (vec![StringMatch::Regex(".*".into())], Vec::new());
        }
        let err = || PolicyError::Origin(clip(item).into_owned());
        let Some((scheme, host)) = item.split_once("://") else {
            bad.push(err());
            continue;
        };
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            bad.push(err());
            continue;
        }
        match host.strip_prefix("*.") {
            Some(suffix) if !suffix.contains('*') && authority(suffix).is_ok() && !suffix.starts_with('[') => {
                let escaped = suffix.replace('.', r"\.");
                out.push(StringMatch::Regex(format!(r"{scheme}://[^/]+\.{escaped}")));
            }
            None if !host.contains('*') && authority(host).is_ok() => {
                out.push(StringMatch::Exact(format!("{scheme}://{host}")));
            }
            _ => bad.push(err()),
        }
    }
    (out, bad)
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
