//! `auth-tls-secret`: client certificates on an Ingress's HTTPS hosts, as
//! Higress reads it (`pkg/ingress/kube/annotations/downstreamtls.go`).
//!
//! - **The value** is `[namespace/]name` of a Secret holding the CA
//!   certificates (`cacert` or `ca.crt`), under both prefixes; without a
//!   namespace, the Ingress's. Higress reads no other `auth-tls-*` key
//!   (ingress-nginx's `-verify-client`, `-verify-depth`, `-error-page`,
//!   `-pass-certificate-to-upstream` are ignored, each with a warning).
//! - **Per host.** A client certificate is asked for in the TLS handshake,
//!   before any path is known, so it is the host's: the Ingress's TLS
//!   hosts go to an HTTPS server of their own. As in Higress, where each
//!   host has one Gateway whose TLS settings come from the first Ingress
//!   that has some, the oldest Ingress asking decides for the host, and an
//!   Ingress on the same host that does not ask is told its paths need a
//!   certificate too.
//! - **Through istiod** the server's `tls.mode` is `MUTUAL` only where
//!   stock istiod finds the CA from the server's `credentialName`: the CA
//!   Secret is the certificate's own Secret or `{name}-cacert` beside it
//!   (Higress's rule; istiod reads `{name}-cacert`, else the Secret
//!   itself). Any other CA Secret leaves istiod's server `SIMPLE`, with a
//!   `standalone_only` warning. (Istio 1.28 added `caCertCredentialName`
//!   for that, which the 1.27 Higress ships does not read, so it is not
//!   sent.)
//! - **On the standalone gateway** the server carries the CA Secret
//!   (`ServerTls::client_ca`, never sent), whatever the mode.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::ingress::secret_ref;
use crate::translate::model::{Server, ServerPort, ServerTls, ServerTlsMode};
use crate::translate::names::{sanitize, short_hash};
use crate::translate::warning::{Reason, Warning};

pub const AUTH_TLS_SECRET: &str = "auth-tls-secret";
/// Istio's name for a server certificate's CA Secret beside it.
const CA_SUFFIX: &str = "-cacert";

/// The CA Secret an Ingress's `auth-tls-secret` names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClientCa {
    /// The annotation it was found under, for warnings.
    pub key: String,
    pub namespace: String,
    pub name: String,
}

impl ClientCa {
    fn secret(&self) -> (String, String) {
        (self.namespace.clone(), self.name.clone())
    }
}

/// Read `auth-tls-secret` as found (key, value); `namespace` is the
/// Ingress's. A value that names no Secret is reported, and the Ingress
/// asks for no client certificate (as in Higress).
pub fn read(found: Option<(String, String)>, namespace: &str, warnings: &mut Vec<String>) -> Option<ClientCa> {
    let (key, value) = found?;
    if value.trim().is_empty() {
        warnings.push(format!("annotation {key} is empty; no client certificate is asked for"));
        return None;
    }
    match secret_ref(&value, namespace) {
        Ok((namespace, name)) => Some(ClientCa { key, namespace, name }),
        Err(e) => {
            warnings.push(format!("annotation {key}: {e}; no client certificate is asked for"));
            None
        }
    }
}

/// One TLS host of the gateway, as the Ingresses claim it.
#[derive(Debug)]
pub struct TlsHost {
    /// (namespace, name) of its certificate's Secret.
    pub secret: (String, String),
    /// The Ingress that claimed it first.
    pub owner: String,
    /// The CA of the oldest Ingress asking for client certificates on this
    /// host, and that Ingress.
    client_ca: Option<(ClientCa, String)>,
    /// The Ingresses serving this host over TLS without asking.
    without: BTreeSet<String>,
}

impl TlsHost {
    pub fn new(secret: (String, String), owner: String) -> TlsHost {
        TlsHost { secret, owner, client_ca: None, without: BTreeSet::new() }
    }

    /// Ingress `id` serves `host` over TLS, asking for client certificates
    /// verified against `ca` or not. A second CA is reported and ignored.
    pub fn claim(&mut self, host: &str, id: &str, ca: Option<&ClientCa>, warnings: &mut Vec<Warning>) {
        match (ca, &self.client_ca) {
            (None, _) => {
                self.without.insert(id.to_owned());
            }
            (Some(ca), None) => self.client_ca = Some((ca.clone(), id.to_owned())),
            (Some(ca), Some((theirs, owner))) if (&ca.namespace, &ca.name) != (&theirs.namespace, &theirs.name) => {
                warnings.push(Warning::new(
                    format!("Ingress {id}"),
                    Reason::IngressConflict,
                    format!(
                        "annotation {}: TLS host {host} already verifies client certificates against Secret {}/{} \
                         (Ingress {owner}); ignored on it",
                        ca.key, theirs.namespace, theirs.name
                    ),
                ));
            }
            (Some(_), Some(_)) => {}
        }
    }
}

/// An Ingress asking for client certificates with no TLS host to ask
/// them on, and a canary Ingress asking (its main Ingress's TLS applies):
/// reported.
pub fn check_unused(id: &str, ca: &ClientCa, canary: bool, has_tls: bool, warnings: &mut Vec<Warning>) {
    let why = if canary {
        "a canary Ingress makes no HTTPS server; the main Ingress's TLS settings apply"
    } else if !has_tls {
        "the Ingress has no spec.tls, so no HTTPS host to ask client certificates on"
    } else {
        return;
    };
    warnings.push(Warning::new(
        format!("Ingress {id}"),
        Reason::InvalidIngress,
        format!("annotation {}: {why}", ca.key),
    ));
}

/// The Gateway's HTTPS servers on `port`: one per certificate Secret and
/// client CA, the hosts it serves; and the warnings the hosts' claims
/// call for. `known_ca` holds the Secrets with CA certificates.
pub fn https_servers(
    hosts: BTreeMap<String, TlsHost>,
    port: u32,
    gateway_ns: &str,
    known_ca: &BTreeSet<(String, String)>,
    warnings: &mut Vec<Warning>,
) -> Vec<Server> {
    /// (certificate Secret, CA Secret) → (hosts, (Ingress, CA) asking).
    type SecretRef = (String, String);
    type Group = (BTreeSet<String>, BTreeSet<(String, ClientCa)>);
    let mut groups: BTreeMap<(SecretRef, Option<SecretRef>), Group> = BTreeMap::new();
    for (host, h) in hosts {
        if let Some((ca, owner)) = &h.client_ca {
            for other in &h.without {
                warnings.push(Warning::new(
                    format!("Ingress {other}"),
                    Reason::IngressConflict,
                    format!(
                        "TLS host {host}: Ingress {owner} requires client certificates on it ({}); they are asked \
                         for in the TLS handshake, before any path is known, so this Ingress's paths on {host} need \
                         one too",
                        ca.key
                    ),
                ));
            }
        }
        let group = groups.entry((h.secret.clone(), h.client_ca.as_ref().map(|(ca, _)| ca.secret()))).or_default();
        group.0.insert(host);
        group.1.extend(h.client_ca.map(|(ca, owner)| (owner, ca)));
    }

    let mut servers = Vec::new();
    let mut taken = BTreeSet::new();
    for (((secret_ns, secret), ca), (hosts, askers)) in groups {
        let mut name = format!("https-{port}-ingress-{}", sanitize(&format!("{secret_ns}-{secret}")));
        let mut mode = ServerTlsMode::Simple;
        if let Some((ca_ns, ca_name)) = &ca {
            name.push_str("-mtls");
            let listed = hosts.iter().map(String::as_str).collect::<Vec<_>>().join(", ");
            // Higress's rule: istiod finds the CA from `credentialName`.
            let istiod_reads =
                *ca_ns == secret_ns && (*ca_name == secret || *ca_name == format!("{secret}{CA_SUFFIX}"));
            if istiod_reads {
                mode = ServerTlsMode::Mutual;
            }
            for (owner, asked) in &askers {
                let object = format!("Ingress {owner}");
                if !istiod_reads {
                    warnings.push(Warning::new(
                        object.clone(),
                        Reason::StandaloneOnly,
                        format!(
                            "annotation {}: CA Secret {ca_ns}/{ca_name} is neither the certificate's Secret \
                             {secret_ns}/{secret} nor {secret_ns}/{secret}{CA_SUFFIX}, where stock istiod looks for \
                             the CA of a Gateway server's credentialName; through istiod {listed} asks for no client \
                             certificate, on the standalone gateway it does",
                            asked.key
                        ),
                    ));
                }
                if !known_ca.contains(&(ca_ns.clone(), ca_name.clone())) {
                    warnings.push(Warning::new(
                        object,
                        Reason::MissingSecret,
                        format!(
                            "annotation {}: no Secret {ca_ns}/{ca_name} with CA certificates (ca.crt or cacert); \
                             client certificates cannot be verified, so HTTPS to {listed} fails",
                            asked.key
                        ),
                    ));
                }
            }
        }
        if !taken.insert(name.clone()) {
            // Without a CA, the key names had before client CAs existed.
            let key = match &ca {
                None => format!("{secret_ns}/{secret}"),
                Some((n, s)) => format!("{secret_ns}/{secret} {n}/{s}"),
            };
            name = format!("{name}-{}", short_hash(&key));
            taken.insert(name.clone());
        }
        let credential_name =
            if secret_ns == gateway_ns { secret } else { format!("kubernetes-gateway://{secret_ns}/{secret}") };
        servers.push(Server {
            port: ServerPort { number: port, protocol: "HTTPS".into(), name },
            hosts: hosts.into_iter().collect(),
            tls: Some(ServerTls { https_redirect: false, mode: Some(mode), credential_name, client_ca: ca }),
        });
    }
    servers
}
