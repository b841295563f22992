//! What one stream's client holds of one type, in O(1) memory per stream,
//! and what differs from the published type, in O(change) work.
//!
//! After every response the client holds exactly the published type as it
//! was then, restricted to its subscription (SotW: a full-state type is sent
//! whole, other types send every changed named resource; delta: every
//! difference and removal). So instead of a name → version map per stream,
//! a [`Tracker`] keeps a clone of the published [`TypeResources`] (a
//! persistent map: the clone is O(1) and shares every entry with the set)
//! and the set revision it is from. On a change, the type's change log
//! ([`TypeResources::changed_since`]) names the only resources that can
//! differ; a full compare happens only when the log no longer reaches back,
//! or the map is of another history.
//!
//! Where the client's holding is not `base ∩ subscription` (a delta
//! reconnect's `initial_resource_versions`, an explicit resubscribe, a name
//! newly subscribed, an EDS removal SotW cannot express), an override
//! records it; overrides are few and are always compared.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::Subscription;
use crate::resources::{Resource, TypeResources};

/// The client's holding of one type on one stream.
#[derive(Debug, Default)]
pub struct Tracker {
    sub: Subscription,
    /// The type as it was when the client was last brought up to date.
    base: TypeResources,
    /// The set revision `base` is from.
    base_rev: u64,
    /// Where the holding differs from `base ∩ sub`: `None` = holds nothing.
    overrides: HashMap<Arc<str>, Option<Arc<str>>>,
}

/// One client's holding of one type at one response, for the status page
/// ([`super::ClientHandle::sent`]): which version of a resource the client
/// was sent, and so holds once it ACKs that response.
#[derive(Debug, Clone, Default)]
pub struct Holding {
    base: TypeResources,
    sub: Subscription,
    overrides: HashMap<Arc<str>, Option<Arc<str>>>,
}

impl Holding {
    /// The version of `name` held, if any.
    pub fn version(&self, name: &str) -> Option<Arc<str>> {
        held_in(&self.base, &self.sub, &self.overrides, name)
    }
}

fn held_in(
    base: &TypeResources,
    sub: &Subscription,
    overrides: &HashMap<Arc<str>, Option<Arc<str>>>,
    name: &str,
) -> Option<Arc<str>> {
    match overrides.get(name) {
        Some(v) => v.clone(),
        None if sub.wants(name) => base.get(name).map(|r| r.version.clone()),
        None => None,
    }
}

/// What differs between the client's holding and the published type.
#[derive(Debug, Default)]
pub struct Changes {
    /// New, changed or forced resources the client wants, in name order.
    pub upserts: Vec<Arc<Resource>>,
    /// Names among `upserts` the client held with another version.
    pub replaced: Vec<Arc<str>>,
    /// Names the client holds that the type no longer has (or, after a
    /// delta reconnect, that it does not want), with the version held.
    pub removed: Vec<(Arc<str>, Arc<str>)>,
    /// How many names were compared: the work done.
    pub examined: usize,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removed.is_empty()
    }
}

impl Tracker {
    pub fn sub(&self) -> &Subscription {
        &self.sub
    }

    /// What the client holds of `name`, by version.
    fn held(&self, name: &str) -> Option<Arc<str>> {
        held_in(&self.base, &self.sub, &self.overrides, name)
    }

    /// What the client holds now, kept apart from the stream: the map and
    /// the subscription are shared (O(1)), the overrides (few after a
    /// response: the removals it did not carry) copied.
    pub fn holding(&self) -> Holding {
        Holding { base: self.base.clone(), sub: self.sub.clone(), overrides: self.overrides.clone() }
    }

    /// A delta stream's first request: the client holds `initial` (name →
    /// version, from `initial_resource_versions`) and asks for `sub`.
    pub fn start(&mut self, sub: Subscription, initial: impl IntoIterator<Item = (Arc<str>, Arc<str>)>) {
        self.sub = sub;
        self.sub.share();
        self.base = TypeResources::default();
        self.base_rev = 0;
        self.overrides = initial.into_iter().map(|(n, v)| (n, Some(v))).collect();
    }

    /// Replace the subscription (SotW requests). Names newly wanted are not
    /// held yet; names no longer wanted are forgotten. True if it changed.
    pub fn set_sub(&mut self, sub: Subscription) -> bool {
        if sub == self.sub {
            return false;
        }
        let newly: Vec<Arc<str>> = if sub.wildcard && !self.sub.wildcard {
            self.base.names().filter(|n| !self.sub.wants(n)).cloned().collect()
        } else {
            sub.names.iter().filter(|n| !self.sub.wants(n)).cloned().collect()
        };
        self.sub = sub;
        self.sub.share();
        for n in newly {
            self.forget(n);
        }
        let sub = &self.sub;
        self.overrides.retain(|n, _| sub.wants(n));
        true
    }

    /// Delta subscribe: an explicit (re)subscribe always gets the resource.
    /// True if `name` was not subscribed yet.
    pub fn subscribe(&mut self, name: &str, known: &TypeResources) -> bool {
        let was_wildcard = self.sub.wildcard;
        if !self.sub.add(name, known) {
            return false;
        }
        if name == "*" {
            let newly: Vec<Arc<str>> =
                self.base.names().filter(|n| !was_wildcard && !self.sub.names.contains(&**n)).cloned().collect();
            newly.into_iter().for_each(|n| self.forget(n));
        } else if let Some(n) = self.sub.names.get(name).cloned() {
            self.forget(n);
        }
        true
    }

    /// Delta unsubscribe: the client drops the resource; no removal is sent.
    pub fn unsubscribe(&mut self, name: &str) {
        self.sub.remove(name);
        let sub = &self.sub;
        self.overrides.retain(|n, _| sub.wants(n));
    }

    /// After a delta request's subscribes and unsubscribes: share the
    /// subscription's names with equal ones on other streams
    /// ([`Subscription::share`]).
    pub fn share_sub(&mut self) {
        self.sub.share();
    }

    /// The client holds nothing of `name` (only `base` knows it).
    fn forget(&mut self, name: Arc<str>) {
        if self.base.contains(&name) || self.overrides.contains_key(&name) {
            self.overrides.insert(name, None);
        }
    }

    /// Compare the holding with `now`, the type in the set of revision
    /// `rev`. `force` names resources to send even if unchanged.
    pub fn changes(&self, now: &TypeResources, rev: u64, force: &HashSet<Arc<str>>) -> Changes {
        let logged =
            (self.base.same_lineage(now) && rev >= self.base_rev).then(|| now.changed_since(self.base_rev)).flatten();
        let mut names: BTreeSet<Arc<str>> = match logged {
            Some(changed) => changed.into_iter().collect(),
            None if self.sub.wildcard => self.base.names().chain(now.names()).cloned().collect(),
            None => self.sub.names.iter().cloned().collect(),
        };
        names.extend(self.overrides.keys().cloned());
        names.extend(force.iter().cloned());
        let mut out = Changes { examined: names.len(), ..Changes::default() };
        for name in names {
            let had = self.held(&name);
            let want = if self.sub.wants(&name) { now.get(&name) } else { None };
            match (had, want) {
                (had, Some(r)) if had.as_deref() != Some(&*r.version) || force.contains(&name) => {
                    if had.is_some() {
                        out.replaced.push(name);
                    }
                    out.upserts.push(r.clone());
                }
                (Some(v), None) => out.removed.push((name, v)),
                _ => {}
            }
        }
        out
    }

    /// The client now holds `now ∩ subscription`, except `unsent`: removals
    /// it was not told of, which it still holds at their old versions.
    pub fn commit(&mut self, now: &TypeResources, rev: u64, unsent: Vec<(Arc<str>, Arc<str>)>) {
        self.base = now.clone();
        self.base_rev = rev;
        self.overrides = unsent.into_iter().map(|(n, v)| (n, Some(v))).collect();
    }

    /// Every resource of `now` the client wants, in name order.
    pub fn wanted<'a>(&'a self, now: &'a TypeResources) -> Box<dyn Iterator<Item = &'a Arc<Resource>> + 'a> {
        if self.sub.wildcard {
            Box::new(now.iter())
        } else {
            Box::new(self.sub.names.iter().filter_map(|n| now.get(n)))
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::Any;

    use super::*;

    fn res(name: &str, body: &str) -> Resource {
        Resource::new(name, Any { type_url: "t".into(), value: body.as_bytes().to_vec() })
    }

    fn names(v: &[Arc<Resource>]) -> Vec<&str> {
        v.iter().map(|r| &*r.name).collect()
    }

    #[test]
    fn one_change_among_many_examines_one_name() {
        let mut now = TypeResources::default();
        for i in 0..10_000 {
            now.insert(1, res(&format!("r{i:05}"), "v1"));
        }
        let mut t = Tracker::default();
        t.set_sub(Subscription { wildcard: true, ..Default::default() });
        let first = t.changes(&now, 1, &HashSet::new());
        assert_eq!(first.upserts.len(), 10_000, "a new holding compares everything");
        t.commit(&now, 1, Vec::new());

        let mut next = now.clone();
        next.insert(2, res("r00042", "v2"));
        let c = t.changes(&next, 2, &HashSet::new());
        assert_eq!(names(&c.upserts), ["r00042"]);
        assert_eq!(c.replaced.len(), 1);
        assert_eq!(c.examined, 1, "only the changed name is looked at");
        t.commit(&next, 2, Vec::new());
        assert!(t.changes(&next, 2, &HashSet::new()).is_empty());

        // A map of another history (not the publisher's clone) is compared whole.
        let mut other = TypeResources::default();
        other.insert(3, res("r00001", "v1"));
        let c = t.changes(&other, 3, &HashSet::new());
        assert_eq!(c.examined, 10_000);
        assert_eq!(c.removed.len(), 9_999);
        assert!(c.upserts.is_empty());
    }

    #[test]
    fn streams_sharing_a_subscription_each_get_their_own_difference() {
        let names: Vec<String> = (0..200).map(|i| format!("c{i:03}")).collect();
        let mut now = TypeResources::default();
        for n in &names {
            now.insert(1, res(n, "v1"));
        }
        let (mut a, mut b) = (Tracker::default(), Tracker::default());
        a.set_sub(Subscription::from_names("eds", &names, &now));
        b.start(Subscription::from_names("eds", &names, &now), []);
        assert!(a.sub().names.ptr_eq(&b.sub().names), "one name set for both streams");
        for t in [&mut a, &mut b] {
            assert_eq!(t.changes(&now, 1, &HashSet::new()).upserts.len(), 200);
            t.commit(&now, 1, Vec::new());
        }

        // `a` keeps up with two changes; `b` falls behind, then catches up.
        let mut r2 = now.clone();
        r2.insert(2, res("c010", "v2"));
        assert_eq!(names_of(&a.changes(&r2, 2, &HashSet::new())), ["c010"]);
        a.commit(&r2, 2, Vec::new());
        let mut r3 = r2.clone();
        r3.insert(3, res("c020", "v2"));
        r3.remove(3, "c030");
        let c = a.changes(&r3, 3, &HashSet::new());
        assert_eq!(names_of(&c), ["c020"]);
        assert_eq!(c.removed.iter().map(|(n, _)| &**n).collect::<Vec<_>>(), ["c030"]);
        a.commit(&r3, 3, Vec::new());
        let c = b.changes(&r3, 3, &HashSet::new());
        assert_eq!(names_of(&c), ["c010", "c020"], "exactly what changed since b's revision");
        assert_eq!(c.removed.iter().map(|(n, _)| &**n).collect::<Vec<_>>(), ["c030"]);
        b.commit(&r3, 3, Vec::new());
        assert!(b.changes(&r3, 3, &HashSet::new()).is_empty());

        // One stream narrowing its subscription leaves the other's whole.
        a.set_sub(Subscription::from_names("eds", &names[..100], &r3));
        assert!(!a.sub().names.ptr_eq(&b.sub().names));
        assert_eq!(b.sub().names.len(), 200);
        let mut r4 = r3.clone();
        r4.insert(4, res("c150", "v2"));
        assert!(a.changes(&r4, 4, &HashSet::new()).is_empty(), "a no longer wants c150");
        assert_eq!(names_of(&b.changes(&r4, 4, &HashSet::new())), ["c150"]);
    }

    fn names_of(c: &Changes) -> Vec<&str> {
        names(&c.upserts)
    }

    #[test]
    fn subscriptions_and_overrides() {
        let mut now = TypeResources::default();
        for n in ["a", "b", "c"] {
            now.insert(1, res(n, "v1"));
        }
        let mut t = Tracker::default();
        t.set_sub(Subscription::from_names("x", ["a"], &now));
        assert_eq!(names(&t.changes(&now, 1, &HashSet::new()).upserts), ["a"]);
        t.commit(&now, 1, Vec::new());
        // Newly wanted names are sent though unchanged; dropped ones are forgotten.
        t.set_sub(Subscription::from_names("x", ["b", "c"], &now));
        let c = t.changes(&now, 1, &HashSet::new());
        assert_eq!(names(&c.upserts), ["b", "c"]);
        assert!(c.removed.is_empty());
        t.commit(&now, 1, Vec::new());
        // Named → wildcard: what was not wanted is not held.
        t.set_sub(Subscription { wildcard: true, ..Default::default() });
        assert_eq!(names(&t.changes(&now, 1, &HashSet::new()).upserts), ["a"]);
        t.commit(&now, 1, Vec::new());

        // Delta reconnect: held versions are compared, unknown ones removed.
        let mut d = Tracker::default();
        let v1 = now["a"].version.clone();
        d.start(
            Subscription { wildcard: true, ..Default::default() },
            [("a".into(), v1), ("b".into(), "old".into()), ("gone".into(), "x".into())],
        );
        let c = d.changes(&now, 1, &HashSet::new());
        assert_eq!(names(&c.upserts), ["b", "c"]);
        assert_eq!(c.replaced, vec![Arc::from("b")]);
        assert_eq!(c.removed.iter().map(|(n, _)| &**n).collect::<Vec<_>>(), ["gone"]);
        d.commit(&now, 1, Vec::new());
        // An explicit resubscribe re-sends; forcing sends unchanged resources.
        assert!(d.subscribe("a", &now));
        assert!(!d.subscribe("a", &now));
        assert_eq!(names(&d.changes(&now, 1, &HashSet::new()).upserts), ["a"]);
        d.commit(&now, 1, Vec::new());
        let force: HashSet<Arc<str>> = [Arc::from("c")].into();
        assert_eq!(names(&d.changes(&now, 1, &force).upserts), ["c"]);
    }
}
