//! Istio objects → MCP-over-xDS resources, as Istio Pilot's MCP client reads
//! them: each `DiscoveryResponse.resources[i]` is an `Any` holding an
//! `istio.mcp.v1alpha1.Resource`, whose `metadata.name` is `namespace/name`
//! and whose `body` is an `Any` of the Istio spec message
//! (`type.googleapis.com/istio.networking.v1alpha3.<Kind>`).
//!
//! Pilot never NACKs, so every spec is validated here by encoding it
//! against the schema in `proto/`: an object that does not fit is left out
//! with a reason and the rest go.

use std::collections::BTreeMap;

use envoy_types::pb::google::protobuf::Any;
use meshbridge_proto::istio::mcp::v1alpha1 as mcp;
use prost::Message;

use super::istio::IstioObject;
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

/// The group of an `apiVersion` (`networking.istio.io/v1` → `networking.istio.io`).
fn group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or(api_version)
}

/// Wrap every object; returns resources by collection, then by `ns/name`,
/// and the reasons for any object left out. `create_time` gives each
/// object's stable creation time (seconds since the epoch).
pub fn resources(
    objects: &[IstioObject],
    create_time: impl Fn(&IstioObject) -> i64,
) -> (BTreeMap<String, BTreeMap<String, Resource>>, Vec<String>) {
    let mut out: BTreeMap<String, BTreeMap<String, Resource>> = BTreeMap::new();
    let mut rejected = Vec::new();
    for obj in objects {
        match resource(obj, create_time(obj)) {
            Ok(r) => {
                out.entry(format!("{}/{}", group(&obj.api_version), obj.kind))
                    .or_default()
                    .insert(r.name.to_string(), r);
            }
            Err(reason) => rejected.push(format!("{} {}: {reason}; left out of MCP", obj.kind, obj.key())),
        }
    }
    (out, rejected)
}

fn resource(obj: &IstioObject, created: i64) -> Result<Resource, String> {
    validate_meta(obj)?;
    let message = format!("{}.{}", meshbridge_proto::NETWORKING_PACKAGE, obj.kind);
    let spec = meshbridge_proto::encode_json(&message, &obj.spec).map_err(|e| e.to_string())?;
    // The version covers everything Pilot sees except the version itself and
    // the creation time, so an unchanged object keeps its version.
    let mut fingerprint = spec.clone();
    for (k, v) in obj.metadata.labels.iter().chain(obj.metadata.annotations.iter()) {
        fingerprint.extend_from_slice(k.as_bytes());
        fingerprint.push(0);
        fingerprint.extend_from_slice(v.as_bytes());
        fingerprint.push(0);
    }
    fingerprint.extend_from_slice(obj.kind.as_bytes());
    let version = content_hash(&fingerprint);
    let name = obj.key();
    let wrapped = mcp::Resource {
        metadata: Some(mcp::Metadata {
            name: name.clone(),
            create_time: Some(prost_types::Timestamp { seconds: created, nanos: 0 }),
            version: version.clone(),
            labels: obj.metadata.labels.clone(),
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
fn validate_meta(obj: &IstioObject) -> Result<(), String> {
    let m = &obj.metadata;
    if !is_dns1123_subdomain(&m.name) {
        return Err(format!("metadata.name {:?} is not a valid Kubernetes name", m.name));
    }
    if !is_dns1123_label(&m.namespace) {
        return Err(format!("metadata.namespace {:?} is not a valid Kubernetes namespace", m.namespace));
    }
    for (k, v) in &m.labels {
        if !is_label_key(k) {
            return Err(format!("metadata.labels: key {k:?} is not a valid label key"));
        }
        if !is_label_value(v) {
            return Err(format!("metadata.labels[{k}]: value {v:?} is not a valid label value"));
        }
    }
    Ok(())
}

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// `[prefix/]name`: prefix a DNS subdomain, name 1–63 alphanumerics with
/// `-_.` inside.
pub fn is_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// Empty, or up to 63 alphanumerics with `-_.` inside.
pub fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
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
    fn invalid_hosts_get_valid_distinct_names() {
        use crate::translate::istio::object_name;
        assert_eq!(object_name("web.dc1.consul"), "web.dc1.consul");
        let a = object_name("providers:com.example.Greeter:1.0.0:.zookeeper");
        let b = object_name("providers:com.example.Greeter:1.0.0:g.zookeeper");
        assert!(a.starts_with("providers-com.example.greeter-1.0.0.zookeeper-"), "{a}");
        assert!(is_dns1123_subdomain(&a) && is_dns1123_subdomain(&b), "{a} {b}");
        assert_ne!(a, b);
        assert!(is_dns1123_subdomain(&object_name("Bad_Host.dc1.consul")));
        assert!(is_dns1123_subdomain(&object_name(":::")));
    }

    #[test]
    fn invalid_objects_are_left_out_and_the_rest_go() {
        use crate::translate::istio::ObjectMeta;
        let object = |name: &str, label: &str| IstioObject {
            api_version: "networking.istio.io/v1".into(),
            kind: "ServiceEntry".into(),
            metadata: ObjectMeta {
                name: name.into(),
                namespace: "mcp".into(),
                labels: [("app".to_string(), label.to_string())].into(),
                ..Default::default()
            },
            spec: serde_json::json!({"hosts": [name], "resolution": "STATIC"}),
        };
        let mut unknown_field = object("c.example", "ok");
        unknown_field.spec["colour"] = "red".into();
        let objects = vec![object("a.example", "ok"), object("b.example", "not ok!"), unknown_field];
        let (out, rejected) = resources(&objects, |_| 0);
        let names: Vec<&String> = out["networking.istio.io/ServiceEntry"].keys().collect();
        assert_eq!(names, vec!["mcp/a.example"]);
        assert_eq!(rejected.len(), 2, "{rejected:?}");
        assert!(rejected[0].contains("mcp/b.example") && rejected[0].contains("metadata.labels[app]"), "{rejected:?}");
        assert!(rejected[1].contains("mcp/c.example") && rejected[1].contains("colour"), "{rejected:?}");
    }

    #[test]
    fn label_rules() {
        assert!(is_label_key("higress-registry-type"));
        assert!(is_label_key("app.kubernetes.io/name"));
        assert!(!is_label_key("bad key"));
        assert!(!is_label_key("-x"));
        assert!(is_label_value(""));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(!is_label_value("x/y"));
    }
}
