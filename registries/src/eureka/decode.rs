//! Pure Eureka logic: decoding `/eureka/apps` answers, the client-side copy
//! of the registry with delta application and the reconcile hashcode, and
//! naming services. No I/O, so every rule is unit-tested below.
//!
//! The JSON is Eureka's Jackson codec (`EurekaJacksonCodec`):
//!
//! ```json
//! {"applications": {"versions__delta": "3", "apps__hashcode": "DOWN_1_UP_2_",
//!   "application": [{"name": "ORDERS", "instance": [{"instanceId": "..",
//!     "app": "ORDERS", "ipAddr": "10.0.0.1", "status": "UP",
//!     "overriddenstatus": "UNKNOWN", "port": {"$": 8080, "@enabled": "true"},
//!     "securePort": {"$": 443, "@enabled": "false"}, "metadata": {..},
//!     "actionType": "ADDED"}]}]}}
//! ```
//!
//! Its deserializer accepts a lone `application` or `instance` object where
//! an array is expected (older XStream/Jettison servers wrote one element
//! that way), so we do too. Instances are read field by field because real
//! servers disagree on details: `$` as a number or a string, `@enabled` as a
//! string or a boolean. `overriddenStatus` is not read: `status` already
//! carries the server's verdict ([`Instance::serves`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use tracing::debug;

use crate::fixed::wants_tls;
use crate::labels;
use crate::model::{Endpoint, Protocol, Service, ServicePort, Tls};
use crate::names::host_part;
use crate::select::Selection;
use crate::shared::intern;
use crate::spec::RegistrySpec;

/// `InstanceInfo.InstanceStatus`. `toEnum` maps anything else to UNKNOWN.
const STATUSES: [&str; 5] = ["UP", "DOWN", "STARTING", "OUT_OF_SERVICE", "UNKNOWN"];

/// `InstanceInfo.ActionType`: what a delta entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Added,
    Modified,
    Deleted,
}

/// One instance, with only what we use.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instance {
    /// `instanceId`, else `hostName`, as `InstanceInfo.getId()`.
    pub id: String,
    /// Upper-cased application name (Eureka's `Applications` keys by it).
    pub app: String,
    pub ip_addr: Option<String>,
    /// `status` as `InstanceStatus.name()`; UP when absent, as the builder.
    /// This is the status that decides traffic: the server has already
    /// applied its override rules to it (see [`Instance::serves`]).
    pub status: &'static str,
    pub port: Option<PortInfo>,
    pub secure_port: Option<PortInfo>,
    pub metadata: BTreeMap<String, String>,
    pub action: Option<Action>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PortInfo {
    pub number: u16,
    pub enabled: bool,
}

impl Instance {
    /// Whether the instance takes traffic: `status` is UP, as Eureka's own
    /// client filters (`DiscoveryClient`, `shouldFilterOnlyUpInstances`).
    ///
    /// `overriddenStatus` is not consulted. The server folds it into
    /// `status` on every register, renew and status change
    /// (`InstanceStatusOverrideRule`s), and it does not always win there:
    /// an instance that reports DOWN or STARTING keeps that status over an
    /// UP override (`DownOrStartingRule`). A real server answered an
    /// instance registered DOWN with override UP as `"status": "DOWN",
    /// "overriddenStatus": "UP"`; reading the override first sent traffic
    /// to it.
    pub fn serves(&self) -> bool {
        self.status == "UP"
    }
}

/// A decoded `/eureka/apps` or `/eureka/apps/delta` answer.
#[derive(Debug, Default)]
pub(crate) struct Applications {
    pub hashcode: Option<String>,
    pub instances: Vec<Instance>,
}

#[derive(Deserialize)]
struct Root {
    applications: AppsJson,
}

#[derive(Deserialize)]
struct AppsJson {
    #[serde(rename = "apps__hashcode", default)]
    hashcode: Option<String>,
    #[serde(default, deserialize_with = "one_or_many")]
    application: Vec<AppJson>,
}

#[derive(Deserialize)]
struct AppJson {
    #[serde(default)]
    name: String,
    #[serde(default, deserialize_with = "one_or_many")]
    instance: Vec<Map<String, Value>>,
}

fn one_or_many<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany<T> {
        Many(Vec<T>),
        One(T),
        Null(()),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::Many(v) => v,
        OneOrMany::One(t) => vec![t],
        OneOrMany::Null(()) => Vec::new(),
    })
}

/// Decode an applications answer. Instances without an id cannot be
/// tracked and are dropped (the hashcode check then forces a full fetch).
pub(crate) fn decode_apps(body: &[u8]) -> Result<Applications, serde_json::Error> {
    let root: Root = serde_json::from_slice(body)?;
    let mut instances = Vec::new();
    for app in root.applications.application {
        for raw in app.instance {
            match instance_of(&raw, &app.name) {
                Some(i) => instances.push(i),
                None => debug!(app = %app.name, "instance without instanceId or hostName ignored"),
            }
        }
    }
    Ok(Applications { hashcode: root.applications.hashcode, instances })
}

fn instance_of(raw: &Map<String, Value>, app_name: &str) -> Option<Instance> {
    let text = |key: &str| raw.get(key).and_then(scalar_text).filter(|s| !s.is_empty());
    let id = text("instanceId").or_else(|| text("hostName"))?;
    // `updateDelta` files an instance under its own appName.
    let app = text("app").unwrap_or_else(|| app_name.to_string()).to_uppercase();
    let action = match text("actionType").as_deref() {
        Some("ADDED") => Some(Action::Added),
        Some("MODIFIED") => Some(Action::Modified),
        Some("DELETED") => Some(Action::Deleted),
        _ => None,
    };
    let metadata = match raw.get("metadata") {
        // `@class` marks an empty map in the Jackson codec; it is no label.
        Some(Value::Object(m)) => {
            m.iter().filter(|(k, _)| *k != "@class").filter_map(|(k, v)| Some((k.clone(), scalar_text(v)?))).collect()
        }
        _ => BTreeMap::new(),
    };
    Some(Instance {
        id,
        app,
        ip_addr: text("ipAddr"),
        status: text("status").map_or("UP", |s| status_name(&s)),
        port: raw.get("port").and_then(|v| port_of(v, true)),
        secure_port: raw.get("securePort").and_then(|v| port_of(v, false)),
        metadata,
        action,
    })
}

/// `InstanceStatus.toEnum`: case-insensitive, UNKNOWN for anything else.
fn status_name(s: &str) -> &'static str {
    STATUSES.iter().find(|known| known.eq_ignore_ascii_case(s)).copied().unwrap_or("UNKNOWN")
}

/// Strings, numbers and booleans as text, as Jackson's `asText`.
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `{"$": 8080, "@enabled": "true"}`. A bare number is a port too. When
/// `@enabled` is missing the `InstanceInfo` default holds: the plain port on,
/// the secure port off.
fn port_of(v: &Value, enabled_by_default: bool) -> Option<PortInfo> {
    let (number, enabled) = match v {
        Value::Object(m) => (m.get("$")?, m.get("@enabled")),
        other => (other, None),
    };
    let number = scalar_text(number)?.trim().parse::<u16>().ok()?;
    let enabled = match enabled {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => enabled_by_default,
    };
    Some(PortInfo { number, enabled })
}

/// Our copy of the server's registry: app -> instance id -> instance, every
/// status included, as the Eureka client keeps it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Registry {
    pub apps: BTreeMap<String, BTreeMap<String, Instance>>,
}

impl Registry {
    pub fn from_full(instances: Vec<Instance>) -> Registry {
        let mut reg = Registry::default();
        for i in instances {
            reg.apps.entry(i.app.clone()).or_default().insert(i.id.clone(), i);
        }
        reg
    }

    /// `DiscoveryClient.updateDelta`: ADDED and MODIFIED put the instance
    /// (replacing one with the same id), DELETED removes it, and an entry
    /// without an action type is ignored. An app left without instances is
    /// dropped, as a full fetch would not list it.
    pub fn apply_delta(&mut self, delta: &[Instance]) {
        for i in delta {
            match i.action {
                Some(Action::Added | Action::Modified) => {
                    self.apps.entry(i.app.clone()).or_default().insert(i.id.clone(), i.clone());
                }
                Some(Action::Deleted) => {
                    if let Some(app) = self.apps.get_mut(&i.app) {
                        app.remove(&i.id);
                        if app.is_empty() {
                            self.apps.remove(&i.app);
                        }
                    }
                }
                None => {}
            }
        }
    }

    /// `Applications.getReconcileHashCode`: the number of instances in each
    /// status (`getStatus()`, the server's verdict), statuses in `TreeMap`
    /// order, each written `STATUS_count_`, e.g. `DOWN_2_UP_5_`; empty for
    /// no instances.
    pub fn reconcile_hash_code(&self) -> String {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for i in self.apps.values().flat_map(|a| a.values()) {
            *counts.entry(i.status).or_default() += 1;
        }
        counts.iter().map(|(status, n)| format!("{status}_{n}_")).collect()
    }
}

/// Turns the registry copy into services. Fixed for the life of a watcher.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    protocol: Protocol,
    tls: bool,
    spec: RegistrySpec,
}

impl Naming {
    pub fn new(spec: &RegistrySpec) -> Naming {
        let protocol = spec.protocol.as_deref().and_then(Protocol::parse).unwrap_or_default();
        Naming { protocol, tls: wants_tls(spec), spec: spec.clone() }
    }

    /// Every selected app as a service, keyed by host. `last` holds what
    /// was sent before, so that an app whose instances are all down keeps
    /// its port.
    pub fn services(
        &self,
        reg: &Registry,
        last: &BTreeMap<String, Service>,
        selection: &Selection,
    ) -> BTreeMap<String, Service> {
        reg.apps
            .iter()
            .filter_map(|(app, instances)| {
                let host = host_name(app);
                if !selection.wants(&host) {
                    return None;
                }
                let last_port = last.get(&host).and_then(|s| s.ports.first()).map(|p| p.number);
                let service = self.service(app, host.clone(), instances.values(), last_port);
                Some((host, service))
            })
            .collect()
    }

    /// One app. Only UP instances count ([`Instance::serves`]). The app uses secure ports when
    /// every UP instance has its secure port enabled: one Envoy cluster has
    /// one transport socket, so in a mixed app the plain ports are used and
    /// instances with only a secure port are left out.
    fn service<'a>(
        &self,
        app: &str,
        host: String,
        instances: impl Iterator<Item = &'a Instance>,
        last_port: Option<u16>,
    ) -> Service {
        let up: Vec<&Instance> = instances.filter(|i| i.serves()).collect();
        let secure = !up.is_empty() && up.iter().all(|i| i.secure_port.is_some_and(|p| p.enabled && p.number != 0));
        let endpoints: Vec<Endpoint> = up.iter().filter_map(|i| endpoint_of(i, secure)).collect();
        if endpoints.len() < up.len() {
            debug!(app, left_out = up.len() - endpoints.len(), "UP instances without a usable address or port");
        }
        let protocol = match (secure, self.protocol) {
            (true, Protocol::Http) => Protocol::Https,
            (true, Protocol::Tcp) => Protocol::Tls,
            (_, p) => p,
        };
        let number = self
            .spec
            .vport_for(&host)
            .or_else(|| endpoints.iter().map(|e| e.port).min())
            .or(last_port)
            .filter(|p| *p != 0);
        let ports = number
            .map(|number| {
                vec![ServicePort { number, protocol, name: format!("{}-{number}", protocol.as_str().to_lowercase()) }]
            })
            .unwrap_or_default();
        let service = Service::new(host, ports, endpoints);
        if secure || self.tls {
            service.with_tls(Tls { sni: self.spec.sni.clone().filter(|s| !s.is_empty()) })
        } else {
            service
        }
    }
}

fn endpoint_of(i: &Instance, secure: bool) -> Option<Endpoint> {
    let ip: IpAddr = i.ip_addr.as_deref()?.parse().ok()?;
    let port = if secure { i.secure_port } else { i.port }.filter(|p| p.enabled && p.number != 0)?;
    let (labels, _) = labels::keep_valid(&i.metadata);
    Some(Endpoint { address: ip.to_string(), port: port.number, weight: 1, labels: intern(labels) })
}

/// Mesh host of an app: `{app}.eureka`, lower case, `_` replaced.
pub(crate) fn host_name(app: &str) -> String {
    host_part(&format!("{}.eureka", app.to_lowercase()))
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
