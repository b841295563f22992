//! Retry pacing shared by the watchers: exponential backoff, with jitter
//! where many loops of one watcher (and many watchers) would otherwise retry
//! in lockstep.

use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The wait after `failures` failures in a row: `start`, doubled for each
/// failure after the first, at most `max` (and `start` for 0).
pub(crate) fn exponential(start: Duration, max: Duration, failures: u32) -> Duration {
    start.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(max)
}

/// [`exponential`] ±20%, never above `max`: for retry loops that keep their
/// own failure count (Eureka, DNS), so that many watchers (or many hosts of
/// one) that failed together do not retry in lockstep.
pub(crate) fn jittered(start: Duration, max: Duration, failures: u32) -> Duration {
    jitter(exponential(start, max, failures)).min(max)
}

/// Exponential backoff, 200 ms doubling to 10 s, with ±20% jitter so that
/// the loops of one watcher (and many watchers) do not retry in lockstep.
/// Used by the Consul, Nacos and ZooKeeper watchers.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    failures: u32,
}

impl Backoff {
    /// How long to wait after one more failure.
    pub fn next(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        jitter(exponential(BACKOFF_START, BACKOFF_MAX, self.failures))
    }

    /// A success: the next failure waits the shortest time again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// How often [`reopened`] tries the ports.
const REOPEN_POLL: Duration = Duration::from_millis(500);
const REOPEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Sleep `delay`, or less: until a server back from an outage accepts TCP
/// again ([`reopened`]); then `backoff` starts again from its shortest wait,
/// since a server accepts connections a little before it serves (a JVM
/// loading its data). A backoff that grew to its cap during a long outage
/// then costs nothing once the server is back.
pub(crate) async fn wait_or_reopened(backoff: &mut Backoff, addrs: &[String]) {
    tokio::select! {
        () = tokio::time::sleep(backoff.next()) => {}
        () = reopened(addrs) => backoff.reset(),
    }
}

/// Resolves once one of `addrs` (`host:port`) that refused a TCP connect or
/// timed it out accepts one again. A server that accepts all along (hung,
/// or refusing at the protocol level) never ends the wait: retrying it
/// sooner would not help.
pub(crate) async fn reopened(addrs: &[String]) {
    let mut was_closed = vec![false; addrs.len()];
    loop {
        for (addr, closed) in addrs.iter().zip(was_closed.iter_mut()) {
            let open = matches!(
                tokio::time::timeout(REOPEN_CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr.as_str())).await,
                Ok(Ok(_))
            );
            if open && *closed {
                return;
            }
            *closed |= !open;
        }
        tokio::time::sleep(REOPEN_POLL).await;
    }
}

/// `d` ±20%.
fn jitter(d: Duration) -> Duration {
    // RandomState is randomly keyed: enough randomness for jitter without a
    // dependency.
    let r = RandomState::new().hash_one(Instant::now()) % 1000;
    d.mul_f64(0.8 + 0.4 * r as f64 / 1000.0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A port that was closed and opens ends the wait; one open all along
    /// does not.
    #[tokio::test]
    async fn reopened_waits_for_a_closed_port_to_open() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open_addr = open.local_addr().unwrap().to_string();
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let addrs = vec![open_addr, closed_addr.to_string()];
        let wait = tokio::spawn(async move { reopened(&addrs).await });
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!wait.is_finished(), "ended while nothing reopened");
        let _back = tokio::net::TcpListener::bind(closed_addr).await.unwrap();
        tokio::time::timeout(Duration::from_secs(3), wait).await.expect("ends once the port opens").unwrap();
        let t = Instant::now();
        wait_or_reopened(&mut Backoff::default(), &[]).await;
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn backoff_doubles_to_a_cap_with_jitter() {
        let mut b = Backoff::default();
        for i in 0..10 {
            let base = (BACKOFF_START * 2u32.pow(i)).min(BACKOFF_MAX);
            let d = b.next();
            assert!(d >= base.mul_f64(0.8) && d <= base.mul_f64(1.2), "step {i}: {d:?}");
        }
        b.reset();
        assert!(b.next() <= BACKOFF_START.mul_f64(1.2));
    }

    /// The spread of `f` over many calls: (min, max, distinct values).
    pub(crate) fn spread(f: impl Fn() -> Duration) -> (Duration, Duration, usize) {
        let all: Vec<Duration> = (0..200).map(|_| f()).collect();
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        (*all.iter().min().unwrap(), *all.iter().max().unwrap(), distinct.len())
    }

    #[test]
    fn jittered_varies_within_a_fifth_and_never_passes_the_cap() {
        let (lo, hi, n) = spread(|| jittered(Duration::from_secs(1), Duration::from_secs(60), 3));
        assert!(n > 20, "only {n} distinct delays in 200");
        assert!(lo >= Duration::from_millis(3200) && hi <= Duration::from_millis(4800), "{lo:?}..{hi:?}");
        let (_, hi, n) = spread(|| jittered(Duration::from_secs(1), Duration::from_secs(60), 30));
        assert!(hi <= Duration::from_secs(60) && n > 20, "{hi:?}, {n}");
    }

    #[test]
    fn exponential_doubles_from_the_first_failure_to_a_cap() {
        let secs = |n| exponential(Duration::from_secs(1), Duration::from_secs(60), n).as_secs();
        assert_eq!((0..=9).map(secs).collect::<Vec<_>>(), vec![1, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(secs(u32::MAX), 60, "no overflow");
        let ms = exponential(Duration::from_millis(200), Duration::from_secs(10), 40);
        assert_eq!(ms, Duration::from_secs(10));
    }
}
