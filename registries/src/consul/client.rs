//! A thin Consul HTTP client on the binary's reqwest: the three calls the
//! watcher needs, with blocking-query `index`/`wait`, `passing`, `dc`, `ns`
//! and the ACL token. Every failure becomes a [`RegistryError`] naming the
//! call; none contains the token (it travels only in a sensitive header).

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Deserialize;
use tracing::debug;

use super::decode::{decode_catalog, decode_health};
use crate::http_error::client_error;
use crate::{Endpoint, RegistryError, RegistrySpec};

const TOKEN_HEADER: &str = "X-Consul-Token";
const INDEX_HEADER: &str = "X-Consul-Index";
/// Slack on top of `wait` and the up to `wait / 16` Consul adds to spread
/// wake-ups, so that a healthy blocking query never hits our timeout.
const TIMEOUT_SLACK: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) struct Client {
    http: reqwest::Client,
    base: Url,
    registry: String,
    datacenter: Option<String>,
    namespace: Option<String>,
}

/// A blocking-query answer and its `X-Consul-Index`.
pub(crate) struct Indexed<T> {
    pub value: T,
    pub index: u64,
}

impl Client {
    pub fn new(spec: &RegistrySpec) -> Result<Client, RegistryError> {
        let config = |field: &str, reason: String| RegistryError::Config {
            registry: spec.name.clone(),
            field: field.to_string(),
            reason,
        };
        // A bare IPv6 literal needs brackets to be a URL host.
        let host = if spec.domain.contains(':') && !spec.domain.starts_with('[') {
            format!("[{}]", spec.domain)
        } else {
            spec.domain.clone()
        };
        let base = Url::parse(&format!("http://{host}:{}/", spec.port))
            .map_err(|e| config("domain", format!("not a usable address: {e}")))?;
        if base.cannot_be_a_base() {
            return Err(config("domain", "not a usable address".into()));
        }
        let mut headers = HeaderMap::new();
        if let Some(token) = spec.auth.get("consulToken").filter(|t| !t.expose().is_empty()) {
            // Never echo the value: the reason only says what is wrong.
            let mut value = HeaderValue::from_str(token.expose())
                .map_err(|_| config("authSecretName", "consulToken is not a valid HTTP header value".into()))?;
            value.set_sensitive(true);
            headers.insert(TOKEN_HEADER, value);
        }
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| config("domain", format!("cannot build HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            registry: spec.name.clone(),
            datacenter: spec.consul_datacenter.clone().filter(|s| !s.is_empty()),
            namespace: spec.consul_namespace.clone().filter(|s| !s.is_empty()),
        })
    }

    /// The agent's datacenter, from `GET /v1/agent/self`.
    pub async fn agent_datacenter(&self) -> Result<String, RegistryError> {
        #[derive(Deserialize)]
        struct AgentSelf {
            #[serde(rename = "Config")]
            config: AgentConfig,
        }
        #[derive(Deserialize)]
        struct AgentConfig {
            #[serde(rename = "Datacenter")]
            datacenter: String,
        }
        let what = "/v1/agent/self";
        let (body, _) = self.get(what, &["v1", "agent", "self"], &[], Duration::ZERO).await?;
        let agent: AgentSelf = serde_json::from_slice(&body).map_err(|e| self.bad(what, e.to_string()))?;
        if agent.config.datacenter.is_empty() {
            return Err(self.bad(what, "empty Config.Datacenter".into()));
        }
        Ok(agent.config.datacenter)
    }

    /// `GET /v1/status/leader`: the cheapest call that proves the agent and
    /// its cluster answer (no ACL needed). No leader is an error: reads fail then.
    pub async fn leader(&self) -> Result<String, RegistryError> {
        let what = "/v1/status/leader";
        let (body, _) = self.get(what, &["v1", "status", "leader"], &[], Duration::ZERO).await?;
        let leader: String = serde_json::from_slice(&body).map_err(|e| self.bad(what, e.to_string()))?;
        if leader.is_empty() {
            return Err(self.bad(what, "no cluster leader".into()));
        }
        Ok(leader)
    }

    /// `GET /v1/catalog/services`, blocking when `index > 0`.
    pub async fn catalog_services(
        &self,
        index: u64,
        wait: Duration,
    ) -> Result<Indexed<BTreeMap<String, Vec<String>>>, RegistryError> {
        let what = "/v1/catalog/services";
        let (body, index) = self.blocking(what, &["v1", "catalog", "services"], &[], index, wait).await?;
        let value = decode_catalog(&body).map_err(|e| self.bad(what, e.to_string()))?;
        Ok(Indexed { value, index })
    }

    /// `GET /v1/health/service/:name?passing`: the instances whose checks
    /// all pass, blocking when `index > 0`.
    pub async fn health_service(
        &self,
        name: &str,
        index: u64,
        wait: Duration,
    ) -> Result<Indexed<Vec<Endpoint>>, RegistryError> {
        let what = format!("/v1/health/service/{name}");
        let segments = ["v1", "health", "service", name];
        let (body, index) = self.blocking(&what, &segments, &[("passing", "true")], index, wait).await?;
        let value = decode_health(&body).map_err(|e| self.bad(&what, e.to_string()))?;
        Ok(Indexed { value, index })
    }

    async fn blocking(
        &self,
        what: &str,
        segments: &[&str],
        extra: &[(&str, &str)],
        index: u64,
        wait: Duration,
    ) -> Result<(Vec<u8>, u64), RegistryError> {
        let index_s = index.to_string();
        let wait_s = format!("{}ms", wait.as_millis());
        let mut query = extra.to_vec();
        if index > 0 {
            query.push(("index", &index_s));
            query.push(("wait", &wait_s));
        }
        let (body, header) = self.get(what, segments, &query, if index > 0 { wait } else { Duration::ZERO }).await?;
        let index = header
            .as_deref()
            .ok_or_else(|| self.bad(what, format!("no {INDEX_HEADER} header")))?
            .parse::<u64>()
            .map_err(|e| self.bad(what, format!("{INDEX_HEADER}: {e}")))?;
        Ok((body, index))
    }

    /// One GET. Returns the body and the `X-Consul-Index` header if any.
    async fn get(
        &self,
        what: &str,
        segments: &[&str],
        query: &[(&str, &str)],
        wait: Duration,
    ) -> Result<(Vec<u8>, Option<String>), RegistryError> {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // Percent-encodes each segment, so any service name is safe.
            path.clear().extend(segments);
        }
        let mut req = self.http.get(url).query(query).timeout(wait + wait / 16 + TIMEOUT_SLACK);
        if let Some(dc) = &self.datacenter {
            req = req.query(&[("dc", dc)]);
        }
        if let Some(ns) = &self.namespace {
            req = req.query(&[("ns", ns)]);
        }
        let resp = req.send().await.map_err(|e| client_error(&self.registry, "GET", what, &e))?;
        let status = resp.status();
        let index = resp.headers().get(INDEX_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = resp.bytes().await.map_err(|e| client_error(&self.registry, "GET", what, &e))?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            debug!(what, status = status.as_u16(), body = %text.trim(), "consul error answer");
            return Err(RegistryError::Status {
                registry: self.registry.clone(),
                what: what.to_string(),
                status: status.as_u16(),
            });
        }
        Ok((body.to_vec(), index))
    }

    fn bad(&self, what: &str, reason: String) -> RegistryError {
        RegistryError::BadResponse { registry: self.registry.clone(), what: what.to_string(), reason }
    }
}

/// The index for the next blocking query, per Consul's "Implementation
/// Details": "if a returned index is lower than the previous value, [clients]
/// should reset index to 0 - effectively restarting their blocking loop", and
/// "sanity check that their index is at least 1 after each blocking response
/// is handled to be sure they actually block on the next request".
pub(crate) fn next_index(prev: u64, got: u64) -> u64 {
    if got < prev { 0 } else { got.max(1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_rules() {
        assert_eq!(next_index(0, 42), 42, "first answer");
        assert_eq!(next_index(42, 42), 42, "timeout, no change");
        assert_eq!(next_index(42, 50), 50, "change");
        assert_eq!(next_index(50, 7), 0, "backwards: restart the loop");
        assert_eq!(next_index(50, 0), 0, "zero after a real index is backwards too");
        assert_eq!(next_index(0, 0), 1, "zero is clamped to 1 so the next query blocks");
    }

    #[test]
    fn token_is_never_in_errors_or_debug() {
        let mut spec = RegistrySpec::new(crate::RegistryKind::Consul, "c", "127.0.0.1", 8500);
        spec.auth.insert("consulToken".into(), crate::Secret::new("s3cret\n"));
        let err = Client::new(&spec).err().expect("newline is not a header value");
        assert!(!format!("{err} {err:?}").contains("s3cret"));
        spec.auth.insert("consulToken".into(), crate::Secret::new("s3cret"));
        assert!(Client::new(&spec).is_ok());
        assert!(!format!("{spec:?}").contains("s3cret"));
    }

    #[test]
    fn ipv6_domain_is_bracketed() {
        let spec = RegistrySpec::new(crate::RegistryKind::Consul, "c", "::1", 8500);
        assert_eq!(Client::new(&spec).unwrap().base.as_str(), "http://[::1]:8500/");
    }
}
