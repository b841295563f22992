//! Test certificates made at test time with the openssl CLI (Debian package
//! `openssl`): a CA, a server certificate it signs for `localhost` and
//! `127.0.0.1`, and a second, unrelated CA (the "wrong CA"). Valid for two
//! days, in a temp dir removed with the value.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use tempfile::TempDir;

pub struct TestPki {
    /// PEM of the CA that signed the server certificate.
    pub ca_pem: String,
    /// PEM of another CA, which signed nothing here.
    pub wrong_ca_pem: String,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    _dir: TempDir,
}

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("run the openssl CLI (Debian package openssl) to make test certificates")?;
    anyhow::ensure!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    Ok(())
}

fn new_ca(dir: &Path, name: &str) -> anyhow::Result<()> {
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    let subject = format!("/CN=meshbridge test {name}");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &subject,
            "-keyout",
            &key,
            "-out",
            &crt,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    )
}

impl TestPki {
    pub fn new() -> anyhow::Result<TestPki> {
        let dir = tempfile::Builder::new().prefix("meshbridge-pki-").tempdir()?;
        let d = dir.path();
        new_ca(d, "ca")?;
        new_ca(d, "wrong-ca")?;
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
            ],
        )?;
        std::fs::write(
            d.join("server.ext"),
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
             subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )?;
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.crt",
            ],
        )?;
        Ok(TestPki {
            ca_pem: std::fs::read_to_string(d.join("ca.crt"))?,
            wrong_ca_pem: std::fs::read_to_string(d.join("wrong-ca.crt"))?,
            ca_file: d.join("ca.crt"),
            cert_file: d.join("server.crt"),
            key_file: d.join("server.key"),
            _dir: dir,
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
