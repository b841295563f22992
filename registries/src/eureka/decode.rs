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
//! that way), so we do too. Instances are decoded straight into the
//! fields we use, each taking whatever JSON type a server writes there
//! (`$` as a number or a string, `@enabled` as a string or a boolean),
//! with every other field skipped unread: no document tree is built.
//! `overriddenStatus` is not read: `status` already carries the server's
//! verdict ([`Instance::serves`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
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

    /// The same instance, whatever the delta action each came with.
    pub fn same_as(&self, other: &Instance) -> bool {
        let Instance { id, app, ip_addr, status, port, secure_port, metadata, action: _ } = self;
        (id, app, ip_addr, status, port, secure_port, metadata)
            == (&other.id, &other.app, &other.ip_addr, &other.status, &other.port, &other.secure_port, &other.metadata)
    }
}

/// A decoded `/eureka/apps` or `/eureka/apps/delta` answer.
#[derive(Debug, Default)]
pub(crate) struct Applications {
    pub hashcode: Option<String>,
    /// The instances, one group per `application` element of the answer,
    /// in its order: a full answer's groups become the registry's apps
    /// as they are ([`Registry::from_full`]), never gathered into one
    /// catalog-sized list first.
    pub groups: Vec<Vec<Instance>>,
    /// A digest of the answer's bytes: the same delta again is told apart
    /// without being applied.
    pub digest: u64,
}

impl Applications {
    /// Every instance, in the answer's order.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> {
        self.groups.iter().flatten()
    }

    pub fn len(&self) -> usize {
        self.groups.iter().map(Vec::len).sum()
    }
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
    instance: Vec<Decoded>,
}

/// One instance, turned into an [`Instance`] as soon as its object is read,
/// so that only one [`RawInstance`] exists at a time. `None`: it has no id.
/// The flag says whether it named its own `app`; if not, the application
/// element's name is filled in once that is known (it may come after the
/// instances).
#[derive(Deserialize)]
#[serde(from = "RawInstance")]
struct Decoded(Option<(Instance, bool)>);

impl From<RawInstance> for Decoded {
    fn from(raw: RawInstance) -> Decoded {
        Decoded(instance_from(raw))
    }
}

impl Decoded {
    /// The instance, under `app_name` (the enclosing element's) when it
    /// named no app of its own.
    fn filed_under(self, app_name: &str) -> Option<Instance> {
        let (i, own_app) = self.0?;
        Some(if own_app { i } else { Instance { app: app_name.to_uppercase(), ..i } })
    }
}

/// An instance as the JSON has it, decoded straight into the fields we
/// use: every other field is skipped as it is read, so no document tree is
/// ever built (a delta at 10k apps can be tens of MB). Each field takes
/// whatever JSON type a server writes there (see [`Scalar`], [`RawPort`]).
#[derive(Deserialize, Default)]
#[serde(default)]
struct RawInstance {
    #[serde(rename = "instanceId")]
    instance_id: Scalar,
    #[serde(rename = "hostName")]
    host_name: Scalar,
    app: Scalar,
    #[serde(rename = "ipAddr")]
    ip_addr: Scalar,
    status: Scalar,
    port: RawPort,
    #[serde(rename = "securePort")]
    secure_port: RawPort,
    metadata: Metadata,
    #[serde(rename = "actionType")]
    action_type: Scalar,
}

/// A string, number or boolean as text, as Jackson's `asText`; anything
/// else (null, an object, an array) is no value, and is skipped unread.
#[derive(Default, Debug, PartialEq)]
struct Scalar(Option<String>);

impl Scalar {
    fn text(self) -> Option<String> {
        self.0.filter(|s| !s.is_empty())
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar(Some(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar(Some(v)))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar(Some(v.to_string())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar(Some(v.to_string())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar(Some(v.to_string())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar(Some(serde_json::Number::from_f64(v).map_or_else(|| v.to_string(), |n| n.to_string()))))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
        Ok(Scalar(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Scalar, E> {
        Ok(Scalar(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar(None))
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

/// A value that is read from a JSON object; any other JSON value (a
/// scalar, which [`FromObject::from_scalar`] may take, or an array, skipped
/// unread) gives the default.
trait FromObject<'de>: Default + Sized {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;

    fn from_scalar(_: Scalar) -> Self {
        Self::default()
    }
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: FromObject<'de>> ObjectVisitor<T> {
    fn scalar<E>(s: Result<Scalar, E>) -> Result<T, E> {
        s.map(T::from_scalar)
    }
}

impl<'de, T: FromObject<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::from_map(map)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<T, A::Error> {
        ScalarVisitor.visit_seq(seq).map(|_| T::default())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        Self::scalar(ScalarVisitor.visit_str(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Self::scalar(ScalarVisitor.visit_u64(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        Self::scalar(ScalarVisitor.visit_i64(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        Self::scalar(ScalarVisitor.visit_f64(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<T, E> {
        Self::scalar(ScalarVisitor.visit_bool(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_none<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }
}

/// `{"$": 8080, "@enabled": "true"}`, or a bare number: the number and the
/// `@enabled` flag as text; anything else is no port.
#[derive(Default)]
struct RawPort {
    number: Scalar,
    enabled: Scalar,
}

impl<'de> FromObject<'de> for RawPort {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<RawPort, A::Error> {
        let mut port = RawPort::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "$" => port.number = map.next_value()?,
                "@enabled" => port.enabled = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(port)
    }

    fn from_scalar(number: Scalar) -> RawPort {
        RawPort { number, enabled: Scalar(None) }
    }
}

impl<'de> Deserialize<'de> for RawPort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawPort, D::Error> {
        d.deserialize_any(ObjectVisitor(PhantomData))
    }
}

/// `metadata`: its scalar values as text; `@class` (the Jackson codec's
/// mark of an empty map) and values that are objects or arrays are left
/// out; anything but an object is no metadata.
#[derive(Default)]
struct Metadata(BTreeMap<String, String>);

impl<'de> FromObject<'de> for Metadata {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Metadata, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let Scalar(value) = map.next_value()?;
            if let Some(value) = value.filter(|_| key != "@class") {
                out.insert(key, value);
            }
        }
        Ok(Metadata(out))
    }
}

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Metadata, D::Error> {
        d.deserialize_any(ObjectVisitor(PhantomData))
    }
}

/// An array, or a lone element where an array is expected (older servers),
/// or null: decoded as it is read, never buffered first.
fn one_or_many<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct OneOrMany<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrMany<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an array, an object or null")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
            while let Some(t) = seq.next_element()? {
                out.push(t);
            }
            Ok(out)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|t| vec![t])
        }
        fn visit_unit<E: de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }
        fn visit_none<E: de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }
    }
    d.deserialize_any(OneOrMany(PhantomData))
}

/// Decode an applications answer held whole (tests, fuzzing). Instances
/// without an id cannot be tracked and are dropped (the hashcode check then
/// forces a full fetch).
#[cfg(test)]
pub(crate) fn decode_apps(body: &[u8]) -> Result<Applications, serde_json::Error> {
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hasher::write(&mut hasher, body);
    applications(serde_json::from_slice(body)?, std::hash::Hasher::finish(&hasher))
}

/// Decode an answer as its bytes arrive (the watcher: a body is never held
/// whole, only the instances decoded from it). `digest` is of the bytes.
pub(crate) fn decode_reader(
    body: impl std::io::Read,
    digest: impl FnOnce() -> u64,
) -> Result<Applications, serde_json::Error> {
    let root: Root = serde_json::from_reader(body)?;
    applications(root, digest())
}

fn applications(root: Root, digest: u64) -> Result<Applications, serde_json::Error> {
    let mut groups = Vec::with_capacity(root.applications.application.len());
    for app in root.applications.application {
        let mut group = Vec::with_capacity(app.instance.len());
        for decoded in app.instance {
            match decoded.filed_under(&app.name) {
                Some(i) => group.push(i),
                None => debug!(app = %app.name, "instance without instanceId or hostName ignored"),
            }
        }
        groups.push(group);
    }
    Ok(Applications { hashcode: root.applications.hashcode, groups, digest })
}

/// One instance from its JSON object, filed under `app_name` when it names
/// no app of its own (tests).
#[cfg(test)]
fn instance_of(raw: &serde_json::Map<String, serde_json::Value>, app_name: &str) -> Option<Instance> {
    let raw: RawInstance = serde_json::from_value(serde_json::Value::Object(raw.clone())).ok()?;
    Decoded::from(raw).filed_under(app_name)
}

/// An instance, and whether it named its own app (the app is empty if
/// not).
fn instance_from(raw: RawInstance) -> Option<(Instance, bool)> {
    let id = raw.instance_id.text().or_else(|| raw.host_name.text())?;
    // `updateDelta` files an instance under its own appName.
    let app = raw.app.text().map(|a| a.to_uppercase());
    let own_app = app.is_some();
    let app = app.unwrap_or_default();
    let action = match raw.action_type.text().as_deref() {
        Some("ADDED") => Some(Action::Added),
        Some("MODIFIED") => Some(Action::Modified),
        Some("DELETED") => Some(Action::Deleted),
        _ => None,
    };
    let instance = Instance {
        id,
        app,
        ip_addr: raw.ip_addr.text(),
        status: raw.status.text().map_or("UP", |s| status_name(&s)),
        port: port_of(raw.port, true),
        secure_port: port_of(raw.secure_port, false),
        metadata: raw.metadata.0,
        action,
    };
    Some((instance, own_app))
}

/// `InstanceStatus.toEnum`: case-insensitive, UNKNOWN for anything else.
fn status_name(s: &str) -> &'static str {
    STATUSES.iter().find(|known| known.eq_ignore_ascii_case(s)).copied().unwrap_or("UNKNOWN")
}

/// A port's number and flag. When `@enabled` is missing the
/// `InstanceInfo` default holds: the plain port on, the secure port off.
fn port_of(raw: RawPort, enabled_by_default: bool) -> Option<PortInfo> {
    let number = raw.number.0?.trim().parse::<u16>().ok()?;
    let enabled = raw.enabled.0.map_or(enabled_by_default, |s| s.eq_ignore_ascii_case("true"));
    Some(PortInfo { number, enabled })
}

/// One app's instances, sorted by id. An app has a few instances as a
/// rule, and a vector holds them at their own size, where a map's node is
/// sized for eleven: at 100k apps of 3 instances that node was 1.7 KB an
/// app, most of the copy's memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct App(Vec<Instance>);

impl App {
    /// From one answer's instances of this app: sorted by id, the last of
    /// a repeated id kept (as inserting them one by one would), actions
    /// cleared.
    fn from_instances(mut instances: Vec<Instance>) -> App {
        instances.reverse();
        // Stable: of equal ids the last listed comes first now, and
        // `dedup_by` keeps the first of each run.
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        instances.dedup_by(|a, b| a.id == b.id);
        for i in &mut instances {
            i.action = None;
        }
        instances.shrink_to_fit();
        App(instances)
    }

    fn find(&self, id: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|i| i.id.as_str().cmp(id))
    }

    pub fn get(&self, id: &str) -> Option<&Instance> {
        self.find(id).ok().map(|at| &self.0[at])
    }

    /// Hold `i`, returning the instance it replaced.
    fn insert(&mut self, i: Instance) -> Option<Instance> {
        match self.find(&i.id) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at], i)),
            Err(at) => {
                self.0.insert(at, i);
                None
            }
        }
    }

    fn remove(&mut self, id: &str) -> Option<Instance> {
        self.find(id).ok().map(|at| self.0.remove(at))
    }

    pub fn values(&self) -> std::slice::Iter<'_, Instance> {
        self.0.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Index<&str> for App {
    type Output = Instance;

    fn index(&self, id: &str) -> &Instance {
        self.get(id).expect("no instance with that id")
    }
}

/// Our copy of the server's registry: app -> its instances by id, every
/// status included, as the Eureka client keeps it, with the number of
/// instances in each status kept as it changes (the reconcile hashcode
/// without a walk). Instances are held without their delta action.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Registry {
    pub apps: BTreeMap<String, App>,
    counts: BTreeMap<&'static str, usize>,
}

impl Registry {
    /// From a full answer's groups ([`Applications::groups`]). A group
    /// whose instances all name one app not seen before becomes that app
    /// as it is; any other instance is put one at a time.
    pub fn from_full(groups: Vec<Vec<Instance>>) -> Registry {
        let mut reg = Registry::default();
        for group in groups {
            let Some(first) = group.first() else { continue };
            let whole = !reg.apps.contains_key(&first.app) && group.iter().all(|i| i.app == first.app);
            if whole {
                let name = first.app.clone();
                let app = App::from_instances(group);
                for i in app.values() {
                    *reg.counts.entry(i.status).or_default() += 1;
                }
                reg.apps.insert(name, app);
            } else {
                for mut i in group {
                    i.action = None;
                    reg.put(i);
                }
            }
        }
        reg
    }

    /// Hold `i`; whether that changed anything.
    fn put(&mut self, i: Instance) -> bool {
        let app = self.apps.entry(i.app.clone()).or_default();
        if app.get(&i.id).is_some_and(|held| *held == i) {
            return false;
        }
        *self.counts.entry(i.status).or_default() += 1;
        if let Some(old) = app.insert(i) {
            self.uncount(old.status);
        }
        true
    }

    fn uncount(&mut self, status: &'static str) {
        if let Some(n) = self.counts.get_mut(status) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(status);
            }
        }
    }

    /// `DiscoveryClient.updateDelta`: ADDED and MODIFIED put the instance
    /// (replacing one with the same id), DELETED removes it, and an entry
    /// without an action type is ignored. An app left without instances is
    /// dropped, as a full fetch would not list it. Returns the apps that
    /// changed: an entry that repeats what is held (the server's delta
    /// queue keeps every change of its last three minutes, so most entries
    /// of a delta usually do) costs a comparison, and no copy.
    pub fn apply_delta<'a>(&mut self, delta: impl IntoIterator<Item = &'a Instance>) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        for i in delta {
            match i.action {
                Some(Action::Added | Action::Modified) => {
                    let held = self.apps.get(&i.app).and_then(|app| app.get(&i.id));
                    if held.is_some_and(|held| held.same_as(i)) {
                        continue;
                    }
                    let mut i = i.clone();
                    i.action = None;
                    let app = i.app.clone();
                    if self.put(i) {
                        changed.insert(app);
                    }
                }
                Some(Action::Deleted) => {
                    let Some(app) = self.apps.get_mut(&i.app) else { continue };
                    let Some(old) = app.remove(&i.id) else { continue };
                    if app.is_empty() {
                        self.apps.remove(&i.app);
                    }
                    self.uncount(old.status);
                    changed.insert(i.app.clone());
                }
                None => {}
            }
        }
        changed
    }

    /// `Applications.getReconcileHashCode`: the number of instances in each
    /// status (`getStatus()`, the server's verdict), statuses in `TreeMap`
    /// order, each written `STATUS_count_`, e.g. `DOWN_2_UP_5_`; empty for
    /// no instances.
    pub fn reconcile_hash_code(&self) -> String {
        self.counts.iter().map(|(status, n)| format!("{status}_{n}_")).collect()
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
    pub fn service<'a>(
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
