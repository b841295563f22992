//! Istio networking and MCP messages, from the hand-written protos in this
//! crate (see `istio/`).
//!
//! The server encodes Istio specs through the generated prost structs below
//! (meshbridge's `translate::pb` converts its typed model into them).
//! [`encode_json`] and [`decode_to_json`] go through [`prost_reflect`]
//! instead: JSON checked against the schema, with no Rust struct in
//! between. They serve tests, the golden check of the typed encoding, and
//! debugging.

// No unwrap() outside tests: errors are handled, or expect()ed with a reason.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use std::sync::OnceLock;

use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, SerializeOptions,
    Value,
};

pub mod envoy;

pub mod istio {
    pub mod mcp {
        pub mod v1alpha1 {
            include!(concat!(env!("OUT_DIR"), "/istio.mcp.v1alpha1.rs"));
        }
    }
    pub mod networking {
        pub mod v1alpha3 {
            include!(concat!(env!("OUT_DIR"), "/istio.networking.v1alpha3.rs"));
        }
    }
    pub mod security {
        pub mod v1beta1 {
            include!(concat!(env!("OUT_DIR"), "/istio.security.v1beta1.rs"));
        }
    }
    pub mod r#type {
        pub mod v1beta1 {
            include!(concat!(env!("OUT_DIR"), "/istio.r#type.v1beta1.rs"));
        }
    }
}

/// The protobuf package of every Istio networking kind meshbridge emits.
pub const NETWORKING_PACKAGE: &str = "istio.networking.v1alpha3";
/// The protobuf package of the security kinds (AuthorizationPolicy).
pub const SECURITY_PACKAGE: &str = "istio.security.v1beta1";

static FDS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/istio_fds.bin"));

/// The descriptor pool of every message in proto/istio.
pub fn descriptor_pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(FDS).expect("build.rs wrote a valid descriptor set"))
}

/// Why a spec could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// No message of that full name exists in [`descriptor_pool`].
    #[error("unknown message type {0:?}")]
    UnknownMessage(String),
    /// The JSON does not fit the schema: an unknown field, a wrong type, an
    /// unknown enum name, two members of one oneof. `path` is where in the
    /// spec (e.g. `http[0].route[1].destination`), `None` at the top level.
    #[error("{message}{}: {source}", path.as_deref().map(|p| format!(" at {p}")).unwrap_or_default())]
    Json { message: String, path: Option<String>, source: serde_json::Error },
    /// The bytes are not a valid encoding of the message.
    #[error("{message}: {source}")]
    Decode { message: String, source: prost::DecodeError },
    /// The decoded message could not be written as JSON.
    #[error("{message}: writing JSON: {source}")]
    ToJson { message: String, source: serde_json::Error },
}

fn message_descriptor(full_name: &str) -> Result<MessageDescriptor, EncodeError> {
    descriptor_pool().get_message_by_name(full_name).ok_or_else(|| EncodeError::UnknownMessage(full_name.to_owned()))
}

/// Encode an Istio spec given in JSON (protobuf JSON mapping) as the message `full_name`
/// (e.g. "istio.networking.v1alpha3.VirtualService"). Unknown fields, wrong types and
/// unknown enum names are errors that name the field path when prost-reflect gives one.
///
/// The encoding is deterministic (fields by number, map entries by key), so
/// equal specs give equal bytes and content-hash versions stay put.
pub fn encode_json(full_name: &str, spec: &serde_json::Value) -> Result<Vec<u8>, EncodeError> {
    let desc = message_descriptor(full_name)?;
    // Pilot never NACKs, so anything outside the schema must fail here.
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(spec, &mut track);
    let msg = DynamicMessage::deserialize_with_options(desc, de, &options).map_err(|source| {
        let path = track.path().to_string();
        EncodeError::Json { message: full_name.to_owned(), path: (path != ".").then_some(path), source }
    })?;
    let mut buf = Vec::new();
    encode_sorted(&msg, &mut buf);
    Ok(buf)
}

/// The reverse, for tests and debugging.
///
/// Fields at their default value are left out (so a round trip compares
/// equal to a spec that omits them), and 64-bit integers are written as
/// numbers, as Kubernetes objects carry them.
pub fn decode_to_json(full_name: &str, bytes: &[u8]) -> Result<serde_json::Value, EncodeError> {
    let desc = message_descriptor(full_name)?;
    let msg = DynamicMessage::decode(desc, bytes)
        .map_err(|source| EncodeError::Decode { message: full_name.to_owned(), source })?;
    let options = SerializeOptions::new().skip_default_fields(true).stringify_64_bit_integers(false);
    msg.serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|source| EncodeError::ToJson { message: full_name.to_owned(), source })
}

// prost-reflect keeps map fields in a `HashMap` and encodes them in its
// iteration order, which differs from run to run. We walk the message
// ourselves, sort map entries by key, and hand every non-message value back
// to prost-reflect so scalar, packed and oneof encoding stay its own.

fn encode_sorted(msg: &DynamicMessage, buf: &mut Vec<u8>) {
    for (field, value) in msg.fields() {
        encode_field(&field, value, buf);
    }
}

fn encode_field(field: &FieldDescriptor, value: &Value, buf: &mut Vec<u8>) {
    match value {
        Value::Map(entries) => {
            let Kind::Message(entry_desc) = field.kind() else { unreachable!("map field without entry type") };
            let (key_field, value_field) = (entry_desc.map_entry_key_field(), entry_desc.map_entry_value_field());
            let mut sorted: Vec<_> = entries.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (key, value) in sorted {
                let mut entry = Vec::new();
                encode_field(&key_field, &Value::from(key.clone()), &mut entry);
                encode_field(&value_field, value, &mut entry);
                encode_len_delimited(field.number(), &entry, buf);
            }
        }
        Value::List(items) if field.kind().as_message().is_some() => {
            for item in items {
                encode_field_message(field, item, buf);
            }
        }
        Value::Message(_) => encode_field_message(field, value, buf),
        _ => {
            let mut single = DynamicMessage::new(field.parent_message().clone());
            single.set_field(field, value.clone());
            prost::Message::encode_raw(&single, buf);
        }
    }
}

fn encode_field_message(field: &FieldDescriptor, value: &Value, buf: &mut Vec<u8>) {
    let Value::Message(msg) = value else { unreachable!("message field holds {value:?}") };
    let mut body = Vec::new();
    encode_sorted(msg, &mut body);
    encode_len_delimited(field.number(), &body, buf);
}

fn encode_len_delimited(number: u32, body: &[u8], buf: &mut Vec<u8>) {
    prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, buf);
    prost::encoding::encode_varint(body.len() as u64, buf);
    buf.extend_from_slice(body);
}
