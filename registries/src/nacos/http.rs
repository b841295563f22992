//! The Nacos 1.x open API (`type: nacos`) on the binary's reqwest: the two
//! read calls the watcher needs. Nacos 2.x and 3.x serve it too.
//!
//! A call goes to the current server; when that server cannot be reached the
//! next call goes to the next one. The token travels in headers marked
//! sensitive, and no error carries a URL (AK/SK signatures are query
//! parameters, as Nacos's clients send them).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderValue};
use tracing::debug;

use super::api::{Api, PROBE_PAGE, Probe, is_auth_error, list_all, refused_read};
use super::auth::{ACCESS_TOKEN, Auth};
use super::decode::{Instance, ServiceKey, decode_instance_list, decode_service_list};
use crate::body::{MAX_BODY_BYTES, read_capped};
use crate::http_error::client_error;
use crate::watcher::RegistryError;

const SERVICE_LIST: &str = "/nacos/v1/ns/service/list";
const INSTANCE_LIST: &str = "/nacos/v1/ns/instance/list";
const TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct HttpApi {
    http: reqwest::Client,
    servers: Vec<String>,
    current: AtomicUsize,
    namespace_id: String,
    registry: String,
    auth: Arc<Auth>,
    /// Deadline of each request (`nacosTimeout`, else [`TIMEOUT`]).
    timeout: Duration,
    /// `http`, or `https` with `registryTls`.
    scheme: &'static str,
}

impl HttpApi {
    pub fn new(
        http: reqwest::Client,
        servers: Vec<String>,
        namespace_id: String,
        registry: String,
        auth: Arc<Auth>,
    ) -> HttpApi {
        HttpApi {
            http,
            servers,
            current: AtomicUsize::new(0),
            namespace_id,
            registry,
            auth,
            timeout: TIMEOUT,
            scheme: "http",
        }
    }

    /// Each request's deadline, `nacosTimeout` when set.
    pub fn with_timeout(self, timeout: Option<Duration>) -> HttpApi {
        HttpApi { timeout: timeout.unwrap_or(TIMEOUT), ..self }
    }

    /// https instead of http (`registryTls`).
    pub fn with_tls(self, tls: bool) -> HttpApi {
        HttpApi { scheme: if tls { "https" } else { "http" }, ..self }
    }

    /// One page of `group`'s services and the total count.
    async fn service_page(&self, group: &str, page: usize, size: usize) -> Result<(Vec<String>, usize), RegistryError> {
        let query = [
            ("pageNo", page.to_string()),
            ("pageSize", size.to_string()),
            ("groupName", group.to_string()),
            ("namespaceId", self.namespace_id.clone()),
        ];
        let body = self.get(SERVICE_LIST, &query, None).await?;
        let list = decode_service_list(&body).map_err(|e| self.bad(SERVICE_LIST, e.to_string()))?;
        Ok((list.doms, usize::try_from(list.count).unwrap_or(0)))
    }

    async fn get(
        &self,
        path: &str,
        query: &[(&str, String)],
        resource: Option<&ServiceKey>,
    ) -> Result<Vec<u8>, RegistryError> {
        let index = self.current.load(Ordering::Relaxed) % self.servers.len();
        let server = &self.servers[index];
        let result = self.get_from(server, path, query, resource).await;
        match &result {
            Err(RegistryError::Unreachable { .. }) => {
                let _ = self.current.compare_exchange(index, index + 1, Ordering::Relaxed, Ordering::Relaxed);
            }
            Err(e) if is_auth_error(e) => self.auth.invalidate(),
            _ => {}
        }
        result
    }

    async fn get_from(
        &self,
        server: &str,
        path: &str,
        query: &[(&str, String)],
        resource: Option<&ServiceKey>,
    ) -> Result<Vec<u8>, RegistryError> {
        self.auth.ensure(std::slice::from_ref(&server.to_string())).await?;
        let mut req = self.http.get(format!("{}://{server}{path}", self.scheme)).query(query).timeout(self.timeout);
        if let Some(token) = self.auth.token() {
            // Nacos's `resolveToken` reads `Authorization: Bearer` before the
            // `accessToken` parameter; rnacos also an `accessToken` header.
            // Neither ends up in a URL or an access log.
            let bearer = HeaderValue::from_str(&format!("Bearer {}", token.expose()));
            let plain = HeaderValue::from_str(token.expose());
            if let (Ok(mut bearer), Ok(mut plain)) = (bearer, plain) {
                bearer.set_sensitive(true);
                plain.set_sensitive(true);
                req = req.header(AUTHORIZATION, bearer).header(ACCESS_TOKEN, plain);
            }
        }
        if let Some(signature) = self.auth.signature(resource.map(ServiceKey::to_string).as_deref()) {
            req = req.query(&signature);
        }
        let resp = req.send().await.map_err(|e| client_error(&self.registry, "GET", path, &e))?;
        let status = resp.status();
        let body =
            read_capped(resp, MAX_BODY_BYTES, &self.registry, path, |e| client_error(&self.registry, "GET", path, e))
                .await?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            debug!(path, status = status.as_u16(), body = %text.trim(), "nacos error answer");
            let e = RegistryError::Status {
                registry: self.registry.clone(),
                what: format!("GET {path}"),
                status: status.as_u16(),
            };
            return Err(refused_read(e, &self.namespace_id));
        }
        Ok(body)
    }

    fn bad(&self, path: &str, reason: String) -> RegistryError {
        RegistryError::BadResponse { registry: self.registry.clone(), what: format!("GET {path}"), reason }
    }
}

impl Api for HttpApi {
    async fn list_services(&self, group: &str) -> Result<Vec<String>, RegistryError> {
        list_all(|page, size| self.service_page(group, page, size)).await
    }

    async fn instances(&self, key: &ServiceKey) -> Result<Vec<Instance>, RegistryError> {
        let query = [
            ("serviceName", key.name.clone()),
            ("groupName", key.group.clone()),
            ("namespaceId", self.namespace_id.clone()),
            // Nacos's default; rnacos's default is `true`.
            ("healthyOnly", "false".to_string()),
        ];
        let body = self.get(INSTANCE_LIST, &query, Some(key)).await?;
        decode_instance_list(&body).map_err(|e| self.bad(INSTANCE_LIST, e.to_string()))
    }

    async fn probe(&self, group: &str) -> Result<Probe, RegistryError> {
        self.service_page(group, 1, PROBE_PAGE).await.map(|(names, count)| Probe::new(count, names))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::spec::{RegistryKind, RegistrySpec};

    #[tokio::test]
    async fn nacos_timeout_bounds_each_request() {
        // A server that accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let spec = RegistrySpec::new(RegistryKind::Nacos, "n", "127.0.0.1", addr.port());
        let http = reqwest::Client::new();
        let auth = Arc::new(Auth::new(&spec, http.clone()).unwrap());
        let api = HttpApi::new(http, vec![addr.to_string()], "public".into(), "n".into(), auth)
            .with_timeout(Some(Duration::from_millis(300)));
        let started = Instant::now();
        let err = api.list_services("DEFAULT_GROUP").await.unwrap_err();
        silent.abort();
        assert!(started.elapsed() < Duration::from_secs(3), "took {:?}, not nacosTimeout", started.elapsed());
        assert!(matches!(err, RegistryError::Unreachable { .. }), "{err}");
    }
}
