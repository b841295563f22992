//! Istio Gateway + VirtualService + DestinationRule → Envoy resources for a
//! bare Envoy acting as a standalone gateway (what Higress's gateway would
//! get from Pilot, without Pilot).
//!
//! - Listeners: `http.{port}` for each HTTP port, and `https.{port}` when at
//!   least one Gateway server has `tls.mode: SIMPLE` or `MUTUAL` with a
//!   known certificate. Each takes its routes by RDS over ADS from the
//!   RouteConfiguration of the same name, and its certificates by SDS over
//!   ADS from Secrets named `namespace/name`.
//! - Routes: a virtual host per VirtualService host bound to a Gateway
//!   server; `http[]` entries in order.
//! - Clusters: only the subset clusters (`outbound|{port}|{subset}|{host}`)
//!   DestinationRules call for, and the aggregate clusters of a route's
//!   cluster and its default backend's (see `fallback.rs`). A service's own
//!   clusters come from [`envoy::clusters`](super::envoy::clusters) for
//!   every registry service.
//!
//! No route names a cluster the Envoy will not have: a destination that is
//! not a registry service (a Kubernetes `*.svc.cluster.local` Service, a
//! typo) is left out with a warning, and a route left with no destination
//! answers 503. The xDS server pushes CDS, EDS, LDS, RDS in that order, so
//! the clusters are there before any route names them.

mod canonical;
mod clusters;
mod fallback;
mod listeners;
mod policy;
mod routes;
mod servers;
mod spec;

use std::collections::BTreeSet;

use envoy_types::util::pack_any;

pub use clusters::ServiceLookup;
pub use listeners::{HCM_FILTER, ROUTER_FILTER};
pub use policy::{LOCAL_RATE_LIMIT_FILTER, inert_local_rate_limit, local_rate_limit};
use servers::Side;

use super::model::IstioObject;
use super::warning::{Reason, Warning};
use crate::resources::Resource;

/// How the standalone Envoy listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayOptions {
    /// `--gateway-http-port`; one HTTP listener each.
    pub http_ports: Vec<u16>,
    /// Port of the HTTPS listener, made only when a server needs it.
    pub https_port: u16,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions { http_ports: vec![80], https_port: 443 }
    }
}

/// CA certificates that verify clients' certificates, from a Secret.
pub use crate::model::CaSecret;
/// A TLS certificate for the HTTPS listener, from a `kubernetes.io/tls` Secret.
pub use crate::model::TlsSecret as GatewayTls;

/// Envoy resources for the standalone gateway, each list sorted by name.
/// Only the Secrets carry private keys: show their names and versions,
/// never their bodies.
#[derive(Debug, Clone, Default)]
pub struct GatewayOutput {
    pub listeners: Vec<Resource>,
    pub routes: Vec<Resource>,
    /// Subset and aggregate clusters only; see the module docs.
    pub clusters: Vec<Resource>,
    /// The subset clusters' endpoints (an aggregate cluster has none).
    pub load_assignments: Vec<Resource>,
    /// SDS Secrets (certificate and key) the HTTPS chains and the clusters'
    /// mutual TLS name.
    pub secrets: Vec<Resource>,
    /// Objects, servers, routes and destinations left out, and why.
    pub warnings: Vec<Warning>,
    /// Every host a route destination names, found or not: the services
    /// whose change can change this output.
    pub referenced: BTreeSet<String>,
}

/// Translate the Istio objects (anything other than Gateways,
/// VirtualServices and DestinationRules is ignored) into the standalone
/// gateway's Envoy resources. `services` looks up a registry service by host.
///
/// `ca` holds the CA certificates of Secrets, for servers that verify
/// client certificates. Such a server's chain routes by a
/// RouteConfiguration of its own (`https.{port}.{gateway}.{index}`) with
/// its hosts only, and the other chains' routes leave those hosts out: a
/// client that names another host in its SNI, or none, cannot reach them
/// with a `Host` header.
pub fn envoy_gateway<'a>(
    objects: impl IntoIterator<Item = &'a IstioObject>,
    services: &ServiceLookup<'_>,
    tls: &[GatewayTls],
    ca: &[CaSecret],
    opts: &GatewayOptions,
) -> GatewayOutput {
    let mut warnings = Vec::new();
    let specs = spec::collect(objects, &mut warnings);
    let servers = servers::servers(&specs.gateways, tls, ca, &mut warnings);
    let all: Vec<&servers::BoundServer<'_>> = servers.iter().collect();
    let mut clusters = clusters::Clusters::new(services, &specs.destination_rules, tls);
    let bound = routes::bind(&specs, &mut clusters, &mut warnings);

    for b in &bound {
        let served = [Side::Http, Side::Https].iter().any(|side| !routes::served_hosts(b, &all, *side).is_empty());
        if !served {
            warnings.push(Warning::new(
                format!("VirtualService {}", b.vs.key()),
                Reason::Unservable,
                "no host matches a served server of its gateways; not routed",
            ));
        }
    }

    let mut out = GatewayOutput::default();
    let mut http_ports = opts.http_ports.clone();
    http_ports.sort_unstable();
    http_ports.dedup();
    for port in &http_ports {
        let name = format!("http.{port}");
        let rc = routes::route_configuration(name.clone(), &bound, &all, Side::Http);
        out.routes.push(Resource::new(name.clone(), canonical::route_configuration_any(rc)));
        out.listeners.push(Resource::new(name.clone(), pack_any(listeners::http_listener(&name, *port))));
    }

    let name = format!("https.{}", opts.https_port);
    let own_routes = |s: &servers::BoundServer<'_>| format!("{name}.{}.{}", s.gateway.key(), s.index);
    let route_config = |s: &servers::BoundServer<'_>| if s.client_certs.asked() { own_routes(s) } else { name.clone() };
    let mut secrets = std::collections::BTreeMap::new();
    let chains = listeners::https_chains(&servers, route_config, &mut secrets, &mut warnings);
    if !chains.is_empty() {
        if http_ports.contains(&opts.https_port) {
            warnings.push(Warning::new(
                "",
                Reason::Unservable,
                format!("HTTPS port {} is also an HTTP port; no HTTPS listener", opts.https_port),
            ));
            secrets.clear();
        } else {
            let (verifying, plain): (Vec<&servers::BoundServer<'_>>, Vec<_>) =
                all.iter().copied().partition(|s| s.client_certs.asked());
            // Hosts that need a client certificate (those a verifying
            // server's host names or covers) are in no other chain's routes.
            let guarded: BTreeSet<&str> =
                verifying.iter().flat_map(|s| s.hosts.iter().map(|h| h.host.as_str())).collect();
            let mut rc = routes::route_configuration(name.clone(), &bound, &plain, Side::Https);
            rc.virtual_hosts
                .retain(|vh| !guarded.iter().any(|g| servers::intersect(g, &vh.name).is_some_and(|h| h == vh.name)));
            out.routes.push(Resource::new(name.clone(), canonical::route_configuration_any(rc)));
            for s in verifying.iter().filter(|s| s.client_certs != servers::ClientCerts::NoCa) {
                let own = own_routes(s);
                let rc = routes::route_configuration(own.clone(), &bound, &[s], Side::Https);
                out.routes.push(Resource::new(own, canonical::route_configuration_any(rc)));
            }
            let listener = listeners::https_listener(&name, opts.https_port, chains);
            out.listeners.push(Resource::new(name, pack_any(listener)));
        }
    }

    let made = clusters.into_resources();
    (out.clusters, out.load_assignments, out.referenced) = (made.clusters, made.load_assignments, made.referenced);
    // One SDS Secret for a certificate both served and presented upstream.
    secrets.extend(made.secrets);
    out.secrets = secrets.into_values().collect();
    out.listeners.sort_by(|a, b| a.name.cmp(&b.name));
    out.routes.sort_by(|a, b| a.name.cmp(&b.name));
    dedup_keep_order(&mut warnings);
    out.warnings = warnings;
    out
}

/// The same route may be reached from several places (a VirtualService on
/// two listeners); say each thing once.
fn dedup_keep_order(warnings: &mut Vec<Warning>) {
    let mut seen = std::collections::BTreeSet::new();
    warnings.retain(|w| seen.insert(w.clone()));
}

#[cfg(test)]
#[path = "gateway_tests.rs"]
mod tests;
