//! `anti_entropy_cost`: what the anti-entropy pass ([`meshbridge_registries::repair`])
//! costs the Consul watcher, and Consul, at rest, against a real Consul 1.8
//! dev agent (`source e2e/env.sh consul`) with `--services` services × 10
//! instances, each with a passing check.
//!
//! The watcher runs in this process with its periodic sweep an hour away
//! and the pass every `--interval` (default 60 s). After the first sync,
//! one window before the first pass gives the cost at rest without it;
//! then exactly one interval, the first pass's, gives its cost. Reported
//! per pass, and as the average share of one core the pass costs at the
//! default interval (5 min): what a pass costs is the same whatever the
//! interval, since it reads every service once.
//!
//! - **watcher CPU**: on-CPU time of every thread but the harness's
//!   (`/proc/self/task/*/schedstat`);
//! - **Consul CPU**: the agent's utime + stime (`/proc/PID/stat`, 10 ms ticks);
//! - **answers** and **bytes**: Consul answers the watcher read, and their bodies.
//!
//! ```sh
//! cargo run --release -p meshbridge-e2e --bin anti_entropy_cost -- --services 1000
//! cargo run --release -p meshbridge-e2e --bin anti_entropy_cost -- --services 10000
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge_e2e::bench::consul::{ConsulDev, PER};
use meshbridge_e2e::bench::inproc::{others_cpu, runtimes, until_idle};
use meshbridge_e2e::bench::procfs::Proc;
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::consul::{ConsulWatcher, answers_read};
use meshbridge_registries::repair::DEFAULT_INTERVAL;
use meshbridge_registries::{RegistryKind, RegistrySpec};

/// What was used so far: (watcher CPU, Consul CPU seconds, answers, bytes).
fn usage(consul: &Proc) -> (Duration, f64, u64, u64) {
    let (answers, bytes) = answers_read();
    (others_cpu(), consul.cpu(), answers, bytes)
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (mut n, mut interval) = (1000usize, 60u64);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut num = || -> anyhow::Result<u64> { Ok(args.next().context("missing value")?.parse()?) };
        match flag.as_str() {
            "--services" => n = num()? as usize,
            "--interval" => interval = num()?,
            _ => bail!("usage: anti_entropy_cost [--services N] [--interval SECONDS]"),
        }
    }
    let (harness, watcher_rt) = runtimes()?;
    let mb = watcher_rt.handle().clone();
    let interval = Duration::from_secs(interval.max(5));
    harness.block_on(async move { tokio::spawn(run(n, interval, mb)).await? })
}

async fn run(n: usize, interval: Duration, mb: tokio::runtime::Handle) -> anyhow::Result<()> {
    let consul = ConsulDev::start().await?;
    let agent = Proc::pid(consul.pid().context("consul pid")?);
    let t = Instant::now();
    consul.fill(n, true).await?;
    eprintln!("anti_entropy_cost: {n} services × {PER} registered in {:.1}s", t.elapsed().as_secs_f64());

    let mut spec = RegistrySpec::new(RegistryKind::Consul, "bench", "127.0.0.1", consul.http_port);
    spec.consul_datacenter = Some("dc1".into());
    spec.consul_refresh_interval = Some(Duration::from_secs(3600));
    spec.anti_entropy_interval = Some(interval);
    let started = Instant::now();
    let mut rec: Recorder = {
        let _enter = mb.enter();
        Recorder::start(Box::new(ConsulWatcher::new(spec)?), Duration::from_secs(600))
    };
    let count = |r: &Recorder, i: usize| r.endpoints(&format!("svc-{i}.dc1.consul")).map_or(0, |e| e.len());
    rec.until("full sync", |r| r.hosts().len() >= n && (0..n).all(|i| count(r, i) == PER)).await;
    let synced = started.elapsed();
    eprintln!("anti_entropy_cost: watcher synced in {:.1}s", synced.as_secs_f64());
    until_idle().await;
    // At rest, before the first pass (it starts one interval after the watcher).
    let rest_from = (Instant::now(), usage(&agent));
    let first_pass = started + interval;
    let rest_until = first_pass.checked_sub(Duration::from_millis(500)).context("interval too short")?;
    anyhow::ensure!(
        rest_until > rest_from.0 + Duration::from_secs(2),
        "the sync took most of the interval: raise --interval"
    );
    tokio::time::sleep_until(rest_until.into()).await;
    let rest_to = (Instant::now(), usage(&agent));
    // One whole interval from the pass's start: the pass and the rest.
    tokio::time::sleep_until(first_pass.into()).await;
    let pass_from = usage(&agent);
    tokio::time::sleep(interval).await;
    let pass_to = usage(&agent);
    rec.idle(Duration::from_millis(10)).await;
    let repairs = rec.repairs_since(0).len();

    let rest_secs = rest_to.0.duration_since(rest_from.0).as_secs_f64();
    let rest_cpu = (rest_to.1.0.saturating_sub(rest_from.1.0)).as_secs_f64() / rest_secs * interval.as_secs_f64();
    let rest_consul = (rest_to.1.1 - rest_from.1.1) / rest_secs * interval.as_secs_f64();
    let pass_cpu = (pass_to.0.saturating_sub(pass_from.0)).as_secs_f64() - rest_cpu;
    let pass_consul = (pass_to.1 - pass_from.1) - rest_consul;
    let answers = pass_to.2 - pass_from.2;
    let bytes = pass_to.3 - pass_from.3;
    let share = |cpu: f64| cpu / DEFAULT_INTERVAL.as_secs_f64() * 100.0;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "\nanti_entropy_cost: Consul 1.8, {n} services × {PER}, pass measured at --interval {}s, loadavg {}",
        interval.as_secs(),
        load.trim()
    );
    println!(
        "| registry | services | answers per pass | body MB per pass | watcher CPU per pass (ms) | watcher share of a core at 5 min | Consul CPU per pass (ms) | Consul share at 5 min | repairs |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| Consul | {n} | {answers} | {:.1} | {:.0} | {:.3} % | {:.0} | {:.3} % | {repairs} |",
        bytes as f64 / 1e6,
        pass_cpu * 1e3,
        share(pass_cpu),
        pass_consul * 1e3,
        share(pass_consul),
    );
    Ok(())
}
