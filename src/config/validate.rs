//! One raw `spec.registries[]` / `spec.proxies[]` entry to a validated spec.
//! Field paths in errors are relative to the entry; `build` prefixes them
//! with the object and `spec.registries[i]`.
//!
//! Things that need more than the entry itself (the auth Secret, the proxy a
//! registry names, duplicates across McpBridges) are checked in `build`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use meshbridge_registries::{
    MIGRATION_MAX, Migration, RegistryKind, RegistrySpec, RegistryTls, WatchMode, WatchSpec, clip, compile_include,
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::model::{PROXY_FIELDS, ProxyConfig, REGISTRY_FIELDS, REGISTRY_IGNORED_FIELDS, RegistryConfig};
use super::types::ProxySpec;

/// Refresh intervals below this are raised to it: Higress's floor
/// (`DefaultRefreshIntervalLimit`, 10 s, for Nacos and Consul). Its console
/// writes seconds into these nanosecond fields, so a "15" means 15 ns and a
/// lower floor would turn that YAML into a full resync every second.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// The service port Higress (its console) gives `static` registries, whose
/// endpoint ports come from `domain`.
pub(crate) const STATIC_DEFAULT_PORT: u16 = 80;

/// A problem with one field of an entry. `field` is a path inside the entry
/// (`port`, `vport.services[0].value`), empty for the entry as a whole.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError { field: field.into(), reason: reason.into() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() { f.write_str(&self.reason) } else { write!(f, "{}: {}", self.field, self.reason) }
    }
}

impl std::error::Error for FieldError {}

/// A registry entry that passed every check that needs only the entry.
#[derive(Debug)]
pub(crate) struct CheckedRegistry {
    /// Everything but `auth`, which `build` fills from the Secret.
    pub spec: RegistrySpec,
    pub auth_secret_name: Option<String>,
    /// `registryTls.caKey`: the Secret key whose CA bundle `build` puts in
    /// `spec.tls`.
    pub tls_ca_key: Option<String>,
}

/// Validate one registry entry. Warnings (unknown or ignored fields, clamped
/// intervals) go to `warnings` whether or not the entry is valid.
/// Refresh intervals below `min_refresh` are raised to it.
pub(crate) fn registry(
    raw: &Value,
    min_refresh: Duration,
    warnings: &mut Vec<FieldError>,
) -> Result<CheckedRegistry, Vec<FieldError>> {
    let cfg: RegistryConfig = typed(raw, REGISTRY_FIELDS, REGISTRY_IGNORED_FIELDS, warnings)?;
    let mut errors = Vec::new();

    let kind = match cfg.kind.as_str() {
        "" => {
            errors.push(FieldError::new("type", "required"));
            None
        }
        s => RegistryKind::parse(s).or_else(|| {
            let known: Vec<_> = RegistryKind::ALL.iter().map(|k| k.as_str()).collect();
            errors.push(FieldError::new(
                "type",
                format!("unknown registry type {:?} (expected one of {})", clip(s), known.join(", ")),
            ));
            None
        }),
    };
    check_name(&cfg.name, &mut errors);

    let port = kind.and_then(|kind| check_address(kind, &cfg, &mut errors));
    let nacos_refresh_interval = interval("nacosRefreshInterval", cfg.nacos_refresh_interval, min_refresh, warnings);
    let consul_refresh_interval = interval("consulRefreshInterval", cfg.consul_refresh_interval, min_refresh, warnings);
    // Higress: unset (0) is the client default; so is a negative value.
    let nacos_timeout = u64::try_from(cfg.nacos_timeout).ok().filter(|ms| *ms > 0).map(Duration::from_millis);
    if cfg.nacos_timeout < 0 {
        warnings.push(FieldError::new("nacosTimeout", "must not be negative; using the default"));
    }
    let mut ecdh_curves: Vec<String> = Vec::new();
    for (i, curve) in cfg.ecdh_curves.iter().enumerate() {
        let curve = curve.trim();
        // Envoy's names are BoringSSL's: X25519, P-256, P-384, X25519MLKEM768…
        if curve.is_empty() || !curve.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            errors.push(FieldError::new(format!("ecdhCurves[{i}]"), format!("{:?} is not a curve name", clip(curve))));
        } else if !ecdh_curves.iter().any(|c| c == curve) {
            ecdh_curves.push(curve.to_string());
        }
    }

    let mut vport_default = None;
    let mut vport_services = BTreeMap::new();
    if let Some(vport) = &cfg.vport {
        if vport.default != 0 {
            vport_default = port_in_range("vport.default", vport.default, &mut errors);
        }
        for (i, svc) in vport.services.iter().enumerate() {
            let field = |f: &str| format!("vport.services[{i}].{f}");
            if svc.name.is_empty() {
                errors.push(FieldError::new(field("name"), "required"));
                continue;
            }
            let Some(value) = port_in_range(&field("value"), svc.value, &mut errors) else {
                continue;
            };
            // Matched against service hosts ignoring case, as Higress does.
            if !svc.name.contains('.') {
                warnings.push(FieldError::new(
                    field("name"),
                    format!(
                        "{:?} names no service host; vport names are hosts such as {}.DEFAULT-GROUP.public.nacos",
                        clip(&svc.name),
                        clip(&svc.name)
                    ),
                ));
            }
            if vport_services.insert(svc.name.to_ascii_lowercase(), value).is_some() {
                errors.push(FieldError::new(field("name"), format!("duplicate service {:?}", clip(&svc.name))));
            }
        }
    }

    let watch = cfg.meshbridge_watch.as_ref().and_then(|raw| watch_spec(raw, kind, &mut errors, warnings));
    let migration =
        cfg.meshbridge_migration.as_ref().map(|raw| migration(raw, &mut errors, warnings)).unwrap_or_default();
    let (tls, tls_ca_key) = kind.map(|k| check_tls(k, &cfg, &mut errors, warnings)).unwrap_or_default();

    let (Some(kind), Some(port), true) = (kind, port, errors.is_empty()) else {
        return Err(errors);
    };
    let mut spec = RegistrySpec::new(kind, cfg.name, cfg.domain, port);
    spec.protocol = non_empty(cfg.protocol);
    spec.sni = non_empty(cfg.sni);
    spec.proxy_name = non_empty(cfg.proxy_name);
    spec.ecdh_curves = ecdh_curves;
    spec.nacos_timeout = nacos_timeout;
    spec.vport_default = vport_default;
    spec.vport_services = vport_services;
    spec.nacos_address_server = non_empty(cfg.nacos_address_server);
    spec.nacos_access_key = cfg.nacos_access_key;
    spec.nacos_secret_key = cfg.nacos_secret_key;
    spec.nacos_namespace_id = non_empty(cfg.nacos_namespace_id);
    spec.nacos_namespace = non_empty(cfg.nacos_namespace);
    spec.nacos_groups = cfg.nacos_groups.into_iter().filter(|g| !g.is_empty()).collect();
    spec.nacos_refresh_interval = nacos_refresh_interval;
    spec.consul_namespace = non_empty(cfg.consul_namespace);
    spec.consul_datacenter = non_empty(cfg.consul_datacenter);
    spec.consul_service_tag = non_empty(cfg.consul_service_tag);
    spec.consul_refresh_interval = consul_refresh_interval;
    spec.zk_services_path = cfg.zk_services_path.into_iter().filter(|p| !p.is_empty()).collect();
    spec.watch = watch;
    spec.tls = tls;
    spec.migration = migration;
    Ok(CheckedRegistry { spec, auth_secret_name: non_empty(cfg.auth_secret_name), tls_ca_key })
}

/// `registryTls` (meshbridge only): `None` unless `enabled: true`, so an
/// entry written for Higress keeps meaning plain HTTP. The CA bundle itself
/// is read from the Secret by `build`; its key is returned.
fn check_tls(
    kind: RegistryKind,
    cfg: &RegistryConfig,
    errors: &mut Vec<FieldError>,
    warnings: &mut Vec<FieldError>,
) -> (Option<RegistryTls>, Option<String>) {
    let Some(tls) = &cfg.registry_tls else { return (None, None) };
    let (ca_key, server_name) = (tls.ca_key.trim(), tls.server_name.trim());
    if !tls.enabled {
        if !ca_key.is_empty() || !server_name.is_empty() {
            warnings.push(FieldError::new("registryTls", "enabled is false: caKey and serverName are ignored"));
        }
        return (None, None);
    }
    let before = errors.len();
    if !matches!(
        kind,
        RegistryKind::Consul | RegistryKind::Nacos | RegistryKind::Nacos2 | RegistryKind::Nacos3 | RegistryKind::Eureka
    ) {
        errors.push(FieldError::new("registryTls.enabled", format!("TLS is not supported for {kind} registries")));
    }
    if !ca_key.is_empty() && cfg.auth_secret_name.trim().is_empty() {
        errors
            .push(FieldError::new("registryTls.caKey", "needs authSecretName: the CA bundle is read from that Secret"));
    }
    if !server_name.is_empty()
        && let Err(reason) = meshbridge_registries::tls::check_server_name(server_name)
    {
        errors.push(FieldError::new("registryTls.serverName", format!("{:?}: {reason}", clip(server_name))));
    }
    if cfg.nacos_address_server.trim().to_ascii_lowercase().starts_with("http://") {
        errors.push(FieldError::new(
            "nacosAddressServer",
            "an http:// URL while registryTls is enabled; use https:// or host:port",
        ));
    }
    if errors.len() > before {
        return (None, None);
    }
    let tls = RegistryTls { ca_pem: None, server_name: non_empty(server_name.to_string()) };
    (Some(tls), non_empty(ca_key.to_string()))
}

/// `meshbridgeWatch: {mode: all|referenced, include: [regex…]}`. `null` is
/// unset; `{}` is `mode: all` with no filter, the same as unset.
fn watch_spec(
    raw: &Value,
    kind: Option<RegistryKind>,
    errors: &mut Vec<FieldError>,
    warnings: &mut Vec<FieldError>,
) -> Option<WatchSpec> {
    const FIELD: &str = "meshbridgeWatch";
    let obj = match raw {
        Value::Null => return None,
        Value::Object(obj) => obj,
        _ => {
            errors.push(FieldError::new(FIELD, "must be an object with mode and include"));
            return None;
        }
    };
    for key in obj.keys().filter(|k| !["mode", "include"].contains(&k.as_str())) {
        warnings.push(FieldError::new(format!("{FIELD}.{}", clip(key)), "unknown field, ignored"));
    }
    let mode = match obj.get("mode") {
        None | Some(Value::Null) => Some(WatchMode::All),
        Some(Value::String(m)) => WatchMode::parse(m).or_else(|| {
            errors.push(FieldError::new(
                format!("{FIELD}.mode"),
                format!("unknown mode {:?} (expected all or referenced)", clip(m)),
            ));
            None
        }),
        Some(_) => {
            errors.push(FieldError::new(format!("{FIELD}.mode"), "must be a string: all or referenced"));
            None
        }
    };
    let mut include = Vec::new();
    match obj.get("include") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let field = format!("{FIELD}.include[{i}]");
                match item.as_str() {
                    Some("") => errors.push(FieldError::new(field, "must not be empty")),
                    Some(p) if p.len() > MAX_PATTERN => {
                        errors.push(FieldError::new(field, format!("longer than {MAX_PATTERN} bytes")));
                    }
                    Some(p) => include.push(p.to_string()),
                    None => errors.push(FieldError::new(field, "must be a string (a regular expression)")),
                }
            }
        }
        Some(_) => errors.push(FieldError::new(format!("{FIELD}.include"), "must be a list of regular expressions")),
    }
    if let Err((i, reason)) = compile_include(&include) {
        // The compiler's message spans lines and ends with the cause.
        let cause = reason.lines().map(str::trim).rfind(|l| !l.is_empty()).unwrap_or("invalid regular expression");
        let cause = cause.strip_prefix("error: ").unwrap_or(cause);
        errors.push(FieldError::new(format!("{FIELD}.include[{i}]"), clip(cause).into_owned()));
    }
    if matches!(kind, Some(RegistryKind::Static | RegistryKind::Dns)) {
        warnings.push(FieldError::new(FIELD, "ignored: static and dns registries list their services themselves"));
    }
    Some(WatchSpec { mode: mode?, include })
}

/// `meshbridgeMigration: {weight: 0..=100, priority: 0..=100}`, both
/// optional. `null` is unset.
fn migration(raw: &Value, errors: &mut Vec<FieldError>, warnings: &mut Vec<FieldError>) -> Migration {
    const FIELD: &str = "meshbridgeMigration";
    let obj = match raw {
        Value::Null => return Migration::default(),
        Value::Object(obj) => obj,
        _ => {
            errors.push(FieldError::new(FIELD, "must be an object with weight and priority"));
            return Migration::default();
        }
    };
    for key in obj.keys().filter(|k| !["weight", "priority"].contains(&k.as_str())) {
        warnings.push(FieldError::new(format!("{FIELD}.{}", clip(key)), "unknown field, ignored"));
    }
    let mut number = |name: &str| -> Option<u32> {
        let value = obj.get(name).filter(|v| !v.is_null())?;
        match value.as_u64().filter(|n| *n <= u64::from(MIGRATION_MAX)) {
            Some(n) => u32::try_from(n).ok(),
            None => {
                let shown = clip(&value.to_string()).into_owned();
                errors.push(FieldError::new(
                    format!("{FIELD}.{name}"),
                    format!("{shown} is not a whole number from 0 to {MIGRATION_MAX}"),
                ));
                None
            }
        }
    };
    let weight = number("weight");
    let priority = number("priority").unwrap_or_default();
    Migration { weight, priority }
}

/// The longest `meshbridgeWatch.include` pattern accepted.
const MAX_PATTERN: usize = 1024;

/// Check `domain` and `port` the way each registry type uses them; returns
/// the port to use. Higress's `static` registry reads endpoint `ip:port`s
/// from `domain` and uses `port` only as the service port (its console
/// always writes 80); `dns` resolves each host in `domain` on `port`.
fn check_address(kind: RegistryKind, cfg: &RegistryConfig, errors: &mut Vec<FieldError>) -> Option<u16> {
    let domain = cfg.domain.trim();
    match kind {
        RegistryKind::Static => {
            if domain.is_empty() {
                errors.push(FieldError::new("domain", "required"));
            }
            for ep in domain.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                if !ep.parse::<SocketAddr>().is_ok_and(|a| a.port() != 0) {
                    errors.push(FieldError::new("domain", format!("{:?} is not an IP:port endpoint", clip(ep))));
                }
            }
            if cfg.port == 0 { Some(STATIC_DEFAULT_PORT) } else { port_in_range("port", cfg.port, errors) }
        }
        RegistryKind::Dns => {
            if domain.is_empty() {
                errors.push(FieldError::new("domain", "required"));
            }
            for host in domain.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                if !is_dns_name(host) {
                    errors.push(FieldError::new("domain", format!("{:?} is not a DNS name", clip(host))));
                }
            }
            port_in_range("port", cfg.port, errors)
        }
        // Higress passes nacosAddressServer only to its nacos2 and nacos3
        // watchers; the address server then supplies the servers' addresses.
        RegistryKind::Nacos2 | RegistryKind::Nacos3 if domain.is_empty() => {
            if cfg.nacos_address_server.is_empty() {
                errors.push(FieldError::new("domain", "required (or nacosAddressServer)"));
                None
            } else if cfg.port == 0 {
                Some(0)
            } else {
                port_in_range("port", cfg.port, errors)
            }
        }
        _ => {
            if domain.is_empty() {
                errors.push(FieldError::new("domain", "required"));
            } else {
                check_hosts(kind, domain, errors);
            }
            port_in_range("port", cfg.port, errors)
        }
    }
}

/// A Consul, Nacos, ZooKeeper or Eureka `domain` must be what its watcher
/// can connect to; checked here so that a bad one is a field error and the
/// running watcher keeps its last good spec (the watcher itself would only
/// fail after the old one was stopped). Consul takes one host; ZooKeeper a
/// comma list of hosts (the port is `port`); Nacos and Eureka a comma list
/// of `host` or `host:port`. A host is an IP (IPv6 optionally bracketed) or
/// a DNS name (underscores allowed, as Docker names have them).
fn check_hosts(kind: RegistryKind, domain: &str, errors: &mut Vec<FieldError>) {
    let (list, with_port) = match kind {
        RegistryKind::Consul => (false, false),
        RegistryKind::Zookeeper => (true, false),
        _ => (true, true),
    };
    let items: Vec<&str> = domain.split(',').map(str::trim).filter(|h| !h.is_empty()).collect();
    if !list && domain.contains(',') {
        errors.push(FieldError::new("domain", format!("{:?}: one host expected, not a list", clip(domain))));
        return;
    }
    if items.is_empty() {
        errors.push(FieldError::new("domain", format!("{:?} names no host", clip(domain))));
    }
    for item in items {
        let ok = if with_port { is_host_port(item) } else { is_host(item) };
        if !ok {
            let expected =
                if with_port { "a host or host:port" } else { "a host name or IP (the port goes in `port`)" };
            errors.push(FieldError::new("domain", format!("{:?} is not {expected}", clip(item))));
        }
    }
}

/// An IP address (IPv6 optionally in brackets) or a host name.
fn is_host(s: &str) -> bool {
    let bare = s.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
    if let Some(v6) = bare {
        return v6.parse::<std::net::Ipv6Addr>().is_ok();
    }
    s.parse::<std::net::IpAddr>().is_ok() || (is_dns_name(&s.replace('_', "-")) && !all_numeric_labels(s))
}

/// [`is_host`], optionally followed by `:port` (1..65535).
fn is_host_port(s: &str) -> bool {
    if is_host(s) {
        return true;
    }
    let Some((host, port)) = s.rsplit_once(':') else { return false };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    // An unbracketed IPv6 address has colons of its own: it cannot take a port.
    port_ok && (host.starts_with('[') || !host.contains(':')) && is_host(host)
}

/// Validate one proxy entry.
pub(crate) fn proxy(raw: &Value, warnings: &mut Vec<FieldError>) -> Result<ProxySpec, Vec<FieldError>> {
    let cfg: ProxyConfig = typed(raw, PROXY_FIELDS, &[], warnings)?;
    let mut errors = Vec::new();
    match cfg.kind.as_str() {
        "" => errors.push(FieldError::new("type", "required")),
        "http" => {}
        other => errors.push(FieldError::new("type", format!("unknown proxy type {:?} (expected http)", clip(other)))),
    }
    check_name(&cfg.name, &mut errors);
    let server_address = cfg.server_address.trim();
    if server_address.is_empty() {
        errors.push(FieldError::new("serverAddress", "required"));
    } else if server_address.parse::<std::net::IpAddr>().is_err()
        && (!is_dns_name(server_address) || all_numeric_labels(server_address))
    {
        // Envoy takes an IP (a STATIC cluster) or a name it resolves itself
        // (STRICT_DNS); a URL or `host:port` here is a common slip.
        errors.push(FieldError::new(
            "serverAddress",
            format!("{:?} is not an IP address or DNS name (the port goes in serverPort)", clip(server_address)),
        ));
    }
    let server_port = port_in_range("serverPort", cfg.server_port, &mut errors);
    let listener_port = match cfg.listener_port {
        0 => None,
        p => port_in_range("listenerPort", p, &mut errors),
    };
    match server_port {
        Some(server_port) if errors.is_empty() => Ok(ProxySpec {
            name: cfg.name,
            server_address: server_address.to_owned(),
            server_port,
            listener_port,
            connect_timeout: (cfg.connect_timeout > 0).then(|| Duration::from_millis(cfg.connect_timeout.into())),
        }),
        _ => Err(errors),
    }
}

/// Deserialize an entry into `T` with field paths in errors, after warning
/// about fields we do not read. Nulls are dropped first: in protobuf JSON a
/// null field is an unset one.
fn typed<T: DeserializeOwned>(
    raw: &Value,
    known: &[&str],
    ignored: &[&str],
    warnings: &mut Vec<FieldError>,
) -> Result<T, Vec<FieldError>> {
    let Value::Object(map) = raw else {
        return Err(vec![FieldError::new("", "must be a mapping")]);
    };
    let map: Map<String, Value> =
        map.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    for key in map.keys() {
        if ignored.contains(&key.as_str()) {
            warnings.push(FieldError::new(key, "MCP server fields are not supported, ignored"));
        } else if !known.contains(&key.as_str()) {
            warnings.push(FieldError::new(key, "unknown field, ignored"));
        }
    }
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        vec![FieldError::new(field, e.into_inner().to_string())]
    })
}

fn check_name(name: &str, errors: &mut Vec<FieldError>) {
    if name.is_empty() {
        errors.push(FieldError::new("name", "required"));
    } else if !is_dns_label(name) {
        errors.push(FieldError::new(
            "name",
            format!(
                "{:?} is not a DNS label (lowercase letters, digits and '-', \
                 starting and ending with a letter or digit, at most 63 characters)",
                clip(name)
            ),
        ));
    }
}

fn port_in_range(field: &str, port: u32, errors: &mut Vec<FieldError>) -> Option<u16> {
    match u16::try_from(port) {
        Ok(p) if p != 0 => Some(p),
        _ => {
            errors.push(FieldError::new(field, "must be 1..65535"));
            None
        }
    }
}

/// An `int64` nanosecond interval: 0 is unset; anything else below `floor`
/// (negative included) is raised to it, as Higress's `WithRefreshInterval`
/// does, with a warning.
fn interval(field: &str, nanos: i64, floor: Duration, warnings: &mut Vec<FieldError>) -> Option<Duration> {
    if nanos == 0 {
        return None;
    }
    let d = u64::try_from(nanos).map(Duration::from_nanos).unwrap_or_default();
    if d >= floor {
        return Some(d);
    }
    warnings.push(FieldError::new(
        field,
        format!("{nanos}ns is below the minimum of {floor:?}, using {floor:?} (the value is in nanoseconds)"),
    ));
    Some(floor)
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// RFC 1123 label, as Kubernetes checks object names.
pub(crate) fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty() && b.len() <= 63 && b.iter().all(|c| ok(c) || *c == b'-') && ok(&b[0]) && ok(&b[b.len() - 1])
}

/// `10.0.0.300`: meant as an IPv4 address, and not a valid one.
fn all_numeric_labels(s: &str) -> bool {
    s.split('.').all(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

/// A host name: dot-separated labels of letters, digits and '-'.
fn is_dns_name(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}
