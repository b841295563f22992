//! Documents to [`Desired`]: validate every entry, resolve auth Secrets and
//! proxy references, reject duplicates, and fall back to an entry's last good
//! spec when its new version is invalid. No I/O besides logging.

use std::collections::{HashMap, HashSet};

use meshbridge_registries::{RegistryKind, RegistrySpec};
use tracing::warn;

use super::model::{Document, McpBridgeDoc, SecretDoc};
use super::validate::{self, CheckedRegistry, FieldError};
use super::{Desired, ProxySpec};

/// (McpBridge `namespace/name`, entry name): what "the same registry" (or
/// proxy) means from one build to the next.
type EntryKey = (String, String);

const KEEPING: &str = " (keeping last good config)";

/// Builds [`Desired`] from documents and remembers, per (McpBridge, name),
/// the last registry and proxy spec that validated, so that a later invalid
/// edit keeps the working one in force.
#[derive(Debug, Default)]
pub struct Builder {
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
    /// Build from documents in source order ("later" in duplicate errors
    /// means later in this order).
    pub fn build<'a>(&mut self, docs: impl IntoIterator<Item = &'a Document>) -> Desired {
        let built = self.build_full(docs);
        for w in &built.warnings {
            warn!(warning = %w, "config");
        }
        built.desired
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
                        run.desired.tls_secrets.push(super::TlsSecret {
                            namespace: s.namespace.clone(),
                            name: s.name.clone(),
                            cert_chain_pem: crt.expose().to_string(),
                            private_key_pem: key.clone(),
                        });
                    }
                    secrets.entry(s.name.as_str()).or_default().push(s)
                }
                Document::Ingress(i) => run.desired.ingresses.push(i.clone()),
            }
        }

        let mut next = Builder::default();
        let mut registry_owner: HashMap<(RegistryKind, String), String> = HashMap::new();
        let mut proxy_owner: HashMap<String, String> = HashMap::new();
        for bridge in bridges {
            let id = bridge.id();
            let object = format!("McpBridge {id}");

            // Proxies first: registries may name them.
            let mut bridge_proxies = HashSet::new();
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
                        let Some(kept) = kept else { continue };
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
                let checked = validate::registry(&raw.0, &mut warnings)
                    .and_then(|c| resolve(c, bridge, &secrets, &bridge_proxies));
                run.warn(&object, &at, warnings);
                let key_name = checked.as_ref().map(|s| s.name.clone()).ok().or_else(|| entry_name(&raw.0));
                let key = key_name.map(|n| (id.clone(), n));
                let spec = match checked {
                    Ok(spec) => spec,
                    Err(errors) => {
                        let kept = key.as_ref().and_then(|k| self.last_good_registry(k, &raw.0));
                        run.reject(&object, &at, errors, kept.is_some());
                        let Some(kept) = kept else { continue };
                        kept
                    }
                };
                let owner_key = (spec.kind, spec.name.clone());
                if let Some(owner) = registry_owner.get(&owner_key) {
                    run.errors.push(format!(
                        "{object}: {at}.name: duplicate registry {}/{} (already defined by {owner})",
                        spec.kind, spec.name
                    ));
                    continue;
                }
                registry_owner.insert(owner_key, format!("{object} {at}"));
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
        d.errors = run.errors;
        Built { desired: run.desired, warnings: run.warnings }
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

/// Fill `auth` from the named Secret and check `proxyName`.
fn resolve(
    checked: CheckedRegistry,
    bridge: &McpBridgeDoc,
    secrets: &HashMap<&str, Vec<&SecretDoc>>,
    proxies: &HashSet<String>,
) -> Result<RegistrySpec, Vec<FieldError>> {
    let CheckedRegistry { mut spec, auth_secret_name } = checked;
    let mut errors = Vec::new();
    if let Some(name) = auth_secret_name {
        match find_secret(&name, &bridge.namespace, secrets) {
            Ok(secret) => spec.auth = secret.data.clone(),
            Err(reason) => errors.push(FieldError { field: "authSecretName".into(), reason }),
        }
    }
    if let Some(proxy) = &spec.proxy_name
        && !proxies.contains(proxy)
    {
        errors.push(FieldError {
            field: "proxyName".into(),
            reason: format!("proxy {proxy:?} not found in spec.proxies"),
        });
    }
    if errors.is_empty() { Ok(spec) } else { Err(errors) }
}

/// The Secret `name` in `namespace`, else the only one of that name anywhere.
fn find_secret<'a>(
    name: &str,
    namespace: &str,
    secrets: &HashMap<&str, Vec<&'a SecretDoc>>,
) -> Result<&'a SecretDoc, String> {
    let found = secrets.get(name).map(Vec::as_slice).unwrap_or_default();
    if let Some(s) = found.iter().find(|s| s.namespace == namespace) {
        return Ok(s);
    }
    match found {
        [] => Err(format!("secret {name:?} not found")),
        [only] => Ok(only),
        many => {
            let namespaces: Vec<_> = many.iter().map(|s| s.namespace.as_str()).collect();
            Err(format!(
                "secret {name:?} not found in namespace {namespace:?} and ambiguous elsewhere (namespaces {})",
                namespaces.join(", ")
            ))
        }
    }
}
