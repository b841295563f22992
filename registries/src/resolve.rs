//! Registries may name hosts; the mesh needs IP addresses. Watchers resolve
//! names before they emit: an instance registered with a host name becomes
//! one endpoint per address the name resolves to.

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use tracing::warn;

use crate::model::Endpoint;

/// One name lookup gives up after this long.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an address has no IPs.
#[derive(Debug)]
pub(crate) enum Unresolved {
    /// The lookup failed (no such name, resolver error).
    Failed(io::Error),
    /// No answer within [`RESOLVE_TIMEOUT`].
    TimedOut,
}

/// The IPs of `address`: itself when it is an IP (written the canonical
/// way), else every address the name resolves to, sorted, each once. An
/// IPv6 address may come in brackets, as in a URL: Dubbo 3 registers its
/// application-level instances that way (`"address": "[::1]"` in ZooKeeper,
/// `"ip": "[::1]"` in Nacos), and no resolver takes the bracketed form.
pub(crate) async fn lookup(address: &str, port: u16) -> Result<Vec<IpAddr>, Unresolved> {
    if let Ok(ip) = address.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    if let Some(Ok(ip)) = address.strip_prefix('[').and_then(|a| a.strip_suffix(']')).map(str::parse::<Ipv6Addr>) {
        return Ok(vec![IpAddr::V6(ip)]);
    }
    match tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((address, port))).await {
        Ok(Ok(addrs)) => {
            let mut ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            ips.sort();
            ips.dedup();
            Ok(ips)
        }
        Ok(Err(e)) => Err(Unresolved::Failed(e)),
        Err(_) => Err(Unresolved::TimedOut),
    }
}

/// Whether `address` is a host name to look up (not an IP, bracketed or not).
pub(crate) fn is_name(address: &str) -> bool {
    address.parse::<IpAddr>().is_err()
        && address.strip_prefix('[').and_then(|a| a.strip_suffix(']')).is_none_or(|a| a.parse::<Ipv6Addr>().is_err())
}

/// One endpoint per IP of each endpoint's address. A name that does not
/// resolve drops that instance alone, with a warning: it is not a registry
/// failure, and the next read tries again. Returns the endpoints and how
/// many instances were dropped.
pub(crate) async fn endpoints(endpoints: Vec<Endpoint>) -> (Vec<Endpoint>, usize) {
    let mut out = Vec::with_capacity(endpoints.len());
    let mut dropped = 0;
    for ep in endpoints {
        match lookup(&ep.address, ep.port).await {
            Ok(ips) => out.extend(ips.into_iter().map(|ip| Endpoint { address: ip.to_string(), ..ep.clone() })),
            Err(Unresolved::Failed(e)) => {
                warn!(address = %ep.address, error = %e, "instance address does not resolve");
                dropped += 1;
            }
            Err(Unresolved::TimedOut) => {
                warn!(address = %ep.address, "instance address lookup timed out");
                dropped += 1;
            }
        }
    }
    (out, dropped)
}

#[cfg(test)]
mod tests {

    use super::*;

    #[tokio::test]
    async fn resolve_keeps_ips_and_expands_names() {
        let ep = |a: &str| Endpoint { address: a.into(), port: 80, weight: 1, labels: Default::default() };
        let (out, dropped) =
            endpoints(vec![ep("10.0.0.1"), ep("::1"), ep("localhost"), ep("no-such-host.invalid")]).await;
        assert_eq!(out[0].address, "10.0.0.1");
        assert_eq!(out[1].address, "::1");
        assert!(out[2..].iter().all(|e| e.address.parse::<IpAddr>().unwrap().is_loopback()), "{out:?}");
        assert!(out.iter().all(|e| e.address != "no-such-host.invalid"));
        assert_eq!(dropped, 1);
    }

    #[test]
    fn names_are_told_from_addresses() {
        assert!(!is_name("10.0.0.1") && !is_name("::1") && !is_name("[::1]"));
        assert!(is_name("db.example.internal") && is_name("localhost") && is_name("[10.0.0.1]"));
    }

    #[tokio::test]
    async fn ips_are_written_the_canonical_way() {
        let ep = Endpoint { address: "0:0::1".into(), port: 80, weight: 1, labels: Default::default() };
        assert_eq!(endpoints(vec![ep]).await.0[0].address, "::1");
        let bracketed = Endpoint { address: "[0:0::1]".into(), port: 80, weight: 1, labels: Default::default() };
        assert_eq!(endpoints(vec![bracketed]).await.0[0].address, "::1", "an IPv6 address in brackets");
        assert!(matches!(lookup("[10.0.0.1]", 80).await, Err(Unresolved::Failed(_))), "brackets hold IPv6 only");
        assert!(matches!(lookup("no-such-host.invalid", 80).await, Err(Unresolved::Failed(_))));
    }
}
