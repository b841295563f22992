//! The parts of Istio's Gateway, VirtualService and DestinationRule specs the
//! gateway translation reads, in Istio's JSON field names.
//!
//! Parsing is lenient where the protobuf JSON mapping is (a `null` means the
//! default, unknown fields are kept aside so callers can refuse or report
//! them) and strict about types: an object that does not parse is reported
//! with the field path and left out, never half-used.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::translate::istio::IstioObject;

const NETWORKING_GROUP: &str = "networking.istio.io/";

/// A parsed object with its identity.
#[derive(Debug, Clone)]
pub struct Named<T> {
    pub namespace: String,
    pub name: String,
    pub spec: T,
}

impl<T> Named<T> {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The objects the gateway translation uses, each list sorted by
/// `namespace/name` whatever order they came in.
#[derive(Debug, Default)]
pub struct Specs {
    pub gateways: Vec<Named<GatewaySpec>>,
    pub virtual_services: Vec<Named<VirtualServiceSpec>>,
    pub destination_rules: Vec<Named<DestinationRuleSpec>>,
}

impl Specs {
    pub fn gateway(&self, namespace: &str, name: &str) -> Option<&Named<GatewaySpec>> {
        self.gateways.iter().find(|g| g.namespace == namespace && g.name == name)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewaySpec {
    pub servers: Vec<Server>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Server {
    pub port: Option<ServerPort>,
    pub hosts: Vec<String>,
    pub tls: Option<ServerTls>,
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServerPort {
    pub number: u32,
    pub protocol: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServerTls {
    pub https_redirect: bool,
    /// `PASSTHROUGH` (Istio's default), `SIMPLE`, `MUTUAL`, …
    pub mode: String,
    pub credential_name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct VirtualServiceSpec {
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
    pub http: Vec<HttpRoute>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRoute {
    pub name: String,
    #[serde(rename = "match")]
    pub matches: Vec<HttpMatch>,
    pub route: Vec<RouteDestination>,
    pub rewrite: Option<Rewrite>,
    /// Fields this translation does not implement (`redirect`, `timeout`,
    /// `retries`, …), reported by name.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpMatch {
    pub name: String,
    pub uri: Option<StringMatch>,
    pub ignore_uri_case: bool,
    pub headers: BTreeMap<String, StringMatch>,
    pub without_headers: BTreeMap<String, StringMatch>,
    pub query_params: BTreeMap<String, StringMatch>,
    /// Conditions this translation cannot express (`method`, `authority`,
    /// `port`, …). A match carrying any is left out rather than widened.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Istio's `StringMatch`: a oneof of `exact`, `prefix` and `regex`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StringMatch {
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub regex: Option<String>,
}

/// One arm of a [`StringMatch`].
#[derive(Debug, Clone, PartialEq)]
pub enum Pattern<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Regex(&'a str),
}

impl StringMatch {
    /// The arm that is set; `Ok(None)` for an empty match (which Istio reads
    /// as "present" for headers and query parameters).
    pub fn pattern(&self) -> Result<Option<Pattern<'_>>, String> {
        let set: Vec<Pattern<'_>> = [
            self.exact.as_deref().map(Pattern::Exact),
            self.prefix.as_deref().map(Pattern::Prefix),
            self.regex.as_deref().map(Pattern::Regex),
        ]
        .into_iter()
        .flatten()
        .collect();
        match set.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.clone())),
            _ => Err("more than one of exact, prefix and regex".into()),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteDestination {
    pub destination: Destination,
    pub weight: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Destination {
    pub host: String,
    pub subset: String,
    pub port: Option<PortSelector>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PortSelector {
    pub number: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Rewrite {
    pub uri: String,
    pub authority: String,
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RegexRewrite {
    #[serde(rename = "match")]
    pub pattern: String,
    pub rewrite: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DestinationRuleSpec {
    pub host: String,
    pub subsets: Vec<Subset>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Subset {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// Parse the Gateways, VirtualServices and DestinationRules among
/// `objects`; everything else is not ours and is skipped silently.
pub fn parse(objects: &[IstioObject], warnings: &mut Vec<String>) -> Specs {
    let mut specs = Specs::default();
    for obj in objects {
        if !obj.api_version.starts_with(NETWORKING_GROUP) {
            continue;
        }
        match obj.kind.as_str() {
            "Gateway" => push(&mut specs.gateways, obj, warnings),
            "VirtualService" => push(&mut specs.virtual_services, obj, warnings),
            "DestinationRule" => push(&mut specs.destination_rules, obj, warnings),
            _ => {}
        }
    }
    dedup(&mut specs.gateways, "Gateway", warnings);
    dedup(&mut specs.virtual_services, "VirtualService", warnings);
    dedup(&mut specs.destination_rules, "DestinationRule", warnings);
    specs
}

fn push<T: DeserializeOwned>(into: &mut Vec<Named<T>>, obj: &IstioObject, warnings: &mut Vec<String>) {
    let mut spec = obj.spec.clone();
    strip_nulls(&mut spec);
    match serde_path_to_error::deserialize::<_, T>(spec) {
        Ok(spec) => {
            into.push(Named { namespace: obj.metadata.namespace.clone(), name: obj.metadata.name.clone(), spec })
        }
        Err(e) => {
            let path = e.path().to_string();
            let at = if path == "." { "spec".to_string() } else { format!("spec.{path}") };
            warnings.push(format!("{} {}: {at}: {}; left out", obj.kind, obj.key(), e.inner()));
        }
    }
}

/// Sort by key; of two objects with the same key keep the first given.
fn dedup<T>(list: &mut Vec<Named<T>>, kind: &str, warnings: &mut Vec<String>) {
    // A stable sort keeps the input order among equal keys.
    list.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    list.dedup_by(|later, earlier| {
        let same = later.namespace == earlier.namespace && later.name == earlier.name;
        if same {
            warnings.push(format!("{kind} {}: given twice; the first is used", later.key()));
        }
        same
    });
}

/// Protobuf JSON reads `null` as the field's default; serde would reject it
/// for a list or a string, so drop null members before parsing.
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}
