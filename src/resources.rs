//! The published resources of one type (an Envoy type URL or an MCP
//! collection), kept so that every step after translation costs what
//! changed, not what exists:
//!
//! - a persistent map (`imbl`), so publishing a new set clones in O(1) and
//!   shares every unchanged entry with the previous one;
//! - a change log of `(revision, name)`, so a stream that last saw revision
//!   `r` finds what changed since without comparing every resource;
//! - a type version kept up to date per change (an XOR of per-resource
//!   hashes), so a response never hashes the whole type;
//! - the whole type encoded on first use as the `resources` field of a SotW
//!   response ([`TypeResources::encoded_all`]), in parts by name range, so
//!   every SotW stream that wants the whole type (an istiod fleet on an MCP
//!   collection, Envoys on CDS) shares one encoding per revision, and a
//!   change re-encodes only its part ([`encoded`]).
//!
//! A leaf module: translation writes it, `xds` reads it.

use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;

mod encoded;

pub use encoded::{Body, EncodedResources, PART_BYTES};

/// An xDS or MCP resource ready to send: its name, content-hash version and
/// body. Names and versions are shared (`Arc<str>`) with every stream that
/// remembers them.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub name: Arc<str>,
    pub version: Arc<str>,
    pub body: Body,
}

impl Resource {
    /// Wrap a message, versioning it by the hash of its encoding.
    pub fn new(name: impl Into<Arc<str>>, body: Any) -> Resource {
        let version = content_hash(&body.value).into();
        Resource { name: name.into(), version, body: Body::new(body) }
    }

    /// A resource with a version computed by the caller (MCP resources hash
    /// what Pilot sees, not their creation time).
    pub fn with_version(name: impl Into<Arc<str>>, version: impl Into<Arc<str>>, body: Any) -> Resource {
        Resource { name: name.into(), version: version.into(), body: Body::new(body) }
    }
}

/// FNV-1a (64 bit): stable across processes and Rust versions, unlike
/// `DefaultHasher`, so a reconnecting client's versions still match.
pub fn hash64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// [`hash64`] as 16 hex digits.
pub fn content_hash(bytes: &[u8]) -> String {
    format!("{:016x}", hash64(bytes))
}

/// How many log entries are kept at least; the log also keeps two per
/// resource, so one full resync of the type is always covered.
const MIN_LOG: usize = 4096;

/// The resources of one type, by name, with their change log.
#[derive(Debug, Clone)]
pub struct TypeResources {
    /// Which history this map belongs to: each new map starts one, clones
    /// continue it. Revisions from [`changed_since`](Self::changed_since)
    /// only mean something within one lineage (the publisher's sets form one
    /// linear history per type).
    lineage: u64,
    by_name: imbl::OrdMap<Arc<str>, Arc<Resource>>,
    /// `(revision, name)` of every insert, update and removal, in revision order.
    log: imbl::Vector<(u64, Arc<str>)>,
    /// Every change after this revision is in `log`.
    log_floor: u64,
    /// XOR over the resources of `hash64(name, 0, version)`.
    version: u64,
    /// Every resource encoded, in parts by name range, each filled on first
    /// use. Clones share the parts; a change empties only its own part.
    parts: encoded::Parts,
}

impl Default for TypeResources {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        TypeResources {
            lineage: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            by_name: imbl::OrdMap::new(),
            log: imbl::Vector::new(),
            log_floor: 0,
            version: 0,
            parts: encoded::Parts::default(),
        }
    }
}

fn entry_hash(name: &str, version: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes().chain([0]).chain(version.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl TypeResources {
    pub fn get(&self, name: &str) -> Option<&Arc<Resource>> {
        self.by_name.get(name)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Every resource, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Resource>> {
        self.by_name.values()
    }

    /// Every name, in order.
    pub fn names(&self) -> impl Iterator<Item = &Arc<str>> {
        self.by_name.keys()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The type's version: changes whenever any resource is added, changed
    /// or removed; the same content always gives the same version.
    pub fn version(&self) -> String {
        format!("{:016x}", self.version)
    }

    /// Every resource, in name order, encoded for a SotW response: each
    /// part of it is encoded once per state of the map and shared by its
    /// clones, so N streams that want the whole type cost one encoding, not
    /// N, and a change re-encodes only the part (about [`PART_BYTES`]) that
    /// holds it.
    pub fn encoded_all(&self) -> EncodedResources {
        self.parts.encoded(&self.by_name, |r| &r.body)
    }

    /// True if `self` and `other` are states of one history (one is a
    /// modified clone of the other), so that revisions compare.
    pub fn same_lineage(&self, other: &TypeResources) -> bool {
        self.lineage == other.lineage
    }

    /// Names added, changed or removed after `revision` (each at most once,
    /// in the order of their last change), or `None` when the log no longer
    /// reaches back that far and the caller must compare everything.
    pub fn changed_since(&self, revision: u64) -> Option<Vec<Arc<str>>> {
        if revision < self.log_floor {
            return None;
        }
        // The log is sorted by revision: find the first entry after `revision`.
        let (mut lo, mut hi) = (0, self.log.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.log[mid].0 <= revision { lo = mid + 1 } else { hi = mid }
        }
        let tail = self.log.skip(lo);
        let mut seen = std::collections::HashSet::with_capacity(tail.len());
        let mut out: Vec<Arc<str>> = Vec::with_capacity(tail.len());
        for (_, name) in tail.iter().rev() {
            if seen.insert(name.clone()) {
                out.push(name.clone());
            }
        }
        out.reverse();
        Some(out)
    }

    /// Insert or replace a resource at `revision`; true if anything changed
    /// (a resource with the same version is left alone).
    pub fn insert(&mut self, revision: u64, resource: Resource) -> bool {
        self.insert_arc(revision, Arc::new(resource))
    }

    /// [`insert`](Self::insert) for a resource already shared.
    pub fn insert_arc(&mut self, revision: u64, resource: Arc<Resource>) -> bool {
        if let Some(old) = self.by_name.get(&*resource.name) {
            if old.version == resource.version {
                return false;
            }
            self.version ^= entry_hash(&old.name, &old.version);
        }
        self.version ^= entry_hash(&resource.name, &resource.version);
        self.log_change(revision, resource.name.clone());
        self.by_name.insert(resource.name.clone(), resource);
        true
    }

    /// Remove a resource at `revision`; true if it was there.
    pub fn remove(&mut self, revision: u64, name: &str) -> bool {
        let Some(old) = self.by_name.remove(name) else {
            return false;
        };
        self.version ^= entry_hash(&old.name, &old.version);
        self.log_change(revision, old.name.clone());
        true
    }

    /// Make the type hold exactly `resources`: inserts what is new or
    /// changed and removes what is missing. O(size of the type), for types
    /// that are rebuilt whole (listeners, routes).
    pub fn replace_all(&mut self, revision: u64, resources: impl IntoIterator<Item = Arc<Resource>>) -> bool {
        let mut keep = std::collections::HashSet::new();
        let mut changed = false;
        for r in resources {
            keep.insert(r.name.clone());
            changed |= self.insert_arc(revision, r);
        }
        let gone: Vec<Arc<str>> = self.by_name.keys().filter(|n| !keep.contains(*n)).cloned().collect();
        for name in gone {
            changed |= self.remove(revision, &name);
        }
        changed
    }

    /// Alias of [`names`](Self::names), as for a map.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.names()
    }

    /// Alias of [`contains`](Self::contains), as for a map.
    pub fn contains_key(&self, name: &str) -> bool {
        self.contains(name)
    }

    fn log_change(&mut self, revision: u64, name: Arc<str>) {
        // Every change comes through here: the part of the encoding that
        // holds `name` no longer holds.
        self.parts.changed(&name);
        debug_assert!(self.log.last().is_none_or(|(r, _)| *r <= revision), "revisions only grow");
        self.log.push_back((revision, name));
        let cap = MIN_LOG.max(2 * self.by_name.len());
        while self.log.len() > cap {
            if let Some((r, _)) = self.log.pop_front() {
                // Entries of revision `r` may remain; only what is strictly
                // older than them is guaranteed gone.
                self.log_floor = self.log_floor.max(r);
            }
        }
    }
}

/// `set[name]`, as for a map: panics when the name is missing.
impl std::ops::Index<&str> for TypeResources {
    type Output = Resource;
    fn index(&self, name: &str) -> &Resource {
        match self.by_name.get(name) {
            Some(r) => r,
            None => panic!("no resource {name:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(name: &str, body: &[u8]) -> Resource {
        Resource::new(name, Any { type_url: "t".into(), value: body.to_vec() })
    }

    #[test]
    fn changes_since_a_revision_and_versions() {
        let mut t = TypeResources::default();
        let empty = t.version();
        assert!(t.insert(1, res("a", b"1")));
        assert!(t.insert(1, res("b", b"1")));
        let v1 = t.version();
        assert!(!t.insert(2, res("a", b"1")), "same content is no change");
        assert_eq!(t.version(), v1);
        assert!(t.insert(3, res("a", b"2")));
        assert!(t.remove(4, "b"));
        assert!(!t.remove(4, "b"));
        let names = |v: Option<Vec<Arc<str>>>| v.map(|v| v.iter().map(|n| n.to_string()).collect::<Vec<_>>());
        assert_eq!(names(t.changed_since(0)), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(names(t.changed_since(3)), Some(vec!["b".to_string()]));
        assert_eq!(names(t.changed_since(4)), Some(vec![]));
        // Back to the first content: back to its version.
        assert!(t.insert(5, res("a", b"1")));
        assert!(t.insert(5, res("b", b"1")));
        assert_eq!(t.version(), v1);
        assert!(t.replace_all(6, []));
        assert_eq!(t.version(), empty);
    }

    #[test]
    fn clones_share_a_lineage_new_maps_do_not() {
        let mut a = TypeResources::default();
        a.insert(1, res("a", b"1"));
        let mut b = a.clone();
        b.insert(2, res("a", b"2"));
        assert!(a.same_lineage(&b));
        let fresh = TypeResources::default();
        assert!(!fresh.same_lineage(&a));
        assert!(!TypeResources::default().same_lineage(&fresh));
    }

    #[test]
    fn the_whole_type_is_encoded_once_per_state() {
        use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
        use prost::Message;
        let mut a = TypeResources::default();
        a.insert(1, res("b", b"2"));
        a.insert(1, res("a", b"1"));
        let enc = a.encoded_all();
        assert_eq!(enc.len(), 2);
        assert!(a.clone().encoded_all().shares(&enc), "clones share one encoding");
        // The bytes are the `resources` field prost would write, in name order.
        let msg = DiscoveryResponse { resources: a.iter().map(|r| r.body.to_any()).collect(), ..Default::default() };
        assert_eq!(enc.to_vec(), msg.encode_to_vec());
        // A changed clone encodes its own state; the original keeps its own.
        let mut b = a.clone();
        assert!(!b.insert(2, res("a", b"1")), "no change");
        assert!(b.encoded_all().shares(&enc));
        b.insert(3, res("c", b"3"));
        assert_eq!(b.encoded_all().len(), 3);
        assert!(a.encoded_all().shares(&enc));
        b.remove(4, "c");
        assert!(!b.encoded_all().shares(&enc), "a new state is encoded anew");
        assert_eq!(b.encoded_all(), enc, "with the same bytes for the same content");
    }

    /// What prost writes for the `resources` field of every resource.
    fn plain(t: &TypeResources) -> Vec<u8> {
        use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
        use prost::Message;
        DiscoveryResponse { resources: t.iter().map(|r| r.body.to_any()).collect(), ..Default::default() }
            .encode_to_vec()
    }

    /// A resource of about 1 KiB.
    fn big(i: usize, fill: u8) -> Resource {
        res(&format!("svc-{i:05}"), &[fill; 1000])
    }

    #[test]
    fn a_change_re_encodes_only_its_part() {
        let mut t = TypeResources::default();
        for i in 0..3000 {
            t.insert(1, big(i, 0));
        }
        let first = t.encoded_all();
        assert_eq!(first.to_vec(), plain(&t));
        assert_eq!(first.len(), 3000);
        // About 3 MB in parts of about PART_BYTES.
        let chunks = first.chunks().len();
        assert!(chunks >= first.encoded_len() / PART_BYTES, "{chunks} chunks");
        assert!(first.chunks().iter().all(|c| c.len() < PART_BYTES + 2048));

        let mut next = t.clone();
        next.insert(2, big(1234, 1));
        let second = next.encoded_all();
        assert_eq!(second.to_vec(), plain(&next));
        let chunks = second.chunks().len();
        let shared = second.shared_chunks(&first);
        assert!(shared + 3 >= chunks, "only the changed part is new: {shared} of {chunks} shared");
        assert!(t.encoded_all().shares(&first), "the earlier state keeps its encoding");

        // The next change to the same part shares everything else again.
        let mut third = next.clone();
        third.insert(3, big(1235, 1));
        let enc = third.encoded_all();
        assert_eq!(enc.to_vec(), plain(&third));
        assert!(enc.shared_chunks(&second) + 2 >= enc.chunks().len());
    }

    /// True if `body`'s value lies inside one of `enc`'s chunks.
    fn held_in(body: &Body, enc: &EncodedResources) -> bool {
        let v = body.value();
        let (start, end) = (v.as_ptr() as usize, v.as_ptr() as usize + v.len());
        enc.chunks().iter().any(|c| c.as_ptr() as usize <= start && end <= c.as_ptr() as usize + c.len())
    }

    #[test]
    fn once_encoded_the_bodies_are_held_in_the_encoding() {
        let mut t = TypeResources::default();
        for i in 0..1000 {
            t.insert(1, big(i, 0));
        }
        let kept: Vec<Arc<Resource>> = t.iter().cloned().collect();
        assert!(!kept.iter().any(|r| held_in(&r.body, &EncodedResources::default())));
        let first = t.encoded_all();
        assert!(t.iter().all(|r| held_in(&r.body, &first)), "every body is a slice of the encoding");
        // The bytes are the same, where they live is not.
        assert!(t.iter().all(|r| r.body.value() == [0u8; 1000][..]));
        assert_eq!(first.to_vec(), plain(&t));

        // A change: its part is encoded anew, and the bodies in it move to
        // the new part, so the old part is held only by the old state.
        let mut next = t.clone();
        next.insert(2, big(500, 7));
        let second = next.encoded_all();
        assert_eq!(second.to_vec(), plain(&next));
        assert!(next.iter().all(|r| held_in(&r.body, &second)));
        let moved = next.iter().filter(|r| !held_in(&r.body, &first)).count();
        assert!(moved > 1 && moved < 400, "only the changed part's bodies moved: {moved}");
        // The old state still encodes to its own bytes.
        assert_eq!(t.encoded_all().to_vec(), plain(&t));
        assert_eq!(t["svc-00500"].body.value(), [0u8; 1000][..]);
        assert_eq!(next["svc-00500"].body.value(), [7u8; 1000][..]);
    }

    #[test]
    fn parts_stay_correct_and_few_under_churn() {
        let mut t = TypeResources::default();
        for i in 0..2000 {
            t.insert(1, big(i * 2, 0));
        }
        t.encoded_all();
        // A fixed pseudo-random walk of inserts, updates and removals,
        // encoding after each.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for rev in 2..600u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % 4200) as usize;
            match x % 3 {
                0 => {
                    t.remove(rev, &format!("svc-{i:05}"));
                }
                _ => {
                    t.insert(rev, big(i, (rev % 250) as u8));
                }
            }
            if rev % 7 == 0 {
                let enc = t.encoded_all();
                assert_eq!(enc.to_vec(), plain(&t), "revision {rev}");
                assert_eq!(enc.len(), t.len());
            }
        }
        // Removing everything but one leaves few parts, and an empty type
        // encodes to nothing.
        let names: Vec<Arc<str>> = t.names().cloned().collect();
        for (k, n) in names.iter().enumerate().skip(1) {
            t.remove(1000 + k as u64, n);
            if k % 50 == 0 {
                t.encoded_all();
            }
        }
        assert_eq!(t.encoded_all().to_vec(), plain(&t));
        assert!(t.parts.count() <= 4, "{} parts for one resource", t.parts.count());
        t.remove(5000, &names[0]);
        assert!(t.encoded_all().is_empty());
        assert_eq!(t.encoded_all().encoded_len(), 0);
    }

    #[test]
    fn a_trimmed_log_asks_for_a_full_compare() {
        let mut t = TypeResources::default();
        for rev in 1..=(MIN_LOG as u64 + 10) {
            t.insert(rev, res("a", &rev.to_le_bytes()));
        }
        assert_eq!(t.changed_since(0), None);
        assert_eq!(t.changed_since(5), None);
        let recent = t.changed_since(MIN_LOG as u64).expect("recent changes are logged");
        assert_eq!(recent.len(), 1);
    }
}
