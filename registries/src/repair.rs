//! The second layer under every watcher: anti-entropy.
//!
//! Detectors (blocking queries, pushes, watches, deltas) make changes fast,
//! and are usually right. Beneath them, every watcher runs the same slow,
//! always-right pass: at a bounded interval it reads the registry's whole
//! truth (every service it publishes, and the list of services), compares
//! it service by service with what it sent, and repairs every difference.
//! What this module gives every watcher alike:
//!
//! - the interval ([`crate::RegistrySpec::anti_entropy`]: `--anti-entropy-interval`, default
//!   [`DEFAULT_INTERVAL`]) and a [`Pacer`] that spreads one pass's reads
//!   over it, so that a pass costs the registry a steady trickle instead
//!   of a burst;
//! - the comparison ([`differs`]), which is the published record's own
//!   equality: endpoint by endpoint, with every label and port;
//! - the fixed set of reasons a repair is counted under ([`RepairKind`]),
//!   told to [`crate::Sink::repaired`], which counts it in
//!   `meshbridge_registry_drift_corrected_total{name,type,kind}`, logs it
//!   at WARN with the services, and shows the last one on
//!   `/v1/registries/{name}`.
//!
//! What each watcher decides alone is only *how* it reads the truth (its
//! protocol) and *which* kind a difference is: a difference that merely
//! raced the read (a change the detectors are delivering right now) is
//! not a repair, and is sent without being counted, so a correct watcher
//! keeps the counter at 0.

use std::time::Duration;

use crate::model::Service;

/// How often a whole pass runs unless configured: Higress re-reads
/// everything every 30 s by brute force; here the detectors carry the
/// changes, and the pass only has to bound what they miss. Measured cost
/// at 10k services is in BENCHMARKS.md ("Anti-entropy").
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// The shortest interval accepted (tests use a few seconds).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Why a repair was needed: the `kind` label of
/// `meshbridge_registry_drift_corrected_total`. A small fixed set, so the
/// series stay few.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RepairKind {
    /// A change the detectors should have delivered and did not (a lost
    /// push, an event never sent, a permission change that moves no index).
    MissedChange,
    /// An answer older than the change that asked for it was applied (a
    /// stale read from a follower or a lagging server).
    StaleRead,
    /// The registry's own version went backwards (a snapshot restore, a
    /// rebuilt cluster): what was held no longer compares.
    IndexReset,
    /// A host name an instance registered with resolves to other addresses
    /// now, or resolves again after a failed lookup.
    NameResolution,
    /// A service that could not be read (permissions, bad data, too big)
    /// is read again, and what it holds now replaces its last state.
    Unreadable,
}

impl RepairKind {
    pub const ALL: [RepairKind; 5] = [
        RepairKind::MissedChange,
        RepairKind::StaleRead,
        RepairKind::IndexReset,
        RepairKind::NameResolution,
        RepairKind::Unreadable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RepairKind::MissedChange => "missed_change",
            RepairKind::StaleRead => "stale_read",
            RepairKind::IndexReset => "index_reset",
            RepairKind::NameResolution => "name_resolution",
            RepairKind::Unreadable => "unreadable",
        }
    }
}

impl std::fmt::Display for RepairKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the truth read now differs from what was sent: a service that
/// appeared, went, or changed anything published (ports, protocol, TLS,
/// any endpoint's address, port, weight or labels).
pub fn differs(sent: Option<&Service>, truth: Option<&Service>) -> bool {
    sent != truth
}

/// Spreads one pass over the interval: the reads of `n` services are
/// handed out in [`Pacer::STEP`] slices, evenly, so that the whole pass
/// ends within nine tenths of the interval (the rest is slack for slow
/// answers) and the registry sees a steady trickle, not a burst.
#[derive(Debug, Clone)]
pub struct Pacer {
    interval: Duration,
}

impl Pacer {
    /// How often a slice is handed out.
    pub const STEP: Duration = Duration::from_secs(1);

    pub fn new(interval: Duration) -> Pacer {
        Pacer { interval }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How many of `n` services one slice reads: at least one, and enough
    /// that `n` fit in nine tenths of the interval.
    pub fn per_step(&self, n: usize) -> usize {
        let steps = (self.interval.as_millis() * 9 / 10 / Self::STEP.as_millis()).max(1) as usize;
        n.div_ceil(steps).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, Protocol, ServicePort};

    fn svc(addr: &str) -> Service {
        let ep = Endpoint { address: addr.into(), port: 80, weight: 1, labels: Default::default() };
        Service::new(
            "web.dc1.consul",
            vec![ServicePort { number: 80, protocol: Protocol::Http, name: "http".into() }],
            vec![ep],
        )
    }

    #[test]
    fn kinds_are_a_fixed_set_of_label_values() {
        let names: Vec<&str> = RepairKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names, ["missed_change", "stale_read", "index_reset", "name_resolution", "unreadable"]);
    }

    #[test]
    fn a_pass_is_spread_over_nine_tenths_of_the_interval() {
        let p = Pacer::new(Duration::from_secs(300));
        assert_eq!(p.per_step(10_000), 38, "10k services over 270 one-second steps");
        assert_eq!(p.per_step(100_000), 371);
        assert_eq!(p.per_step(5), 1, "a small registry reads one a step");
        assert_eq!(p.per_step(0), 1);
        assert_eq!(Pacer::new(Duration::from_secs(1)).per_step(10), 10, "a tiny interval reads all at once");
    }

    #[test]
    fn any_published_field_is_a_difference() {
        let a = svc("10.0.0.1");
        assert!(!differs(Some(&a), Some(&a.clone())));
        assert!(differs(Some(&a), Some(&svc("10.0.0.2"))));
        assert!(differs(Some(&a), None), "gone");
        assert!(differs(None, Some(&a)), "appeared");
        let mut weighted = a.clone();
        weighted.endpoints[0].weight = 5;
        assert!(differs(Some(&a), Some(&weighted)));
    }
}
