//! A type's resources encoded for a SotW response, kept in parts by name
//! range so that a change re-encodes only its part.
//!
//! An MCP collection to Pilot or CDS to an Envoy carries every resource of
//! its type in each response: 6–14 MB for the ServiceEntries of 10k
//! services. Encoded whole, one changed endpoint re-encoded (and copied,
//! and the allocator kept) all of it on every change. Here the encoding is
//! cut into parts of about [`PART_BYTES`], each covering a range of names:
//! a change empties the cell of the one part whose range holds its name,
//! and the next response encodes that part alone and shares every other
//! part's bytes with the previous state. A response sends the parts one
//! after the other: the `resources` field is repeated, so the concatenation
//! of the parts is the same field list the whole encoding was.

use std::ops::{Bound, Range};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use envoy_types::pb::google::protobuf::Any;
use prost::bytes::{BufMut, Bytes};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

/// `DiscoveryResponse.resources` (envoy/service/discovery/v3/discovery.proto).
const RESOURCES_FIELD: u32 = 2;
/// `google.protobuf.Any.type_url` and `.value` (google/protobuf/any.proto).
const ANY_TYPE_URL: u32 = 1;
const ANY_VALUE: u32 = 2;

/// A resource's message: a `google.protobuf.Any` whose value bytes can be
/// shared. Once a part of the type's SotW encoding holds a resource, its
/// value becomes a slice of that part, so the bytes are held once, not once
/// per resource and again in the encoding (heaptrack at 10k services: the
/// ServiceEntries' 13.7 MB twice). The bytes never change, only where they
/// live.
pub struct Body {
    type_url: Box<str>,
    value: Mutex<Bytes>,
}

impl Body {
    pub fn new(any: Any) -> Body {
        Body { type_url: any.type_url.into_boxed_str(), value: Mutex::new(Bytes::from(any.value)) }
    }

    pub fn type_url(&self) -> &str {
        &self.type_url
    }

    /// The message's bytes (shared, no copy).
    pub fn value(&self) -> Bytes {
        self.value.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The plain message (a copy).
    pub fn to_any(&self) -> Any {
        Any { type_url: self.type_url.to_string(), value: self.value().to_vec() }
    }

    /// The length of the `Any` message.
    pub fn encoded_len(&self) -> usize {
        self.any_len(self.value.lock().unwrap_or_else(PoisonError::into_inner).len())
    }

    /// The length of the `Any` of this type URL and a value of `value` bytes.
    fn any_len(&self, value: usize) -> usize {
        bytes_field_len(ANY_TYPE_URL, self.type_url.len()) + bytes_field_len(ANY_VALUE, value)
    }

    /// The length of the `Any` as field `tag` of a message.
    pub fn field_len(&self, tag: u32) -> usize {
        let len = self.encoded_len();
        key_len(tag) + encoded_len_varint(len as u64) + len
    }

    /// Write the `Any` as field `tag` of a message, as prost does.
    pub fn encode_field(&self, tag: u32, buf: &mut impl BufMut) {
        self.write_field(tag, &self.value(), buf);
    }

    /// [`encode_field`](Self::encode_field) into `buf`, and where in it
    /// the value's bytes went.
    fn encode_field_at(&self, tag: u32, buf: &mut Vec<u8>) -> Range<usize> {
        let value = self.value();
        self.write_field(tag, &value, buf);
        buf.len() - value.len()..buf.len()
    }

    /// Field `tag` holding the `Any` of this type URL and `value`.
    fn write_field(&self, tag: u32, value: &[u8], buf: &mut impl BufMut) {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(self.any_len(value.len()) as u64, buf);
        put_bytes(ANY_TYPE_URL, self.type_url.as_bytes(), buf);
        put_bytes(ANY_VALUE, value, buf);
    }

    /// Hold the value in `bytes` from now on: the same bytes, in a buffer
    /// that is kept anyway (the encoding's), so the value's own is freed.
    fn share(&self, bytes: Bytes) {
        let mut value = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        debug_assert_eq!(*value, bytes, "a body's bytes never change");
        if value.len() == bytes.len() {
            *value = bytes;
        }
    }
}

/// The length of a bytes or string field holding `len` bytes (none when
/// empty: proto3 leaves default values out, as prost does).
fn bytes_field_len(tag: u32, len: usize) -> usize {
    if len == 0 { 0 } else { key_len(tag) + encoded_len_varint(len as u64) + len }
}

fn put_bytes(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    if !bytes.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(bytes.len() as u64, buf);
        buf.put_slice(bytes);
    }
}

impl Clone for Body {
    fn clone(&self) -> Body {
        Body { type_url: self.type_url.clone(), value: Mutex::new(self.value()) }
    }
}

impl PartialEq for Body {
    fn eq(&self, other: &Body) -> bool {
        self.type_url == other.type_url && self.value() == other.value()
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body").field("type_url", &self.type_url).field("len", &self.value().len()).finish()
    }
}

/// About how many bytes one part holds. Large enough that a 14 MB type is
/// a few dozen parts (a response is a few dozen chunks), small enough that
/// re-encoding one costs well under a millisecond.
pub const PART_BYTES: usize = 256 * 1024;

/// Resources already encoded as the repeated `resources` field (number 2)
/// of an `envoy.service.discovery.v3.DiscoveryResponse`: each entry is the
/// field's key, length and `google.protobuf.Any`, in chunks that go on the
/// wire one after the other. Cheap to clone (the chunks are shared).
#[derive(Debug, Clone, Default)]
pub struct EncodedResources {
    chunks: Vec<Bytes>,
    byte_len: usize,
    count: usize,
}

impl EncodedResources {
    /// Encode `bodies` in order, as one chunk.
    pub fn encode<'a>(bodies: impl Iterator<Item = &'a Body> + Clone) -> EncodedResources {
        let len: usize = bodies.clone().map(|b| b.field_len(RESOURCES_FIELD)).sum();
        let mut bytes = Vec::with_capacity(len);
        let mut count = 0;
        for b in bodies {
            b.encode_field(RESOURCES_FIELD, &mut bytes);
            count += 1;
        }
        let mut out = EncodedResources::default();
        out.append(Bytes::from(bytes), count);
        out
    }

    /// Append one resource (decoding, tests).
    pub fn push(&mut self, body: &Body) {
        let mut bytes = Vec::with_capacity(body.field_len(RESOURCES_FIELD));
        body.encode_field(RESOURCES_FIELD, &mut bytes);
        self.append(Bytes::from(bytes), 1);
    }

    fn append(&mut self, chunk: Bytes, count: usize) {
        self.byte_len += chunk.len();
        self.count += count;
        if !chunk.is_empty() {
            self.chunks.push(chunk);
        }
    }

    /// The encoded field entries, in the order they are sent (shared, no
    /// copy).
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// How many bytes the chunks hold together.
    pub fn encoded_len(&self) -> usize {
        self.byte_len
    }

    /// How many resources.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The chunks as one buffer (tests, debugging: a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        self.chunks.concat()
    }

    /// How many chunks `self` shares with `other` (the same buffers, not
    /// merely equal bytes).
    pub fn shared_chunks(&self, other: &EncodedResources) -> usize {
        self.chunks.iter().filter(|c| other.chunks.iter().any(|o| same_buffer(c, o))).count()
    }

    /// True if both are one encoding: every chunk the same buffer.
    pub fn shares(&self, other: &EncodedResources) -> bool {
        self.chunks.len() == other.chunks.len() && self.chunks.iter().zip(&other.chunks).all(|(a, b)| same_buffer(a, b))
    }
}

fn same_buffer(a: &Bytes, b: &Bytes) -> bool {
    a.as_ptr() == b.as_ptr() && a.len() == b.len()
}

/// Equal bytes and count, however they are chunked.
impl PartialEq for EncodedResources {
    fn eq(&self, other: &EncodedResources) -> bool {
        self.count == other.count
            && self.byte_len == other.byte_len
            && self.chunks.iter().flat_map(|c| c.iter()).eq(other.chunks.iter().flat_map(|c| c.iter()))
    }
}

/// One encoded run of resources, and the name of its first.
#[derive(Debug, Clone)]
struct Piece {
    first: Arc<str>,
    bytes: Bytes,
    count: usize,
}

/// The encoding of one part: pieces of at most about [`PART_BYTES`] each
/// (a part that grew past it is split at the pieces on its next change).
#[derive(Debug, Default)]
struct Encoded {
    pieces: Vec<Piece>,
    len: usize,
}

type Cell = Arc<OnceLock<Encoded>>;

/// The parts of one type's whole encoding: each key is the first name its
/// part may hold (the first part's is `""`, which sorts first), and the
/// part runs up to the next key. A cell is filled on first use and shared
/// by every clone of the map until a change in its range replaces it.
#[derive(Debug, Clone)]
pub(super) struct Parts {
    cells: imbl::OrdMap<Arc<str>, Cell>,
}

impl Default for Parts {
    fn default() -> Self {
        let mut cells = imbl::OrdMap::new();
        cells.insert(Arc::from(""), Cell::default());
        Parts { cells }
    }
}

impl Parts {
    /// Every resource of `by_name` encoded in name order: each part is
    /// encoded at most once per state and shared with the states before and
    /// after it that did not change it.
    /// `body` gives a resource's message (the map is the caller's).
    pub fn encoded<V: Clone>(&self, by_name: &imbl::OrdMap<Arc<str>, V>, body: fn(&V) -> &Body) -> EncodedResources {
        let mut out = EncodedResources::default();
        let mut iter = self.cells.iter().peekable();
        while let Some((lo, cell)) = iter.next() {
            let hi = iter.peek().map(|(k, _)| &***k);
            let enc = cell.get_or_init(|| encode_range(by_name, body, lo, hi));
            for p in &enc.pieces {
                out.append(p.bytes.clone(), p.count);
            }
        }
        out
    }

    /// `name` was added, changed or removed: empty the cell of its part
    /// (splitting a part that grew past [`PART_BYTES`] at its pieces, so
    /// only the piece that holds `name` is encoded again), and join it with
    /// a neighbour that is also empty or small.
    pub fn changed(&mut self, name: &str) {
        let Some((lo, cell)) = self.containing(name) else {
            return;
        };
        let Some(enc) = cell.get() else {
            // Already to be encoded.
            return;
        };
        let mut key = lo.clone();
        if enc.pieces.len() > 1 {
            for (i, p) in enc.pieces.iter().enumerate() {
                let k = if i == 0 { lo.clone() } else { p.first.clone() };
                let one = Encoded { pieces: vec![p.clone()], len: p.bytes.len() };
                self.cells.insert(k, Arc::new(OnceLock::from(one)));
            }
            key = self.containing(name).map(|(k, _)| k.clone()).unwrap_or(lo);
        }
        self.cells.insert(key.clone(), Cell::default());
        self.absorb_next(&key);
        if let Some(prev) = self.cells.range::<_, str>((Bound::Unbounded, Bound::Excluded(&*key))).next_back() {
            let prev_key = prev.0.clone();
            if absorbable(prev.1) {
                self.cells.remove(&*key);
                self.cells.insert(prev_key, Cell::default());
            }
        }
    }

    /// How many parts (tests, debugging).
    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.cells.len()
    }

    fn containing(&self, name: &str) -> Option<(Arc<str>, Cell)> {
        self.cells
            .range::<_, str>((Bound::Unbounded, Bound::Included(name)))
            .next_back()
            .map(|(k, c)| (k.clone(), c.clone()))
    }

    /// The part after the (empty) one at `key` joins it if it is empty or
    /// small: a small part is cheap to encode again, and joining keeps the
    /// number of parts in proportion to the type's size.
    fn absorb_next(&mut self, key: &Arc<str>) {
        let next = self.cells.range::<_, str>((Bound::Excluded(&**key), Bound::Unbounded)).next();
        if let Some((next_key, next_cell)) = next
            && absorbable(next_cell)
        {
            let next_key = next_key.clone();
            self.cells.remove(&*next_key);
        }
    }
}

/// A part worth joining to an emptied neighbour: empty itself, or filled
/// with less than a quarter of a part.
fn absorbable(cell: &Cell) -> bool {
    cell.get().is_none_or(|e| e.len < PART_BYTES / 4)
}

/// Encode the resources named from `lo` (inclusive) to `hi` (exclusive), in
/// pieces of about [`PART_BYTES`].
fn encode_range<V: Clone>(
    by_name: &imbl::OrdMap<Arc<str>, V>,
    body: fn(&V) -> &Body,
    lo: &str,
    hi: Option<&str>,
) -> Encoded {
    let upper = hi.map_or(Bound::Unbounded, Bound::Excluded);
    let mut out = Encoded::default();
    let mut buf: Vec<u8> = Vec::new();
    let mut first: Option<Arc<str>> = None;
    // The bodies in `buf` and where their values lie, to share once frozen.
    let mut values: Vec<(&Body, Range<usize>)> = Vec::new();
    for (name, r) in by_name.range::<_, str>((Bound::Included(lo), upper)) {
        if first.is_none() {
            first = Some(name.clone());
        }
        let b = body(r);
        let at = b.encode_field_at(RESOURCES_FIELD, &mut buf);
        values.push((b, at));
        if buf.len() >= PART_BYTES {
            out.close(&mut first, &mut buf, &mut values);
        }
    }
    out.close(&mut first, &mut buf, &mut values);
    out
}

impl Encoded {
    /// The piece in `buf` is complete: keep it, and let its bodies hold
    /// their values in it.
    fn close(&mut self, first: &mut Option<Arc<str>>, buf: &mut Vec<u8>, values: &mut Vec<(&Body, Range<usize>)>) {
        if let Some(first) = first.take() {
            let mut full = std::mem::take(buf);
            // The bytes keep their buffer's capacity: give back the slack
            // its doubling left.
            if full.capacity() > full.len() + full.len() / 8 {
                full.shrink_to_fit();
            }
            let bytes = Bytes::from(full);
            for (b, at) in values.iter() {
                b.share(bytes.slice(at.clone()));
            }
            self.len += bytes.len();
            self.pieces.push(Piece { first, bytes, count: values.len() });
            values.clear();
        }
    }
}
