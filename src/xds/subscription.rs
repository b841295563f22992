//! What a client subscribes to, and the type rules that decide what a
//! response carries and in which order. A leaf of `xds`: the stream state
//! machines and the server read it.

use std::sync::Arc;

use crate::resources::TypeResources;
use crate::translate::ConfigSet;
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, SECRET_TYPE};

/// What a client asked for, for one type. Names are shared `Arc<str>`,
/// the published resource's own name where there is one, so a stream's
/// subscription costs a pointer per name; and the set is a persistent map
/// shared between the streams that ask for the same names
/// ([`share`](Self::share)): a fleet of Envoys each naming every cluster in
/// EDS holds one set, not one per stream. A name added or removed later
/// copies only the path to it (O(log n)), the rest stays shared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    pub wildcard: bool,
    pub names: Names,
}

/// Sets of at least this many names are shared; smaller ones cost less
/// than the lookup.
const SHARE_FROM: usize = 64;

/// How many distinct large sets are offered for sharing. The table holds
/// them (a persistent set has no weak reference), so it is short: the
/// oldest goes first. Streams of one fleet ask for one set per type.
const SHARED_SETS: usize = 16;

/// A name set.
type Names = imbl::OrdSet<Arc<str>>;

/// Recently offered large sets, by a hash of their names.
static SHARED: std::sync::LazyLock<std::sync::Mutex<std::collections::VecDeque<(u64, Names)>>> =
    std::sync::LazyLock::new(Default::default);

fn names_hash(names: &Names) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for n in names {
        n.hash(&mut h);
    }
    h.finish()
}

impl Subscription {
    /// From a SotW `resource_names` list or the first delta subscribe list.
    /// An empty list is the legacy wildcard, but only for types where the
    /// client may not know names up front (all but EDS and RDS, which are
    /// always named: an empty EDS list means "nothing"; SDS, whose
    /// Secrets are named by the listeners). Names the type
    /// holds share its resources' names.
    pub fn from_names<S: AsRef<str>>(
        type_url: &str,
        names: impl IntoIterator<Item = S>,
        known: &TypeResources,
    ) -> Subscription {
        let mut sub = Subscription::default();
        let mut any = false;
        for n in names {
            any = true;
            sub.add(n.as_ref(), known);
        }
        if !any && is_full_state(type_url) {
            sub.wildcard = true;
        }
        sub
    }

    /// Add a name (`*` turns wildcard on). True if it was not there.
    pub fn add(&mut self, name: &str, known: &TypeResources) -> bool {
        if name == "*" {
            let was = self.wildcard;
            self.wildcard = true;
            return !was;
        }
        if self.names.contains(name) {
            return false;
        }
        let name = known.get(name).map(|r| r.name.clone()).unwrap_or_else(|| name.into());
        self.names.insert(name).is_none()
    }

    pub fn remove(&mut self, name: &str) {
        if name == "*" {
            self.wildcard = false;
        } else {
            self.names.remove(name);
        }
    }

    /// Share the name set with an equal one another stream offered, if
    /// any; else offer this one. O(names), after a request that changed
    /// the subscription.
    pub fn share(&mut self) {
        if self.names.len() < SHARE_FROM {
            return;
        }
        let key = names_hash(&self.names);
        let mut shared = SHARED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match shared.iter().find(|(k, set)| *k == key && set.len() == self.names.len()) {
            Some((_, set)) if set.ptr_eq(&self.names) => {}
            Some((_, set)) if *set == self.names => self.names = set.clone(),
            _ => {
                if shared.len() >= SHARED_SETS {
                    shared.pop_front();
                }
                shared.push_back((key, self.names.clone()));
            }
        }
    }

    pub fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// True only if [`from_names`](Self::from_names) would give `self`,
    /// checked without building it, in one pass, when the names come
    /// sorted and without duplicates (as Envoy's do); otherwise false, and
    /// the caller builds the subscription.
    pub fn is_same<S: AsRef<str>>(&self, type_url: &str, names: impl ExactSizeIterator<Item = S>) -> bool {
        if names.len() == 0 {
            return self.names.is_empty() && self.wildcard == is_full_state(type_url);
        }
        !self.wildcard
            && names.len() == self.names.len()
            && names.zip(self.names.iter()).all(|(a, b)| a.as_ref() == &**b)
    }
}

/// The resources a type URL names in `set`, empty when it has none.
pub fn type_resources<'a>(set: &'a ConfigSet, type_url: &str) -> &'a TypeResources {
    set.resources(type_url).unwrap_or_else(|| no_resources())
}

/// An empty resource set.
pub fn no_resources() -> &'static TypeResources {
    static EMPTY: std::sync::LazyLock<TypeResources> = std::sync::LazyLock::new(TypeResources::default);
    &EMPTY
}

/// Types whose every response must list all resources (xDS: Listener and
/// Cluster are "full state" in SotW), and any type we do not know, which
/// Pilot's MCP client treats the same way. EDS, RDS and SDS are not.
pub fn is_full_state(type_url: &str) -> bool {
    type_url != ENDPOINT_TYPE && type_url != ROUTE_TYPE && type_url != SECRET_TYPE
}

/// go-control-plane's order: CDS, EDS, LDS, RDS, then anything else.
pub fn push_order<'a>(types: impl Iterator<Item = &'a String>) -> Vec<String> {
    let rank = |t: &str| match t {
        CLUSTER_TYPE => 0,
        ENDPOINT_TYPE => 1,
        LISTENER_TYPE => 2,
        ROUTE_TYPE => 3,
        _ => 4,
    };
    let mut v: Vec<String> = types.cloned().collect();
    v.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_name_sets_are_shared_and_copied_on_write() {
        let known = TypeResources::default();
        let names: Vec<String> = (0..SHARE_FROM * 2).map(|i| format!("shared-test-{i:04}")).collect();
        let mut a = Subscription::from_names(ENDPOINT_TYPE, &names, &known);
        let mut b = Subscription::from_names(ENDPOINT_TYPE, names.iter().rev(), &known);
        assert!(!a.names.ptr_eq(&b.names));
        a.share();
        b.share();
        assert!(a.names.ptr_eq(&b.names), "the second stream holds the first one's set");
        assert_eq!(a, b);
        // A change to one copies a path; the other keeps what it asked for.
        b.add("one-more", &known);
        assert!(!a.names.ptr_eq(&b.names));
        assert_eq!(a.names.len(), names.len());
        assert_eq!(b.names.len(), names.len() + 1);
        b.remove("one-more");
        b.share();
        assert!(a.names.ptr_eq(&b.names), "equal again: shared again");
        a.remove(&names[0]);
        assert_eq!(b.names.len(), names.len(), "removing from one leaves the other whole");
        // Small sets are left alone.
        let mut small = Subscription::from_names(ENDPOINT_TYPE, ["x"], &known);
        let before = small.names.clone();
        small.share();
        assert!(small.names.ptr_eq(&before));
    }

    #[test]
    fn is_same_agrees_with_from_names() {
        let known = TypeResources::default();
        let v = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (type_url, held, asked) in [
            (ENDPOINT_TYPE, v(&["a", "b"]), v(&["a", "b"])),
            (ENDPOINT_TYPE, v(&["a", "b"]), v(&["b", "a"])),
            (ENDPOINT_TYPE, v(&["a", "b"]), v(&["a", "a"])),
            (ENDPOINT_TYPE, v(&["a", "b"]), v(&["a", "b", "c"])),
            (ENDPOINT_TYPE, v(&["a"]), v(&["*"])),
            (ENDPOINT_TYPE, v(&[]), v(&[])),
            (CLUSTER_TYPE, v(&[]), v(&[])),
            (CLUSTER_TYPE, v(&["*"]), v(&[])),
            (CLUSTER_TYPE, v(&["a"]), v(&[])),
        ] {
            let sub = Subscription::from_names(type_url, &held, &known);
            let same = sub == Subscription::from_names(type_url, &asked, &known);
            // Never a false "same"; and sorted, distinct names are recognised.
            let fast = sub.is_same(type_url, asked.iter());
            assert!(!fast || same, "{type_url} {held:?} {asked:?}");
            let sorted = asked.windows(2).all(|w| w[0] < w[1]) && !asked.contains(&"*".to_string());
            assert_eq!(fast, same && (sorted || asked.is_empty()), "{type_url} {held:?} {asked:?}");
        }
    }
}
