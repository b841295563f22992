//! Responses encoded from the published resources without copying them.
//!
//! SotW: a `DiscoveryResponse` whose resources are already encoded.
//!
//! A full-state response (an MCP collection to Pilot, CDS to Envoy) carries
//! every resource of its type: 6–14 MB for the ServiceEntries of 10k
//! services. Built as a prost `DiscoveryResponse`, every stream would clone
//! each resource's `Any`, encode them all, then free them, on every change.
//! [`SotwResponse`] instead carries the `resources` field as bytes
//! ([`EncodedResources`]), encoded once per type state and shared by every
//! stream that wants the whole type; only the few per-stream fields
//! (version, type URL, nonce) are encoded per response.
//!
//! On the wire it is an ordinary `DiscoveryResponse`: a protobuf message is
//! the concatenation of its fields ("Encoding: Message Structure"), and
//! parsers accept fields in any order, though this writes them in field
//! order as prost does.
//!
//! Delta: a [`DeltaResponse`] holds the published `Arc<Resource>`s and
//! encodes each as an `envoy.service.discovery.v3.Resource` straight from
//! them. Built as a prost `DeltaDiscoveryResponse`, a stream's first
//! response copied every name, version and body (four allocations per
//! resource, 20k resources at 10k services, for each of 100 streams) only
//! to encode and free them; the churn left the allocator's heap
//! fragmented (BENCHMARKS.md, "xDS memory").

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource as XdsResource,
};
use envoy_types::pb::google::protobuf::Any;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, message, skip_field, string};
use prost::{DecodeError, Message};

use crate::resources::{Body, EncodedResources, Resource};

/// `DiscoveryResponse` field numbers (envoy/service/discovery/v3/discovery.proto).
const VERSION_INFO: u32 = 1;
const RESOURCES: u32 = 2;
const TYPE_URL: u32 = 4;
const NONCE: u32 = 5;

/// A SotW response as sent: encodes to the same bytes as the
/// `DiscoveryResponse` [`decoded`](Self::decoded) returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SotwResponse {
    pub version_info: String,
    pub resources: EncodedResources,
    pub type_url: String,
    pub nonce: String,
}

impl SotwResponse {
    /// The plain message (tests, debugging): decodes every resource.
    pub fn decoded(&self) -> DiscoveryResponse {
        DiscoveryResponse::decode(self.encode_to_vec().as_slice())
            .expect("a SotwResponse encodes a valid DiscoveryResponse")
    }

    /// The request a client sends to ACK this response while asking for
    /// `names` (tests and benches driving a stream by hand).
    pub fn ack(&self, names: &[String]) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: self.type_url.clone(),
            resource_names: names.to_vec(),
            version_info: self.version_info.clone(),
            response_nonce: self.nonce.clone(),
            ..Default::default()
        }
    }
}

impl SotwResponse {
    /// The fields before `resources`.
    pub(super) fn encode_head(&self, buf: &mut impl BufMut) {
        if !self.version_info.is_empty() {
            string::encode(VERSION_INFO, &self.version_info, buf);
        }
    }

    /// The fields after `resources`.
    pub(super) fn encode_tail(&self, buf: &mut impl BufMut) {
        if !self.type_url.is_empty() {
            string::encode(TYPE_URL, &self.type_url, buf);
        }
        if !self.nonce.is_empty() {
            string::encode(NONCE, &self.nonce, buf);
        }
    }
}

impl Message for SotwResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.encode_head(buf);
        for chunk in self.resources.chunks() {
            buf.put_slice(chunk);
        }
        self.encode_tail(buf);
    }

    /// Decoding is for tests (the server only encodes): fields this type
    /// does not keep (canary, control_plane, …) are skipped.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            VERSION_INFO => string::merge(wire_type, &mut self.version_info, buf, ctx),
            RESOURCES => {
                let mut any = Any::default();
                message::merge(wire_type, &mut any, buf, ctx)?;
                self.resources.push(&Body::new(any));
                Ok(())
            }
            TYPE_URL => string::merge(wire_type, &mut self.type_url, buf, ctx),
            NONCE => string::merge(wire_type, &mut self.nonce, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let s = |tag, v: &String| if v.is_empty() { 0 } else { string::encoded_len(tag, v) };
        s(VERSION_INFO, &self.version_info)
            + self.resources.encoded_len()
            + s(TYPE_URL, &self.type_url)
            + s(NONCE, &self.nonce)
    }

    fn clear(&mut self) {
        *self = SotwResponse::default();
    }
}

/// `DeltaDiscoveryResponse` field numbers (the same proto file).
const DELTA_RESOURCES: u32 = 2;
const DELTA_TYPE_URL: u32 = 4;
const DELTA_NONCE: u32 = 5;
const DELTA_REMOVED: u32 = 6;
/// `Resource` field numbers.
const RESOURCE_VERSION: u32 = 1;
const RESOURCE_BODY: u32 = 2;
const RESOURCE_NAME: u32 = 3;

/// A delta response as sent: encodes to the same bytes as the
/// `DeltaDiscoveryResponse` [`decoded`](Self::decoded) returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeltaResponse {
    /// New and changed resources, shared with the published set.
    pub resources: Vec<Arc<Resource>>,
    pub type_url: String,
    pub removed_resources: Vec<String>,
    pub nonce: String,
}

impl DeltaResponse {
    /// The plain message (tests, debugging).
    pub fn decoded(&self) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse::decode(self.encode_to_vec().as_slice())
            .expect("a DeltaResponse encodes a valid DeltaDiscoveryResponse")
    }
}

/// The length of `r` encoded as a `Resource` message (written in field
/// number order, as prost does: version, resource, name).
fn resource_len(r: &Resource) -> usize {
    let s = |tag, v: &str| if v.is_empty() { 0 } else { string_len(tag, v) };
    s(RESOURCE_NAME, &r.name) + s(RESOURCE_VERSION, &r.version) + r.body.field_len(RESOURCE_BODY)
}

fn string_len(tag: u32, v: &str) -> usize {
    prost::encoding::key_len(tag) + prost::encoding::encoded_len_varint(v.len() as u64) + v.len()
}

fn put_str(tag: u32, v: &str, buf: &mut impl BufMut) {
    if !v.is_empty() {
        prost::encoding::encode_key(tag, WireType::LengthDelimited, buf);
        prost::encoding::encode_varint(v.len() as u64, buf);
        buf.put_slice(v.as_bytes());
    }
}

impl DeltaResponse {
    /// Encode from resource `*at` on until `buf` holds at least `budget`
    /// bytes, moving `*at` past what was written; the other fields go after
    /// the last resource. True once the whole message is written: called
    /// until then, the parts concatenated are [`Message::encode_raw`]'s bytes.
    pub fn encode_part(&self, at: &mut usize, budget: usize, buf: &mut impl BufMut) -> bool {
        let start = buf.remaining_mut();
        while let Some(r) = self.resources.get(*at) {
            if start - buf.remaining_mut() >= budget {
                return false;
            }
            prost::encoding::encode_key(DELTA_RESOURCES, WireType::LengthDelimited, buf);
            prost::encoding::encode_varint(resource_len(r) as u64, buf);
            put_str(RESOURCE_VERSION, &r.version, buf);
            r.body.encode_field(RESOURCE_BODY, buf);
            put_str(RESOURCE_NAME, &r.name, buf);
            *at += 1;
        }
        put_str(DELTA_TYPE_URL, &self.type_url, buf);
        put_str(DELTA_NONCE, &self.nonce, buf);
        for name in &self.removed_resources {
            string::encode(DELTA_REMOVED, name, buf);
        }
        true
    }
}

impl Message for DeltaResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        let mut at = 0;
        self.encode_part(&mut at, usize::MAX, buf);
    }

    /// Decoding is for tests (the server only encodes): fields this type
    /// does not keep are skipped.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            DELTA_RESOURCES => {
                let mut r = XdsResource::default();
                message::merge(wire_type, &mut r, buf, ctx)?;
                let body = r.resource.unwrap_or_default();
                self.resources.push(Arc::new(Resource::with_version(r.name, r.version, body)));
                Ok(())
            }
            DELTA_TYPE_URL => string::merge(wire_type, &mut self.type_url, buf, ctx),
            DELTA_REMOVED => string::merge_repeated(wire_type, &mut self.removed_resources, buf, ctx),
            DELTA_NONCE => string::merge(wire_type, &mut self.nonce, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let s = |tag, v: &str| if v.is_empty() { 0 } else { string_len(tag, v) };
        self.resources
            .iter()
            .map(|r| {
                let len = resource_len(r);
                prost::encoding::key_len(DELTA_RESOURCES) + prost::encoding::encoded_len_varint(len as u64) + len
            })
            .sum::<usize>()
            + s(DELTA_TYPE_URL, &self.type_url)
            + string::encoded_len_repeated(DELTA_REMOVED, &self.removed_resources)
            + s(DELTA_NONCE, &self.nonce)
    }

    fn clear(&mut self) {
        *self = DeltaResponse::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any(i: u8) -> Any {
        Any { type_url: format!("type.googleapis.com/t{i}"), value: vec![i; 3 + i as usize] }
    }

    #[test]
    fn encodes_as_the_plain_message_does() {
        let anys: Vec<Any> = (0..5).map(any).collect();
        let plain = DiscoveryResponse {
            version_info: "v1".into(),
            resources: anys.clone(),
            type_url: "type.googleapis.com/t".into(),
            nonce: "7".into(),
            ..Default::default()
        };
        let ours = SotwResponse {
            version_info: "v1".into(),
            resources: EncodedResources::encode(anys.iter().cloned().map(Body::new).collect::<Vec<_>>().iter()),
            type_url: "type.googleapis.com/t".into(),
            nonce: "7".into(),
        };
        assert_eq!(ours.encode_to_vec(), plain.encode_to_vec());
        assert_eq!(ours.encoded_len(), plain.encoded_len());
        assert_eq!(ours.decoded(), plain);
        // And it decodes into itself.
        assert_eq!(SotwResponse::decode(plain.encode_to_vec().as_slice()).expect("decode"), ours);
        let empty = SotwResponse::default();
        assert_eq!(empty.encoded_len(), 0);
        assert_eq!(empty.decoded(), DiscoveryResponse::default());
    }

    #[test]
    fn a_delta_response_encodes_as_the_plain_message_does() {
        let resources: Vec<Arc<Resource>> = (0..5).map(|i| Arc::new(Resource::new(format!("r{i}"), any(i)))).collect();
        let plain = DeltaDiscoveryResponse {
            resources: resources
                .iter()
                .map(|r| XdsResource {
                    name: r.name.to_string(),
                    version: r.version.to_string(),
                    resource: Some(r.body.to_any()),
                    ..Default::default()
                })
                .collect(),
            type_url: "type.googleapis.com/t".into(),
            removed_resources: vec!["gone".into(), "also-gone".into()],
            nonce: "7".into(),
            ..Default::default()
        };
        let ours = DeltaResponse {
            resources,
            type_url: plain.type_url.clone(),
            removed_resources: plain.removed_resources.clone(),
            nonce: "7".into(),
        };
        assert_eq!(ours.encode_to_vec(), plain.encode_to_vec());
        assert_eq!(ours.encoded_len(), plain.encoded_len());
        assert_eq!(ours.decoded(), plain);
        assert_eq!(DeltaResponse::decode(plain.encode_to_vec().as_slice()).expect("decode"), ours);
        let empty = DeltaResponse::default();
        assert_eq!(empty.encoded_len(), 0);
        assert_eq!(empty.decoded(), DeltaDiscoveryResponse::default());
    }
}
