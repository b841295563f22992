//! The API server side of `kube_services_cost`: objects written straight
//! to a real kube-apiserver over HTTPS with the admin token (no kubectl
//! process per write, so a write's response time is the harness's own
//! stamp), JSON patches, and a bare watch on EndpointSlices that stamps
//! when each event reaches a plain client, to tell the API server's share
//! of a change's latency from meshbridge's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::task::{JoinHandle, JoinSet};

use crate::apiserver::ApiServer;

/// One write's time limit.
const WRITE_LIMIT: Duration = Duration::from_secs(30);

/// An HTTPS client of the API server, as the admin.
#[derive(Clone)]
pub struct KubeApi {
    url: String,
    token: String,
    http: reqwest::Client,
    /// Without a time limit, for the watch.
    streaming: reqwest::Client,
}

impl KubeApi {
    pub fn new(server: &ApiServer) -> anyhow::Result<KubeApi> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&server.ca_file)?)?;
        let build = |limit: Option<Duration>| {
            let b = reqwest::Client::builder().add_root_certificate(ca.clone());
            match limit {
                Some(l) => b.timeout(l),
                None => b,
            }
            .build()
        };
        Ok(KubeApi {
            url: server.url.clone(),
            token: server.admin_token().to_owned(),
            http: build(Some(WRITE_LIMIT))?,
            streaming: build(None)?,
        })
    }

    async fn check(what: &str, resp: reqwest::Response) -> anyhow::Result<Value> {
        let status = resp.status();
        let body = resp.text().await.with_context(|| format!("{what}: body"))?;
        if !status.is_success() {
            bail!("{what}: {status}: {body}");
        }
        serde_json::from_str(&body).with_context(|| format!("{what}: not JSON: {body}"))
    }

    /// POST `object` to the collection at `path` (`/api/v1/namespaces`).
    pub async fn create(&self, path: &str, object: &Value) -> anyhow::Result<()> {
        let resp = self.http.post(format!("{}{path}", self.url)).bearer_auth(&self.token).json(object).send().await?;
        Self::check(&format!("POST {path}"), resp).await.map(drop)
    }

    /// [`create`](Self::create) each of `objects`, `in_flight` at a time.
    pub async fn create_all(&self, path: &str, objects: Vec<Value>, in_flight: usize) -> anyhow::Result<()> {
        let mut tasks = JoinSet::new();
        for object in objects {
            if tasks.len() >= in_flight {
                tasks.join_next().await.context("no task")???;
            }
            let (api, path) = (self.clone(), path.to_owned());
            tasks.spawn(async move { api.create(&path, &object).await });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        Ok(())
    }

    /// A JSON patch (RFC 6902) of the object at `path`; its new
    /// `resourceVersion`.
    pub async fn json_patch(&self, path: &str, ops: &Value) -> anyhow::Result<String> {
        let resp = self
            .http
            .patch(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json-patch+json")
            .body(ops.to_string())
            .send()
            .await?;
        let object = Self::check(&format!("PATCH {path}"), resp).await?;
        object["metadata"]["resourceVersion"].as_str().map(str::to_owned).context("no resourceVersion in the answer")
    }

    /// Watch the collection at `path` (a list URL) from now on.
    pub async fn watch(&self, path: &str) -> anyhow::Result<Watch> {
        let list = self.http.get(format!("{}{path}?limit=1", self.url)).bearer_auth(&self.token).send().await?;
        let list = Self::check(&format!("GET {path}"), list).await?;
        let from = list["metadata"]["resourceVersion"].as_str().context("no resourceVersion on the list")?;
        let url = format!("{}{path}?watch=true&resourceVersion={from}&timeoutSeconds=7200", self.url);
        let resp = self.streaming.get(url).bearer_auth(&self.token).send().await?;
        anyhow::ensure!(resp.status().is_success(), "watch {path}: {}", resp.status());
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let task = tokio::spawn(read_events(resp, seen.clone()));
        Ok(Watch { seen, task })
    }
}

/// A plain watch: when each object version (by `resourceVersion`) arrived.
pub struct Watch {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    task: JoinHandle<()>,
}

impl Watch {
    /// When the event carrying version `rv` arrived.
    pub fn seen(&self, rv: &str) -> Option<Instant> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner).get(rv).copied()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One JSON event per line; each stamped when its last chunk arrived.
async fn read_events(mut resp: reqwest::Response, seen: Arc<Mutex<HashMap<String, Instant>>>) {
    let mut buf: Vec<u8> = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let at = Instant::now();
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let Ok(event) = serde_json::from_slice::<Value>(&line) else { continue };
            if let Some(rv) = event["object"]["metadata"]["resourceVersion"].as_str() {
                seen.lock().unwrap_or_else(PoisonError::into_inner).insert(rv.to_owned(), at);
            }
        }
    }
}
