//! `eureka_scale`: meshbridge against the real Eureka server at scale, as a
//! new user would run it (issue 36): `--apps` apps × `--instances`
//! instances registered on the e2e server jar (`source e2e/env.sh
//! eureka-server`) with Eureka's *default* caches and delta retention (the
//! jar's `application.properties` is tuned for tests; [`SERVER_DEFAULTS`]
//! puts the defaults back), leases renewed as clients renew them. Then
//! meshbridge, the release binary as its own child process ([`child`]):
//! its sync, then its RSS and CPU every 10 s at rest, under status churn,
//! and at rest again; beside each sample, what `GET /eureka/apps/delta`
//! carries at that moment (the harness fetches it itself: the same cache
//! key meshbridge reads).
//!
//! CPU per poll cycle is the child's CPU over a window divided by the
//! window's 10 s periods (the Eureka watcher's interval), whatever it did
//! in them (deltas, its anti-entropy read every 5 min, xDS work). It never
//! fails on a figure.
//!
//! ```sh
//! source e2e/env.sh eureka-server
//! cargo run --release -p meshbridge-e2e --bin eureka_scale -- --apps 10000 --instances 3
//! ```
//!
//! With a target directory shared between worktrees, cargo may take a
//! binary built from the other tree as fresh: name the one to measure with
//! `MESHBRIDGE_BIN` (BENCHMARKS.md, "Eureka at 10k").

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge_e2e::bench::child::{self, Meshbridge};
use meshbridge_e2e::bench::procfs::Proc;
use meshbridge_e2e::bench::registry::{benchmark_address, bounded};
use meshbridge_e2e::eureka::{EurekaApi, EurekaServer, instance};
use tokio::time::MissedTickBehavior;

const USAGE: &str = "usage: eureka_scale [--apps 10000] [--instances 3] [--rest-secs 300] [--churn-per-sec 10] \
[--churn-secs 60] [--after-secs 120] [--renew-secs 30] [--concurrency 64] [--server-heap-mb 1024] \
[--meshbridge-env KEY=VALUE,...]";

/// Eureka's own defaults (Spring Cloud Netflix 5.0 `EurekaServerConfigBean`,
/// read from the jar's bytecode) for every setting the test tuning in
/// `e2e/eureka-server/src/main/resources/application.properties` changes,
/// but one: `wait-time-in-ms-when-sync-empty` stays 0, or a standalone
/// server that started empty answers 403 for five minutes (a server in
/// service is long past that).
const SERVER_DEFAULTS: [&str; 8] = [
    "--eureka.server.use-read-only-response-cache=true",
    "--eureka.server.response-cache-update-interval-ms=30000",
    "--eureka.server.response-cache-auto-expiration-in-seconds=180",
    "--eureka.server.retention-time-in-m-s-in-delta-queue=180000",
    "--eureka.server.delta-retention-timer-interval-in-ms=30000",
    "--eureka.server.enable-self-preservation=true",
    "--eureka.server.eviction-interval-timer-in-ms=60000",
    "--eureka.server.peer-eureka-nodes-update-interval-ms=600000",
];

/// The Eureka watcher's poll interval (`registries/src/eureka.rs`).
const POLL: Duration = Duration::from_secs(10);
/// How often the child is sampled.
const SAMPLE: Duration = Duration::from_secs(10);
/// Eureka's default lease, renewed every `--renew-secs`.
const LEASE_SECS: u64 = 90;
/// Renewals in flight at once.
const RENEW_CONCURRENCY: usize = 32;
/// A churned instance is put back this long after it was taken out.
const OUT_FOR: Duration = Duration::from_secs(5);
const SYNC_LIMIT: Duration = Duration::from_secs(300);
/// How long the server's read-only cache may take to serve every
/// registration (it is refreshed every 30 s).
const SERVED_LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
struct Opts {
    apps: usize,
    per: usize,
    rest: Duration,
    churn_per_sec: usize,
    churn: Duration,
    after: Duration,
    /// 0: no renewals, leases of an hour instead.
    renew_secs: u64,
    concurrency: usize,
    heap_mb: usize,
    env: Vec<(String, String)>,
}

fn parse(args: &[String]) -> anyhow::Result<Opts> {
    let mut o = Opts {
        apps: 10_000,
        per: 3,
        rest: Duration::from_secs(300),
        churn_per_sec: 10,
        churn: Duration::from_secs(60),
        after: Duration::from_secs(120),
        renew_secs: 30,
        concurrency: 64,
        heap_mb: 1024,
        env: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = || value.parse::<usize>().with_context(|| format!("{flag}: not a number: {value}"));
        let secs = || num().map(|n| Duration::from_secs(n as u64));
        match flag.as_str() {
            "--apps" => o.apps = num()?.max(1),
            "--instances" => o.per = num()?.max(1),
            "--rest-secs" => o.rest = secs()?,
            "--churn-per-sec" => o.churn_per_sec = num()?,
            "--churn-secs" => o.churn = secs()?,
            "--after-secs" => o.after = secs()?,
            "--renew-secs" => o.renew_secs = num()? as u64,
            "--concurrency" => o.concurrency = num()?.max(1),
            "--server-heap-mb" => o.heap_mb = num()?,
            "--meshbridge-env" => o.env = child::parse_env(value)?,
            _ => bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = parse(&args)?;
    eprintln!("eureka_scale: {opts:?}");
    child::run_scale("eureka-scale", |bin| run(opts, bin))
}

/// App `i`'s name and its instance `j`'s id.
fn app(i: usize) -> String {
    format!("BENCH-{i:05}")
}

fn instance_id(i: usize, j: usize) -> String {
    format!("bench-{i}-{j}")
}

/// What the server holds: `apps` × `per` instances, instance `k` being
/// instance `k % per` of app `k / per`.
#[derive(Clone)]
struct Catalog {
    api: EurekaApi,
    apps: usize,
    per: usize,
}

impl Catalog {
    fn total(&self) -> usize {
        self.apps * self.per
    }

    fn at(&self, k: usize) -> (String, String) {
        (app(k / self.per), instance_id(k / self.per, k % self.per))
    }

    async fn register_all(&self, lease_secs: u64, concurrency: usize) -> anyhow::Result<()> {
        let me = self.clone();
        bounded(self.total(), concurrency, move |k| {
            let (api, (name, id)) = (me.api.clone(), me.at(k));
            let mut body = instance(&name, &id, &benchmark_address(k), 8080, "UP");
            body["leaseInfo"]["durationInSecs"] = lease_secs.into();
            async move { api.register(body).await }
        })
        .await
    }

    /// One renewal of every lease; failures are counted, not fatal (a
    /// renewal that fails is a client that missed one).
    async fn renew_all(&self, failed: Arc<AtomicUsize>) {
        let me = self.clone();
        let _ = bounded(self.total(), RENEW_CONCURRENCY, move |k| {
            let (api, (name, id), failed) = (me.api.clone(), me.at(k), failed.clone());
            async move {
                if api.heartbeat(&name, &id).await.is_err() {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
        })
        .await;
    }
}

/// What one `/eureka/apps` or `/eureka/apps/delta` body holds.
#[derive(Debug, Clone, Copy, Default)]
struct Body {
    bytes: usize,
    instances: usize,
    added: usize,
    modified: usize,
    deleted: usize,
}

impl Body {
    fn of(text: &str) -> Body {
        let n = |s: &str| text.matches(s).count();
        Body {
            bytes: text.len(),
            instances: n("\"instanceId\""),
            added: n("\"actionType\":\"ADDED\""),
            modified: n("\"actionType\":\"MODIFIED\""),
            deleted: n("\"actionType\":\"DELETED\""),
        }
    }
}

/// The harness's own reads of the server, as meshbridge reads it (JSON, no
/// compression).
#[derive(Clone)]
struct Reader {
    http: reqwest::Client,
    base: String,
}

impl Reader {
    async fn get(&self, path: &str) -> anyhow::Result<Body> {
        let resp = self.http.get(format!("{}{path}", self.base)).header("Accept", "application/json").send().await?;
        anyhow::ensure!(resp.status().is_success(), "GET {path}: {}", resp.status());
        Ok(Body::of(&resp.text().await?))
    }
}

#[derive(Debug, Clone)]
struct Sample {
    phase: &'static str,
    /// Seconds since meshbridge synced.
    t: f64,
    rss: f64,
    /// Child CPU since the previous sample, ms.
    cpu_ms: f64,
    /// Eureka server CPU since the previous sample, ms.
    server_ms: f64,
    endpoints: Option<usize>,
    delta: Option<Body>,
}

#[derive(Debug, Clone)]
struct Window {
    phase: &'static str,
    secs: f64,
    cpu_s: f64,
    rss_max: f64,
    hwm: f64,
    changes: usize,
}

struct Run {
    mb: Meshbridge,
    server: Proc,
    reader: Reader,
    synced_at: Instant,
    samples: Vec<Sample>,
    windows: Vec<Window>,
    last_cpu: f64,
    last_server: f64,
}

impl Run {
    /// Sample every [`SAMPLE`] for `len`, while `churn` (if any) runs.
    async fn phase(&mut self, phase: &'static str, len: Duration, churn: Option<tokio::task::JoinHandle<usize>>) {
        let (start, cpu0) = (Instant::now(), self.mb.proc.cpu());
        let mut rss_max: f64 = 0.0;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE, SAMPLE);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        while start.elapsed() + Duration::from_millis(500) < len {
            tick.tick().await;
            let s = self.sample(phase).await;
            rss_max = rss_max.max(s.rss);
            eprintln!(
                "eureka_scale: {phase} t={:.0}s RSS {:.0} MiB, CPU {:.0} ms, endpoints {:?}, delta {:?}",
                s.t, s.rss, s.cpu_ms, s.endpoints, s.delta
            );
            self.samples.push(s);
        }
        let changes = match churn {
            Some(h) => h.await.unwrap_or(0),
            None => 0,
        };
        let mem = self.mb.proc.memory();
        self.windows.push(Window {
            phase,
            secs: start.elapsed().as_secs_f64(),
            cpu_s: self.mb.proc.cpu() - cpu0,
            rss_max: rss_max.max(mem.rss),
            hwm: mem.hwm,
            changes,
        });
    }

    async fn sample(&mut self, phase: &'static str) -> Sample {
        let (cpu, server) = (self.mb.proc.cpu(), self.server.cpu());
        let rss = self.mb.proc.memory().rss;
        let s = Sample {
            phase,
            t: self.synced_at.elapsed().as_secs_f64(),
            rss,
            cpu_ms: (cpu - self.last_cpu) * 1e3,
            server_ms: (server - self.last_server) * 1e3,
            endpoints: self.mb.counts().await.map(|c| c.1),
            delta: self.reader.get("/apps/delta").await.ok(),
        };
        (self.last_cpu, self.last_server) = (cpu, server);
        s
    }
}

/// Status churn at `per_sec` changes a second for `len`: instances in
/// turn are taken OUT_OF_SERVICE (a status override) and put back UP
/// ([`OUT_FOR`] later, the override deleted), every change one write the
/// server queues as MODIFIED. Returns the changes made.
fn churn(cat: Catalog, per_sec: usize, len: Duration) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        if per_sec == 0 {
            tokio::time::sleep(len).await;
            return 0;
        }
        let every = Duration::from_secs_f64(1.0 / per_sec as f64);
        let lag = (OUT_FOR.as_secs_f64() / every.as_secs_f64() / 2.0).round() as usize;
        let mut tick = tokio::time::interval(every);
        let (start, mut made, mut out) = (Instant::now(), 0, std::collections::VecDeque::new());
        // Spread over the apps: instance j of app i, i first.
        let pick = |m: usize| (m % cat.apps) * cat.per + (m / cat.apps) % cat.per;
        let mut m = 0;
        while start.elapsed() < len {
            tick.tick().await;
            let ok = if out.len() <= lag {
                let (a, id) = cat.at(pick(m));
                m += 1;
                out.push_back((a.clone(), id.clone()));
                cat.api.set_status(&a, &id, "OUT_OF_SERVICE").await
            } else {
                let (a, id) = out.pop_front().expect("not empty");
                cat.api.delete_override(&a, &id, "UP").await
            };
            made += usize::from(ok.is_ok());
        }
        // The last ones back, off the clock.
        for (a, id) in out {
            let _ = cat.api.delete_override(&a, &id, "UP").await;
        }
        made
    })
}

async fn run(o: Opts, bin: PathBuf) -> anyhow::Result<String> {
    let heap = format!("-Xmx{}m", o.heap_mb);
    let server = EurekaServer::start_with_jvm(&[&heap], &SERVER_DEFAULTS).await?;
    let cat = Catalog { api: server.api.clone(), apps: o.apps, per: o.per };
    let total = cat.total();
    let lease = if o.renew_secs > 0 { LEASE_SECS } else { 3600 };
    let t = Instant::now();
    cat.register_all(lease, o.concurrency).await?;
    let register_s = t.elapsed().as_secs_f64();
    eprintln!("eureka_scale: {total} instances registered in {register_s:.1} s");

    let renew_failed = Arc::new(AtomicUsize::new(0));
    let renew_rounds = Arc::new(AtomicUsize::new(0));
    let renewer = (o.renew_secs > 0).then(|| {
        let (cat, failed, rounds) = (cat.clone(), renew_failed.clone(), renew_rounds.clone());
        let period = Duration::from_secs(o.renew_secs);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let t = Instant::now();
                cat.renew_all(failed.clone()).await;
                rounds.fetch_add(1, Ordering::Relaxed);
                eprintln!("eureka_scale: renewed {total} leases in {:.1} s", t.elapsed().as_secs_f64());
            }
        })
    });

    // The read-only cache serves registrations up to 30 s late: meshbridge
    // starts once the server serves them all, so that its sync is its own.
    let reader = Reader {
        http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?,
        base: format!("http://{}/eureka", server.host_port()),
    };
    let t = Instant::now();
    let full = loop {
        let body = reader.get("/apps").await.unwrap_or_default();
        if body.instances >= total || t.elapsed() > SERVED_LIMIT {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let served_s = t.elapsed().as_secs_f64();

    let dir = tempfile::tempdir()?;
    let logs = tempfile::tempdir()?;
    let log = std::env::var_os("MESHBRIDGE_BENCH_LOGS").map_or_else(
        || logs.path().join("meshbridge.log"),
        |d| PathBuf::from(d).join(format!("meshbridge-eureka-{}.log", o.apps)),
    );
    let bridge = format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n    - {{type: eureka, name: bench, domain: 127.0.0.1, port: {}}}\n",
        server.port
    );
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge)?;
    let server_proc = Proc::pid(server.pid().context("eureka server without a pid")?);
    let t = Instant::now();
    let mb = Meshbridge::start(&bin, dir.path(), log, &o.env).await?;
    let mut seen = (0, 0);
    let synced = loop {
        if let Some(c) = mb.counts().await {
            seen = c;
            if c.0 >= o.apps && c.1 >= total {
                break true;
            }
        }
        if t.elapsed() > SYNC_LIMIT {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let sync_s = t.elapsed().as_secs_f64();
    let (sync_cpu, sync_mem) = (mb.proc.cpu(), mb.proc.memory());
    eprintln!("eureka_scale: synced={synced} in {sync_s:.2} s, {seen:?}, RSS {:.0} MiB", sync_mem.rss);

    let mut run = Run {
        last_cpu: mb.proc.cpu(),
        last_server: server_proc.cpu(),
        mb,
        server: server_proc,
        reader,
        synced_at: Instant::now(),
        samples: Vec::new(),
        windows: Vec::new(),
    };
    run.phase("rest", o.rest, None).await;
    if !o.churn.is_zero() {
        run.phase("churn", o.churn, Some(churn(cat.clone(), o.churn_per_sec, o.churn))).await;
    }
    if !o.after.is_zero() {
        run.phase("after", o.after, None).await;
    }
    if let Some(r) = renewer {
        r.abort();
    }
    let alive = run.mb.is_running();

    let mut out = String::new();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    writeln!(out, "\neureka_scale: {} apps × {} instances, loadavg {}", o.apps, o.per, load.trim())?;
    writeln!(out, "server settings: {} -Xmx{}m; leases {lease} s", SERVER_DEFAULTS.join(" "), o.heap_mb)?;
    if o.renew_secs > 0 {
        writeln!(
            out,
            "renewals: every {} s, {} rounds, {} failed",
            o.renew_secs,
            renew_rounds.load(Ordering::Relaxed),
            renew_failed.load(Ordering::Relaxed)
        )?;
    }
    if !alive {
        writeln!(out, "**meshbridge exited during the run**; last lines:\n{}", tail(&run.mb.log(), 5))?;
    }
    writeln!(
        out,
        "\n| apps × instances | registered (s) | server serves all after (s) | full body (MB) | sync (s) | sync CPU (s) | RSS at sync (MiB) |"
    )?;
    writeln!(out, "| --- | --- | --- | --- | --- | --- | --- |")?;
    writeln!(
        out,
        "| {} × {} | {register_s:.1} | {served_s:.1} | {:.1} | {} | {sync_cpu:.2} | {:.0} |",
        o.apps,
        o.per,
        full.bytes as f64 / 1e6,
        if synced { format!("{sync_s:.2}") } else { format!("not synced: {seen:?}") },
        sync_mem.rss,
    )?;

    writeln!(
        out,
        "\n| window | length (s) | status changes | CPU (s) | share of a core | CPU per 10 s poll (ms) | RSS max sampled (MiB) | VmHWM at end (MiB) |"
    )?;
    writeln!(out, "| --- | --- | --- | --- | --- | --- | --- | --- |")?;
    for w in &run.windows {
        writeln!(
            out,
            "| {} | {:.0} | {} | {:.2} | {:.2} % | {:.0} | {:.0} | {:.0} |",
            w.phase,
            w.secs,
            w.changes,
            w.cpu_s,
            w.cpu_s / w.secs * 100.0,
            w.cpu_s * 1e3 / (w.secs / POLL.as_secs_f64()),
            w.rss_max,
            w.hwm
        )?;
    }

    writeln!(
        out,
        "\n| since sync (s) | window | RSS (MiB) | meshbridge CPU, last 10 s (ms) | Eureka CPU, last 10 s (ms) | endpoints | delta instances (added / modified / deleted) | delta body (KB) |"
    )?;
    writeln!(out, "| --- | --- | --- | --- | --- | --- | --- | --- |")?;
    for s in &run.samples {
        let delta = s.delta.map_or_else(
            || ("failed".to_string(), "-".to_string()),
            |d| {
                (
                    format!("{} ({} / {} / {})", d.instances, d.added, d.modified, d.deleted),
                    format!("{:.1}", d.bytes as f64 / 1e3),
                )
            },
        );
        writeln!(
            out,
            "| {:.0} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            s.t,
            s.phase,
            s.rss,
            s.cpu_ms,
            s.server_ms,
            s.endpoints.map_or_else(|| "-".into(), |e| e.to_string()),
            delta.0,
            delta.1
        )?;
    }
    Ok(out)
}

fn tail(log: &str, n: usize) -> String {
    let mut lines: Vec<&str> = log.lines().rev().take(n).collect();
    lines.reverse();
    lines.join("\n")
}
