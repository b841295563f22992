//! `nacos_scale`: meshbridge against the real Nacos 3.1 server at scale
//! (issue 36), beside rnacos. The server is started on free ports in a temp
//! dir (`source e2e/env.sh nacos-server`; `--server rnacos` for rnacos),
//! the real server's JVM with its default JIT and `--server-heap-mb` of heap
//! (the tests' C1-only, 320 MB JVM is for start-up, not for serving), and
//! filled with `--services` × `--instances` persistent instances. Then, for
//! each of `--transports` (`nacos2`: gRPC, `nacos`: the 1.x HTTP API), the
//! release meshbridge as its own child ([`child`]) and a real Envoy over
//! delta ADS, started together:
//!
//! - the full sync: meshbridge start → its cache holds every endpoint, and
//!   → Envoy has every cluster active (its EDS answered); the server's CPU
//!   and meshbridge's over it;
//! - before meshbridge, the server's own answer time: every service read
//!   by the harness (`ServiceQueryRequest` over gRPC, `GET
//!   /nacos/v1/ns/instance/list` over HTTP) 8 at a time (meshbridge's
//!   reads in flight) and 64 at a time, so the sync can be split into the
//!   server's reads and the rest;
//! - RSS and CPU at rest, `--rest-secs` starting `--settle-secs` after the
//!   sync;
//! - single changes: an instance disabled, then enabled again (the v3
//!   admin API on Nacos), one at a time, each timed from the write to
//!   Envoy's EDS ACK and, beside it, to the push a plain subscriber of the
//!   harness's own (`meshbridge_registries::nacos::testing`, one gRPC
//!   connection, subscribed to the changed services) receives: the
//!   server's push delay. meshbridge's CPU over the changes, per change;
//! - new services: one registered (its instances in parallel), timed to
//!   Envoy's cluster being active; each registration a different part of
//!   5 s after the previous service showed, so that the watcher's probe
//!   period is sampled at every phase, not always just after a probe.
//!
//! Over HTTP a change waits for the next full read (`nacosRefreshInterval`,
//! 30 s), so fewer changes are made (`--http-changes`). It never fails on a
//! figure; every figure is also printed as a `FIGURE` line.
//!
//! ```sh
//! source e2e/env.sh nacos-server envoy rnacos
//! cargo run --release -p meshbridge-e2e --bin nacos_scale -- --services 10000
//! ```

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meshbridge_e2e::bench::child::{self, Meshbridge};
use meshbridge_e2e::bench::procfs::Proc;
use meshbridge_e2e::bench::registry::{benchmark_address, bounded, poll_until};
use meshbridge_e2e::bench::report::quantile;
use meshbridge_e2e::bench::{cluster_counts, envoy_warm};
use meshbridge_e2e::envoy::{AdsMode, Envoy, Stats};
use meshbridge_e2e::nacos::{Api, Instance, Rnacos};
use meshbridge_e2e::nacos_server::NacosServer;
use meshbridge_registries::nacos::testing::{Pushed, Subscriber};

const USAGE: &str = "usage: nacos_scale [--services 1000] [--instances 10] [--server nacos|rnacos] \
[--transports nacos2,nacos] [--changes 100] [--http-changes 4] [--new-services 3] [--settle-secs 60] \
[--rest-secs 60] [--server-heap-mb 0 (auto)] [--server-jvm 'FLAGS'] [--concurrency 32] [--reads true|false] \
[--meshbridge-env KEY=VALUE,...]";

const GROUP: &str = "DEFAULT_GROUP";
const NAMESPACE: &str = "public";
const SYNC_LIMIT: Duration = Duration::from_secs(600);
const CALL: Duration = Duration::from_secs(30);
/// A change over gRPC shows within this, or it is counted missed.
const CHANGE_LIMIT: Duration = Duration::from_secs(10);
/// Over HTTP a change waits for the next full read (30 s) and that read.
const HTTP_CHANGE_LIMIT: Duration = Duration::from_secs(90);
const NEW_SERVICE_LIMIT: Duration = Duration::from_secs(90);
/// The span over which new services' registrations are spread.
const NEW_SERVICE_SPREAD: Duration = Duration::from_secs(5);
/// The plain subscriber's health checks, as the Java client's.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// The reads in flight the answer-time probe compares: meshbridge's
/// (`CONCURRENCY` in registries/src/nacos.rs) and many more, twice: the
/// first pass runs on a server whose JIT has not compiled its read path
/// yet (registrations do not warm it), the second on a warm one, as
/// meshbridge's sync finds it after them.
const PROBE_IN_FLIGHT: [usize; 4] = [8, 64, 8, 64];

#[derive(Debug, Clone, Copy, PartialEq)]
enum ServerKind {
    Nacos,
    Rnacos,
}

#[derive(Debug, Clone)]
struct Opts {
    services: usize,
    per: usize,
    server: ServerKind,
    transports: Vec<String>,
    changes: usize,
    http_changes: usize,
    new_services: usize,
    settle: Duration,
    rest: Duration,
    /// 0: [`heap_mb`] of the catalog.
    heap_mb: usize,
    /// The Nacos JVM's flags instead of the sized heap and G1 (e.g. the
    /// tests' C1-only 320 MB JVM, to compare).
    jvm: Option<Vec<String>>,
    concurrency: usize,
    /// Time the server's answers before meshbridge starts (`--reads
    /// false`: meshbridge starts right after the registrations, on a
    /// server whose read path is cold).
    reads: bool,
    env: Vec<(String, String)>,
}

fn parse(args: &[String]) -> anyhow::Result<Opts> {
    let mut o = Opts {
        services: 1000,
        per: 10,
        server: ServerKind::Nacos,
        transports: vec!["nacos2".into(), "nacos".into()],
        changes: 100,
        http_changes: 4,
        new_services: 3,
        settle: Duration::from_secs(60),
        rest: Duration::from_secs(60),
        heap_mb: 0,
        jvm: None,
        concurrency: 32,
        reads: true,
        env: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = || value.parse::<usize>().with_context(|| format!("{flag}: not a number: {value}"));
        let secs = || num().map(|n| Duration::from_secs(n as u64));
        match flag.as_str() {
            "--services" => o.services = num()?.max(1),
            "--instances" => o.per = num()?.max(1),
            "--server" => {
                o.server = match value.as_str() {
                    "nacos" => ServerKind::Nacos,
                    "rnacos" => ServerKind::Rnacos,
                    _ => bail!("--server: nacos or rnacos, not {value}"),
                }
            }
            "--transports" => {
                o.transports = value.split(',').map(str::to_string).collect();
                if let Some(t) = o.transports.iter().find(|t| !["nacos", "nacos2"].contains(&t.as_str())) {
                    bail!("--transports: nacos2 and/or nacos, not {t}");
                }
            }
            "--changes" => o.changes = num()?,
            "--http-changes" => o.http_changes = num()?,
            "--new-services" => o.new_services = num()?,
            "--settle-secs" => o.settle = secs()?,
            "--rest-secs" => o.rest = secs()?.max(Duration::from_secs(1)),
            "--server-heap-mb" => o.heap_mb = num()?,
            "--server-jvm" => o.jvm = Some(value.split_whitespace().map(str::to_string).collect()),
            "--concurrency" => o.concurrency = num()?.max(1),
            "--reads" => o.reads = value.parse().with_context(|| format!("--reads: true or false, not {value}"))?,
            "--meshbridge-env" => o.env = child::parse_env(value)?,
            _ => bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    Ok(o)
}

/// The server's heap for `instances`: 1 GiB, plus 8 KiB an instance (a
/// persistent instance is held in the naming service, its raft log and
/// its push caches), at most 8 GiB.
fn heap_mb(instances: usize) -> usize {
    (1024 + instances * 8 / 1024).min(8192)
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = parse(&args)?;
    eprintln!("nacos_scale: {opts:?}");
    child::run_scale("nacos-scale", |bin| run(opts, bin))
}

fn service(i: usize) -> String {
    format!("svc-{i:06}")
}

fn instance(i: usize, j: usize, per: usize) -> Instance {
    Instance::new(&service(i), &benchmark_address(i * per + j), 8080)
}

/// The server under test; dropping it stops it and removes its dir.
enum Server {
    Nacos(NacosServer),
    Rnacos(Rnacos),
}

impl Server {
    async fn start(o: &Opts) -> anyhow::Result<Server> {
        Ok(match o.server {
            ServerKind::Nacos => {
                let heap = if o.heap_mb > 0 { o.heap_mb } else { heap_mb(o.services * o.per) };
                let sized = vec![format!("-Xms{heap}m"), format!("-Xmx{heap}m"), "-XX:+UseG1GC".into()];
                let jvm = o.jvm.clone().unwrap_or(sized);
                eprintln!("nacos_scale: Nacos JVM {jvm:?}");
                Server::Nacos(
                    NacosServer::start_with_jvm(&jvm).await.context("start nacos (source e2e/env.sh nacos-server)")?,
                )
            }
            ServerKind::Rnacos => {
                Server::Rnacos(Rnacos::start().await.context("start rnacos (source e2e/env.sh rnacos)")?)
            }
        })
    }

    fn api(&self) -> &Api {
        match self {
            Server::Nacos(n) => n,
            Server::Rnacos(r) => r,
        }
    }

    fn http_port(&self) -> u16 {
        match self {
            Server::Nacos(n) => n.http_port,
            Server::Rnacos(r) => r.http_port,
        }
    }

    fn grpc_port(&self) -> u16 {
        match self {
            Server::Nacos(n) => n.grpc_port(),
            Server::Rnacos(r) => r.grpc_port(),
        }
    }

    fn proc(&self) -> anyhow::Result<Proc> {
        let pid = match self {
            Server::Nacos(n) => n.pid(),
            Server::Rnacos(r) => r.pid(),
        };
        Ok(Proc::pid(pid.context("server without a pid")?))
    }

    fn name(&self) -> &'static str {
        match self {
            Server::Nacos(_) => "nacos-3.1",
            Server::Rnacos(_) => "rnacos",
        }
    }
}

/// Percentile `p` (0–100) of `v`, nearest rank; NaN when empty.
fn pct(v: &[f64], p: f64) -> f64 {
    quantile(v, p / 100.0).unwrap_or(f64::NAN)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The time every service took to read, `in_flight` at a time, and the
/// p50 / p99 of one answer (ms).
#[derive(Debug, Clone, Copy)]
struct ReadAll {
    in_flight: usize,
    total_s: f64,
    p50: f64,
    p99: f64,
    server_cpu_s: f64,
}

async fn read_all<F, Fut>(n: usize, in_flight: usize, server: &Proc, read: F) -> anyhow::Result<ReadAll>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let times = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let (t, cpu) = (Instant::now(), server.cpu());
    let read = Arc::new(read);
    let sink = times.clone();
    bounded(n, in_flight, move |i| {
        let (read, sink) = (read.clone(), sink.clone());
        async move {
            let t = Instant::now();
            read(i).await?;
            sink.lock().unwrap_or_else(PoisonError::into_inner).push(ms(t.elapsed()));
            Ok(())
        }
    })
    .await?;
    let total_s = t.elapsed().as_secs_f64();
    let v = std::mem::take(&mut *times.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(ReadAll { in_flight, total_s, p50: pct(&v, 50.0), p99: pct(&v, 99.0), server_cpu_s: server.cpu() - cpu })
}

/// When the plain subscriber last got a push, by service name.
type Pushes = Arc<Mutex<HashMap<String, Instant>>>;

/// What one transport's run measured.
#[derive(Debug, Default)]
struct Row {
    transport: String,
    cache_s: Option<f64>,
    envoy_s: Option<f64>,
    sync_cpu_s: f64,
    server_sync_cpu_s: f64,
    rss_rest: f64,
    hwm: f64,
    rest_cpu_ms_per_s: f64,
    changes: usize,
    envoy_ms: Vec<f64>,
    bare_ms: Vec<f64>,
    ours_ms: Vec<f64>,
    write_ms: Vec<f64>,
    change_cpu_ms: f64,
    change_cpu_net_ms: f64,
    new_ms: Vec<f64>,
    /// The sync's steps, seconds after meshbridge's first log line.
    timeline: Vec<(&'static str, f64)>,
    notes: Vec<String>,
}

/// The sync's steps in the child's log: what each line marks, and a text
/// the line holds (the first such line counts).
const STEPS: [(&str, &[&str]); 6] = [
    ("connected", &["meshbridge_registries::nacos: connected"]),
    ("registry_answered", &["every registry answered"]),
    ("cds_sent", &["sent delta response", "cluster.v3.Cluster\""]),
    ("eds_sent", &["sent delta response", "ClusterLoadAssignment"]),
    ("cds_ack", &[": ACK ", "cluster.v3.Cluster\""]),
    ("eds_ack", &[": ACK ", "ClusterLoadAssignment"]),
];

/// Seconds into the day of a log line's RFC 3339 timestamp
/// (`2026-11-29T02:44:13.630264Z`).
fn log_secs(line: &str) -> Option<f64> {
    let time = line.get(11..line.find('Z')?)?;
    let mut parts = time.splitn(3, ':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// When each of [`STEPS`] happened, after the child's first line (of its
/// last start: a log kept in `MESHBRIDGE_BENCH_LOGS` is appended to).
fn timeline(log: &str) -> Vec<(&'static str, f64)> {
    let log = log
        .rfind("starting meshbridge")
        .and_then(|at| log.get(log[..at].rfind('\n').map_or(0, |nl| nl + 1)..))
        .unwrap_or(log);
    let Some(start) = log.lines().next().and_then(log_secs) else { return Vec::new() };
    STEPS
        .iter()
        .filter_map(|(step, texts)| {
            let line = log.lines().find(|l| texts.iter().all(|t| l.contains(t)))?;
            Some((*step, log_secs(line)? - start))
        })
        .collect()
}

async fn run(o: Opts, bin: PathBuf) -> anyhow::Result<String> {
    let load_start = loadavg();
    let server = Server::start(&o).await?;
    let server_proc = server.proc()?;
    let (n, per) = (o.services, o.per);
    let api = Arc::new(server.api().clone());

    // Persistent writes can time out while the server's raft group is
    // still electing: the first one is retried until it goes through.
    let first = Instant::now();
    while let Err(e) = api.register(&instance(0, 0, per)).await {
        anyhow::ensure!(first.elapsed() < Duration::from_secs(120), "first registration: {e:#}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let t = Instant::now();
    let cpu = server_proc.cpu();
    let writes = api.clone();
    bounded(n * per, o.concurrency, move |k| {
        let api = writes.clone();
        async move { api.register(&instance(k / per, k % per, per)).await }
    })
    .await?;
    let register_s = t.elapsed().as_secs_f64();
    let register_rate = (n * per) as f64 / register_s;
    let register_cpu = server_proc.cpu() - cpu;
    eprintln!("nacos_scale: {} instances in {register_s:.1} s ({register_rate:.0}/s)", n * per);
    println!(
        "FIGURE nacos_scale_register server={} instances={} s={register_s:.1} per_s={register_rate:.0} server_cpu_s={register_cpu:.1}",
        server.name(),
        n * per
    );

    // The server's own answer time, before meshbridge.
    let mut reads = Vec::new();
    let grpc_addr = format!("127.0.0.1:{}", server.grpc_port());
    let plain = Arc::new(Subscriber::connect(&grpc_addr, NAMESPACE, CALL, |_: Pushed| {}).await?);
    let http = reqwest::Client::builder().timeout(CALL).build()?;
    let list_url = format!("http://127.0.0.1:{}/nacos/v1/ns/instance/list", server.http_port());
    let probes = if o.reads { &PROBE_IN_FLIGHT[..] } else { &[] };
    for (k, &in_flight) in probes.iter().enumerate() {
        let pass = k / 2 + 1;
        let c = plain.clone();
        let grpc = read_all(n, in_flight, &server_proc, move |i| {
            let c = c.clone();
            async move { c.query(GROUP, &service(i), CALL).await.map(drop).map_err(Into::into) }
        })
        .await?;
        let (h, url) = (http.clone(), list_url.clone());
        let over_http = read_all(n, in_flight, &server_proc, move |i| {
            let (h, url) = (h.clone(), url.clone());
            async move {
                let resp = h.get(url).query(&[("serviceName", service(i))]).send().await?;
                anyhow::ensure!(resp.status().is_success(), "instance list: {}", resp.status());
                resp.bytes().await?;
                Ok(())
            }
        })
        .await?;
        for (transport, r) in [("nacos2", grpc), ("nacos", over_http)] {
            println!(
                "FIGURE nacos_scale_reads server={} services={n} pass={pass} transport={transport} in_flight={} s={:.2} p50_ms={:.2} p99_ms={:.2} server_cpu_s={:.2}",
                server.name(),
                r.in_flight,
                r.total_s,
                r.p50,
                r.p99,
                r.server_cpu_s
            );
            reads.push((pass, transport, r));
        }
    }
    drop(plain);

    let mut rows = Vec::new();
    for transport in &o.transports {
        eprintln!("nacos_scale: {transport} with {n} services × {per}");
        let mut row = Row { transport: transport.clone(), ..Row::default() };
        if let Err(e) = measure(&o, &server, &server_proc, &bin, &mut row).await {
            row.notes.push(format!("stopped: {e:#}"));
        }
        eprint!("{}", render_row(&server, &o, &row));
        rows.push(row);
    }

    let mut out = String::new();
    writeln!(
        out,
        "\nnacos_scale: {} with {n} services × {per}; loadavg at start {load_start}, at end {}",
        server.name(),
        loadavg()
    )?;
    writeln!(
        out,
        "registration: {} instances in {register_s:.1} s ({register_rate:.0} a second, {} in flight), server CPU {register_cpu:.1} s",
        n * per,
        o.concurrency
    )?;
    writeln!(
        out,
        "\n| pass | transport | reads in flight | every service read (s) | answer p50 / p99 (ms) | server CPU (s) |"
    )?;
    writeln!(out, "| --- | --- | --- | --- | --- | --- |")?;
    for (pass, t, r) in &reads {
        writeln!(
            out,
            "| {pass} | {t} | {} | {:.2} | {:.1} / {:.1} | {:.2} |",
            r.in_flight, r.total_s, r.p50, r.p99, r.server_cpu_s
        )?;
    }
    writeln!(out)?;
    writeln!(out, "{}", header())?;
    for row in &rows {
        write!(out, "{}", render_row(&server, &o, row))?;
    }
    writeln!(out, "\nThe sync in meshbridge's log (s after its first line):")?;
    for row in &rows {
        let steps: Vec<String> = row.timeline.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        writeln!(out, "- {}: {}", row.transport, steps.join(", "))?;
    }
    for row in &rows {
        for note in &row.notes {
            writeln!(out, "- {}: {note}", row.transport)?;
        }
    }
    Ok(out)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn header() -> String {
    "| server | services × instances | transport | sync to cache (s) | sync to Envoy EDS (s) | meshbridge CPU in sync (s) | server CPU in sync (s) | RSS at rest (MiB) | CPU at rest (ms/s) | changes | write → Envoy p50 / max (ms) | write → plain subscriber p50 / max (ms) | ours (Envoy − subscriber) p50 / max (ms) | CPU per change, raw / net of rest (ms) | new service → Envoy p50 / max (ms) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".into()
}

fn render_row(server: &Server, o: &Opts, r: &Row) -> String {
    let s = |v: Option<f64>| v.map_or_else(|| "not synced".into(), |v| format!("{v:.2}"));
    let pm = |v: &[f64]| {
        if v.is_empty() { "-".into() } else { format!("{:.0} / {:.0}", pct(v, 50.0), pct(v, 100.0)) }
    };
    format!(
        "| {} | {} × {} | {} | {} | {} | {:.2} | {:.2} | {:.0} | {:.1} | {} | {} | {} | {} | {:.1} / {:.1} | {} |\n",
        server.name(),
        o.services,
        o.per,
        r.transport,
        s(r.cache_s),
        s(r.envoy_s),
        r.sync_cpu_s,
        r.server_sync_cpu_s,
        r.rss_rest,
        r.rest_cpu_ms_per_s,
        r.changes,
        pm(&r.envoy_ms),
        pm(&r.bare_ms),
        pm(&r.ours_ms),
        r.change_cpu_ms,
        r.change_cpu_net_ms,
        pm(&r.new_ms),
    )
}

async fn measure(o: &Opts, server: &Server, server_proc: &Proc, bin: &Path, row: &mut Row) -> anyhow::Result<()> {
    let (n, per) = (o.services, o.per);
    let dir = tempfile::tempdir()?;
    let logs = tempfile::tempdir()?;
    let log = std::env::var_os("MESHBRIDGE_BENCH_LOGS").map_or_else(
        || logs.path().join("meshbridge.log"),
        |d| PathBuf::from(d).join(format!("meshbridge-{}-{}-{n}.log", server.name(), row.transport)),
    );
    let bridge = format!(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {{ name: default, namespace: higress-system }}\nspec:\n  registries:\n    - {{type: {}, name: bench, domain: 127.0.0.1, port: {}}}\n",
        row.transport,
        server.http_port()
    );
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge)?;

    // meshbridge, then Envoy at once, as a proxy already running would
    // connect: the sync is timed from meshbridge's start to each.
    let server_cpu = server_proc.cpu();
    let t = Instant::now();
    let mb = Meshbridge::start(bin, dir.path(), log, &o.env).await?;
    let xds = mb.xds_addr;
    let envoy = tokio::spawn(async move {
        let envoy = Envoy::start_with_stats(xds, AdsMode::Delta, "none", Stats::Istio).await?;
        let warm = envoy_warm(&envoy, n, SYNC_LIMIT).await;
        anyhow::Ok((envoy, warm.then(|| t.elapsed().as_secs_f64())))
    });
    let synced = loop {
        if let Some((s, e)) = mb.counts().await
            && s >= n
            && e >= n * per
        {
            break true;
        }
        if t.elapsed() > SYNC_LIMIT {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    row.cache_s = synced.then(|| t.elapsed().as_secs_f64());
    row.sync_cpu_s = mb.proc.cpu();
    row.server_sync_cpu_s = server_proc.cpu() - server_cpu;
    let (envoy, envoy_s) = envoy.await??;
    row.envoy_s = envoy_s;
    if !synced {
        bail!("meshbridge not synced after {SYNC_LIMIT:?}: {:?}", mb.counts().await);
    }
    row.timeline = timeline(&mb.log());
    println!(
        "FIGURE nacos_scale_timeline server={} services={n} transport={} {}",
        server.name(),
        row.transport,
        row.timeline.iter().map(|(k, v)| format!("{k}_s={v:.2}")).collect::<Vec<_>>().join(" ")
    );
    println!(
        "FIGURE nacos_scale_sync server={} services={n} transport={} cache_s={:.2} envoy_s={} mb_cpu_s={:.2} server_cpu_s={:.2}",
        server.name(),
        row.transport,
        row.cache_s.unwrap_or(f64::NAN),
        envoy_s.map_or_else(|| "none".into(), |s| format!("{s:.2}")),
        row.sync_cpu_s,
        row.server_sync_cpu_s
    );

    // At rest: `settle` after the sync, for `rest`.
    tokio::time::sleep(o.settle).await;
    let cpu = mb.proc.cpu();
    tokio::time::sleep(o.rest).await;
    let rest_rate = (mb.proc.cpu() - cpu) / o.rest.as_secs_f64();
    let mem = mb.proc.memory();
    (row.rss_rest, row.hwm, row.rest_cpu_ms_per_s) = (mem.rss, mem.hwm, rest_rate * 1e3);
    println!(
        "FIGURE nacos_scale_rest server={} services={n} transport={} rss_mib={:.0} hwm_mib={:.0} cpu_ms_per_s={:.2}",
        server.name(),
        row.transport,
        mem.rss,
        mem.hwm,
        rest_rate * 1e3
    );

    let grpc = row.transport == "nacos2";
    let (changes, limit) = if grpc { (o.changes, CHANGE_LIMIT) } else { (o.http_changes, HTTP_CHANGE_LIMIT) };
    changes_run(o, server, &mb, changes, limit, rest_rate, row).await?;
    new_services(o, server, &envoy, row).await?;
    drop(envoy);
    Ok(())
}

/// Change `k`: instance 0 of service `k / 2 × step`, disabled (`k` even)
/// or enabled again (`k` odd).
async fn changes_run(
    o: &Opts,
    server: &Server,
    mb: &Meshbridge,
    changes: usize,
    limit: Duration,
    rest_rate: f64,
    row: &mut Row,
) -> anyhow::Result<()> {
    let (n, per) = (o.services, o.per);
    let step = (n / changes.div_ceil(2).max(1)).max(1);
    let target = |k: usize| (k / 2 * step) % n;
    let pushes: Pushes = Arc::default();
    let seen = pushes.clone();
    let grpc_addr = format!("127.0.0.1:{}", server.grpc_port());
    let plain = Arc::new(
        Subscriber::connect(&grpc_addr, NAMESPACE, CALL, move |p: Pushed| {
            seen.lock().unwrap_or_else(PoisonError::into_inner).insert(p.name, Instant::now());
        })
        .await?,
    );
    // Kept alive as a client keeps an idle connection (HTTP changes wait
    // 30 s each); aborted when the changes end.
    let keeper = plain.clone();
    let keepalive = tokio::spawn(async move {
        loop {
            tokio::time::sleep(KEEPALIVE).await;
            if let Err(e) = keeper.health_check(CALL).await {
                eprintln!("nacos_scale: plain subscriber health check failed: {e}");
            }
        }
    });
    for k in (0..changes).step_by(2) {
        plain.subscribe(GROUP, &service(target(k)), CALL).await?;
    }
    // The pushes that follow a subscription, out of the way.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pushed_after = |name: &str, t: Instant| {
        pushes.lock().unwrap_or_else(PoisonError::into_inner).get(name).is_some_and(|at| *at > t)
    };
    let pushed_at = |name: &str| pushes.lock().unwrap_or_else(PoisonError::into_inner).get(name).copied();
    let (cpu, window) = (mb.proc.cpu(), Instant::now());
    for k in 0..changes {
        let i = target(k);
        let mut inst = instance(i, 0, per);
        inst.enabled = k % 2 == 1;
        let name = service(i);
        let t = Instant::now();
        server.api().update(&inst).await.with_context(|| format!("change {k}"))?;
        let written = t.elapsed();
        let done =
            poll_until(limit, Duration::from_millis(1), || mb.envoy_ack_after(t).is_some() && pushed_after(&name, t))
                .await;
        row.write_ms.push(ms(written));
        let (envoy, bare) = (mb.envoy_ack_after(t), pushed_at(&name).filter(|at| *at > t));
        if let Some(e) = envoy {
            row.envoy_ms.push(ms(e - t));
        }
        if let Some(b) = bare {
            row.bare_ms.push(ms(b - t));
        }
        if let (Some(e), Some(b)) = (envoy, bare) {
            row.ours_ms.push(ms(e - t) - ms(b - t));
        }
        if !done {
            row.notes.push(format!(
                "change {k} ({name}): Envoy {}, plain subscriber {} within {limit:?}",
                if envoy.is_some() { "updated" } else { "not updated" },
                if bare.is_some() { "pushed" } else { "not pushed" }
            ));
        }
        row.changes += 1;
    }
    keepalive.abort();
    if plain.is_closed() {
        row.notes.push("the plain subscriber's connection was closed by the server during the changes".into());
    }
    let spent = mb.proc.cpu() - cpu;
    let secs = window.elapsed().as_secs_f64();
    let done = row.changes.max(1) as f64;
    row.change_cpu_ms = spent * 1e3 / done;
    row.change_cpu_net_ms = (spent - rest_rate * secs).max(0.0) * 1e3 / done;
    row.notes.push(format!(
        "{} changes over {secs:.1} s; the server's write answered in p50 {:.0} ms",
        row.changes,
        pct(&row.write_ms, 50.0)
    ));
    let (e, b, d) = (&row.envoy_ms, &row.bare_ms, &row.ours_ms);
    println!(
        "FIGURE nacos_scale_change server={} services={n} transport={} changes={} envoy_p50_ms={:.0} envoy_max_ms={:.0} bare_p50_ms={:.0} bare_max_ms={:.0} ours_p50_ms={:.0} ours_max_ms={:.0} cpu_ms={:.2} cpu_net_ms={:.2}",
        server.name(),
        row.transport,
        row.changes,
        pct(e, 50.0),
        pct(e, 100.0),
        pct(b, 50.0),
        pct(b, 100.0),
        pct(d, 50.0),
        pct(d, 100.0),
        row.change_cpu_ms,
        row.change_cpu_net_ms
    );
    Ok(())
}

/// Register `--new-services` services one at a time (their instances in
/// parallel), each timed to one more cluster being active in Envoy; then
/// deregister their instances (the services, empty, stay on the server:
/// each transport adds services of its own).
async fn new_services(o: &Opts, server: &Server, envoy: &Envoy, row: &mut Row) -> anyhow::Result<()> {
    let (n, per) = (o.services, o.per);
    let mut added = Vec::new();
    for m in 0..o.new_services {
        // Each registration at another phase of the watcher's probe: the
        // previous service was seen right after a probe, so registering at
        // once would always wait a whole period. Golden-ratio steps over
        // 5 s spread the phases evenly for any period that divides it.
        let phase = (m as f64 * 0.618_033_988_75).fract() * NEW_SERVICE_SPREAD.as_secs_f64();
        tokio::time::sleep(Duration::from_secs_f64(phase)).await;
        let (active, _) = cluster_counts(envoy).await.context("Envoy's cluster counts")?;
        let name = format!("new-{}-{m}", row.transport);
        let instances: Vec<Instance> =
            (0..per).map(|j| Instance::new(&name, &benchmark_address((n + m) * per + j), 8080)).collect();
        let t = Instant::now();
        futures::future::try_join_all(instances.iter().map(|inst| server.api().register(inst))).await?;
        if envoy_warm(envoy, active + 1, NEW_SERVICE_LIMIT).await {
            row.new_ms.push(ms(t.elapsed()));
        } else {
            row.notes.push(format!("new service {name} not in Envoy within {NEW_SERVICE_LIMIT:?}"));
        }
        added.extend(instances);
    }
    let v = &row.new_ms;
    println!(
        "FIGURE nacos_scale_new_service server={} services={n} transport={} count={} p50_ms={:.0} max_ms={:.0}",
        server.name(),
        row.transport,
        v.len(),
        pct(v, 50.0),
        pct(v, 100.0)
    );
    for inst in &added {
        server.api().deregister(inst).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_is_read_from_the_last_start() {
        let log = "\
2026-11-29T02:44:13.000000Z  INFO meshbridge::run: starting meshbridge 0.1.0
2026-11-29T02:44:15.000000Z  INFO meshbridge::startup: every registry answered or was loaded from the dump
2026-11-29T03:05:56.000000Z  INFO meshbridge::run: starting meshbridge 0.1.0
2026-11-29T03:05:56.030000Z  INFO nacos{registry=bench}: meshbridge_registries::nacos: connected servers=[]
2026-11-29T03:06:03.900000Z  INFO meshbridge::startup: every registry answered or was loaded from the dump
2026-11-29T03:06:04.500000Z DEBUG ads{stream=1}: meshbridge::xds::delta: sent delta response type_url=\"type.googleapis.com/envoy.config.cluster.v3.Cluster\" nonce=\"1\"
";
        let steps = timeline(log);
        let names: Vec<&str> = steps.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, ["connected", "registry_answered", "cds_sent"]);
        assert!((steps[1].1 - 7.9).abs() < 1e-6, "{steps:?}");
        assert_eq!(log_secs("2026-11-29T01:02:03.5Z x"), Some(3723.5));
    }
}
