//! Small maps that thousands of records hold with the same contents, shared
//! instead of copied: an endpoint's labels (every provider of a Dubbo
//! service usually carries the same `application`, `version`, `side` and
//! `protocol`), the registry labels of every translated ServiceEntry and a
//! WorkloadEntry's port map. A `BTreeMap` with a few entries costs a whole
//! node (300–550 bytes) plus its strings; at 10k services × 10 endpoints a
//! copy per endpoint is tens of MiB (BENCHMARKS.md, "xDS memory" and
//! "Memory at 10k").
//!
//! [`Shared`] is the value behind an `Arc`, serialized as the value; a
//! change copies it first (copy on write). [`intern`] hands out one `Arc`
//! per distinct value among those alive. Its tables hold weak references
//! by content hash, not copies, so values that nothing else shares (a Dubbo
//! URL's `pid` and `timestamp` make every provider's labels distinct) cost a
//! table slot, not a second copy.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use serde::{Deserialize, Serialize};

/// A value shared behind an `Arc`; serialized as the value itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shared<T>(pub Arc<T>);

/// Labels: an endpoint's, or a translated object's.
pub type Labels = Shared<BTreeMap<String, String>>;
/// A WorkloadEntry's port name → the endpoint's port.
pub type PortMap = Shared<BTreeMap<String, u32>>;

impl<K, V> Shared<BTreeMap<K, V>> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Writing copies a value other holders share.
impl<T: Clone> std::ops::DerefMut for Shared<T> {
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared(Arc::new(value))
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for Shared<BTreeMap<K, V>> {
    fn from(entries: [(K, V); N]) -> Self {
        Shared(Arc::new(BTreeMap::from(entries)))
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for Shared<BTreeMap<K, V>> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        Shared(Arc::new(entries.into_iter().collect()))
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// Read values are interned: services read back from a state dump share
/// their labels as the watchers' own do.
impl<'de, T: Deserialize<'de> + Internable> Deserialize<'de> for Shared<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(intern)
    }
}

/// Live values by content hash. Entries whose value nobody holds any more
/// are dropped when the table has doubled since the last sweep.
pub struct Interner<T> {
    live: HashMap<u64, Vec<Weak<T>>>,
    hasher: RandomState,
    entries: usize,
    sweep_at: usize,
}

impl<T: Eq + Hash> Interner<T> {
    fn new() -> Self {
        Interner { live: HashMap::new(), hasher: RandomState::new(), entries: 0, sweep_at: 64 }
    }

    fn get(&mut self, value: T) -> Shared<T> {
        match self.find(&value) {
            Ok(held) => held,
            Err(hash) => self.insert(hash, Arc::new(value)),
        }
    }

    /// Like [`Interner::get`] for a value already behind an `Arc`: no copy
    /// is made either way.
    fn get_shared(&mut self, value: Shared<T>) -> Shared<T> {
        match self.find(&value.0) {
            Ok(held) => held,
            Err(hash) => self.insert(hash, value.0),
        }
    }

    /// The live copy equal to `value`, or the hash to file it under.
    fn find(&self, value: &T) -> Result<Shared<T>, u64> {
        let hash = self.hasher.hash_one(value);
        let held = self.live.get(&hash).and_then(|b| b.iter().filter_map(Weak::upgrade).find(|h| **h == *value));
        held.map(Shared).ok_or(hash)
    }

    fn insert(&mut self, hash: u64, shared: Arc<T>) -> Shared<T> {
        self.live.entry(hash).or_default().push(Arc::downgrade(&shared));
        self.entries += 1;
        if self.entries > self.sweep_at {
            self.live.retain(|_, bucket| {
                bucket.retain(|w| w.strong_count() > 0);
                !bucket.is_empty()
            });
            self.entries = self.live.values().map(Vec::len).sum();
            self.live.shrink_to_fit();
            self.sweep_at = (self.entries * 2).max(64);
        }
        Shared(shared)
    }
}

/// Types [`intern`] knows: each has its own table.
pub trait Internable: Eq + Hash + Sized + 'static {
    #[doc(hidden)]
    fn table() -> &'static Mutex<Interner<Self>>;
}

static LABELS: LazyLock<Mutex<Interner<BTreeMap<String, String>>>> = LazyLock::new(|| Mutex::new(Interner::new()));
static PORTS: LazyLock<Mutex<Interner<BTreeMap<String, u32>>>> = LazyLock::new(|| Mutex::new(Interner::new()));

impl Internable for BTreeMap<String, String> {
    fn table() -> &'static Mutex<Interner<Self>> {
        &LABELS
    }
}

impl Internable for BTreeMap<String, u32> {
    fn table() -> &'static Mutex<Interner<Self>> {
        &PORTS
    }
}

/// The one shared copy of `value` among those alive (a new one if none).
pub fn intern<T: Internable>(value: T) -> Shared<T> {
    T::table().lock().unwrap_or_else(PoisonError::into_inner).get(value)
}

/// [`intern`] for a value already shared: the copy every equal value
/// shares (empty ones included: `Shared::default()` is an allocation each).
pub fn reshare<T: Internable>(value: Shared<T>) -> Shared<T> {
    T::table().lock().unwrap_or_else(PoisonError::into_inner).get_shared(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_and_writes_copy_first() {
        let m = |k: &str| BTreeMap::from([(k.to_string(), 1u32)]);
        let a = intern(m("shared-test-a"));
        let b = intern(m("shared-test-a"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert!(!Arc::ptr_eq(&a.0, &intern(m("shared-test-b")).0));
        let mut c = b.clone();
        c.insert("more".into(), 2);
        assert_eq!(b.len(), 1, "the shared copy is left alone");
        assert_eq!(c.len(), 2);
        // Serialized as the value.
        assert_eq!(serde_json::to_string(&a).expect("json"), r#"{"shared-test-a":1}"#);
        let back: PortMap = serde_json::from_str(r#"{"shared-test-a":1}"#).expect("parse");
        assert_eq!(back, a);
        assert!(Arc::ptr_eq(&back.0, &a.0), "read values are interned");
        // Once nobody holds a value, a new one is made (and the old entry swept).
        let weak = Arc::downgrade(&a.0);
        drop((a, b, back));
        assert!(weak.upgrade().is_none(), "the table holds no strong reference");
        for i in 0..200 {
            intern(m(&format!("shared-test-sweep-{i}")));
        }
        let again = intern(m("shared-test-a"));
        assert_eq!(again.len(), 1);
    }

    #[test]
    fn resharing_finds_the_copy_equal_values_share() {
        let labels = |v: &str| BTreeMap::from([("reshare-test".to_string(), v.to_string())]);
        let held = intern(labels("x"));
        let own: Labels = labels("x").into();
        assert!(!Arc::ptr_eq(&held.0, &own.0));
        let again = reshare(own);
        assert!(Arc::ptr_eq(&held.0, &again.0));
        // A value nobody shared yet becomes the copy others get.
        let first: Labels = labels("y").into();
        let kept = reshare(first.clone());
        assert!(Arc::ptr_eq(&first.0, &kept.0));
        assert!(Arc::ptr_eq(&first.0, &intern(labels("y")).0));
        let (e1, e2) = (reshare(Labels::default()), reshare(Labels::default()));
        assert!(e1.is_empty() && Arc::ptr_eq(&e1.0, &e2.0), "empty labels are shared too");
    }
}
