//! Sweeps against a small in-process FAKE of Consul's `/v1/health/service`
//! (a keep-alive HTTP/1.1 server that answers pipelined requests in order,
//! as Go's `net/http` does).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::spec::RegistrySpec;
use crate::watcher::Sink;

/// Records the hosts of upserts and of drift calls.
#[derive(Default)]
struct NullSink {
    upserts: std::sync::Mutex<Vec<String>>,
    drift: std::sync::Mutex<Vec<(RepairKind, String)>>,
}

impl Sink for NullSink {
    fn update(&self, update: Update) {
        if let Update::Upsert(s) = update {
            self.upserts.lock().unwrap().push(s.host);
        }
    }
    fn healthy(&self) {}
    fn error(&self, _: &RegistryError) {}
    fn repaired(&self, kind: RepairKind, hosts: &[String]) {
        self.drift.lock().unwrap().extend(hosts.iter().map(|h| (kind, h.clone())));
    }
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
    ctx_with(port, cap, Arc::new(NullSink::default()))
}

fn ctx_with(port: u16, cap: usize, sink: Arc<NullSink>) -> Arc<Ctx> {
    let spec = RegistrySpec::new(crate::RegistryKind::Consul, "c", "127.0.0.1", port);
    let sink: Arc<dyn Sink> = sink;
    Arc::new(Ctx {
        client: super::super::client::Client::new(&spec, cap).unwrap(),
        naming: super::super::decode::Naming::new(&spec, "dc1"),
        tag: None,
        wait: Duration::from_secs(1),
        read_slots: cap - 4,
        sink: sink.clone(),
        health: crate::health::Health::new(sink, "consul"),
        seq: AtomicU64::new(0),
        rebase: tokio::sync::watch::Sender::new(0),
    })
}

fn order(n: usize) -> Vec<(String, u64)> {
    (0..n).map(|i| (format!("s{i}"), 1)).collect()
}

fn ctl(len: usize) -> Arc<std::sync::Mutex<SweepCtl>> {
    Arc::new(std::sync::Mutex::new(SweepCtl::new(len)))
}

/// A sweep the supervisor says is running, as `start_sweep` would record it.
fn running(sup: &Supervisor, started: Instant, periodic: bool, settled: u64, follows: bool) -> Running {
    let len = sup.services.len();
    Running { started, periodic, settled, follows, ctl: ctl(len), len, members: sup.members }
}

/// Runs a sweep; returns the services it found moved (with their index)
/// and whether it ended well.
async fn run_sweep(ctx: Arc<Ctx>, order: Vec<(String, u64)>, first: usize) -> (Vec<(String, u64)>, bool) {
    let (tx, mut rx) = mpsc::channel(16);
    let ctl = ctl(order.len());
    tokio::spawn(sweep(ctx, tx, order, first, ctl));
    let mut moved = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("sweep hangs") {
            Some(Event::Moved(m)) => moved.extend(m),
            Some(Event::SweepDone { ok }) => {
                moved.sort();
                return (moved, ok);
            }
            Some(_) => {}
            None => panic!("sweep dropped its sender"),
        }
    }
}

#[tokio::test]
async fn a_sweep_finds_every_moved_service_not_only_the_first() {
    // A burst: three services moved, at different indexes, far apart.
    let moved_at = |name: &str| match name {
        "s5" => 7,
        "s300" => 99,
        "s1999" => 42,
        _ => 1,
    };
    let (port, seen) = fake(moved_at, None).await;
    let (moved, ok) = run_sweep(ctx(port, 8), order(2000), 0).await;
    assert!(ok);
    let want: Vec<(String, u64)> = [("s1999", 42), ("s300", 99), ("s5", 7)].map(|(n, i)| (n.to_string(), i)).into();
    assert_eq!(moved, want);
    assert_eq!(seen.probes.load(Ordering::SeqCst), 2000, "every service probed");
    assert_eq!(seen.reads.load(Ordering::SeqCst), 0, "the supervisor reads, not the sweep");
    // The parts' connections, pipelined and reused across batches.
    let parts = 8 - 4 - 1;
    assert!(seen.max_open.load(Ordering::SeqCst) <= parts, "{}", seen.max_open.load(Ordering::SeqCst));
    assert!(seen.connections.load(Ordering::SeqCst) > 1, "the parts run on several connections");
}

#[tokio::test]
async fn recent_changes_go_alone_in_the_first_batch() {
    let (port, _) = fake(|name| if name == "s1500" { 99 } else { 1 }, None).await;
    let mut order = order(2000);
    let recent = order.remove(1500);
    order.insert(0, recent);
    let (tx, mut rx) = mpsc::channel(16);
    let ctl = ctl(order.len());
    tokio::spawn(sweep(ctx(port, 8), tx, order, 1, ctl));
    // The first thing the sweep says is the recent service: its batch of
    // one answers before any other is asked.
    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap() {
        Some(Event::Moved(m)) => assert_eq!(m, vec![("s1500".to_string(), 99)]),
        _ => panic!("the recent service first"),
    }
}

#[tokio::test]
async fn a_server_that_closes_connections_is_still_swept_whole() {
    // Every connection is closed after 5 answers: the batches end early and
    // their probes go one at a time.
    let (port, seen) = fake(|name| if name == "s90" || name == "s3" { 3 } else { 1 }, Some(5)).await;
    let (moved, ok) = run_sweep(ctx(port, 5), order(100), 0).await;
    assert!(ok);
    assert_eq!(moved, vec![("s3".to_string(), 3), ("s90".to_string(), 3)]);
    assert!(seen.probes.load(Ordering::SeqCst) >= 100);
    assert!(seen.max_open.load(Ordering::SeqCst) <= 5);
}

#[test]
fn an_extended_sweep_covers_every_service_once_from_where_it_was() {
    // Two and a half batches after the 3 recent ones.
    let n = 3 + 2 * PROBE_BATCH + PROBE_BATCH / 2;
    let order: Vec<(String, u64)> = (0..n).map(|i| (format!("s{i}"), 1)).collect();
    let names = |b: Vec<(String, u64)>| b.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    let mut c = SweepCtl::new(order.len());
    // The 3 recent ones alone, then whole batches up to the lap's end.
    assert_eq!(names(c.next_batch(&order, 3).unwrap()), ["s0", "s1", "s2"]);
    assert_eq!(c.next_batch(&order, 3).unwrap().len(), PROBE_BATCH);
    assert_eq!(c.next, 3 + PROBE_BATCH);
    // A change now: every service once more from the next position, recent
    // first.
    assert!(c.extend(order.len(), vec![("s0".into(), 1)]));
    assert_eq!(names(c.next_batch(&order, 3).unwrap()), ["s0"]);
    let mut seen = Vec::new();
    while let Some(batch) = c.next_batch(&order, 3) {
        assert!(batch.len() <= PROBE_BATCH);
        seen.extend(names(batch));
    }
    // The rest of the first lap, then the start of the second up to there.
    assert_eq!(seen.len(), n);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), n, "each service once");
    assert_eq!(seen[0], format!("s{}", 3 + PROBE_BATCH));
    assert_eq!(seen.last().cloned(), Some(format!("s{}", 2 + PROBE_BATCH)));
    assert!(c.closed && !c.extend(order.len(), vec![]), "too late once done");
}

#[test]
fn recent_changes_are_swept_first() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    let mut sup = supervisor(ctx(1, 8));
    for i in 0..5 {
        sup.services.insert(format!("s{i}"), Tracked { index: i, ..Tracked::default() });
    }
    sup.recent = VecDeque::from(["s3".to_string(), "gone".to_string(), "s1".to_string()]);
    let (order, first) = sup.sweep_order();
    let names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!((names, first), (vec!["s3", "s1", "s0", "s2", "s4"], 2));
}

/// A catalog detector's answer naming `names` (no tags), as Consul
/// sends it.
fn catalog_answer(names: &[&str], index: u64) -> Indexed<Vec<u8>> {
    let map: BTreeMap<&str, Vec<String>> = names.iter().map(|n| (*n, vec![])).collect();
    Indexed { value: serde_json::to_vec(&map).unwrap(), index }
}

fn supervisor(ctx: Arc<Ctx>) -> Supervisor {
    let (tx, rx) = mpsc::channel(8);
    std::mem::forget(rx);
    let mut selector = Selector::all();
    let selection = selector.current();
    Supervisor::new(ctx, tx, selector, selection, crate::repair::DEFAULT_INTERVAL)
}

#[tokio::test]
async fn every_catalog_change_is_swept_and_a_burst_shares_one_sweep() {
    let mut sup = supervisor(ctx(1, 8));
    let catalog = |index| catalog_answer(&["web", "api"], index);
    sup.on_catalog(catalog_answer(&["web"], 10));
    sup.unswept = None;
    // A new service named by the catalog does not excuse the sweep: the
    // same write (a transaction) may have changed others.
    sup.on_catalog(catalog(11));
    let (first, due) = sup.unswept.expect("swept although a service was named");
    assert!(due <= first + SWEEP_QUIET);
    // The next change of the burst moves the sweep on, but never past the
    // cap from the first.
    tokio::time::sleep(Duration::from_millis(30)).await;
    sup.on_catalog(catalog(12));
    let (first2, due2) = sup.unswept.unwrap();
    assert_eq!(first2, first);
    assert!(due2 > due && due2 <= first + SWEEP_MAX_DEFER);
    // While a sweep runs, a change extends it by a lap from where it is.
    sup.unswept = None;
    let run = running(&sup, Instant::now(), false, 0, false);
    run.ctl.lock().unwrap().next = 1;
    sup.running = Some(run);
    sup.on_catalog(catalog(13));
    assert!(!sup.sweep_again && sup.unswept.is_none());
    let (ctl, len) = sup.running.as_ref().map(|r| (r.ctl.clone(), r.len)).unwrap();
    assert_eq!((len, ctl.lock().unwrap().end), (2, 1 + 2), "one lap of the services from the next position");
    // A service added since the sweep began is not in its order: one more
    // sweep after it, then.
    sup.on_catalog(catalog_answer(&["web", "api", "db"], 14));
    assert!(sup.sweep_again);
    // Too late to extend a sweep that has started its last batch.
    sup.sweep_again = false;
    let run = running(&sup, Instant::now(), false, 0, false);
    run.ctl.lock().unwrap().closed = true;
    sup.running = Some(run);
    sup.on_catalog(catalog(15));
    assert!(sup.sweep_again);
}

#[tokio::test]
async fn a_node_change_reads_the_services_on_that_node() {
    let mut sup = supervisor(ctx(1, 8));
    let on = |nodes: &[&str]| Tracked { nodes: nodes.iter().map(|n| n.to_string()).collect(), ..Tracked::default() };
    sup.services.insert("a".into(), on(&["n1"]));
    sup.services.insert("b".into(), on(&["n2", "n3"]));
    sup.services.insert("c".into(), on(&["n3"]));
    sup.nodes = BTreeMap::from([("n1".into(), 5), ("n2".into(), 5), ("n3".into(), 5)]);
    // The read slots are taken, so what is wanted stays queued to be seen.
    for i in 0..5 {
        sup.in_flight.insert(format!("busy{i}"), false);
    }
    sup.on_nodes(Indexed { value: BTreeMap::from([("n1".into(), 5), ("n2".into(), 9), ("n3".into(), 5)]), index: 9 });
    assert_eq!(sup.queue, ["b"], "n2's address changed");
    sup.queue.clear();
    sup.queued.clear();
    sup.on_nodes(Indexed { value: BTreeMap::from([("n1".into(), 5), ("n2".into(), 9)]), index: 10 });
    let mut queued: Vec<&String> = sup.queue.iter().collect();
    queued.sort();
    assert_eq!(queued, ["b", "c"], "n3 went");
}

#[tokio::test]
async fn back_to_back_sweeps_rest_every_other_time() {
    let mut sup = supervisor(ctx(1, 8));
    let took = Duration::from_millis(400);
    let ended = |sup: &mut Supervisor, follows| {
        sup.running = Some(running(sup, Instant::now() - took, false, 0, follows));
        sup.on_sweep_done(true);
    };
    ended(&mut sup, false);
    assert!(sup.sweep_not_before <= Instant::now(), "the first follow-up starts at once");
    ended(&mut sup, true);
    assert!(sup.sweep_not_before >= Instant::now() + took - Duration::from_millis(50), "a follow-up rests after");
}

#[tokio::test]
async fn a_sweep_cut_short_by_an_outage_is_not_retried_in_a_loop() {
    let mut sup = supervisor(ctx(1, 8));
    sup.running = Some(running(&sup, Instant::now(), true, 0, false));
    sup.sweep_again = true;
    sup.on_sweep_done(false);
    // The recovery resync reads everything once Consul answers again.
    assert!(sup.running.is_none() && sup.sweep_due.is_none() && !sup.sweep_again);
}

#[tokio::test]
async fn a_periodic_sweep_counts_only_missed_changes_as_drift() {
    // Consul's answer for every read: one instance of each service.
    let health = r#"[{"Node":{"Node":"n1","Address":"10.0.0.1"},"Service":{"Service":"x","Address":"10.0.0.1","Port":80},"Checks":[]}]"#;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.read(&mut buf).await
                    && n > 0
                {
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nX-Consul-Index: 30\r\nContent-Length: {}\r\n\r\n{health}",
                        health.len()
                    );
                    if conn.write_all(resp.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let sink = Arc::new(NullSink::default());
    let (tx, mut rx) = mpsc::channel(8);
    let mut selector = Selector::all();
    let selection = selector.current();
    let mut sup =
        Supervisor::new(ctx_with(port, 8, sink.clone()), tx, selector, selection, crate::repair::DEFAULT_INTERVAL);
    for name in ["missed", "racing", "failing"] {
        sup.services.insert(name.into(), Tracked { index: 10, ..Tracked::default() });
    }
    sup.services.get_mut("failing").unwrap().failing =
        Some(RegistryError::BadResponse { registry: "c".into(), what: "x".into(), reason: "bad".into() });
    // Everything up to index 20 had been seen and handled when the
    // periodic sweep started.
    sup.running = Some(running(&sup, Instant::now(), true, 20, false));
    sup.on_moved(vec![("missed".into(), 15), ("racing".into(), 25), ("failing".into(), 15)]);
    for _ in 0..3 {
        let Some(Event::Read(read)) = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap() else {
            panic!("a read")
        };
        sup.on_event(Event::Read(read));
    }
    assert_eq!(sink.upserts.lock().unwrap().len(), 3, "all three changed");
    let mut drift = sink.drift.lock().unwrap().clone();
    drift.sort();
    assert_eq!(
        drift,
        [(RepairKind::MissedChange, "missed.dc1.consul".into()), (RepairKind::Unreadable, "failing.dc1.consul".into())],
        "the change that should have been read, and the service that could not be read; not the race"
    );
}

fn answer(seq: u64, min_index: u64, index: u64, addr: &str) -> Read {
    let ep = crate::model::Endpoint { address: addr.into(), port: 80, weight: 1, labels: Default::default() };
    let value = super::super::decode::Instances { endpoints: vec![ep], nodes: BTreeSet::from(["n1".to_string()]) };
    Read { name: "web".into(), seq, min_index, named: false, unresolved: 0, result: Ok(Indexed { value, index }) }
}

#[tokio::test]
async fn a_catalog_index_that_goes_back_is_a_reset_resynced_and_judged() {
    let mut sup = supervisor(ctx(1, 8));
    let catalog = |index| catalog_answer(&["web"], index);
    sup.on_catalog(catalog(100));
    assert!(sup.resync_at.is_none() && sup.resync_kind.is_none());
    // A snapshot restore: the detector's next answer is far below.
    sup.on_catalog(catalog(40));
    assert!(sup.resync_at.is_some_and(|at| at <= Instant::now() + INDEX_RESET_RESYNC), "a resync, soon");
    assert_eq!(sup.resync_kind, Some(RepairKind::IndexReset), "what it corrects is counted as a reset");
    assert_eq!(sup.catalog_index, 100, "the old answer is not applied");
}

#[tokio::test]
async fn a_stale_answer_is_refused_read_again_and_counted() {
    let sink = Arc::new(NullSink::default());
    let mut sup = supervisor(ctx_with(1, 8, sink.clone()));
    sup.services.insert("web".into(), Tracked::default());
    assert!(sup.apply_read(answer(1, 0, 10, "10.0.0.1"), true), "the first read is sent");
    // A sweep's probe saw index 20; the read answered 15, from a server
    // behind: keep what was sent, and read again.
    assert!(!sup.apply_read(answer(2, 20, 15, "10.0.0.9"), true), "a stale answer is not sent");
    sup.update_degraded();
    assert!(sup.retry_at.is_some(), "read again with the backoff");
    assert_eq!(sup.min_wanted.get("web"), Some(&20), "the re-read must reach the probe's index");
    assert_eq!(sup.services["web"].sent.as_ref().unwrap().endpoints[0].address, "10.0.0.1");
    assert!(sup.apply_read(answer(3, 20, 21, "10.0.0.2"), true), "the fresh answer is sent");
    assert_eq!(*sink.drift.lock().unwrap(), [(RepairKind::StaleRead, "web.dc1.consul".to_string())]);
    sup.update_degraded();
    assert!(sup.retry_at.is_none(), "nothing left to read again");
}

#[tokio::test]
async fn the_anti_entropy_listing_repairs_what_no_index_announced() {
    let sink = Arc::new(NullSink::default());
    let mut sup = supervisor(ctx_with(1, 8, sink.clone()));
    for i in 0..5 {
        sup.in_flight.insert(format!("busy{i}"), false);
    }
    let catalog = |names: &[&str], index| Indexed {
        value: names.iter().map(|n| (n.to_string(), vec![])).collect::<BTreeMap<_, _>>(),
        index,
    };
    sup.on_catalog(catalog_answer(&["web"], 50));
    sup.services.get_mut("web").unwrap().sent = Some(sup.ctx.naming.service("web", vec![], None));
    // Newer than the detector's view: the detector will bring it.
    sup.on_event(Event::Listed(Ok(catalog(&["web", "api"], 51))));
    assert!(sink.drift.lock().unwrap().is_empty() && !sup.services.contains_key("api"));
    // At the detector's own index, the token now sees "api" and no longer
    // "web" (an ACL change): both repaired, and counted.
    sup.on_event(Event::Listed(Ok(catalog(&["api"], 50))));
    let mut drift = sink.drift.lock().unwrap().clone();
    drift.sort();
    assert_eq!(
        drift,
        [(RepairKind::MissedChange, "api.dc1.consul".into()), (RepairKind::MissedChange, "web.dc1.consul".into())]
    );
    assert!(sup.services.contains_key("api") && !sup.services.contains_key("web"));
    assert!(sup.queue.contains(&"api".to_string()), "api is read");
}

#[tokio::test]
async fn a_catalog_body_is_decoded_only_when_it_differs_from_what_was_applied() {
    let mut sup = supervisor(ctx(1, 8));
    sup.on_catalog(catalog_answer(&["web", "api"], 10));
    assert_eq!(sup.services.keys().collect::<Vec<_>>(), ["api", "web"]);
    // An instance added: the same body at a new index. Members are left
    // as they are (a service dropped by hand stays dropped), and the move
    // is still swept.
    sup.services.remove("api");
    sup.unswept = None;
    sup.sweep_due = None;
    sup.last_sweep = None;
    sup.on_catalog(catalog_answer(&["web", "api"], 11));
    assert_eq!(sup.services.keys().collect::<Vec<_>>(), ["web"], "the same body is not applied again");
    assert!(sup.sweep_due.is_some() || sup.unswept.is_some(), "the move is swept");
    assert_eq!(sup.catalog_index, 11);
    // The catalog set from elsewhere (the anti-entropy listing at the
    // detector's index, here without "api"): the detector's next body, the
    // same as its last, is applied again, and "api" comes back.
    sup.on_event(Event::Listed(Ok(Indexed { value: BTreeMap::from([("web".to_string(), vec![])]), index: 11 })));
    sup.on_catalog(catalog_answer(&["web", "api"], 12));
    assert_eq!(sup.services.keys().collect::<Vec<_>>(), ["api", "web"]);
    // A body that does not decode changes nothing and asks for a resync.
    sup.on_catalog(Indexed { value: b"{\"web\": 7".to_vec(), index: 13 });
    assert_eq!(sup.services.keys().collect::<Vec<_>>(), ["api", "web"]);
    assert!(sup.resync_at.is_some(), "a full sync reads the catalog again");
}
