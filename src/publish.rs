//! The publisher: whenever the cache or the desired config changes, translate
//! everything into a new [`ConfigSet`] and publish it on a watch channel. The
//! channel coalesces bursts, so a storm of registry events costs one
//! translation of the newest state, not one per event.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::cache::{Cache, RegistryKey};
use crate::config::Desired;
use crate::translate::gateway::GatewayOptions;
use crate::translate::ingress::IngressOptions;
use crate::translate::istio::IstioObject;
use crate::translate::{self, ConfigSet, Inputs};

/// How Ingresses and the standalone gateway are translated.
#[derive(Debug, Clone, Default)]
pub struct PublishOptions {
    pub ingress: IngressOptions,
    pub gateway: GatewayOptions,
}

/// Each object's MCP creation time: when this process first saw it. Pilot
/// treats a changed `create_time` as a changed object, so it must not move
/// while the object lives.
#[derive(Default)]
struct CreateTimes(HashMap<String, i64>);

impl CreateTimes {
    fn key(o: &IstioObject) -> String {
        format!("{}/{}", o.kind, o.key())
    }
}

/// Start the publisher task; the receiver always holds the newest set.
pub fn spawn(
    cache: &Arc<Cache>,
    mut desired: watch::Receiver<Arc<Desired>>,
    opts: PublishOptions,
    tasks: &mut Vec<JoinHandle<()>>,
) -> watch::Receiver<Arc<ConfigSet>> {
    let mut times = CreateTimes::default();
    let mut changes = cache.subscribe();
    let first = publish(cache, &desired.borrow_and_update(), &opts, &mut times);
    let (tx, rx) = watch::channel(Arc::new(first));
    let cache = cache.clone();
    tasks.push(tokio::spawn(async move {
        // A config source that went away leaves its last Desired in force.
        let mut desired_open = true;
        loop {
            tokio::select! {
                r = changes.changed() => { if r.is_err() { break } changes.borrow_and_update(); }
                r = desired.changed(), if desired_open => { if r.is_err() { desired_open = false; continue } }
            }
            let d = desired.borrow_and_update().clone();
            let set = publish(&cache, &d, &opts, &mut times);
            for w in &set.warnings {
                debug!(warning = %w, "translation");
            }
            tx.send_replace(Arc::new(set));
        }
    }));
    rx
}

fn publish(cache: &Cache, desired: &Desired, opts: &PublishOptions, times: &mut CreateTimes) -> ConfigSet {
    // take_view: the time of the oldest change this set is the first to
    // carry, for the event-to-push latency metrics.
    let (view, changed_at) = cache.take_view();
    let registry_proxies = desired
        .registries
        .iter()
        .filter_map(|r| Some((RegistryKey::new(r.kind, r.name.clone()), r.proxy_name.clone()?)))
        .collect();
    let registry_ecdh_curves = desired
        .registries
        .iter()
        .filter(|r| !r.ecdh_curves.is_empty())
        .map(|r| (RegistryKey::new(r.kind, r.name.clone()), r.ecdh_curves.clone()))
        .collect();
    let inputs = Inputs {
        ingresses: &desired.ingresses,
        tls_secrets: &desired.tls_secrets,
        ingress: opts.ingress.clone(),
        gateway: opts.gateway.clone(),
        proxies: &desired.proxies,
        registry_proxies,
        registry_ecdh_curves,
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or_default();
    let seen = RefCell::new(std::mem::take(&mut times.0));
    let mut set = translate::build(&view, &inputs, |o| *seen.borrow_mut().entry(CreateTimes::key(o)).or_insert(now));
    let mut seen = seen.into_inner();
    // Forget objects that are gone, so a re-created one gets a new time.
    let live: HashSet<String> = set.istio.iter().map(CreateTimes::key).collect();
    seen.retain(|k, _| live.contains(k));
    times.0 = seen;
    set.changed_at = changed_at;
    set
}
