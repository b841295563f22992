//! `consul_change_cost`: what one change costs the Consul watcher alone,
//! by kind of change, against a real Consul 1.8 (`source e2e/env.sh
//! consul`) with `--services` services × 10 instances, each instance with a
//! passing catalog check (`--no-checks`: none).
//!
//! Per round, on a service not touched before: its first instance's check
//! fails, then passes again, then the instance is deregistered, then
//! registered again (`--pattern repeat`, the default: after the first, each
//! change is on a service that just changed, as in a rolling deploy). With
//! `--pattern distinct`, the deregistration and the registration are each
//! on a service no change touched before (the registration adds an 11th
//! instance), so no "recently changed" order can help. Each change is timed from just before the write to the
//! watcher's update reaching its sink, then the watcher is left until it is
//! idle, so the figures hold all the work the change caused (a sweep
//! included):
//!
//! - **CPU**: on-CPU time of every thread but the harness's, from
//!   `/proc/self/task/*/schedstat` (nanoseconds, not 10 ms ticks);
//! - **answers** and **bytes**: Consul answers the watcher read and their
//!   body bytes ([`answers_read`]; each answer also carries ~250 bytes of
//!   headers).
//!
//! ```sh
//! cargo run --release -p meshbridge-e2e --bin consul_change_cost -- --services 10000 --rounds 10
//! cargo run --release -p meshbridge-e2e --bin consul_change_cost -- --services 10000 --rounds 10 --pattern distinct
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge_e2e::bench::consul::{ConsulDev, PER, check_op, instance_ops};
use meshbridge_e2e::bench::inproc::{others_cpu, runtimes, until_idle};
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::consul::{ConsulWatcher, answers_read};
use meshbridge_registries::{RegistryKind, RegistrySpec};
use serde_json::{Value, json};

fn host(i: usize) -> String {
    format!("svc-{i}.dc1.consul")
}

/// What the watcher used so far: (CPU of every thread but the harness's,
/// Consul answers, their body bytes).
fn watcher_usage() -> (Duration, u64, u64) {
    let (answers, bytes) = answers_read();
    (others_cpu(), answers, bytes)
}

#[derive(Default)]
struct Tally {
    latency: Vec<Duration>,
    cpu: Duration,
    answers: u64,
    bytes: u64,
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (mut n, mut rounds, mut checks, mut distinct) = (1000usize, 10usize, true, false);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut num = || -> anyhow::Result<usize> { Ok(args.next().context("missing value")?.parse()?) };
        match flag.as_str() {
            "--services" => n = num()?,
            "--rounds" => rounds = num()?,
            "--no-checks" => checks = false,
            "--pattern" => match args.next().as_deref() {
                Some("repeat") => distinct = false,
                Some("distinct") => distinct = true,
                _ => bail!("--pattern: repeat or distinct"),
            },
            _ => {
                bail!("usage: consul_change_cost [--services N] [--rounds N] [--no-checks] [--pattern repeat|distinct]")
            }
        }
    }
    let (harness, watcher_rt) = runtimes()?;
    let mb = watcher_rt.handle().clone();
    harness.block_on(async move { tokio::spawn(run(n, rounds, checks, distinct, mb)).await? })
}

async fn run(n: usize, rounds: usize, checks: bool, distinct: bool, mb: tokio::runtime::Handle) -> anyhow::Result<()> {
    let consul = ConsulDev::start().await?;
    let t = Instant::now();
    consul.fill(n, checks).await?;
    eprintln!(
        "consul_change_cost: {n} services × {PER} (checks: {checks}) registered in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let mut spec = RegistrySpec::new(RegistryKind::Consul, "bench", "127.0.0.1", consul.http_port);
    spec.consul_datacenter = Some("dc1".into());
    let watcher = ConsulWatcher::new(spec)?;
    let t = Instant::now();
    let mut rec: Recorder = {
        let _enter = mb.enter();
        Recorder::start(Box::new(watcher), Duration::from_secs(600))
    };
    let count = |r: &Recorder, i: usize| r.endpoints(&host(i)).map_or(0, |e| e.len());
    rec.until("full sync", |r| r.hosts().len() >= n && (0..n).all(|i| count(r, i) == PER)).await;
    eprintln!("consul_change_cost: watcher synced in {:.1}s", t.elapsed().as_secs_f64());
    until_idle().await;

    let kinds = ["check fails", "check passes", "instance deregistered", "instance registered"];
    let mut tallies: BTreeMap<usize, Tally> = BTreeMap::new();
    let rounds = rounds.min(n / 3);
    for round in 0..rounds {
        // Spread over the catalog: the sweep's order is the services' order.
        let first = round * n / rounds + n / (2 * rounds);
        for (k, kind) in kinds.iter().enumerate() {
            if !checks && k < 2 {
                continue;
            }
            // distinct: the deregistration and the registration each on a
            // service of its own; the registration adds instance PER.
            let (i, j) = match (distinct, k) {
                (true, 2) => (first + 1, 0),
                (true, 3) => (first + 2, PER),
                _ => (first, 0),
            };
            let want = match (distinct, k) {
                (true, 3) => PER + 1,
                _ if k % 2 == 0 => PER - 1,
                _ => PER,
            };
            let (cpu0, answers0, bytes0) = watcher_usage();
            let started = Instant::now();
            match k {
                0 => consul.put("/v1/txn", Some(json!([check_op(i, 0, "critical")]))).await?,
                1 => consul.put("/v1/txn", Some(json!([check_op(i, 0, "passing")]))).await?,
                2 => {
                    let dereg = json!({"Node": "node-0", "ServiceID": format!("svc-{i}-0")});
                    consul.put("/v1/catalog/deregister", Some(dereg)).await?
                }
                _ => consul.put("/v1/txn", Some(Value::from(instance_ops(i, j, checks, "passing")))).await?,
            }
            rec.until(kind, |r| count(r, i) == want).await;
            let latency = started.elapsed();
            until_idle().await;
            let (cpu1, answers1, bytes1) = watcher_usage();
            let tally = tallies.entry(k).or_default();
            tally.latency.push(latency);
            tally.cpu += cpu1.saturating_sub(cpu0);
            tally.bytes += bytes1.saturating_sub(bytes0);
            tally.answers += answers1.saturating_sub(answers0);
        }
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pattern = if distinct { "distinct" } else { "repeat" };
    println!(
        "\nconsul_change_cost: {n} services × {PER}, checks: {checks}, pattern: {pattern}, {rounds} rounds, loadavg {}",
        load.trim()
    );
    println!(
        "| change | services | latency p50 / max (ms) | watcher CPU per change (ms) | answers per change | body bytes per change |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for (k, t) in &mut tallies {
        t.latency.sort();
        let c = t.latency.len().max(1) as u32;
        println!(
            "| {} | {n} | {:.1} / {:.1} | {:.2} | {:.1} | {} |",
            kinds[*k],
            t.latency[t.latency.len() / 2].as_secs_f64() * 1e3,
            t.latency.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
            (t.cpu / c).as_secs_f64() * 1e3,
            t.answers as f64 / f64::from(c),
            t.bytes / u64::from(c),
        );
    }
    Ok(())
}
