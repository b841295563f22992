//! What translation reads besides the registries' services.

use std::collections::BTreeMap;

use meshbridge_registries::Migration;

use super::gateway::GatewayOptions;
use super::ingress::IngressOptions;
use crate::model::{CaSecret, IngressDoc, ProxySpec, RegistryKey, TlsSecret};

#[derive(Debug, Clone, Default)]
pub struct Inputs<'a> {
    pub ingresses: &'a [IngressDoc],
    pub tls_secrets: &'a [TlsSecret],
    /// CA certificates by Secret, for client certificate validation.
    pub ca_secrets: &'a [CaSecret],
    /// `known_secrets` is filled from `tls_secrets`, `known_ca_secrets`
    /// from `ca_secrets`.
    pub ingress: IngressOptions,
    pub gateway: GatewayOptions,
    /// McpBridge `spec.proxies[]`, validated.
    pub proxies: &'a [ProxySpec],
    /// The `proxyName` of each registry that has one.
    pub registry_proxies: BTreeMap<RegistryKey, String>,
    /// The `ecdhCurves` of each registry that has some: offered in the TLS
    /// handshakes of its services' clusters and proxied clusters.
    pub registry_ecdh_curves: BTreeMap<RegistryKey, Vec<String>>,
    /// The `meshbridgeMigration` of each registry that sets one: its share
    /// and priority on hosts other registries report too ([`super::merge`]).
    pub registry_migration: BTreeMap<RegistryKey, Migration>,
}
