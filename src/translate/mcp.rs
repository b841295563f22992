//! Istio objects → MCP-over-xDS resources, as Istio Pilot's MCP client reads
//! them: each `DiscoveryResponse.resources[i]` is an `Any` holding an
//! `istio.mcp.v1alpha1.Resource`, whose `metadata.name` is `namespace/name`
//! and whose `body` is an `Any` of the Istio spec message
//! (`type.googleapis.com/istio.networking.v1alpha3.<Kind>`).
//!
//! Specs are encoded from the typed model through the generated prost
//! messages ([`super::pb`]), so they fit the schema by construction. Pilot
//! never NACKs, so what types cannot rule out is checked here (Kubernetes
//! names and labels, an EnvoyFilter patch value that is not an object): an
//! object that fails is left out with a reason and the rest go.

use std::collections::BTreeMap;

use envoy_types::pb::google::protobuf::Any;
use meshbridge_proto::istio::mcp::v1alpha1 as mcp;
use prost::Message;

use super::model::{IstioObject, Spec};
use super::names::{is_dns1123_label, is_dns1123_subdomain, is_label_key, is_label_value};
use super::warning::{Reason, Warning};
use crate::resources::{Resource, content_hash};

pub const MCP_RESOURCE_TYPE: &str = "type.googleapis.com/istio.mcp.v1alpha1.Resource";

/// The collection an MCP type URL asks for, without its version:
/// `networking.istio.io/v1alpha3/ServiceEntry` and
/// `networking.istio.io/v1/ServiceEntry` are both
/// `networking.istio.io/ServiceEntry`. `None` for anything that is not of
/// the `group/version/kind` form (Envoy type URLs).
pub fn collection(type_url: &str) -> Option<String> {
    let mut parts = type_url.split('/');
    let (Some(group), Some(_version), Some(kind), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if group.is_empty() || kind.is_empty() || group.contains("type.googleapis.com") {
        return None;
    }
    Some(format!("{group}/{kind}"))
}

/// The collection an object is served in: `networking.istio.io/ServiceEntry`.
pub fn collection_of(obj: &IstioObject) -> String {
    let api = obj.api_version();
    let group = api.rsplit_once('/').map(|(g, _)| g).unwrap_or(api);
    format!("{group}/{}", obj.kind())
}

/// Wrap every object; returns resources by collection, then by `ns/name`,
/// and the reasons for any object left out. `create_time` gives each
/// object's stable creation time (seconds since the epoch).
pub fn resources<'a>(
    objects: impl IntoIterator<Item = &'a IstioObject>,
    create_time: impl Fn(&IstioObject) -> i64,
) -> (BTreeMap<String, BTreeMap<String, Resource>>, Vec<Warning>) {
    let mut out: BTreeMap<String, BTreeMap<String, Resource>> = BTreeMap::new();
    let mut rejected = Vec::new();
    for obj in objects {
        match resource(obj, create_time(obj)) {
            Ok(r) => {
                out.entry(collection_of(obj)).or_default().insert(r.name.to_string(), r);
            }
            Err(w) => rejected.push(w),
        }
    }
    (out, rejected)
}

/// One object as an MCP resource, or why Pilot could not take it.
pub fn resource(obj: &IstioObject, created: i64) -> Result<Resource, Warning> {
    let reject = |reason: String| {
        Warning::new(
            format!("{} {}", obj.kind(), obj.key()),
            Reason::InvalidObject,
            format!("{reason}; left out of MCP"),
        )
    };
    validate_meta(obj).map_err(|e| reject(e.to_string()))?;
    let package = match obj.spec {
        Spec::AuthorizationPolicy(_) => meshbridge_proto::SECURITY_PACKAGE,
        _ => meshbridge_proto::NETWORKING_PACKAGE,
    };
    let message = format!("{package}.{}", obj.kind());
    let spec = super::pb::encode(&obj.spec).map_err(|e| reject(e.to_string()))?;
    // The golden check: in unit tests, every object any test translates is
    // also encoded the old way (JSON checked against the schema by
    // reflection) and must give the same bytes.
    #[cfg(test)]
    {
        let by_reflection = meshbridge_proto::encode_json(&message, &obj.spec.to_json())
            .unwrap_or_else(|e| panic!("{} {}: {e}", obj.kind(), obj.key()));
        assert!(
            spec == by_reflection,
            "{} {}: the typed encoding differs from the reflected one",
            obj.kind(),
            obj.key()
        );
    }
    // The version covers everything Pilot sees except the version itself and
    // the creation time, so an unchanged object keeps its version.
    let mut fingerprint = spec.clone();
    for (k, v) in obj.metadata.labels.iter().chain(obj.metadata.annotations.iter()) {
        fingerprint.extend_from_slice(k.as_bytes());
        fingerprint.push(0);
        fingerprint.extend_from_slice(v.as_bytes());
        fingerprint.push(0);
    }
    fingerprint.extend_from_slice(obj.kind().as_bytes());
    let version = content_hash(&fingerprint);
    let name = obj.key();
    let wrapped = mcp::Resource {
        metadata: Some(mcp::Metadata {
            name: name.clone(),
            create_time: Some(prost_types::Timestamp { seconds: created, nanos: 0 }),
            version: version.clone(),
            labels: (*obj.metadata.labels).clone(),
            annotations: obj.metadata.annotations.clone(),
        }),
        body: Some(prost_types::Any { type_url: format!("type.googleapis.com/{message}"), value: spec }),
    };
    Ok(Resource::with_version(
        name,
        version,
        Any { type_url: MCP_RESOURCE_TYPE.into(), value: wrapped.encode_to_vec() },
    ))
}

/// Kubernetes rules Pilot relies on but never reports: a DNS-1123 name and
/// namespace, and valid label keys and values.
fn validate_meta(obj: &IstioObject) -> Result<(), InvalidMeta> {
    let m = &obj.metadata;
    if !is_dns1123_subdomain(&m.name) {
        return Err(InvalidMeta::Name(m.name.clone()));
    }
    if !is_dns1123_label(&m.namespace) {
        return Err(InvalidMeta::Namespace(m.namespace.clone()));
    }
    for (k, v) in m.labels.iter() {
        if !is_label_key(k) {
            return Err(InvalidMeta::LabelKey(k.clone()));
        }
        if !is_label_value(v) {
            return Err(InvalidMeta::LabelValue { key: k.clone(), value: v.clone() });
        }
    }
    Ok(())
}

/// Object metadata Pilot would take but Kubernetes rules forbid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum InvalidMeta {
    #[error("metadata.name {0:?} is not a valid Kubernetes name")]
    Name(String),
    #[error("metadata.namespace {0:?} is not a valid Kubernetes namespace")]
    Namespace(String),
    #[error("metadata.labels: key {0:?} is not a valid label key")]
    LabelKey(String),
    #[error("metadata.labels[{key}]: value {value:?} is not a valid label value")]
    LabelValue { key: String, value: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collections_ignore_the_version() {
        assert_eq!(
            collection("networking.istio.io/v1/ServiceEntry").as_deref(),
            Some("networking.istio.io/ServiceEntry")
        );
        assert_eq!(
            collection("networking.istio.io/v1alpha3/ServiceEntry").as_deref(),
            Some("networking.istio.io/ServiceEntry")
        );
        assert_eq!(collection("core/v1alpha1/MeshConfig").as_deref(), Some("core/MeshConfig"));
        assert_eq!(collection("type.googleapis.com/envoy.config.cluster.v3.Cluster"), None);
        assert_eq!(collection("a/b"), None);
    }

    #[test]
    fn invalid_objects_are_left_out_and_the_rest_go() {
        use crate::translate::model::{
            ApplyTo, EnvoyConfigObjectPatch, EnvoyFilterSpec, Location, ObjectMeta, Operation, Patch, PatchContext,
            PatchMatch, Resolution, ServiceEntrySpec, Spec,
        };
        let object = |name: &str, label: &str| IstioObject {
            metadata: ObjectMeta {
                name: name.into(),
                namespace: "mcp".into(),
                labels: std::collections::BTreeMap::from([("app".to_string(), label.to_string())]).into(),
                ..Default::default()
            },
            spec: Spec::ServiceEntry(ServiceEntrySpec {
                hosts: vec![name.into()],
                ports: vec![],
                location: Location::MeshInternal,
                resolution: Resolution::Static,
                endpoints: vec![],
            }),
        };
        let filter = IstioObject::new(
            "c-example",
            "mcp",
            Spec::EnvoyFilter(EnvoyFilterSpec {
                workload_selector: None,
                config_patches: vec![EnvoyConfigObjectPatch {
                    apply_to: ApplyTo::Cluster,
                    matches: PatchMatch { context: PatchContext::Gateway, ..Default::default() },
                    patch: Patch { operation: Operation::Add, value: Some(serde_json::json!(["not", "a", "Struct"])) },
                }],
            }),
        );
        let objects = vec![object("a.example", "ok"), object("b.example", "not ok!"), filter];
        let (out, rejected) = resources(&objects, |_| 0);
        let names: Vec<&String> = out["networking.istio.io/ServiceEntry"].keys().collect();
        assert_eq!(names, vec!["mcp/a.example"]);
        let rejected: Vec<String> = rejected.iter().map(ToString::to_string).collect();
        assert_eq!(rejected.len(), 2, "{rejected:?}");
        assert!(rejected[0].contains("mcp/b.example") && rejected[0].contains("metadata.labels[app]"), "{rejected:?}");
        assert!(
            rejected[1].contains("mcp/c-example") && rejected[1].contains("configPatches[0].patch.value"),
            "{rejected:?}"
        );
    }
}
