//! The upstream group, read as Higress reads it (under `higress.io/`, then
//! `nginx.ingress.kubernetes.io/`), into the traffic policy of the
//! DestinationRule of each service an Ingress routes to:
//!
//! - cookie affinity (`affinity`, `session-cookie-name`, `-path`,
//!   `-max-age`, `-expires`) → consistent hash on a cookie Envoy generates;
//! - else `upstream-hash-by` (`$request_uri`, `$host`, `$remote_addr`,
//!   `$http_<name>`, `$arg_<name>`) → consistent hash on that key;
//! - else `load-balance` → a simple load balancer;
//! - `backend-protocol` (`HTTP`, `HTTP2`, `GRPC`, `HTTPS`, `GRPCS`) → HTTP/2
//!   to the upstream and/or TLS origination without certificate checks, as
//!   Higress does.
//!
//! A value that cannot be honoured is a warning naming the annotation, and
//! that rule alone is dropped.

use meshbridge_registries::clip;

use super::syntax::is_token;
use crate::translate::model::{
    ClientTlsMode, ClientTlsSettings, ConnectionPoolSettings, ConsistentHash, H2UpgradePolicy, HttpCookie,
    HttpPoolSettings, LoadBalancerSettings, ProtoDuration, SimpleLb, TrafficPolicy,
};

pub const LOAD_BALANCE: &str = "load-balance";
pub const UPSTREAM_HASH_BY: &str = "upstream-hash-by";
pub const AFFINITY: &str = "affinity";
pub const SESSION_COOKIE_NAME: &str = "session-cookie-name";
pub const SESSION_COOKIE_PATH: &str = "session-cookie-path";
pub const SESSION_COOKIE_MAX_AGE: &str = "session-cookie-max-age";
pub const SESSION_COOKIE_EXPIRES: &str = "session-cookie-expires";
pub const BACKEND_PROTOCOL: &str = "backend-protocol";

/// Higress's defaults for cookie affinity.
const DEFAULT_COOKIE_NAME: &str = "INGRESSCOOKIE";
const DEFAULT_COOKIE_PATH: &str = "/";

/// A found annotation: (the key it was found under, its value).
type Key = Option<(String, String)>;

/// The annotations of the group, each as found under either prefix.
pub struct Found {
    pub load_balance: Key,
    pub hash_by: Key,
    pub affinity: Key,
    pub cookie_name: Key,
    pub cookie_path: Key,
    pub cookie_max_age: Key,
    pub cookie_expires: Key,
    pub backend_protocol: Key,
}

/// The traffic policy the group asks for; `None` when it asks for nothing.
pub fn read(f: &Found, warnings: &mut Vec<String>) -> Option<TrafficPolicy> {
    let load_balancer = load_balancer(f, warnings);
    let (connection_pool, tls) = match &f.backend_protocol {
        None => (None, None),
        Some((key, value)) => backend_protocol(key, value, warnings),
    };
    let policy = TrafficPolicy { load_balancer, connection_pool, tls, ..TrafficPolicy::default() };
    (policy != TrafficPolicy::default()).then_some(policy)
}

fn load_balancer(f: &Found, warnings: &mut Vec<String>) -> Option<LoadBalancerSettings> {
    if f.affinity.is_some() || f.cookie_name.is_some() || f.cookie_path.is_some() {
        if let Some((key, value)) = &f.affinity
            && !value.trim().eq_ignore_ascii_case("cookie")
        {
            warnings
                .push(format!("annotation {key}: {:?} is not supported (only cookie); taken as cookie", clip(value)));
        }
        let name = match &f.cookie_name {
            Some((_, v)) if is_token(v.trim()) => v.trim().to_owned(),
            Some((key, v)) => {
                warnings
                    .push(format!("annotation {key}: {:?} is not a cookie name; {DEFAULT_COOKIE_NAME} used", clip(v)));
                DEFAULT_COOKIE_NAME.to_owned()
            }
            None => DEFAULT_COOKIE_NAME.to_owned(),
        };
        let path = match &f.cookie_path {
            Some((_, v)) if v.starts_with('/') && !v.chars().any(|c| c.is_control() || c == ';') => v.clone(),
            Some((key, v)) => {
                warnings.push(format!("annotation {key}: {:?} is not a cookie path; / used", clip(v)));
                DEFAULT_COOKIE_PATH.to_owned()
            }
            None => DEFAULT_COOKIE_PATH.to_owned(),
        };
        // Higress: max-age, else expires, in seconds; neither makes a session
        // cookie (a TTL of 0).
        let mut ttl = 0;
        for found in [&f.cookie_max_age, &f.cookie_expires].into_iter().flatten() {
            let (key, v) = found;
            match v.trim().parse::<u64>() {
                Ok(secs) if !v.trim().starts_with('+') => {
                    ttl = secs;
                    break;
                }
                _ => {
                    warnings.push(format!("annotation {key}: {:?} is not a whole number of seconds; ignored", clip(v)))
                }
            }
        }
        return Some(LoadBalancerSettings::ConsistentHash(ConsistentHash::HttpCookie(HttpCookie {
            name,
            path,
            ttl: Some(ProtoDuration::from_secs(ttl)),
        })));
    }
    if let Some((key, value)) = &f.hash_by {
        return match hash_key(value.trim()) {
            Some(k) => Some(LoadBalancerSettings::ConsistentHash(k)),
            None => {
                warnings.push(format!(
                    "annotation {key}: {:?} is not a supported key ($request_uri, $host, $remote_addr, \
                     $http_<header>, $arg_<parameter>); not hashed",
                    clip(value)
                ));
                None
            }
        };
    }
    let (key, value) = f.load_balance.as_ref()?;
    let simple = match value.trim().to_ascii_uppercase().as_str() {
        "ROUND_ROBIN" => SimpleLb::RoundRobin,
        "LEAST_CONN" => SimpleLb::LeastConn,
        "LEAST_REQUEST" => SimpleLb::LeastRequest,
        "RANDOM" => SimpleLb::Random,
        _ => {
            warnings.push(format!(
                "annotation {key}: {:?} is not a supported load balancer (round_robin, least_conn, least_request, \
                 random); the default is used",
                clip(value)
            ));
            return None;
        }
    };
    Some(LoadBalancerSettings::Simple(simple))
}

/// ingress-nginx's variables, as Higress maps them. A header variable
/// names the header as nginx does: lowercase, `_` for `-`.
fn hash_key(value: &str) -> Option<ConsistentHash> {
    match value {
        "$request_uri" => return Some(ConsistentHash::HttpHeaderName(":path".into())),
        "$host" => return Some(ConsistentHash::HttpHeaderName(":authority".into())),
        "$remote_addr" => return Some(ConsistentHash::UseSourceIp(true)),
        _ => {}
    }
    if let Some(header) = value.strip_prefix("$http_").filter(|h| is_token(h)) {
        return Some(ConsistentHash::HttpHeaderName(header.replace('_', "-").to_ascii_lowercase()));
    }
    if let Some(param) = value.strip_prefix("$arg_").filter(|p| !p.is_empty() && is_token(p)) {
        return Some(ConsistentHash::HttpQueryParameterName(param.to_owned()));
    }
    None
}

fn backend_protocol(
    key: &str,
    value: &str,
    warnings: &mut Vec<String>,
) -> (Option<ConnectionPoolSettings>, Option<ClientTlsSettings>) {
    let (h2, tls) = match value.trim().to_ascii_uppercase().as_str() {
        "HTTP" => (false, false),
        "HTTP2" | "GRPC" => (true, false),
        "HTTPS" => (false, true),
        "GRPCS" => (true, true),
        _ => {
            warnings.push(format!(
                "annotation {key}: {:?} is not a supported protocol (HTTP, HTTP2, HTTPS, GRPC, GRPCS); HTTP used",
                clip(value)
            ));
            (false, false)
        }
    };
    let pool =
        h2.then_some(ConnectionPoolSettings { http: HttpPoolSettings { h2_upgrade_policy: H2UpgradePolicy::Upgrade } });
    // Higress originates TLS without checking the upstream's certificate.
    let tls =
        tls.then_some(ClientTlsSettings { mode: ClientTlsMode::Simple, sni: None, insecure_skip_verify: Some(true) });
    (pool, tls)
}
