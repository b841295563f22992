//! How long a Consul read may take: the one place that decides every
//! call's timeout ([`timeout`]) and, for the catalog-wide reads, the slack
//! each learns ([`Budget`]).
//!
//! A call gets `wait + wait / 16` (a blocking query's wait and the up to
//! `wait / 16` Consul adds to spread wake-ups; both 0 for a non-blocking
//! read) plus a slack for Consul to compute and send the answer. A fixed
//! slack of 5 s was too short at 100k services × 10 instances on Consul
//! 1.8.7: right after a mass registration the first `/v1/catalog/services`
//! (2.1 MB, computed over 1M instances; 1.4–1.6 s on a quiet Consul) took
//! longer than 5 s, every retry got 5 s again, and the first sync took 48 s,
//! past `--initial-sync-timeout`. A blocking query that Consul wakes near
//! its deadline computes the answer after it, so the same slack bounds that.
//!
//! So the catalog-wide reads (catalog services, nodes, each failing-check
//! state) each have a [`Budget`], whose slack is the largest of:
//!
//! - [`BASE`] (5 s), what every call had before, and what the small calls
//!   keep: one service's read, the index probes, the leader probe (the
//!   hung-Consul detector) and `/v1/agent/self`;
//! - [`FACTOR`] × the longest of the last [`RECENT`] answer times of that
//!   read: a Consul that has shown it needs 3 s gets 9 s;
//! - after a timeout, twice the slack of the try that timed out (5, 10, 20,
//!   40 s), until that read answers;
//!
//! and never more than [`MAX`] (60 s).
//!
//! A timeout is still an error at once: the registry shows that it fails,
//! and a hung Consul is reported as soon as before. Only the next try waits
//! longer, so an answer Consul is slow to give gets through on a retry
//! instead of timing out forever.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The slack every call gets at least, and the small calls always.
pub(crate) const BASE: Duration = Duration::from_secs(5);
/// The most slack a read gets, however slow Consul has been.
pub(crate) const MAX: Duration = Duration::from_secs(60);
/// The slack is this many times the longest recent answer: at 100k
/// services Consul answered the catalog in 1.4–1.6 s when quiet and in more
/// than 5 s right after a mass registration.
const FACTOR: u32 = 3;
/// Answer times remembered per read. The catalog is read without blocking
/// at every full sync, anti-entropy listing (5 min) and detector restart,
/// so this spans tens of minutes: a slow spell is remembered for a while,
/// then forgotten.
const RECENT: usize = 8;

/// The timeout of a call that blocks for `wait` (zero: not blocking) with
/// `slack` for Consul to answer.
pub(crate) fn timeout(wait: Duration, slack: Duration) -> Duration {
    wait + wait / 16 + slack
}

/// What one catalog-wide read has learned of Consul's answer times.
#[derive(Default)]
pub(crate) struct Budget {
    learned: Mutex<Learned>,
}

#[derive(Default)]
struct Learned {
    /// The last [`RECENT`] answer times, a ring (zero: none yet).
    recent: [Duration; RECENT],
    next: usize,
    /// Twice the slack of the last try that timed out; zero once the read
    /// answered.
    after_timeout: Duration,
}

impl Budget {
    /// The slack the next call of this read gets.
    pub fn slack(&self) -> Duration {
        let learned = self.lock();
        let longest = learned.recent.iter().max().copied().unwrap_or_default();
        BASE.max(longest.saturating_mul(FACTOR)).max(learned.after_timeout).min(MAX)
    }

    /// A call that blocked for `wait` (zero: not blocking) answered
    /// successfully after `took`: learn how long Consul needed, and end any
    /// doubling. A blocking query's answer says how long Consul needed only
    /// when it came after `wait` and Consul's spread: then Consul computed
    /// it for at least that long after its deadline.
    pub fn answered(&self, wait: Duration, took: Duration) {
        let needed = if wait.is_zero() { Some(took) } else { took.checked_sub(timeout(wait, Duration::ZERO)) };
        let mut learned = self.lock();
        learned.after_timeout = Duration::ZERO;
        if let Some(needed) = needed.filter(|n| !n.is_zero()) {
            let at = learned.next;
            learned.recent[at] = needed;
            learned.next = (at + 1) % RECENT;
        }
    }

    /// A call that had `slack` timed out: the next try gets twice that.
    /// Returns the slack the next try gets.
    pub fn timed_out(&self, slack: Duration) -> Duration {
        {
            let mut learned = self.lock();
            // A try with less slack (one that started before a longer one
            // timed out) must not shorten the next.
            learned.after_timeout = learned.after_timeout.max(slack.saturating_mul(2)).min(MAX);
        }
        self.slack()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Learned> {
        self.learned.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The catalog-wide reads, each with its own [`Budget`]: one read's
/// slowness says little about another's (the failing checks are few while
/// the catalog is large).
#[derive(Default)]
pub(crate) struct Budgets {
    pub services: Budget,
    pub nodes: Budget,
    /// By [`super::client::CheckState::ALL`].
    pub checks: [Budget; 2],
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_fresh_read_gets_the_base_slack() {
        assert_eq!(Budget::default().slack(), BASE);
        assert_eq!(timeout(Duration::ZERO, BASE), secs(5), "a non-blocking read: the slack alone");
        assert_eq!(timeout(secs(32), BASE), secs(39), "a blocking one: wait, wait / 16, slack");
    }

    #[test]
    fn the_slack_grows_with_the_longest_recent_answer() {
        let b = Budget::default();
        b.answered(Duration::ZERO, Duration::from_millis(1500));
        assert_eq!(b.slack(), BASE, "3 × 1.5 s is under the base");
        b.answered(Duration::ZERO, secs(7));
        assert_eq!(b.slack(), secs(21));
        b.answered(Duration::ZERO, secs(1));
        assert_eq!(b.slack(), secs(21), "the longest recent answer, not the last");
        for _ in 0..RECENT - 1 {
            b.answered(Duration::ZERO, secs(1));
        }
        assert_eq!(b.slack(), BASE, "forgotten once {RECENT} answers came after it");
        b.answered(Duration::ZERO, secs(30));
        assert_eq!(b.slack(), MAX, "capped");
    }

    #[test]
    fn a_blocking_answer_counts_only_what_came_after_its_deadline() {
        let b = Budget::default();
        let wait = secs(32); // Consul's deadline: up to 34 s
        b.answered(wait, secs(20));
        b.answered(wait, secs(33));
        assert_eq!(b.slack(), BASE, "answers within the deadline say nothing of Consul's answer time");
        b.answered(wait, secs(38));
        assert_eq!(b.slack(), secs(12), "4 s past the deadline, × 3");
    }

    #[test]
    fn each_timeout_doubles_the_next_try_until_an_answer() {
        let b = Budget::default();
        let mut tries = vec![b.slack()];
        for _ in 0..5 {
            let next = b.timed_out(*tries.last().unwrap());
            tries.push(next);
        }
        assert_eq!(tries, [5, 10, 20, 40, 60, 60].map(secs));
        b.answered(Duration::ZERO, secs(7));
        assert_eq!(b.slack(), secs(21), "an answer ends the doubling; its time is learned");
        assert_eq!(b.timed_out(secs(21)), secs(42), "doubles what timed out, learned or not");
        b.answered(Duration::ZERO, secs(1));
        assert_eq!(b.slack(), secs(21));
    }

    #[test]
    fn an_older_try_timing_out_does_not_shorten_the_next() {
        let b = Budget::default();
        assert_eq!(b.timed_out(secs(20)), secs(40));
        assert_eq!(b.timed_out(BASE), secs(40), "a 5 s try that started earlier");
    }

    #[test]
    fn a_blocking_timeout_doubles_the_slack_not_the_wait() {
        let b = Budget::default();
        let wait = secs(32);
        let first = timeout(wait, b.slack());
        let second = timeout(wait, b.timed_out(b.slack()));
        assert_eq!(second - first, BASE);
    }
}
