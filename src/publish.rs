//! The publisher: whenever the cache or the desired config changes, bring
//! the translated [`ConfigSet`] up to date and publish it on a watch
//! channel. The cache hands over only the hosts that changed, and the
//! [`Translator`] does only their work, so a one-instance change costs the
//! same at 10 or 10,000 services. The channel coalesces bursts: a storm of
//! registry events costs one pass over the hosts it touched.
//!
//! Translation runs on the blocking pool, never as a long poll on an async
//! worker.

use std::sync::Arc;

use meshbridge_registries::Migration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::cache::{Cache, Changes, RegistryKey};
use crate::config::{Desired, FileStatus};
use crate::startup::{Readiness, StartupGate};
use crate::translate::gateway::GatewayOptions;
use crate::translate::ingress::IngressOptions;
use crate::translate::{ConfigSet, Inputs, Translator};

/// What the publisher hands out: the translated set, and beside it what is
/// not translation (the config source's status, the startup gate's
/// readiness). Derefs to the set, which is what most readers want.
#[derive(Debug, Clone, Default)]
pub struct Published {
    pub set: Arc<ConfigSet>,
    pub config: ConfigStatus,
    pub readiness: Readiness,
}

impl std::ops::Deref for Published {
    type Target = ConfigSet;
    fn deref(&self) -> &ConfigSet {
        &self.set
    }
}

impl Published {
    /// A set alone, ready to serve, with no config problems (tests, tools).
    pub fn ready(set: ConfigSet) -> Published {
        Published { set: Arc::new(set), ..Published::default() }
    }
}

/// The config source's current problems and files, as of the `Desired` the
/// set was built from (`/v1/config`, metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigStatus {
    pub errors: Arc<[String]>,
    pub files: Arc<[FileStatus]>,
}

impl ConfigStatus {
    fn of(d: &Desired) -> ConfigStatus {
        ConfigStatus { errors: d.errors.as_slice().into(), files: d.files.as_slice().into() }
    }
}

/// How Ingresses and the standalone gateway are translated.
#[derive(Debug, Clone, Default)]
pub struct PublishOptions {
    pub ingress: IngressOptions,
    pub gateway: GatewayOptions,
}

/// Start the publisher task; the receiver always holds the newest set.
pub fn spawn(
    cache: &Arc<Cache>,
    mut desired: watch::Receiver<Arc<Desired>>,
    opts: PublishOptions,
    mut gate: StartupGate,
    tasks: &mut Vec<JoinHandle<()>>,
) -> watch::Receiver<Arc<Published>> {
    let mut translator = Translator::new();
    let mut changes = cache.subscribe();
    changes.borrow_and_update();
    let mut readiness = gate.check(cache);
    let first = cache.take_all();
    let d = desired.borrow_and_update().clone();
    translate(&mut translator, first, &d, &opts, true);
    let mut published = Published { set: Arc::new(translator.set().clone()), config: ConfigStatus::of(&d), readiness };
    let (tx, rx) = watch::channel(Arc::new(published.clone()));
    let cache = cache.clone();
    tasks.push(tokio::spawn(async move {
        // A config source that went away leaves its last Desired in force.
        let mut desired_open = true;
        let mut translator = Some(translator);
        let mut translated_from = d;
        loop {
            tokio::select! {
                r = changes.changed() => { if r.is_err() { break } changes.borrow_and_update(); }
                r = desired.changed(), if desired_open => {
                    if r.is_err() { desired_open = false; continue }
                }
                // Only while a registry is missing: see crate::startup.
                _ = tokio::time::sleep(gate.recheck(readiness).unwrap_or_default()), if gate.recheck(readiness).is_some() => {
                    if gate.check(&cache) == readiness && !changes.has_changed().unwrap_or(false) { continue }
                }
            }
            // Whichever branch woke us, the Desired read here is the one
            // translated: a new config that arrives with a cache change
            // (a kube Service upsert and the Ingress naming it, say) is
            // seen as new, never taken as read by the cache branch.
            let d = desired.borrow_and_update().clone();
            let inputs_changed = !Arc::ptr_eq(&d, &translated_from);
            translated_from = d.clone();
            let config = ConfigStatus::of(&d);
            let now_ready = gate.check(&cache);
            let batch = cache.take_changes();
            let Some(mut t) = translator.take() else { break };
            let opts = opts.clone();
            let done = tokio::task::spawn_blocking(move || {
                let changed = translate(&mut t, batch, &d, &opts, inputs_changed);
                (t, changed)
            })
            .await;
            let (t, changed) = match done {
                Ok(done) => done,
                Err(e) => {
                    // A panic in translation is a bug; the last published
                    // set stays in force and the publisher stops.
                    warn!(error = %e, "translation failed; keeping the last published config");
                    break;
                }
            };
            if changed || now_ready != readiness || config != published.config {
                readiness = now_ready;
                // A set translation left alone is handed out again as is.
                if changed {
                    published.set = Arc::new(t.set().clone());
                }
                published.config = config;
                published.readiness = readiness;
                tx.send_replace(Arc::new(published.clone()));
            }
            translator = Some(t);
        }
    }));
    rx
}

#[cfg(test)]
#[path = "publish_tests.rs"]
mod tests;

fn translate(
    t: &mut Translator,
    changes: Changes,
    desired: &Desired,
    opts: &PublishOptions,
    inputs_changed: bool,
) -> bool {
    let inputs = inputs(desired, opts);
    let hosts = changes.hosts.len();
    let changed = t.apply(changes, &inputs, inputs_changed);
    if changed {
        let set = t.set();
        debug!(revision = set.revision, hosts, warnings = set.warnings.len(), "published");
    }
    changed
}

/// What translation takes from a [`Desired`] and the options: the same for
/// the server and for `meshbridge check`.
pub(crate) fn inputs<'a>(desired: &'a Desired, opts: &PublishOptions) -> Inputs<'a> {
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
    let registry_migration = desired
        .registries
        .iter()
        .filter(|r| r.migration != Migration::default())
        .map(|r| (RegistryKey::new(r.kind, r.name.clone()), r.migration))
        .collect();
    Inputs {
        ingresses: &desired.ingresses,
        tls_secrets: &desired.tls_secrets,
        ca_secrets: &desired.ca_secrets,
        ingress: opts.ingress.clone(),
        gateway: opts.gateway.clone(),
        proxies: &desired.proxies,
        registry_proxies,
        registry_ecdh_curves,
        registry_migration,
    }
}

/// How Ingresses are read and what the standalone Envoy gateway listens on.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// Only Ingresses of this class count; an empty value means all.
    #[arg(long, env = "MESHBRIDGE_INGRESS_CLASS", default_value = crate::translate::ingress::DEFAULT_INGRESS_CLASS)]
    pub ingress_class: String,
    /// Ports of the HTTP listeners served to Envoy over LDS (comma list).
    #[arg(long, env = "MESHBRIDGE_GATEWAY_HTTP_PORT", default_value = "80", value_delimiter = ',')]
    pub gateway_http_port: Vec<u16>,
    /// Port of the HTTPS listener, made when an Ingress TLS Secret is present.
    #[arg(long, env = "MESHBRIDGE_GATEWAY_HTTPS_PORT", default_value_t = 443)]
    pub gateway_https_port: u16,
    /// Namespace and name of the Istio Gateway that Ingresses are bound to.
    #[arg(long, env = "MESHBRIDGE_GATEWAY_NAMESPACE", default_value = "higress-system")]
    pub gateway_namespace: String,
    #[arg(long, env = "MESHBRIDGE_GATEWAY_NAME", default_value = "higress-gateway")]
    pub gateway_name: String,
}

impl Default for GatewayArgs {
    fn default() -> Self {
        GatewayArgs {
            ingress_class: crate::translate::ingress::DEFAULT_INGRESS_CLASS.into(),
            gateway_http_port: vec![80],
            gateway_https_port: 443,
            gateway_namespace: "higress-system".into(),
            gateway_name: "higress-gateway".into(),
        }
    }
}

impl GatewayArgs {
    pub(crate) fn publish_options(&self) -> PublishOptions {
        PublishOptions {
            ingress: IngressOptions {
                ingress_class: Some(self.ingress_class.clone()),
                gateway_namespace: self.gateway_namespace.clone(),
                gateway_name: self.gateway_name.clone(),
                known_secrets: Default::default(),
                known_ca_secrets: Default::default(),
                service_hosts: Default::default(),
            },
            gateway: GatewayOptions { http_ports: self.gateway_http_port.clone(), https_port: self.gateway_https_port },
        }
    }
}
