//! The `dns` registry type: `domain` is a comma list of host names, each
//! resolved (A and AAAA) with hickory-resolver; every address becomes an
//! endpoint on `port` of the one service `{name}.dns`.
//!
//! Each host is re-resolved when its answer's TTL runs out (the smallest
//! record TTL, at least 1 s and at most [`MAX_REFRESH`], so a long TTL does
//! not pin a stale address for hours). The resolver's own cache is off: this
//! watcher holds the last answer and decides when to ask again.
//!
//! A failed lookup (timeout, SERVFAIL, and also NXDOMAIN or no records) is
//! reported to [`Sink::error`] and retried with backoff, and that host keeps
//! its last addresses. This is what Envoy's `STRICT_DNS` clusters do, and it
//! keeps a flapping or misconfigured resolver from emptying a service. The
//! first [`Update::Snapshot`] goes out once every host has been tried and at
//! least one answered; after that only a changed address set is sent.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use hickory_resolver::config::{ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::{Resolver, TokioResolver};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::fixed::single_service;
use crate::model::{Endpoint, Service};
use crate::retry;
use crate::spec::RegistrySpec;
use crate::watcher::{RegistryError, Sink, Update, Watcher};

/// Re-resolve at least this often, whatever the TTL.
pub const MAX_REFRESH: Duration = Duration::from_secs(60);
/// Re-resolve at most this often, even with TTL 0.
pub const MIN_REFRESH: Duration = Duration::from_secs(1);
const DEFAULT_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// Resolves the hosts of one `dns` registry. Built by [`crate::watcher_for`].
pub struct DnsWatcher {
    spec: RegistrySpec,
    hosts: Vec<String>,
    resolver_addr: Option<SocketAddr>,
    lookup_timeout: Duration,
}

impl DnsWatcher {
    pub fn new(spec: RegistrySpec) -> Result<DnsWatcher, RegistryError> {
        let config = |field: &str, reason: &str| RegistryError::Config {
            registry: spec.name.clone(),
            field: field.into(),
            reason: reason.into(),
        };
        let mut hosts: Vec<String> =
            spec.domain.split(',').map(str::trim).filter(|h| !h.is_empty()).map(str::to_string).collect();
        hosts.dedup();
        if hosts.is_empty() {
            return Err(config("domain", "no host names"));
        }
        if spec.port == 0 {
            return Err(config("port", "must be 1..65535"));
        }
        Ok(DnsWatcher { spec, hosts, resolver_addr: None, lookup_timeout: DEFAULT_LOOKUP_TIMEOUT })
    }

    /// Ask this DNS server (UDP) instead of the system's resolvers, without
    /// search domains or the hosts file.
    pub fn with_resolver_addr(mut self, addr: SocketAddr) -> DnsWatcher {
        self.resolver_addr = Some(addr);
        self
    }

    /// Give up on one lookup (A and AAAA together) after this long.
    pub fn with_lookup_timeout(mut self, timeout: Duration) -> DnsWatcher {
        self.lookup_timeout = timeout;
        self
    }

    fn resolver(&self) -> Result<TokioResolver, NetError> {
        let mut builder = match self.resolver_addr {
            Some(addr) => {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let server = NameServerConfig::new(addr.ip(), true, vec![udp]);
                let config = ResolverConfig::from_parts(None, vec![], vec![server]);
                let mut builder = Resolver::builder_with_config(config, TokioRuntimeProvider::default());
                builder.options_mut().use_hosts_file = ResolveHosts::Never;
                builder
            }
            None => TokioResolver::builder_tokio()?,
        };
        let options = builder.options_mut();
        // We keep the last answer ourselves and re-ask when its TTL is out.
        options.cache_size = 0;
        // Every address is an endpoint, whatever the system prefers.
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        builder.build()
    }
}

impl Watcher for DnsWatcher {
    fn run(self: Box<Self>, sink: Arc<dyn Sink>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let span = info_span!("dns", registry = %self.spec.name);
        Box::pin(self.run_inner(sink).instrument(span))
    }
}

/// What one host last resolved to, and when to ask again.
struct HostState {
    host: String,
    /// `None` until the first answer.
    addrs: Option<BTreeSet<IpAddr>>,
    due: Instant,
    failures: u32,
}

impl DnsWatcher {
    async fn run_inner(self, sink: Arc<dyn Sink>) {
        info!(hosts = ?self.hosts, port = self.spec.port, resolver = ?self.resolver_addr, "starting");
        let resolver = self.build_resolver(&sink).await;
        let now = Instant::now();
        let mut hosts: Vec<HostState> =
            self.hosts.iter().map(|h| HostState { host: h.clone(), addrs: None, due: now, failures: 0 }).collect();
        let mut sent: Option<Service> = None;
        loop {
            let now = Instant::now();
            let due: Vec<&mut HostState> = hosts.iter_mut().filter(|h| h.due <= now).collect();
            let lookups = due.iter().map(|h| self.lookup(&resolver, &h.host));
            let results = join_all(lookups).await;
            let now = Instant::now();
            let mut answered = false;
            for (state, result) in due.into_iter().zip(results) {
                match result {
                    Ok((addrs, ttl)) => {
                        debug!(host = %state.host, addrs = ?addrs, ?ttl, "resolved");
                        answered = true;
                        state.addrs = Some(addrs);
                        state.failures = 0;
                        state.due = now + ttl.clamp(MIN_REFRESH, MAX_REFRESH);
                    }
                    Err(e) => {
                        warn!(host = %state.host, error = %e, "lookup failed; keeping the last addresses");
                        sink.error(&e);
                        state.failures += 1;
                        state.due = now + backoff(state.failures);
                    }
                }
            }
            if answered {
                sink.healthy();
            }
            if let Some(service) = self.service(&hosts) {
                match &sent {
                    None => {
                        info!(endpoints = service.endpoints.len(), "first answer");
                        sink.update(Update::Snapshot(vec![service.clone()]));
                        sent = Some(service);
                    }
                    Some(last) if *last != service => {
                        info!(endpoints = service.endpoints.len(), "addresses changed");
                        sink.update(Update::Upsert(service.clone()));
                        sent = Some(service);
                    }
                    Some(_) => {}
                }
            }
            let next = hosts.iter().map(|h| h.due).min().unwrap_or(now + MAX_REFRESH);
            tokio::time::sleep_until(next).await;
        }
    }

    /// The resolver, retrying with backoff while the system's resolver
    /// configuration cannot be read.
    async fn build_resolver(&self, sink: &Arc<dyn Sink>) -> TokioResolver {
        let mut failures = 0;
        loop {
            match self.resolver() {
                Ok(resolver) => return resolver,
                Err(e) => {
                    let e = RegistryError::Config {
                        registry: self.spec.name.clone(),
                        field: "domain".into(),
                        reason: format!("cannot set up the DNS resolver: {e}"),
                    };
                    warn!(error = %e, "no resolver");
                    sink.error(&e);
                    failures += 1;
                    tokio::time::sleep(backoff(failures)).await;
                }
            }
        }
    }

    /// The service once every host has been tried and one has answered: the
    /// union of the last addresses of every host.
    fn service(&self, hosts: &[HostState]) -> Option<Service> {
        let tried = hosts.iter().all(|h| h.addrs.is_some() || h.failures > 0);
        let addrs: BTreeSet<IpAddr> = hosts.iter().filter_map(|h| h.addrs.as_ref()).flatten().copied().collect();
        if !tried || hosts.iter().all(|h| h.addrs.is_none()) {
            return None;
        }
        let endpoints = addrs
            .into_iter()
            .map(|ip| Endpoint { address: ip.to_string(), port: self.spec.port, weight: 1, labels: Default::default() })
            .collect();
        // With one host, it is also the name the endpoints' certificates carry.
        let sni = match self.hosts.as_slice() {
            [one] => Some(one.trim_end_matches('.')),
            _ => None,
        };
        let host = format!("{}.dns", self.spec.name);
        Some(single_service(&self.spec, host, self.spec.port, endpoints, sni))
    }

    /// A and AAAA for `host`: its addresses and how long they are valid.
    async fn lookup(
        &self,
        resolver: &TokioResolver,
        host: &str,
    ) -> Result<(BTreeSet<IpAddr>, Duration), RegistryError> {
        match tokio::time::timeout(self.lookup_timeout, resolver.lookup_ip(host)).await {
            Ok(Ok(lookup)) => {
                let ttl = lookup.valid_until().saturating_duration_since(std::time::Instant::now());
                let addrs: BTreeSet<IpAddr> = lookup.iter().collect();
                if addrs.is_empty() {
                    return Err(self.bad(host, "no A or AAAA records".into()));
                }
                Ok((addrs, ttl))
            }
            Ok(Err(e)) => Err(self.lookup_error(host, &e)),
            Err(_) => Err(RegistryError::Unreachable {
                registry: self.spec.name.clone(),
                reason: format!("lookup {host}: timed out after {:?}", self.lookup_timeout),
            }),
        }
    }

    /// A DNS answer that says "no" is a bad response; anything else means the
    /// servers could not be asked.
    fn lookup_error(&self, host: &str, e: &NetError) -> RegistryError {
        match e {
            NetError::Dns(DnsError::NoRecordsFound(no)) if no.response_code == ResponseCode::NXDomain => {
                self.bad(host, "NXDOMAIN (no such host)".into())
            }
            NetError::Dns(DnsError::NoRecordsFound(_)) => self.bad(host, "no A or AAAA records".into()),
            NetError::Dns(DnsError::ResponseCode(code)) => self.bad(host, format!("server answered {code}")),
            other => RegistryError::Unreachable {
                registry: self.spec.name.clone(),
                reason: format!("lookup {host}: {other}"),
            },
        }
    }

    fn bad(&self, host: &str, reason: String) -> RegistryError {
        RegistryError::BadResponse { registry: self.spec.name.clone(), what: format!("lookup {host}"), reason }
    }
}

/// 1 s doubling to 60 s, ±20% so that hosts that failed together are not
/// retried together: a host that keeps failing is asked about about once a
/// minute, as often as one that resolves with a long TTL.
fn backoff(failures: u32) -> Duration {
    retry::jittered(BACKOFF_START, BACKOFF_MAX, failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Tls;
    use crate::spec::RegistryKind;

    fn spec(domain: &str) -> RegistrySpec {
        RegistrySpec::new(RegistryKind::Dns, "ext", domain, 443)
    }

    fn state(host: &str, addrs: Option<&[&str]>, failures: u32) -> HostState {
        HostState {
            host: host.into(),
            addrs: addrs.map(|a| a.iter().map(|s| s.parse().unwrap()).collect()),
            due: Instant::now(),
            failures,
        }
    }

    #[test]
    fn spec_checks() {
        assert!(DnsWatcher::new(spec(" , ")).is_err());
        let mut s = spec("a.example");
        s.port = 0;
        assert!(matches!(DnsWatcher::new(s), Err(RegistryError::Config { field, .. }) if field == "port"));
        assert_eq!(DnsWatcher::new(spec("a.example, b.example ,")).unwrap().hosts, vec!["a.example", "b.example"]);
    }

    #[tokio::test]
    async fn service_waits_for_every_host_and_keeps_failed_hosts_addresses() {
        let w = DnsWatcher::new(spec("a.example,b.example")).unwrap();
        assert_eq!(w.service(&[state("a", Some(&["10.0.0.1"]), 0), state("b", None, 0)]), None, "b not tried yet");
        assert_eq!(w.service(&[state("a", None, 1), state("b", None, 2)]), None, "nobody answered");
        let svc = w.service(&[state("a", Some(&["10.0.0.2", "::1"]), 3), state("b", None, 1)]).unwrap();
        assert_eq!(svc.host, "ext.dns");
        let eps: Vec<String> = svc.endpoints.iter().map(|e| format!("{}|{}", e.address, e.port)).collect();
        assert_eq!(eps, vec!["10.0.0.2|443", "::1|443"]);
        assert_eq!(svc.ports[0].number, 443);
    }

    #[tokio::test]
    async fn tls_sni_defaults_to_the_only_host() {
        let mut s = spec("api.example.com.");
        s.protocol = Some("https".into());
        let w = DnsWatcher::new(s.clone()).unwrap();
        let svc = w.service(&[state("api.example.com.", Some(&["10.0.0.1"]), 0)]).unwrap();
        assert_eq!(svc.tls, Some(Tls { sni: Some("api.example.com".into()) }));

        s.domain = "a.example,b.example".into();
        let w = DnsWatcher::new(s.clone()).unwrap();
        let two = [state("a", Some(&["10.0.0.1"]), 0), state("b", Some(&["10.0.0.2"]), 0)];
        assert_eq!(w.service(&two).unwrap().tls, Some(Tls { sni: None }), "no single name to use");
        s.sni = Some("front.example".into());
        let w = DnsWatcher::new(s).unwrap();
        assert_eq!(w.service(&two).unwrap().tls, Some(Tls { sni: Some("front.example".into()) }));
    }

    #[test]
    fn backoff_doubles_to_a_minute_with_jitter() {
        for (n, want) in [1u64, 2, 4, 8, 16, 32, 60, 60, 60].into_iter().enumerate() {
            let want = Duration::from_secs(want);
            let (lo, hi, distinct) = crate::retry::tests::spread(|| backoff(n as u32 + 1));
            assert!(lo >= want.mul_f64(0.8) && hi <= want.mul_f64(1.2).min(BACKOFF_MAX), "{n}: {lo:?}..{hi:?}");
            assert!(distinct > 20, "failure {}: delays do not vary ({distinct} distinct)", n + 1);
        }
        assert!(backoff(u32::MAX) <= BACKOFF_MAX);
    }
}
