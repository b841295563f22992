//! The certificates the registry TLS tests use, from the shared test PKI
//! ([`meshbridge::testing::pki`], the openssl CLI): a CA, a server
//! certificate it signs for `localhost` and `127.0.0.1`, and a second,
//! unrelated CA (the "wrong CA"). Valid for two days, in temp dirs removed
//! with the value.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use meshbridge::testing::pki;

pub struct TestPki {
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
    /// PEM of another CA, which signed nothing here.
    pub wrong_ca_pem: String,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    _ca: pki::TestPki,
    _wrong_ca: pki::TestPki,
}

impl TestPki {
    pub fn new() -> anyhow::Result<TestPki> {
        let ca = pki::TestPki::new("meshbridge test ca")?;
        let wrong_ca = pki::TestPki::new("meshbridge test wrong-ca")?;
        let server = ca.server("server", &["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
        Ok(TestPki {
            ca_pem: std::fs::read_to_string(&ca.ca.cert)?,
            wrong_ca_pem: std::fs::read_to_string(&wrong_ca.ca.cert)?,
            ca_file: ca.ca.cert.clone(),
            cert_file: server.cert,
            key_file: server.key,
            _ca: ca,
            _wrong_ca: wrong_ca,
        })
    }

    /// A rustls server config with the server certificate, offering `alpn`.
    pub fn server_config(&self, alpn: &[&[u8]]) -> anyhow::Result<std::sync::Arc<rustls::ServerConfig>> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(&self.cert_file)?.collect::<Result<Vec<_>, _>>()?;
        let key = PrivateKeyDer::from_pem_file(&self.key_file)?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(certs, key)?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(std::sync::Arc::new(config))
    }
}
