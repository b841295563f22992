//! A `networking.k8s.io/v1` Ingress, reduced to what the translation reads,
//! parsed once where it comes in: from a file's YAML (through its JSON form)
//! or from the API server's typed object. The `higress.io/destination`
//! annotation and `metadata.creationTimestamp` are parsed here too, so the
//! translator and the reconciler read types and never JSON.
//!
//! Reading JSON is lenient, as a hand-written file needs: unknown fields
//! are ignored, `null` reads as empty (YAML `tls:` with nothing after it)
//! and a scalar annotation value reads as its text, so only a field of the
//! wrong type makes an Ingress unreadable.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1 as k8s;
use k8s_openapi::jiff::Timestamp;
use meshbridge_registries::clip;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// The legacy class annotation, still honoured before `spec.ingressClassName`
/// (as Higress and ingress-nginx do).
pub const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// Higress's annotation routing an McpBridge backend to registry services.
pub const DESTINATION: &str = "higress.io/destination";

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Ingress {
    pub metadata: Metadata,
    pub spec: Spec,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Metadata {
    #[serde(deserialize_with = "annotations")]
    annotations: BTreeMap<String, String>,
    /// `metadata.creationTimestamp` as written, until [`parse`] reads it
    /// into `created`: the two sources then compare equal.
    creation_timestamp: Option<String>,
    /// Set by [`parse`] and the `From` of the API's object.
    #[serde(skip)]
    created: Option<Result<Timestamp, BadTimestamp>>,
    /// `higress.io/destination`, parsed; `None` when absent.
    #[serde(skip)]
    destination: Option<Result<Vec<McpDestination>, DestinationError>>,
}

impl Metadata {
    /// An annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    pub fn annotation_keys(&self) -> impl Iterator<Item = &str> {
        self.annotations.keys().map(String::as_str)
    }

    /// `metadata.creationTimestamp`: `None` when absent, `Err` when it is
    /// not an RFC 3339 time.
    pub fn created(&self) -> Option<Result<Timestamp, &BadTimestamp>> {
        self.created.as_ref().map(|r| r.as_ref().copied())
    }

    /// `higress.io/destination`, parsed; `None` when absent.
    pub fn destination(&self) -> Option<&Result<Vec<McpDestination>, DestinationError>> {
        self.destination.as_ref()
    }

    /// Fill the parsed fields from the raw ones.
    fn finish(&mut self) {
        self.created = self.creation_timestamp.take().map(|ts| match ts.parse::<Timestamp>() {
            Ok(t) if is_rfc3339(&ts) => Ok(t),
            _ => Err(BadTimestamp(clip(&ts).into_owned())),
        });
        self.destination = self.annotations.get(DESTINATION).map(|v| parse_destination(v));
    }
}

/// A `metadata.creationTimestamp` that is not an RFC 3339 time (clipped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata.creationTimestamp {0:?} is not an RFC 3339 time")]
pub struct BadTimestamp(pub String);

/// jiff also reads ISO 8601 forms RFC 3339 does not allow (a basic offset
/// such as `+0200`, a bracketed zone); Kubernetes writes only RFC 3339.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    let tail_ok = match b.last() {
        Some(b'Z' | b'z') => true,
        _ => b.len() >= 6 && matches!(b[b.len() - 6], b'+' | b'-') && b[b.len() - 3] == b':',
    };
    b.len() >= 20 && b[..19].is_ascii() && tail_ok && !s.contains('[')
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Spec {
    pub ingress_class_name: Option<String>,
    pub default_backend: Option<Backend>,
    #[serde(deserialize_with = "nullable")]
    pub tls: Vec<Tls>,
    #[serde(deserialize_with = "nullable")]
    pub rules: Vec<Rule>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Tls {
    #[serde(deserialize_with = "nullable")]
    pub hosts: Vec<String>,
    pub secret_name: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Rule {
    pub host: Option<String>,
    pub http: Option<HttpRuleValue>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct HttpRuleValue {
    #[serde(deserialize_with = "nullable")]
    pub paths: Vec<HttpPath>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpPath {
    pub path: Option<String>,
    pub path_type: Option<String>,
    pub backend: Backend,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct Backend {
    pub service: Option<ServiceBackend>,
    pub resource: Option<ResourceBackend>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServiceBackend {
    pub name: String,
    pub port: ServiceBackendPort,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ServiceBackendPort {
    /// Wide, so that an out-of-range number is reported as such rather than
    /// as a type error.
    pub number: Option<i64>,
    pub name: Option<String>,
}

/// A `TypedLocalObjectReference`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceBackend {
    pub api_group: Option<String>,
    pub kind: String,
    pub name: String,
}

impl ResourceBackend {
    /// Higress's check (`common.ValidateBackendResource`): only the McpBridge
    /// named `default` of `networking.higress.io` routes to registry services.
    pub fn is_mcp_bridge(&self) -> bool {
        self.api_group.as_deref() == Some("networking.higress.io") && self.kind == "McpBridge" && self.name == "default"
    }
}

/// An Ingress object that does not have the shape of one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{reason}", field_prefix(.path))]
pub struct InvalidIngress {
    /// The field that does not fit (`.` for the object itself).
    pub path: String,
    pub reason: String,
}

fn field_prefix(path: &str) -> String {
    if path == "." { String::new() } else { format!("{path}: ") }
}

/// Read an Ingress from its JSON form; the error names the field that does
/// not fit.
pub fn parse(object: &Value) -> Result<Ingress, InvalidIngress> {
    let mut ingress: Ingress = serde_path_to_error::deserialize(object).map_err(|e| {
        let path = e.path().to_string();
        InvalidIngress { path, reason: e.into_inner().to_string() }
    })?;
    ingress.metadata.finish();
    Ok(ingress)
}

/// The API server's typed object: no JSON on the way. `class` replaces
/// `spec.ingressClassName` when given (what the DefaultIngressClass
/// admission does to new Ingresses).
pub fn from_api(ing: &k8s::Ingress, class: Option<&str>) -> Ingress {
    let spec = ing.spec.as_ref();
    let mut metadata = Metadata {
        annotations: ing.metadata.annotations.clone().unwrap_or_default(),
        creation_timestamp: None,
        created: ing.metadata.creation_timestamp.as_ref().map(|t| Ok(t.0)),
        destination: None,
    };
    metadata.destination = metadata.annotations.get(DESTINATION).map(|v| parse_destination(v));
    Ingress {
        metadata,
        spec: Spec {
            ingress_class_name: class.map(str::to_owned).or_else(|| spec.and_then(|s| s.ingress_class_name.clone())),
            default_backend: spec.and_then(|s| s.default_backend.as_ref()).map(backend),
            tls: spec
                .and_then(|s| s.tls.as_ref())
                .into_iter()
                .flatten()
                .map(|t| Tls { hosts: t.hosts.clone().unwrap_or_default(), secret_name: t.secret_name.clone() })
                .collect(),
            rules: spec
                .and_then(|s| s.rules.as_ref())
                .into_iter()
                .flatten()
                .map(|r| Rule {
                    host: r.host.clone(),
                    http: r.http.as_ref().map(|h| HttpRuleValue {
                        paths: h
                            .paths
                            .iter()
                            .map(|p| HttpPath {
                                path: p.path.clone(),
                                path_type: Some(p.path_type.clone()),
                                backend: backend(&p.backend),
                            })
                            .collect(),
                    }),
                })
                .collect(),
        },
    }
}

fn backend(b: &k8s::IngressBackend) -> Backend {
    Backend {
        service: b.service.as_ref().map(|s| ServiceBackend {
            name: s.name.clone(),
            port: ServiceBackendPort {
                number: s.port.as_ref().and_then(|p| p.number).map(i64::from),
                name: s.port.as_ref().and_then(|p| p.name.clone()),
            },
        }),
        resource: b.resource.as_ref().map(|r| ResourceBackend {
            api_group: r.api_group.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
        }),
    }
}

fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Annotation values as text. Kubernetes only allows strings, but a
/// hand-written file may say `ignore-path-case: true` unquoted; `null`
/// reads as empty.
fn annotations<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let raw: Option<BTreeMap<String, Value>> = Option::deserialize(d)?;
    Ok(raw
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s,
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (k, text)
        })
        .collect())
}

// ---- mirror-target-service ------------------------------------------------

/// Where `mirror-target-service` sends copies, before the host is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MirrorTarget {
    /// A Kubernetes Service: `name.namespace.svc.cluster.local`, in the
    /// Ingress's namespace when none is given.
    Service { namespace: Option<String>, name: String, port: Option<u16> },
    /// A registry service, by the name `higress.io/destination` uses.
    Registry { name: String, port: Option<u16> },
    /// `mirror-target-fqdn`: the host as written.
    Fqdn { host: String, port: u16 },
}

/// Why a `mirror-target-service` value was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("{0:?} has no port 1 to 65535 after ':'")]
    Port(String),
    #[error("{0:?} is not [namespace/]service[:port] nor a registry service")]
    Form(String),
}

/// `[namespace/]name[:port]`.
pub fn service_target(v: &str) -> Result<MirrorTarget, TargetError> {
    let (rest, port) = match v.rsplit_once(':') {
        Some((rest, p)) => match port(p) {
            Some(n) => (rest, Some(n)),
            None => return Err(TargetError::Port(clip(v).into_owned())),
        },
        None => (v, None),
    };
    match rest.split_once('/') {
        Some((ns, name)) if valid_dns_label(ns) && valid_dns_label(name) => {
            Ok(MirrorTarget::Service { namespace: Some(ns.to_owned()), name: name.to_owned(), port })
        }
        None if valid_dns_label(rest) => Ok(MirrorTarget::Service { namespace: None, name: rest.to_owned(), port }),
        None if rest.contains('.') && rest.split('.').all(|l| !l.is_empty()) && !rest.contains(char::is_whitespace) => {
            Ok(MirrorTarget::Registry { name: rest.to_owned(), port })
        }
        _ => Err(TargetError::Form(clip(v).into_owned())),
    }
}

pub(crate) fn port(p: &str) -> Option<u16> {
    let p = p.trim();
    p.parse::<u16>().ok().filter(|n| *n > 0 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The keys a mirror target is read under, as Higress reads them
/// (`higress.io/` first).
const MIRROR_TARGET_SERVICE_KEYS: [&str; 2] =
    ["higress.io/mirror-target-service", "nginx.ingress.kubernetes.io/mirror-target-service"];
const MIRROR_TARGET_FQDN_KEYS: [&str; 2] =
    ["higress.io/mirror-target-fqdn", "nginx.ingress.kubernetes.io/mirror-target-fqdn"];
/// `default-backend`, read the same way and in the same form.
pub const DEFAULT_BACKEND_KEYS: [&str; 2] =
    ["higress.io/default-backend", "nginx.ingress.kubernetes.io/default-backend"];

impl Metadata {
    /// The services the annotations name besides the backends, as the
    /// translation reads them: the mirror target (unless
    /// `mirror-target-fqdn` wins) and the `default-backend`.
    fn annotated_services(&self) -> impl Iterator<Item = MirrorTarget> + '_ {
        let set = |keys: [&str; 2]| keys.iter().find_map(|k| self.annotation(k).filter(|v| !v.trim().is_empty()));
        let mirror = set(MIRROR_TARGET_FQDN_KEYS).is_none().then(|| set(MIRROR_TARGET_SERVICE_KEYS)).flatten();
        [mirror, set(DEFAULT_BACKEND_KEYS)].into_iter().flatten().filter_map(|v| service_target(v.trim()).ok())
    }

    /// The Kubernetes Services those annotations name, as
    /// `(namespace, name)` (`namespace`: the Ingress's when none is given).
    pub fn annotated_kubernetes_services(&self, ingress_namespace: &str) -> Vec<(String, String)> {
        self.annotated_services()
            .filter_map(|t| match t {
                MirrorTarget::Service { namespace, name, .. } => {
                    Some((namespace.unwrap_or_else(|| ingress_namespace.to_owned()), name))
                }
                _ => None,
            })
            .collect()
    }

    /// The registry services those annotations name: hosts the watchers
    /// must read under `meshbridgeWatch: {mode: referenced}`, as a
    /// destination's are.
    pub fn annotated_registry_services(&self) -> Vec<String> {
        self.annotated_services()
            .filter_map(|t| match t {
                MirrorTarget::Registry { name, .. } => Some(name),
                _ => None,
            })
            .collect()
    }
}

// ---- proxy-ssl-secret ------------------------------------------------------

/// The keys `proxy-ssl-secret` is read under, as Higress reads it
/// (`higress.io/` first).
pub const PROXY_SSL_SECRET_KEYS: [&str; 2] =
    ["higress.io/proxy-ssl-secret", "nginx.ingress.kubernetes.io/proxy-ssl-secret"];

/// The keys `auth-tls-secret` (the CA client certificates are verified
/// against) is read under, `higress.io/` first as every key here.
pub const AUTH_TLS_SECRET_KEYS: [&str; 2] =
    ["higress.io/auth-tls-secret", "nginx.ingress.kubernetes.io/auth-tls-secret"];

/// Why a `proxy-ssl-secret` or `auth-tls-secret` value names no Secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretNameError {
    /// Not `[namespace/]name` with a DNS-1123 label and subdomain (shown
    /// clipped).
    #[error("{0:?} is not [namespace/]name of a Secret")]
    Form(String),
}

/// `proxy-ssl-secret`'s and `auth-tls-secret`'s `[namespace/]name` (Higress's
/// `util.SplitNamespacedName`), as `(namespace, name)`: the Ingress's
/// namespace when none is given.
pub fn secret_ref(value: &str, ingress_namespace: &str) -> Result<(String, String), SecretNameError> {
    let v = value.trim();
    let (ns, name) = v.split_once('/').unwrap_or((ingress_namespace, v));
    if valid_dns_label(ns) && meshbridge_registries::names::is_dns1123_subdomain(name) {
        Ok((ns.to_owned(), name.to_owned()))
    } else {
        Err(SecretNameError::Form(clip(value).into_owned()))
    }
}

impl Metadata {
    /// The Secret `proxy-ssl-secret` names, when it names one.
    pub fn proxy_ssl_secret(&self, ingress_namespace: &str) -> Option<(String, String)> {
        let v = PROXY_SSL_SECRET_KEYS.iter().find_map(|k| self.annotation(k))?;
        secret_ref(v, ingress_namespace).ok()
    }
}

// ---- higress.io/destination ------------------------------------------------

/// One line of `higress.io/destination`: `[NN%] host[:port] [subset]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpDestination {
    pub weight: u32,
    pub host: String,
    pub port: Option<u16>,
    pub subset: Option<String>,
}

/// Why a `higress.io/destination` value was rejected. `line` is 1-based and
/// counts blank lines, so it points into the value as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    /// No destination line at all.
    #[error("no destination given")]
    Empty,
    /// The weight before `%` is not a whole number from 0 to 100.
    #[error("line {line}: weight {weight:?} is not a percentage from 0 to 100")]
    BadWeight { line: usize, weight: String },
    /// A weight with nothing after it.
    #[error("line {line}: no host after the weight")]
    NoHost { line: usize },
    /// The host is empty or has characters no registry host has.
    #[error("line {line}: host {host:?} is not a valid host name")]
    BadHost { line: usize, host: String },
    /// The text after the last `:` is not a port from 1 to 65535.
    #[error("line {line}: port {port:?} is not a number from 1 to 65535")]
    BadPort { line: usize, port: String },
    /// The subset is not a DNS label (what Istio requires of subset names).
    #[error("line {line}: subset {subset:?} is not a valid subset name (lowercase letters, digits and '-')")]
    BadSubset { line: usize, subset: String },
    /// More than `[NN%] host[:port] [subset]` on one line.
    #[error("line {line}: unexpected {extra:?} after the subset")]
    Extra { line: usize, extra: String },
    /// The weights do not add up to 100.
    #[error("weights add up to {sum}, not 100")]
    WeightSum { sum: u64 },
}

/// Parse `higress.io/destination`: one destination per line,
/// `[NN%] host[:port] [subset]` (Higress's format, e.g.
/// `80% orders.DEFAULT-GROUP.public.nacos:8080 v1`). Blank lines are
/// skipped; a line without a weight weighs 100, so the weights must add up
/// to 100. Stricter than Higress, which takes `host:junk` as a host name,
/// ignores extra words and only logs a bad weight sum.
pub fn parse_destination(value: &str) -> Result<Vec<McpDestination>, DestinationError> {
    let mut out = Vec::new();
    let mut sum: u64 = 0;
    for (i, text) in value.lines().enumerate() {
        let line = i + 1;
        let mut words = text.split_whitespace().peekable();
        let Some(first) = words.peek().copied() else { continue };
        let weight = match first.strip_suffix('%') {
            Some(w) => {
                words.next();
                match w.parse::<u32>() {
                    Ok(w) if w <= 100 && !has_sign(first) => w,
                    _ => return Err(DestinationError::BadWeight { line, weight: clip(first).into_owned() }),
                }
            }
            None => 100,
        };
        let address = words.next().ok_or(DestinationError::NoHost { line })?;
        let (host, port) = match address.rsplit_once(':') {
            Some((host, port)) => {
                let number = port.parse::<u16>().ok().filter(|p| *p != 0 && !has_sign(port));
                let number = number.ok_or_else(|| DestinationError::BadPort { line, port: clip(port).into_owned() })?;
                (host, Some(number))
            }
            None => (address, None),
        };
        if !valid_registry_host(host) {
            return Err(DestinationError::BadHost { line, host: clip(host).into_owned() });
        }
        let subset = match words.next() {
            Some(s) if valid_dns_label(s) => Some(s.to_owned()),
            Some(s) => return Err(DestinationError::BadSubset { line, subset: clip(s).into_owned() }),
            None => None,
        };
        if let Some(extra) = words.next() {
            return Err(DestinationError::Extra { line, extra: clip(extra).into_owned() });
        }
        sum += u64::from(weight);
        out.push(McpDestination { weight, host: host.to_owned(), port, subset });
    }
    if out.is_empty() {
        return Err(DestinationError::Empty);
    }
    if sum != 100 {
        return Err(DestinationError::WeightSum { sum });
    }
    Ok(out)
}

/// Rust's integer parsers accept a leading `+`; a weight or port never has one.
pub(crate) fn has_sign(s: &str) -> bool {
    s.starts_with('+')
}

/// Registry hosts keep the registry's spelling (`orders.DEFAULT-GROUP.public.nacos`,
/// `DEFAULT_GROUP`), so case and `_` are allowed; anything that could not be
/// a host name is not.
fn valid_registry_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && !host.starts_with('.')
        && !host.ends_with('.')
        && !host.contains("..")
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// RFC 1123 label: what Istio requires of subset names.
pub use meshbridge_registries::names::is_dns1123_label as valid_dns_label;

#[cfg(test)]
#[path = "ingress_tests.rs"]
mod tests;
