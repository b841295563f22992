//! Small maps that thousands of translated objects hold with the same
//! contents, shared instead of copied: the registry labels of every
//! ServiceEntry (`higress-registry-type`, `higress-registry-name`) and a
//! WorkloadEntry's port name → port map. A `BTreeMap` with one or two
//! entries costs a whole node (300–550 bytes) plus its strings; at 10k
//! services × 10 endpoints these copies were 8 MiB of the published set
//! (BENCHMARKS.md, "xDS memory").
//!
//! [`Shared`] is the value behind an `Arc`, serialized as the value; a
//! change copies it first (copy on write). [`intern`] hands out one `Arc`
//! per distinct value among those alive.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use serde::{Deserialize, Serialize};

/// A value shared behind an `Arc`; serialized as the value itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Shared<T>(pub Arc<T>);

/// Object labels.
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

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(|v| Shared(Arc::new(v)))
    }
}

/// Live values by content. Entries whose value nobody holds any more are
/// dropped when the table has doubled since the last sweep.
pub struct Interner<T> {
    live: BTreeMap<T, Weak<T>>,
    sweep_at: usize,
}

impl<T: Ord + Clone> Interner<T> {
    const fn new() -> Self {
        Interner { live: BTreeMap::new(), sweep_at: 64 }
    }

    fn get(&mut self, value: T) -> Shared<T> {
        if let Some(held) = self.live.get(&value).and_then(Weak::upgrade) {
            return Shared(held);
        }
        let shared = Arc::new(value.clone());
        self.live.insert(value, Arc::downgrade(&shared));
        if self.live.len() > self.sweep_at {
            self.live.retain(|_, v| v.strong_count() > 0);
            self.sweep_at = (self.live.len() * 2).max(64);
        }
        Shared(shared)
    }
}

/// Types [`intern`] knows: each has its own table.
pub trait Internable: Ord + Clone + Sized + 'static {
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
        // Once nobody holds a value, a new one is made (and the old entry swept).
        let before = Arc::as_ptr(&a.0);
        drop((a, b));
        for i in 0..200 {
            intern(m(&format!("shared-test-sweep-{i}")));
        }
        let again = intern(m("shared-test-a"));
        assert_eq!(again.len(), 1);
        let _ = before;
    }
}
