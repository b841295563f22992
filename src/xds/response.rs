//! A SotW `DiscoveryResponse` whose resources are already encoded.
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

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, message, skip_field, string};
use prost::{DecodeError, Message};

use crate::resources::EncodedResources;

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
        buf.put_slice(self.resources.bytes());
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
                self.resources.push(&any);
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
            + self.resources.bytes().len()
            + s(TYPE_URL, &self.type_url)
            + s(NONCE, &self.nonce)
    }

    fn clear(&mut self) {
        *self = SotwResponse::default();
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
            resources: EncodedResources::encode(anys.iter()),
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
}
