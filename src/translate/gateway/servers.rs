//! Gateway servers → what the standalone Envoy serves them on.
//!
//! The Envoy listens on its own ports (`--gateway-http-port`, the HTTPS
//! port), not on the numbers a Gateway names (80, 443 under Higress), so a
//! server is placed by protocol: HTTP, HTTP2 and GRPC servers feed every
//! HTTP listener, `HTTPS` servers with `tls.mode: SIMPLE` or `MUTUAL` and a
//! known credential feed the HTTPS listener. Gateway `selector`s are not
//! read: the standalone Envoy is every Gateway's workload.
//!
//! A server asks for client certificates when its `tls.mode` is `MUTUAL` or
//! it names a client CA (`ServerTls::client_ca`, an Ingress's
//! `auth-tls-secret`): verified against that Secret's CA certificates, or,
//! for `MUTUAL` alone, where istiod looks for them (the Secret
//! `{credentialName}-cacert`, else the credential's own).

use super::spec::Named;
use crate::model::{CaSecret, TlsSecret as GatewayTls};
use crate::translate::model::{GatewaySpec, Server, ServerTls, ServerTlsMode};
use crate::translate::warning::{Reason, Warning};

/// The listener kind a server feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Http,
    Https,
}

/// A Gateway server the standalone Envoy serves.
#[derive(Debug)]
pub struct BoundServer<'a> {
    pub gateway: &'a Named<'a, GatewaySpec>,
    /// Index in the Gateway's `servers`, for names and warnings.
    pub index: usize,
    pub side: Side,
    /// `tls.httpsRedirect` on an HTTP server.
    pub https_redirect: bool,
    pub hosts: Vec<ServerHost>,
    /// The certificate, for an HTTPS server.
    pub tls: Option<&'a GatewayTls>,
    /// Whether clients must present a certificate, and what verifies it.
    pub client_certs: ClientCerts<'a>,
}

/// What an HTTPS server asks of its clients' certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCerts<'a> {
    /// Nothing: no certificate asked for.
    NotAsked,
    /// A certificate these CA certificates verify is required.
    Verified(&'a CaSecret),
    /// Required, but there is no CA to verify one with: the server is not
    /// served, and its hosts are in no other server's routes.
    NoCa,
}

impl ClientCerts<'_> {
    pub fn asked(self) -> bool {
        self != ClientCerts::NotAsked
    }
}

impl BoundServer<'_> {
    /// `ns/name servers[i]`, for names and warnings.
    pub fn label(&self) -> String {
        format!("{} servers[{}]", self.gateway.key(), self.index)
    }
}

/// One entry of a server's `hosts`: `[namespace/]dnsName`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerHost {
    pub visible_to: Visibility,
    /// Lowercase; `*` or `*.suffix` wildcards as given.
    pub host: String,
}

/// Which VirtualServices a server host admits, from its namespace prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    /// No prefix, or `*/`.
    Any,
    /// `ns/`, or `./` (the Gateway's own namespace).
    Namespace(String),
    /// `~/`: no VirtualService.
    Nothing,
}

impl ServerHost {
    fn parse(raw: &str, gateway_namespace: &str) -> ServerHost {
        let (visible_to, host) = match raw.split_once('/') {
            None => (Visibility::Any, raw),
            Some(("*", h)) => (Visibility::Any, h),
            Some((".", h)) => (Visibility::Namespace(gateway_namespace.to_string()), h),
            Some(("~", h)) => (Visibility::Nothing, h),
            Some((ns, h)) => (Visibility::Namespace(ns.to_string()), h),
        };
        ServerHost { visible_to, host: host.to_ascii_lowercase() }
    }

    /// Whether a VirtualService in `namespace` may bind to this host.
    pub fn admits(&self, namespace: &str) -> bool {
        match &self.visible_to {
            Visibility::Any => true,
            Visibility::Namespace(ns) => ns == namespace,
            Visibility::Nothing => false,
        }
    }
}

/// Classify every server of every Gateway; a server that cannot be served
/// is reported and left out.
pub fn servers<'a>(
    gateways: &'a [Named<'a, GatewaySpec>],
    tls: &'a [GatewayTls],
    ca: &'a [CaSecret],
    warnings: &mut Vec<Warning>,
) -> Vec<BoundServer<'a>> {
    let mut out = Vec::new();
    for gw in gateways {
        for (index, server) in gw.spec.servers.iter().enumerate() {
            match classify(gw, server, tls) {
                Ok((side, tls)) => {
                    let client_certs = match (tls, &server.tls) {
                        (Some(cert), Some(t)) => client_certs(cert, t, ca),
                        _ => ClientCerts::NotAsked,
                    };
                    if client_certs == ClientCerts::NoCa {
                        warnings.push(Warning::new(
                            format!("Gateway {} servers[{index}]", gw.key()),
                            Reason::MissingSecret,
                            format!(
                                "client certificates are required and no Secret with CA certificates (ca.crt or \
                                 cacert) is there to verify them ({}); left out",
                                ca_wanted(tls, server.tls.as_ref())
                            ),
                        ));
                    }
                    let hosts: Vec<ServerHost> =
                        server.hosts.iter().map(|h| ServerHost::parse(h, gw.namespace)).collect();
                    let bound = BoundServer {
                        gateway: gw,
                        index,
                        side,
                        https_redirect: side == Side::Http && server.tls.as_ref().is_some_and(|t| t.https_redirect),
                        hosts,
                        tls,
                        client_certs,
                    };
                    if bound.hosts.is_empty() {
                        warnings.push(Warning::new(
                            format!("Gateway {}", bound.label()),
                            Reason::Unservable,
                            "no hosts; left out",
                        ));
                        continue;
                    }
                    out.push(bound);
                }
                Err((reason, why)) => warnings.push(Warning::new(
                    format!("Gateway {} servers[{index}]", gw.key()),
                    reason,
                    format!("{why}; left out"),
                )),
            }
        }
    }
    out
}

fn classify<'a>(
    gw: &Named<'_, GatewaySpec>,
    server: &Server,
    tls: &'a [GatewayTls],
) -> Result<(Side, Option<&'a GatewayTls>), (Reason, String)> {
    let unservable = |why: String| (Reason::Unservable, why);
    match server.port.protocol.to_ascii_uppercase().as_str() {
        "HTTP" | "HTTP2" | "GRPC" => Ok((Side::Http, None)),
        "HTTPS" => {
            let Some(t) = &server.tls else { return Err(unservable("HTTPS without tls".into())) };
            let mode = t.mode.unwrap_or(ServerTlsMode::Passthrough);
            if !matches!(mode, ServerTlsMode::Simple | ServerTlsMode::Mutual) {
                return Err(unservable(format!(
                    "tls.mode {} is not supported by the standalone gateway (SIMPLE and MUTUAL only)",
                    mode.as_str()
                )));
            }
            if t.credential_name.is_empty() {
                return Err(unservable("tls.credentialName is empty (certificate files are not supported)".into()));
            }
            let secret =
                find_tls(&t.credential_name, gw.namespace, tls).map_err(|e| (Reason::MissingSecret, e.to_string()))?;
            if !is_pem(&secret.cert_chain_pem) || !is_pem(secret.private_key_pem.expose()) {
                return Err((
                    Reason::MissingSecret,
                    format!(
                        "secret {}/{} (credentialName {:?}): tls.crt or tls.key is not PEM",
                        secret.namespace, secret.name, t.credential_name
                    ),
                ));
            }
            Ok((Side::Https, Some(secret)))
        }
        other => Err(unservable(format!("protocol {other:?} is not supported by the standalone gateway"))),
    }
}

/// The client certificates an HTTPS server with certificate `cert` asks
/// for: verified against its `client_ca`, or for `MUTUAL` alone against
/// `{credential}-cacert` beside the certificate, else the certificate's
/// own Secret, as istiod looks (its `GetCaCert`).
fn client_certs<'a>(cert: &GatewayTls, t: &ServerTls, ca: &'a [CaSecret]) -> ClientCerts<'a> {
    let find = |ns: &str, name: &str| ca.iter().find(|c| c.namespace == ns && c.name == name && is_pem(&c.ca_cert_pem));
    let found = match &t.client_ca {
        Some((ns, name)) => find(ns, name),
        None if t.mode == Some(ServerTlsMode::Mutual) => {
            find(&cert.namespace, &format!("{}-cacert", cert.name)).or_else(|| find(&cert.namespace, &cert.name))
        }
        None => return ClientCerts::NotAsked,
    };
    found.map_or(ClientCerts::NoCa, ClientCerts::Verified)
}

/// Which Secrets a server's client CA was looked for in, for a warning.
fn ca_wanted(cert: Option<&GatewayTls>, t: Option<&ServerTls>) -> String {
    match (t.and_then(|t| t.client_ca.as_ref()), cert) {
        (Some((ns, name)), _) => format!("Secret {ns}/{name}"),
        (None, Some(c)) => format!("Secret {0}/{1}-cacert or {0}/{1}", c.namespace, c.name),
        (None, None) => String::new(),
    }
}

/// A cheap check that spares Envoy a NACK of the whole listener; it never
/// looks past the armour line, so nothing of the key can end up in a warning.
pub fn is_pem(s: &str) -> bool {
    s.contains("-----BEGIN ")
}

/// Why a Gateway server's `tls.credentialName` names no usable Secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// No `kubernetes.io/tls` Secret has that name (in that namespace).
    #[error("credentialName {credential:?}: no such kubernetes.io/tls secret")]
    NotFound { credential: String },
    /// Not in the Gateway's namespace, and several other namespaces have it.
    #[error("credentialName {credential:?}: not in namespace {namespace:?} and ambiguous elsewhere")]
    Ambiguous { credential: String, namespace: String },
}

/// Resolve a `credentialName`: `namespace/name`, or `name` in the Gateway's
/// namespace, else the only Secret of that name anywhere. Higress's
/// `kubernetes-ingress://{cluster}/{namespace}/{name}` and Istio's
/// `kubernetes-gateway://{namespace}/{name}` forms name the same Secret.
pub fn find_tls<'a>(
    credential: &str,
    gateway_namespace: &str,
    tls: &'a [GatewayTls],
) -> Result<&'a GatewayTls, CredentialError> {
    let not_found = || CredentialError::NotFound { credential: credential.to_string() };
    let reference = if let Some(rest) = credential.strip_prefix("kubernetes-ingress://") {
        // {cluster}/{namespace}/{name}
        rest.split_once('/').map(|(_, ns_name)| ns_name).ok_or_else(not_found)?
    } else if let Some(rest) = credential.strip_prefix("kubernetes-gateway://") {
        rest
    } else {
        credential
    };
    if let Some((ns, name)) = reference.split_once('/') {
        return tls.iter().find(|t| t.namespace == ns && t.name == name).ok_or_else(not_found);
    }
    if let Some(t) = tls.iter().find(|t| t.namespace == gateway_namespace && t.name == reference) {
        return Ok(t);
    }
    let mut anywhere = tls.iter().filter(|t| t.name == reference);
    match (anywhere.next(), anywhere.next()) {
        (Some(t), None) => Ok(t),
        (None, _) => Err(not_found()),
        (Some(_), Some(_)) => Err(CredentialError::Ambiguous {
            credential: credential.to_string(),
            namespace: gateway_namespace.to_string(),
        }),
    }
}

/// Whether `pattern` (a host, `*`, or `*.suffix`) covers `host`.
fn covers(pattern: &str, host: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_prefix('*') {
        Some(suffix) => host.ends_with(suffix) && host.len() > suffix.len(),
        None => pattern == host,
    }
}

/// The host served when a VirtualService host meets a server host: the more
/// specific of the two if one covers the other (Istio's rule), else none.
pub fn intersect(server_host: &str, vs_host: &str) -> Option<String> {
    if covers(server_host, vs_host) {
        Some(vs_host.to_string())
    } else if covers(vs_host, server_host) {
        Some(server_host.to_string())
    } else {
        None
    }
}
