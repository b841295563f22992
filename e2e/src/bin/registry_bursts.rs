//! `registry_bursts`: how long the ZooKeeper or Nacos watcher alone takes to
//! converge after a burst of changes, and what a burst costs it, against
//! the real server the bench uses (ZooKeeper 3.8 with Dubbo providers, or
//! rnacos over gRPC; `source e2e/env.sh zookeeper rnacos`), filled with
//! `--services` services × 10 instances. (Consul has its own tool,
//! `consul_bursts`, with check and node changes.)
//!
//! A burst is `--sizes` changes sent back to back, each on a random service
//! and instance: the instance removed if present, else added back. After
//! the last write the watcher's view of every service the burst touched
//! must hold exactly the instances the burst left; the time from the last
//! write to that moment is the convergence time. Then the watcher is left
//! until idle, so its CPU holds all the work the burst caused.
//!
//! ```sh
//! cargo run --release -p meshbridge-e2e --bin registry_bursts -- --registry zookeeper --services 10000 --sizes 10,100
//! ```

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge_e2e::bench::inproc::{others_cpu, runtimes, until_idle};
use meshbridge_e2e::bench::registry::{Kind, Registry};
use meshbridge_e2e::convergence::Rng;
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::nacos::NacosWatcher;
use meshbridge_registries::zookeeper::ZookeeperWatcher;
use meshbridge_registries::{RegistryKind, RegistrySpec, Watcher};

const PER: usize = 10;
/// A burst slower than this is reported with its slowest services.
const SLOW: Duration = Duration::from_secs(3);

struct Args {
    kind: Kind,
    services: usize,
    bursts: usize,
    sizes: Vec<usize>,
    seed: u64,
    /// Wait this long after the full sync before the first burst.
    settle: Duration,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        kind: Kind::Zookeeper,
        services: 1000,
        bursts: 20,
        sizes: vec![10, 100],
        seed: 1,
        settle: Duration::ZERO,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().context("missing value");
        match flag.as_str() {
            "--registry" => {
                a.kind = match value()?.as_str() {
                    "zookeeper" => Kind::Zookeeper,
                    "nacos" => Kind::Nacos,
                    other => bail!("--registry: zookeeper or nacos, not {other}"),
                }
            }
            "--services" => a.services = value()?.parse()?,
            "--bursts" => a.bursts = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "--settle" => a.settle = Duration::from_secs(value()?.parse()?),
            "--sizes" => a.sizes = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            _ => bail!(
                "usage: registry_bursts [--registry zookeeper|nacos] [--services N] [--bursts N] [--sizes 10,100] [--seed N] [--settle SECS]"
            ),
        }
    }
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = args()?;
    let (harness, watcher_rt) = runtimes()?;
    let mb = watcher_rt.handle().clone();
    harness.block_on(async move { tokio::spawn(run(args, mb)).await? })
}

fn percentile(v: &[Duration], q: f64) -> f64 {
    v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default().as_secs_f64() * 1e3
}

async fn run(args: Args, mb: tokio::runtime::Handle) -> anyhow::Result<()> {
    let n = args.services;
    let reg = Registry::start(args.kind).await?;
    let t = Instant::now();
    reg.fill(n, PER).await?;
    eprintln!("registry_bursts: {n} services × {PER} registered in {:.1}s", t.elapsed().as_secs_f64());
    // No periodic read inside the run: only change detection counts.
    let quiet = Duration::from_secs(3600);
    let watcher: Box<dyn Watcher> = match args.kind {
        Kind::Zookeeper => {
            let spec = RegistrySpec::new(RegistryKind::Zookeeper, "bench", "127.0.0.1", reg.ports()[0]);
            Box::new(ZookeeperWatcher::new(spec)?.with_resync(quiet))
        }
        _ => {
            let mut spec = RegistrySpec::new(RegistryKind::Nacos2, "bench", "127.0.0.1", reg.ports()[0]);
            spec.nacos_refresh_interval = Some(quiet);
            Box::new(NacosWatcher::new(spec)?)
        }
    };
    let mut rec: Recorder = {
        let _enter = mb.enter();
        Recorder::start(watcher, Duration::from_secs(900))
    };
    let host = |i: usize| match args.kind {
        Kind::Zookeeper => format!("providers:com.bench.Svc{i}:1.0.0:.zookeeper"),
        _ => format!("svc-{i}.DEFAULT-GROUP.public.nacos"),
    };
    let count = |r: &Recorder, i: usize| r.endpoints(&host(i)).map_or(0, |e| e.len());
    rec.until("full sync", |r| (0..n).all(|i| count(r, i) == PER)).await;
    let synced = Instant::now();
    until_idle().await;
    if !args.settle.is_zero() {
        eprintln!("registry_bursts: synced; settling {:?} before the first burst", args.settle);
        rec.idle(args.settle).await;
    }

    let mut present = vec![[true; PER]; n];
    let mut rng = Rng::new(args.seed);
    println!("\nregistry_bursts: {:?} {n} services × {PER}, seed {}", args.kind, args.seed);
    println!(
        "| registry | services | burst | bursts | writes took p50 (ms) | converged after the last write p50 / p99 / max (ms) | watcher CPU per burst (ms) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for &size in &args.sizes {
        let (mut converged, mut sent_took, mut cpu) = (Vec::new(), Vec::new(), Duration::ZERO);
        for _ in 0..args.bursts {
            let mut touched = BTreeSet::new();
            let cpu0 = others_cpu();
            let started = Instant::now();
            for _ in 0..size {
                let (i, j) = (rng.index(n), rng.index(PER));
                present[i][j] = !present[i][j];
                reg.set_instance(i, j, present[i][j]).await?;
                touched.insert(i);
            }
            let sent = Instant::now();
            let want = |i: usize| present[i].iter().filter(|p| **p).count();
            // When each touched service first matched, to name the slow ones.
            let mut matched = std::collections::BTreeMap::new();
            rec.until("burst converged", |r| {
                for &i in &touched {
                    if count(r, i) == want(i) {
                        matched.entry(i).or_insert_with(|| sent.elapsed());
                    } else {
                        matched.remove(&i);
                    }
                }
                matched.len() == touched.len()
            })
            .await;
            converged.push(sent.elapsed());
            if sent.elapsed() > SLOW {
                let mut slow: Vec<_> = matched.iter().filter(|(_, t)| **t > SLOW).collect();
                slow.sort_by_key(|(_, t)| std::cmp::Reverse(**t));
                eprintln!(
                    "registry_bursts: slow burst of {size}, {:.1}s after the full sync: converged after {:?}; slowest services (index, after): {:?}",
                    started.duration_since(synced).as_secs_f64(),
                    sent.elapsed(),
                    &slow[..slow.len().min(10)]
                );
            }
            sent_took.push(sent.duration_since(started));
            until_idle().await;
            cpu += others_cpu().saturating_sub(cpu0);
        }
        converged.sort();
        sent_took.sort();
        println!(
            "| {:?} | {n} | {size} | {} | {:.0} | {:.0} / {:.0} / {:.0} | {:.1} |",
            args.kind,
            args.bursts,
            percentile(&sent_took, 0.5),
            percentile(&converged, 0.5),
            percentile(&converged, 0.99),
            percentile(&converged, 1.0),
            (cpu / args.bursts.max(1) as u32).as_secs_f64() * 1e3,
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("loadavg {}", load.trim());
    Ok(())
}
