//! `--max-stale`: withdraw the endpoints of a registry that has been
//! unreachable for too long.
//!
//! Off by default, because keeping the last known endpoints is what keeps
//! traffic flowing through a registry outage: instances rarely all move at
//! once, and Envoy's own health checks and outlier detection drop the ones
//! that did. Turn it on when a stale endpoint is worse than none: addresses
//! are reused quickly (pod IPs in a busy cluster, autoscaled VMs), so an old
//! address may now belong to another service; or traffic to a dead instance
//! must fail fast so that clients fail over to another region.
//!
//! "Unreachable" is measured from the first failed call after the last
//! success (or, for a registry loaded from the dump that has not answered,
//! from the load). A registry that answers but cannot read one service is
//! degraded (`Sink::degraded`), not unreachable: it is never withdrawn.
//! Services keep their ports with no endpoints, so clusters stay and
//! requests get a fast 503. The registry's next full answer restores them.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::task::JoinHandle;
use tracing::warn;

use crate::cache::Cache;

/// Withdraw what is due now; returns how many registries were withdrawn.
pub fn enforce(cache: &Cache, max_stale: Duration, now: SystemTime) -> usize {
    let mut n = 0;
    for r in cache.registries() {
        let st = &r.status;
        let Some(since) = st.unreachable_since else { continue };
        if st.healthy || st.withdrawn || now.duration_since(since).unwrap_or_default() < max_stale {
            continue;
        }
        warn!(
            registry = %r.key,
            max_stale_s = max_stale.as_secs_f64(),
            endpoints = r.endpoints,
            "registry unreachable for longer than --max-stale; withdrawing its endpoints"
        );
        cache.withdraw(&r.key);
        n += 1;
    }
    n
}

/// Check every `max_stale / 10` (between 100 ms and 5 s).
pub fn spawn(cache: Arc<Cache>, max_stale: Duration) -> JoinHandle<()> {
    let every = (max_stale / 10).clamp(Duration::from_millis(100), Duration::from_secs(5));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            enforce(&cache, max_stale, SystemTime::now());
        }
    })
}

#[cfg(test)]
mod tests {
    use meshbridge_registries::{Endpoint, RegistryError, RegistryKind, Service, ServicePort, Update};

    use super::*;
    use crate::cache::RegistryKey;

    #[test]
    fn withdraws_only_after_max_stale_and_only_unreachable_registries() {
        let cache = Cache::new();
        let (down, up) = (RegistryKey::new(RegistryKind::Consul, "down"), RegistryKey::new(RegistryKind::Consul, "up"));
        let ep = Endpoint { address: "10.0.0.1".into(), port: 80, weight: 1, labels: Default::default() };
        let svc = |h: &str| {
            Service::new(
                h,
                vec![ServicePort { number: 80, protocol: Default::default(), name: "http-80".into() }],
                vec![ep.clone()],
            )
        };
        let d = cache.attach(&down);
        d.update(Update::Snapshot(vec![svc("a.consul")]));
        let u = cache.attach(&up);
        u.update(Update::Snapshot(vec![svc("b.consul")]));
        // One service of `up` cannot be read: unhealthy, but it answers, so
        // it is never withdrawn for staleness.
        let part =
            RegistryError::Status { registry: "up".into(), what: "GET /v1/health/service/b".into(), status: 500 };
        u.degraded(&part);
        d.error(&RegistryError::Unreachable { registry: "down".into(), reason: "refused".into() });
        let max = Duration::from_secs(30);
        assert_eq!(enforce(&cache, max, SystemTime::now()), 0, "not yet");
        let later = SystemTime::now() + Duration::from_secs(31);
        assert_eq!(enforce(&cache, max, later), 1);
        assert_eq!(enforce(&cache, max, later), 0, "once");
        let view = cache.view();
        assert!(view.services["a.consul"].service.endpoints.is_empty());
        assert_eq!(view.services["b.consul"].service.endpoints.len(), 1);
        let up_status = cache.statuses().into_iter().find(|(k, _)| *k == up).expect("up").1;
        assert!(!up_status.healthy, "degraded is not healthy");
        assert_eq!((up_status.unreachable_since, up_status.consecutive_failures), (None, 0));
        assert!(up_status.last_error.is_some_and(|e| e.contains("500")));
    }
}
