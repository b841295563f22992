//! TLS to registries (Consul, Nacos, Eureka): one rustls client config per
//! watcher, built from the spec's [`RegistryTls`].
//!
//! Trust: with a CA bundle (`registryTls.caKey`, a key of the
//! `authSecretName` Secret), that bundle only, so a private registry is
//! pinned to its own CA; without one, the Mozilla roots (webpki-roots, as
//! reqwest's own default) plus the host's (rustls-native-certs, read once).
//! Verification is never turned off.
//!
//! Failures are told apart from plain connection failures by
//! [`tls_failure`], the one place that looks inside an error chain for a
//! rustls error.

use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, OnceLock};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The most certificates a CA bundle may hold: a bundle is a handful;
/// thousands means the wrong key.
pub const MAX_CA_CERTS: usize = 1000;

/// How a watcher talks TLS to its registry. Present only when the registry
/// entry opts in (`registryTls.enabled: true`); absent is plain HTTP, as in
/// Higress.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct RegistryTls {
    /// PEM CA bundle to trust instead of the default roots.
    pub ca_pem: Option<String>,
    /// The name to verify the registry's certificate against (and send as
    /// SNI) instead of the host in `domain`.
    pub server_name: Option<String>,
}

impl fmt::Debug for RegistryTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A bundle can be large: show its size, not its text.
        f.debug_struct("RegistryTls")
            .field("ca_pem_bytes", &self.ca_pem.as_ref().map(String::len))
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// What is wrong with a registry's TLS settings (the text of a config
/// error on `registryTls`).
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("not a PEM certificate bundle: {0}")]
    NotPem(rustls::pki_types::pem::Error),
    #[error("more than {MAX_CA_CERTS} certificates")]
    TooManyCerts,
    #[error("no PEM certificate (-----BEGIN CERTIFICATE-----) found")]
    NoCert,
    #[error("{0} certificate(s) cannot be used as a trust anchor")]
    NotAnchors(usize),
    /// The name, or `None` when the caller names the field itself.
    #[error("{}not a DNS name or IP address", .0.as_ref().map(|n| format!("{n:?} is ")).unwrap_or_default())]
    ServerName(Option<String>),
    #[error("TLS setup: {0}")]
    Setup(String),
}

/// The certificates of a PEM CA bundle; an error (for a config message)
/// when it holds none, too many, or a block that does not parse.
pub fn parse_ca_bundle(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(TlsConfigError::NotPem)?;
        if certs.len() == MAX_CA_CERTS {
            return Err(TlsConfigError::TooManyCerts);
        }
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(TlsConfigError::NoCert);
    }
    let mut store = RootCertStore::empty();
    let (_, bad) = store.add_parsable_certificates(certs.clone());
    if bad > 0 {
        return Err(TlsConfigError::NotAnchors(bad));
    }
    Ok(certs)
}

/// A `serverName` that can be verified: a DNS name or an IP address.
pub fn check_server_name(name: &str) -> Result<(), TlsConfigError> {
    let plain = name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    match ServerName::try_from(name.to_string()) {
        Ok(_) if plain => Ok(()),
        _ => Err(TlsConfigError::ServerName(None)),
    }
}

/// The rustls client config for `tls`, with ring (the one crypto provider
/// in the tree), offering the ALPN protocols `alpn` (none: no ALPN).
pub(crate) fn client_config(tls: &RegistryTls, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsConfigError> {
    let roots = match &tls.ca_pem {
        Some(pem) => {
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(parse_ca_bundle(pem)?);
            store
        }
        None => default_roots().clone(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsConfigError::Setup(e.to_string()))?;
    let mut config = match &tls.server_name {
        None => builder.with_root_certificates(roots).with_no_client_auth(),
        Some(name) => {
            let name =
                ServerName::try_from(name.clone()).map_err(|_| TlsConfigError::ServerName(Some(name.clone())))?;
            let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsConfigError::Setup(e.to_string()))?;
            let verifier = Arc::new(NamedVerifier { inner, name });
            builder.dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth()
        }
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A reqwest builder for `registry`: with `tls`, its roots and
/// `serverName` (see [`client_config`]), and https only; plain otherwise.
pub(crate) fn http_client(
    registry: &str,
    tls: Option<&RegistryTls>,
) -> Result<reqwest::ClientBuilder, crate::RegistryError> {
    let builder = reqwest::Client::builder();
    let Some(tls) = tls else { return Ok(builder) };
    let config = |reason: TlsConfigError| crate::RegistryError::Config {
        registry: registry.to_string(),
        field: "registryTls".into(),
        reason: reason.to_string(),
    };
    let client = client_config(tls, &[b"h2", b"http/1.1"]).map_err(config)?;
    Ok(builder.use_preconfigured_tls((*client).clone()).https_only(true))
}

/// Full WebPKI verification against the configured `serverName` instead of
/// the name the connection was opened with: the host in `domain` may be an
/// IP or an alias that the certificate does not list. Nothing is skipped.
#[derive(Debug)]
struct NamedVerifier {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for NamedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner.verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The name to verify for `host` (a `domain` host, IPv6 with or without
/// brackets), unless `tls.server_name` overrides it.
pub(crate) fn server_name(tls: &RegistryTls, host: &str) -> Result<ServerName<'static>, TlsConfigError> {
    let name = tls.server_name.as_deref().unwrap_or(host);
    let name = name.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(name.to_string()).map_err(|_| TlsConfigError::ServerName(Some(name.to_string())))
}

/// Mozilla's roots and the host's, loaded once per process.
fn default_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut store = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
        let native = rustls_native_certs::load_native_certs();
        let (added, _) = store.add_parsable_certificates(native.certs);
        tracing::debug!(added, errors = native.errors.len(), "host CA certificates loaded for registry TLS");
        store
    })
}

/// If `e` or a cause of it is a TLS failure, a message that says so:
/// "TLS handshake failed: certificate verification failed: …" for a
/// certificate the trust roots do not vouch for, else "TLS handshake
/// failed: …". `None` for any other error.
pub fn tls_failure(e: &(dyn StdError + 'static)) -> Option<String> {
    // hyper-rustls wraps tokio-rustls's io::Error in another one: `find`
    // looks inside both.
    crate::error_chain::find::<rustls::Error>(e).map(describe)
}

pub(crate) fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(_) => {
            format!("TLS handshake failed: certificate verification failed: {e}")
        }
        _ => format!("TLS handshake failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_must_hold_certificates() {
        assert!(parse_ca_bundle("").unwrap_err().to_string().contains("no PEM certificate"));
        assert!(parse_ca_bundle("hello").is_err());
        let junk = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(parse_ca_bundle(junk).is_err(), "not a certificate");
    }

    #[test]
    fn server_names() {
        let tls = RegistryTls::default();
        assert!(server_name(&tls, "consul.example").is_ok());
        assert!(server_name(&tls, "[::1]").is_ok());
        assert!(server_name(&tls, "10.0.0.1").is_ok());
        assert!(server_name(&tls, "bad name").is_err());
        let tls = RegistryTls { server_name: Some("consul.internal".into()), ..Default::default() };
        assert_eq!(server_name(&tls, "10.0.0.1").unwrap().to_str(), "consul.internal");
        assert!(check_server_name("a b").is_err());
    }

    #[test]
    fn default_config_builds() {
        assert!(client_config(&RegistryTls::default(), &[b"h2"]).is_ok());
    }

    #[test]
    fn tls_errors_are_found_in_chains() {
        let bad = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, bad);
        let msg = tls_failure(&io).unwrap();
        assert!(msg.starts_with("TLS handshake failed: certificate verification failed"), "{msg}");
        // As hyper-rustls reports it: an io::Error around tokio-rustls's.
        let bad = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let twice = std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, bad));
        assert!(tls_failure(&twice).is_some_and(|m| m.contains("certificate verification failed")));
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(tls_failure(&plain), None);
    }
}
