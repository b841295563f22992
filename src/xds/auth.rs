//! Who is at the other end of a stream, and what that lets it have.
//!
//! The trust rule (ARCHITECTURE.md, "Trust model"): an SDS Secret carries
//! a private key, so it goes only to a stream whose peer is authenticated,
//! that is one that presented a client certificate the `--xds-client-ca`
//! verified, or one that connects from a loopback address (a sidecar Envoy
//! in the same pod or host, which could read meshbridge's memory anyway).
//! Every other client still gets listeners, routes and clusters: they
//! name their certificates, and carry no key. Its Secret requests are
//! answered with no Secret, one WARN is logged for the stream, and
//! `/debug/xdsz` shows the refusal on the client
//! ([`ClientHandle::visible`](super::ClientHandle::visible)).

use std::net::{IpAddr, SocketAddr};

/// How a client's connection was authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAuth {
    /// From a loopback address, whatever the transport.
    Loopback,
    /// TLS with a client certificate the `--xds-client-ca` verified;
    /// `identity` is its first URI SAN (a SPIFFE id), else its first DNS SAN.
    Mtls { identity: Option<String> },
    /// TLS without a client certificate (no `--xds-client-ca`).
    Tls,
    /// Plain TCP from elsewhere.
    Plaintext,
}

impl PeerAuth {
    /// A plaintext (or server-only TLS) connection from `remote`.
    pub fn unverified(remote: Option<SocketAddr>, tls: bool) -> PeerAuth {
        match remote {
            Some(addr) if is_loopback(addr.ip()) => PeerAuth::Loopback,
            _ if tls => PeerAuth::Tls,
            _ => PeerAuth::Plaintext,
        }
    }

    /// May this client have private keys?
    pub fn trusted(&self) -> bool {
        matches!(self, PeerAuth::Loopback | PeerAuth::Mtls { .. })
    }

    /// What `/debug/xdsz` shows: `loopback`, `mtls`, `tls` or `plaintext`.
    pub fn label(&self) -> &'static str {
        match self {
            PeerAuth::Loopback => "loopback",
            PeerAuth::Mtls { .. } => "mtls",
            PeerAuth::Tls => "tls",
            PeerAuth::Plaintext => "plaintext",
        }
    }

    pub fn identity(&self) -> Option<&str> {
        match self {
            PeerAuth::Mtls { identity } => identity.as_deref(),
            _ => None,
        }
    }
}

/// 127.0.0.0/8, ::1, and IPv4-mapped loopback (`::ffff:127.0.0.1`, as a
/// dual-stack listener sees an IPv4 client).
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// The client identity a verified certificate names, capped in length.
pub fn cert_identity(cert: &rustls::pki_types::CertificateDer<'_>) -> Option<String> {
    let cert = webpki::EndEntityCert::try_from(cert).ok()?;
    let name = cert.valid_uri_names().next().or_else(|| cert.valid_dns_names().next())?;
    // Names are ASCII (webpki checked them); a cap keeps `/debug/xdsz` small.
    Some(name.chars().take(256).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_trusted_and_nothing_else_without_a_certificate() {
        let at = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        assert_eq!(PeerAuth::unverified(at("127.0.0.1:1"), false), PeerAuth::Loopback);
        assert_eq!(PeerAuth::unverified(at("127.9.9.9:1"), true), PeerAuth::Loopback);
        assert_eq!(PeerAuth::unverified(at("[::1]:1"), false), PeerAuth::Loopback);
        assert_eq!(PeerAuth::unverified(at("[::ffff:127.0.0.1]:1"), false), PeerAuth::Loopback);
        assert_eq!(PeerAuth::unverified(at("[::ffff:10.0.0.1]:1"), false), PeerAuth::Plaintext);
        assert_eq!(PeerAuth::unverified(at("10.1.2.3:1"), true), PeerAuth::Tls);
        assert_eq!(PeerAuth::unverified(None, false), PeerAuth::Plaintext);
        assert!(PeerAuth::Loopback.trusted() && PeerAuth::Mtls { identity: None }.trusted());
        assert!(!PeerAuth::Tls.trusted() && !PeerAuth::Plaintext.trusted());
    }
}
