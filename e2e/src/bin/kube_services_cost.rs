//! `kube_services_cost`: Kubernetes Services as an endpoint source (issue
//! 35), against a REAL kube-apiserver and etcd (`source e2e/env.sh
//! kube-apiserver kubetools`), with meshbridge's release binary as its own
//! child in `--kube` mode (admin kubeconfig, no leader election).
//!
//! The catalog, in namespace `bench`: `--services` headless Services with
//! one TCP port (`http`, 80 → 8080), and `--endpoints` ready endpoints in
//! EndpointSlices of at most 100, addresses in 198.18.0.0/15 (RFC 2544's
//! benchmark range; nothing is ever sent to them). One of the Services
//! (`big`) has `--big` endpoints over several slices; the others share the
//! rest, one slice each at the defaults. One Ingress of class `higress`
//! names every Service, so meshbridge reads them all.
//!
//! Measured: the sync (spawn → `/v1/registries` counts every endpoint, and
//! → an in-process delta ADS follower holds every cluster's
//! ClusterLoadAssignment in full), the child's CPU and RSS then and at
//! rest; then `--changes` single slice changes on small Services and as
//! many on slices of `big`, one at a time, in cycles of four on one slice
//! (an endpoint's `ready` to false, back to true, the endpoint removed,
//! added again). Each is timed from the PATCH's answer to the
//! ClusterLoadAssignment with the new endpoint count at a delta and at a
//! SotW follower (Envoy-like: CDS, then EDS for every cluster), and to the
//! same event at a bare watch on the slices (the API server's own share).
//!
//! ```sh
//! source e2e/env.sh kube-apiserver kubetools
//! cargo run --release -p meshbridge-e2e --bin kube_services_cost -- --services 1000 --endpoints 10000
//! ```

use std::collections::VecDeque;
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use meshbridge::translate::envoy::cluster_name;
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::bench::child::{self, Meshbridge};
use meshbridge_e2e::bench::follow::{Follower, Kind};
use meshbridge_e2e::bench::kube::{KubeApi, Watch};
use meshbridge_e2e::bench::procfs::HARNESS_THREAD;
use meshbridge_e2e::bench::registry::poll_until;
use meshbridge_e2e::bench::report::quantile;
use serde_json::{Value, json};

const USAGE: &str = "usage: kube_services_cost [--services 1000] [--endpoints 10000] [--big 1000] [--changes 200] \
[--idle-secs 5] [--sync-timeout-secs 300] [--meshbridge-arg ARG]...";
const NS: &str = "bench";
const SERVICE_PORT: u16 = 80;
const TARGET_PORT: u16 = 8080;
/// Endpoints per slice at most, as the EndpointSlice controller's default.
const SLICE_MAX: usize = 100;
/// How long one change may take to reach both followers.
const CHANGE_LIMIT: Duration = Duration::from_secs(10);
/// Between two changes, so that one's trailing work is not the next's.
const GAP: Duration = Duration::from_millis(100);
/// Writes in flight while the catalog is created.
const IN_FLIGHT: usize = 8;

struct Opts {
    services: usize,
    endpoints: usize,
    big: usize,
    changes: usize,
    idle: Duration,
    sync_timeout: Duration,
    /// Added to the child's `meshbridge run` arguments.
    extra: Vec<OsString>,
}

fn parse() -> anyhow::Result<Opts> {
    let mut o = Opts {
        services: 1000,
        endpoints: 10_000,
        big: 1000,
        changes: 200,
        idle: Duration::from_secs(5),
        sync_timeout: Duration::from_secs(300),
        extra: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        if flag == "--meshbridge-arg" {
            o.extra.push(value.into());
            continue;
        }
        let num = value.parse::<usize>().with_context(|| format!("{flag}: not a number: {value}"))?;
        match flag.as_str() {
            "--services" => o.services = num,
            "--endpoints" => o.endpoints = num,
            "--big" => o.big = num,
            "--changes" => o.changes = num,
            "--idle-secs" => o.idle = Duration::from_secs(num as u64),
            "--sync-timeout-secs" => o.sync_timeout = Duration::from_secs(num as u64),
            _ => bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    ensure!(o.services >= 2 || o.big == 0, "--big needs at least one other Service");
    Ok(o)
}

/// One Service: its name and the endpoint addresses of each of its slices,
/// as the harness last wrote them.
struct Svc {
    name: String,
    slices: Vec<VecDeque<u32>>,
}

impl Svc {
    fn endpoints(&self) -> usize {
        self.slices.iter().map(VecDeque::len).sum()
    }

    fn cluster(&self) -> String {
        cluster_name(SERVICE_PORT, "", &format!("{}.{NS}.svc.cluster.local", self.name))
    }

    fn slice_name(&self, k: usize) -> String {
        format!("{}-{k}", self.name)
    }
}

/// The catalog: small Services `svc-N` sharing what `big` leaves, then
/// `big` last (if `--big` is not 0). Addresses are numbered from 1.
fn catalog(o: &Opts) -> anyhow::Result<Vec<Svc>> {
    let small = o.services - usize::from(o.big > 0);
    ensure!(o.endpoints >= o.big + small, "--endpoints: at least one per small Service, plus --big");
    ensure!(o.endpoints < 1 << 17, "--endpoints: 198.18.0.0/15 holds 131,072 addresses");
    let (per, extra) = ((o.endpoints - o.big) / small, (o.endpoints - o.big) % small);
    let mut next = 1u32;
    let mut take = |count: usize| -> Vec<VecDeque<u32>> {
        let all: Vec<u32> = (next..next + count as u32).collect();
        next += count as u32;
        all.chunks(SLICE_MAX).map(|c| c.iter().copied().collect()).collect()
    };
    let mut out: Vec<Svc> =
        (0..small).map(|i| Svc { name: format!("svc-{i}"), slices: take(per + usize::from(i < extra)) }).collect();
    if o.big > 0 {
        out.push(Svc { name: "big".into(), slices: take(o.big) });
    }
    Ok(out)
}

fn address(i: u32) -> String {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i).to_string()
}

fn endpoint(i: u32) -> Value {
    json!({"addresses": [address(i)], "conditions": {"ready": true}})
}

fn service_object(s: &Svc) -> Value {
    // Headless: the test API server's Service range has room for 254.
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": s.name, "namespace": NS},
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": TARGET_PORT,
            "protocol": "TCP"}]}})
}

fn slice_object(s: &Svc, k: usize) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": s.slice_name(k), "namespace": NS, "labels": {"kubernetes.io/service-name": s.name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
        "endpoints": s.slices[k].iter().map(|a| endpoint(*a)).collect::<Vec<_>>()})
}

fn ingress_object(all: &[Svc]) -> Value {
    let paths: Vec<Value> = all
        .iter()
        .map(|s| {
            json!({"path": format!("/{}", s.name), "pathType": "Prefix",
                "backend": {"service": {"name": s.name, "port": {"number": SERVICE_PORT}}}})
        })
        .collect();
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "bench", "namespace": NS},
        "spec": {"ingressClassName": "higress", "rules": [{"host": "bench.example.com", "http": {"paths": paths}}]}})
}

fn slices_text(n: usize) -> String {
    if n == 1 { "1 slice".into() } else { format!("{n} slices") }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    // ring only, as the meshbridge binary does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let o = parse()?;
    let bin = child::binary(true)?;
    let harness = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(HARNESS_THREAD)
        .enable_all()
        .build()?;
    let out = harness.block_on(async move { tokio::spawn(run(o, bin)).await? })?;
    print!("{out}");
    Ok(())
}

/// Sync and rest figures.
#[derive(Default)]
struct Sync {
    registry_s: Option<f64>,
    ads_s: Option<f64>,
    cpu_s: f64,
    rss_sync: f64,
    rss_rest: f64,
    hwm: f64,
    idle_ms_per_s: f64,
    settle_s: f64,
    /// `GET /ready` at rest.
    ready: u16,
}

async fn run(o: Opts, bin: std::path::PathBuf) -> anyhow::Result<String> {
    let mut all = catalog(&o)?;
    let t = Instant::now();
    let server = ApiServer::start().await?;
    // Kube mode lists McpBridges at start: the CRD must be served.
    server.install_shipped().await?;
    let api = KubeApi::new(&server)?;
    api.create("/api/v1/namespaces", &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .await?;
    let services: Vec<Value> = all.iter().map(service_object).collect();
    api.create_all(&format!("/api/v1/namespaces/{NS}/services"), services, IN_FLIGHT).await?;
    let slices: Vec<Value> = all.iter().flat_map(|s| (0..s.slices.len()).map(|k| slice_object(s, k))).collect();
    let slice_count = slices.len();
    let slices_path = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
    api.create_all(&slices_path, slices, IN_FLIGHT).await?;
    api.create(&format!("/apis/networking.k8s.io/v1/namespaces/{NS}/ingresses"), &ingress_object(&all)).await?;
    eprintln!(
        "kube_services_cost: API server up and {} Services, {} endpoints in {slice_count} slices written in {:.1} s",
        all.len(),
        o.endpoints,
        t.elapsed().as_secs_f64()
    );

    let logs = tempfile::tempdir()?;
    let log = std::env::var_os("MESHBRIDGE_BENCH_LOGS")
        .map_or_else(|| logs.path().join("meshbridge.log"), |d| std::path::PathBuf::from(d).join("kube-services.log"));
    let mut args: Vec<OsString> = vec![
        "--kube".into(),
        "--kubeconfig".into(),
        server.admin_kubeconfig.clone().into(),
        "--leader-elect=false".into(),
    ];
    args.extend(o.extra.iter().cloned());
    let started = Instant::now();
    let mb = Meshbridge::start_with(&bin, &args, log, &[]).await?;
    let delta = Follower::start_tracking(Kind::Delta, mb.xds_addr).await?;
    let sotw = Follower::start_tracking(Kind::Sotw, mb.xds_addr).await?;
    let mut sync = Sync::default();
    let deadline = started + o.sync_timeout;
    let full = |f: &Follower| all.iter().all(|s| f.load(&s.cluster()).is_some_and(|l| l.endpoints == s.endpoints()));
    while Instant::now() < deadline && (sync.registry_s.is_none() || sync.ads_s.is_none()) {
        if sync.registry_s.is_none() && mb.counts().await == Some((all.len(), o.endpoints)) {
            sync.registry_s = Some(started.elapsed().as_secs_f64());
            sync.cpu_s = mb.proc.cpu();
            sync.rss_sync = mb.proc.memory().rss;
        }
        if sync.ads_s.is_none() && full(&delta) {
            sync.ads_s = Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if sync.ads_s.is_none() {
        let (clusters, endpoints) = delta.loads_total();
        bail!(
            "not synced after {:?}: registries {:?}, delta follower {clusters} clusters / {endpoints} endpoints\n{}",
            o.sync_timeout,
            mb.counts().await,
            mb.log()
        );
    }
    ensure!(poll_until(o.sync_timeout, Duration::from_millis(20), || full(&sotw)).await, "SotW follower not synced");
    eprintln!(
        "kube_services_cost: synced in {:.2} s (ADS {:.2} s)",
        sync.registry_s.unwrap_or(0.0),
        sync.ads_s.unwrap_or(0.0)
    );

    sync.settle_s = settle(&mb).await;
    let idle_a = mb.proc.cpu();
    tokio::time::sleep(o.idle).await;
    sync.idle_ms_per_s = (mb.proc.cpu() - idle_a) * 1e3 / o.idle.as_secs_f64();
    let mem = mb.proc.memory();
    (sync.rss_rest, sync.hwm) = (mem.rss, mem.hwm);
    let ready = reqwest::get(format!("http://{}/ready", mb.admin_addr)).await?;
    sync.ready = ready.status().as_u16();

    let watch = api.watch(&slices_path).await?;
    let ctx = Ctx { api: &api, mb: &mb, delta: &delta, sotw: &sotw, watch: &watch };
    let small = all.len() - usize::from(o.big > 0);
    let rounds = o.changes.div_ceil(4).max(1);
    let mut groups = Vec::new();
    let (fewest, most) = (all[small - 1].endpoints(), all[0].endpoints());
    let range = if fewest == most { most.to_string() } else { format!("{fewest}–{most}") };
    let label = format!("small Service ({range} endpoints, {})", slices_text(all[0].slices.len()));
    let spread = move |r: usize| ((r * small / rounds + small / (2 * rounds)) % small, 0);
    groups.push(changes(&ctx, &mut all, label, o.changes, spread).await?);
    if o.big > 0 {
        let big = all.len() - 1;
        let slices = all[big].slices.len();
        let label = format!("`big` ({} endpoints, {})", all[big].endpoints(), slices_text(slices));
        groups.push(changes(&ctx, &mut all, label, o.changes, move |r: usize| (big, r % slices)).await?);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    Ok(render(&o, all.len(), slice_count, &sync, &groups, load.trim()))
}

/// Wait until the child has spent at most 10 ms of CPU a second for 3
/// seconds in a row (120 s at most), as the bench does; how long it took.
async fn settle(mb: &Meshbridge) -> f64 {
    let started = Instant::now();
    let mut quiet = 0;
    while quiet < 3 && started.elapsed() < Duration::from_secs(120) {
        let before = mb.proc.cpu();
        tokio::time::sleep(Duration::from_secs(1)).await;
        quiet = if mb.proc.cpu() - before <= 0.01 { quiet + 1 } else { 0 };
    }
    started.elapsed().as_secs_f64()
}

struct Ctx<'a> {
    api: &'a KubeApi,
    mb: &'a Meshbridge,
    delta: &'a Follower,
    sotw: &'a Follower,
    watch: &'a Watch,
}

/// One group of changes' figures.
#[derive(Default)]
struct Group {
    label: String,
    done: usize,
    missed: usize,
    write_ms: Vec<f64>,
    delta_ms: Vec<f64>,
    sotw_ms: Vec<f64>,
    watch_ms: Vec<f64>,
    cpu_ms: f64,
    delta_bytes: u64,
    sotw_bytes: u64,
    window_s: f64,
}

/// `count` changes, in cycles of four on the slice `target(round)` names
/// (Service index, slice index).
async fn changes(
    ctx: &Ctx<'_>,
    all: &mut [Svc],
    label: String,
    count: usize,
    target: impl Fn(usize) -> (usize, usize),
) -> anyhow::Result<Group> {
    let mut g = Group { label, ..Group::default() };
    let (cpu_a, delta_a, sotw_a) = (ctx.mb.proc.cpu(), ctx.delta.tally().bytes, ctx.sotw.tally().bytes);
    let window = Instant::now();
    let mut removed = None;
    for k in 0..count {
        let (i, slice) = target(k / 4);
        let svc = &mut all[i];
        // Steps 0–2 act on the slice's first endpoint, checked by address.
        let first = svc.slices[slice].front().map(|a| address(*a));
        let check = json!({"op": "test", "path": "/endpoints/0/addresses/0", "value": first});
        let ops = match k % 4 {
            0 => json!([check, {"op": "replace", "path": "/endpoints/0/conditions/ready", "value": false}]),
            1 => json!([check, {"op": "replace", "path": "/endpoints/0/conditions/ready", "value": true}]),
            2 => {
                removed = svc.slices[slice].pop_front();
                json!([check, {"op": "remove", "path": "/endpoints/0"}])
            }
            _ => {
                // The one the step before removed, back at the end.
                let back = removed.take().context("nothing removed")?;
                svc.slices[slice].push_back(back);
                if svc.slices[slice].len() == 1 {
                    // An emptied slice's `endpoints` is stored as null.
                    json!([{"op": "add", "path": "/endpoints", "value": [endpoint(back)]}])
                } else {
                    json!([{"op": "add", "path": "/endpoints/-", "value": endpoint(back)}])
                }
            }
        };
        let want = svc.endpoints() - usize::from(k % 4 == 0);
        let (cluster, path) = (
            svc.cluster(),
            format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/{}", svc.slice_name(slice)),
        );
        let sent = Instant::now();
        let rv = ctx.api.json_patch(&path, &ops).await?;
        let answered = Instant::now();
        let arrived = |f: &Follower| f.load(&cluster).filter(|l| l.at > sent && l.endpoints == want).map(|l| l.at);
        let ok = poll_until(CHANGE_LIMIT, Duration::from_millis(1), || {
            arrived(ctx.delta).is_some() && arrived(ctx.sotw).is_some()
        })
        .await;
        g.write_ms.push(ms(answered - sent));
        if !ok {
            g.missed += 1;
            ensure!(g.missed < 5, "{}: 5 changes did not reach the followers in {CHANGE_LIMIT:?}", g.label);
            continue;
        }
        g.done += 1;
        let since = |t: Instant| ms(t.saturating_duration_since(answered));
        g.delta_ms.extend(arrived(ctx.delta).map(since));
        g.sotw_ms.extend(arrived(ctx.sotw).map(since));
        g.watch_ms.extend(ctx.watch.seen(&rv).map(since));
        tokio::time::sleep(GAP).await;
    }
    g.window_s = window.elapsed().as_secs_f64();
    let done = g.done.max(1);
    g.cpu_ms = (ctx.mb.proc.cpu() - cpu_a) * 1e3 / done as f64;
    g.delta_bytes = (ctx.delta.tally().bytes - delta_a) / done as u64;
    g.sotw_bytes = (ctx.sotw.tally().bytes - sotw_a) / done as u64;
    eprintln!("kube_services_cost: {}: {} changes done, {} missed", g.label, g.done, g.missed);
    Ok(g)
}

fn p3(v: &[f64]) -> String {
    match (quantile(v, 0.5), quantile(v, 0.99), quantile(v, 1.0)) {
        (Some(a), Some(b), Some(c)) => format!("{a:.1} / {b:.1} / {c:.1}"),
        _ => "–".into(),
    }
}

fn render(o: &Opts, services: usize, slices: usize, s: &Sync, groups: &[Group], load: &str) -> String {
    let opt = |v: Option<f64>| v.map_or_else(|| "–".into(), |v| format!("{v:.2}"));
    let mut out = format!(
        "\nkube_services_cost: {services} Services, {} endpoints in {slices} slices (`big`: {}), loadavg {load}\n\n",
        o.endpoints, o.big
    );
    out += "| sync to /v1/registries (s) | sync to a delta follower (s) | CPU to sync (s) | RSS at sync (MiB) | RSS at rest (MiB) | peak RSS (MiB) | CPU at rest (ms/s) |\n";
    out += "| --- | --- | --- | --- | --- | --- | --- |\n";
    out += &format!(
        "| {} | {} | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} |\n\n",
        opt(s.registry_s),
        opt(s.ads_s),
        s.cpu_s,
        s.rss_sync,
        s.rss_rest,
        s.hwm,
        s.idle_ms_per_s
    );
    out += "| slice change on | changes | delta follower p50 / p99 / max (ms) | SotW follower p50 / p99 / max (ms) | bare watch p50 / p99 / max (ms) | PATCH p50 (ms) | CPU per change (ms) | bytes per change, delta / SotW |\n";
    out += "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for g in groups {
        let missed = if g.missed > 0 { format!(" ({} missed)", g.missed) } else { String::new() };
        out += &format!(
            "| {} | {}{missed} | {} | {} | {} | {:.1} | {:.2} | {} / {} |\n",
            g.label,
            g.done,
            p3(&g.delta_ms),
            p3(&g.sotw_ms),
            p3(&g.watch_ms),
            quantile(&g.write_ms, 0.5).unwrap_or(0.0),
            g.cpu_ms,
            g.delta_bytes,
            g.sotw_bytes
        );
    }
    out += &format!(
        "\nsettled in {:.1} s before the rest figures; /ready at rest: {}; changes every {GAP:?} after the last arrived; windows {}\n",
        s.settle_s,
        s.ready,
        groups.iter().map(|g| format!("{:.1} s", g.window_s)).collect::<Vec<_>>().join(", ")
    );
    out
}
