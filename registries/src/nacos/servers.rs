//! Where the Nacos servers are: `domain:port` from the spec, or the list an
//! address server (`nacosAddressServer`) publishes at `/nacos/serverlist`,
//! one `ip[:port]` per line, re-read every refresh interval.

use std::net::IpAddr;
use std::time::Duration;

use reqwest::Url;

use crate::body::read_capped;
use crate::http_error::client_error;
use crate::spec::RegistrySpec;
use crate::watcher::RegistryError;

const SERVERLIST_PATH: &str = "/nacos/serverlist";
/// The most bytes read from an address server answer.
const SERVERLIST_MAX_BYTES: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(5);
/// Nacos's own default when neither the list nor the spec gives a port.
const DEFAULT_PORT: u16 = 8848;

/// The source of the server list.
pub(crate) enum Servers {
    Fixed(Vec<String>),
    AddressServer { url: Url, port: u16, http: reqwest::Client, registry: String },
}

impl Servers {
    pub fn new(spec: &RegistrySpec, http: reqwest::Client) -> Result<Servers, RegistryError> {
        let port = if spec.port == 0 { DEFAULT_PORT } else { spec.port };
        let Some(address) = spec.nacos_address_server.as_deref().map(str::trim).filter(|a| !a.is_empty()) else {
            let servers: Vec<String> =
                spec.domain.split(',').map(str::trim).filter(|d| !d.is_empty()).map(|d| server_addr(d, port)).collect();
            if servers.is_empty() {
                return Err(config(spec, "domain", "required (or nacosAddressServer)".into()));
            }
            return Ok(Servers::Fixed(servers));
        };
        // Higress accepts `host:port` as well as a URL.
        // With `registryTls` a bare address is https too; an explicit
        // scheme is kept as written.
        let scheme = if spec.tls.is_some() { "https" } else { "http" };
        let base = if address.contains("://") { address.to_string() } else { format!("{scheme}://{address}") };
        let mut url = Url::parse(&base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| {
            config(spec, "nacosAddressServer", format!("{address:?} is not an http URL or host:port"))
        })?;
        // A bare host means Nacos's well-known path; an explicit path is kept.
        if url.path() == "/" {
            url.set_path(SERVERLIST_PATH);
        }
        let namespace = spec.nacos_namespace_id.as_deref().filter(|n| !n.is_empty());
        if let Some(ns) = namespace {
            url.query_pairs_mut().append_pair("namespace", ns);
        }
        Ok(Servers::AddressServer { url, port, http, registry: spec.name.clone() })
    }

    pub fn is_dynamic(&self) -> bool {
        matches!(self, Servers::AddressServer { .. })
    }

    /// The current list, sorted, as `host:port` (IPv6 bracketed).
    pub async fn fetch(&self) -> Result<Vec<String>, RegistryError> {
        let (url, port, http, registry) = match self {
            Servers::Fixed(list) => return Ok(list.clone()),
            Servers::AddressServer { url, port, http, registry } => (url, *port, http, registry),
        };
        let what = url.path();
        // Higress sends this header; some address servers route on it.
        let req = http.get(url.clone()).header("Request-Module", "Naming").timeout(TIMEOUT);
        let resp = req.send().await.map_err(|e| client_error(registry, "GET", what, &e))?;
        let status = resp.status();
        // A server list is a few lines; 1 MiB is generous.
        let body =
            read_capped(resp, SERVERLIST_MAX_BYTES, registry, what, |e| client_error(registry, "GET", what, e)).await?;
        let body = String::from_utf8_lossy(&body);
        if !status.is_success() {
            return Err(RegistryError::Status {
                registry: registry.clone(),
                what: format!("GET {what}"),
                status: status.as_u16(),
            });
        }
        parse_server_list(&body, port).map_err(|reason| RegistryError::BadResponse {
            registry: registry.clone(),
            what: format!("GET {what}"),
            reason: reason.to_string(),
        })
    }
}

fn config(spec: &RegistrySpec, field: &str, reason: String) -> RegistryError {
    RegistryError::Config { registry: spec.name.clone(), field: field.to_string(), reason }
}

/// `host:port` for a host (name, IPv4 or IPv6, bracketed or not) and a port
/// used when the host carries none.
fn server_addr(host: &str, port: u16) -> String {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return match ip {
            IpAddr::V4(v4) => format!("{v4}:{port}"),
            IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        };
    }
    if let Ok(sock) = host.parse::<std::net::SocketAddr>() {
        return sock.to_string();
    }
    if host.starts_with('[') && host.ends_with(']') {
        return format!("{host}:{port}");
    }
    match host.rsplit_once(':') {
        Some((h, p)) if p.parse::<u16>().is_ok() && !h.contains(':') => host.to_string(),
        _ => format!("{host}:{port}"),
    }
}

/// Why an address server's answer was not used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadServerList {
    #[error("{0:?} is not an ip or ip:port")]
    NotAnAddress(String),
    #[error("empty server list")]
    Empty,
}

/// An address server's answer: one `ip` or `ip:port` per line (Higress
/// splits on any whitespace). Anything else makes the whole answer bad, so a
/// broken address server cannot point us at garbage.
pub(crate) fn parse_server_list(body: &str, port: u16) -> Result<Vec<String>, BadServerList> {
    let mut out = Vec::new();
    for item in body.split_whitespace() {
        let addr = server_addr(item, port);
        let host = addr.rsplit_once(':').map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'));
        if host.is_none_or(|h| h.parse::<IpAddr>().is_err()) {
            return Err(BadServerList::NotAnAddress(crate::clip::clip(item).to_string()));
        }
        out.push(addr);
    }
    if out.is_empty() {
        return Err(BadServerList::Empty);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The gRPC port is the HTTP port plus this (the Nacos clients' rule).
pub(crate) const GRPC_PORT_OFFSET: u16 = 1000;

/// `host:port` of a server's gRPC port (its HTTP port + 1000).
pub(crate) fn grpc_addr(server: &str) -> Option<String> {
    let (host, port) = server.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?.checked_add(GRPC_PORT_OFFSET)?;
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::RegistryKind;

    #[test]
    fn server_list_answers() {
        let got = parse_server_list("10.0.0.2:8848\n10.0.0.1\r\n\n  ::1  [::2]:9000 10.0.0.1:8848\n", 8848).unwrap();
        assert_eq!(got, vec!["10.0.0.1:8848", "10.0.0.2:8848", "[::1]:8848", "[::2]:9000"]);
        assert!(parse_server_list("", 8848).is_err());
        assert!(parse_server_list("10.0.0.1\nnacos.example.com", 8848).is_err());
        assert!(parse_server_list("<html>", 8848).is_err());
    }

    #[test]
    fn fixed_servers_from_the_spec() {
        let spec = RegistrySpec::new(RegistryKind::Nacos2, "n", "nacos.svc, 10.0.0.1:9999,::1", 8848);
        let Ok(Servers::Fixed(list)) = Servers::new(&spec, reqwest::Client::new()) else { panic!() };
        assert_eq!(list, vec!["nacos.svc:8848", "10.0.0.1:9999", "[::1]:8848"]);
    }

    #[test]
    fn address_server_urls() {
        let url = |addr: &str, ns: Option<&str>| {
            let mut spec = RegistrySpec::new(RegistryKind::Nacos2, "n", "", 0);
            spec.nacos_address_server = Some(addr.into());
            spec.nacos_namespace_id = ns.map(String::from);
            match Servers::new(&spec, reqwest::Client::new()) {
                Ok(Servers::AddressServer { url, port, .. }) => format!("{url} {port}"),
                Ok(_) => "fixed".into(),
                Err(e) => e.to_string(),
            }
        };
        assert_eq!(url("10.0.0.9:8080", None), "http://10.0.0.9:8080/nacos/serverlist 8848");
        assert_eq!(url("http://as.example/custom", Some("dev")), "http://as.example/custom?namespace=dev 8848");
        assert!(url("ftp://x", None).contains("nacosAddressServer"));
    }

    #[test]
    fn address_server_is_https_with_registry_tls() {
        let mut spec = RegistrySpec::new(RegistryKind::Nacos2, "n", "", 0);
        spec.tls = Some(crate::tls::RegistryTls::default());
        for (given, want) in [
            ("10.0.0.9:8080", "https://10.0.0.9:8080/nacos/serverlist"),
            ("https://as.example/list", "https://as.example/list"),
        ] {
            spec.nacos_address_server = Some(given.into());
            let Ok(Servers::AddressServer { url, .. }) = Servers::new(&spec, reqwest::Client::new()) else { panic!() };
            assert_eq!(url.as_str(), want);
        }
    }
}
