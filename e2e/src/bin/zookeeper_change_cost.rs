//! `zookeeper_change_cost`: what one change costs the ZooKeeper watcher
//! alone, against a real ZooKeeper 3.8 (`source e2e/env.sh zookeeper`)
//! filled as the bench fills it: `--services` Dubbo interfaces × 10
//! providers. Each change removes one provider of an interface not touched
//! before (the bench's change), is timed from just before the delete to the
//! watcher's update reaching its sink, then the watcher is left until it is
//! idle, so the figure holds all the work the change caused. Then the
//! watcher runs `--resync-rounds` periodic resyncs (period `--resync-secs`)
//! with nothing changing, and their CPU is reported per resync.
//!
//! CPU is the on-CPU time of every thread but the harness's (which writes
//! to ZooKeeper), from `/proc/self/task/*/schedstat`; RSS is the process's
//! (the watcher plus the recorder's copy of every service, as the cache
//! would hold them).
//!
//! ```sh
//! cargo run --release -p meshbridge-e2e --bin zookeeper_change_cost -- --services 10000 --changes 50
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge_e2e::bench::inproc::{others_cpu, runtimes, until_idle};
use meshbridge_e2e::bench::procfs::Proc;
use meshbridge_e2e::bench::registry::{Kind, Registry};
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::zookeeper::ZookeeperWatcher;
use meshbridge_registries::{RegistryKind, RegistrySpec};

const PER: usize = 10;

fn host(i: usize) -> String {
    format!("providers:com.bench.Svc{i}:1.0.0:.zookeeper")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let (mut n, mut changes, mut resync_secs, mut resync_rounds) = (1000usize, 50usize, 5u64, 3u64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut num = || -> anyhow::Result<usize> { Ok(args.next().context("missing value")?.parse()?) };
        match flag.as_str() {
            "--services" => n = num()?,
            "--changes" => changes = num()?,
            "--resync-secs" => resync_secs = num()? as u64,
            "--resync-rounds" => resync_rounds = num()? as u64,
            _ => {
                bail!("usage: zookeeper_change_cost [--services N] [--changes N] [--resync-secs S] [--resync-rounds N]")
            }
        }
    }
    let (harness, watcher_rt) = runtimes()?;
    let mb = watcher_rt.handle().clone();
    let resync = Duration::from_secs(resync_secs.max(1));
    harness.block_on(async move { tokio::spawn(run(n, changes.min(n), resync, resync_rounds, mb)).await? })
}

async fn run(
    n: usize,
    changes: usize,
    resync: Duration,
    rounds: u64,
    mb: tokio::runtime::Handle,
) -> anyhow::Result<()> {
    let reg = Registry::start(Kind::Zookeeper).await?;
    let t = Instant::now();
    reg.fill(n, PER).await?;
    eprintln!("zookeeper_change_cost: {n} services × {PER} registered in {:.1}s", t.elapsed().as_secs_f64());

    let spec = RegistrySpec::new(RegistryKind::Zookeeper, "bench", "127.0.0.1", reg.ports()[0]);
    let count = |r: &Recorder, i: usize| r.endpoints(&host(i)).map_or(0, |e| e.len());
    let start = |resync: Duration| -> anyhow::Result<Recorder> {
        let watcher = ZookeeperWatcher::new(spec.clone())?.with_resync(resync);
        let _enter = mb.enter();
        Ok(Recorder::start(Box::new(watcher), Duration::from_secs(600)))
    };
    // Changes first, under a watcher whose resync never comes.
    let (cpu0, t) = (others_cpu(), Instant::now());
    let mut rec = start(Duration::from_secs(3600))?;
    rec.until("full sync", |r| r.hosts().len() >= n && (0..n).all(|i| count(r, i) == PER)).await;
    let (sync_took, sync_cpu) = (t.elapsed(), others_cpu().saturating_sub(cpu0));
    let rss_sync = Proc::me().memory().rss;
    until_idle().await;

    let (mut latency, mut cpu) = (Vec::new(), Duration::ZERO);
    for k in 0..changes {
        // The bench's order: the first n changes each touch a new service.
        let before = others_cpu();
        let started = Instant::now();
        let i = reg.change(k, n, PER).await?;
        rec.until("the change", |r| count(r, i) == PER - 1).await;
        latency.push(started.elapsed());
        until_idle().await;
        cpu += others_cpu().saturating_sub(before);
    }
    latency.sort();
    drop(rec);

    // Then resyncs with nothing changing, under a watcher of their own.
    let mut rec = start(resync)?;
    rec.until("full sync", |r| r.hosts().len() >= n).await;
    until_idle().await;
    let mark = rec.mark();
    let before = others_cpu();
    rec.idle(resync * rounds as u32 + resync / 2).await;
    let resync_cpu = others_cpu().saturating_sub(before) / rounds.max(1) as u32;
    let snapshots = rec.snapshots_since(mark);
    for e in rec.errors_since(mark) {
        eprintln!("zookeeper_change_cost: error during the resyncs: {e}");
    }
    let peak = Proc::me().memory();

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("\nzookeeper_change_cost: {n} services × {PER}, {changes} changes, loadavg {}", load.trim());
    println!(
        "| services | sync (s) | sync CPU (s) | RSS at sync / end (peak) (MiB) | change latency p50 / max (ms) | watcher CPU per change (ms) | CPU per resync, {} periods of {:?}, {} snapshots (ms) |",
        rounds, resync, snapshots
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let c = latency.len().max(1) as u32;
    println!(
        "| {n} | {:.2} | {:.2} | {:.0} / {:.0} ({:.0}) | {:.1} / {:.1} | {:.3} | {:.1} |",
        sync_took.as_secs_f64(),
        sync_cpu.as_secs_f64(),
        rss_sync,
        peak.rss,
        peak.hwm,
        latency.get(latency.len() / 2).map_or(0.0, |d| ms(*d)),
        latency.last().map_or(0.0, |d| ms(*d)),
        ms(cpu / c),
        ms(resync_cpu),
    );
    Ok(())
}
