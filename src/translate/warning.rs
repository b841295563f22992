//! What translation left out or changed, and why: one typed record per
//! problem. Metrics count by [`Reason`], logs and the admin API read the
//! same record, and no caller ever parses the text.

use std::fmt;

use serde::Serialize;

/// Why something was left out, routed elsewhere or changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Two registries report the same host; the first in key order wins.
    HostConflict,
    /// A service with no port cannot be a ServiceEntry or a cluster.
    NoPort,
    /// A service with an empty host.
    EmptyHost,
    /// An object that fails Pilot's rules (schema, name, labels); left out of MCP.
    InvalidObject,
    /// An Ingress (or part of one) that cannot be read or routed as written.
    InvalidIngress,
    /// Two Ingresses claim the same path, host or default backend; the older wins.
    IngressConflict,
    /// A TLS Secret that is missing or unusable.
    MissingSecret,
    /// A route destination with no cluster: the route answers 503 or loses that share.
    NoCluster,
    /// A Gateway server, VirtualService or route the standalone gateway cannot serve.
    Unservable,
    /// A proxy that cannot be used, or a service that cannot go through one:
    /// its services are routed directly.
    ProxyUnusable,
    /// An Ingress annotation under `higress.io/` or
    /// `nginx.ingress.kubernetes.io/` that meshbridge does not implement:
    /// the Ingress is served without it.
    IgnoredAnnotation,
    /// A setting the standalone gateway enforces that no Istio object
    /// carries: through istiod it does nothing.
    StandaloneOnly,
}

impl Reason {
    /// Every reason, so metrics can report zeros.
    pub const ALL: [Reason; 12] = [
        Reason::HostConflict,
        Reason::NoPort,
        Reason::EmptyHost,
        Reason::InvalidObject,
        Reason::InvalidIngress,
        Reason::IngressConflict,
        Reason::MissingSecret,
        Reason::NoCluster,
        Reason::Unservable,
        Reason::ProxyUnusable,
        Reason::IgnoredAnnotation,
        Reason::StandaloneOnly,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::HostConflict => "host_conflict",
            Reason::NoPort => "no_port",
            Reason::EmptyHost => "empty_host",
            Reason::InvalidObject => "invalid_object",
            Reason::InvalidIngress => "invalid_ingress",
            Reason::IngressConflict => "ingress_conflict",
            Reason::MissingSecret => "missing_secret",
            Reason::NoCluster => "no_cluster",
            Reason::Unservable => "unservable",
            Reason::ProxyUnusable => "proxy_unusable",
            Reason::IgnoredAnnotation => "ignored_annotation",
            Reason::StandaloneOnly => "standalone_only",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem: the object it concerns (`Ingress default/shop`,
/// `VirtualService higress-system/x: http[0]`, `host web.dc1.consul`),
/// the reason, and what was done about it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Warning {
    pub object: String,
    pub reason: Reason,
    pub detail: String,
}

impl Warning {
    /// `object` and `detail` are clipped ([`meshbridge_registries::clip_to`]):
    /// they may echo values of any size from files and registries.
    pub fn new(object: impl Into<String>, reason: Reason, detail: impl Into<String>) -> Warning {
        use meshbridge_registries::{LOG_MESSAGE_MAX, LOG_VALUE_MAX, clip_owned};
        Warning {
            object: clip_owned(object.into(), 2 * LOG_VALUE_MAX),
            reason,
            detail: clip_owned(detail.into(), LOG_MESSAGE_MAX),
        }
    }
}

/// `object: detail`, or the detail alone when there is no object.
impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.object.is_empty() { f.write_str(&self.detail) } else { write!(f, "{}: {}", self.object, self.detail) }
    }
}

/// Serialised as its text, as logs show it.
impl Serialize for Warning {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Counts per reason, every reason present (zero when absent).
pub fn count_by_reason<'a>(warnings: impl IntoIterator<Item = &'a Warning>) -> Vec<(Reason, usize)> {
    let mut counts: Vec<(Reason, usize)> = Reason::ALL.iter().map(|r| (*r, 0)).collect();
    for w in warnings {
        if let Some(c) = counts.iter_mut().find(|(r, _)| *r == w.reason) {
            c.1 += 1;
        }
    }
    counts
}
