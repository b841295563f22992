//! The Consul supervisor's anti-entropy side ([`crate::repair`]): the
//! pass's catalog listing and the checks it asks for, the re-reads of
//! services named by host, and what a resync after an index reset
//! repairs. The pass's schedule and the judge of a read are in
//! `verify.rs`; this is where the supervisor acts on them.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tokio::time::Instant;

use super::{INDEX_RESET_RESYNC, Supervisor};
use crate::consul::client::Indexed;
use crate::consul::ctx::is_outage;
use crate::model::Service;
use crate::repair::RepairKind;
use crate::watcher::RegistryError;

impl Supervisor {
    /// Consul's index went backwards with no sync in between: a restored
    /// snapshot, or a cluster rebuilt while we were connected. Indexes held
    /// per service no longer compare, so only a full read is right, and
    /// what it changes is counted as a repair.
    pub(super) fn on_reset(&mut self) {
        self.resync_kind = Some(RepairKind::IndexReset);
        let soon = Instant::now() + INDEX_RESET_RESYNC;
        self.resync_at = Some(self.resync_at.map_or(soon, |at| at.min(soon)));
    }

    /// The anti-entropy pass's listing. At the index the catalog detector
    /// last reported, it must name the same services: a difference there
    /// is something no index move announced (what the token may read
    /// changed), repaired now. A listing at another index is older or
    /// newer than the detector's view; the detector settles it.
    pub(super) fn on_listed(&mut self, listed: Result<Indexed<BTreeMap<String, Vec<String>>>, RegistryError>) {
        match listed {
            Ok(answer) if answer.index == self.catalog_index && answer.value != self.catalog => {
                let selected: BTreeMap<&String, &Vec<String>> =
                    self.ctx.selected(&answer.value, &self.selection).collect();
                let mut hosts: BTreeSet<String> = selected
                    .iter()
                    .filter(|(name, tags)| self.services.get(**name).is_none_or(|t| t.tags != ***tags))
                    .map(|(name, _)| self.ctx.naming.host(name))
                    .collect();
                hosts.extend(
                    self.services
                        .iter()
                        .filter(|(name, t)| t.sent.is_some() && !selected.contains_key(name))
                        .map(|(name, _)| self.ctx.naming.host(name)),
                );
                if !hosts.is_empty() {
                    self.ctx.sink.repaired(RepairKind::MissedChange, &hosts.into_iter().collect::<Vec<_>>());
                }
                self.catalog = answer.value;
                self.catalog_body = None;
                self.set_members("service left the catalog (anti-entropy)");
                self.update_degraded();
            }
            Ok(_) => {}
            Err(e) if is_outage(&e) => self.ctx.health.fail(&e),
            Err(e) => self.ctx.health.fail_part(&e),
        }
        self.verifier.begin(self.services.keys().cloned());
    }

    /// Read `name` to check it: a difference the detectors are not
    /// delivering is a repair ([`judge`]).
    pub(super) fn want_check(&mut self, name: String) {
        if self.services.contains_key(&name) {
            self.verifier.ask(&name, self.settled);
            self.want_read(name);
        }
    }

    /// Services with an instance registered by host name are read again at
    /// every periodic tick: their addresses move with no index.
    pub(super) fn recheck_names(&mut self) {
        let named: Vec<String> = self.services.iter().filter(|(_, t)| t.named).map(|(n, _)| n.clone()).collect();
        named.into_iter().for_each(|name| self.want_check(name));
    }

    /// A node or a node check changed: every read in flight may have left
    /// Consul before it, and its service's nodes are not known until it is
    /// applied, so each is read once more after it lands.
    pub(super) fn again_in_flight(&mut self) {
        self.in_flight.values_mut().for_each(|again| *again = true);
    }

    /// A full sync that repairs (an index reset): count every service it
    /// finds different from what was sent, or new, under `kind`.
    pub(super) fn judge_sync(&self, kind: RepairKind, before: &HashMap<String, Service>, all: &[Service]) {
        let now: HashMap<&str, &Service> = all.iter().map(|s| (s.host.as_str(), s)).collect();
        let mut hosts: BTreeSet<String> = before
            .iter()
            .filter(|(host, s)| crate::repair::differs(Some(s), now.get(host.as_str()).copied()))
            .map(|(host, _)| host.clone())
            .collect();
        hosts.extend(all.iter().filter(|s| !before.contains_key(&s.host)).map(|s| s.host.clone()));
        if !hosts.is_empty() {
            self.ctx.sink.repaired(kind, &hosts.into_iter().collect::<Vec<_>>());
        }
    }
}
