//! What every Consul loop shares ([`Ctx`]) and the results of its reads:
//! the leaf that the watcher (`consul.rs`) and its supervisor both use.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub(crate) use super::client::is_outage;
use super::client::{CheckState, Client, Indexed};
use super::decode::{CheckPrints, Instances, Naming, select_services};
use crate::health::Health;
use crate::resolve;
use crate::select::Selection;
use crate::watcher::{RegistryError, Sink};

/// What every loop shares.
pub(crate) struct Ctx {
    pub(super) client: Client,
    pub(super) naming: Naming,
    pub(super) tag: Option<String>,
    pub(super) wait: Duration,
    /// Reads in flight at once (the cap less the detectors).
    pub(super) read_slots: usize,
    pub(super) sink: Arc<dyn Sink>,
    pub(super) health: Health,
    /// Orders reads: a read's answer is applied only if no later-started
    /// read's answer was applied before it.
    pub(super) seq: AtomicU64,
    /// Bumped after every resync: each detector drops the index it blocks
    /// on and asks again from 0, so that an index Consul no longer has (a
    /// rebuilt cluster, a restored snapshot) cannot park it for a whole
    /// `wait`, and a detector sleeping out its backoff wakes at once.
    pub(super) rebase: tokio::sync::watch::Sender<u64>,
}

/// One service read, numbered when it started.
pub(crate) struct Read {
    pub(super) name: String,
    pub(super) seq: u64,
    /// The index the change that asked for it had reached (a sweep's probe;
    /// 0: none known): an answer below it is a stale read.
    pub(super) min_index: u64,
    /// Some instance registered a host name, resolved by this read.
    pub(super) named: bool,
    /// Instances dropped because their name did not resolve.
    pub(super) unresolved: usize,
    pub(super) result: Result<Indexed<Instances>, RegistryError>,
}

/// The result of a full, non-blocking read of the catalog (every service
/// the tag filter keeps), the nodes, the checks and every selected service.
pub(crate) struct FullSync {
    pub(super) catalog: Indexed<BTreeMap<String, Vec<String>>>,
    pub(super) nodes: Indexed<BTreeMap<String, u64>>,
    /// The critical checks, then the warning ones ([`CheckState::ALL`]).
    pub(super) checks: [Indexed<CheckPrints>; 2],
    pub(super) reads: Vec<Read>,
}

impl Ctx {
    pub(super) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The watched services (tag filter applied) with their tags.
    pub(super) fn watched(&self, catalog: BTreeMap<String, Vec<String>>) -> BTreeMap<String, Vec<String>> {
        let keep = select_services(&catalog, self.tag.as_deref());
        catalog.into_iter().filter(|(name, _)| keep.contains(name)).collect()
    }

    /// Read one service and resolve its endpoints. `min_index`: see
    /// [`Read::min_index`].
    pub(super) async fn read(&self, name: String, min_index: u64) -> Read {
        let seq = self.next_seq();
        let (mut named, mut unresolved) = (false, 0);
        let result = match self.client.health_service(&name).await {
            Ok(mut answer) => {
                let endpoints = std::mem::take(&mut answer.value.endpoints);
                named = endpoints.iter().any(|e| resolve::is_name(&e.address));
                let (resolved, dropped) = resolve::endpoints(endpoints).await;
                answer.value.endpoints = resolved;
                unresolved = dropped;
                Ok(answer)
            }
            Err(e) => Err(e),
        };
        Read { name, seq, min_index, named, unresolved, result }
    }

    /// The catalog services `selection` selects, by the host each gets.
    pub(super) fn selected<'a>(
        &'a self,
        catalog: &'a BTreeMap<String, Vec<String>>,
        selection: &'a Selection,
    ) -> impl Iterator<Item = (&'a String, &'a Vec<String>)> + 'a {
        let naming = &self.naming;
        let all = selection.is_all();
        catalog.iter().filter(move |(name, _)| all || selection.wants(&naming.host(name)))
    }

    /// Catalog, nodes, checks, then every selected service, `read_slots` at a time. A
    /// service whose answer is bad is kept in the result (skipped later); a
    /// failure to reach Consul fails the whole sync. Callers retry a failed
    /// sync after a backoff; a catalog-wide read that timed out gets twice
    /// the slack on that retry ([`super::budget`]), so an answer Consul is
    /// slow to compute (a large catalog right after a mass registration)
    /// gets through instead of timing out on every try.
    pub(super) async fn full_sync(&self, selection: &Selection) -> Result<FullSync, RegistryError> {
        use futures::StreamExt;
        let started = std::time::Instant::now();
        let catalog = self.client.catalog_services(0, self.wait).await?;
        let nodes = self.client.catalog_nodes(0, self.wait).await?;
        let critical = self.client.checks_in(CheckState::Critical, 0, self.wait).await?;
        let warning = self.client.checks_in(CheckState::Warning, 0, self.wait).await?;
        let checks = [critical, warning];
        let catalog = Indexed { value: self.watched(catalog.value), index: catalog.index };
        let names: Vec<String> = self.selected(&catalog.value, selection).map(|(n, _)| n.clone()).collect();
        let reads: Vec<Read> = futures::stream::iter(names)
            .map(|name| self.read(name, 0))
            .buffer_unordered(self.read_slots)
            .collect()
            .await;
        if let Some(e) = reads.iter().find_map(|r| r.result.as_ref().err().filter(|e| is_outage(e))) {
            return Err(e.clone());
        }
        self.health.ok();
        self.sink.synced(started.elapsed());
        Ok(FullSync { catalog, nodes, checks, reads })
    }
}

/// What the loops tell the supervisor.
pub(crate) enum Event {
    /// The catalog detector's answer, its body not decoded: the supervisor
    /// decodes it only when it differs from the last one it decoded.
    Catalog(Indexed<Vec<u8>>),
    /// A health detector's answer: the checks in one failing state.
    Checks(CheckState, Indexed<CheckPrints>),
    /// The nodes detector's answer: node -> `ModifyIndex`.
    Nodes(Indexed<BTreeMap<String, u64>>),
    /// A read finished.
    Read(Read),
    /// Services a sweep found moved, with the index each has now (0: the
    /// probe was refused; the read says why).
    Moved(Vec<(String, u64)>),
    /// A sweep finished (`ok`: it probed every service).
    SweepDone { ok: bool },
    /// A detector's answer came with an index below its last one: Consul's
    /// state was replaced (a restored snapshot, a rebuilt cluster).
    Reset,
    /// The anti-entropy pass's listing of the catalog (tag filter applied;
    /// a non-blocking read, not a detector's answer).
    Listed(Result<Indexed<BTreeMap<String, Vec<String>>>, RegistryError>),
}
