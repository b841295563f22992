//! Services that ZooKeeper answers for but that cannot be read: a Dubbo
//! `providers` node with a digest ACL and no world READ (`NoAuth`), data
//! the server cannot marshal, anything but losing the session or the
//! connection. Such a service keeps its last state (or its absence) and
//! is read again with backoff, while every other service goes on updating:
//! one bad service is never a reason to stop the rest (Consul's watcher
//! does the same).

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::tree::ServiceKey;
use crate::health::Health;
use crate::retry::Backoff;
use crate::watcher::RegistryError;

#[derive(Default)]
pub(crate) struct Failing {
    services: BTreeMap<ServiceKey, RegistryError>,
    /// Failures the sink has not been told of: a service that started
    /// failing, or fails another way.
    news: Vec<RegistryError>,
    backoff: Backoff,
    retry_at: Option<Instant>,
}

impl Failing {
    /// `key` could not be read.
    pub fn fail(&mut self, key: ServiceKey, e: RegistryError) {
        if self.services.get(&key).is_none_or(|old| old.to_string() != e.to_string()) {
            self.news.push(e.clone());
        }
        self.services.insert(key, e);
    }

    /// `key` was read (or found gone): returns whether it was failing.
    pub fn read(&mut self, key: &ServiceKey) -> bool {
        self.services.remove(key).is_some()
    }

    pub fn contains(&self, key: &ServiceKey) -> bool {
        self.services.contains_key(key)
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// A full sync read every service: exactly `failed` fail now.
    pub fn replace(&mut self, failed: Vec<(ServiceKey, RegistryError)>) {
        let old = std::mem::take(&mut self.services);
        for (key, e) in failed {
            if old.get(&key).is_none_or(|was| was.to_string() != e.to_string()) {
                self.news.push(e.clone());
            }
            self.services.insert(key, e);
        }
    }

    /// When the failing services are to be read again.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// The retry is due: the services to read again.
    pub fn due(&mut self) -> Vec<ServiceKey> {
        self.retry_at = None;
        self.services.keys().cloned().collect()
    }

    /// Before a round's updates are sent: whether the registry is degraded
    /// (then a call that answered is not health).
    pub fn settle(&self, health: &Health) {
        health.set_degraded(!self.services.is_empty());
    }

    /// After a round of reads: tell `health` what fails, and schedule the
    /// next retry (sooner the first times, then every 10 s at most). `sent`:
    /// the round sent an update, which marks the registry healthy in the
    /// cache; it is not while a service fails, so that is told again.
    pub fn report(&mut self, health: &Health, sent: bool) {
        self.settle(health);
        let news = std::mem::take(&mut self.news);
        for e in &news {
            health.fail_part(e);
        }
        if news.is_empty()
            && sent
            && let Some(e) = self.services.values().next()
        {
            health.fail_part(e);
        }
        if self.services.is_empty() {
            self.backoff.reset();
            self.retry_at = None;
        } else if self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + self.backoff.next());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::watcher::{Sink, Update};

    #[derive(Default)]
    struct Counts {
        healthy: AtomicUsize,
        degraded: AtomicUsize,
    }

    impl Sink for Counts {
        fn update(&self, _: Update) {}
        fn healthy(&self) {
            self.healthy.fetch_add(1, Ordering::SeqCst);
        }
        fn error(&self, e: &RegistryError) {
            panic!("a failing service is no registry error: {e}");
        }
        fn degraded(&self, _: &RegistryError) {
            self.degraded.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey { root: 0, name: name.into() }
    }

    fn no_auth(path: &str) -> RegistryError {
        RegistryError::BadResponse { registry: "zk".into(), what: format!("list {path}"), reason: "no auth".into() }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_service_is_told_once_and_retried_with_growing_waits() {
        let counts = Arc::new(Counts::default());
        let health = Health::new(counts.clone(), "test");
        let mut failing = Failing::default();
        failing.fail(key("a"), no_auth("/dubbo/a/providers"));
        failing.report(&health, false);
        assert!(health.is_degraded());
        assert_eq!(counts.degraded.load(Ordering::SeqCst), 1);
        let first = failing.retry_at().unwrap() - Instant::now();
        assert!(first <= Duration::from_millis(240), "{first:?}");

        // Each retry that fails the same way waits longer, and is not news.
        let mut waits = Vec::new();
        for _ in 0..8 {
            assert_eq!(failing.due(), [key("a")]);
            failing.fail(key("a"), no_auth("/dubbo/a/providers"));
            failing.report(&health, false);
            waits.push(failing.retry_at().unwrap() - Instant::now());
        }
        assert_eq!(counts.degraded.load(Ordering::SeqCst), 1, "the same failure is told once");
        assert!(waits[7] >= Duration::from_secs(8) && waits[7] <= Duration::from_secs(12), "{waits:?}");

        // An update sent meanwhile marks the registry healthy: told again.
        failing.report(&health, true);
        assert_eq!(counts.degraded.load(Ordering::SeqCst), 2);

        assert!(failing.read(&key("a")));
        assert!(!failing.read(&key("a")));
        failing.report(&health, false);
        assert!(!health.is_degraded());
        assert_eq!(failing.retry_at(), None);
    }

    #[test]
    fn a_full_sync_replaces_the_set_and_tells_only_what_is_new() {
        let counts = Arc::new(Counts::default());
        let health = Health::new(counts.clone(), "test");
        let mut failing = Failing::default();
        failing.fail(key("a"), no_auth("/dubbo/a/providers"));
        failing.fail(key("b"), no_auth("/dubbo/b/providers"));
        failing.report(&health, false);
        assert_eq!(counts.degraded.load(Ordering::SeqCst), 2);
        failing.replace(vec![(key("b"), no_auth("/dubbo/b/providers")), (key("c"), no_auth("/dubbo/c/providers"))]);
        assert!(!failing.contains(&key("a")) && failing.contains(&key("b")) && failing.contains(&key("c")));
        failing.report(&health, false);
        assert_eq!(counts.degraded.load(Ordering::SeqCst), 3, "only c is news");
        failing.replace(Vec::new());
        assert!(failing.is_empty());
    }
}
