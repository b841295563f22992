//! `bench_profile`: the per-change path alone, for callgrind. A cache with
//! `--services` services × 10 endpoints feeds meshbridge's publisher and
//! ADS server in-process (`meshbridge::testing::XdsFixture`), with
//! `--streams` in-process delta ADS clients following every cluster,
//! `--sotw` Envoy-like SotW clients (CDS, then EDS naming every cluster)
//! and `--mcp` Pilot-like MCP clients (SotW, every collection, wildcard);
//! then `--changes` one-endpoint changes go in through the registry sink,
//! one at a time, each waited for (every follower updated, or with none
//! the new config set published).
//!
//! The CPU figure is the whole process: meshbridge and the in-process
//! followers' decoding. Callgrind's inclusive counts split the two
//! (`meshbridge::` against `meshbridge_e2e::bench::follow`).
//!
//! With `--callgrind`, instrumentation is switched on (`callgrind_control
//! -i on`) only around the changes, so the instruction counts are those of
//! the changes alone:
//!
//! ```sh
//! valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=cg.out \
//!   target/release/bench_profile --services 10000 --changes 20 --streams 100 --callgrind
//! callgrind_annotate cg.out | head -40
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge::testing::XdsFixture;
use meshbridge::translate::envoy::CLUSTER_TYPE;
use meshbridge_e2e::bench::follow::{Follower, Kind};
use meshbridge_e2e::bench::procfs;
use meshbridge_registries::{Endpoint, Protocol, Service, ServicePort, Update};

const PER: usize = 10;

fn service(i: usize, without: Option<usize>) -> Service {
    let endpoints = (0..PER)
        .filter(|j| Some(*j) != without)
        .map(|j| Endpoint { address: format!("10.1.0.{}", j + 1), port: 8080, weight: 1, labels: Default::default() })
        .collect();
    let port = ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() };
    Service::new(format!("svc-{i}.bench.consul"), vec![port], endpoints)
}

fn callgrind(on: bool) -> anyhow::Result<()> {
    let status = std::process::Command::new("callgrind_control")
        .args(["-i", if on { "on" } else { "off" }, &std::process::id().to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("run callgrind_control (is this under valgrind --tool=callgrind?)")?;
    if !status.success() {
        bail!("callgrind_control failed: {status}");
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (mut services, mut changes, mut streams, mut use_callgrind) = (10_000, 200, 100, false);
    let (mut sotw, mut mcp, mut exit_after_sync) = (0, 0, false);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut num = || -> anyhow::Result<usize> { Ok(args.next().context("missing value")?.parse()?) };
        match flag.as_str() {
            "--services" => services = num()?,
            "--changes" => changes = num()?,
            "--streams" => streams = num()?,
            "--sotw" => sotw = num()?,
            "--mcp" => mcp = num()?,
            "--callgrind" => use_callgrind = true,
            "--exit-after-sync" => exit_after_sync = true,
            _ => bail!(
                "usage: bench_profile [--services N] [--changes N] [--streams N] [--sotw N] [--mcp N] [--callgrind] \
                 [--exit-after-sync]"
            ),
        }
    }
    let t = Instant::now();
    let fixture = XdsFixture::start((0..services).map(|i| service(i, None)).collect()).await;
    let mut config = fixture.config.clone();
    // The first set published: what the server holds before any client.
    let clusters = |c: &meshbridge::translate::ConfigSet| c.envoy.get(CLUSTER_TYPE).map_or(0, |t| t.len());
    while clusters(&config.borrow()) < services {
        config.changed().await?;
    }
    let rss = || procfs::Proc::me().memory().rss;
    let rss_published = rss();
    let mut followers = Vec::new();
    let kinds = [(Kind::Delta, streams), (Kind::Sotw, sotw), (Kind::Mcp, mcp)];
    for (kind, n) in kinds {
        for _ in 0..n {
            followers.push((kind, Follower::start(kind, fixture.addr).await?));
        }
    }
    let refs: Vec<&Follower> = followers.iter().map(|(_, f)| f).collect();
    meshbridge_e2e::bench::settle(&refs, Duration::from_secs(3600)).await;
    eprintln!(
        "bench_profile: {services} services, {streams} delta + {sotw} sotw + {mcp} mcp followers synced in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    println!("bench_profile rss_mib published={:.0} with_followers={:.0}", rss_published, rss());
    if exit_after_sync {
        // Everything still held: a heap profiler's "leaked" report is then
        // what the server and the followers hold once in sync.
        std::process::exit(0);
    }
    let bytes_before: Vec<u64> = refs.iter().map(|f| f.tally().bytes).collect();

    if use_callgrind {
        callgrind(true)?;
    }
    let (cpu, t) = (procfs::process_cpu(), Instant::now());
    for k in 0..changes {
        let before: Vec<u64> = refs.iter().map(|f| f.tally().updates).collect();
        config.borrow_and_update();
        fixture.sink.update(Update::Upsert(service(k % services, Some((k / services) % PER))));
        if followers.is_empty() {
            config.changed().await?;
        } else {
            while refs.iter().zip(&before).any(|(f, b)| f.tally().updates <= *b) {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
    }
    // A change may touch more than one type (an MCP ServiceEntry and its
    // WorkloadEntry): let the last responses land inside the window.
    quiet(&refs).await;
    let (cpu, wall) = (procfs::process_cpu() - cpu, t.elapsed());
    if use_callgrind {
        callgrind(false)?;
    }
    println!(
        "bench_profile services={services} streams={streams} changes={changes} wall_ms_per_change={:.3} cpu_ms_per_change={:.3}",
        wall.as_secs_f64() * 1e3 / changes as f64,
        cpu * 1e3 / changes as f64
    );
    for (kind, n) in kinds.into_iter().filter(|(_, n)| *n > 0) {
        let bytes: u64 = followers
            .iter()
            .zip(&bytes_before)
            .filter(|((k, _), _)| *k == kind)
            .map(|((_, f), b)| f.tally().bytes - b)
            .sum();
        println!("  {kind:?}: bytes_per_change_per_stream={}", bytes / (n * changes.max(1)) as u64);
    }
    Ok(())
}

/// Wait until no follower has received anything for 20 ms.
async fn quiet(all: &[&Follower]) {
    let total = || all.iter().map(|f| f.tally().bytes).sum::<u64>();
    let mut last = total();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = total();
        if now == last {
            return;
        }
        last = now;
    }
}
