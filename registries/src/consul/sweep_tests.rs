//! Sweeps against a small in-process FAKE of Consul's `/v1/health/service`
//! (a keep-alive HTTP/1.1 server that answers pipelined requests in order,
//! as Go's `net/http` does).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::spec::RegistrySpec;
use crate::watcher::Sink;

struct NullSink;

impl Sink for NullSink {
    fn update(&self, _: Update) {}
    fn healthy(&self) {}
    fn error(&self, _: &RegistryError) {}
}

/// What the fake saw.
#[derive(Default)]
struct Seen {
    probes: AtomicUsize,
    reads: AtomicUsize,
    connections: AtomicUsize,
    /// Connections open now, and the most at once.
    open: AtomicUsize,
    max_open: AtomicUsize,
}

/// Serves `index(name)` for every service; `close_every`: answer with
/// `Connection: close` and hang up after that many answers on a connection
/// (a server that does not keep connections alive).
async fn fake(index: impl Fn(&str) -> u64 + Send + Sync + 'static, close_every: Option<usize>) -> (u16, Arc<Seen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let index = Arc::new(index);
    let s = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let (seen, index) = (s.clone(), index.clone());
            seen.connections.fetch_add(1, Ordering::SeqCst);
            let open = seen.open.fetch_add(1, Ordering::SeqCst) + 1;
            seen.max_open.fetch_max(open, Ordering::SeqCst);
            tokio::spawn(async move {
                let (mut buf, mut chunk, mut answered) = (Vec::new(), [0u8; 4096], 0usize);
                'conn: loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        let head = String::from_utf8_lossy(&head).into_owned();
                        let path = head.split(' ').nth(1).unwrap_or("").to_string();
                        let probe = path.contains("tag=");
                        let name = path.trim_start_matches("/v1/health/service/").split('?').next().unwrap_or("");
                        if probe {
                            seen.probes.fetch_add(1, Ordering::SeqCst);
                        } else {
                            seen.reads.fetch_add(1, Ordering::SeqCst);
                        }
                        answered += 1;
                        let close = close_every.is_some_and(|n| answered >= n);
                        let resp = format!(
                            "HTTP/1.1 200 OK\r\nX-Consul-Index: {}\r\n{}Content-Length: 2\r\n\r\n[]",
                            index(name),
                            if close { "Connection: close\r\n" } else { "" }
                        );
                        if conn.write_all(resp.as_bytes()).await.is_err() || close {
                            break 'conn;
                        }
                    }
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                seen.open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (port, seen)
}

fn ctx(port: u16, cap: usize) -> Arc<Ctx> {
    let spec = RegistrySpec::new(crate::RegistryKind::Consul, "c", "127.0.0.1", port);
    let sink: Arc<dyn Sink> = Arc::new(NullSink);
    Arc::new(Ctx {
        client: super::super::client::Client::new(&spec, cap).unwrap(),
        naming: super::super::decode::Naming::new(&spec, "dc1"),
        tag: None,
        wait: Duration::from_secs(1),
        read_slots: cap - 2,
        sink: sink.clone(),
        health: crate::health::Health::new(sink, "consul"),
        seq: AtomicU64::new(0),
    })
}

fn order(n: usize) -> Vec<(String, u64)> {
    (0..n).map(|i| (format!("s{i}"), 1)).collect()
}

/// Runs a sweep; returns the services it read and whether it ended well.
async fn run_sweep(
    ctx: Arc<Ctx>,
    order: Vec<(String, u64)>,
    target: Option<u64>,
    cancel: Arc<Notify>,
) -> (Vec<String>, bool) {
    run_sweep_first(ctx, order, 0, target, cancel).await
}

async fn run_sweep_first(
    ctx: Arc<Ctx>,
    order: Vec<(String, u64)>,
    first: usize,
    target: Option<u64>,
    cancel: Arc<Notify>,
) -> (Vec<String>, bool) {
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(sweep(ctx, tx, order, first, target, target.is_none(), cancel));
    let mut read = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("sweep hangs") {
            Some(Event::Read { read: r, .. }) => read.push(r.name),
            Some(Event::SweepDone { ok, .. }) => return (read, ok),
            Some(_) => {}
            None => panic!("sweep dropped its sender"),
        }
    }
}

#[tokio::test]
async fn a_parallel_sweep_stops_every_part_at_the_change() {
    // s300 of 2,000 moved to index 99: the change looked for.
    let (port, seen) = fake(|name| if name == "s300" { 99 } else { 1 }, None).await;
    let ctx = ctx(port, 8);
    let (read, ok) = run_sweep(ctx, order(2000), Some(99), Arc::new(Notify::new())).await;
    assert!(ok);
    assert_eq!(read, vec!["s300".to_string()]);
    let probes = seen.probes.load(Ordering::SeqCst);
    // Up to the change's batch, plus at most the batches in flight on the
    // other parts: far from all 2,000.
    let parts = 8 - 2 - 1;
    assert!(probes <= 304 + parts * PROBE_BATCH, "{probes} probes");
    // The parts' connections and the read's.
    let most = seen.max_open.load(Ordering::SeqCst);
    assert!(most <= parts + 1, "{most} connections");
    assert!(seen.connections.load(Ordering::SeqCst) > 1, "the parts run on several connections");
}

#[tokio::test]
async fn recent_changes_alone_first_find_a_repeat_change_with_one_batch() {
    let (port, seen) = fake(|name| if name == "s1500" { 99 } else { 1 }, None).await;
    let mut order = order(2000);
    let recent = order.remove(1500);
    order.insert(0, recent);
    let (read, ok) = run_sweep_first(ctx(port, 8), order, 1, Some(99), Arc::new(Notify::new())).await;
    assert!(ok);
    assert_eq!(read, vec!["s1500".to_string()]);
    assert_eq!(seen.probes.load(Ordering::SeqCst), 1, "the recent batch alone");
}

#[tokio::test]
async fn a_periodic_sweep_probes_all_and_reads_every_moved_service() {
    let (port, seen) = fake(|name| if name == "s5" || name == "s777" { 7 } else { 1 }, None).await;
    let (mut read, ok) = run_sweep(ctx(port, 8), order(1000), None, Arc::new(Notify::new())).await;
    read.sort();
    assert!(ok);
    assert_eq!(read, vec!["s5".to_string(), "s777".to_string()]);
    assert_eq!(seen.probes.load(Ordering::SeqCst), 1000);
    assert_eq!(seen.reads.load(Ordering::SeqCst), 2);
    // Pipelined: far fewer connections than probes, reused across batches.
    assert!(seen.connections.load(Ordering::SeqCst) <= 8, "{}", seen.connections.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_cancelled_sweep_stops() {
    let (port, seen) = fake(|_| 1, None).await;
    let cancel = Arc::new(Notify::new());
    cancel.notify_one();
    let (read, ok) = run_sweep(ctx(port, 8), order(5000), Some(99), cancel).await;
    assert!(read.is_empty() && ok);
    assert!(seen.probes.load(Ordering::SeqCst) < 5000, "{}", seen.probes.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_server_that_closes_connections_is_still_swept_whole() {
    // Every connection is closed after 5 answers: the batches end early and
    // their probes go one at a time.
    let (port, seen) = fake(|name| if name == "s90" { 3 } else { 1 }, Some(5)).await;
    let (read, ok) = run_sweep(ctx(port, 4), order(100), None, Arc::new(Notify::new())).await;
    assert!(ok);
    assert_eq!(read, vec!["s90".to_string()]);
    assert!(seen.probes.load(Ordering::SeqCst) >= 100);
    assert!(seen.max_open.load(Ordering::SeqCst) <= 4);
}

#[test]
fn recent_changes_are_swept_first() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    let (tx, _rx) = mpsc::channel(1);
    let mut selector = Selector::all();
    let selection = selector.current();
    let mut sup = Supervisor::new(ctx(1, 8), tx, selector, selection);
    for i in 0..5 {
        sup.services.insert(format!("s{i}"), Tracked { index: i, ..Tracked::default() });
    }
    sup.recent = VecDeque::from(["s3".to_string(), "gone".to_string(), "s1".to_string()]);
    let names = |(o, first): (Vec<(String, u64)>, usize)| (o.into_iter().map(|(n, _)| n).collect::<Vec<_>>(), first);
    assert_eq!(
        names(sup.sweep_order(false)),
        (vec!["s3", "s1", "s0", "s2", "s4"].into_iter().map(String::from).collect(), 2)
    );
    assert_eq!(names(sup.sweep_order(true)).0, ["s0", "s1", "s2", "s3", "s4"], "periodic: catalog order");
}

fn supervisor() -> Supervisor {
    let (tx, _rx) = mpsc::channel(8);
    let mut selector = Selector::all();
    let selection = selector.current();
    Supervisor::new(ctx(1, 8), tx, selector, selection)
}

#[tokio::test]
async fn the_grace_ends_once_the_health_detector_answered_past_the_change() {
    let checks = |index| Indexed { value: CheckPrints::default(), index };
    let mut sup = supervisor();
    let later = Instant::now() + EXPLAIN_GRACE;
    sup.unexplained = Some((50, later));
    sup.on_checks(checks(49));
    assert_eq!(sup.unexplained, Some((50, later)), "an older answer: a read may still name it");
    // A read pending may account for it (an instance registered with a
    // failing check moves the catalog and the checks at the same index).
    sup.in_flight.insert("s".into(), false);
    sup.on_checks(checks(50));
    assert_eq!(sup.unexplained, Some((50, later)), "a read is pending");
    sup.in_flight.clear();
    sup.on_checks(checks(51));
    assert!(sup.unexplained.is_some_and(|(_, at)| at <= Instant::now()), "nothing can name it: sweep now");
}

#[tokio::test]
async fn a_read_that_accounts_for_the_change_stops_its_sweep() {
    let mut sup = supervisor();
    let cancel = Arc::new(Notify::new());
    sup.sweep_cancel = Some((50, cancel.clone()));
    sup.read_max_index = 49;
    sup.after_reads();
    assert!(sup.sweep_cancel.is_some());
    sup.read_max_index = 50;
    sup.after_reads();
    assert!(sup.sweep_cancel.is_none());
    tokio::time::timeout(Duration::from_secs(1), cancel.notified()).await.expect("the sweep is told to stop");
}
