//! A throwaway PKI for TLS tests, made at test time by the openssl CLI
//! (Debian package `openssl`) in a temp dir that is removed on drop: a CA,
//! and leaf certificates it signs for servers and clients.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::codegen::http::Uri;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A CA in a temp dir.
#[derive(Debug)]
pub struct TestPki {
    pub dir: PathBuf,
    pub ca: Issued,
}

fn openssl(args: &[&str], dir: &Path) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("run the openssl CLI (Debian package openssl) to make test certificates")?;
    anyhow::ensure!(out.status.success(), "openssl {}: {}", args[0], String::from_utf8_lossy(&out.stderr));
    Ok(())
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl TestPki {
    /// A new CA named `name`, valid for two days.
    pub fn new(name: &str) -> anyhow::Result<TestPki> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("meshbridge-pki-{}-{seq}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let subj = format!("/CN={name}");
        let mut args = vec!["req", "-x509", "-nodes", "-days", "2", "-subj", &subj];
        args.extend(EC);
        args.extend([
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ]);
        openssl(&args, &dir)?;
        let ca = Issued { cert: dir.join("ca.crt"), key: dir.join("ca.key") };
        Ok(TestPki { dir, ca })
    }

    /// A leaf certificate `file.crt`/`file.key` for these subject
    /// alternative names (`DNS:x`, `IP:1.2.3.4`, `URI:spiffe://…`), good
    /// for both server and client use.
    pub fn issue(&self, file: &str, sans: &[String]) -> anyhow::Result<Issued> {
        let (key, csr, crt, ext) =
            (format!("{file}.key"), format!("{file}.csr"), format!("{file}.crt"), format!("{file}.ext"));
        let subj = format!("/CN={file}");
        let mut args = vec!["req", "-new", "-nodes", "-subj", &subj, "-keyout", &key, "-out", &csr];
        args.extend(EC);
        openssl(&args, &self.dir)?;
        let ext_text = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={}\n",
            sans.join(",")
        );
        std::fs::write(self.dir.join(&ext), ext_text)?;
        let ca_cert = self.ca.cert.to_string_lossy().into_owned();
        let ca_key = self.ca.key.to_string_lossy().into_owned();
        openssl(
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_cert,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &crt,
                "-extfile",
                &ext,
            ],
            &self.dir,
        )?;
        Ok(Issued { cert: self.dir.join(crt), key: self.dir.join(key) })
    }

    /// A server certificate for `dns` names and `ips`.
    pub fn server(&self, file: &str, dns: &[&str], ips: &[IpAddr]) -> anyhow::Result<Issued> {
        let sans: Vec<String> =
            dns.iter().map(|d| format!("DNS:{d}")).chain(ips.iter().map(|ip| format!("IP:{ip}"))).collect();
        self.issue(file, &sans)
    }

    /// A rustls client config trusting this CA, presenting `client` if given.
    pub fn client_config(&self, client: Option<&Issued>) -> anyhow::Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.ca.cert)? {
            roots.add(cert?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let mut config = match client {
            Some(c) => {
                let certs = CertificateDer::pem_file_iter(&c.cert)?.collect::<Result<Vec<_>, _>>()?;
                builder.with_client_auth_cert(certs, PrivateKeyDer::from_pem_file(&c.key)?)?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How a test client opens its TCP connections: from here by default
/// ([`dial_to`]), or from elsewhere, such as inside a network namespace
/// (the e2e crate's `Netns::dial`). Called on the blocking pool.
pub type Dial = Arc<dyn Fn() -> std::io::Result<std::net::TcpStream> + Send + Sync>;

/// Connections to `addr` from this process's network namespace.
pub fn dial_to(addr: SocketAddr) -> Dial {
    Arc::new(move || std::net::TcpStream::connect(addr))
}

/// A TCP connection opened by `dial`, for tokio.
pub async fn dialed(dial: &Dial) -> std::io::Result<tokio::net::TcpStream> {
    let dial = dial.clone();
    let tcp = tokio::task::spawn_blocking(move || dial()).await.map_err(std::io::Error::other)??;
    tcp.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(tcp)
}

/// A tonic connector that opens its connections with `dial`, over TLS
/// with `config` when it is set, checking the server certificate against
/// `server_name`.
#[derive(Clone)]
pub struct Connector {
    pub dial: Dial,
    pub tls: Option<(ServerName<'static>, Arc<rustls::ClientConfig>)>,
}

type Io = hyper_util::rt::TokioIo<Pin<Box<dyn Stream>>>;

/// A connection, plain or TLS.
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send> Stream for T {}

impl tonic::codegen::Service<Uri> for Connector {
    type Response = Io;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Io, std::io::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = dialed(&this.dial).await?;
            let stream: Pin<Box<dyn Stream>> = match this.tls {
                None => Box::pin(tcp),
                Some((name, config)) => Box::pin(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?),
            };
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

/// A gRPC channel to `addr` over TLS.
pub async fn tls_channel(
    addr: SocketAddr,
    server_name: &str,
    config: rustls::ClientConfig,
) -> anyhow::Result<tonic::transport::Channel> {
    tls_channel_dialed(dial_to(addr), server_name, config).await
}

/// A gRPC channel over TLS on connections opened by `dial`.
pub async fn tls_channel_dialed(
    dial: Dial,
    server_name: &str,
    config: rustls::ClientConfig,
) -> anyhow::Result<tonic::transport::Channel> {
    let tls = Some((ServerName::try_from(server_name.to_string())?, Arc::new(config)));
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{server_name}"))?;
    Ok(endpoint.connect_with_connector(Connector { dial, tls }).await?)
}

/// A plaintext gRPC channel on connections opened by `dial`.
pub async fn channel_dialed(dial: Dial) -> anyhow::Result<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_static("http://xds.test");
    Ok(endpoint.connect_with_connector(Connector { dial, tls: None }).await?)
}

/// An Ingress for `host` (all paths to `destination`, a Higress
/// `higress.io/destination`) with TLS from a `kubernetes.io/tls` Secret
/// `shop/shop-cert` holding `cert`: what makes the standalone gateway's
/// HTTPS listener and its SDS Secret `shop/shop-cert`.
pub fn tls_ingress_yaml(host: &str, destination: &str, cert: &Issued) -> anyhow::Result<String> {
    let indent = |p: &Path| -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(p)?.lines().map(|l| format!("    {l}\n")).collect())
    };
    Ok(format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  namespace: shop
  creationTimestamp: "2026-01-01T00:00:00Z"
  annotations:
    higress.io/destination: {destination}
spec:
  ingressClassName: higress
  tls:
    - hosts: [{host}]
      secretName: shop-cert
  rules:
    - host: {host}
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              resource: {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }}
---
apiVersion: v1
kind: Secret
metadata: {{ name: shop-cert, namespace: shop }}
type: kubernetes.io/tls
stringData:
  tls.crt: |
{crt}  tls.key: |
{key}"#,
        crt = indent(&cert.cert)?,
        key = indent(&cert.key)?,
    ))
}

/// The SDS name of the Secret [`tls_ingress_yaml`] writes.
pub const TLS_INGRESS_SECRET: &str = "shop/shop-cert";
