//! A test proxy of our own that plays a load balancer or NAT with an idle
//! timeout (hole H4 of the watcher review): it relays TCP on loopback, and
//! a connection that carried nothing either way for `idle` is reset (RST,
//! `SO_LINGER` 0) when the client next sends on it, as an AWS NLB does
//! after its idle timeout. A connection busy with a long answer (a Consul
//! blocking query) is not idle: the answer's bytes count.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub struct IdleCutProxy {
    pub port: u16,
    cuts: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl IdleCutProxy {
    /// Relay `127.0.0.1:{port}` to `upstream`, cutting connections idle for `idle`.
    pub async fn start(upstream: SocketAddr, idle: Duration) -> std::io::Result<IdleCutProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let cuts = Arc::new(AtomicU64::new(0));
        let counted = cuts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let cuts = counted.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, idle, cuts).await;
                    }
                });
            }
        });
        Ok(IdleCutProxy { port, cuts, task })
    }

    /// Connections reset so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for IdleCutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(mut client: TcpStream, mut server: TcpStream, idle: Duration, cuts: Arc<AtomicU64>) {
    let mut last = Instant::now();
    let (mut up, mut down) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut up) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if last.elapsed() >= idle {
                        // Idle too long: reset, as the load balancer would.
                        cuts.fetch_add(1, Ordering::SeqCst);
                        // Deprecated because a non-zero linger blocks the
                        // dropping thread; zero never does, it only resets.
                        #[allow(deprecated)]
                        let _ = client.set_linger(Some(Duration::ZERO));
                        return;
                    }
                    last = Instant::now();
                    if server.write_all(&up[..n]).await.is_err() {
                        return;
                    }
                }
            },
            read = server.read(&mut down) => match read {
                Ok(0) | Err(_) => {
                    // The server closed: pass the close on after the data.
                    let _ = client.shutdown().await;
                    return;
                }
                Ok(n) => {
                    last = Instant::now();
                    if client.write_all(&down[..n]).await.is_err() {
                        return;
                    }
                }
            },
        }
    }
}
