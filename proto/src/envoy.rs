//! Envoy's messages as JSON, the way Envoy's own admin `/config_dump` writes
//! them: proto field names (snake_case), default values left out, and every
//! `Any` (a resource, a `typed_config`) written inline with its `@type`.
//!
//! meshbridge builds Envoy messages with envoy-types' prost structs, which
//! have no JSON mapping; this goes through the descriptors `build.rs`
//! compiled from envoy-types' own `.proto` sources instead.

use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};

use crate::EncodeError;

static FDS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_fds.bin"));

/// The descriptor pool of the Envoy messages meshbridge sends (see
/// `ENVOY_FILES` in `build.rs`) and everything they import.
pub fn descriptor_pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(FDS).expect("build.rs wrote a valid Envoy descriptor set"))
}

/// The message a type URL (`type.googleapis.com/envoy...`) names.
fn full_name(type_url: &str) -> &str {
    type_url.rsplit_once('/').map_or(type_url, |(_, name)| name)
}

/// An encoded Envoy message of `type_url` as JSON, with `"@type"` first as
/// in a config dump. A type (or a `typed_config` inside it) that the pool
/// lacks is an error naming it.
pub fn to_json(type_url: &str, bytes: &[u8]) -> Result<serde_json::Value, EncodeError> {
    let name = full_name(type_url);
    let desc =
        descriptor_pool().get_message_by_name(name).ok_or_else(|| EncodeError::UnknownMessage(name.to_owned()))?;
    let msg = DynamicMessage::decode(desc, bytes)
        .map_err(|source| EncodeError::Decode { message: name.to_owned(), source })?;
    let options = SerializeOptions::new().skip_default_fields(true).use_proto_field_name(true);
    let body = msg
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|source| EncodeError::ToJson { message: name.to_owned(), source })?;
    let mut out = serde_json::Map::new();
    out.insert("@type".into(), serde_json::Value::String(format!("type.googleapis.com/{name}")));
    if let serde_json::Value::Object(fields) = body {
        out.extend(fields);
    }
    Ok(serde_json::Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_meshbridge_sends_is_in_the_pool() {
        for name in [
            "envoy.config.cluster.v3.Cluster",
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
            "envoy.config.listener.v3.Listener",
            "envoy.config.route.v3.RouteConfiguration",
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        ] {
            assert!(descriptor_pool().get_message_by_name(name).is_some(), "{name}");
        }
    }

    #[test]
    fn a_typed_config_is_written_inline_with_its_type() {
        // A Listener with a filter whose typed_config is a Router: the
        // nested Any must be written out, not left as bytes.
        let json = serde_json::json!({
            "name": "l",
            "filter_chains": [{"filters": [{"name": "f", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                "suppress_envoy_headers": true,
            }}]}],
        });
        let desc = descriptor_pool().get_message_by_name("envoy.config.listener.v3.Listener").expect("listener");
        let msg = DynamicMessage::deserialize(desc, json).expect("valid listener JSON");
        let bytes = prost::Message::encode_to_vec(&msg);
        let back = to_json("type.googleapis.com/envoy.config.listener.v3.Listener", &bytes).expect("decodes");
        assert_eq!(back["@type"], "type.googleapis.com/envoy.config.listener.v3.Listener");
        assert_eq!(back["name"], "l");
        let typed = &back["filter_chains"][0]["filters"][0]["typed_config"];
        assert_eq!(typed["@type"], "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router");
        assert_eq!(typed["suppress_envoy_headers"], true, "{back}");
    }

    #[test]
    fn an_unknown_type_is_named() {
        let err = to_json("type.googleapis.com/envoy.nope.v3.Nothing", b"").expect_err("unknown");
        assert!(err.to_string().contains("envoy.nope.v3.Nothing"), "{err}");
    }
}
