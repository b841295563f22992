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
//!   Higress does;
//! - `proxy-ssl-secret`, `-verify`, `-name`, `-server-name` → mutual TLS to
//!   the upstream, as Higress's `upstreamtls.go` reads them (see [`tls`]).
//!
//! A value that cannot be honoured is a warning naming the annotation, and
//! that rule alone is dropped.

use meshbridge_registries::clip;
use meshbridge_registries::names::is_host_name;

use super::syntax::is_token;
use crate::model::ingress::secret_ref;
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
pub const PROXY_SSL_SECRET: &str = "proxy-ssl-secret";
pub const PROXY_SSL_VERIFY: &str = "proxy-ssl-verify";
pub const PROXY_SSL_NAME: &str = "proxy-ssl-name";
pub const PROXY_SSL_SERVER_NAME: &str = "proxy-ssl-server-name";

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
    pub ssl_secret: Key,
    pub ssl_verify: Key,
    pub ssl_name: Key,
    pub ssl_server_name: Key,
}

/// The Secret `proxy-ssl-secret` names for the client certificate: its
/// `credentialName` is filled in by the caller, which knows the gateway's
/// namespace and which Secrets exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSecret {
    /// The annotation it was found under, for warnings.
    pub key: String,
    pub namespace: String,
    pub name: String,
}

/// The traffic policy the group asks for (`None` when it asks for
/// nothing), and the Secret of a `MUTUAL` policy's client certificate.
/// `namespace` is the Ingress's, where a Secret named without one is.
pub fn read(f: &Found, namespace: &str, warnings: &mut Vec<String>) -> (Option<TrafficPolicy>, Option<ClientSecret>) {
    let load_balancer = load_balancer(f, warnings);
    let (h2, https) = match &f.backend_protocol {
        None => (false, false),
        Some((key, value)) => backend_protocol(key, value, warnings),
    };
    let connection_pool =
        h2.then_some(ConnectionPoolSettings { http: HttpPoolSettings { h2_upgrade_policy: H2UpgradePolicy::Upgrade } });
    let (tls, secret) = tls(f, h2, https, namespace, warnings);
    let policy = TrafficPolicy { load_balancer, connection_pool, tls, ..TrafficPolicy::default() };
    ((policy != TrafficPolicy::default()).then_some(policy), secret)
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

/// (HTTP/2, TLS) as `backend-protocol` asks.
fn backend_protocol(key: &str, value: &str, warnings: &mut Vec<String>) -> (bool, bool) {
    match value.trim().to_ascii_uppercase().as_str() {
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
    }
}

/// The upstream TLS, as Higress's `upstreamtls.go` builds it:
///
/// - with `proxy-ssl-secret` and any `backend-protocol` but `HTTP` (the
///   default): `MUTUAL`, with the Secret's certificate (so `GRPC` with a
///   Secret is gRPC over mutual TLS, as in Higress; ingress-nginx would
///   speak plain gRPC);
/// - else with `HTTPS` or `GRPCS`: `SIMPLE`, the upstream not verified;
/// - else none, and a `proxy-ssl-*` key is reported as having no effect
///   (Higress ignores it silently).
///
/// `proxy-ssl-name` is the SNI only with `proxy-ssl-server-name: on`, as in
/// Higress and ingress-nginx. `proxy-ssl-verify: on` verifies the upstream
/// against the Secret's `ca.crt`; off (the default) verifies nothing
/// (`insecureSkipVerify`). Higress writes `insecureSkipVerify: false` for
/// off, which changes nothing, and leaves the check to its fork; a stock
/// istiod would then wait for a `ca.crt` the Secret need not have.
fn tls(
    f: &Found,
    h2: bool,
    https: bool,
    namespace: &str,
    warnings: &mut Vec<String>,
) -> (Option<ClientTlsSettings>, Option<ClientSecret>) {
    let verify = on_off(&f.ssl_verify, warnings);
    let server_name = on_off(&f.ssl_server_name, warnings);
    let secret = f.ssl_secret.as_ref().and_then(|(key, value)| match secret_ref(value, namespace) {
        Ok((namespace, name)) => Some(ClientSecret { key: key.clone(), namespace, name }),
        Err(e) => {
            warnings.push(format!("annotation {key}: {e}; no client certificate"));
            None
        }
    });
    if !h2 && !https {
        for (key, _) in [&f.ssl_secret, &f.ssl_verify, &f.ssl_name, &f.ssl_server_name].into_iter().flatten() {
            warnings.push(format!(
                "annotation {key} has no effect without TLS to the backend ({BACKEND_PROTOCOL} HTTPS or GRPCS, or \
                 {PROXY_SSL_SECRET} with a protocol other than HTTP)"
            ));
        }
        return (None, None);
    }
    let mode = match (&secret, https) {
        (Some(_), _) => ClientTlsMode::Mutual,
        (None, true) => ClientTlsMode::Simple,
        (None, false) => {
            // HTTP2 or GRPC, and no usable Secret: no TLS.
            for (key, _) in [&f.ssl_verify, &f.ssl_name, &f.ssl_server_name].into_iter().flatten() {
                warnings.push(format!("annotation {key} has no effect without TLS to the backend"));
            }
            return (None, None);
        }
    };
    let sni = match (&f.ssl_name, server_name) {
        (Some((key, name)), Some(true)) => {
            let name = name.trim();
            if is_host_name(name) {
                Some(name.to_owned())
            } else {
                warnings.push(format!("annotation {key}: {:?} is not a host name; no SNI set", clip(name)));
                None
            }
        }
        (Some((key, _)), _) => {
            warnings.push(format!("annotation {key} has no effect without {PROXY_SSL_SERVER_NAME}: on"));
            None
        }
        (None, _) => None,
    };
    let verified = mode == ClientTlsMode::Mutual && verify == Some(true);
    if let (ClientTlsMode::Simple, Some(true), Some((key, _))) = (mode, verify, &f.ssl_verify) {
        warnings.push(format!(
            "annotation {key}: on needs the CA (ca.crt) of a {PROXY_SSL_SECRET}; the backend is not verified"
        ));
    }
    let settings =
        ClientTlsSettings { mode, sni, insecure_skip_verify: (!verified).then_some(true), credential_name: None };
    (Some(settings), secret)
}

/// `on` or `off`, exactly (Higress's `^(on|off)$`); anything else is
/// reported and taken as off.
fn on_off(found: &Key, warnings: &mut Vec<String>) -> Option<bool> {
    let (key, value) = found.as_ref()?;
    match value.as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => {
            warnings.push(format!("annotation {key}: {:?} is not on or off; taken as off", clip(value)));
            Some(false)
        }
    }
}
