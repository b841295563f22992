//! The traffic group as Higress reads it (`mirror.go`,
//! `ip_access_control.go`), and ingress-nginx's `denylist-source-range`.
//!
//! Mirroring: a copy of each
//! request, or of a share of them, goes to another service as well; its
//! answers are dropped. `mirror-target-fqdn` (with `mirror-target-fqdn-port`,
//! 80 by default) names any host and comes first; `mirror-target-service`
//! names a service as `[namespace/]name[:port]`, which Higress looks up
//! among the Kubernetes Services. meshbridge watches no Services, so a name
//! without a dot is taken as one (`name.namespace.svc.cluster.local`, the
//! Ingress's namespace by default) and a dotted name without a namespace as
//! a registry service, as `higress.io/destination` names them
//! (`shadow.static:80`), which must exist. `mirror-percentage` is a whole
//! percentage; Higress mirrors everything for 100 or more (and for values
//! it cannot read), meshbridge reports those and leaves the mirror out.

use std::net::IpAddr;

use meshbridge_registries::clip;

pub use crate::model::ingress::MirrorTarget;
use crate::model::ingress::{port, service_target};
use crate::translate::model::{Cidr, SourceRanges};

pub const MIRROR_TARGET_SERVICE: &str = "mirror-target-service";
pub const MIRROR_PERCENTAGE: &str = "mirror-percentage";
pub const MIRROR_TARGET_FQDN: &str = "mirror-target-fqdn";
pub const MIRROR_TARGET_FQDN_PORT: &str = "mirror-target-fqdn-port";
pub const WHITELIST_SOURCE_RANGE: &str = "whitelist-source-range";
pub const DENYLIST_SOURCE_RANGE: &str = "denylist-source-range";
/// Higress's port for `mirror-target-fqdn`.
const DEFAULT_FQDN_PORT: u16 = 80;

/// Looks an annotation up: `(key, both prefixes)` → the key found and its
/// value.
pub type Lookup<'a> = dyn FnMut(&str, bool) -> Option<(String, String)> + 'a;

/// Where the mirror annotations send copies, before the host is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    /// The annotation that named the target, for warnings.
    pub key: String,
    pub target: MirrorTarget,
    /// Unset: every request.
    pub percentage: Option<u32>,
}

/// Read the mirror annotations; bad values go to `warnings`, naming the
/// annotation, and leave the mirror out.
pub fn read_mirror(get: &mut Lookup<'_>, warnings: &mut Vec<String>) -> Option<Mirror> {
    let fqdn = get(MIRROR_TARGET_FQDN, true).filter(|(_, v)| !v.trim().is_empty());
    let service = get(MIRROR_TARGET_SERVICE, true).filter(|(_, v)| !v.trim().is_empty());
    let fqdn_port = get(MIRROR_TARGET_FQDN_PORT, true);
    let percentage = get(MIRROR_PERCENTAGE, true);
    let mut bad = |key: &str, why: String| {
        warnings.push(format!("annotation {key}: {why}; mirror left out"));
        None
    };
    let (key, target) = if let Some((key, v)) = fqdn {
        let host = v.trim();
        let host_ok =
            host.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        if !host_ok {
            return bad(&key, format!("{:?} is not a host name", clip(&v)));
        }
        let port = match &fqdn_port {
            None => DEFAULT_FQDN_PORT,
            Some((pkey, p)) => match port(p) {
                Some(n) => n,
                None => return bad(pkey, format!("{:?} is not a port (1 to 65535)", clip(p))),
            },
        };
        (key, MirrorTarget::Fqdn { host: host.to_ascii_lowercase(), port })
    } else if let Some((key, v)) = service {
        match service_target(v.trim()) {
            Ok(t) => (key, t),
            Err(why) => return bad(&key, why.to_string()),
        }
    } else {
        return None;
    };
    let percentage = match percentage {
        None => None,
        Some((pkey, p)) => match p.trim().parse::<u32>() {
            Ok(100) => None,
            Ok(n @ 0..=99) if !p.trim().starts_with('+') => Some(n),
            _ => return bad(&pkey, format!("{:?} is not a whole percentage from 0 to 100", clip(&p))),
        },
    };
    Some(Mirror { key, target, percentage })
}

/// `whitelist-source-range` (Higress reads it under both prefixes) and
/// ingress-nginx's `denylist-source-range`: comma-separated CIDRs or bare
/// addresses. A bad entry is reported and left out; an allow list left
/// with none serves no one rather than everyone.
pub fn read_source_ranges(get: &mut Lookup<'_>, warnings: &mut Vec<String>) -> Option<SourceRanges> {
    let allow = get(WHITELIST_SOURCE_RANGE, true);
    let deny = get(DENYLIST_SOURCE_RANGE, true);
    if allow.is_none() && deny.is_none() {
        return None;
    }
    let mut list = |(key, v): (String, String)| {
        let mut out = Vec::new();
        for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match cidr(entry) {
                Some(c) => out.push(c),
                None => {
                    warnings.push(format!("annotation {key}: {:?} is not an address or CIDR; left out", clip(entry)))
                }
            }
        }
        (key, out)
    };
    let allow = allow.map(&mut list);
    let deny = deny.map(&mut list).map(|(_, d)| d).unwrap_or_default();
    if let Some((key, a)) = &allow
        && a.is_empty()
    {
        warnings.push(format!("annotation {key}: no usable address; every client is denied"));
    }
    Some(SourceRanges { allow: allow.map(|(_, a)| a), deny })
}

/// `10.0.0.0/8`, `2001:db8::/32`, or an address alone (all its bits).
fn cidr(v: &str) -> Option<Cidr> {
    let (addr, len) = match v.split_once('/') {
        Some((a, l)) if !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit()) => (a, Some(l.parse::<u8>().ok()?)),
        Some(_) => return None,
        None => (v, None),
    };
    let address: IpAddr = addr.parse().ok()?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    let prefix_len = len.unwrap_or(max);
    (prefix_len <= max).then_some(Cidr { address, prefix_len })
}

#[cfg(test)]
#[path = "traffic_tests.rs"]
pub(super) mod traffic_tests;
