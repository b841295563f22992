//! A tiny HTTPS backend with a self-signed certificate (made by the openssl
//! CLI in a temp dir): it records the TLS server name (SNI) of every
//! connection and answers every HTTP/1.1 request `200 {name}`.

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
    server_names: Arc<Mutex<Vec<Option<String>>>>,
    tasks: Vec<JoinHandle<()>>,
    _dir: TempDir,
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
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let server_names = Arc::new(Mutex::new(Vec::new()));
        let mut bound = Vec::new();
        let mut tasks = Vec::new();
        for addr in addrs {
            let listener = TcpListener::bind(addr).await.with_context(|| format!("bind {addr}"))?;
            bound.push(listener.local_addr()?);
            tasks.push(tokio::spawn(serve(listener, acceptor.clone(), server_names.clone(), name.to_string())));
        }
        Ok(TlsBackend { addrs: bound, name: name.to_string(), server_names, tasks, _dir: dir })
    }

    /// The SNI of every TLS connection accepted so far, in order.
    pub fn server_names(&self) -> Vec<Option<String>> {
        self.server_names.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

async fn serve(listener: TcpListener, acceptor: TlsAcceptor, names: Arc<Mutex<Vec<Option<String>>>>, body: String) {
    while let Ok((sock, _)) = listener.accept().await {
        let (acceptor, names, body) = (acceptor.clone(), names.clone(), body.clone());
        tokio::spawn(async move {
            let Ok(mut tls) = acceptor.accept(sock).await else { return };
            let sni = tls.get_ref().1.server_name().map(str::to_string);
            names.lock().unwrap_or_else(PoisonError::into_inner).push(sni);
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
