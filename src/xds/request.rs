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

    /// Read one length-delimited name from `buf`, with no allocation per
    /// name. A name that lies whole in the buffer's current chunk (nearly
    /// always: tonic hands over one contiguous message) is checked as UTF-8
    /// where it lies and copied once; anything else (a name split across
    /// chunks, a wrong wire type, bad UTF-8, a short buffer) takes prost's
    /// own string decoding, which also gives prost's errors.
    fn merge(&mut self, wire_type: WireType, buf: &mut impl Buf, ctx: DecodeContext) -> Result<(), DecodeError> {
        if wire_type == WireType::LengthDelimited {
            let chunk = buf.chunk();
            if let Some((len, head)) = peek_varint(chunk)
                && let Some(bytes) = usize::try_from(len).ok().and_then(|len| chunk.get(head..head.checked_add(len)?))
                && let Ok(name) = std::str::from_utf8(bytes)
            {
                self.text.push_str(name);
                self.ends.push(self.text.len());
                let used = head + bytes.len();
                buf.advance(used);
                return Ok(());
            }
        }
        string::merge(wire_type, &mut self.scratch, buf, ctx)?;
        self.text.push_str(&self.scratch);
        self.ends.push(self.text.len());
        Ok(())
    }
}

/// A varint at the start of `bytes`: its value and length, or `None` if it
/// does not end within them (or within the 10 bytes a varint may take).
fn peek_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, b) in bytes.iter().take(10).enumerate() {
        if i == 9 && *b > 1 {
            // Past 64 bits: prost's decoding says so.
            return None;
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
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

    #[test]
    fn names_split_across_chunks_decode_the_same() {
        let plain = DiscoveryRequest {
            resource_names: (0..50).map(|i| format!("outbound|80||svc-{i}.example")).collect(),
            type_url: "t".into(),
            ..Default::default()
        };
        let bytes = plain.encode_to_vec();
        let whole = SotwRequest::decode(bytes.as_slice()).expect("decode");
        // Every split point: a name (or its length) may straddle the chunks.
        for cut in 0..bytes.len() {
            let (a, b) = bytes.split_at(cut);
            let split = SotwRequest::decode(a.chain(b)).expect("decode a split buffer");
            assert_eq!(split, whole, "cut at {cut}");
        }
        // A length varint longer than 64 bits is refused, as prost does.
        let mut bad = Vec::new();
        encode_key(RESOURCE_NAMES, WireType::LengthDelimited, &mut bad);
        bad.extend_from_slice(&[0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02, b'a']);
        assert!(DiscoveryRequest::decode(bad.as_slice()).is_err());
        assert!(SotwRequest::decode(bad.as_slice()).is_err());
    }
}
