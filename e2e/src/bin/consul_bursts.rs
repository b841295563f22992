//! `consul_bursts`: how long the Consul watcher alone takes to converge
//! after a burst of changes, and what a burst costs it, against a real
//! Consul 1.8 (`source e2e/env.sh consul`) with `--services` services × 10
//! instances (instance `j` of every service on `node-j`), each with a
//! passing check.
//!
//! A burst is `--sizes` changes sent back to back, each on a random service
//! and instance (so spread over many services and all nodes): an instance
//! deregistered, registered again, or its check turning critical or
//! passing. After the last write the watcher's view of every service the
//! burst touched must equal what the burst left in Consul; the time from
//! the last write to that moment is the convergence time. Then the watcher
//! is left until idle, so CPU and answers hold all the work the burst
//! caused. A node address change is timed the same way: it moves an
//! instance of every service.
//!
//! ```sh
//! cargo run --release -p meshbridge-e2e --bin consul_bursts -- --services 10000 --bursts 20 --sizes 10,100
//! ```

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge_e2e::bench::consul::{ConsulDev, PER, check_op, instance_ops};
use meshbridge_e2e::bench::inproc::{others_cpu, runtimes, until_idle};
use meshbridge_e2e::convergence::Rng;
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::consul::{ConsulWatcher, answers_read};
use meshbridge_registries::{RegistryKind, RegistrySpec};
use serde_json::{Value, json};

fn host(i: usize) -> String {
    format!("svc-{i}.dc1.consul")
}

/// What each instance is in Consul now.
#[derive(Clone, Copy, PartialEq)]
enum State {
    Passing,
    Critical,
    Gone,
}

struct Args {
    services: usize,
    bursts: usize,
    sizes: Vec<usize>,
    seed: u64,
    /// Probe one request at a time (to measure what pipelining gains).
    no_pipelining: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args { services: 1000, bursts: 20, sizes: vec![10, 100], seed: 1, no_pipelining: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().context("missing value");
        match flag.as_str() {
            "--services" => a.services = value()?.parse()?,
            "--bursts" => a.bursts = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "--sizes" => a.sizes = value()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--no-pipelining" => a.no_pipelining = true,
            _ => {
                bail!("usage: consul_bursts [--services N] [--bursts N] [--sizes 10,100] [--seed N] [--no-pipelining]")
            }
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

/// One row of the table: convergence times after the last write, how long
/// the writes took, and the watcher's CPU and Consul answers.
#[derive(Default)]
struct Row {
    converged: Vec<Duration>,
    sent: Vec<Duration>,
    cpu: Duration,
    answers: u64,
}

impl Row {
    fn print(&mut self, what: &str, n: usize) {
        self.converged.sort();
        self.sent.sort();
        let c = self.converged.len().max(1);
        let at = |v: &[Duration], q: f64| {
            v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default().as_secs_f64() * 1e3
        };
        println!(
            "| {what} | {n} | {} | {:.0} | {:.0} / {:.0} / {:.0} | {:.1} | {:.0} |",
            self.converged.len(),
            at(&self.sent, 0.5),
            at(&self.converged, 0.5),
            at(&self.converged, 0.99),
            at(&self.converged, 1.0),
            (self.cpu / c as u32).as_secs_f64() * 1e3,
            self.answers as f64 / c as f64,
        );
    }
}

async fn run(args: Args, mb: tokio::runtime::Handle) -> anyhow::Result<()> {
    let n = args.services;
    let consul = ConsulDev::start().await?;
    let t = Instant::now();
    consul.fill(n, true).await?;
    eprintln!("consul_bursts: {n} services × {PER} registered in {:.1}s", t.elapsed().as_secs_f64());
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "bench", "127.0.0.1", consul.http_port);
    spec.consul_datacenter = Some("dc1".into());
    // No periodic sweep inside the run: only change detection counts.
    spec.consul_refresh_interval = Some(Duration::from_secs(3600));
    let mut rec: Recorder = {
        let _enter = mb.enter();
        let watcher = ConsulWatcher::new(spec)?;
        let watcher = if args.no_pipelining { watcher.without_pipelining() } else { watcher };
        Recorder::start(Box::new(watcher), Duration::from_secs(600))
    };
    let count = |r: &Recorder, i: usize| r.endpoints(&host(i)).map_or(0, |e| e.len());
    rec.until("full sync", |r| r.hosts().len() >= n && (0..n).all(|i| count(r, i) == PER)).await;
    until_idle().await;

    let mut state = vec![[State::Passing; PER]; n];
    let mut address: Vec<String> = (0..PER).map(|j| format!("10.1.0.{}", j + 1)).collect();
    let expected = |state: &[[State; PER]], address: &[String], i: usize| -> Vec<String> {
        let mut e: Vec<String> =
            (0..PER).filter(|j| state[i][*j] == State::Passing).map(|j| format!("{}:8080", address[j])).collect();
        e.sort();
        e
    };
    let view = |r: &Recorder, i: usize| {
        let mut e = r.endpoints(&host(i)).unwrap_or_default();
        e.sort();
        e
    };
    let mut rng = Rng::new(args.seed);
    let mut rows = Vec::new();
    for &size in &args.sizes {
        let mut row = Row::default();
        for _ in 0..args.bursts {
            let mut touched = BTreeSet::new();
            let mut writes: Vec<(&str, Value)> = Vec::with_capacity(size);
            for _ in 0..size {
                let (i, j) = (rng.below(n as u64) as usize, rng.below(PER as u64) as usize);
                touched.insert(i);
                let (next, write) = match state[i][j] {
                    State::Passing if rng.chance(0.5) => (
                        State::Gone,
                        (
                            "/v1/catalog/deregister",
                            json!({"Node": format!("node-{j}"), "ServiceID": format!("svc-{i}-{j}")}),
                        ),
                    ),
                    State::Passing => (State::Critical, ("/v1/txn", json!([check_op(i, j, "critical")]))),
                    State::Critical => (State::Passing, ("/v1/txn", json!([check_op(i, j, "passing")]))),
                    State::Gone => (State::Passing, ("/v1/txn", Value::from(instance_ops(i, j, true, "passing")))),
                };
                state[i][j] = next;
                writes.push(write);
            }
            let (cpu0, (answers0, _)) = (others_cpu(), answers_read());
            let started = Instant::now();
            for (path, body) in writes {
                consul.put(path, Some(body)).await?;
            }
            let sent = Instant::now();
            rec.until("burst converged", |r| touched.iter().all(|&i| view(r, i) == expected(&state, &address, i)))
                .await;
            row.converged.push(sent.elapsed());
            row.sent.push(sent.duration_since(started));
            until_idle().await;
            row.cpu += others_cpu().saturating_sub(cpu0);
            row.answers += answers_read().0.saturating_sub(answers0);
        }
        rows.push((format!("burst of {size}"), row));
    }
    // A node's address changes: every service has an instance there.
    let mut row = Row::default();
    for round in 0..3usize {
        let j = round % PER;
        let moved = format!("10.1.0.{}", 100 + round);
        let (cpu0, (answers0, _)) = (others_cpu(), answers_read());
        let started = Instant::now();
        consul.put("/v1/catalog/register", Some(json!({"Node": format!("node-{j}"), "Address": moved}))).await?;
        let sent = Instant::now();
        address[j] = moved;
        rec.until("node change converged", |r| (0..n).all(|i| view(r, i) == expected(&state, &address, i))).await;
        row.converged.push(sent.elapsed());
        row.sent.push(sent.duration_since(started));
        until_idle().await;
        row.cpu += others_cpu().saturating_sub(cpu0);
        row.answers += answers_read().0.saturating_sub(answers0);
    }
    rows.push(("node address changed".into(), row));

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pipelining = if args.no_pipelining { "off" } else { "on" };
    println!(
        "\nconsul_bursts: {n} services × {PER}, seed {}, probes pipelined: {pipelining}, loadavg {}",
        args.seed,
        load.trim()
    );
    println!(
        "| change | services | bursts | writes took p50 (ms) | converged after the last write p50 / p99 / max (ms) | watcher CPU per burst (ms) | Consul answers per burst |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (what, mut row) in rows {
        row.print(&what, n);
    }
    Ok(())
}
