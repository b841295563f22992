//! Tiny HTTP/1.1 backends that answer every request with their own name, so
//! a test can tell which endpoint Envoy picked; [`EchoBackend`] also shows
//! what it was sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub struct Backend {
    pub addr: SocketAddr,
    pub name: String,
    task: JoinHandle<()>,
}

impl Backend {
    /// Listen on `ip:0` and answer `200 {name}` to every request.
    pub async fn start(ip: &str, name: &str) -> anyhow::Result<Backend> {
        Backend::on(std::net::TcpListener::bind((ip, 0))?, name)
    }

    /// Answer `200 {name}` on a listener made elsewhere (in a network
    /// namespace, say: a socket stays in the namespace it was made in).
    pub fn on(listener: std::net::TcpListener, name: &str) -> anyhow::Result<Backend> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        let body: Arc<str> = name.into();
        let task = serve(listener, move |_head| {
            let body = body.clone();
            async move {
                format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}", body.len())
            }
        });
        Ok(Backend { addr, name: name.to_string(), task })
    }
}

/// Accept connections on `listener` and answer each request head read on
/// one (keep-alive) with what `answer` makes of it; bodies are not read.
fn serve<F, Fut>(listener: TcpListener, answer: F) -> JoinHandle<()>
where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = String> + Send,
{
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let mut seen = Vec::new();
                loop {
                    let n = match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = seen.drain(..end + 4).collect();
                        let resp = answer(String::from_utf8_lossy(&head).into_owned()).await;
                        if sock.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    })
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Requests per path (with its query).
type Hits = Arc<Mutex<BTreeMap<String, u32>>>;

/// A backend that shows what it was sent and can misbehave on request, for
/// route policy tests. Each answer's body is its name, then the request
/// head's lines (header names lowercased); each answer carries
/// `x-powered-by: echo` and `x-backend: {name}`. By path:
/// - `…/slow…`: answers after 3 s;
/// - `…/flaky…`: the first request for each path gets a 503, later ones 200;
/// - `…/status/NNN…`: answers with status NNN.
///
/// It counts the requests each path got.
pub struct EchoBackend {
    pub addr: SocketAddr,
    pub name: String,
    hits: Hits,
    task: JoinHandle<()>,
}

impl EchoBackend {
    pub async fn start(ip: &str, name: &str) -> anyhow::Result<EchoBackend> {
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let hits: Hits = Arc::default();
        let (me, counts): (Arc<str>, Hits) = (name.into(), hits.clone());
        let task = serve(listener, move |head| {
            let (me, counts) = (me.clone(), counts.clone());
            async move { echo_answer(&me, &head, &counts).await }
        });
        Ok(EchoBackend { addr, name: name.to_string(), hits, task })
    }

    /// How many requests `path` (with its query) got.
    pub fn hits(&self, path: &str) -> u32 {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// The answer to one request head (bodies are not expected).
async fn echo_answer(name: &str, head: &str, counts: &Mutex<BTreeMap<String, u32>>) -> String {
    let mut lines = head.lines().filter(|l| !l.is_empty());
    let request_line = lines.next().unwrap_or_default();
    let path = request_line.split(' ').nth(1).unwrap_or("/").to_string();
    let n = {
        let mut counts = counts.lock().unwrap();
        let n = counts.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    if path.contains("/slow") {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    }
    let asked = path.split_once("/status/").and_then(|(_, rest)| rest.get(..3)).filter(|c| c.parse::<u16>().is_ok());
    let status = match asked {
        Some(code) => format!("{code} Asked For"),
        None if path.contains("/flaky") && n == 1 => "503 Service Unavailable".into(),
        None => "200 OK".into(),
    };
    let mut body = format!("{name}\n{request_line}\n");
    for line in lines {
        let (k, v) = line.split_once(':').unwrap_or((line, ""));
        body.push_str(&format!("{}: {}\n", k.trim().to_ascii_lowercase(), v.trim()));
    }
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nx-powered-by: echo\r\nx-backend: {name}\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

impl Drop for EchoBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}
