//! The Ingress annotations the translation understands, read once per
//! Ingress. Like Higress, `rewrite-target`, `use-regex` and `ignore-path-case` are read
//! under both `higress.io/` and `nginx.ingress.kubernetes.io/` (Higress's
//! "ASAP" keys, `higress.io/` first); `destination`, `rewrite-path` and `full-path-regex` only
//! under `higress.io/`. The canary group (`canary`, `canary-by-*`,
//! `canary-weight*`) is read under both prefixes too, and so are the route
//! policy annotations, each under the prefixes Higress reads it with (see
//! [`policy`]), and `auth-tls-secret` ([`downstream`]). Any other key under
//! those two prefixes is counted as ignored.

use std::collections::BTreeMap;

use meshbridge_registries::clip;

use super::downstream::{self, ClientCa};
use super::policy::{self, RoutePolicy};
use super::syntax::{is_token, parse_bool};
use super::upstream;
use crate::model::ingress::has_sign;
pub use crate::model::ingress::{
    DESTINATION, DestinationError, McpDestination, Metadata, parse_destination, valid_dns_label,
};
use crate::translate::model::{HttpMatch, StringMatch, TrafficPolicy};

const HIGRESS: &str = "higress.io/";
const NGINX: &str = "nginx.ingress.kubernetes.io/";

const REWRITE_PATH: &str = "higress.io/rewrite-path";
const REWRITE_TARGET: &str = "rewrite-target";
const USE_REGEX: &str = "use-regex";
const FULL_PATH_REGEX: &str = "higress.io/full-path-regex";
/// What makes a path a regex for Higress, with a `rewrite-target` set.
const REGEX_META: &str = r"\.+*?()|[]{}^$";
const IGNORE_PATH_CASE: &str = "ignore-path-case";
const MATCH_METHOD: &str = "match-method";
/// The methods `match-method` takes, as Higress's `methodList`.
const METHODS: [&str; 9] = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];
const CANARY: &str = "canary";
const CANARY_BY_HEADER: &str = "canary-by-header";
const CANARY_BY_HEADER_VALUE: &str = "canary-by-header-value";
const CANARY_BY_HEADER_PATTERN: &str = "canary-by-header-pattern";
const CANARY_BY_COOKIE: &str = "canary-by-cookie";
const CANARY_WEIGHT: &str = "canary-weight";
const CANARY_WEIGHT_TOTAL: &str = "canary-weight-total";
/// The canary group, in the order [`read_canary`] takes their values.
const CANARY_KEYS: [&str; 7] = [
    CANARY,
    CANARY_BY_HEADER,
    CANARY_BY_HEADER_VALUE,
    CANARY_BY_HEADER_PATTERN,
    CANARY_BY_COOKIE,
    CANARY_WEIGHT,
    CANARY_WEIGHT_TOTAL,
];
/// Higress's and ingress-nginx's default `canary-weight-total`.
const DEFAULT_WEIGHT_TOTAL: u32 = 100;

/// What one Ingress's annotations say.
#[derive(Debug)]
pub struct IngressAnnotations {
    /// `higress.io/destination`, parsed; `None` when absent.
    pub destination: Option<Result<Vec<McpDestination>, DestinationError>>,
    /// The rewrite for this Ingress's paths.
    pub rewrite: Option<RewriteRule>,
    /// What makes this Ingress's paths regexes ([`Self::regex_path`]).
    pub regex: RegexSettings,
    pub ignore_path_case: bool,
    /// `Some` when `canary` is true: this Ingress's paths attach to the
    /// non-canary routes they repeat instead of making routes of their own.
    pub canary: Option<Canary>,
    /// The upstream group's traffic policy, for the DestinationRule of every
    /// service this Ingress routes to; `None` when it sets none. A `MUTUAL`
    /// policy's `credentialName` is left for the translator to fill from
    /// `client_secret`.
    pub upstream: Option<TrafficPolicy>,
    /// `proxy-ssl-secret`, when the policy is `MUTUAL`.
    pub client_secret: Option<upstream::ClientSecret>,
    /// `auth-tls-secret`: the CA client certificates on this Ingress's TLS
    /// hosts are verified against.
    pub client_ca: Option<ClientCa>,
    /// Redirects, timeout, retries, header control, upstream-vhost, CORS.
    pub policy: RoutePolicy,
    /// `match-method`, `*-match-header-*`, `*-match-query-*`.
    pub conditions: Conditions,
    /// `higress.io/*` and `nginx.ingress.kubernetes.io/*` keys not understood, in key order.
    pub ignored: Vec<String>,
    /// Annotations that were understood but whose value was not.
    pub warnings: Vec<String>,
}

/// Higress's request conditions (its `match.go`): `match-method` (under
/// both prefixes), and `{exact,regex,prefix}-match-header-NAME` and
/// `{exact,regex,prefix}-match-query-NAME` (under `higress.io/` only). Every
/// match of the Ingress's routes gets them, so two Ingresses on one host
/// and path with different conditions make two routes, the one with more
/// conditions first. A header a canary rule matches keeps the canary's
/// value, as in Higress.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conditions {
    /// Upper case, each once, in the order given.
    pub methods: Vec<String>,
    /// Lowercase header name → how its value must match.
    pub headers: BTreeMap<String, StringMatch>,
    /// Query parameter name → how its value must match.
    pub query: BTreeMap<String, StringMatch>,
}

impl Conditions {
    /// Add the conditions to `m`; a header or parameter `m` matches already
    /// keeps its own.
    pub fn apply(&self, m: &mut HttpMatch) {
        if !self.methods.is_empty() {
            m.method = Some(StringMatch::Regex(self.methods.join("|")));
        }
        for (name, value) in &self.headers {
            m.headers.entry(name.clone()).or_insert_with(|| value.clone());
        }
        for (name, value) in &self.query {
            m.query_params.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }

    /// How specific the conditions are, for ordering routes of one path:
    /// a method first, then more headers, then more query parameters (the
    /// order Istio gives Gateway API routes).
    pub fn specificity(&self) -> (bool, usize, usize) {
        (!self.methods.is_empty(), self.headers.len(), self.query.len())
    }

    /// Read the conditions of `meta`; returns the keys read.
    fn read(
        meta: &Metadata,
        method: Option<(String, String)>,
        warnings: &mut Vec<String>,
    ) -> (Conditions, Vec<String>) {
        let mut out = Conditions::default();
        let mut used = Vec::new();
        if let Some((key, value)) = method {
            for m in value.split_whitespace() {
                let m = m.to_ascii_uppercase();
                if !METHODS.contains(&m.as_str()) {
                    warnings.push(format!("annotation {key}: {:?} is not an HTTP method; left out", clip(&m)));
                } else if !out.methods.contains(&m) {
                    out.methods.push(m);
                }
            }
        }
        for key in meta.annotation_keys() {
            let Some(rest) = key.strip_prefix(HIGRESS) else { continue };
            let Some((kind, what, name)) = ["exact", "regex", "prefix"].iter().find_map(|kind| {
                let rest = rest.strip_prefix(kind)?.strip_prefix("-match-")?;
                ["header", "query"]
                    .iter()
                    .find_map(|what| Some((*kind, *what, rest.strip_prefix(what)?.strip_prefix('-')?)))
            }) else {
                continue;
            };
            used.push(key.to_owned());
            let value = meta.annotation(key).unwrap_or_default().to_owned();
            let name = if what == "header" { name.to_ascii_lowercase() } else { name.to_owned() };
            if what == "header" && !is_token(&name) || name.is_empty() {
                warnings.push(format!("annotation {}: {:?} is not a {what} name; left out", clip(key), clip(&name)));
                continue;
            }
            let value = match kind {
                "exact" => StringMatch::Exact(value),
                "prefix" => StringMatch::Prefix(value),
                _ => match regex_syntax::Parser::new().parse(&value) {
                    Ok(_) => StringMatch::Regex(value),
                    Err(e) => {
                        let e = e.to_string();
                        let why = e.lines().last().unwrap_or_default().trim_start_matches("error: ").to_owned();
                        warnings.push(format!(
                            "annotation {}: {:?} is not a valid RE2 regex ({why}); left out",
                            clip(key),
                            clip(&value)
                        ));
                        continue;
                    }
                },
            };
            let map = if what == "header" { &mut out.headers } else { &mut out.query };
            map.insert(name, value);
        }
        (out, used)
    }
}

/// How the matched path is rewritten before it is sent upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RewriteRule {
    /// `higress.io/rewrite-path`: the matched prefix is replaced (Istio
    /// `rewrite.uri`).
    Path(String),
    /// `rewrite-target`: Higress substitutes the target for a regex match of
    /// the Ingress path (Istio `rewrite.uriRegexRewrite`).
    Target(String),
}

/// The rules of a canary Ingress that survived parsing, highest precedence
/// first. None at all still makes it a canary (of weight 0), as in Higress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Canary {
    pub header: Option<CanaryHeader>,
    /// `canary-by-cookie`: the cookie's name, checked to be a token.
    pub cookie: Option<String>,
    pub weight: Option<CanaryWeight>,
}

/// `canary-by-header` and how its value sends a request to the canary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanaryHeader {
    /// Lowercase, as Istio requires of header match keys.
    pub name: String,
    pub rule: HeaderRule,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderRule {
    /// The header alone: `always` → canary, `never` → main.
    AlwaysNever,
    /// `canary-by-header-value`: this exact value → canary.
    Value(String),
    /// `canary-by-header-pattern`: a value the regex finds a match in →
    /// canary.
    Pattern(String),
}

/// `canary-weight` out of `canary-weight-total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CanaryWeight {
    pub weight: u32,
    pub total: u32,
}

/// A path matched as a regex: Higress's `PrefixRegex` and `FullPathRegex`
/// path types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RegexPath {
    /// The regex matches the start of the request path (`PATH.*`).
    Prefix,
    /// It matches the whole request path (`PATH$`).
    Full,
}

/// The annotations that make an Ingress's paths regexes, as Higress reads
/// them (its `NeedRegexMatch`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegexSettings {
    /// `use-regex: "true"`.
    pub use_regex: bool,
    /// `higress.io/full-path-regex: "true"`.
    pub full_path: bool,
    /// A `rewrite-target` is applied (no `rewrite-path` beside it).
    pub target: bool,
    /// That target refers to captures (`$1`, `\1`): every path is a regex.
    pub captures: bool,
}

impl IngressAnnotations {
    /// Whether `path` is matched as a regex, and how: with `use-regex` or
    /// `full-path-regex`, with a `rewrite-target` that names captures, or
    /// with any `rewrite-target` when the path has a regex metacharacter.
    pub fn regex_path(&self, path: &str) -> Option<RegexPath> {
        let r = &self.regex;
        let meta = r.target && path.contains(|c| REGEX_META.contains(c));
        let regex = meta || r.captures || r.use_regex || r.full_path;
        regex.then_some(if r.full_path { RegexPath::Full } else { RegexPath::Prefix })
    }
}

impl IngressAnnotations {
    /// Read `meta`'s annotations; `namespace` is the Ingress's.
    pub fn read(meta: &Metadata, namespace: &str) -> IngressAnnotations {
        let mut out = IngressAnnotations {
            destination: None,
            rewrite: None,
            regex: RegexSettings::default(),
            ignore_path_case: false,
            canary: None,
            upstream: None,
            client_secret: None,
            client_ca: None,
            policy: RoutePolicy::default(),
            conditions: Conditions::default(),
            ignored: Vec::new(),
            warnings: Vec::new(),
        };
        let mut used: Vec<String> = vec![DESTINATION.to_owned()];
        let mut get = |key: &str, both_prefixes: bool| -> Option<(String, String)> {
            let keys: Vec<String> = if both_prefixes {
                vec![format!("{HIGRESS}{key}"), format!("{NGINX}{key}")]
            } else {
                vec![key.to_owned()]
            };
            used.extend(keys.iter().cloned());
            keys.into_iter().find_map(|k| meta.annotation(&k).map(|v| (k, v.to_owned())))
        };

        // Parsed with the Ingress, where it came in.
        out.destination = meta.destination().cloned();

        let rewrite_path = get(REWRITE_PATH, false).filter(|(_, v)| !v.is_empty());
        let rewrite_target = get(REWRITE_TARGET, true).filter(|(_, v)| !v.is_empty());
        // Higress prefers rewrite-path when both are set.
        out.rewrite = match (rewrite_path, rewrite_target) {
            (Some((_, path)), _) => Some(RewriteRule::Path(path)),
            (None, Some((_, target))) => {
                out.regex.target = true;
                out.regex.captures = target.contains(['$', '\\']);
                Some(RewriteRule::Target(re2_rewrite(&target)))
            }
            (None, None) => None,
        };
        for (name, both_prefixes) in [(USE_REGEX, true), (FULL_PATH_REGEX, false)] {
            let Some((key, value)) = get(name, both_prefixes) else { continue };
            let Some(on) = parse_bool(&value) else {
                out.warnings.push(format!("annotation {key}: {:?} is not a boolean; taken as false", clip(&value)));
                continue;
            };
            if name == USE_REGEX {
                out.regex.use_regex = on;
            } else {
                out.regex.full_path = on;
            }
        }

        if let Some((key, value)) = get(IGNORE_PATH_CASE, true) {
            match parse_bool(&value) {
                Some(b) => out.ignore_path_case = b,
                None => {
                    out.warnings.push(format!("annotation {key}: {:?} is not a boolean; taken as false", clip(&value)))
                }
            }
        }

        let found = upstream::Found {
            load_balance: get(upstream::LOAD_BALANCE, true),
            hash_by: get(upstream::UPSTREAM_HASH_BY, true),
            affinity: get(upstream::AFFINITY, true),
            cookie_name: get(upstream::SESSION_COOKIE_NAME, true),
            cookie_path: get(upstream::SESSION_COOKIE_PATH, true),
            cookie_max_age: get(upstream::SESSION_COOKIE_MAX_AGE, true),
            cookie_expires: get(upstream::SESSION_COOKIE_EXPIRES, true),
            backend_protocol: get(upstream::BACKEND_PROTOCOL, true),
            ssl_secret: get(upstream::PROXY_SSL_SECRET, true),
            ssl_verify: get(upstream::PROXY_SSL_VERIFY, true),
            ssl_name: get(upstream::PROXY_SSL_NAME, true),
            ssl_server_name: get(upstream::PROXY_SSL_SERVER_NAME, true),
        };
        (out.upstream, out.client_secret) = upstream::read(&found, namespace, &mut out.warnings);
        out.client_ca = downstream::read(get(downstream::AUTH_TLS_SECRET, true), namespace, &mut out.warnings);

        let canary: Vec<Option<(String, String)>> = CANARY_KEYS.iter().map(|k| get(k, true)).collect();
        out.canary = read_canary(&canary, &mut out.warnings);
        out.policy = policy::read(&mut get, &mut out.warnings);
        let method = get(MATCH_METHOD, true);
        let (conditions, condition_keys) = Conditions::read(meta, method, &mut out.warnings);
        out.conditions = conditions;
        used.extend(condition_keys);

        let mut ignored: Vec<String> = meta
            .annotation_keys()
            .filter(|k| (k.starts_with(HIGRESS) || k.starts_with(NGINX)) && !used.iter().any(|u| u == k))
            .map(|k| clip(k).to_string())
            .collect();
        ignored.sort();
        out.ignored = ignored;
        out
    }
}

/// The canary group, given as the (key, value) found for each of
/// [`CANARY_KEYS`]. Unlike Higress, which keeps only the highest of header,
/// cookie and weight, every valid rule is kept, as ingress-nginx does: a
/// request the header leaves undecided goes on to the cookie, then to the
/// weight. A rule whose value
/// is bad is dropped with a warning naming the annotation; the others stay.
fn read_canary(found: &[Option<(String, String)>], warnings: &mut Vec<String>) -> Option<Canary> {
    let [enabled, header, value, pattern, cookie, weight, total] = found else { return None };
    let non_empty = |f: &Option<(String, String)>| f.clone().filter(|(_, v)| !v.trim().is_empty());
    let (key, on) = enabled.as_ref()?;
    match parse_bool(on.trim()) {
        Some(true) => {}
        Some(false) => return None,
        None => {
            warnings.push(format!("annotation {key}: {:?} is not a boolean; taken as false", clip(on)));
            return None;
        }
    }
    let mut canary = Canary::default();

    let (value, pattern) = (non_empty(value), non_empty(pattern));
    match non_empty(header) {
        None => {
            for (key, _) in value.iter().chain(&pattern) {
                warnings.push(format!("annotation {key} has no effect without {CANARY_BY_HEADER}"));
            }
        }
        Some((key, name)) if !is_token(name.trim()) => {
            warnings.push(format!("annotation {key}: {:?} is not a header name; header rule dropped", clip(&name)))
        }
        Some((_, name)) => {
            let name = name.trim().to_ascii_lowercase();
            // ingress-nginx: the value wins over the pattern.
            let rule = match (value, pattern) {
                (Some((_, v)), _) => Some(HeaderRule::Value(v)),
                (None, Some((key, p))) => match regex_syntax::Parser::new().parse(&p) {
                    Ok(_) => Some(HeaderRule::Pattern(p)),
                    Err(e) => {
                        let e = e.to_string();
                        let why = e.lines().last().unwrap_or_default().trim_start_matches("error: ");
                        warnings.push(format!(
                            "annotation {key}: {:?} is not a valid RE2 regex ({why}); header rule dropped",
                            clip(&p)
                        ));
                        None
                    }
                },
                (None, None) => Some(HeaderRule::AlwaysNever),
            };
            canary.header = rule.map(|rule| CanaryHeader { name, rule });
        }
    }

    if let Some((key, name)) = non_empty(cookie) {
        let name = name.trim();
        if is_token(name) {
            canary.cookie = Some(name.to_owned());
        } else {
            warnings.push(format!("annotation {key}: {:?} is not a cookie name; cookie rule dropped", clip(name)));
        }
    }

    let number = |v: &str| v.trim().parse::<u32>().ok().filter(|_| !has_sign(v.trim()));
    // `None`: the total is bad, and reported.
    let total = match total {
        None => Some(DEFAULT_WEIGHT_TOTAL),
        Some((key, t)) => {
            let n = number(t).filter(|t| *t > 0);
            if n.is_none() {
                warnings.push(format!(
                    "annotation {key}: {:?} is not a whole number above 0; weight rule dropped",
                    clip(t)
                ));
            }
            n
        }
    };
    if let Some((key, w)) = weight {
        match (number(w), total) {
            (None, _) => warnings.push(format!(
                "annotation {key}: {:?} is not a whole number from 0 to the total; weight rule dropped",
                clip(w)
            )),
            (Some(_), None) => {}
            (Some(weight), Some(total)) if weight > total => warnings
                .push(format!("annotation {key}: {weight} is more than the total of {total}; weight rule dropped")),
            (Some(weight), Some(total)) => canary.weight = Some(CanaryWeight { weight, total }),
        }
    }
    Some(canary)
}

/// A `rewrite-target` as RE2 writes substitutions: nginx's `$1` becomes
/// `\1`, as Higress converts it (every `$`, once one is followed by a
/// digit).
fn re2_rewrite(target: &str) -> String {
    let nginx_refs = target.as_bytes().windows(2).any(|w| w[0] == b'$' && w[1].is_ascii_digit());
    if nginx_refs { target.replace('$', "\\") } else { target.to_owned() }
}

#[cfg(test)]
#[path = "annotations_tests.rs"]
mod tests;
