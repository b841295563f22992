//! Kubernetes Services as a source of endpoints for the standalone gateway
//! (`--kube` mode): an Ingress backend that names a Service routes to
//! `outbound|PORT||name.namespace.svc.cluster.local`, whose endpoints come
//! from the Service's EndpointSlices, as kube-proxy reads them.
//!
//! - **What is read.** Only the Services Ingresses reference (a path's or
//!   the default backend's `service`, a `mirror-target-service` or a
//!   `default-backend` annotation naming one),
//!   in their namespaces: one watch on Services and one on EndpointSlices
//!   per such namespace, started and stopped as the Ingresses change.
//! - **Ports** as kube-proxy maps them: a Service port is matched to the
//!   slice port of the same name (the EndpointSlice controller has already
//!   resolved `targetPort`, named or numbered, for each slice), TCP only.
//! - **Endpoints**: a slice's `IPv4`/`IPv6` endpoints whose `ready`
//!   condition is not false and that are not `terminating` (an unset
//!   condition counts as ready, not terminating, as the API documents), the
//!   first address of each. A Service with several ports labels each
//!   endpoint with the port it serves ([`LABEL_SERVICE_PORT`]), since one
//!   pod may serve them on different target ports.
//! - **Readiness**: the pseudo-registry counts as answered (startup gate,
//!   `/ready`) once every namespace it first watched has listed both
//!   kinds; a failed watch is the registry's error until the next event.
//! - **Into the cache** under the pseudo-registry
//!   [`RegistryKind::Kubernetes`] `kubernetes`, one `Upsert`/`Remove` per
//!   changed Service: translation makes its clusters and EDS like a registry
//!   service's, at the cost of that Service, and sends istiod nothing for
//!   it (istiod reads Services itself).
//!
//! `ExternalName` Services give their name as the endpoint on each Service
//! port, which makes a STRICT_DNS cluster, as Istio does. Not read: `FQDN`
//! slices.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use meshbridge_registries::{Endpoint, Protocol, RegistryError, RegistryKind, Service, ServicePort, Sink, Update};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::cache::{Cache, RegistryKey};
use crate::config::Desired;
use crate::model::IngressDoc;
use crate::translate::model::LABEL_SERVICE_PORT;

/// The label the EndpointSlice controller puts on a Service's slices.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The pseudo-registry the Services are cached under.
pub fn registry_key() -> RegistryKey {
    RegistryKey::new(RegistryKind::Kubernetes, "kubernetes")
}

/// The mesh host of a Service.
pub fn host(namespace: &str, name: &str) -> String {
    crate::translate::names::service_host(namespace, name)
}

/// The Services Ingresses reference, as `namespace → names`.
pub fn referenced(ingresses: &[IngressDoc]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for doc in ingresses {
        let Ok(ing) = &doc.ingress else { continue };
        let mut add = |ns: &str, name: &str| {
            if !name.is_empty() {
                out.entry(ns.to_owned()).or_default().insert(name.to_owned());
            }
        };
        let backends = ing.spec.default_backend.iter().chain(
            ing.spec.rules.iter().filter_map(|r| r.http.as_ref()).flat_map(|h| h.paths.iter().map(|p| &p.backend)),
        );
        for b in backends {
            if let Some(svc) = &b.service {
                add(&doc.namespace, &svc.name);
            }
        }
        for (ns, name) in ing.metadata.annotated_kubernetes_services(&doc.namespace) {
            add(&ns, &name);
        }
    }
    out
}

/// The protocol of a Service port: its `appProtocol` (`kubernetes.io/h2c`
/// is HTTP/2), else the prefix of its name as Istio reads it (`grpc-api`),
/// else HTTP, which is what an Ingress sends.
fn protocol(name: &str, app_protocol: Option<&str>) -> Protocol {
    let app = app_protocol.map(|a| a.strip_prefix("kubernetes.io/").unwrap_or(a));
    app.and_then(Protocol::parse)
        .or_else(|| Protocol::parse(name.split('-').next().unwrap_or_default()))
        .unwrap_or(Protocol::Http)
}

/// A Service and its slices → the service the gateway serves; `None` for
/// one with no TCP port, or an `ExternalName` that is not a DNS name. An
/// `ExternalName` Service gives its name on each of its ports (slices are
/// not read for it): Envoy resolves it.
pub fn service_of<'a>(svc: &KubeService, slices: impl IntoIterator<Item = &'a EndpointSlice>) -> Option<Service> {
    let namespace = svc.namespace().unwrap_or_default();
    let spec = svc.spec.as_ref()?;
    let external = (spec.type_.as_deref() == Some("ExternalName")).then_some(spec.external_name.as_deref());
    let tcp = |p: Option<&String>| p.is_none_or(|p| p == "TCP");
    let ports: Vec<(&str, ServicePort)> = spec
        .ports
        .iter()
        .flatten()
        .filter(|p| tcp(p.protocol.as_ref()))
        .filter_map(|p| {
            let number = u16::try_from(p.port).ok().filter(|n| *n > 0)?;
            let name = p.name.as_deref().unwrap_or_default();
            let protocol = protocol(name, p.app_protocol.as_deref());
            // The Service's own port name, which an Ingress backend may use.
            let port_name = if name.is_empty() {
                format!("{}-{number}", protocol.as_str().to_lowercase())
            } else {
                name.to_owned()
            };
            Some((name, ServicePort { number, protocol, name: port_name }))
        })
        .collect();
    if ports.is_empty() {
        return None;
    }
    let several = ports.len() > 1;
    let port_label = |port: &ServicePort| -> meshbridge_registries::Labels {
        if several {
            BTreeMap::from([(LABEL_SERVICE_PORT.to_owned(), port.number.to_string())]).into()
        } else {
            Default::default()
        }
    };
    let mut endpoints = Vec::new();
    if let Some(name) = external {
        // The name on each Service port (there is no target port): Envoy
        // resolves it, in a DNS cluster.
        let name = name.map(|n| n.trim_end_matches('.')).filter(|n| external_name_ok(n))?;
        for (_, port) in &ports {
            endpoints.push(Endpoint {
                address: name.to_owned(),
                port: port.number,
                weight: 1,
                labels: port_label(port),
            });
        }
    }
    for slice in slices.into_iter().filter(|_| external.is_none()) {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        for sp in slice.ports.iter().flatten().filter(|p| tcp(p.protocol.as_ref())) {
            let name = sp.name.as_deref().unwrap_or_default();
            let Some((_, port)) = ports.iter().find(|(n, _)| *n == name) else { continue };
            let Some(target) = sp.port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0) else { continue };
            let labels = port_label(port);
            for ep in &slice.endpoints {
                let conditions = ep.conditions.as_ref();
                let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
                let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
                let Some(address) = ep.addresses.first() else { continue };
                if ready && !terminating {
                    endpoints.push(Endpoint {
                        address: address.clone(),
                        port: target,
                        weight: 1,
                        labels: labels.clone(),
                    });
                }
            }
        }
    }
    // A pod listed by two slices (while the controller moves it) once.
    endpoints.sort();
    endpoints.dedup();
    let mut out = Service::new(host(&namespace, &svc.name_any()), Vec::new(), endpoints);
    out.ports = ports.into_iter().map(|(_, p)| p).collect();
    out.ports.sort_by_key(|p| p.number);
    Some(out)
}

/// An `ExternalName` as a DNS name Envoy can resolve: a DNS-1123
/// subdomain, as the API server validates it (an IP address also passes).
fn external_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A namespace's EndpointSlices, indexed by the Service each belongs to,
/// so that a change reads only that Service's slices.
#[derive(Default)]
struct Slices {
    /// Service name → its slices by name.
    by_service: HashMap<String, HashMap<String, EndpointSlice>>,
    /// Slice name → its Service's name.
    owner: HashMap<String, String>,
}

impl Slices {
    /// Add or replace a slice; returns the Services it changes (its own,
    /// and the one it was listed under before, if that changed).
    fn apply(&mut self, slice: EndpointSlice, touched: &mut BTreeSet<String>) {
        let (name, service) = (slice.name_any(), slice.labels().get(SERVICE_NAME_LABEL).cloned().unwrap_or_default());
        if let Some(before) = self.owner.insert(name.clone(), service.clone())
            && before != service
        {
            self.take(&before, &name);
            touched.insert(before);
        }
        self.by_service.entry(service.clone()).or_default().insert(name, slice);
        touched.insert(service);
    }

    fn delete(&mut self, name: &str, touched: &mut BTreeSet<String>) {
        if let Some(service) = self.owner.remove(name) {
            self.take(&service, name);
            touched.insert(service);
        }
    }

    fn take(&mut self, service: &str, name: &str) {
        if let Some(slices) = self.by_service.get_mut(service) {
            slices.remove(name);
            if slices.is_empty() {
                self.by_service.remove(service);
            }
        }
    }

    fn of(&self, service: &str) -> impl Iterator<Item = &EndpointSlice> {
        self.by_service.get(service).into_iter().flat_map(|s| s.values())
    }
}

/// What one namespace's watches saw.
#[derive(Default)]
struct Namespace {
    services: HashMap<String, KubeService>,
    slices: Slices,
    /// The Services of this namespace the Ingresses reference.
    wanted: BTreeSet<String>,
    /// What was last written to the cache, by Service name.
    written: BTreeMap<String, Arc<Service>>,
}

impl Namespace {
    /// Write `name`'s service to the cache if it changed (or remove it):
    /// the work of that Service's slices alone.
    fn sync(&mut self, name: &str, sink: &dyn Sink) {
        let now = self
            .wanted
            .contains(name)
            .then(|| self.services.get(name))
            .flatten()
            .and_then(|svc| service_of(svc, self.slices.of(name)));
        match (now, self.written.get(name)) {
            (Some(now), Some(before)) if **before == now => {}
            (Some(now), _) => {
                debug!(service = %now.host, endpoints = now.endpoints.len(), "Service endpoints");
                self.written.insert(name.to_owned(), Arc::new(now.clone()));
                sink.update(Update::Upsert(now));
            }
            (None, Some(before)) => {
                sink.update(Update::Remove(before.host.clone()));
                self.written.remove(name);
            }
            (None, None) => {}
        }
    }
}

#[allow(clippy::large_enum_variant)] // one at a time through a bounded channel
enum Seen {
    Service(Result<watcher::Event<KubeService>, watcher::Error>),
    Slice(Result<watcher::Event<EndpointSlice>, watcher::Error>),
}

/// One namespace: its two watches, until aborted.
async fn watch_namespace(
    client: Client,
    ns: String,
    mut wanted: watch::Receiver<BTreeSet<String>>,
    sink: Arc<dyn Sink>,
    listed: mpsc::UnboundedSender<String>,
) {
    let (tx, mut rx) = mpsc::channel::<Seen>(256);
    // Held per namespace: only what the mapping reads is kept (managed
    // fields and annotations are most of an object's bytes).
    let services = watcher(Api::<KubeService>::namespaced(client.clone(), &ns), watcher::Config::default())
        .default_backoff()
        .modify(|s| strip(&mut s.metadata))
        .map(Seen::Service);
    let slices =
        watcher(Api::<EndpointSlice>::namespaced(client, &ns), watcher::Config::default().labels(SERVICE_NAME_LABEL))
            .default_backoff()
            .modify(|s| strip(&mut s.metadata))
            .map(Seen::Slice);
    let forward = {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut both = futures::stream::select(services.boxed(), slices.boxed());
            while let Some(seen) = both.next().await {
                if tx.send(seen).await.is_err() {
                    break;
                }
            }
        })
    };
    drop(tx);
    let mut state = Namespace { wanted: wanted.borrow_and_update().clone(), ..Namespace::default() };
    // Relists fill these, then replace the maps at InitDone.
    let mut listing_services: Option<HashMap<String, KubeService>> = None;
    let mut listing_slices: Option<Slices> = None;
    // Until both first lists are in, and once after.
    let (mut services_listed, mut slices_listed, mut told) = (false, false, false);
    loop {
        let seen = tokio::select! {
            seen = rx.recv() => seen,
            changed = wanted.changed() => {
                if changed.is_err() {
                    break;
                }
                let now = wanted.borrow_and_update().clone();
                let touched: BTreeSet<String> = now.symmetric_difference(&state.wanted).cloned().collect();
                state.wanted = now;
                for name in touched {
                    state.sync(&name, sink.as_ref());
                }
                continue;
            }
        };
        let Some(seen) = seen else { break };
        let mut touched: BTreeSet<String> = BTreeSet::new();
        match seen {
            Seen::Service(Ok(event)) => match event {
                watcher::Event::Apply(s) => {
                    touched.insert(s.name_any());
                    state.services.insert(s.name_any(), s);
                }
                watcher::Event::Delete(s) => {
                    touched.insert(s.name_any());
                    state.services.remove(&s.name_any());
                }
                watcher::Event::Init => listing_services = Some(HashMap::new()),
                watcher::Event::InitApply(s) => {
                    listing_services.get_or_insert_with(HashMap::new).insert(s.name_any(), s);
                }
                watcher::Event::InitDone => {
                    let listed = listing_services.take().unwrap_or_default();
                    touched.extend(state.services.keys().chain(listed.keys()).cloned());
                    state.services = listed;
                    services_listed = true;
                }
            },
            Seen::Slice(Ok(event)) => match event {
                watcher::Event::Apply(s) => state.slices.apply(s, &mut touched),
                watcher::Event::Delete(s) => state.slices.delete(&s.name_any(), &mut touched),
                watcher::Event::Init => listing_slices = Some(Slices::default()),
                watcher::Event::InitApply(s) => {
                    listing_slices.get_or_insert_with(Slices::default).apply(s, &mut BTreeSet::new());
                }
                watcher::Event::InitDone => {
                    let listed = listing_slices.take().unwrap_or_default();
                    touched.extend(state.slices.by_service.keys().chain(listed.by_service.keys()).cloned());
                    state.slices = listed;
                    slices_listed = true;
                }
            },
            Seen::Service(Err(error)) | Seen::Slice(Err(error)) => {
                warn!(namespace = %ns, %error, "watching Services or EndpointSlices; retrying");
                let reason = format!("namespace {ns}: {error}");
                sink.error(&RegistryError::Unreachable { registry: registry_key().name, reason });
                continue;
            }
        }
        for name in &touched {
            if state.wanted.contains(name) || state.written.contains_key(name) {
                state.sync(name, sink.as_ref());
            }
        }
        sink.healthy();
        if services_listed && slices_listed && !told {
            told = true;
            let _ = listed.send(ns.clone());
        }
    }
    forward.abort();
    // Stopped: what this namespace served goes.
    for svc in std::mem::take(&mut state.written).into_values() {
        sink.update(Update::Remove(svc.host.clone()));
    }
}

fn strip(meta: &mut kube::api::ObjectMeta) {
    meta.managed_fields = None;
    meta.annotations = None;
}

struct Running {
    task: JoinHandle<()>,
    wanted: watch::Sender<BTreeSet<String>>,
}

/// Before the first publish: have the pseudo-registry in the cache if the
/// first Ingresses name a Service, so that the startup gate waits for it
/// ([`run`] takes it over).
pub(super) fn prepare(cache: &Arc<Cache>, desired: &Desired) {
    if !referenced(&desired.ingresses).is_empty() {
        cache.attach(&registry_key());
    }
}

/// Follow the Ingresses' Service backends: a watch pair per referenced
/// namespace, started and stopped as `desired` changes. The pseudo-registry
/// exists in the cache (and on `/v1/registries`) only while some Ingress
/// names a Service. It counts as answered (for the startup gate and
/// `/ready`) once every namespace it first watched has listed its Services
/// and slices: the gateway is never sent routes to Services not yet read.
pub(super) async fn run(client: Client, cache: Arc<Cache>, mut desired: watch::Receiver<Arc<Desired>>) {
    let key = registry_key();
    let mut sink: Option<Arc<dyn Sink>> = None;
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let (listed_tx, mut listed_rx) = mpsc::unbounded_channel::<String>();
    // Namespaces whose first lists the registry waits for, until it is synced.
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut synced = false;
    let mut first = true;
    loop {
        let want = referenced(&desired.borrow_and_update().ingresses);
        running.retain(|ns, r| {
            let keep = want.contains_key(ns);
            if !keep {
                info!(namespace = %ns, "no Ingress names its Services: stopped watching them");
                r.task.abort();
                pending.remove(ns);
                if let Some(sink) = &sink {
                    for host in r.wanted.borrow().iter().map(|name| host(ns, name)) {
                        sink.update(Update::Remove(host));
                    }
                }
            }
            keep
        });
        // (The first time, [`prepare`] may have attached it.)
        if want.is_empty() && (sink.take().is_some() || first) {
            cache.remove(&key);
            (synced, pending) = (false, BTreeSet::new());
        }
        first = false;
        for (ns, names) in want {
            if let Some(r) = running.get(&ns) {
                r.wanted.send_if_modified(|w| {
                    let changed = *w != names;
                    *w = names.clone();
                    changed
                });
                continue;
            }
            let sink = sink.get_or_insert_with(|| cache.attach(&key)).clone();
            if !synced {
                pending.insert(ns.clone());
            }
            info!(namespace = %ns, services = names.len(), "watching Services and EndpointSlices");
            let (tx, rx) = watch::channel(names);
            let span = info_span!("services", namespace = %ns);
            let task =
                tokio::spawn(watch_namespace(client.clone(), ns.clone(), rx, sink, listed_tx.clone()).instrument(span));
            running.insert(ns, Running { task, wanted: tx });
        }
        loop {
            if !synced && sink.is_some() && pending.is_empty() {
                synced = true;
                cache.mark_synced(&key);
                info!("every referenced namespace's Services and EndpointSlices read");
            }
            tokio::select! {
                changed = desired.changed() => {
                    if changed.is_err() {
                        for r in running.into_values() {
                            r.task.abort();
                        }
                        return;
                    }
                    break;
                }
                Some(ns) = listed_rx.recv() => {
                    pending.remove(&ns);
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "services_tests.rs"]
mod tests;
