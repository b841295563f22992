//! Reflectors on McpBridge, Ingress and IngressClass, the referenced
//! Secrets read by name ([`super::secrets`]), and the one task that turns
//! them into [`Desired`].
//!
//! Objects go through `config::parse_object` and `config::Builder`, the
//! functions the directory source uses, so a McpBridge means the same thing
//! whichever way it arrives. Only referenced Secrets are read: those named
//! by an `authSecretName` (in its McpBridge's namespace), by an
//! Ingress's `spec.tls[].secretName` (in the Ingress's namespace) and by its
//! `proxy-ssl-secret` and `auth-tls-secret` (`[namespace/]name`). A
//! Secret's data ends up in the registry spec it resolves into, so the
//! reconciler, which restarts a watcher only when its spec changed, restarts
//! exactly the watchers that use a changed Secret.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use super::args::{DEFAULT_MCPBRIDGE, KubeError, SourceOptions};
use super::secrets::{SecretRef, Secrets};
use crate::config::{Builder, Desired, Document, FieldError, IngressDoc, parse_object};
use crate::model::ingress;
use crate::model::ingress::{AUTH_TLS_SECRET_KEYS, PROXY_SSL_SECRET_KEYS, secret_ref};

/// Wait this long after a change for the rest of a burst (a relist, a
/// `kubectl apply` of several objects) before rebuilding.
const DEBOUNCE: Duration = Duration::from_millis(50);
const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// Higress's class, which also takes Ingresses that name none (as the
/// Ingress translator does).
const HIGRESS_CLASS: &str = "higress";

/// One McpBridge as last seen, for the status and port writers.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedBridge {
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    pub resource_version: Option<String>,
    /// `spec.registries[]` and `spec.proxies[]` as written.
    pub registries: Vec<Value>,
    pub proxies: Vec<Value>,
    /// `status` as the API server has it.
    pub status: Option<Value>,
}

impl ObservedBridge {
    /// `namespace/name`, as config errors name it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The selected McpBridges and the config built from everything watched.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub bridges: Vec<ObservedBridge>,
    pub desired: Arc<Desired>,
}

/// The stores the builder reads.
struct Stores {
    bridges: Store<DynamicObject>,
    ingresses: Store<Ingress>,
    classes: Store<IngressClass>,
}

pub(super) fn mcpbridge_resource() -> ApiResource {
    ApiResource {
        group: super::args::MCPBRIDGE_GROUP.into(),
        version: super::args::MCPBRIDGE_VERSION.into(),
        api_version: format!("{}/{}", super::args::MCPBRIDGE_GROUP, super::args::MCPBRIDGE_VERSION),
        kind: super::args::MCPBRIDGE_KIND.into(),
        plural: super::args::MCPBRIDGE_PLURAL.into(),
    }
}

/// Start the reflectors, wait for their first lists, and start the task
/// that publishes [`Desired`] (only when it changed) and [`Observed`].
pub(super) async fn start(
    client: Client,
    opts: &SourceOptions,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(watch::Receiver<Arc<Desired>>, watch::Receiver<Arc<Observed>>), KubeError> {
    let args = &opts.args;
    let notify = Arc::new(Notify::new());
    let ar = mcpbridge_resource();
    let bridge_cfg = if let Some(selector) = &args.mcpbridge_selector {
        watcher::Config::default().labels(selector)
    } else if args.all_mcpbridges {
        watcher::Config::default()
    } else {
        watcher::Config::default().fields(&format!("metadata.name={DEFAULT_MCPBRIDGE}"))
    };
    let bridges = reflect(
        Api::<DynamicObject>::namespaced_with(client.clone(), &args.namespace, &ar),
        bridge_cfg,
        ar.clone(),
        "mcpbridges",
        &notify,
        tasks,
    );
    let ingresses = match &args.watch_namespace {
        Some(ns) => Api::<Ingress>::namespaced(client.clone(), ns),
        None => Api::<Ingress>::all(client.clone()),
    };
    let ingresses = reflect(ingresses, watcher::Config::default(), (), "ingresses", &notify, tasks);
    let classes = reflect(
        Api::<IngressClass>::all(client.clone()),
        watcher::Config::default(),
        (),
        "ingressclasses",
        &notify,
        tasks,
    );
    let stores = Stores { bridges, ingresses, classes };
    wait_ready(&stores, args.kube_sync_timeout).await?;

    let mut assembler = Assembler::new(opts.ingress_class.clone());
    assembler.builder = Builder::default().with_anti_entropy_interval(opts.anti_entropy_interval);
    // The Secrets the first config references are read before it is built,
    // so no registry starts without its credentials.
    let mut secrets = Secrets::new(client.clone());
    let first_refs = assembler.references(&stores);
    if tokio::time::timeout(args.kube_sync_timeout, secrets.sync(&first_refs, true)).await.is_err() {
        return Err(KubeError::SyncTimeout { resource: "secrets", timeout: args.kube_sync_timeout });
    }
    let first = assembler.observe(&stores, &secrets);
    let secret_resync = args.secret_resync_interval.max(Duration::from_millis(100));
    log_desired(&first.desired);
    let (desired_tx, desired_rx) = watch::channel(first.desired.clone());
    let (observed_tx, observed_rx) = watch::channel(Arc::new(first));
    tasks.push(tokio::spawn(
        async move {
            let every = secret_resync;
            let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let all = tokio::select! {
                    () = notify.notified() => false,
                    _ = resync.tick() => true,
                };
                tokio::time::sleep(DEBOUNCE).await;
                let refs = assembler.references(&stores);
                secrets.sync(&refs, all).await;
                let observed = assembler.observe(&stores, &secrets);
                if **desired_tx.borrow() != *observed.desired {
                    log_desired(&observed.desired);
                    desired_tx.send_replace(observed.desired.clone());
                }
                observed_tx.send_if_modified(|old| {
                    let changed = **old != observed;
                    if changed {
                        *old = Arc::new(observed);
                    }
                    changed
                });
            }
        }
        .instrument(info_span!("kube_source")),
    ));
    Ok((desired_rx, observed_rx))
}

/// A reflector task for one resource; every change wakes `notify`.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
    resource: &'static str,
    notify: &Arc<Notify>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let writer = reflector::store::Writer::new(dyntype);
    let store = writer.as_reader();
    let stream = watcher(api, config)
        .default_backoff()
        // Managed fields are large and never read.
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .reflect(writer);
    let notify = notify.clone();
    tasks.push(tokio::spawn(
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                        notify.notify_one()
                    }
                    Ok(_) => {}
                    Err(error) => warn!(%error, "watch failed; retrying with backoff"),
                }
            }
        }
        .instrument(info_span!("kube_watch", resource)),
    ));
    store
}

async fn wait_ready(stores: &Stores, timeout: Duration) -> Result<(), KubeError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let fail = |resource| KubeError::SyncTimeout { resource, timeout };
    let wait = |resource, ready| async move {
        // A dropped writer (the reflector task ended) shows in the watch logs.
        let _ = tokio::time::timeout_at(deadline, ready).await.map_err(|_| fail(resource))?;
        debug!(resource, "listed");
        Ok::<(), KubeError>(())
    };
    wait("mcpbridges", stores.bridges.wait_until_ready().boxed_local()).await?;
    wait("ingresses", stores.ingresses.wait_until_ready().boxed_local()).await?;
    wait("ingressclasses", stores.classes.wait_until_ready().boxed_local()).await?;
    Ok(())
}

/// Object identity across builds: (kind, namespace, name).
type ObjectKey = (&'static str, String, String);

/// Turns store contents into [`Observed`], remembering each object's last
/// good document and, through its [`Builder`], each entry's last good spec.
pub(crate) struct Assembler {
    ingress_class: String,
    builder: Builder,
    objects: HashMap<ObjectKey, Parsed>,
    /// Objects serialized and parsed so far: the cost test checks that an
    /// edit of one object parses one, however many there are.
    #[cfg(test)]
    pub(crate) parses: usize,
}

/// One object as last parsed. Unchanged objects (same uid and
/// resourceVersion) are not serialized and parsed again: with thousands of
/// Ingresses, one edit costs one parse.
struct Parsed {
    version: Option<String>,
    /// The current document, or the last good one while `error` is set.
    doc: Option<Document>,
    error: Option<String>,
}

impl Assembler {
    pub(crate) fn new(ingress_class: String) -> Self {
        Assembler {
            ingress_class,
            builder: Builder::default(),
            objects: HashMap::new(),
            #[cfg(test)]
            parses: 0,
        }
    }

    fn observe(&mut self, stores: &Stores, secrets: &Secrets) -> Observed {
        let mut observed =
            self.build(stores.bridges.state(), stores.ingresses.state(), &stores.classes.state(), secrets.present());
        let unreadable = secrets.errors();
        if !unreadable.is_empty() {
            Arc::make_mut(&mut observed.desired).errors.extend(unreadable);
        }
        observed
    }

    /// The Secrets the stores' objects reference: each McpBridge entry's
    /// `authSecretName` in the McpBridge's namespace, and the
    /// `spec.tls[].secretName` of each Ingress of our class in its own, and
    /// its `proxy-ssl-secret` and `auth-tls-secret` (`[namespace/]name`).
    fn references(&self, stores: &Stores) -> BTreeSet<SecretRef> {
        let classes = stores.classes.state();
        self.referenced(&stores.bridges.state(), &stores.ingresses.state(), &classes)
    }

    pub(crate) fn referenced(
        &self,
        bridges: &[Arc<DynamicObject>],
        ingresses: &[Arc<Ingress>],
        classes: &[Arc<IngressClass>],
    ) -> BTreeSet<SecretRef> {
        let mut refs = BTreeSet::new();
        for obj in bridges {
            let bridge = observe_bridge(obj);
            for entry in &bridge.registries {
                if let Some(Value::String(name)) = entry.get("authSecretName")
                    && !name.is_empty()
                {
                    refs.insert((bridge.namespace.clone(), name.clone()));
                }
            }
        }
        let default_class = self.default_class(classes);
        for ing in ingresses {
            if selected(ing, &self.ingress_class, default_class).is_none() {
                continue;
            }
            let ns = ing.namespace().unwrap_or_default();
            for tls in ing.spec.iter().flat_map(|s| s.tls.iter().flatten()) {
                refs.extend(tls.secret_name.clone().filter(|n| !n.is_empty()).map(|n| (ns.clone(), n)));
            }
            // The client certificate for mutual TLS to the backends.
            let annotations = ing.annotations();
            if let Some(v) = PROXY_SSL_SECRET_KEYS.iter().find_map(|k| annotations.get(*k)) {
                refs.extend(secret_ref(v, &ns).ok());
            }
            // The CA that clients' certificates are verified against.
            if let Some(v) = AUTH_TLS_SECRET_KEYS.iter().find_map(|k| annotations.get(*k)) {
                refs.extend(secret_ref(v, &ns).ok());
            }
        }
        refs
    }

    fn default_class(&self, classes: &[Arc<IngressClass>]) -> bool {
        classes.iter().any(|c| {
            c.name_any() == self.ingress_class
                && c.annotations().get(DEFAULT_CLASS_ANNOTATION).is_some_and(|v| v == "true")
        })
    }

    /// Build from objects as the stores hold them. Order does not matter:
    /// objects are sorted by (namespace, name) first, so "the later one" of
    /// two clashing McpBridges is always the same.
    pub(crate) fn build(
        &mut self,
        mut bridges: Vec<Arc<DynamicObject>>,
        mut ingresses: Vec<Arc<Ingress>>,
        classes: &[Arc<IngressClass>],
        mut secrets: Vec<Arc<Secret>>,
    ) -> Observed {
        bridges.sort_by_cached_key(|o| (o.namespace(), o.name_any()));
        ingresses.sort_by_cached_key(|o| (o.namespace(), o.name_any()));
        secrets.sort_by_cached_key(|o| (o.namespace(), o.name_any()));
        // Keys in document order: McpBridges, Secrets, Ingresses.
        let mut order = Vec::new();
        let mut observed = Vec::new();

        let mut auth_names = HashSet::new();
        for obj in &bridges {
            let bridge = observe_bridge(obj);
            for entry in &bridge.registries {
                if let Some(Value::String(name)) = entry.get("authSecretName") {
                    auth_names.insert(name.clone());
                }
            }
            let key = ("McpBridge", bridge.namespace.clone(), bridge.name.clone());
            let source = format!("McpBridge {}/{}", bridge.namespace, bridge.name);
            let value = || {
                let mut value = serde_json::to_value(obj.as_ref()).unwrap_or_default();
                if let Value::Object(map) = &mut value {
                    map.insert(
                        "apiVersion".into(),
                        format!("{}/{}", super::args::MCPBRIDGE_GROUP, super::args::MCPBRIDGE_VERSION).into(),
                    );
                    map.insert("kind".into(), super::args::MCPBRIDGE_KIND.into());
                }
                parse_object(&source, value)
            };
            self.parse(&key, version(obj.as_ref(), ""), value);
            order.push(key);
            observed.push(bridge);
        }

        let default_class = self.default_class(classes);
        let mut tls_names = HashSet::new();
        let mut ours = Vec::new();
        for ing in &ingresses {
            let Some(set_class) = selected(ing, &self.ingress_class, default_class) else { continue };
            let ns = ing.namespace().unwrap_or_default();
            for tls in ing.spec.iter().flat_map(|s| s.tls.iter().flatten()) {
                tls_names.extend(tls.secret_name.clone().map(|n| (ns.clone(), n)));
            }
            ours.push((("Ingress", ns, ing.name_any()), ing, set_class));
        }

        for secret in &secrets {
            let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
            if !auth_names.contains(&name) && !tls_names.contains(&(ns.clone(), name.clone())) {
                continue;
            }
            let source = format!("Secret {ns}/{name}");
            let key = ("Secret", ns, name);
            self.parse(&key, version(secret.as_ref(), ""), || {
                parse_object(&source, serde_json::to_value(secret.as_ref()).unwrap_or_default())
            });
            order.push(key);
        }
        for (key, ing, set_class) in ours {
            // The typed object becomes our model directly, no JSON between.
            // A class set here is what the API server's DefaultIngressClass
            // admission does to new Ingresses, so the translator sees it.
            let class = set_class.then(|| self.ingress_class.clone());
            let (namespace, name) = (key.1.clone(), key.2.clone());
            let doc = move || {
                let ingress = ingress::from_api(ing.as_ref(), class.as_deref());
                Ok(Some(Document::Ingress(IngressDoc { namespace, name, ingress: Ok(Arc::new(ingress)) })))
            };
            self.parse(&key, version(ing.as_ref(), if set_class { "+class" } else { "" }), doc);
            order.push(key);
        }
        let live: HashSet<&ObjectKey> = order.iter().collect();
        self.objects.retain(|k, _| live.contains(k));

        let mut errors = Vec::new();
        for key in &order {
            let (kind, ns, name) = key;
            let parsed = &self.objects[key];
            if let Some(reason) = &parsed.error {
                let outcome =
                    if parsed.doc.is_some() { "keeping last good config of this object" } else { "object ignored" };
                errors.push(format!("{kind} {ns}/{name}: {reason}; {outcome}"));
            }
        }
        let docs = order.iter().filter_map(|k| self.objects[k].doc.as_ref());
        let mut desired = self.builder.build(docs);
        errors.append(&mut desired.errors);
        desired.errors = errors;
        Observed { bridges: observed, desired: Arc::new(desired) }
    }

    /// Parse one object unless this `version` was parsed already. A version
    /// that does not parse keeps the last good document.
    fn parse(
        &mut self,
        key: &ObjectKey,
        version: Option<String>,
        parse: impl FnOnce() -> Result<Option<Document>, FieldError>,
    ) {
        let known = self.objects.get(key).is_some_and(|p| p.version.is_some() && p.version == version);
        if known {
            return;
        }
        #[cfg(test)]
        {
            self.parses += 1;
        }
        let result = parse();
        let entry = self.objects.entry(key.clone()).or_insert(Parsed { version: None, doc: None, error: None });
        entry.version = version;
        match result {
            Ok(doc) => {
                entry.doc = doc;
                entry.error = None;
            }
            Err(reason) => entry.error = Some(reason.to_string()),
        }
    }
}

/// What an object was parsed from: its uid and resourceVersion, plus how we
/// changed it. `None` (no uid or version, as in hand-made objects) means
/// always parse.
fn version<K: Resource>(obj: &K, extra: &str) -> Option<String> {
    let meta = obj.meta();
    Some(format!("{}/{}{extra}", meta.uid.as_ref()?, meta.resource_version.as_ref()?))
}

fn observe_bridge(obj: &DynamicObject) -> ObservedBridge {
    let list = |field: &str| match obj.data.get("spec").and_then(|s| s.get(field)) {
        Some(Value::Array(entries)) => entries.clone(),
        _ => Vec::new(),
    };
    ObservedBridge {
        namespace: obj.namespace().unwrap_or_default(),
        name: obj.name_any(),
        generation: obj.metadata.generation,
        resource_version: obj.resource_version(),
        registries: list("registries"),
        proxies: list("proxies"),
        status: obj.data.get("status").filter(|s| !s.is_null()).cloned(),
    }
}

/// Whether an Ingress is ours: `Some(true)` when it is only through the
/// default IngressClass and must be given the class name.
/// `kubernetes.io/ingress.class` wins over `spec.ingressClassName`, as in
/// Higress; an empty `--ingress-class` takes every Ingress.
pub(crate) fn selected(ing: &Ingress, class: &str, default_class: bool) -> Option<bool> {
    if class.is_empty() {
        return Some(false);
    }
    let named = ing
        .annotations()
        .get(CLASS_ANNOTATION)
        .cloned()
        .or_else(|| ing.spec.as_ref().and_then(|s| s.ingress_class_name.clone()))
        .filter(|c| !c.is_empty());
    match named {
        Some(c) => (c == class).then_some(false),
        None if class == HIGRESS_CLASS => Some(false),
        None => default_class.then_some(true),
    }
}

fn log_desired(desired: &Desired) {
    info!(
        registries = desired.registries.len(),
        proxies = desired.proxies.len(),
        ingresses = desired.ingresses.len(),
        errors = desired.errors.len(),
        "config from kubernetes"
    );
    for error in &desired.errors {
        warn!(error = %error, "config problem");
    }
}
