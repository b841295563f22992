//! The Consul watcher's anti-entropy pass ([`crate::repair`]): every
//! interval, one non-blocking listing of the catalog and one read of every
//! tracked service, whatever their indexes say, spread over the interval
//! by the shared [`Pacer`] and sent through the supervisor's ordinary read
//! slots (so the connection cap holds). The supervisor applies the answers
//! as it applies any read; this module only keeps the pass's place and
//! tells which difference is a repair, and of which kind ([`judge`]).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::repair::{Pacer, RepairKind};

/// One watcher's pass.
pub(super) struct Verifier {
    pacer: Pacer,
    /// Services still to read in the pass under way.
    left: VecDeque<String>,
    /// When the next pass starts.
    next_pass: Instant,
    /// When the next slice of reads is due (`None`: no pass under way).
    next_step: Option<Instant>,
    /// Reads per slice in the pass under way.
    per_step: usize,
    /// Services whose read was asked by the pass (or by a re-check), with
    /// the index every detector had settled at when it was asked.
    asked: HashMap<String, u64>,
    /// Passes begun, for the log.
    passes: u64,
}

/// What the timer asks of the supervisor.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Due {
    /// Start a pass: list the catalog (the reads follow its answer).
    pub list: bool,
    /// Read these now.
    pub read: Vec<String>,
}

impl Verifier {
    pub fn new(interval: Duration) -> Verifier {
        Verifier {
            pacer: Pacer::new(interval),
            left: VecDeque::new(),
            next_pass: Instant::now() + interval,
            next_step: None,
            per_step: 1,
            asked: HashMap::new(),
            passes: 0,
        }
    }

    pub fn next_timer(&self) -> Instant {
        self.next_step.map_or(self.next_pass, |step| step.min(self.next_pass))
    }

    /// The work due at `now`. A pass still under way when the next is due
    /// is finished by that one (its services are all in the new order).
    pub fn due(&mut self, now: Instant) -> Due {
        let mut due = Due::default();
        if self.next_pass <= now {
            self.next_pass = now + self.pacer.interval();
            self.next_step = None;
            self.left.clear();
            self.passes += 1;
            due.list = true;
        }
        if self.next_step.is_some_and(|at| at <= now) {
            due.read = self.left.drain(..self.per_step.min(self.left.len())).collect();
            self.next_step = (!self.left.is_empty()).then(|| now + Pacer::STEP);
        }
        due
    }

    /// The listing answered (or failed): read `services` over the pass,
    /// the first slice at once.
    pub fn begin(&mut self, services: impl IntoIterator<Item = String>) {
        self.left = services.into_iter().collect();
        self.per_step = self.pacer.per_step(self.left.len());
        self.next_step = (!self.left.is_empty()).then(Instant::now);
    }

    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Remember that a read of `name` was asked to check it, with every
    /// detector settled at `settled`.
    pub fn ask(&mut self, name: &str, settled: u64) {
        self.asked.entry(name.to_string()).or_insert(settled);
    }

    /// A read of `name` was applied: whether a check had asked for it (and
    /// the settled index then).
    pub fn answered(&mut self, name: &str) -> Option<u64> {
        self.asked.remove(name)
    }

    /// A service left the catalog.
    pub fn forget(&mut self, name: &str) {
        self.asked.remove(name);
    }
}

/// What the read of one service found, for [`judge`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Found {
    /// The read's answer differs from what was sent.
    pub differs: bool,
    /// The service's last read had failed (it was unreadable).
    pub was_failing: bool,
    /// Why it was read again, when a detector already knew something was
    /// off (a stale answer refused, a name that did not resolve).
    pub hint: Option<RepairKind>,
    /// The settled index when a check asked for the read (`None`: a
    /// detector asked for it, and a difference is the change it reported).
    pub asked: Option<u64>,
    /// `X-Consul-Index` of the last read applied, and of this one.
    pub prev_index: u64,
    pub index: u64,
    /// Some instance registered a host name.
    pub named: bool,
}

/// Whether a difference a read found is a repair, and of which kind; `None`
/// for the changes the detectors are delivering (a read they asked for, or
/// one that raced a change newer than what they had settled).
pub(super) fn judge(f: Found) -> Option<RepairKind> {
    if !f.differs {
        return None;
    }
    if f.was_failing {
        return Some(RepairKind::Unreadable);
    }
    if let Some(hint) = f.hint {
        return Some(hint);
    }
    if f.named && f.index == f.prev_index {
        // No write moved the index, so no detector is delivering this: the
        // name resolves elsewhere now, whichever read saw it first (a
        // detector's read can land just after the name moved, beside the
        // check that asked, which then finds nothing new).
        return Some(RepairKind::NameResolution);
    }
    let settled = f.asked?;
    if f.index < f.prev_index {
        // Consul's index for this service went back: a restored snapshot.
        Some(RepairKind::IndexReset)
    } else if f.index == f.prev_index {
        // Same index, other content: nothing Consul wrote. A name that now
        // resolves elsewhere, or what the token may see (an ACL change).
        Some(if f.named { RepairKind::NameResolution } else { RepairKind::MissedChange })
    } else if f.index <= settled {
        // Written before what every detector had reported, and not read.
        Some(RepairKind::MissedChange)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found() -> Found {
        Found {
            differs: true,
            was_failing: false,
            hint: None,
            asked: Some(100),
            prev_index: 50,
            index: 50,
            named: false,
        }
    }

    #[test]
    fn only_a_difference_the_detectors_are_not_delivering_is_a_repair() {
        assert_eq!(judge(Found { differs: false, ..found() }), None, "no difference, nothing to repair");
        assert_eq!(judge(Found { asked: None, index: 60, ..found() }), None, "a read a detector asked for");
        assert_eq!(judge(Found { index: 120, ..found() }), None, "a change newer than what was settled: a race");
        assert_eq!(judge(Found { index: 90, ..found() }), Some(RepairKind::MissedChange), "settled and missed");
        assert_eq!(judge(found()), Some(RepairKind::MissedChange), "same index, other content (ACL)");
        assert_eq!(judge(Found { named: true, ..found() }), Some(RepairKind::NameResolution));
        let moved = Found { named: true, asked: None, ..found() };
        assert_eq!(judge(moved), Some(RepairKind::NameResolution), "a name that moved, seen by a detector's read");
        let written = Found { named: true, asked: None, index: 60, ..found() };
        assert_eq!(judge(written), None, "a named service's change a detector asked for");
        assert_eq!(judge(Found { index: 20, ..found() }), Some(RepairKind::IndexReset), "the index went back");
        assert_eq!(judge(Found { was_failing: true, asked: None, ..found() }), Some(RepairKind::Unreadable));
        let stale = Found { hint: Some(RepairKind::StaleRead), asked: None, index: 60, ..found() };
        assert_eq!(judge(stale), Some(RepairKind::StaleRead));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_lists_then_reads_every_service_spread_over_the_interval() {
        let mut v = Verifier::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(v.next_timer(), start + Duration::from_secs(10));
        assert_eq!(v.due(start), Due::default(), "nothing before the first pass");
        tokio::time::advance(Duration::from_secs(10)).await;
        let now = Instant::now();
        assert_eq!(v.due(now), Due { list: true, read: vec![] }, "a pass starts with the listing");
        v.begin((0..20).map(|i| format!("s{i}")));
        let mut read = Vec::new();
        let mut steps = 0;
        while read.len() < 20 {
            let at = v.next_timer();
            assert!(at < now + Duration::from_secs(10), "the pass ends within its interval");
            tokio::time::advance(at.saturating_duration_since(Instant::now())).await;
            let due = v.due(Instant::now());
            assert!(!due.list);
            assert!(due.read.len() <= 3, "a slice, not a burst: {}", due.read.len());
            read.extend(due.read);
            steps += 1;
        }
        assert_eq!(read.len(), 20, "every service once");
        assert!(steps >= 7, "spread over {steps} steps");
        assert_eq!(v.next_timer(), now + Duration::from_secs(10), "then the next pass");
        assert_eq!(v.passes(), 1);
    }
}
