//! A thin Eureka REST client on the binary's reqwest, over a list of
//! servers with failover.
//!
//! `domain` is a comma list of `host`, `host:port`, `[v6]` or `[v6]:port`
//! (port default: `port`). A call goes to the server that answered last; if
//! it fails (unreachable, an error status, or an answer we cannot read) the
//! next server is tried, wrapping around, each at most once per call, like
//! the Java client's `makeRemoteCall` walking its service URLs.

use std::net::Ipv6Addr;
use std::time::Duration;

use reqwest::Url;
use reqwest::header::{ACCEPT, HeaderMap, HeaderValue};
use tracing::{debug, warn};

use std::hash::{DefaultHasher, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use super::decode::{Applications, decode_reader};
use crate::body::{read_capped, too_large};
use crate::http_error::request_error;
use crate::spec::RegistrySpec;
use crate::watcher::RegistryError;

pub(crate) const APPS: &str = "/eureka/apps";
pub(crate) const DELTA: &str = "/eureka/apps/delta";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A full registry can be hundreds of megabytes; give it time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The most bytes read from one answer. It is decoded as it arrives, never
/// held: a full answer is about 1 KB per instance, so this is about a
/// million instances.
const MAX_STREAM_BYTES: usize = 1 << 30;
/// An error answer is read for its first lines only.
const ERROR_BODY_BYTES: usize = 64 << 10;
/// Chunks between the reader and the decoder.
const CHUNKS_IN_FLIGHT: usize = 8;
/// A delta up to this size is held while its digest is taken, then
/// decoded from memory if it is new. A larger one is only hashed as it
/// streams by, and fetched again to be decoded if it is new: after a mass
/// registration the server answers the whole catalog as the delta, the
/// same bytes for up to three minutes, and decoding it again every poll
/// was nearly all the watcher's CPU.
const HELD_DELTA_BYTES: usize = 1 << 20;

/// One call to one server, as [`Client::failover`] makes it.
type Attempt<'c, T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, RegistryError>> + Send + 'c>>;

/// A delta, or word that it is byte for byte the one last applied.
pub(crate) enum Delta {
    Same,
    New(Applications),
}

pub(crate) struct Client {
    http: reqwest::Client,
    /// `http://host:port` (`https` with TLS), no trailing slash.
    servers: Vec<String>,
    /// Index of the server that answered last; calls start there.
    current: usize,
    registry: String,
}

impl Client {
    pub fn new(spec: &RegistrySpec) -> Result<Client, RegistryError> {
        let mut servers = parse_servers(&spec.domain, spec.port).map_err(|reason| RegistryError::Config {
            registry: spec.name.clone(),
            field: "domain".into(),
            reason: reason.to_string(),
        })?;
        if spec.tls.is_some() {
            for server in &mut servers {
                server.replace_range(.."http".len(), "https");
            }
        }
        let mut headers = HeaderMap::new();
        // Eureka answers XML unless asked otherwise.
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        let http = crate::tls::http_client(&spec.name, spec.tls.as_ref())?
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| RegistryError::Config {
                registry: spec.name.clone(),
                field: "domain".into(),
                reason: format!("cannot build HTTP client: {e}"),
            })?;
        Ok(Client { http, servers, current: 0, registry: spec.name.clone() })
    }

    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// GET `path` from the current server, failing over to the others.
    /// Returns the index of the server that answered, or every server's
    /// error when none did.
    pub async fn fetch(&mut self, path: &'static str) -> Result<(usize, Applications), Vec<RegistryError>> {
        self.failover(|client, index| Box::pin(client.get(index, path))).await
    }

    /// GET the delta, failing over as [`Client::fetch`] does. When its
    /// digest is `last`, it is not decoded ([`Delta::Same`]).
    pub async fn fetch_delta(&mut self, last: Option<u64>) -> Result<(usize, Delta), Vec<RegistryError>> {
        self.failover(|client, index| Box::pin(client.get_delta(index, last))).await
    }

    /// Call `get` on the current server, then on each other one in turn
    /// until one answers, like the Java client's `makeRemoteCall`.
    async fn failover<T>(
        &mut self,
        get: impl for<'c> Fn(&'c Client, usize) -> Attempt<'c, T>,
    ) -> Result<(usize, T), Vec<RegistryError>> {
        let mut errors = Vec::new();
        for step in 0..self.servers.len() {
            let index = (self.current + step) % self.servers.len();
            match get(self, index).await {
                Ok(answer) => {
                    if index != self.current {
                        warn!(from = %self.servers[self.current], to = %self.servers[index], "failed over");
                        self.current = index;
                    }
                    return Ok((index, answer));
                }
                Err(e) => {
                    warn!(server = %self.servers[index], error = %e, kind = e.kind(), "eureka call failed");
                    errors.push(e);
                }
            }
        }
        Err(errors)
    }

    async fn get_delta(&self, index: usize, last: Option<u64>) -> Result<Delta, RegistryError> {
        let Some(last) = last else { return self.get(index, DELTA).await.map(Delta::New) };
        let (what, mut resp) = self.send(index, DELTA).await?;
        let read_error = |e: &reqwest::Error| request_error(&self.registry, "GET", &what, e);
        if resp.content_length().unwrap_or(0) > MAX_STREAM_BYTES as u64 {
            return Err(too_large(&self.registry, &what, MAX_STREAM_BYTES));
        }
        let mut digest = DefaultHasher::new();
        let mut held = Some(Vec::new());
        let mut read = 0usize;
        while let Some(chunk) = resp.chunk().await.map_err(|e| read_error(&e))? {
            read += chunk.len();
            if read > MAX_STREAM_BYTES {
                return Err(too_large(&self.registry, &what, MAX_STREAM_BYTES));
            }
            digest.write(&chunk);
            if read > HELD_DELTA_BYTES {
                held = None;
            } else if let Some(held) = &mut held {
                held.extend_from_slice(&chunk);
            }
        }
        let digest = digest.finish();
        if digest == last {
            return Ok(Delta::Same);
        }
        match held {
            Some(body) => {
                let decoded = tokio::task::spawn_blocking(move || decode_reader(body.as_slice(), || digest))
                    .await
                    .map_err(|e| bad_response(&self.registry, &what, format!("decoder stopped: {e}")))?;
                decoded.map(Delta::New).map_err(|e| bad_response(&self.registry, &what, e.to_string()))
            }
            // Too large to have held: read it again, decoding as it streams.
            None => {
                debug!(bytes = read, "a new large delta; reading it again to decode it");
                self.get(index, DELTA).await.map(Delta::New)
            }
        }
    }

    async fn send(&self, index: usize, path: &str) -> Result<(String, reqwest::Response), RegistryError> {
        let what = format!("{}{path}", self.servers[index]);
        let resp = self.http.get(&what).send().await.map_err(|e| request_error(&self.registry, "GET", &what, &e))?;
        let status = resp.status();
        if !status.is_success() {
            let read_error = |e: &reqwest::Error| request_error(&self.registry, "GET", &what, e);
            let body = read_capped(resp, ERROR_BODY_BYTES, &self.registry, &what, read_error).await?;
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            debug!(what, status = status.as_u16(), body = %text.trim(), "eureka error answer");
            return Err(RegistryError::Status { registry: self.registry.clone(), what, status: status.as_u16() });
        }
        Ok((what, resp))
    }

    async fn get(&self, index: usize, path: &str) -> Result<Applications, RegistryError> {
        let (what, resp) = self.send(index, path).await?;
        let read_error = |e: &reqwest::Error| request_error(&self.registry, "GET", &what, e);
        decode_streamed(resp, MAX_STREAM_BYTES, &self.registry, &what, read_error).await
    }
}

fn bad_response(registry: &str, what: &str, reason: String) -> RegistryError {
    RegistryError::BadResponse { registry: registry.to_string(), what: what.to_string(), reason }
}

/// Decode `resp`'s body as it arrives, on a blocking thread fed chunk by
/// chunk: memory is the decoded instances and a few chunks in flight, never
/// the body (a full answer at 100k apps is hundreds of MB). At most `cap`
/// bytes are read.
async fn decode_streamed(
    mut resp: reqwest::Response,
    cap: usize,
    registry: &str,
    what: &str,
    read_error: impl Fn(&reqwest::Error) -> RegistryError,
) -> Result<Applications, RegistryError> {
    if resp.content_length().unwrap_or(0) > cap as u64 {
        return Err(too_large(registry, what, cap));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(CHUNKS_IN_FLIGHT);
    let digest = Arc::new(Mutex::new(DefaultHasher::new()));
    let decoder = {
        let digest = digest.clone();
        tokio::task::spawn_blocking(move || {
            let reader = std::io::BufReader::with_capacity(64 << 10, ChunkReader { rx, current: Bytes::new() });
            decode_reader(reader, || digest.lock().unwrap_or_else(PoisonError::into_inner).finish())
        })
    };
    let mut read = 0usize;
    let transport = loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                read += chunk.len();
                if read > cap {
                    break Err(too_large(registry, what, cap));
                }
                digest.lock().unwrap_or_else(PoisonError::into_inner).write(&chunk);
                // The decoder stopped early (the JSON is broken): its error says why.
                if tx.send(chunk).await.is_err() {
                    break Ok(());
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(read_error(&e)),
        }
    };
    // The end of the body, or of what will be read of it.
    drop(tx);
    let decoded = decoder.await.map_err(|e| RegistryError::BadResponse {
        registry: registry.to_string(),
        what: what.to_string(),
        reason: format!("decoder stopped: {e}"),
    })?;
    transport?;
    decoded.map_err(|e| RegistryError::BadResponse {
        registry: registry.to_string(),
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// The body's chunks as a `Read`, for the blocking decoder.
struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Why a `domain` entry is not a Eureka server address.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadServer {
    /// The entry (clipped) and what is wrong with it.
    #[error("{item:?}: {why}")]
    Entry { item: String, why: String },
    #[error("no servers")]
    None,
}

/// `domain` as base URLs, in order, duplicates removed.
pub(crate) fn parse_servers(domain: &str, default_port: u16) -> Result<Vec<String>, BadServer> {
    let mut out: Vec<String> = Vec::new();
    for item in domain.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = |why: &str| BadServer::Entry { item: crate::clip::clip(item).into_owned(), why: why.to_string() };
        let (host, port) = if let Some(rest) = item.strip_prefix('[') {
            let (v6, tail) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
            v6.parse::<Ipv6Addr>().map_err(|_| bad("not an IPv6 address"))?;
            let port = match tail {
                "" => None,
                t => Some(t.strip_prefix(':').ok_or_else(|| bad("expected :port after ']'"))?),
            };
            (format!("[{v6}]"), port)
        } else if item.parse::<Ipv6Addr>().is_ok() {
            (format!("[{item}]"), None)
        } else {
            match item.split_once(':') {
                Some((host, port)) => (host.to_string(), Some(port)),
                None => (item.to_string(), None),
            }
        };
        let port = match port {
            None if default_port == 0 => return Err(bad("no port, and the registry has none")),
            None => default_port,
            Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| bad("port must be 1..65535"))?,
        };
        let base = format!("http://{host}:{port}");
        let url = Url::parse(&base).map_err(|e| bad(&e.to_string()))?;
        if url.host_str().is_none_or(str::is_empty) || url.path() != "/" {
            return Err(bad("not a host"));
        }
        if !out.contains(&base) {
            out.push(base);
        }
    }
    if out.is_empty() {
        return Err(BadServer::None);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on loopback that answers one request with `body`, chunked
    /// (no length declared), in pieces of `piece` bytes.
    async fn serve_once(body: Vec<u8>, piece: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 4096];
            let _ = sock.read(&mut head).await;
            let mut out =
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
            for part in body.chunks(piece) {
                out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                out.extend_from_slice(part);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
            let _ = sock.write_all(&out).await;
        });
        format!("http://{addr}/eureka/apps")
    }

    fn answer(apps: usize) -> Vec<u8> {
        let apps: Vec<serde_json::Value> = (0..apps)
            .map(|a| {
                serde_json::json!({"name": format!("A{a}"), "instance": [{"instanceId": format!("i{a}"),
                "app": format!("A{a}"), "ipAddr": "10.0.0.1", "status": "UP", "port": {"$": 80, "@enabled": "true"},
                "actionType": "ADDED"}]})
            })
            .collect();
        serde_json::json!({"applications": {"apps__hashcode": format!("UP_{}_", apps.len()), "application": apps}})
            .to_string()
            .into_bytes()
    }

    async fn fetch(url: &str, cap: usize) -> Result<Applications, RegistryError> {
        let resp = reqwest::get(url).await.unwrap();
        let read_error = |e: &reqwest::Error| request_error("e", "GET", url, e);
        decode_streamed(resp, cap, "e", url, read_error).await
    }

    #[tokio::test]
    async fn an_answer_is_decoded_as_it_streams_and_capped() {
        let body = answer(500);
        let whole = super::super::decode::decode_apps(&body).unwrap();
        let url = serve_once(body.clone(), 777).await;
        let streamed = fetch(&url, body.len()).await.unwrap();
        assert_eq!(streamed.groups, whole.groups);
        assert_eq!(
            (streamed.hashcode, streamed.digest),
            (whole.hashcode, whole.digest),
            "the digest of the same bytes"
        );

        let url = serve_once(body.clone(), 777).await;
        let err = fetch(&url, body.len() - 1).await.unwrap_err();
        assert!(err.to_string().contains("byte cap"), "{err}");

        let mut broken = body.clone();
        broken.truncate(body.len() / 2);
        let url = serve_once(broken, 777).await;
        assert!(matches!(fetch(&url, body.len()).await, Err(RegistryError::BadResponse { .. })));
    }

    /// A server on loopback that answers every request with `body` (a
    /// declared length), counting the requests.
    async fn serve_always(body: Vec<u8>) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let served = count.clone();
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let body = body.clone();
                let served = served.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n) = sock.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        head.extend_from_slice(&buf[..n]);
                        while let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                            head.drain(..end + 4);
                            served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let mut out = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            out.extend_from_slice(&body);
                            if sock.write_all(&out).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (port, count)
    }

    /// A delta byte for byte the last one applied is not decoded: a small
    /// one is held and hashed, a large one (the whole catalog, after a mass
    /// registration) hashed as it streams by and read again only when new.
    #[tokio::test]
    async fn a_repeated_delta_is_recognised_before_it_is_decoded() {
        for (apps, requests_when_new) in [(5, 1), (8_000, 2)] {
            let body = answer(apps);
            assert_eq!(body.len() > HELD_DELTA_BYTES, requests_when_new == 2, "{} bytes", body.len());
            let (port, served) = serve_always(body.clone()).await;
            let spec = RegistrySpec::new(crate::RegistryKind::Eureka, "e", "127.0.0.1", port);
            let mut client = Client::new(&spec).unwrap();
            let whole = super::super::decode::decode_apps(&body).unwrap();

            let Ok((0, Delta::New(first))) = client.fetch_delta(None).await else { panic!("no first delta") };
            assert_eq!((first.len(), first.digest), (apps, whole.digest));
            assert_eq!(served.swap(0, std::sync::atomic::Ordering::SeqCst), 1);

            let Ok((0, Delta::Same)) = client.fetch_delta(Some(whole.digest)).await else {
                panic!("the same bytes were not recognised")
            };
            assert_eq!(served.swap(0, std::sync::atomic::Ordering::SeqCst), 1);

            let Ok((0, Delta::New(again))) = client.fetch_delta(Some(whole.digest ^ 1)).await else {
                panic!("a new delta was not decoded")
            };
            assert_eq!(again.groups, whole.groups);
            assert_eq!(again.digest, whole.digest);
            assert_eq!(served.swap(0, std::sync::atomic::Ordering::SeqCst), requests_when_new, "{apps} apps");
        }
    }

    #[test]
    fn server_lists() {
        let got = parse_servers(" eureka-a, 10.0.0.2:8762,[::1]:9000, ::2,[fe80::1], eureka-a:8761 ,", 8761).unwrap();
        assert_eq!(
            got,
            vec![
                "http://eureka-a:8761",
                "http://10.0.0.2:8762",
                "http://[::1]:9000",
                "http://[::2]:8761",
                "http://[fe80::1]:8761"
            ]
        );
        for bad in ["", " , ", "a:0", "a:x", "a:70000", "[::1", "[nope]:80", "[::1]x", "a/b", "a b"] {
            assert!(parse_servers(bad, 8761).is_err(), "{bad:?} accepted");
        }
        assert!(parse_servers("a", 0).is_err());
        assert_eq!(parse_servers("a:1", 0).unwrap(), vec!["http://a:1"]);
    }
}
