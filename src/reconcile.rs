//! Diffs the desired registries against the running watchers and starts,
//! restarts or stops watchers to match.
//!
//! Registries are keyed by (type, name). A watcher restarts only when its
//! spec changed; its services stay in the cache until the new watcher's
//! first answer replaces them, so a restart does not flap endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshbridge_registries::{Referenced, RegistrySpec, Selector, watcher_for};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span, warn};

use crate::cache::{Cache, RegistryKey};
use crate::config::{Desired, IngressDoc};

/// What the reconciler does for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Start(RegistryKey),
    Restart(RegistryKey),
    Stop(RegistryKey),
}

/// The pure part: what must happen to go from `running` to `desired`.
/// Actions come out in key order: stops, then restarts, then starts.
pub fn diff(running: &BTreeMap<RegistryKey, RegistrySpec>, desired: &[RegistrySpec]) -> Vec<Action> {
    let want: BTreeMap<RegistryKey, &RegistrySpec> =
        desired.iter().map(|s| (RegistryKey::new(s.kind, s.name.clone()), s)).collect();
    let mut actions = Vec::new();
    actions.extend(running.keys().filter(|k| !want.contains_key(*k)).map(|k| Action::Stop(k.clone())));
    for (key, spec) in &want {
        match running.get(key) {
            Some(old) if !old.same_watcher(spec) => actions.push(Action::Restart(key.clone())),
            Some(_) => {}
            None => actions.push(Action::Start(key.clone())),
        }
    }
    actions.sort_by_key(|a| match a {
        Action::Stop(_) => 0,
        Action::Restart(_) => 1,
        Action::Start(_) => 2,
    });
    actions
}

struct Running {
    spec: RegistrySpec,
    /// `None` when the spec could not be turned into a watcher.
    task: Option<JoinHandle<()>>,
    /// The watcher's referenced hosts (selective watch): a new set is sent
    /// here, and the watcher applies it without a restart.
    referenced: watch::Sender<Referenced>,
}

/// Hosts the routes reference, ASCII-lowercased: every host named by a
/// `higress.io/destination` annotation, and every registry service a
/// mirror or `default-backend` annotation names, of any Ingress given,
/// whatever its class (over-selecting costs only a read; an Ingress of another class
/// routes nothing). An annotation that does not parse references nothing
/// (its routes are rejected too).
pub fn referenced_hosts(ingresses: &[IngressDoc]) -> Referenced {
    let mut hosts = std::collections::BTreeSet::new();
    for doc in ingresses {
        let Ok(ingress) = &doc.ingress else { continue };
        if let Some(Ok(list)) = ingress.metadata.destination() {
            hosts.extend(list.iter().map(|d| d.host.to_ascii_lowercase()));
        }
        hosts.extend(ingress.metadata.annotated_registry_services().iter().map(|h| h.to_ascii_lowercase()));
    }
    Arc::new(hosts)
}

/// Start the reconciler task: apply the current `Desired` now (so watchers
/// start before anything is served), then every new one, calling `observe`
/// on each first (the effective-config log).
pub fn spawn(
    cache: &Arc<Cache>,
    mut desired: watch::Receiver<Arc<Desired>>,
    observe: fn(&Desired),
    tasks: &mut Vec<JoinHandle<()>>,
) {
    let mut reconciler = Reconciler::new(cache.clone());
    let first = desired.borrow_and_update().clone();
    observe(&first);
    reconciler.set_referenced(referenced_hosts(&first.ingresses));
    reconciler.apply(&first.registries);
    tasks.push(tokio::spawn(async move {
        // The reconciler (and so every watcher) lives as long as this task.
        while desired.changed().await.is_ok() {
            let d = desired.borrow_and_update().clone();
            observe(&d);
            reconciler.set_referenced(referenced_hosts(&d.ingresses));
            reconciler.apply(&d.registries);
        }
    }));
}

/// Owns the watcher tasks. Dropping it stops them all.
pub struct Reconciler {
    cache: Arc<Cache>,
    running: BTreeMap<RegistryKey, Running>,
    referenced: Referenced,
}

impl Reconciler {
    pub fn new(cache: Arc<Cache>) -> Self {
        Reconciler { cache, running: BTreeMap::new(), referenced: Referenced::default() }
    }

    /// The hosts routes reference now. Running watchers get the new set
    /// (only if it changed); watchers started later start with it.
    pub fn set_referenced(&mut self, hosts: Referenced) {
        if hosts == self.referenced {
            return;
        }
        info!(hosts = hosts.len(), "referenced hosts changed");
        self.referenced = hosts;
        for r in self.running.values() {
            r.referenced.send_replace(self.referenced.clone());
        }
    }

    /// Bring the watchers in line with `desired`; returns what was done.
    pub fn apply(&mut self, desired: &[RegistrySpec]) -> Vec<Action> {
        let current: BTreeMap<RegistryKey, RegistrySpec> =
            self.running.iter().map(|(k, r)| (k.clone(), r.spec.clone())).collect();
        let actions = diff(&current, desired);
        for action in &actions {
            match action {
                Action::Stop(key) => {
                    info!(registry = %key, "stopping watcher");
                    if let Some(r) = self.running.remove(key) {
                        abort(r);
                    }
                    self.cache.remove(key);
                }
                Action::Restart(key) | Action::Start(key) => {
                    let spec = desired.iter().find(|s| s.kind == key.kind && s.name == key.name).cloned();
                    let Some(spec) = spec else { continue };
                    if let Some(old) = self.running.remove(key) {
                        info!(registry = %key, "spec changed; restarting watcher");
                        abort(old);
                    } else {
                        info!(registry = %key, endpoint = spec.endpoint(), "starting watcher");
                    }
                    let (referenced, rx) = watch::channel(self.referenced.clone());
                    let task = self.spawn(key, &spec, rx);
                    self.running.insert(key.clone(), Running { spec, task, referenced });
                }
            }
        }
        actions
    }

    fn spawn(
        &self,
        key: &RegistryKey,
        spec: &RegistrySpec,
        referenced: watch::Receiver<Referenced>,
    ) -> Option<JoinHandle<()>> {
        self.cache.describe(key, spec);
        let watcher =
            Selector::new(&spec.name, spec.watch.as_ref(), referenced).and_then(|selector| watcher_for(spec, selector));
        match watcher {
            Ok(watcher) => {
                let sink = self.cache.attach(key);
                let span = info_span!("watcher", registry = %key);
                Some(tokio::spawn(self.cache.watchers().track(watcher.run(sink)).instrument(span)))
            }
            Err(error) => {
                warn!(registry = %key, %error, "cannot start watcher");
                self.cache.set_failed(key, &error.to_string());
                None
            }
        }
    }

    pub fn running(&self) -> impl Iterator<Item = &RegistryKey> {
        self.running.keys()
    }
}

fn abort(r: Running) {
    if let Some(task) = r.task {
        task.abort();
    }
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        for (_, r) in std::mem::take(&mut self.running) {
            abort(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshbridge_registries::RegistryKind;

    fn spec(kind: RegistryKind, name: &str, port: u16) -> RegistrySpec {
        RegistrySpec::new(kind, name, "127.0.0.1", port)
    }

    fn running(specs: &[RegistrySpec]) -> BTreeMap<RegistryKey, RegistrySpec> {
        specs.iter().map(|s| (RegistryKey::new(s.kind, s.name.clone()), s.clone())).collect()
    }

    #[test]
    fn a_migration_step_restarts_no_watcher() {
        let a = spec(RegistryKind::Nacos, "a", 8848);
        let mut stepped = a.clone();
        stepped.migration = meshbridge_registries::Migration { weight: Some(10), priority: 1 };
        assert!(diff(&running(std::slice::from_ref(&a)), std::slice::from_ref(&stepped)).is_empty());
        let mut moved = stepped.clone();
        moved.port = 8849;
        assert_eq!(
            diff(&running(&[a]), &[moved]),
            vec![Action::Restart(RegistryKey::new(RegistryKind::Nacos, "a"))],
            "anything else still restarts it"
        );
    }

    #[test]
    fn diff_starts_restarts_and_stops() {
        let a = spec(RegistryKind::Consul, "a", 8500);
        let b = spec(RegistryKind::Consul, "b", 8500);
        let c = spec(RegistryKind::Consul, "c", 8500);
        let now = running(&[a.clone(), b.clone()]);
        let b2 = spec(RegistryKind::Consul, "b", 8501);
        let actions = diff(&now, &[b2, c]);
        assert_eq!(
            actions,
            vec![
                Action::Stop(RegistryKey::new(RegistryKind::Consul, "a")),
                Action::Restart(RegistryKey::new(RegistryKind::Consul, "b")),
                Action::Start(RegistryKey::new(RegistryKind::Consul, "c")),
            ]
        );
    }

    #[test]
    fn unchanged_spec_is_left_alone() {
        let a = spec(RegistryKind::Consul, "a", 8500);
        assert!(diff(&running(std::slice::from_ref(&a)), &[a]).is_empty());
    }

    #[test]
    fn same_name_other_type_is_another_registry() {
        let a = spec(RegistryKind::Consul, "a", 8500);
        let n = spec(RegistryKind::Nacos2, "a", 8848);
        let actions = diff(&running(&[a]), &[n]);
        assert_eq!(actions.len(), 2);
        assert!(matches!(&actions[0], Action::Stop(k) if k.kind == RegistryKind::Consul));
        assert!(matches!(&actions[1], Action::Start(k) if k.kind == RegistryKind::Nacos2));
    }

    #[tokio::test]
    async fn a_spec_that_cannot_run_fails_alone() {
        let cache = Cache::new();
        let mut r = Reconciler::new(cache.clone());
        // A static registry whose domain has no port cannot be built.
        r.apply(&[spec(RegistryKind::Static, "s", 80), spec(RegistryKind::Consul, "c", 1)]);
        let statuses = cache.statuses();
        let bad = statuses.iter().find(|(k, ..)| k.kind == RegistryKind::Static).unwrap();
        assert!(bad.1.last_error.as_deref().unwrap().contains("domain"), "{:?}", bad.1.last_error);
        assert_eq!(r.running().count(), 2);
        r.apply(&[]);
        assert!(cache.statuses().is_empty());
    }

    #[test]
    fn referenced_hosts_come_from_destination_mirror_and_default_backend_annotations() {
        let ing = |name: &str, dest: Option<&str>| {
            let mut annotations = serde_json::Map::new();
            if let Some(d) = dest {
                annotations.insert(crate::model::ingress::DESTINATION.into(), d.into());
            }
            let mirror = |key: &str| format!("nginx.ingress.kubernetes.io/{key}");
            match name {
                // A registry service; a Kubernetes Service (no dot); one the
                // FQDN annotation overrides.
                "a" => annotations.insert(mirror("mirror-target-service"), "Shadow.static:80".into()),
                "b" => {
                    annotations.insert("higress.io/default-backend".into(), "Errors.static".into());
                    annotations.insert(mirror("mirror-target-service"), "shop/shadow".into())
                }
                "c" => {
                    annotations.insert(mirror("mirror-target-fqdn"), "x.example.com".into());
                    annotations.insert(mirror("mirror-target-service"), "ignored.static".into())
                }
                _ => None,
            };
            let object = serde_json::json!({"metadata": {"name": name, "annotations": annotations}});
            IngressDoc::from_json("default".into(), name.into(), &object)
        };
        let got = referenced_hosts(&[
            ing("a", Some("web.DEFAULT-GROUP.public.nacos:8080")),
            ing("b", Some("60% api.dc1.consul v1\n40% Pay.dc1.consul:80")),
            ing("c", None),
            ing("d", Some("150% broken.dc1.consul")),
        ]);
        let want: Vec<&str> = vec![
            "api.dc1.consul",
            "errors.static",
            "pay.dc1.consul",
            "shadow.static",
            "web.default-group.public.nacos",
        ];
        assert_eq!(got.iter().map(String::as_str).collect::<Vec<_>>(), want);
    }

    #[tokio::test]
    async fn a_new_referenced_set_reaches_running_watchers_without_a_restart() {
        let cache = Cache::new();
        let mut r = Reconciler::new(cache.clone());
        let mut s = spec(RegistryKind::Consul, "a", 1);
        s.watch = Some(meshbridge_registries::WatchSpec::default());
        r.apply(std::slice::from_ref(&s));
        let mut rx = r.running[&RegistryKey::new(RegistryKind::Consul, "a")].referenced.subscribe();
        r.set_referenced(Arc::new(["api.dc1.consul".to_string()].into()));
        assert!(rx.has_changed().unwrap());
        assert!(rx.borrow_and_update().contains("api.dc1.consul"));
        assert!(r.apply(std::slice::from_ref(&s)).is_empty(), "no restart");
        r.set_referenced(Arc::new(["api.dc1.consul".to_string()].into()));
        assert!(!rx.has_changed().unwrap(), "an unchanged set is not sent again");
    }
}
