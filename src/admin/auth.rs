//! Bearer-token protection of the admin API.
//!
//! On a loopback address the API is open unless a token is configured. On
//! any other address a token is required: without one configured, every
//! protected endpoint answers 401 saying how to set it (and startup logs a
//! warning), so a bridge exposed by mistake leaks nothing. `/ready` and
//! `/healthz` stay open for probes.

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use meshbridge_registries::Secret;

use super::ApiError;

/// Paths that never need the token: what Kubernetes probes call.
const OPEN_PATHS: [&str; 2] = ["/ready", "/healthz"];

/// What the admin API asks of a request.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Loopback address, no token configured.
    Open,
    /// `Authorization: Bearer <token>` required.
    Token(Secret),
    /// Non-loopback address and no token: protected endpoints refuse all.
    Unconfigured,
}

impl Auth {
    /// The rule for an admin server on `addr` with `token` configured. A
    /// configured token is always enforced, on loopback too.
    pub fn new(addr: SocketAddr, token: Option<Secret>) -> Auth {
        match token.filter(|t| !t.expose().is_empty()) {
            Some(t) => Auth::Token(t),
            None if addr.ip().is_loopback() => Auth::Open,
            None => Auth::Unconfigured,
        }
    }

    fn check(&self, headers: &HeaderMap) -> Result<(), Refused> {
        match self {
            Auth::Open => Ok(()),
            Auth::Unconfigured => Err(Refused::Unconfigured),
            Auth::Token(token) => match bearer(headers) {
                Some(given) if ct_eq(given.as_bytes(), token.expose().as_bytes()) => Ok(()),
                Some(_) => Err(Refused::Invalid),
                None => Err(Refused::Missing),
            },
        }
    }
}

/// Why a request to the admin API was refused (the body of its 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum Refused {
    #[error(
        "the admin API listens on a non-loopback address and no token is configured: \
         set --admin-token (or MESHBRIDGE_ADMIN_TOKEN) and send 'Authorization: Bearer <token>'"
    )]
    Unconfigured,
    #[error("invalid bearer token")]
    Invalid,
    #[error("missing bearer token: send 'Authorization: Bearer <token>'")]
    Missing,
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Equality whose time does not depend on where the inputs differ (only on
/// the longer length), so the token cannot be guessed byte by byte.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

/// Middleware: let open paths through, check the token on the rest.
pub async fn require(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    match auth.check(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(message) => {
            let mut resp = ApiError::new(StatusCode::UNAUTHORIZED, message.to_string()).into_response();
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn constant_time_equality() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret1"));
        assert!(!ct_eq(b"", b"x"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn rules_by_address_and_token() {
        let lo: SocketAddr = "127.0.0.1:8888".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8888".parse().unwrap();
        assert!(matches!(Auth::new(lo, None), Auth::Open));
        assert!(matches!(Auth::new("[::1]:1".parse().unwrap(), None), Auth::Open));
        assert!(matches!(Auth::new(any, None), Auth::Unconfigured));
        assert!(matches!(Auth::new(any, Some(Secret::new(""))), Auth::Unconfigured));
        let auth = Auth::new(any, Some(Secret::new("tok")));
        assert!(auth.check(&headers("Bearer tok")).is_ok());
        assert!(auth.check(&headers("bearer  tok")).is_ok());
        assert!(auth.check(&headers("Bearer nope")).is_err());
        assert!(auth.check(&headers("Basic tok")).is_err());
        assert!(auth.check(&HeaderMap::new()).is_err());
        assert!(Auth::new(lo, Some(Secret::new("tok"))).check(&HeaderMap::new()).is_err());
        assert!(Auth::Unconfigured.check(&headers("Bearer tok")).unwrap_err().to_string().contains("--admin-token"));
    }
}
