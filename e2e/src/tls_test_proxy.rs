//! A TLS-terminating TCP proxy for tests (not a product component): it
//! accepts TLS with a [`TestPki`] server certificate and relays the plain
//! bytes to a server that has no TLS of its own (rnacos, the Eureka fake).
//! It counts completed handshakes, so a test can tell that a client really
//! came through TLS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::test_pki::TestPki;

pub struct TlsTestProxy {
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TlsTestProxy {
    /// Listen on `listen` (port 0: any) with TLS offering `alpn`, relaying
    /// to `upstream`.
    pub async fn start(
        pki: &TestPki,
        listen: SocketAddr,
        upstream: SocketAddr,
        alpn: &[&[u8]],
    ) -> anyhow::Result<TlsTestProxy> {
        let acceptor = TlsAcceptor::from(pki.server_config(alpn)?);
        let listener = TcpListener::bind(listen).await.with_context(|| format!("bind {listen}"))?;
        let addr = listener.local_addr()?;
        let handshakes = Arc::new(AtomicUsize::new(0));
        let count = handshakes.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (acceptor, count) = (acceptor.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(sock).await else { return };
                    count.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut plain) = TcpStream::connect(upstream).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Ok(TlsTestProxy { addr, handshakes, task })
    }

    /// TLS handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for TlsTestProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// TLS test proxies in front of a Nacos server's HTTP port and its gRPC port
/// (HTTP + 1000), on a free loopback pair `P`, `P + 1000`.
pub struct NacosTlsProxies {
    pub http: TlsTestProxy,
    pub grpc: TlsTestProxy,
}

impl NacosTlsProxies {
    pub async fn start(pki: &TestPki, http_port: u16, grpc_port: u16) -> anyhow::Result<NacosTlsProxies> {
        let upstream = |port| SocketAddr::from(([127, 0, 0, 1], port));
        for _ in 0..20 {
            let http = TlsTestProxy::start(pki, "127.0.0.1:0".parse()?, upstream(http_port), &[b"http/1.1"]).await?;
            let Some(port) = http.addr.port().checked_add(1000) else { continue };
            let listen = upstream(port);
            if let Ok(grpc) = TlsTestProxy::start(pki, listen, upstream(grpc_port), &[b"h2"]).await {
                return Ok(NacosTlsProxies { http, grpc });
            }
        }
        anyhow::bail!("no free loopback port pair P, P + 1000")
    }
}
