//! A TCP relay in front of a real HTTP/1.1 server that records the request
//! line (`METHOD /path?query`) of every request passing through it, so a
//! test can count what a watcher asked the registry for. Bytes are relayed
//! unchanged both ways; only the client-to-server side is read for request
//! lines (GET requests without bodies, as the watchers send; a request with
//! a body is recorded too, and its body is not mistaken for a request line
//! unless it looks like one). The relay stops when dropped.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const METHODS: [&str; 5] = ["GET ", "PUT ", "POST ", "DELETE ", "HEAD "];

pub struct RequestLog {
    pub port: u16,
    lines: Arc<Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl RequestLog {
    /// Relay a free loopback port to `127.0.0.1:{upstream}`.
    pub async fn start(upstream: u16) -> anyhow::Result<RequestLog> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let log = lines.clone();
        let target = SocketAddr::from(([127, 0, 0, 1], upstream));
        let task = tokio::spawn(async move {
            // Dropping the accept task does not stop the relays it spawned;
            // they end when either side closes, which the watcher's stop does.
            while let Ok((client, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        relay(client, server, log).await;
                    }
                });
            }
        });
        Ok(RequestLog { port, lines, task })
    }

    /// Every request line seen so far (`GET /v1/health/service/web?…`).
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The paths (query cut) of requests whose path starts with `prefix`.
    pub fn paths_under(&self, prefix: &str) -> Vec<String> {
        self.lines()
            .iter()
            .filter_map(|l| l.split_once(' ').map(|(_, rest)| rest.split(' ').next().unwrap_or(rest)))
            .map(|p| p.split('?').next().unwrap_or(p))
            .filter(|p| p.starts_with(prefix))
            .map(|p| p.to_string())
            .collect()
    }

    /// Forget what was recorded.
    pub fn clear(&self) {
        self.lines.lock().unwrap().clear();
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, server: TcpStream, log: Arc<Mutex<Vec<String>>>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        // Bytes of an unfinished line carried to the next read.
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = pending.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&pending[..end]).into_owned();
                pending.drain(..end + 2);
                if METHODS.iter().any(|m| line.starts_with(m)) {
                    let request = line.rsplit_once(' ').map_or(line.as_str(), |(r, _)| r).to_string();
                    log.lock().unwrap().push(request);
                }
            }
            if pending.len() > 64 * 1024 {
                pending.clear();
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let down = async move {
        let _ = tokio::io::copy(&mut sr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}
