//! Documents to [`Desired`]: validate every entry, resolve auth Secrets and
//! proxy references, reject duplicates, and fall back to an entry's last good
//! spec when its new version is invalid. No I/O besides logging.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use meshbridge_registries::{RegistryKind, RegistrySpec};
use tracing::warn;

use super::model::{Document, McpBridgeDoc, SecretDoc};
use super::types::{CaSecret, Desired, ProxySpec, TlsSecret};
use super::validate::{self, CheckedRegistry, FieldError, MIN_REFRESH_INTERVAL};

/// (McpBridge `namespace/name`, entry name): what "the same registry" (or
/// proxy) means from one build to the next.
type EntryKey = (String, String);

const KEEPING: &str = " (keeping last good config)";

/// Builds [`Desired`] from documents and remembers, per (McpBridge, name),
/// the last registry and proxy spec that validated, so that a later invalid
/// edit keeps the working one in force.
#[derive(Debug, Default)]
pub struct Builder {
    /// Floor for refresh intervals; `None` is [`MIN_REFRESH_INTERVAL`].
    min_refresh: Option<Duration>,
    /// `--consul-max-conns`: every Consul registry's connection cap.
    consul_max_conns: Option<usize>,
    /// `--anti-entropy-interval`: every registry's anti-entropy interval.
    anti_entropy_interval: Option<Duration>,
    /// A list: one McpBridge may use a name for registries of several types.
    registries: HashMap<EntryKey, Vec<RegistrySpec>>,
    proxies: HashMap<EntryKey, ProxySpec>,
}

/// What one build produced, with the warnings `build` logs.
#[derive(Debug, Default)]
pub(crate) struct Built {
    pub desired: Desired,
    pub warnings: Vec<String>,
}

impl Builder {
    /// A builder that raises refresh intervals to `floor` instead of
    /// Higress's 10 s (`--min-refresh-interval`, for tests).
    pub fn with_min_refresh_interval(floor: Duration) -> Builder {
        Builder { min_refresh: Some(floor), ..Builder::default() }
    }

    /// Cap every Consul registry's connections at `n` (`--consul-max-conns`).
    pub fn with_consul_max_conns(self, n: Option<usize>) -> Builder {
        Builder { consul_max_conns: n, ..self }
    }

    /// Run every registry's anti-entropy pass at this interval
    /// (`--anti-entropy-interval`).
    pub fn with_anti_entropy_interval(self, interval: Option<Duration>) -> Builder {
        Builder { anti_entropy_interval: interval, ..self }
    }

    /// Build from documents in source order ("later" in duplicate errors
    /// means later in this order).
    pub fn build<'a>(&mut self, docs: impl IntoIterator<Item = &'a Document>) -> Desired {
        self.build_reporting(docs).desired
    }

    /// As [`Builder::build`], keeping the warnings it logged beside the
    /// result (`meshbridge check` prints them).
    pub(crate) fn build_reporting<'a>(&mut self, docs: impl IntoIterator<Item = &'a Document>) -> Built {
        let mut built = self.build_full(docs);
        for r in built.desired.registries.iter_mut().filter(|r| r.kind == RegistryKind::Consul) {
            r.consul_max_conns = r.consul_max_conns.or(self.consul_max_conns);
        }
        for r in &mut built.desired.registries {
            r.anti_entropy_interval = r.anti_entropy_interval.or(self.anti_entropy_interval);
        }
        for w in &built.warnings {
            warn!(warning = %w, "config");
        }
        built
    }

    pub(crate) fn build_full<'a>(&mut self, docs: impl IntoIterator<Item = &'a Document>) -> Built {
        let mut run = Run::default();
        let mut bridges: Vec<&McpBridgeDoc> = Vec::new();
        let mut secrets: HashMap<&str, Vec<&SecretDoc>> = HashMap::new();
        let mut seen_objects = HashSet::new();
        for doc in docs {
            let (kind, ns, name) = match doc {
                Document::McpBridge(b) => ("McpBridge", &b.namespace, &b.name),
                Document::Secret(s) => ("Secret", &s.namespace, &s.name),
                Document::Ingress(i) => ("Ingress", &i.namespace, &i.name),
            };
            if !seen_objects.insert((kind, ns, name)) {
                run.errors.push(format!("{kind} {ns}/{name}: defined more than once, ignoring all but the first"));
                continue;
            }
            match doc {
                Document::McpBridge(b) => bridges.push(b),
                Document::Secret(s) => {
                    if let (Some(crt), Some(key)) = (s.data.get("tls.crt"), s.data.get("tls.key")) {
                        run.desired.tls_secrets.push(TlsSecret {
                            namespace: s.namespace.clone(),
                            name: s.name.clone(),
                            cert_chain_pem: crt.expose().to_string(),
                            private_key_pem: key.clone(),
                            ca_cert_pem: s.data.get("ca.crt").map(|ca| ca.expose().to_string()),
                        });
                    }
                    // Istio's order: `cacert` first, then `ca.crt`.
                    if let Some(ca) = ["cacert", "ca.crt"].iter().find_map(|k| s.data.get(*k)) {
                        run.desired.ca_secrets.push(CaSecret {
                            namespace: s.namespace.clone(),
                            name: s.name.clone(),
                            ca_cert_pem: ca.expose().to_string(),
                        });
                    }
                    secrets.entry(s.name.as_str()).or_default().push(s)
                }
                Document::Ingress(i) => run.desired.ingresses.push(i.clone()),
            }
        }

        let mut next = Builder {
            min_refresh: self.min_refresh,
            consul_max_conns: self.consul_max_conns,
            anti_entropy_interval: self.anti_entropy_interval,
            ..Builder::default()
        };
        let min_refresh = self.min_refresh.unwrap_or(MIN_REFRESH_INTERVAL);
        let mut registry_owner: HashMap<(RegistryKind, String), (String, String)> = HashMap::new();
        let mut proxy_owner: HashMap<String, String> = HashMap::new();
        // Explicit listener ports across every McpBridge: the proxies share
        // one Envoy, so two cannot listen on the same port.
        let mut port_owner: HashMap<u16, String> = HashMap::new();
        for bridge in bridges {
            let id = bridge.id();
            let object = format!("McpBridge {id}");

            // Proxies first: registries may name them. A proxy left out
            // (invalid with no last good spec, duplicate, port clash) is in
            // `bridge_rejected`, so its registries can say why they go direct.
            let mut bridge_proxies = HashSet::new();
            let mut bridge_rejected = HashSet::new();
            for (i, raw) in bridge.proxies.iter().enumerate() {
                let at = format!("spec.proxies[{i}]");
                let mut warnings = Vec::new();
                let checked = validate::proxy(&raw.0, &mut warnings);
                run.warn(&object, &at, warnings);
                let key_name = checked.as_ref().map(|p| p.name.clone()).ok().or_else(|| entry_name(&raw.0));
                let key = key_name.map(|n| (id.clone(), n));
                let spec = match checked {
                    Ok(spec) => spec,
                    Err(errors) => {
                        let kept = key.as_ref().and_then(|k| self.proxies.get(k)).cloned();
                        run.reject(&object, &at, errors, kept.is_some());
                        let Some(kept) = kept else {
                            bridge_rejected.extend(key.map(|(_, name)| name));
                            continue;
                        };
                        kept
                    }
                };
                if let Some(owner) = proxy_owner.get(&spec.name) {
                    run.errors.push(format!(
                        "{object}: {at}.name: duplicate proxy {:?} (already defined by {owner})",
                        spec.name
                    ));
                    continue;
                }
                if let Some(port) = spec.listener_port {
                    if let Some(owner) = port_owner.get(&port) {
                        run.errors.push(format!("{object}: {at}.listenerPort: {port} already used by {owner}"));
                        bridge_rejected.insert(spec.name.clone());
                        continue;
                    }
                    port_owner.insert(port, format!("proxy {:?}", spec.name));
                }
                proxy_owner.insert(spec.name.clone(), format!("{object} {at}"));
                bridge_proxies.insert(spec.name.clone());
                if let Some(key) = key {
                    next.proxies.insert(key, spec.clone());
                }
                run.desired.proxies.push(spec);
            }

            for (i, raw) in bridge.registries.iter().enumerate() {
                let at = format!("spec.registries[{i}]");
                let mut warnings = Vec::new();
                let checked = validate::registry(&raw.0, min_refresh, &mut warnings)
                    .and_then(|c| resolve(c, bridge, &secrets))
                    .map(|spec| check_proxy(spec, &bridge_proxies, &bridge_rejected, &mut run, &object, &at));
                run.warn(&object, &at, warnings);
                let key_name = checked.as_ref().map(|s| s.name.clone()).ok().or_else(|| entry_name(&raw.0));
                let key = key_name.map(|n| (id.clone(), n));
                let spec = match checked {
                    Ok(spec) => {
                        run.warn(&object, &at, plain_credentials(&spec).into_iter().collect());
                        spec
                    }
                    Err(errors) => {
                        let kept = key.as_ref().and_then(|k| self.last_good_registry(k, &raw.0));
                        run.reject(&object, &at, errors, kept.is_some());
                        let Some(kept) = kept else { continue };
                        kept
                    }
                };
                let owner_key = (spec.kind, spec.name.clone());
                if let Some((owner_object, owner_at)) = registry_owner.get(&owner_key) {
                    run.errors.push(format!(
                        "{object}: {at}.name: duplicate registry {}/{} (already defined by {owner_object} {owner_at})",
                        spec.kind, spec.name
                    ));
                    // A clash between two McpBridges is reported on both, so
                    // each object's status shows it (Kubernetes mode).
                    if *owner_object != object {
                        run.errors.push(format!(
                            "{owner_object}: {owner_at}.name: registry {}/{} is also defined by {object} {at}, which is ignored",
                            spec.kind, spec.name
                        ));
                    }
                    continue;
                }
                registry_owner.insert(owner_key, (object.clone(), at.clone()));
                if let Some(key) = key {
                    next.registries.entry(key).or_default().push(spec.clone());
                }
                run.desired.registries.push(spec);
            }
        }
        *self = next;

        let d = &mut run.desired;
        d.registries.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
        d.proxies.sort_by(|a, b| a.name.cmp(&b.name));
        d.ingresses.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        d.tls_secrets.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        d.ca_secrets.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        // Messages echo names and values from files: bound each line.
        d.errors = run.errors.into_iter().map(clip_message).collect();
        Built { desired: run.desired, warnings: run.warnings.into_iter().map(clip_message).collect() }
    }

    /// The last good spec of an invalid registry entry: the one of the same
    /// name and type, or, if the type is unreadable now (a typo), the only
    /// one of that name.
    fn last_good_registry(&self, key: &EntryKey, raw: &serde_json::Value) -> Option<RegistrySpec> {
        let candidates = self.registries.get(key)?;
        let kind = raw.get("type").and_then(|t| t.as_str()).and_then(RegistryKind::parse);
        match (kind, candidates.as_slice()) {
            (Some(kind), _) => candidates.iter().find(|s| s.kind == kind).cloned(),
            (None, [only]) => Some(only.clone()),
            (None, _) => None,
        }
    }
}

/// Accumulators of one build.
#[derive(Default)]
struct Run {
    desired: Desired,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Run {
    fn warn(&mut self, object: &str, at: &str, warnings: Vec<FieldError>) {
        for w in warnings {
            self.warnings.push(format!("{object}: {}: {}", path(at, &w.field), w.reason));
        }
    }

    /// Record an invalid entry's errors, noting when its last good spec stays.
    fn reject(&mut self, object: &str, at: &str, errors: Vec<FieldError>, kept: bool) {
        let suffix = if kept { KEEPING } else { "" };
        for e in errors {
            self.errors.push(format!("{object}: {}: {}{suffix}", path(at, &e.field), e.reason));
        }
    }
}

fn clip_message(m: String) -> String {
    meshbridge_registries::clip_owned(m, meshbridge_registries::LOG_MESSAGE_MAX)
}

fn path(at: &str, field: &str) -> String {
    if field.is_empty() { at.to_owned() } else { format!("{at}.{field}") }
}

/// The `name` of a raw entry, to find its last good spec when it is invalid.
fn entry_name(raw: &serde_json::Value) -> Option<String> {
    match raw.get("name")? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// Fill `auth` from the named Secret.
fn resolve(
    checked: CheckedRegistry,
    bridge: &McpBridgeDoc,
    secrets: &HashMap<&str, Vec<&SecretDoc>>,
) -> Result<RegistrySpec, Vec<FieldError>> {
    let CheckedRegistry { mut spec, auth_secret_name, tls_ca_key } = checked;
    if let Some(name) = auth_secret_name {
        match find_secret(&name, &bridge.namespace, secrets) {
            Ok(secret) => spec.auth = secret.data.clone(),
            Err(reason) => return Err(vec![FieldError::new("authSecretName", reason.to_string())]),
        }
        if let (Some(key), Some(tls)) = (tls_ca_key, spec.tls.as_mut()) {
            let error = |reason: String| vec![FieldError { field: "registryTls.caKey".into(), reason }];
            let Some(pem) = spec.auth.get(&key) else {
                return Err(error(format!("key {key:?} not found in secret {name:?}")));
            };
            if let Err(reason) = meshbridge_registries::tls::parse_ca_bundle(pem.expose()) {
                return Err(error(format!("secret {name:?} key {key:?}: {reason}")));
            }
            tls.ca_pem = Some(pem.expose().to_string());
        }
    }
    Ok(spec)
}

/// Credentials that would cross plain HTTP to a host other than loopback:
/// a warning naming the registry and the credentials (never their values).
fn plain_credentials(spec: &RegistrySpec) -> Option<FieldError> {
    if spec.tls.is_some() {
        return None;
    }
    let names = spec.credential_names();
    if names.is_empty() {
        return None;
    }
    let mut hosts: Vec<String> = spec.domain.split(',').map(str::trim).filter(|h| !h.is_empty()).map(host_of).collect();
    hosts.extend(spec.nacos_address_server.as_deref().map(address_server_host));
    if hosts.iter().all(|h| is_loopback(h)) {
        return None;
    }
    Some(FieldError {
        field: String::new(),
        reason: format!(
            "registry {:?} sends {} over plain HTTP to a non-loopback address; set registryTls.enabled: true for https",
            spec.name,
            names.join(" and ")
        ),
    })
}

/// The host of a `domain` item: `host`, `host:port`, `[v6]:port` or a bare IPv6.
fn host_of(item: &str) -> String {
    if item.parse::<std::net::IpAddr>().is_ok() {
        return item.to_string();
    }
    if let Some(rest) = item.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default().to_string();
    }
    item.rsplit_once(':').map_or(item, |(h, _)| h).to_string()
}

/// The host of a `nacosAddressServer` (a URL or `host:port`).
fn address_server_host(address: &str) -> String {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    host_of(rest.split(['/', '?']).next().unwrap_or_default())
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A `proxyName` that names no usable proxy of the same McpBridge is an
/// error, but not the registry's: its services are still found and are
/// routed directly (the name is cleared), so a bad proxy never takes a
/// registry down with it.
fn check_proxy(
    mut spec: RegistrySpec,
    proxies: &HashSet<String>,
    rejected: &HashSet<String>,
    run: &mut Run,
    object: &str,
    at: &str,
) -> RegistrySpec {
    let Some(proxy) = &spec.proxy_name else { return spec };
    if proxies.contains(proxy) {
        return spec;
    }
    let why = if rejected.contains(proxy) {
        format!("proxy {proxy:?} is not usable (see its spec.proxies error)")
    } else {
        format!("proxy {proxy:?} not found in spec.proxies")
    };
    run.errors.push(format!("{object}: {at}.proxyName: {why}; routing its services directly"));
    spec.proxy_name = None;
    spec
}

/// Why the Secret an entry names could not be used.
#[derive(Debug, thiserror::Error)]
enum SecretLookup {
    #[error("secret {0:?} not found")]
    NotFound(String),
    #[error("secret {name:?} not found in namespace {namespace:?} and ambiguous elsewhere (namespaces {})", .elsewhere.join(", "))]
    Ambiguous { name: String, namespace: String, elsewhere: Vec<String> },
}

/// The Secret `name` in `namespace`, else the only one of that name anywhere.
fn find_secret<'a>(
    name: &str,
    namespace: &str,
    secrets: &HashMap<&str, Vec<&'a SecretDoc>>,
) -> Result<&'a SecretDoc, SecretLookup> {
    let found = secrets.get(name).map(Vec::as_slice).unwrap_or_default();
    if let Some(s) = found.iter().find(|s| s.namespace == namespace) {
        return Ok(s);
    }
    match found {
        [] => Err(SecretLookup::NotFound(name.to_string())),
        [only] => Ok(only),
        many => Err(SecretLookup::Ambiguous {
            name: name.to_string(),
            namespace: namespace.to_string(),
            elsewhere: many.iter().map(|s| s.namespace.clone()).collect(),
        }),
    }
}
