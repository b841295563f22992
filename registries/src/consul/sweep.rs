//! A sweep: every tracked service asked for its index (pipelined probes on
//! a few connections), the ones that moved handed to the supervisor to
//! read. How far it goes is shared with the supervisor ([`SweepCtl`]), which
//! extends it while it runs; see `supervisor.rs` for when sweeps start.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::debug;

use super::ctx::{Ctx, Event, is_outage};
use crate::watcher::RegistryError;

/// Index probes pipelined per request batch on one connection.
pub(crate) const PROBE_BATCH: usize = 16;

/// What the supervisor and a running sweep share: how far the sweep goes
/// and what it probes first. A sweep covers positions `0..end` of its
/// order taken round and round (position `p` is `order[p % len]`), so a
/// catalog change while it runs extends it by one lap from the next
/// position it starts: every service then gets a probe started after the
/// change, and none is probed twice for nothing.
#[derive(Default)]
pub(crate) struct SweepCtl {
    /// The next position a batch starts at.
    pub(crate) next: usize,
    /// Where the sweep stops.
    pub(crate) end: usize,
    /// Batches to probe before the next position (the services changed
    /// most recently, when a change extends the sweep).
    pub(crate) urgent: VecDeque<Vec<(String, u64)>>,
    /// The sweep has started its last batch: extending it is too late.
    pub(crate) closed: bool,
}

impl SweepCtl {
    pub(crate) fn new(len: usize) -> SweepCtl {
        SweepCtl { end: len, ..SweepCtl::default() }
    }

    /// Cover every service once more, from the next position on, `urgent`
    /// first. False if the sweep is past extending.
    pub(crate) fn extend(&mut self, len: usize, urgent: Vec<(String, u64)>) -> bool {
        if self.closed {
            return false;
        }
        self.end = self.end.max(self.next + len);
        if !urgent.is_empty() {
            self.urgent.push_back(urgent);
        }
        true
    }

    /// The next batch of `order`, its first `first` (the recently changed)
    /// alone at the start of each lap; `None` (and closed) once done.
    pub(crate) fn next_batch(&mut self, order: &[(String, u64)], first: usize) -> Option<Vec<(String, u64)>> {
        if let Some(batch) = self.urgent.pop_front() {
            return Some(batch);
        }
        let len = order.len();
        if len == 0 || self.next >= self.end {
            self.closed = true;
            return None;
        }
        let lap = self.next % len;
        let stop = if lap < first { first } else { (lap + PROBE_BATCH).min(len) };
        let take = (stop - lap).min(self.end - self.next);
        self.next += take;
        Some(order[lap..lap + take].to_vec())
    }
}

/// A sweep: probe `order` in batches of [`PROBE_BATCH`] pipelined probes,
/// on up to the read slots less one (left for reads) connections at once,
/// for as long as `ctl` says, and hand the services whose index moved to
/// the supervisor as each batch answers, so their reads run while the
/// sweep goes on. Its first `first` services (the recently changed) go
/// alone in a batch. Laps (the sweep was extended) go in pairs with a rest
/// of half a pair between, so that steady churn costs Consul at most two
/// thirds of its time in probes. Stops at an outage.
pub(crate) async fn sweep(
    ctx: Arc<Ctx>,
    tx: mpsc::Sender<Event>,
    order: Vec<(String, u64)>,
    first: usize,
    ctl: Arc<std::sync::Mutex<SweepCtl>>,
) {
    let parts = ctx.read_slots.saturating_sub(1).max(1);
    let len = order.len();
    let first = first.min(len);
    let order = Arc::new(order);
    // Laps go in pairs: the second of a pair starts at once (a burst that
    // straddles the first lap's start is covered without delay), and the
    // first of the next pair after a rest half as long as the pair took.
    let batches = futures::stream::unfold(Instant::now(), |pair_started| {
        let (order, ctl) = (order.clone(), ctl.clone());
        async move {
            let mut pair_started = pair_started;
            let new_pair = {
                let c = ctl.lock().unwrap_or_else(|e| e.into_inner());
                len > 0 && c.next > 0 && c.next % (2 * len) == 0 && c.next < c.end && c.urgent.is_empty()
            };
            if new_pair {
                tokio::time::sleep(pair_started.elapsed() / 2).await;
                pair_started = Instant::now();
            }
            let batch = ctl.lock().unwrap_or_else(|e| e.into_inner()).next_batch(&order, first)?;
            Some((batch, pair_started))
        }
    });
    let probes = batches.map(|batch| probe_batch(ctx.clone(), batch)).buffer_unordered(parts);
    let mut probes = std::pin::pin!(probes);
    let (mut ok, mut moved_total) = (true, 0usize);
    while let Some(result) = probes.next().await {
        match result {
            Ok(moved) if moved.is_empty() => {}
            Ok(moved) => {
                moved_total += moved.len();
                if tx.send(Event::Moved(moved)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                ctx.health.fail(&e);
                ok = false;
                break;
            }
        }
    }
    let probed = {
        let mut c = ctl.lock().unwrap_or_else(|e| e.into_inner());
        c.closed = true;
        c.next
    };
    debug!(services = len, probed, moved = moved_total, ok, "sweep done");
    let _ = tx.send(Event::SweepDone { ok }).await;
}

/// Probe one batch: the services whose index moved, with the index each has
/// now. A refused probe counts as moved, with index 0 (its read says what
/// is wrong); an outage fails the batch.
async fn probe_batch(ctx: Arc<Ctx>, batch: Vec<(String, u64)>) -> Result<Vec<(String, u64)>, RegistryError> {
    let names: Vec<&str> = batch.iter().map(|(n, _)| n.as_str()).collect();
    let indexes = ctx.client.service_indexes(&names).await;
    let mut moved = Vec::new();
    for ((name, known), result) in batch.iter().zip(indexes) {
        match result {
            Ok(now) if now == *known => {}
            Ok(now) => moved.push((name.clone(), now)),
            Err(e) if is_outage(&e) => return Err(e),
            Err(_) => moved.push((name.clone(), 0)),
        }
    }
    Ok(moved)
}
