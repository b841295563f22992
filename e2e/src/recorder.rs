//! A recording [`Sink`] for registry tests: [`Recorder`] runs a watcher,
//! keeps every call it makes to its sink, and folds the updates into what a
//! cache applying them would hold, so that a test can wait on that state
//! and then ask about the history ("no update since the outage began").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use meshbridge_registries::{RegistryError, RepairKind, Service, Sink, Update, Watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// One call a watcher made to its sink.
#[derive(Debug, Clone)]
pub enum Event {
    Update(Update),
    Healthy,
    Error(RegistryError),
    /// [`Sink::degraded`]: one part (a service) cannot be read while the
    /// registry answers.
    Degraded(RegistryError),
    /// [`Sink::repaired`]: services the anti-entropy pass corrected, and why.
    Repaired(RepairKind, Vec<String>),
    /// [`Sink::synced`]: a full sync took this long. Kept apart, in
    /// [`Recorder::passes`], not among the events.
    Synced(Duration),
}

struct ChannelSink(mpsc::UnboundedSender<(Instant, Event)>);

impl Sink for ChannelSink {
    fn update(&self, update: Update) {
        let _ = self.0.send((Instant::now(), Event::Update(update)));
    }
    fn healthy(&self) {
        let _ = self.0.send((Instant::now(), Event::Healthy));
    }
    fn error(&self, error: &RegistryError) {
        let _ = self.0.send((Instant::now(), Event::Error(error.clone())));
    }
    fn degraded(&self, error: &RegistryError) {
        let _ = self.0.send((Instant::now(), Event::Degraded(error.clone())));
    }
    fn repaired(&self, kind: RepairKind, hosts: &[String]) {
        let _ = self.0.send((Instant::now(), Event::Repaired(kind, hosts.to_vec())));
    }
    fn synced(&self, took: Duration) {
        let _ = self.0.send((Instant::now(), Event::Synced(took)));
    }
}

/// What a [`Recorder`] folds the updates into.
pub trait View: Default {
    fn apply(&mut self, update: &Update);
}

/// Every service by host, as the cache holds them.
pub type Hosts = BTreeMap<String, Service>;

impl View for Hosts {
    fn apply(&mut self, update: &Update) {
        match update.clone() {
            Update::Snapshot(all) => *self = all.into_iter().map(|s| (s.host.clone(), s)).collect(),
            Update::Upsert(s) => {
                self.insert(s.host.clone(), s);
            }
            Update::Remove(host) => {
                self.remove(&host);
            }
        }
    }
}

/// The one service of a registry that has one (`static`, `dns`).
impl View for Option<Service> {
    fn apply(&mut self, update: &Update) {
        match update {
            Update::Snapshot(all) => *self = all.first().cloned(),
            Update::Upsert(s) => *self = Some(s.clone()),
            Update::Remove(_) => *self = None,
        }
    }
}

/// A running watcher, everything it told its sink, and the services as a
/// cache applying those updates would hold them. Dropping it stops the
/// watcher.
pub struct Recorder<V: View = Hosts> {
    pub task: JoinHandle<()>,
    rx: mpsc::UnboundedReceiver<(Instant, Event)>,
    /// Every sink call so far, in order.
    pub events: Vec<Event>,
    /// When each of `events` was made.
    times: Vec<Instant>,
    pub view: V,
    /// How long [`Recorder::until`] waits.
    deadline: Duration,
    /// Each sync the watcher reported ([`Sink::synced`]): when it began
    /// and when it ended.
    pub passes: Vec<(Instant, Instant)>,
}

impl<V: View> Drop for Recorder<V> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<V: View> Recorder<V> {
    /// Run `watcher`; [`Recorder::until`] gives up after `deadline`.
    pub fn start(watcher: Box<dyn Watcher>, deadline: Duration) -> Recorder<V> {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(watcher.run(Arc::new(ChannelSink(tx))));
        Recorder { task, rx, events: Vec::new(), times: Vec::new(), view: V::default(), deadline, passes: Vec::new() }
    }

    /// Wait until `pred` holds, re-checking after every sink call.
    pub async fn until(&mut self, what: &str, mut pred: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + self.deadline;
        while !pred(self) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => self.push(event),
                Ok(None) => panic!("watcher stopped while waiting for {what}"),
                Err(_) => panic!("no {what} after {:?}; sink calls:\n{}", self.deadline, self.dump()),
            }
        }
    }

    /// Record everything that arrives for `d`.
    pub async fn idle(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while let Ok(Some(event)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            self.push(event);
        }
    }

    fn push(&mut self, (at, event): (Instant, Event)) {
        if let Event::Synced(took) = event {
            self.passes.push((at.checked_sub(took).unwrap_or(at), at));
            return;
        }
        if let Event::Update(update) = &event {
            self.view.apply(update);
        }
        self.times.push(at);
        self.events.push(event);
    }

    /// A position in the history, for "since" questions.
    pub fn mark(&self) -> usize {
        self.events.len()
    }

    pub fn since(&self, mark: usize) -> impl Iterator<Item = &Event> {
        self.events[mark..].iter()
    }

    pub fn updates_since(&self, mark: usize) -> Vec<&Update> {
        self.since(mark).filter_map(|e| if let Event::Update(u) = e { Some(u) } else { None }).collect()
    }

    /// Every error since `mark`, the registry's and its parts' (degraded).
    pub fn errors_since(&self, mark: usize) -> Vec<&RegistryError> {
        self.since(mark)
            .filter_map(|e| match e {
                Event::Error(e) | Event::Degraded(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    /// The errors of parts (services) since `mark`: [`Sink::degraded`].
    pub fn degraded_since(&self, mark: usize) -> Vec<&RegistryError> {
        self.since(mark).filter_map(|e| if let Event::Degraded(e) = e { Some(e) } else { None }).collect()
    }

    /// The first snapshot since `mark`.
    pub fn snapshot_since(&self, mark: usize) -> Option<&Vec<Service>> {
        self.updates_since(mark).into_iter().find_map(|u| if let Update::Snapshot(s) = u { Some(s) } else { None })
    }

    pub fn snapshots_since(&self, mark: usize) -> usize {
        self.updates_since(mark).iter().filter(|u| matches!(u, Update::Snapshot(_))).count()
    }

    /// Every service a [`Sink::repaired`] call named since `mark`, whatever
    /// its kind.
    pub fn drift_since(&self, mark: usize) -> Vec<&String> {
        self.since(mark).filter_map(|e| if let Event::Repaired(_, h) = e { Some(h) } else { None }).flatten().collect()
    }

    /// Every service a [`Sink::repaired`] call named since `mark`, with its kind.
    pub fn repairs_since(&self, mark: usize) -> Vec<(RepairKind, &String)> {
        self.since(mark)
            .filter_map(|e| if let Event::Repaired(kind, h) = e { Some(h.iter().map(|h| (*kind, h))) } else { None })
            .flatten()
            .collect()
    }

    /// Every service a [`Sink::repaired`] call of `kind` named since `mark`.
    pub fn repaired_since(&self, mark: usize, kind: RepairKind) -> Vec<&String> {
        self.since(mark)
            .filter_map(|e| match e {
                Event::Repaired(k, hosts) if *k == kind => Some(hosts),
                _ => None,
            })
            .flatten()
            .collect()
    }

    pub fn healthy_since(&self, mark: usize) -> bool {
        self.since(mark).any(|e| matches!(e, Event::Healthy))
    }

    /// When the last sink call was made.
    pub fn last_at(&self) -> Option<Instant> {
        self.times.last().copied()
    }

    /// Every sink call, one a line, with its time since the first.
    pub fn dump(&self) -> String {
        let start = self.times.first().copied();
        let lines = self.times.iter().zip(&self.events).map(|(at, e)| {
            let ms = start.map(|s| at.duration_since(s).as_millis()).unwrap_or(0);
            format!("  +{ms}ms {e:?}")
        });
        lines.collect::<Vec<_>>().join("\n")
    }
}

impl Recorder<Hosts> {
    /// `address:port` of each endpoint of `host` in the view.
    pub fn endpoints(&self, host: &str) -> Option<Vec<String>> {
        self.view.get(host).map(|s| s.endpoints.iter().map(|e| format!("{}:{}", e.address, e.port)).collect())
    }

    pub fn hosts(&self) -> Vec<&str> {
        self.view.keys().map(String::as_str).collect()
    }
}

impl Recorder<Option<Service>> {
    /// `address|port` of each endpoint of the service.
    pub fn endpoints(&self) -> Option<Vec<String>> {
        let s = self.view.as_ref()?;
        Some(s.endpoints.iter().map(|e| format!("{}|{}", e.address, e.port)).collect())
    }
}
