//! Neutral service records: what every registry reports, whatever its kind.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::shared::{Labels, reshare};

/// Application protocol of a service port, in Istio's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub enum Protocol {
    #[default]
    #[serde(rename = "HTTP")]
    Http,
    #[serde(rename = "HTTPS")]
    Https,
    #[serde(rename = "HTTP2")]
    Http2,
    #[serde(rename = "GRPC")]
    Grpc,
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "TLS")]
    Tls,
}

impl Protocol {
    /// Parse a registry's protocol name (case-insensitive); `None` if unknown.
    pub fn parse(s: &str) -> Option<Protocol> {
        Some(match s.to_ascii_lowercase().as_str() {
            "http" => Protocol::Http,
            "https" => Protocol::Https,
            "http2" | "h2" | "h2c" => Protocol::Http2,
            "grpc" | "grpcs" | "triple" | "tri" => Protocol::Grpc,
            "tcp" | "dubbo" => Protocol::Tcp,
            "tls" => Protocol::Tls,
            _ => return None,
        })
    }

    /// Istio's name, also used as the port name prefix.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "HTTP",
            Protocol::Https => "HTTPS",
            Protocol::Http2 => "HTTP2",
            Protocol::Grpc => "GRPC",
            Protocol::Tcp => "TCP",
            Protocol::Tls => "TLS",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One port of a service as the mesh sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServicePort {
    pub number: u16,
    pub protocol: Protocol,
    /// Istio port name, e.g. `http-8080`.
    pub name: String,
}

/// One instance of a service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// An IP address (v4 or v6). Registries resolve names before emitting.
    pub address: String,
    /// The instance's own port; it may differ from the service port.
    pub port: u16,
    /// Load-balancing weight, at least 1.
    pub weight: u32,
    /// Shared between endpoints with equal labels ([`Service::new`]).
    pub labels: Labels,
}

/// A service as one registry reports it. Every field is ordered so that
/// equal services compare and hash equal, which makes versions stable.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Service {
    /// Fully qualified mesh host, e.g. `web.dc1.consul`.
    pub host: String,
    /// Service ports, sorted by number. Usually one.
    pub ports: Vec<ServicePort>,
    /// Endpoints, sorted. Empty means the registry says there are none.
    pub endpoints: Vec<Endpoint>,
    /// Set when the mesh must talk TLS to the endpoints (protocol `https` or
    /// `grpcs`, or a Eureka secure port); translation then originates TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<Tls>,
}

/// How to originate TLS to a service's endpoints.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Tls {
    /// Server name to send in the TLS handshake; none sends no SNI.
    pub sni: Option<String>,
}

impl Service {
    /// Build a service with one port, sorting endpoints so that equal
    /// contents give equal values whatever order the registry used.
    pub fn new(host: impl Into<String>, ports: Vec<ServicePort>, mut endpoints: Vec<Endpoint>) -> Self {
        for e in &mut endpoints {
            e.labels = reshare(std::mem::take(&mut e.labels));
        }
        endpoints.sort();
        endpoints.dedup();
        let mut ports = ports;
        ports.sort();
        ports.dedup_by_key(|p| p.number);
        Service { host: host.into(), ports, endpoints, tls: None }
    }

    /// The same service, reached over TLS.
    pub fn with_tls(self, tls: Tls) -> Self {
        Service { tls: Some(tls), ..self }
    }
}
