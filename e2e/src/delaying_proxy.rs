//! A fake: a delaying TCP proxy of our own, in front of a real Consul, that
//! plays a Consul slow to answer some requests (as Consul 1.8 is with its
//! first `/v1/catalog/services` at 100k services right after a mass
//! registration, which a dev agent on a test machine cannot be made to do
//! on demand). It relays TCP on loopback and holds every request that
//! `hold` picks for `delay` before passing it on, so its answer comes that
//! much later; everything else passes through at once. It reads the
//! client's bytes as a stream of HTTP/1.1 request heads with no bodies,
//! which is all the Consul watcher sends (GETs, pipelined or not).
//! Dropping it ends every relayed connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Picks the requests to hold, by their request line (`GET /path?query HTTP/1.1`).
pub type Hold = Arc<dyn Fn(&str) -> bool + Send + Sync>;

pub struct DelayingProxy {
    pub port: u16,
    held: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl DelayingProxy {
    /// Relay `127.0.0.1:{port}` to `upstream`, holding the requests `hold`
    /// picks for `delay`.
    pub async fn start(upstream: SocketAddr, delay: Duration, hold: Hold) -> std::io::Result<DelayingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let held = Arc::new(AtomicU64::new(0));
        let counted = held.clone();
        let task = tokio::spawn(async move {
            // Owned here, so aborting this task ends every connection.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else { return };
                        let (hold, held) = (hold.clone(), counted.clone());
                        conns.spawn(async move {
                            if let Ok(server) = TcpStream::connect(upstream).await {
                                relay(client, server, delay, hold, held).await;
                            }
                        });
                    }
                    Some(_) = conns.join_next() => {}
                }
            }
        });
        Ok(DelayingProxy { port, held, task })
    }

    /// Requests held so far.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::SeqCst)
    }
}

impl Drop for DelayingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers pass straight back; requests go up one head at a time, each
/// held first if `hold` picks it. Ends when either side closes.
async fn relay(client: TcpStream, server: TcpStream, delay: Duration, hold: Hold, held: Arc<AtomicU64>) {
    let (client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, server_tx) = server.into_split();
    let down = tokio::io::copy(&mut server_rx, &mut client_tx);
    let up = requests_up(client_rx, server_tx, delay, hold, held);
    tokio::select! {
        _ = down => {}
        () = up => {}
    }
}

async fn requests_up(
    mut client: OwnedReadHalf,
    mut server: OwnedWriteHalf,
    delay: Duration,
    hold: Hold,
    held: Arc<AtomicU64>,
) {
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Pass on every complete head received so far, in order.
        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head: Vec<u8> = pending.drain(..end + 4).collect();
            let line = String::from_utf8_lossy(&head);
            let line = line.lines().next().unwrap_or_default();
            if hold(line) {
                held.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
            }
            if server.write_all(&head).await.is_err() {
                return;
            }
        }
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// A [`Hold`] for Consul's non-blocking `GET {path}` (no `index`: the
/// first read of a sync or a listing, not a detector's blocking query).
pub fn non_blocking_get(path: &'static str) -> Hold {
    Arc::new(move |line: &str| {
        let Some(target) = line.strip_prefix("GET ").and_then(|rest| rest.split(' ').next()) else {
            return false;
        };
        let (target_path, query) = target.split_once('?').unwrap_or((target, ""));
        target_path == path && !query.split('&').any(|pair| pair.starts_with("index="))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_only_the_non_blocking_get_of_its_path() {
        let hold = non_blocking_get("/v1/catalog/services");
        assert!(hold("GET /v1/catalog/services?dc=dc1 HTTP/1.1"));
        assert!(hold("GET /v1/catalog/services HTTP/1.1"));
        assert!(!hold("GET /v1/catalog/services?dc=dc1&index=12&wait=30000ms HTTP/1.1"), "blocking");
        assert!(!hold("GET /v1/catalog/services?index=12 HTTP/1.1"), "blocking");
        assert!(!hold("GET /v1/catalog/nodes?dc=dc1 HTTP/1.1"));
        assert!(!hold("GET /v1/catalog/services/web HTTP/1.1"));
        assert!(!hold("PUT /v1/catalog/services HTTP/1.1"));
    }
}
