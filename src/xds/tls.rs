//! TLS and mTLS for the xDS server (`--xds-tls-cert`, `--xds-tls-key`,
//! `--xds-client-ca`), with rustls and the ring provider.
//!
//! The files are read at startup (a bad one is a startup error naming the
//! flag and the path) and then re-read every `--xds-tls-reload-interval`:
//! when any changed (cert-manager rotates a mounted Secret by swapping a
//! symlink), the next handshake uses the new certificate and CA. A change
//! that does not load is logged and the last good one is kept.
//!
//! Handshakes run in their own tasks, at most [`MAX_HANDSHAKES`] at once,
//! each bounded by `--xds-handshake-timeout`: a client that never finishes
//! its handshake holds neither the accept loop nor other clients.

use std::hash::{Hash, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

use super::auth::{PeerAuth, cert_identity};
use super::limits::{Conn, Connections, Io, LogLimit, XdsLimits, XdsTlsArgs};

/// TLS handshakes in progress at once; more connections wait in the
/// kernel's accept queue.
pub const MAX_HANDSHAKES: usize = 256;

/// Why the xDS server's TLS files cannot be used. Never carries key bytes.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A flag needs another one that is not given.
    #[error("{0}")]
    Flags(&'static str),
    /// A file could not be read.
    #[error("{flag} {}: {error}", path.display())]
    Read { flag: &'static str, path: PathBuf, error: io::Error },
    /// A file holds no usable PEM of the kind its flag needs.
    #[error("{flag} {}: {what}", path.display())]
    Pem { flag: &'static str, path: PathBuf, what: String },
    /// rustls refused the certificate, key or CA.
    #[error("{flag} {}: {message}", path.display())]
    Rejected { flag: &'static str, path: PathBuf, message: String },
}

const CERT_FLAG: &str = "--xds-tls-cert";
const KEY_FLAG: &str = "--xds-tls-key";
const CA_FLAG: &str = "--xds-client-ca";

/// The loaded TLS config, swapped whole when the files change.
pub struct XdsTls {
    args: XdsTlsArgs,
    current: RwLock<Loaded>,
}

struct Loaded {
    config: Arc<ServerConfig>,
    /// Hash of the three files' bytes, to see a change without keeping a key copy.
    digest: u64,
}

impl std::fmt::Debug for XdsTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsTls").field("args", &self.args).finish_non_exhaustive()
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|error| TlsError::Read { flag, path: path.to_owned(), error })
}

impl XdsTls {
    /// `None` without `--xds-tls-cert`; an error for a bad file or flag set.
    pub fn load(args: &XdsTlsArgs) -> Result<Option<Arc<XdsTls>>, TlsError> {
        if args.xds_client_cert_optional && args.xds_client_ca.is_none() {
            return Err(TlsError::Flags("--xds-client-cert-optional needs --xds-client-ca"));
        }
        let (Some(_), Some(_)) = (&args.xds_tls_cert, &args.xds_tls_key) else {
            return match (&args.xds_tls_cert, &args.xds_tls_key, &args.xds_client_ca) {
                (None, None, None) => Ok(None),
                (Some(_), None, _) => Err(TlsError::Flags("--xds-tls-cert needs --xds-tls-key")),
                (None, Some(_), _) => Err(TlsError::Flags("--xds-tls-key needs --xds-tls-cert")),
                _ => Err(TlsError::Flags("--xds-client-ca needs --xds-tls-cert and --xds-tls-key")),
            };
        };
        let loaded = build(args)?;
        Ok(Some(Arc::new(XdsTls { args: args.clone(), current: RwLock::new(loaded) })))
    }

    /// `mtls` (a verified client certificate required), `mtls-optional`
    /// (verified when presented) or `tls` (no client certificates).
    pub fn mode(&self) -> &'static str {
        match (&self.args.xds_client_ca, self.args.xds_client_cert_optional) {
            (Some(_), false) => "mtls",
            (Some(_), true) => "mtls-optional",
            (None, _) => "tls",
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().unwrap_or_else(PoisonError::into_inner).config.clone())
    }

    /// Re-read the files; true if they changed and now serve. On error the
    /// last good config stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let digest = digest(&self.args)?;
        if digest == self.current.read().unwrap_or_else(PoisonError::into_inner).digest {
            return Ok(false);
        }
        let loaded = build(&self.args)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = loaded;
        Ok(true)
    }

    /// Check the files every `--xds-tls-reload-interval` until `self` is
    /// the last reference.
    pub fn spawn_reloader(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.args.xds_tls_reload_interval;
        if every.is_zero() {
            return None;
        }
        let weak = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            // Warn once per broken spell, not every interval.
            let mut failing = false;
            loop {
                tokio::time::sleep(every).await;
                let Some(tls) = weak.upgrade() else { return };
                // File reads and PEM parsing: off the async workers.
                let Ok(result) = tokio::task::spawn_blocking(move || tls.reload()).await else { return };
                match result {
                    Ok(changed) => {
                        if changed {
                            info!("xds TLS files changed: new certificate in use");
                        }
                        failing = false;
                    }
                    Err(e) => {
                        if !failing {
                            warn!(error = %e, "xds TLS files changed but do not load; keeping the last good ones");
                        }
                        failing = true;
                    }
                }
            }
        }))
    }
}

fn paths(args: &XdsTlsArgs) -> impl Iterator<Item = (&'static str, &Path)> {
    [(CERT_FLAG, &args.xds_tls_cert), (KEY_FLAG, &args.xds_tls_key), (CA_FLAG, &args.xds_client_ca)]
        .into_iter()
        .filter_map(|(flag, p)| Some((flag, p.as_deref()?)))
}

fn digest(args: &XdsTlsArgs) -> Result<u64, TlsError> {
    let mut h = std::hash::DefaultHasher::new();
    for (flag, path) in paths(args) {
        read(flag, path)?.hash(&mut h);
    }
    Ok(h.finish())
}

fn build(args: &XdsTlsArgs) -> Result<Loaded, TlsError> {
    let (Some(cert_path), Some(key_path)) = (&args.xds_tls_cert, &args.xds_tls_key) else {
        return Err(TlsError::Flags("--xds-tls-cert and --xds-tls-key go together"));
    };
    let digest = digest(args)?;
    let pem_err = |flag, path: &Path, what: String| TlsError::Pem { flag, path: path.to_owned(), what };
    let certs = CertificateDer::pem_slice_iter(&read(CERT_FLAG, cert_path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(CERT_FLAG, cert_path, format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(pem_err(CERT_FLAG, cert_path, "no CERTIFICATE block".into()));
    }
    // The key's parse error names no key bytes.
    let key = PrivateKeyDer::from_pem_slice(&read(KEY_FLAG, key_path)?)
        .map_err(|e| pem_err(KEY_FLAG, key_path, format!("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rejected { flag: CERT_FLAG, path: cert_path.clone(), message: e.to_string() })?;
    let builder = match &args.xds_client_ca {
        Some(ca_path) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&read(CA_FLAG, ca_path)?) {
                let cert = cert.map_err(|e| pem_err(CA_FLAG, ca_path, format!("bad PEM: {e}")))?;
                roots.add(cert).map_err(|e| TlsError::Rejected {
                    flag: CA_FLAG,
                    path: ca_path.clone(),
                    message: e.to_string(),
                })?;
            }
            if roots.is_empty() {
                return Err(pem_err(CA_FLAG, ca_path, "no CERTIFICATE block".into()));
            }
            let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if args.xds_client_cert_optional {
                verifier = verifier.allow_unauthenticated();
            }
            let verifier = verifier.build().map_err(|e| TlsError::Rejected {
                flag: CA_FLAG,
                path: ca_path.clone(),
                message: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| TlsError::Rejected {
        flag: KEY_FLAG,
        path: key_path.clone(),
        message: e.to_string(),
    })?;
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Loaded { config: Arc::new(config), digest })
}

/// Accept on `listener` and hand over connections whose TLS handshake
/// completed, each knowing how its peer authenticated.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<XdsTls>,
    connections: Arc<Connections>,
    limits: Arc<XdsLimits>,
) -> impl Stream<Item = io::Result<Conn>> {
    let (tx, rx) = mpsc::channel::<io::Result<Conn>>(16);
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let failures = Arc::new(LogLimit::new(Duration::from_secs(10)));
    tokio::spawn(async move {
        loop {
            let (tcp, remote) = tokio::select! {
                // The server stopped taking connections.
                _ = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        debug!(error = %e, "xds accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
            let (acceptor, tx, failures) = (tls.acceptor(), tx.clone(), failures.clone());
            let (connections, limits) = (connections.clone(), limits.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match handshake(acceptor, tcp, limits.handshake_timeout).await {
                    Ok((io, auth)) => {
                        let _ = tx.send(Ok(connections.accept(io, auth, &limits))).await;
                    }
                    Err(e) => {
                        if let Some(unlogged) = failures.check() {
                            warn!(peer = %remote, error = %e, unlogged, "xds TLS handshake failed");
                        }
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

async fn handshake(acceptor: TlsAcceptor, tcp: TcpStream, timeout: Duration) -> io::Result<(Io, PeerAuth)> {
    let remote = tcp.peer_addr().ok();
    let accept = acceptor.accept(tcp);
    let stream = if timeout.is_zero() {
        accept.await?
    } else {
        tokio::time::timeout(timeout, accept)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??
    };
    // A certificate is there only if the verifier accepted it.
    let auth = match stream.get_ref().1.peer_certificates().and_then(|c| c.first()) {
        Some(cert) => PeerAuth::Mtls { identity: cert_identity(cert) },
        None => PeerAuth::unverified(remote, true),
    };
    Ok((Io::Tls(Box::new(stream)), auth))
}
