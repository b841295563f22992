//! A SotW `DiscoveryRequest` whose resource names are decoded into one
//! buffer instead of one `String` each.
//!
//! Envoy's EDS request names every cluster it has, and it repeats them in
//! the ACK of every EDS response: 10k names at 10k services, on every
//! change. Decoded as prost's `DiscoveryRequest` that is 10k allocations
//! and frees per ACK, the largest per-change cost of a SotW stream once the
//! responses are shared (BENCHMARKS.md, "SotW and MCP per-change cost").
//! [`SotwRequest`] keeps the names packed; the stream compares them with
//! the subscription it holds and builds a new one only when they differ.

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint, key_len, string};
use prost::{DecodeError, Message};

/// `DiscoveryRequest.resource_names` (envoy/service/discovery/v3/discovery.proto).
const RESOURCE_NAMES: u32 = 3;

/// A SotW request as received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SotwRequest {
    /// Every field but `resource_names`, which stays empty.
    pub req: DiscoveryRequest,
    pub names: Names,
}

/// Resource names, packed: `text[ends[i-1]..ends[i]]` is name `i`.
#[derive(Debug, Clone, Default)]
pub struct Names {
    text: String,
    ends: Vec<usize>,
    /// The name being decoded.
    scratch: String,
}

impl Names {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Name `i`.
    pub fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        // Every end is a char boundary (whole names were pushed): the
        // empty fallback is unreachable.
        self.text.get(start..self.ends[i]).unwrap_or_default()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + Clone {
        (0..self.len()).map(|i| self.get(i))
    }

    fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len());
    }

    /// Read one length-delimited name from `buf` (prost's own string
    /// decoding, into a reused buffer: no allocation per name).
    fn merge(&mut self, wire_type: WireType, buf: &mut impl Buf, ctx: DecodeContext) -> Result<(), DecodeError> {
        string::merge(wire_type, &mut self.scratch, buf, ctx)?;
        self.text.push_str(&self.scratch);
        self.ends.push(self.text.len());
        Ok(())
    }
}

impl PartialEq for Names {
    fn eq(&self, other: &Names) -> bool {
        self.text == other.text && self.ends == other.ends
    }
}

impl From<DiscoveryRequest> for SotwRequest {
    fn from(mut req: DiscoveryRequest) -> Self {
        let mut names = Names::default();
        for n in std::mem::take(&mut req.resource_names) {
            names.push(&n);
        }
        SotwRequest { req, names }
    }
}

impl Message for SotwRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.req.encode_raw(buf);
        for n in self.names.iter() {
            encode_key(RESOURCE_NAMES, WireType::LengthDelimited, buf);
            encode_varint(n.len() as u64, buf);
            buf.put_slice(n.as_bytes());
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag == RESOURCE_NAMES {
            self.names.merge(wire_type, buf, ctx)
        } else {
            self.req.merge_field(tag, wire_type, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        let names: usize =
            self.names.iter().map(|n| key_len(RESOURCE_NAMES) + encoded_len_varint(n.len() as u64) + n.len()).sum();
        self.req.encoded_len() + names
    }

    fn clear(&mut self) {
        *self = SotwRequest::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_a_discovery_request_encodes() {
        let plain = DiscoveryRequest {
            version_info: "v".into(),
            resource_names: vec!["a".into(), "".into(), "outbound|80||é.example".into()],
            type_url: "t".into(),
            response_nonce: "3".into(),
            ..Default::default()
        };
        let bytes = plain.encode_to_vec();
        let ours = SotwRequest::decode(bytes.as_slice()).expect("decode");
        assert_eq!(ours.names.iter().collect::<Vec<_>>(), ["a", "", "outbound|80||é.example"]);
        assert_eq!(ours.req, DiscoveryRequest { resource_names: Vec::new(), ..plain.clone() });
        assert_eq!(ours, SotwRequest::from(plain.clone()));
        assert_eq!(ours.encoded_len(), bytes.len());
        assert_eq!(DiscoveryRequest::decode(ours.encode_to_vec().as_slice()).expect("round trip"), plain);

        // A name that is not UTF-8 is refused, as prost refuses it.
        let mut bad = Vec::new();
        encode_key(RESOURCE_NAMES, WireType::LengthDelimited, &mut bad);
        encode_varint(2, &mut bad);
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert!(SotwRequest::decode(bad.as_slice()).is_err());
        assert!(DiscoveryRequest::decode(bad.as_slice()).is_err());
        // A length past the end is refused.
        assert!(SotwRequest::decode(&bad[..bad.len() - 1]).is_err());
    }
}
