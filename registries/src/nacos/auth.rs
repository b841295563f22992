//! Nacos credentials: a username/password login whose `accessToken` is
//! refreshed before it expires, and AK/SK request signatures. Both clients
//! use them: the 1.x HTTP client in query parameters, the gRPC client in
//! each request's metadata headers (`grpc.rs`).
//!
//! We log in ourselves (nacos-sdk's `HttpLoginAuthPlugin`, used before our
//! own gRPC client,  logs the password at debug level, swallows login failures (so
//! an expired token stops sync silently, as in Higress #2289), and refreshes
//! only on its own fixed 30 s timer. Here every registry call first makes
//! sure the token is fresh, a failed login is an error the watcher reports,
//! and a token the server rejects is dropped so the next call logs in again.
//!
//! The login goes where Nacos's own Java client (3.x, `HttpLoginProcessor`)
//! sends it: `/v3/auth/user/login` first, then `/v1/auth/users/login` when
//! the server answers 404 or 501 (Nacos 1.x and 2.x have no v3 API). The
//! path that worked is kept, so refreshes against an old server cost one
//! call. Nacos 3.1 answers a wrong password on the v3 path `500` (its
//! `AccessException` has no handler outside the console) and an unknown user
//! `403`; both are login errors here, whatever the status, never a fallback.
//!
//! Secrets leave only in a form body, a sensitive header or a signature.
//! Errors and logs name the call, never a credential.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::Deserialize;
use tracing::{debug, info};

use crate::body::{MAX_BODY_BYTES, read_capped};
use crate::http_error::client_error;
use crate::spec::{RegistrySpec, Secret};
use crate::watcher::RegistryError;

/// Nacos 3.x (and rnacos).
const LOGIN_V3: &str = "/nacos/v3/auth/user/login";
/// Nacos 1.x and 2.x; Nacos 3.x while `nacos.core.api.compatibility.client.enabled`.
const LOGIN_V1: &str = "/nacos/v1/auth/users/login";
/// How a login error starts its `what`: [`is_login_error`] reads it.
const LOGIN_WHAT: &str = "nacos login";
const LOGIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Refresh when this share of the token's TTL has passed.
const REFRESH_AT: f64 = 0.75;
/// The token's header for gRPC requests and the 1.x open API.
pub(crate) const ACCESS_TOKEN: &str = "accessToken";

/// What a registry call needs to prove who we are.
pub(crate) struct Auth {
    login: Option<Login>,
    signer: Option<Signer>,
}

impl Auth {
    /// Credentials from the spec: `nacosUsername`/`nacosPassword` from the
    /// auth secret, `nacosAccessKey`/`nacosSecretKey` from the entry.
    pub fn new(spec: &RegistrySpec, http: reqwest::Client) -> Result<Auth, RegistryError> {
        let get = |key: &str| spec.auth.get(key).filter(|s| !s.expose().is_empty()).cloned();
        let config = |field: &str, reason: &str| RegistryError::Config {
            registry: spec.name.clone(),
            field: field.to_string(),
            reason: reason.to_string(),
        };
        let login = match (get("nacosUsername"), get("nacosPassword")) {
            (Some(username), Some(password)) => {
                let scheme = if spec.tls.is_some() { "https" } else { "http" };
                Some(Login { username, password, http, scheme, registry: spec.name.clone(), state: Mutex::default() })
            }
            (None, None) => None,
            _ => return Err(config("authSecretName", "needs both nacosUsername and nacosPassword")),
        };
        let nonempty = |s: &Option<Secret>| s.clone().filter(|s| !s.expose().is_empty());
        let signer = match (nonempty(&spec.nacos_access_key), nonempty(&spec.nacos_secret_key)) {
            (Some(access_key), Some(secret_key)) => Some(Signer { access_key, secret_key }),
            (None, None) => None,
            _ => return Err(config("nacosAccessKey", "needs both nacosAccessKey and nacosSecretKey")),
        };
        Ok(Auth { login, signer })
    }

    pub fn has_login(&self) -> bool {
        self.login.is_some()
    }

    pub fn has_signer(&self) -> bool {
        self.signer.is_some()
    }

    /// Log in unless a fresh token is held. A no-op without a username.
    pub async fn ensure(&self, servers: &[String]) -> Result<(), RegistryError> {
        match &self.login {
            Some(login) => login.ensure(servers).await,
            None => Ok(()),
        }
    }

    /// The server rejected our token: log in again on the next call.
    pub fn invalidate(&self) {
        if let Some(login) = &self.login {
            login.state().token = None;
        }
    }

    /// The current token, if logged in.
    pub fn token(&self) -> Option<Secret> {
        self.login.as_ref().and_then(|l| l.state().token.clone())
    }

    /// The AK/SK signature for a naming call on `resource` (a grouped service
    /// name `group@@service`, or none for calls on no one service):
    /// `ak`, `data` and `signature`, as the Nacos clients send them.
    pub fn signature(&self, resource: Option<&str>) -> Option<[(&'static str, String); 3]> {
        self.signer.as_ref().map(|s| s.sign(resource, now_millis()))
    }
}

/// A refused login (as opposed to a refused token).
pub(crate) fn is_login_error(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Status { what, .. } if what.starts_with(LOGIN_WHAT))
}

/// The `what` of a refused login: the call, and what to check.
fn login_what(path: &str) -> String {
    format!("{LOGIN_WHAT} (POST {path}; check nacosUsername and nacosPassword)")
}

fn now_millis() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or_default()
}

struct Login {
    username: Secret,
    password: Secret,
    http: reqwest::Client,
    /// `http`, or `https` with `registryTls`.
    scheme: &'static str,
    registry: String,
    state: Mutex<TokenState>,
}

#[derive(Default)]
struct TokenState {
    token: Option<Secret>,
    refresh_at: Option<Instant>,
    /// Where the next login goes first, rotating over the servers.
    next: usize,
    /// The server has no v3 login (it answered 404 or 501): use v1.
    v1: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LoginAnswer {
    access_token: String,
    #[serde(default)]
    token_ttl: i64,
}

impl Login {
    fn state(&self) -> std::sync::MutexGuard<'_, TokenState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fresh(&self) -> bool {
        let st = self.state();
        st.token.is_some() && st.refresh_at.is_some_and(|t| Instant::now() < t)
    }

    async fn ensure(&self, servers: &[String]) -> Result<(), RegistryError> {
        if self.fresh() {
            return Ok(());
        }
        let start = self.state().next;
        let mut last = None;
        for i in 0..servers.len() {
            let server = &servers[(start + i) % servers.len()];
            match self.login(server).await {
                Ok(()) => return Ok(()),
                // Another server may answer; a refusal is final.
                Err(e @ RegistryError::Unreachable { .. }) => {
                    self.state().next = start + i + 1;
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| RegistryError::Config {
            registry: self.registry.clone(),
            field: "domain".into(),
            reason: "no Nacos server to log in to".into(),
        }))
    }

    async fn login(&self, server: &str) -> Result<(), RegistryError> {
        if !self.state().v1 {
            match self.post(server, LOGIN_V3).await? {
                Answer::NoSuchPath => {
                    debug!(server, "no v3 login on this nacos; using v1");
                    self.state().v1 = true;
                }
                Answer::Body(body) => return self.keep(server, LOGIN_V3, &body),
            }
        }
        match self.post(server, LOGIN_V1).await? {
            Answer::Body(body) => self.keep(server, LOGIN_V1, &body),
            Answer::NoSuchPath => Err(self.refused(LOGIN_V1, 404)),
        }
    }

    /// One login call: the answer's body, or that the path is unknown.
    async fn post(&self, server: &str, path: &str) -> Result<Answer, RegistryError> {
        let url = format!("{}://{server}{path}", self.scheme);
        // A form body, not the query string that nacos-sdk uses: URLs end up
        // in access logs.
        let form = [("username", self.username.expose()), ("password", self.password.expose())];
        let req = self.http.post(url).form(&form).timeout(LOGIN_TIMEOUT);
        let resp = req.send().await.map_err(|e| client_error(&self.registry, "POST", path, &e))?;
        let status = resp.status();
        if path == LOGIN_V3 && matches!(status.as_u16(), 404 | 501) {
            return Ok(Answer::NoSuchPath);
        }
        let read_error = |e: &reqwest::Error| client_error(&self.registry, "POST", path, e);
        let body = read_capped(resp, MAX_BODY_BYTES, &self.registry, path, read_error).await?;
        if !status.is_success() {
            debug!(status = status.as_u16(), path, "nacos login refused");
            return Err(self.refused(path, status.as_u16()));
        }
        Ok(Answer::Body(body))
    }

    fn refused(&self, path: &str, status: u16) -> RegistryError {
        RegistryError::Status { registry: self.registry.clone(), what: login_what(path), status }
    }

    /// Keep the token of a successful login.
    fn keep(&self, server: &str, path: &str, body: &[u8]) -> Result<(), RegistryError> {
        let bad = |reason: String| RegistryError::BadResponse {
            registry: self.registry.clone(),
            what: format!("POST {path}"),
            reason,
        };
        // serde's message names the field, never the value.
        let answer: LoginAnswer = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        if answer.access_token.is_empty() {
            return Err(bad("empty accessToken".into()));
        }
        let ttl = Duration::from_secs(u64::try_from(answer.token_ttl).unwrap_or(0));
        let mut st = self.state();
        info!(server, path, ttl_s = ttl.as_secs(), "logged in to nacos");
        st.token = Some(Secret::new(answer.access_token));
        st.refresh_at = Some(Instant::now() + ttl.mul_f64(REFRESH_AT));
        Ok(())
    }
}

enum Answer {
    Body(Vec<u8>),
    /// 404 or 501 on the v3 path: a server without the v3 API.
    NoSuchPath,
}

/// AK/SK signing as Nacos's clients do it for naming calls: `data` is the
/// time in milliseconds, then `@@` and the grouped service name if any;
/// `signature` is base64(HMAC-SHA1(secretKey, data)).
struct Signer {
    access_key: Secret,
    secret_key: Secret,
}

impl Signer {
    fn sign(&self, resource: Option<&str>, millis: u128) -> [(&'static str, String); 3] {
        let data = match resource.filter(|r| !r.is_empty()) {
            Some(r) => format!("{millis}@@{r}"),
            None => millis.to_string(),
        };
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, self.secret_key.expose().as_bytes());
        let tag = ring::hmac::sign(&key, data.as_bytes());
        let signature = base64::engine::general_purpose::STANDARD.encode(tag.as_ref());
        [("ak", self.access_key.expose().to_string()), ("data", data), ("signature", signature)]
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::spec::RegistryKind;

    fn spec() -> RegistrySpec {
        RegistrySpec::new(RegistryKind::Nacos2, "n", "127.0.0.1", 8848)
    }

    #[test]
    fn credentials_come_in_pairs_and_never_show() {
        let mut s = spec();
        assert!(!Auth::new(&s, reqwest::Client::new()).unwrap().has_login());
        s.auth.insert("nacosUsername".into(), Secret::new("user-9f"));
        let err = Auth::new(&s, reqwest::Client::new()).err().expect("password missing");
        assert!(!format!("{err} {err:?}").contains("user-9f"));
        s.auth.insert("nacosPassword".into(), Secret::new("pw-77c1"));
        assert!(Auth::new(&s, reqwest::Client::new()).unwrap().has_login());
        s.nacos_access_key = Some(Secret::new("ak-1"));
        assert!(Auth::new(&s, reqwest::Client::new()).is_err(), "ak without sk");
        s.nacos_secret_key = Some(Secret::new("sk-1"));
        assert!(Auth::new(&s, reqwest::Client::new()).unwrap().has_signer());
    }

    #[test]
    fn signatures_match_the_nacos_clients() {
        // RFC 2202 test case 2 as HMAC-SHA1("Jefe", "what do ya want for nothing?").
        let signer = Signer { access_key: Secret::new("ak"), secret_key: Secret::new("Jefe") };
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, b"Jefe");
        let tag = ring::hmac::sign(&key, b"what do ya want for nothing?");
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");

        let [ak, data, sig] = signer.sign(Some("DEFAULT_GROUP@@web"), 1700000000000);
        assert_eq!(ak, ("ak", "ak".to_string()));
        assert_eq!(data, ("data", "1700000000000@@DEFAULT_GROUP@@web".to_string()));
        let want = ring::hmac::sign(&key, data.1.as_bytes());
        assert_eq!(sig.1, base64::engine::general_purpose::STANDARD.encode(want.as_ref()));
        assert_eq!(signer.sign(None, 5)[1].1, "5");
    }

    #[tokio::test]
    async fn unreachable_login_is_an_error_naming_the_call() {
        let mut s = spec();
        s.auth.insert("nacosUsername".into(), Secret::new("u"));
        s.auth.insert("nacosPassword".into(), Secret::new("secret-pw-31"));
        let auth = Auth::new(&s, reqwest::Client::new()).unwrap();
        // Port 1 on loopback: connection refused.
        let err = auth.ensure(&["127.0.0.1:1".to_string()]).await.unwrap_err();
        assert!(matches!(err, RegistryError::Unreachable { .. }), "{err:?}");
        let text = format!("{err} {err:?}");
        assert!(text.contains(LOGIN_V3) && !text.contains("secret-pw-31"), "{text}");
        assert!(auth.token().is_none());
    }

    /// A one-shot HTTP server: answers each request with the status for its
    /// path (`paths`), 404 otherwise, and records the paths asked.
    async fn fake(paths: &'static [(&'static str, u16)]) -> (String, Arc<Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = conn.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or_default().to_string();
                let status = paths.iter().find(|(p, _)| *p == path).map_or(404, |(_, s)| *s);
                let body = if status == 200 { r#"{"accessToken":"tok-1","tokenTtl":1}"# } else { "{}" };
                log.lock().unwrap().push(path);
                let resp =
                    format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = conn.write_all(resp.as_bytes()).await;
            }
        });
        (addr, seen)
    }

    fn login_auth() -> Auth {
        let mut s = spec();
        s.auth.insert("nacosUsername".into(), Secret::new("u"));
        s.auth.insert("nacosPassword".into(), Secret::new("secret-pw-31"));
        Auth::new(&s, reqwest::Client::new()).unwrap()
    }

    #[tokio::test]
    async fn login_tries_v3_then_v1_and_keeps_what_worked() {
        // Nacos 2.x: no v3 API.
        let (addr, seen) = fake(&[(LOGIN_V1, 200)]).await;
        let auth = login_auth();
        auth.ensure(std::slice::from_ref(&addr)).await.unwrap();
        assert_eq!(auth.token().map(|t| t.expose().to_string()).as_deref(), Some("tok-1"));
        // The 1 s token is refreshed at 0.75 s: straight to v1.
        tokio::time::sleep(Duration::from_millis(800)).await;
        auth.ensure(std::slice::from_ref(&addr)).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [LOGIN_V3, LOGIN_V1, LOGIN_V1]);

        // Nacos 3.x: v3 only.
        let (addr, seen) = fake(&[(LOGIN_V3, 200)]).await;
        let auth = login_auth();
        auth.ensure(std::slice::from_ref(&addr)).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), [LOGIN_V3]);
    }

    #[tokio::test]
    async fn a_refused_login_is_final_and_says_what_to_check() {
        // Nacos 3.1 answers a wrong password 500 and an unknown user 403
        // on v3: neither is a reason to try v1.
        for status in [500, 403] {
            let paths: &'static [(&str, u16)] = if status == 500 { &[(LOGIN_V3, 500)] } else { &[(LOGIN_V3, 403)] };
            let (addr, seen) = fake(paths).await;
            let auth = login_auth();
            let err = auth.ensure(std::slice::from_ref(&addr)).await.unwrap_err();
            assert!(is_login_error(&err), "{err:?}");
            let text = err.to_string();
            assert!(text.contains("check nacosUsername and nacosPassword") && text.contains(LOGIN_V3), "{text}");
            assert!(!format!("{text} {err:?}").contains("secret-pw-31"));
            assert_eq!(*seen.lock().unwrap(), [LOGIN_V3]);
        }
    }
}
