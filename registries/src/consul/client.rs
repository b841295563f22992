//! A thin Consul HTTP client: the calls the watcher needs, with blocking-query `index`/`wait`, `dc`, `ns` and the ACL token.
//! Every failure becomes a [`RegistryError`] naming the call; none contains
//! the token (it travels only in a sensitive header).
//!
//! **Connections are capped.** Calls go over the watcher's own pool of at
//! most `cap` HTTP/1.1 connections ([`Pool`]), so the watcher never holds
//! more TCP connections to Consul than the cap, whatever the catalog size
//! (Consul's default `limits.http_max_conns_per_client` is 200 per client
//! address). The URL is still built with reqwest's `Url` (percent-encoding).
//!
//! **Timeouts are budgets.** How long a call may take is decided in one
//! place, [`super::budget`]: the small calls get a fixed 5 s after their
//! wait, the catalog-wide reads a slack that grows with what Consul has
//! shown it needs and doubles on the next try after a timeout.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::StatusCode;
use hyper::header::{HOST, HeaderValue, USER_AGENT};
use reqwest::Url;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use tracing::debug;

use super::budget::{self, Budget, Budgets};
use super::decode::{CheckPrints, Instances, decode_catalog, decode_checks_into, decode_health, decode_nodes};
use super::pool::{Pool, PoolTls};
use crate::body::{Capped, MAX_BODY_BYTES, collect_capped, too_large};
use crate::spec::RegistrySpec;
use crate::watcher::RegistryError;

const TOKEN_HEADER: &str = "X-Consul-Token";
const INDEX_HEADER: &str = "X-Consul-Index";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A tag no instance carries: `?tag=` makes `/v1/health/service/:name`
/// answer `[]` but still with the service's own `X-Consul-Index`. Consul
/// looks tags up in its service-tag index, so this probe costs about a
/// quarter of a `filter` that matches nothing (bexpr evaluates every
/// instance by reflection): 10,000 probes took 2.5 s against 10.2 s on
/// Consul 1.8.7 with 10k services × 10 instances. Should an instance carry
/// it after all, the probe only reads more bytes.
const PROBE_TAG: &str = "meshbridge-index-probe-no-such-tag";
/// How long the connection-limit check waits for Consul to hang up.
const LIMIT_CHECK: Duration = Duration::from_millis(300);
/// The pause between the connection-limit check's two tries.
const LIMIT_RECHECK: Duration = Duration::from_millis(100);

/// Answers read from Consul by every watcher in this process, and their
/// body bytes: what `consul_change_cost` reports per change.
static ANSWERS: AtomicU64 = AtomicU64::new(0);
static BODY_BYTES: AtomicU64 = AtomicU64::new(0);
static RETRIED: AtomicU64 = AtomicU64::new(0);

/// (answers, body bytes) read from Consul so far by every watcher in this
/// process. For benchmarks; one relaxed add per answer.
pub fn answers_read() -> (u64, u64) {
    (ANSWERS.load(Ordering::Relaxed), BODY_BYTES.load(Ordering::Relaxed))
}

/// Requests sent again on another connection after a pooled one was found
/// cut, by every watcher in this process. For tests.
pub fn requests_resent() -> u64 {
    RETRIED.load(Ordering::Relaxed)
}

pub(crate) struct Client {
    pool: Pool,
    base: Url,
    /// `Host` header: `host:port`, IPv6 bracketed.
    authority: String,
    token: Option<HeaderValue>,
    registry: String,
    datacenter: Option<String>,
    namespace: Option<String>,
    /// Index probes pipelined on raw connections (off: one request at a
    /// time, for measuring what pipelining gains).
    pipelining: bool,
    /// The query of every index probe (`?tag=…`, `dc`, `ns`), encoded once.
    probe_query: String,
    /// The catalog-wide reads' timeouts ([`super::budget`]).
    budgets: Budgets,
}

/// A blocking-query answer and its `X-Consul-Index`.
pub(crate) struct Indexed<T> {
    pub value: T,
    pub index: u64,
}

/// A failing check state, each watched by its own blocking query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckState {
    Critical,
    Warning,
}

impl CheckState {
    pub const ALL: [CheckState; 2] = [CheckState::Critical, CheckState::Warning];

    pub fn name(self) -> &'static str {
        match self {
            CheckState::Critical => "critical",
            CheckState::Warning => "warning",
        }
    }

    fn path(self) -> &'static str {
        match self {
            CheckState::Critical => "/v1/health/state/critical",
            CheckState::Warning => "/v1/health/state/warning",
        }
    }
}

/// What `GET /v1/agent/self` tells about the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Agent {
    pub datacenter: String,
    /// `Config.Version`, e.g. `1.8.7`, or `1.8.7+ent` for Enterprise.
    pub version: String,
}

impl Agent {
    /// Consul Enterprise marks its version with `+ent` (`1.8.7+ent`);
    /// namespaces exist only there.
    pub fn is_enterprise(&self) -> bool {
        self.version.contains("+ent")
    }
}

impl Client {
    /// A client that holds at most `max_conns` connections to Consul.
    pub fn new(spec: &RegistrySpec, max_conns: usize) -> Result<Client, RegistryError> {
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
        let scheme = if spec.tls.is_some() { "https" } else { "http" };
        let base = Url::parse(&format!("{scheme}://{host}:{}/", spec.port))
            .map_err(|e| config("domain", format!("not a usable address: {e}")))?;
        if base.cannot_be_a_base() {
            return Err(config("domain", "not a usable address".into()));
        }
        let mut token = None;
        if let Some(secret) = spec.auth.get("consulToken").filter(|t| !t.expose().is_empty()) {
            // Never echo the value: the reason only says what is wrong.
            let mut value = HeaderValue::from_str(secret.expose())
                .map_err(|_| config("authSecretName", "consulToken is not a valid HTTP header value".into()))?;
            value.set_sensitive(true);
            token = Some(value);
        }
        let (Some(host), Some(port)) = (base.host_str(), base.port_or_known_default()) else {
            return Err(config("domain", "not a usable address".into()));
        };
        let tls = match &spec.tls {
            Some(tls) => {
                let client =
                    crate::tls::client_config(tls, &[b"http/1.1"]).map_err(|e| config("registryTls", e.to_string()))?;
                let server_name =
                    crate::tls::server_name(tls, host).map_err(|e| config("registryTls", e.to_string()))?;
                Some(PoolTls { connector: tokio_rustls::TlsConnector::from(client), server_name })
            }
            None => None,
        };
        let mut client = Client {
            pool: Pool::new(host, port, max_conns, CONNECT_TIMEOUT, tls),
            authority: format!("{host}:{port}"),
            base,
            token,
            registry: spec.name.clone(),
            datacenter: spec.consul_datacenter.clone().filter(|s| !s.is_empty()),
            namespace: None,
            pipelining: true,
            probe_query: String::new(),
            budgets: Budgets::default(),
        };
        client.probe_query = client.encode_probe_query();
        Ok(client)
    }

    pub fn set_pipelining(&mut self, on: bool) {
        self.pipelining = on;
    }

    /// Send `ns` on every call from now on (Consul Enterprise only).
    pub fn set_namespace(&mut self, namespace: Option<String>) {
        self.namespace = namespace;
        self.probe_query = self.encode_probe_query();
    }

    /// `?tag=…` with `dc` and `ns`, as [`Client::target`] encodes it.
    fn encode_probe_query(&self) -> String {
        let target = self.target(&["x"], &[("tag", PROBE_TAG)]);
        target.find('?').map_or_else(String::new, |at| target[at..].to_string())
    }

    /// Append the request target of [`Client::service_index`] for `name`.
    /// A name of URL-safe characters alone (the usual service name) needs
    /// no encoding and is written as it is; any other goes through
    /// [`Client::target`].
    fn write_probe_target(&self, out: &mut Vec<u8>, name: &str) {
        let plain = !name.is_empty()
            && name != "."
            && name != ".."
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
        if plain {
            out.extend_from_slice(b"/v1/health/service/");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(self.probe_query.as_bytes());
        } else {
            let target = self.target(&["v1", "health", "service", name], &[("tag", PROBE_TAG)]);
            out.extend_from_slice(target.as_bytes());
        }
    }

    /// The agent's datacenter and version, from `GET /v1/agent/self`.
    pub async fn agent(&self) -> Result<Agent, RegistryError> {
        #[derive(Deserialize)]
        struct AgentSelf {
            #[serde(rename = "Config")]
            config: AgentConfig,
        }
        #[derive(Deserialize)]
        struct AgentConfig {
            #[serde(rename = "Datacenter")]
            datacenter: String,
            #[serde(rename = "Version", default)]
            version: String,
        }
        let what = "/v1/agent/self";
        let (body, _) = self.get(what, &["v1", "agent", "self"], &[], Duration::ZERO, None).await?;
        let agent: AgentSelf = serde_json::from_slice(&body).map_err(|e| self.bad(what, e.to_string()))?;
        if agent.config.datacenter.is_empty() {
            return Err(self.bad(what, "empty Config.Datacenter".into()));
        }
        Ok(Agent { datacenter: agent.config.datacenter, version: agent.config.version })
    }

    /// `GET /v1/status/leader`: the cheapest call that proves the agent and
    /// its cluster answer (no ACL needed). No leader is an error: reads fail then.
    pub async fn leader(&self) -> Result<String, RegistryError> {
        let what = "/v1/status/leader";
        let (body, _) = self.get(what, &["v1", "status", "leader"], &[], Duration::ZERO, None).await?;
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
        let answer = self.catalog_services_body(index, wait).await?;
        Ok(Indexed { value: self.decode_catalog(&answer.value)?, index: answer.index })
    }

    /// [`Client::catalog_services`] not decoded yet: the detector's answer,
    /// which an instance added or removed leaves byte for byte the same.
    pub async fn catalog_services_body(&self, index: u64, wait: Duration) -> Result<Indexed<Vec<u8>>, RegistryError> {
        let what = "/v1/catalog/services";
        let budget = Some(&self.budgets.services);
        let (body, index) = self.blocking(what, &["v1", "catalog", "services"], &[], index, wait, budget).await?;
        Ok(Indexed { value: body, index })
    }

    /// Decode a `GET /v1/catalog/services` body.
    pub fn decode_catalog(&self, body: &[u8]) -> Result<BTreeMap<String, Vec<String>>, RegistryError> {
        decode_catalog(body).map_err(|e| self.bad("/v1/catalog/services", e.to_string()))
    }

    /// `GET /v1/catalog/nodes` (node -> `ModifyIndex`), blocking when
    /// `index > 0`. A node's address, tagged addresses or meta change moves
    /// only the nodes table and the indexes of the services on it, not
    /// `/v1/catalog/services`, so this is the only answer that names it.
    pub async fn catalog_nodes(
        &self,
        index: u64,
        wait: Duration,
    ) -> Result<Indexed<BTreeMap<String, u64>>, RegistryError> {
        let what = "/v1/catalog/nodes";
        let budget = Some(&self.budgets.nodes);
        let (body, index) = self.blocking(what, &["v1", "catalog", "nodes"], &[], index, wait, budget).await?;
        let value = decode_nodes(&body).map_err(|e| self.bad(what, e.to_string()))?;
        Ok(Indexed { value, index })
    }

    /// The checks in `state` (`critical` or `warning`): `GET
    /// /v1/health/state/:state`, blocking when `index > 0`, folded into
    /// per-service and per-node fingerprints. Answered from Consul's status
    /// index, so the bytes and the work grow with the checks that fail, not
    /// with every check (`/v1/health/state/any` is about 360 bytes per check:
    /// 36 MB at 10k services × 10 instances). Consul wakes a state's query
    /// when a check enters or leaves that state, and only then (measured on
    /// 1.8.7: a check turning `warning` does not wake the `critical` query,
    /// whose index does not move either), so each failing state needs its
    /// own blocking query. Filtering `/v1/health/state/any` instead
    /// (`Status != "passing"`) answers the same but makes Consul evaluate
    /// every check (0.5–0.8 s at 100k checks), and Consul 1.8's filter has
    /// neither `ModifyIndex` nor `>` to ask only for recent changes.
    pub async fn checks_in(
        &self,
        state: CheckState,
        index: u64,
        wait: Duration,
    ) -> Result<Indexed<CheckPrints>, RegistryError> {
        let what = state.path();
        let budget = Some(&self.budgets.checks[state as usize]);
        let segments = ["v1", "health", "state", state.name()];
        let (body, index) = self.blocking(what, &segments, &[], index, wait, budget).await?;
        let mut value = CheckPrints::default();
        decode_checks_into(&mut value, &body).map_err(|e| self.bad(what, e.to_string()))?;
        Ok(Indexed { value, index })
    }

    /// `GET /v1/health/service/:name` (not blocking): every instance, the
    /// passing ones as endpoints.
    pub async fn health_service(&self, name: &str) -> Result<Indexed<Instances>, RegistryError> {
        let what = format!("/v1/health/service/{name}");
        let segments = ["v1", "health", "service", name];
        let (body, index) = self.blocking(&what, &segments, &[], 0, Duration::ZERO, None).await?;
        let value = decode_health(&body).map_err(|e| self.bad(&what, e.to_string()))?;
        Ok(Indexed { value, index })
    }

    /// The `X-Consul-Index` of `GET /v1/health/service/:name` without its
    /// instances (a tag none carries, [`PROBE_TAG`]): Consul keeps one index per
    /// service, moved by every write to its instances or their checks, so a
    /// service whose index is unchanged needs no read.
    pub async fn service_index(&self, name: &str) -> Result<u64, RegistryError> {
        let what = format!("/v1/health/service/{name}");
        let segments = ["v1", "health", "service", name];
        let query = [("tag", PROBE_TAG)];
        let (_, index) = self.blocking(&what, &segments, &query, 0, Duration::ZERO, None).await?;
        Ok(index)
    }

    async fn blocking(
        &self,
        what: &str,
        segments: &[&str],
        extra: &[(&str, &str)],
        index: u64,
        wait: Duration,
        budget: Option<&Budget>,
    ) -> Result<(Vec<u8>, u64), RegistryError> {
        let index_s = index.to_string();
        let wait_s = format!("{}ms", wait.as_millis());
        let mut query = extra.to_vec();
        if index > 0 {
            query.push(("index", &index_s));
            query.push(("wait", &wait_s));
        }
        let wait = if index > 0 { wait } else { Duration::ZERO };
        let (body, header) = self.get(what, segments, &query, wait, budget).await?;
        let index = header
            .as_deref()
            .ok_or_else(|| self.bad(what, format!("no {INDEX_HEADER} header")))?
            .parse::<u64>()
            .map_err(|e| self.bad(what, format!("{INDEX_HEADER}: {e}")))?;
        Ok((body, index))
    }

    /// The origin-form request target (path and query, the host goes in
    /// `Host`) of a GET on `segments` with `query`, `dc` and `ns`.
    fn target(&self, segments: &[&str], query: &[(&str, &str)]) -> String {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            // Percent-encodes each segment, so any service name is safe.
            path.clear().extend(segments);
        }
        let mut pairs: Vec<(&str, &str)> = query.to_vec();
        if let Some(dc) = &self.datacenter {
            pairs.push(("dc", dc));
        }
        if let Some(ns) = &self.namespace {
            pairs.push(("ns", ns));
        }
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(pairs);
        }
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        }
    }

    /// The indexes of `names` ([`Client::service_index`]), in order, as many
    /// as possible pipelined on one raw connection ([`super::pipeline`]),
    /// the rest one request at a time. Stops after the first outage error,
    /// so the answer can be shorter than `names`.
    pub async fn service_indexes(&self, names: &[&str]) -> Vec<Result<u64, RegistryError>> {
        let mut out: Vec<Result<u64, RegistryError>> =
            self.pipelined_indexes(names).await.into_iter().map(Ok).collect();
        for name in &names[out.len()..] {
            let result = self.service_index(name).await;
            let outage = result.as_ref().is_err_and(is_outage);
            out.push(result);
            if outage {
                break;
            }
        }
        out
    }

    /// The indexes of a prefix of `names`, pipelined; empty when no raw
    /// connection could be had (the one-request path then says why).
    async fn pipelined_indexes(&self, names: &[&str]) -> Vec<u64> {
        if names.len() < 2 || !self.pipelining {
            return Vec::new();
        }
        let mut requests = Vec::with_capacity(names.len() * 256);
        for name in names {
            write_get(&mut requests, |out| self.write_probe_target(out, name), &self.authority, self.token.as_ref());
        }
        let call = async {
            let mut lease = self.pool.checkout_raw().await.ok()?;
            let io = lease.io()?;
            let (indexes, answers, oddity) = super::pipeline::exchange(io, &requests, names.len()).await;
            match &oddity {
                None => lease.done(),
                Some(odd) => {
                    debug!(?odd, answered = indexes.len(), batch = names.len(), "pipelined probes ended early")
                }
            }
            ANSWERS.fetch_add(indexes.len() as u64, Ordering::Relaxed);
            BODY_BYTES.fetch_add(answers.body_bytes, Ordering::Relaxed);
            Some(indexes)
        };
        // As long as the same probes one at a time may take.
        let timeout = CONNECT_TIMEOUT + budget::BASE;
        tokio::time::timeout(timeout, call).await.ok().flatten().unwrap_or_default()
    }

    /// One GET on a pooled connection, blocking for `wait` (zero: not
    /// blocking). Its timeout comes from `budget` (a catalog-wide read) or
    /// is the fixed [`budget::BASE`] after the wait (a small call), as
    /// [`super::budget`] explains. Returns the body and the `X-Consul-Index`
    /// header if any.
    async fn get(
        &self,
        what: &str,
        segments: &[&str],
        query: &[(&str, &str)],
        wait: Duration,
        budget: Option<&Budget>,
    ) -> Result<(Vec<u8>, Option<String>), RegistryError> {
        let target = self.target(segments, query);
        let request = || {
            let mut req =
                hyper::Request::get(target.clone()).header(HOST, &self.authority).header(USER_AGENT, "meshbridge");
            if let Some(token) = &self.token {
                req = req.header(TOKEN_HEADER, token.clone());
            }
            req.body(Empty::<Bytes>::new()).map_err(|e| self.bad(what, e.to_string()))
        };
        let slack = budget.map_or(budget::BASE, Budget::slack);
        let timeout = budget::timeout(wait, slack);
        let call = async {
            // A GET that a pooled connection lost before any byte of the
            // answer (a load balancer or NAT that dropped it while idle) is
            // sent again, as hyper's own pool does for idempotent requests.
            // Each such failure closes that connection, so this ends at a
            // new one, whose failure is the answer.
            let (mut lease, resp, sent) = loop {
                let mut lease = self.pool.checkout().await.map_err(|e| self.unreachable(what, e.to_string()))?;
                // Consul's answer time, not the wait for a free connection.
                let sent = Instant::now();
                match lease.send(request()?).await {
                    Ok(resp) => break (lease, resp, sent),
                    Err(e) if e.closed_before_answer() && lease.reused() => {
                        debug!(what, error = %e, "a pooled connection was cut while idle; sending again");
                        RETRIED.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) if e.closed_before_answer() && self.hangs_up_at_once().await => {
                        self.pool.limit_reached();
                        return Err(self.limit(what, "Consul closes new connections from this address at once".into()));
                    }
                    Err(e) => return Err(self.unreachable(what, e.to_string())),
                }
            };
            let status = resp.status();
            let index = resp.headers().get(INDEX_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
            let body = match collect_capped(resp.into_body(), MAX_BODY_BYTES).await {
                Ok(body) => body,
                Err(Capped::TooLarge) => return Err(too_large(&self.registry, what, MAX_BODY_BYTES)),
                Err(Capped::Read(e)) => return Err(self.unreachable(what, format!("reading the answer failed: {e}"))),
            };
            lease.done();
            ANSWERS.fetch_add(1, Ordering::Relaxed);
            BODY_BYTES.fetch_add(body.len() as u64, Ordering::Relaxed);
            Ok((status, index, body, sent.elapsed()))
        };
        let (status, index, body, took) = match tokio::time::timeout(timeout, call).await {
            Ok(result) => result?,
            Err(_) => {
                let Some(budget) = budget else {
                    return Err(self.unreachable(what, format!("timed out after {}", secs(timeout))));
                };
                // Reported at once, as any failure; only the next try of
                // this read waits longer.
                let next = budget.timed_out(slack);
                debug!(what, ?timeout, ?slack, next_slack = ?next, "no answer in time; the next try gets more slack");
                let next = budget::timeout(wait, next);
                let reason = format!("timed out after {}; the next try allows {}", secs(timeout), secs(next));
                return Err(self.unreachable(what, reason));
            }
        };
        if let Some(budget) = budget.filter(|_| status.is_success()) {
            budget.answered(wait, took);
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.pool.limit_reached();
            return Err(self.limit(what, "429 Too Many Requests".into()));
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            debug!(what, status = status.as_u16(), body = %text.trim(), "consul error answer");
            return Err(RegistryError::Status {
                registry: self.registry.clone(),
                what: what.to_string(),
                status: status.as_u16(),
            });
        }
        Ok((body, index))
    }

    /// Consul enforces `limits.http_max_conns_per_client` by accepting a
    /// connection and closing it at once, which a client sees as a
    /// connection closed before any answer; so does a Consul that is
    /// restarting. Tell them apart with one fresh connection: refused is an
    /// outage, hung up on without a word is the limit.
    async fn hangs_up_at_once(&self) -> bool {
        let (Some(host), Some(port)) = (self.base.host_str(), self.base.port_or_known_default()) else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let check = || async {
            let mut conn = tokio::net::TcpStream::connect((host, port)).await.ok()?;
            let mut byte = [0u8; 1];
            // Consul sends nothing before a request: 0 bytes read is a hang-up.
            matches!(conn.read(&mut byte).await, Ok(0) | Err(_)).then_some(())
        };
        let hung_up = || async { tokio::time::timeout(LIMIT_CHECK, check()).await.ok().flatten().is_some() };
        // Twice, a moment apart: a Consul that is going down can accept and
        // drop a connection while it exits, but then refuses the next.
        if !hung_up().await {
            return false;
        }
        tokio::time::sleep(LIMIT_RECHECK).await;
        hung_up().await
    }

    fn unreachable(&self, what: &str, reason: String) -> RegistryError {
        RegistryError::Unreachable { registry: self.registry.clone(), reason: format!("GET {what}: {reason}") }
    }

    fn limit(&self, what: &str, reason: String) -> RegistryError {
        RegistryError::ConnectionLimit { registry: self.registry.clone(), what: what.to_string(), reason }
    }

    fn bad(&self, what: &str, reason: String) -> RegistryError {
        RegistryError::BadResponse { registry: self.registry.clone(), what: what.to_string(), reason }
    }
}

/// `d` in seconds, one decimal, for messages.
fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Append a GET request for the target `target` writes as [`Client::get`]
/// sends it (`Host`, `User-Agent`, the token if any) to `out`.
fn write_get(out: &mut Vec<u8>, target: impl FnOnce(&mut Vec<u8>), authority: &str, token: Option<&HeaderValue>) {
    out.extend_from_slice(b"GET ");
    target(out);
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\nUser-Agent: meshbridge\r\n");
    if let Some(token) = token {
        out.extend_from_slice(TOKEN_HEADER.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(token.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The index for the next blocking query, per Consul's "Implementation
/// Details": "if a returned index is lower than the previous value, [clients]
/// should reset index to 0 - effectively restarting their blocking loop", and
/// "sanity check that their index is at least 1 after each blocking response
/// is handled to be sure they actually block on the next request".
pub(crate) fn next_index(prev: u64, got: u64) -> u64 {
    if got < prev { 0 } else { got.max(1) }
}

/// An error that says Consul itself cannot be used (as opposed to one
/// service's answer being bad).
pub(crate) fn is_outage(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Unreachable { .. } | RegistryError::ConnectionLimit { .. })
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
        let err = Client::new(&spec, 4).err().expect("newline is not a header value");
        assert!(!format!("{err} {err:?}").contains("s3cret"));
        spec.auth.insert("consulToken".into(), crate::Secret::new("s3cret"));
        assert!(Client::new(&spec, 4).is_ok());
        assert!(!format!("{spec:?}").contains("s3cret"));
    }

    #[test]
    fn probe_targets_are_encoded_as_any_other_target() {
        let mut spec = RegistrySpec::new(crate::RegistryKind::Consul, "c", "127.0.0.1", 8500);
        spec.consul_datacenter = Some("dc 1&x".into());
        let mut client = Client::new(&spec, 4).unwrap();
        client.set_namespace(Some("team/a".into()));
        for name in ["svc-1", "a.b_c~d", "web api", "a/b", "ünï", "..", ".", "", "%41", "a?b#c"] {
            let mut fast = Vec::new();
            client.write_probe_target(&mut fast, name);
            let slow = client.target(&["v1", "health", "service", name], &[("tag", PROBE_TAG)]);
            assert_eq!(String::from_utf8(fast).unwrap(), slow, "{name:?}");
        }
        assert!(client.probe_query.contains("dc=dc+1%26x") && client.probe_query.contains("ns=team%2Fa"));
    }

    #[test]
    fn ipv6_domain_is_bracketed() {
        let spec = RegistrySpec::new(crate::RegistryKind::Consul, "c", "::1", 8500);
        assert_eq!(Client::new(&spec, 4).unwrap().base.as_str(), "http://[::1]:8500/");
    }
}
