//! Never serve a partial view: the startup gate.
//!
//! Until every registry has answered its first full sync or been loaded
//! from the state dump, the published set's [`Readiness`] is `held`, and
//! the xDS server sends nothing to a new stream while it is (requests wait,
//! nothing is lost). A registry whose spec cannot become a watcher is
//! reported and never waited for. `--initial-sync-timeout` bounds the wait:
//! past it the set is released anyway, still marked `incomplete`, and the
//! log, `/ready` (503) and `/v1/registries` (`missing`) say which registry
//! it lacks.
//!
//! The hold happens once, at start: after the first release a set is never
//! held again, since clients already have config and a registry added
//! later only adds to it. `incomplete` keeps tracking the truth, for `/ready`.

use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::cache::{Cache, RegistryKey, RegistryStatus};

/// How often the publisher re-checks while a registry is missing: a
/// registry's first answer may equal its dump and change no content.
pub const RECHECK: Duration = Duration::from_millis(100);

/// A registry counts once it answered, was loaded from the dump, or can
/// never start.
pub fn counts(status: &RegistryStatus) -> bool {
    status.ready || status.stale || status.config_error
}

/// Registries the served config lacks, in key order.
pub fn missing(cache: &Cache) -> Vec<RegistryKey> {
    cache.statuses().into_iter().filter(|(_, status)| !counts(status)).map(|(key, _)| key).collect()
}

/// The publisher's side of the gate.
#[derive(Debug)]
pub struct StartupGate {
    started: Instant,
    timeout: Duration,
    released: bool,
}

/// What a set about to be published may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Readiness {
    /// Clients must not be sent the set yet (the startup gate).
    pub held: bool,
    /// A registry had neither answered nor been loaded from the dump when
    /// the set was built.
    pub incomplete: bool,
}

impl StartupGate {
    pub fn new(timeout: Duration) -> StartupGate {
        StartupGate { started: Instant::now(), timeout, released: false }
    }

    /// Check the cache; call it just *before* taking the cache's changes,
    /// so that everything counted here is in the set built from them.
    pub fn check(&mut self, cache: &Cache) -> Readiness {
        let missing = missing(cache);
        if !self.released {
            let waited = self.started.elapsed();
            if missing.is_empty() {
                self.released = true;
                info!(
                    waited_ms = waited.as_millis() as u64,
                    "every registry answered or was loaded from the dump; serving"
                );
            } else if waited >= self.timeout {
                self.released = true;
                let missing: Vec<String> = missing.iter().map(|k| k.to_string()).collect();
                warn!(
                    ?missing,
                    timeout_s = self.timeout.as_secs_f64(),
                    "initial sync timed out; serving a config that lacks these registries (see /ready)"
                );
            }
        }
        Readiness { held: !self.released, incomplete: !missing.is_empty() }
    }

    /// When to check again: soon while anything is missing, never after.
    pub fn recheck(&self, last: Readiness) -> Option<Duration> {
        (last.held || last.incomplete).then_some(RECHECK)
    }
}

#[cfg(test)]
mod tests {
    use meshbridge_registries::{RegistryError, RegistryKind, RegistrySpec, Update};

    use super::*;

    #[test]
    fn held_until_every_registry_counts_or_the_timeout() {
        let cache = Cache::new();
        let a = RegistryKey::new(RegistryKind::Consul, "a");
        let bad = RegistryKey::new(RegistryKind::Nacos2, "bad");
        let sink = cache.attach(&a);
        cache.describe(&bad, &RegistrySpec::new(RegistryKind::Nacos2, "bad", "x", 1));
        cache.set_failed(&bad, "bad: cannot start");
        let mut gate = StartupGate::new(Duration::from_secs(60));
        assert_eq!(gate.check(&cache), Readiness { held: true, incomplete: true });
        // An error is not an answer.
        sink.error(&RegistryError::Unreachable { registry: "a".into(), reason: "refused".into() });
        assert!(gate.check(&cache).held);
        sink.update(Update::Snapshot(vec![]));
        assert_eq!(gate.check(&cache), Readiness { held: false, incomplete: false });
        assert_eq!(gate.recheck(Readiness { held: false, incomplete: false }), None);

        // Never held again; a registry added later only makes it incomplete.
        cache.attach(&RegistryKey::new(RegistryKind::Consul, "later"));
        assert_eq!(gate.check(&cache), Readiness { held: false, incomplete: true });
    }

    #[test]
    fn timeout_releases_an_incomplete_set() {
        let cache = Cache::new();
        cache.attach(&RegistryKey::new(RegistryKind::Consul, "down"));
        let mut gate = StartupGate::new(Duration::ZERO);
        assert_eq!(gate.check(&cache), Readiness { held: false, incomplete: true });
    }
}
