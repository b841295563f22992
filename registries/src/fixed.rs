//! The `static` registry type (`static` is a Rust keyword, hence the module
//! name): a fixed list of endpoints in `domain`, `ip:port` or `[v6]:port`
//! separated by commas, served as the one service `{name}.static`.
//!
//! As in Higress, `port` is the *service* port (config validation turns an
//! unset port into 80, what the Higress console writes) while each endpoint
//! keeps its own port. There is nothing to watch: the watcher sends one
//! [`Update::Snapshot`], which marks the registry ready, and then idles until
//! the reconciler drops it.
//!
//! [`single_service`] also names the `dns` registry's one service.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tracing::{Instrument, info, info_span};

use crate::model::{Endpoint, Protocol, Service, ServicePort, Tls};
use crate::spec::RegistrySpec;
use crate::watcher::{RegistryError, Sink, Update, Watcher};

/// The service port when the spec has none (see `src/config/validate.rs`).
const DEFAULT_SERVICE_PORT: u16 = 80;

/// Serves the endpoints of one `static` registry. Built by [`crate::watcher_for`].
pub struct StaticWatcher {
    service: Service,
}

impl StaticWatcher {
    pub fn new(spec: RegistrySpec) -> Result<StaticWatcher, RegistryError> {
        let endpoints = parse_endpoints(&spec)?;
        let port = if spec.port == 0 { DEFAULT_SERVICE_PORT } else { spec.port };
        let host = format!("{}.static", spec.name);
        Ok(StaticWatcher { service: single_service(&spec, host, port, endpoints, None) })
    }

    /// The one service this registry reports.
    pub fn service(&self) -> &Service {
        &self.service
    }
}

impl Watcher for StaticWatcher {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let span = info_span!("static", host = %self.service.host);
        Box::pin(
            async move {
                info!(endpoints = self.service.endpoints.len(), "serving static endpoints");
                let started = std::time::Instant::now();
                sink.update(Update::Snapshot(vec![self.service]));
                // A full sync like any other registry's, so its duration is reported too.
                sink.synced(started.elapsed());
                sink.healthy();
                std::future::pending::<()>().await;
            }
            .instrument(span),
        )
    }
}

/// `domain` as endpoints. Addresses are written back in canonical form, so
/// `[::1]:80` and `[0::1]:80` are the same endpoint.
fn parse_endpoints(spec: &RegistrySpec) -> Result<Vec<Endpoint>, RegistryError> {
    let config = |reason: String| RegistryError::Config { registry: spec.name.clone(), field: "domain".into(), reason };
    let mut endpoints = Vec::new();
    for item in spec.domain.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let addr: SocketAddr = item.parse().map_err(|_| config(format!("{item:?} is not an IP:port endpoint")))?;
        if addr.port() == 0 {
            return Err(config(format!("{item:?}: port must be 1..65535")));
        }
        endpoints.push(Endpoint {
            address: addr.ip().to_string(),
            port: addr.port(),
            weight: 1,
            labels: Default::default(),
        });
    }
    if endpoints.is_empty() {
        return Err(config("no endpoints".into()));
    }
    Ok(endpoints)
}

/// The one service of a `static` or `dns` registry: `port` with the
/// registry's protocol (HTTP by default), and TLS when the protocol is
/// `https` or `grpcs`, with `sni` or else `default_sni` as server name.
pub(crate) fn single_service(
    spec: &RegistrySpec,
    host: String,
    port: u16,
    endpoints: Vec<Endpoint>,
    default_sni: Option<&str>,
) -> Service {
    let protocol = spec.protocol.as_deref().and_then(Protocol::parse).unwrap_or_default();
    let name = format!("{}-{port}", protocol.as_str().to_lowercase());
    let service = Service::new(host, vec![ServicePort { number: port, protocol, name }], endpoints);
    if wants_tls(spec) {
        let sni = spec.sni.clone().filter(|s| !s.is_empty()).or_else(|| default_sni.map(str::to_string));
        service.with_tls(Tls { sni })
    } else {
        service
    }
}

/// Protocols that mean "TLS to the endpoints". `Protocol` folds `grpcs` into
/// GRPC, so the spec's own spelling decides.
pub(crate) fn wants_tls(spec: &RegistrySpec) -> bool {
    spec.protocol.as_deref().is_some_and(|p| p.eq_ignore_ascii_case("https") || p.eq_ignore_ascii_case("grpcs"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RegistryKind;

    fn spec(domain: &str, port: u16) -> RegistrySpec {
        RegistrySpec::new(RegistryKind::Static, "local-echo", domain, port)
    }

    #[test]
    fn endpoints_keep_their_ports_and_ipv6_is_canonical() {
        let w = StaticWatcher::new(spec(" 10.0.0.2:8080, [0:0::1]:9090,10.0.0.1:8080 ,", 80)).unwrap();
        let svc = w.service();
        assert_eq!(svc.host, "local-echo.static");
        assert_eq!(svc.ports, vec![ServicePort { number: 80, protocol: Protocol::Http, name: "http-80".into() }]);
        let eps: Vec<String> = svc.endpoints.iter().map(|e| format!("{}|{}", e.address, e.port)).collect();
        assert_eq!(eps, vec!["10.0.0.1|8080", "10.0.0.2|8080", "::1|9090"]);
        assert_eq!(svc.tls, None);
    }

    #[test]
    fn bad_domains_are_config_errors() {
        for bad in ["", " , ", "10.0.0.1", "host:80", "10.0.0.1:0", "::1:80", "10.0.0.1:80,nope"] {
            let err = StaticWatcher::new(spec(bad, 80)).err().unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(matches!(&err, RegistryError::Config { field, .. } if field == "domain"), "{err}");
        }
    }

    #[test]
    fn port_zero_is_80_and_protocols_choose_tls() {
        let mut s = spec("10.0.0.1:8443", 0);
        s.protocol = Some("HTTPS".into());
        let svc = StaticWatcher::new(s.clone()).unwrap().service;
        assert_eq!((svc.ports[0].number, svc.ports[0].protocol), (80, Protocol::Https));
        assert_eq!(svc.tls, Some(Tls { sni: None }));

        s.protocol = Some("grpcs".into());
        s.sni = Some("api.example.com".into());
        let svc = StaticWatcher::new(s.clone()).unwrap().service;
        assert_eq!(svc.ports[0].name, "grpc-80");
        assert_eq!(svc.tls, Some(Tls { sni: Some("api.example.com".into()) }));

        s.protocol = Some("grpc".into());
        assert_eq!(StaticWatcher::new(s).unwrap().service.tls, None, "sni alone does not mean TLS");
    }
}
