//! The admin server's accept loop: HTTP/1 only, with a header-read timeout
//! and a cap on open connections, which `axum::serve` does not offer. A
//! connection beyond the cap is closed at once; one that does not send a
//! complete request head in time is closed by hyper.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};

/// Admin server bounds (`meshbridge run` flags).
#[derive(Debug, Clone, Copy)]
pub struct AdminLimits {
    /// Time to send a complete request head, from the connection's start or
    /// the end of the previous request.
    pub header_read_timeout: Duration,
    /// Connections open at once; more are closed on accept.
    pub max_connections: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits { header_read_timeout: Duration::from_secs(10), max_connections: 128 }
    }
}

/// Serve `router` on `listener` until `shutdown` resolves; open
/// connections then finish their request in flight.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: AdminLimits,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (closing, close_rx) = watch::channel(false);
    let mut refused: u64 = 0;
    tokio::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off a little.
                    debug!(error = %e, "admin accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                warn!(%peer, refused, max = limits.max_connections, "admin connection refused: too many open");
            }
            drop(io);
            continue;
        };
        let svc = TowerToHyperService::new(router.clone());
        let mut close = close_rx.clone();
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(io), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r { debug!(%peer, error = %e, "admin connection ended") },
                _ = close.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(slot);
        });
    }
    let _ = closing.send(true);
    Ok(())
}
