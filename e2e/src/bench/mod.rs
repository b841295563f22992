//! The benchmark harness (`cargo run --release -p meshbridge-e2e --bin
//! bench`): real registries filled with `n` services × 10 instances,
//! meshbridge as its own child process (the binary, [`child`]), a real
//! Envoy over delta ADS, and in-process ADS clients; it measures
//! meshbridge's sync, CPU, memory and connections, and the cost and latency
//! of single-instance changes, and prints a table. It never fails on a
//! figure.
//!
//! What each figure means is in BENCHMARKS.md ("Benchmark harness").

pub mod child;
pub mod consul;
pub mod follow;
pub mod inproc;
pub mod kube;
pub mod peer;
pub mod procfs;
pub mod registry;
pub mod report;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use child::Meshbridge;
use procfs::Proc;

use crate::envoy::{AdsMode, Envoy, Stats};
use follow::{Follower, Kind as FollowKind, Tally};
use registry::{Kind, Registry, poll_until};
pub use report::{Peer, Row};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Vec<usize>,
    /// Instances per service.
    pub per: usize,
    /// Single-instance changes per registry and size.
    pub changes: usize,
    /// In-process delta ADS clients besides the real Envoy.
    pub fanout: usize,
    pub registries: Vec<Kind>,
    /// Failing-check rounds against the Consul DNS peer (0: skip).
    pub peer_rounds: usize,
    /// Give up on a full sync after this long.
    pub sync_timeout: Duration,
    /// The meshbridge binary; `None`: [`child::binary`] without building.
    pub meshbridge_bin: Option<PathBuf>,
    /// Environment added to meshbridge's (e.g. `MALLOC_ARENA_MAX=2`).
    pub meshbridge_env: Vec<(String, String)>,
    /// Which statistics the real Envoy keeps. Istio's inclusion list by
    /// default: with all of them, Envoy's main thread spends 150–280 ms of
    /// every 5 s flushing 1.1 million statistics at 10k clusters, and an
    /// xDS response that lands then waits for it (BENCHMARKS.md).
    pub envoy_stats: Stats,
    /// How long meshbridge's CPU is watched with nothing changing, once it
    /// has settled and before the changes (a note on each row).
    pub idle: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sizes: vec![1000],
            per: 10,
            changes: 200,
            fanout: 100,
            registries: vec![Kind::Consul, Kind::Nacos, Kind::Zookeeper],
            peer_rounds: 5,
            sync_timeout: Duration::from_secs(300),
            meshbridge_bin: None,
            meshbridge_env: Vec::new(),
            envoy_stats: Stats::Istio,
            idle: Duration::from_secs(5),
        }
    }
}

/// How long one change may take to show up everywhere.
const CHANGE_LIMIT: Duration = Duration::from_secs(10);
/// Consecutive changes that show up nowhere before a size is given up.
const MAX_MISSES: usize = 5;

/// Run everything and return the report; meshbridge runs as a child
/// process per registry and size.
pub fn run_blocking(mut opts: Options) -> anyhow::Result<String> {
    if opts.meshbridge_bin.is_none() {
        opts.meshbridge_bin = Some(child::binary(false)?);
    }
    let harness = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(procfs::HARNESS_THREAD)
        .enable_all()
        .build()?;
    let rows = harness.block_on(async move { harness_spawn(run(opts)).await })?;
    harness.shutdown_timeout(Duration::from_secs(2));
    Ok(report::render(&rows))
}

async fn harness_spawn<T: Send + 'static>(
    f: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::spawn(f).await?
}

async fn run(opts: Options) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &kind in &opts.registries {
        for &n in &opts.sizes {
            eprintln!("bench: {} with {n} services × {}", kind.name(), opts.per);
            let row = measure(kind, n, &opts).await.unwrap_or_else(|e| {
                let mut row = Row::new(kind, n, opts.per);
                row.notes.push(format!("failed: {e:#}"));
                row
            });
            // Each row as soon as it is measured: a long run stopped
            // halfway still leaves its figures.
            eprint!("{}", report::render(std::slice::from_ref(&row)));
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Before the changes, meshbridge counts as settled once
/// [`SETTLE_QUIET`] seconds in a row each cost it at most this much CPU
/// (seconds per second), or after the limit. One second of at most 20 ms
/// (until run 9) was not enough: the kernel counts CPU in 10 ms ticks, and
/// rnacos's pushes after the 10k subscriptions cost meshbridge 20–50 ms a
/// second for half a minute, which one second read as 20 ms let through.
/// A debug build (the CI smoke run, `tests/bench_smoke.rs`) spends about
/// four times the CPU at rest: the Nacos watcher's 500 ms probe alone
/// costs it 8–10 ms a second, which read as 10 or 20 ms a second never
/// settled and always waited out the limit.
const SETTLE_PROBE: Duration = Duration::from_secs(1);
const SETTLED_CPU: f64 = if cfg!(debug_assertions) { 0.03 } else { 0.01 };
const SETTLE_QUIET: usize = 3;
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// How often the harness asks meshbridge's admin API for its counts while
/// it syncs (each answer is O(registries)).
const SYNC_POLL: Duration = Duration::from_millis(20);

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn measure(kind: Kind, n: usize, opts: &Options) -> anyhow::Result<Row> {
    let per = opts.per;
    let mut row = Row::new(kind, n, per);
    let reg = Registry::start_sized(kind, n * per).await?;
    let t = Instant::now();
    reg.fill(n, per).await?;
    row.fill_s = t.elapsed().as_secs_f64();
    if let Some(c) = reg.consul() {
        peer::register(c).await?;
    }

    let dir = tempfile::tempdir()?;
    // The child's log: in MESHBRIDGE_BENCH_LOGS if set (kept), else in a
    // temp dir removed with the row.
    let logs = tempfile::tempdir()?;
    let log = std::env::var_os("MESHBRIDGE_BENCH_LOGS").map_or_else(
        || logs.path().join("meshbridge.log"),
        |d| PathBuf::from(d).join(format!("meshbridge-{}-{n}.log", kind.name())),
    );
    let bridge = format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n{}",
        reg.bridge_entry()
    );
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge)?;
    let bin = opts.meshbridge_bin.clone().map_or_else(|| child::binary(false), Ok)?;
    let t = Instant::now();
    let mut mb = Meshbridge::start(&bin, dir.path(), log, &opts.meshbridge_env).await?;
    let result = drive(&mb, &reg, &mut row, opts, t).await;
    if let Err(e) = result {
        row.notes.push(format!("stopped: {e:#}"));
        if !mb.is_running() {
            let log = mb.log();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            row.notes.push(format!("meshbridge exited; last lines: {:?}", tail));
        }
    }
    Ok(row)
}

async fn drive(mb: &Meshbridge, reg: &Registry, row: &mut Row, opts: &Options, started: Instant) -> anyhow::Result<()> {
    let (n, per) = (row.services, opts.per);
    let deadline = started + opts.sync_timeout;
    let synced = loop {
        if let Some((s, e)) = mb.counts().await {
            row.seen = (s, e);
            if s >= n && e >= n * per {
                break true;
            }
        }
        if Instant::now() >= deadline {
            break false;
        }
        tokio::time::sleep(SYNC_POLL).await;
    };
    row.sync_s = synced.then(|| started.elapsed().as_secs_f64());
    // Everything the child has used since it started.
    row.cpu_sync_s = mb.proc.cpu();
    row.mem_sync = mb.proc.memory();
    row.connections = mb.proc.connections_to(&reg.ports());
    row.connections_harness = Proc::me().connections_to(&reg.ports());
    if !synced {
        row.notes.push(format!(
            "not synced after {:?}: {} services, {} endpoints",
            opts.sync_timeout, row.seen.0, row.seen.1
        ));
    }

    // Route to no cluster: Envoy takes every cluster over CDS anyway. Envoy
    // is the child's first xDS client: its stream is the one that logs ACKs.
    let t = Instant::now();
    let envoy = Envoy::start_with_stats(mb.xds_addr, AdsMode::Delta, "none", opts.envoy_stats).await?;
    let clusters = row.seen.0;
    let warm = envoy_warm(&envoy, clusters, opts.sync_timeout).await;
    row.envoy_sync_s = warm.then(|| t.elapsed().as_secs_f64());
    row.mem_envoy = mb.proc.memory();
    if let Some(pid) = envoy.pid() {
        let (p, mem) = (Proc::pid(pid), Proc::pid(pid).memory());
        row.notes.push(format!(
            "Envoy itself with {clusters} clusters: RSS {:.0} MiB, CPU {:.1} s since its start",
            mem.rss,
            p.cpu()
        ));
    }

    let sotw = Follower::start(FollowKind::Sotw, mb.xds_addr).await?;
    let delta = Follower::start(FollowKind::Delta, mb.xds_addr).await?;
    let mcp = Follower::start(FollowKind::Mcp, mb.xds_addr).await?;
    let mut fanout = Vec::with_capacity(opts.fanout);
    for _ in 0..opts.fanout {
        fanout.push(Follower::start(FollowKind::Delta, mb.xds_addr).await?);
    }
    let all: Vec<&Follower> = [&sotw, &delta, &mcp].into_iter().chain(fanout.iter()).collect();
    settle(&all, opts.sync_timeout).await;
    row.mem_clients = mb.proc.memory();
    row.notes.push(format!("meshbridge with every client connected: {}", memory_note(&mb.proc)));

    changes(mb, reg, row, opts, &all).await?;
    row.mem_end = mb.proc.memory();
    if let (Some(c), true) = (reg.consul(), opts.peer_rounds > 0) {
        row.peer = Some(peer_rounds(mb, c, opts.peer_rounds).await?);
    }
    drop(envoy);
    Ok(())
}

/// What `smaps_rollup` says the resident memory is, and the thread count.
fn memory_note(p: &Proc) -> String {
    let rollup = p.smaps_rollup();
    let kib = |key: &str| {
        rollup.lines().find_map(|l| l.strip_prefix(key)?.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
    };
    let mib = |key: &str| kib(key).map_or_else(|| "?".into(), |k| format!("{:.0}", k / 1024.0));
    let threads = p.threads().map_or_else(|| "?".into(), |t| t.to_string());
    let file = match (kib("Rss:"), kib("Anonymous:")) {
        (Some(r), Some(a)) => format!("{:.0}", (r - a) / 1024.0),
        _ => "?".into(),
    };
    format!(
        "RSS {} MiB: anonymous {}, file-backed {file} (smaps_rollup); {threads} threads",
        mib("Rss:"),
        mib("Anonymous:")
    )
}

/// Wait until Envoy has `clusters` active clusters and none warming.
pub async fn envoy_warm(envoy: &Envoy, clusters: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cluster_counts(envoy).await.is_some_and(|(active, warming)| active >= clusters && warming == 0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Envoy's active and warming clusters (`cluster_manager` statistics).
pub async fn cluster_counts(envoy: &Envoy) -> Option<(usize, usize)> {
    let stats = envoy.admin("/stats?filter=cluster_manager%5C.(active|warming)_clusters$").await.ok()?;
    let stat =
        |name: &str| stats.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(": ")?.trim().parse::<usize>().ok());
    Some((stat("cluster_manager.active_clusters")?, stat("cluster_manager.warming_clusters")?))
}

/// Wait until every follower has had an update and nothing more has
/// arrived for a second.
pub async fn settle(all: &[&Follower], limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut last = 0;
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        let tallies: Vec<Tally> = all.iter().map(|f| f.tally()).collect();
        let bytes = tallies.iter().map(|t| t.bytes).sum();
        if bytes != last {
            (last, quiet_since) = (bytes, Instant::now());
        } else if tallies.iter().all(|t| t.updates > 0) && quiet_since.elapsed() > Duration::from_secs(1) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn changes(
    mb: &Meshbridge,
    reg: &Registry,
    row: &mut Row,
    opts: &Options,
    all: &[&Follower],
) -> anyhow::Result<()> {
    let (n, per) = (row.services, opts.per);
    let total = opts.changes.min(n * per);
    // Followers that missed a change are not waited for again (noted).
    let mut waited: Vec<bool> = vec![true; all.len()];
    let before_all: Vec<Tally> = all.iter().map(|f| f.tally()).collect();
    // Work the sync started may still be running (Nacos subscribes to every
    // service after its first read, one call each): wait for it to settle,
    // or its CPU is counted against the changes.
    let settling = Instant::now();
    let mut quiet = 0;
    loop {
        let before = mb.proc.cpu();
        tokio::time::sleep(SETTLE_PROBE).await;
        let rate = (mb.proc.cpu() - before) / SETTLE_PROBE.as_secs_f64();
        quiet = if rate <= SETTLED_CPU { quiet + 1 } else { 0 };
        if quiet >= SETTLE_QUIET || settling.elapsed() >= SETTLE_LIMIT {
            row.notes.push(format!(
                "settled before the changes in {:.1} s (CPU {:.0} ms per second at the end)",
                settling.elapsed().as_secs_f64(),
                rate * 1e3
            ));
            break;
        }
    }
    // What meshbridge spends with nothing changing, so that a slow
    // registry's long change window can be told from the changes' own cost.
    let idle_a = mb.proc.cpu();
    tokio::time::sleep(opts.idle).await;
    let rest_rate = (mb.proc.cpu() - idle_a) / opts.idle.as_secs_f64();
    row.notes.push(format!(
        "CPU with no change, over {} s before the changes: {:.1} ms per second",
        opts.idle.as_secs(),
        rest_rate * 1e3
    ));
    let cpu_a = mb.proc.cpu();
    let split_a = mb.proc.cpu_user_sys();
    let window = Instant::now();
    let mut misses = 0;
    for k in 0..total {
        let bare = reg.watch(k % n, CHANGE_LIMIT).await;
        let before: Vec<Tally> = all.iter().map(|f| f.tally()).collect();
        let ti = Instant::now();
        if let Err(e) = reg.change(k, n, per).await {
            // Refused by the registry (e.g. Consul's per-client limit taken
            // by meshbridge): the harness is "another client" locked out.
            bare.abort();
            row.change_errors += 1;
            if row.change_errors == 1 {
                row.notes.push(format!("change {k} refused: {e:#}"));
            }
            misses += 1;
            if misses >= MAX_MISSES {
                row.notes.push(format!("gave up after {MAX_MISSES} changes in a row failed"));
                break;
            }
            continue;
        }
        let updated = |i: usize| all[i].tally().updates > before[i].updates;
        let done = poll_until(CHANGE_LIMIT, Duration::from_millis(1), || {
            mb.envoy_ack_after(ti).is_some() && bare.is_finished() && (0..all.len()).all(|i| !waited[i] || updated(i))
        })
        .await;
        let Some(ack) = mb.envoy_ack_after(ti) else {
            bare.abort();
            misses += 1;
            if misses >= MAX_MISSES {
                row.notes.push(format!("gave up after {MAX_MISSES} changes in a row did not reach Envoy"));
                break;
            }
            continue;
        };
        misses = 0;
        if !done {
            let missed: Vec<usize> = (0..all.len()).filter(|&i| waited[i] && !updated(i)).collect();
            for &i in &missed {
                waited[i] = false;
            }
            if !missed.is_empty() {
                row.notes.push(format!(
                    "{} in-process clients (of {}) had not received change {k} within {CHANGE_LIMIT:?}; not waited for since",
                    missed.len(),
                    all.len()
                ));
            }
        }
        row.done += 1;
        let envoy_ms = ms(ack - ti);
        row.envoy_ms.push(envoy_ms);
        if let Some(own) = mb.envoy_own_after(ti) {
            row.envoy_own_ms.push(ms(own));
        }
        let bare_at = if bare.is_finished() { bare.await.ok().flatten() } else { None };
        if let Some(at) = bare_at {
            let bare_ms = ms(at - ti);
            row.bare_ms.push(bare_ms);
            row.diff_ms.push(envoy_ms - bare_ms);
        }
        // The last of the fan-out clients and Envoy to have the change.
        let last = all[3..]
            .iter()
            .filter_map(|f| f.tally().last)
            .filter(|t| *t > ti)
            .map(|t| ms(t - ti))
            .fold(envoy_ms, f64::max);
        row.fanout_ms.push(last);
        if (k + 1) % 50 == 0 {
            eprintln!("bench: {} {n}: {} changes done", reg.kind.name(), k + 1);
        }
    }
    row.changes = total;
    let done = row.done.max(1) as f64;
    let spent = mb.proc.cpu() - cpu_a;
    row.cpu_per_change_ms = spent * 1e3 / done;
    let split_b = mb.proc.cpu_user_sys();
    // The table's figure is everything spent in the window; a registry
    // whose changes are slow to arrive (rnacos batches its pushes) also
    // pays its rest rate (the Nacos probe) for longer, so the note gives
    // the figure without it too.
    let window_secs = window.elapsed().as_secs_f64();
    let net = (spent - rest_rate * window_secs).max(0.0) * 1e3 / done;
    row.notes.push(format!(
        "CPU per change: user {:.2} ms, system {:.2} ms, over {window_secs:.1} s of changes; \
         {net:.2} ms without the rest rate",
        (split_b.0 - split_a.0) * 1e3 / done,
        (split_b.1 - split_a.1) * 1e3 / done,
    ));
    let bytes = |i: usize| (all[i].tally().bytes - before_all[i].bytes) as f64 / done;
    row.bytes_per_change = [bytes(0), bytes(1), bytes(2)];
    Ok(())
}

async fn peer_rounds(mb: &Meshbridge, consul: &consul::ConsulDev, rounds: usize) -> anyhow::Result<Peer> {
    let envoy = peer::PeerEnvoy::start(consul.dns_port).await?;
    let both = |m: &std::collections::BTreeSet<String>| m.contains(peer::KEPT) && m.contains(peer::FAILED);
    let limit = Duration::from_secs(30);
    let mut out = Peer::default();
    if envoy.until(limit, both).await.is_none() {
        out.note = Some("peer Envoy never resolved both instances".into());
        return Ok(out);
    }
    let check = peer::check_id(peer::FAILED);
    for _ in 0..rounds {
        let ti = Instant::now();
        consul.put(&format!("/v1/agent/check/fail/{check}"), None).await?;
        let dns = envoy.until(limit, |m| m.contains(peer::KEPT) && !m.contains(peer::FAILED));
        let ours = poll_until(limit, Duration::from_millis(1), || mb.envoy_ack_after(ti).is_some());
        let (dns, ours) = tokio::join!(dns, ours);
        if let (Some(dns), true, Some(ack)) = (dns, ours, mb.envoy_ack_after(ti)) {
            out.dns_ms.push(ms(dns - ti));
            out.meshbridge_ms.push(ms(ack - ti));
            if let Some(own) = mb.envoy_own_after(ti) {
                out.envoy_own_ms.push(ms(own));
            }
        }
        consul.put(&format!("/v1/agent/check/pass/{check}"), None).await?;
        envoy.until(limit, both).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(out)
}
