//! Gateway servers → what the standalone Envoy serves them on.
//!
//! The Envoy listens on its own ports (`--gateway-http-port`, the HTTPS
//! port), not on the numbers a Gateway names (80, 443 under Higress), so a
//! server is placed by protocol: HTTP, HTTP2 and GRPC servers feed every
//! HTTP listener, `HTTPS` servers with `tls.mode: SIMPLE` and a known
//! credential feed the HTTPS listener. Gateway `selector`s are not read: the
//! standalone Envoy is every Gateway's workload.

use super::spec::Named;
use crate::model::TlsSecret as GatewayTls;
use crate::translate::model::{GatewaySpec, Server, ServerTlsMode};
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
    warnings: &mut Vec<Warning>,
) -> Vec<BoundServer<'a>> {
    let mut out = Vec::new();
    for gw in gateways {
        for (index, server) in gw.spec.servers.iter().enumerate() {
            match classify(gw, server, tls) {
                Ok((side, tls)) => {
                    let hosts: Vec<ServerHost> =
                        server.hosts.iter().map(|h| ServerHost::parse(h, gw.namespace)).collect();
                    let bound = BoundServer {
                        gateway: gw,
                        index,
                        side,
                        https_redirect: side == Side::Http && server.tls.as_ref().is_some_and(|t| t.https_redirect),
                        hosts,
                        tls,
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
            if mode != ServerTlsMode::Simple {
                return Err(unservable(format!(
                    "tls.mode {} is not supported by the standalone gateway (SIMPLE only)",
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
