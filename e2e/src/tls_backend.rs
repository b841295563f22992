//! A tiny HTTPS backend with a self-signed certificate (made by the openssl
//! CLI in a temp dir), or with a server config of the test's own (one that
//! requires a client certificate: [`TlsBackend::start_with`]): it records
//! the TLS server name (SNI) and the client certificate of every connection
//! it accepts and answers every HTTP/1.1 request `200 {name}`.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

pub struct TlsBackend {
    pub addrs: Vec<SocketAddr>,
    pub name: String,
    handshakes: Arc<Mutex<Vec<Handshake>>>,
    tasks: Vec<JoinHandle<()>>,
    _dir: Option<TempDir>,
}

/// What one accepted connection's handshake showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handshake {
    pub server_name: Option<String>,
    /// The DER of the client's leaf certificate, when it sent one.
    pub client_cert: Option<Vec<u8>>,
}

/// A P-256 certificate for `dns_name`, valid for two days: (cert, key) PEM.
fn self_signed(dir: &std::path::Path, dns_name: &str) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .arg("-subj")
        .arg(format!("/CN={dns_name}"))
        .arg("-addext")
        .arg(format!("subjectAltName=DNS:{dns_name}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .context("run the openssl CLI (Debian package openssl) to make a test certificate")?;
    anyhow::ensure!(out.status.success(), "openssl req: {}", String::from_utf8_lossy(&out.stderr));
    Ok((std::fs::read(cert)?, std::fs::read(key)?))
}

impl TlsBackend {
    /// Listen on every address in `addrs` with a certificate for
    /// `dns_name`; `name` is the body of every answer.
    pub async fn start(addrs: &[SocketAddr], dns_name: &str, name: &str) -> anyhow::Result<TlsBackend> {
        let dir = tempfile::tempdir()?;
        let (cert, key) = self_signed(dir.path(), dns_name)?;
        let certs = CertificateDer::pem_slice_iter(&cert).collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(&key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        let mut backend = TlsBackend::start_with(addrs, Arc::new(config), name).await?;
        backend._dir = Some(dir);
        Ok(backend)
    }

    /// Listen on every address in `addrs` with `config`; `name` is the body
    /// of every answer. A connection whose handshake fails (no client
    /// certificate where `config` requires one) is not recorded.
    pub async fn start_with(
        addrs: &[SocketAddr],
        config: Arc<rustls::ServerConfig>,
        name: &str,
    ) -> anyhow::Result<TlsBackend> {
        let acceptor = TlsAcceptor::from(config);
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let mut bound = Vec::new();
        let mut tasks = Vec::new();
        for addr in addrs {
            let listener = TcpListener::bind(addr).await.with_context(|| format!("bind {addr}"))?;
            bound.push(listener.local_addr()?);
            tasks.push(tokio::spawn(serve(listener, acceptor.clone(), handshakes.clone(), name.to_string())));
        }
        Ok(TlsBackend { addrs: bound, name: name.to_string(), handshakes, tasks, _dir: None })
    }

    /// The SNI of every TLS connection accepted so far, in order.
    pub fn server_names(&self) -> Vec<Option<String>> {
        self.handshakes().into_iter().map(|h| h.server_name).collect()
    }

    /// Every TLS connection accepted so far, in order.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.handshakes.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, seen: Arc<Mutex<Vec<Handshake>>>, body: String) {
    while let Ok((sock, _)) = listener.accept().await {
        let (acceptor, seen, body) = (acceptor.clone(), seen.clone(), body.clone());
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(sock).await else { return };
            let conn = tls.get_ref().1;
            let server_name = conn.server_name().map(str::to_string);
            let client_cert = conn.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec());
            seen.lock().unwrap_or_else(PoisonError::into_inner).push(Handshake { server_name, client_cert });
            let mut buf = vec![0u8; 8192];
            let mut seen = Vec::new();
            // Keep-alive: answer each request head on the connection.
            loop {
                let n = match tls.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                seen.extend_from_slice(&buf[..n]);
                while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                    seen.drain(..end + 4);
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{}",
                        body.len(),
                        body
                    );
                    if tls.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
