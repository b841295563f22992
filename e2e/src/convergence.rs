//! Randomized, seeded convergence runs: a test applies bursts of a real
//! registry's own operations, back to back, and after each burst waits
//! until meshbridge's view of every service (read through its admin API)
//! equals the registry's truth (read from the registry by the test), or
//! fails with the seed, the burst and the diverging services.
//!
//! `MESHBRIDGE_CONVERGENCE_SEED` replays a seed; `MESHBRIDGE_CONVERGENCE_BURSTS`
//! sets how many bursts a test runs (default [`DEFAULT_BURSTS`]).
//!
//! Two ways to drive it: a test's own loop over [`Bursts`] (Consul), or
//! [`run`], which drives a [`Registry`] (generate one operation, apply it,
//! read the truth) against a [`View`] ([`AdminView`], or [`RecorderView`]
//! for a watcher run alone) and compares only services with endpoints
//! ([`non_empty`]: watchers keep an authoritative empty service where a
//! registry may drop the name, and an empty service routes nowhere either
//! way). [`envoy_converges`] compares a real Envoy's EDS at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use meshbridge::run::App;
use meshbridge_registries::Service;
use serde_json::Value;

use crate::envoy::Envoy;
use crate::recorder::Recorder;

/// Bursts per test unless `MESHBRIDGE_CONVERGENCE_BURSTS` says otherwise.
pub const DEFAULT_BURSTS: usize = 100;
/// How often a converging view is read again.
const POLL: Duration = Duration::from_millis(10);

/// Services by host, each with its endpoints as [`endpoint`] writes them,
/// sorted.
pub type Truth = BTreeMap<String, Vec<String>>;

/// One endpoint as both sides write it: `address:port w=weight` and the
/// labels the test compares, in key order.
pub fn endpoint(address: &str, port: u64, weight: u64, labels: &[(&str, &str)]) -> String {
    let mut out = format!("{address}:{port} w={weight}");
    let mut labels = labels.to_vec();
    labels.sort();
    for (k, v) in labels {
        let _ = write!(out, " {k}={v}");
    }
    out
}

/// The label the ZooKeeper and Nacos tests set on instances and compare.
pub const REV: &str = "rev";

/// [`endpoint`] with the [`REV`] label when `rev` is set.
pub fn endpoint_rev(address: &str, port: u16, weight: u32, rev: Option<&str>) -> String {
    let labels: Vec<(&str, &str)> = rev.map(|r| (REV, r)).into_iter().collect();
    endpoint(address, port.into(), weight.into(), &labels)
}

/// A small seeded generator (splitmix64): the same seed gives the same run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() { None } else { items.get(self.below(items.len() as u64) as usize) }
    }

    /// Uniform in `0..n` (`n > 0`), as an index.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.index(hi - lo + 1)
    }
}

/// meshbridge's view of one registry, through the admin API.
pub struct AdminView {
    base: String,
    registry: String,
    labels: Vec<String>,
    http: reqwest::Client,
}

impl AdminView {
    /// The view of `registry` on `app`, comparing the endpoint labels
    /// named in `labels`.
    pub fn new(app: &App, registry: &str, labels: &[&str]) -> AdminView {
        AdminView {
            base: format!("http://{}", app.admin_addr),
            registry: registry.to_string(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            http: reqwest::Client::new(),
        }
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.get_if_there(path).await?.ok_or_else(|| anyhow::anyhow!("GET {path}: 404 Not Found"))
    }

    /// `None` for a 404: a service listed a moment ago may be gone by the
    /// time its detail is asked for.
    async fn get_if_there(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let resp = self.http.get(format!("{}{path}", self.base)).timeout(Duration::from_secs(5)).send().await?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        anyhow::ensure!(resp.status().is_success(), "GET {path}: {}", resp.status());
        Ok(Some(resp.json().await?))
    }

    /// Every service the registry serves, with its endpoints.
    pub async fn read(&self) -> anyhow::Result<Truth> {
        let list = self.get(&format!("/v1/registries/{}?services=true", self.registry)).await?;
        let mut view = Truth::new();
        for host in list["serviceList"].as_array().into_iter().flatten().filter_map(|s| s["host"].as_str()) {
            let path = format!("/v1/registries/{}/services/{host}", self.registry);
            let Some(detail) = self.get_if_there(&path).await? else { continue };
            let mut endpoints: Vec<String> = detail["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    let labels: Vec<(&str, &str)> =
                        self.labels.iter().filter_map(|k| Some((k.as_str(), e["labels"][k].as_str()?))).collect();
                    endpoint(
                        e["address"].as_str().unwrap_or(""),
                        e["port"].as_u64().unwrap_or(0),
                        e["weight"].as_u64().unwrap_or(0),
                        &labels,
                    )
                })
                .collect();
            endpoints.sort();
            view.insert(host.to_string(), endpoints);
        }
        Ok(view)
    }

    /// `meshbridge_registry_drift_corrected_total` for this registry, from
    /// `/metrics`, summed over every `kind`; `None` when no series is there.
    pub async fn drift_corrected(&self) -> anyhow::Result<Option<u64>> {
        Ok(self.repairs().await?.map(|by_kind| by_kind.values().sum()))
    }

    /// `meshbridge_registry_drift_corrected_total` for this registry by
    /// `kind`; `None` when no series is there.
    pub async fn repairs(&self) -> anyhow::Result<Option<BTreeMap<String, u64>>> {
        let text = self.http.get(format!("{}/metrics", self.base)).send().await?.text().await?;
        Ok(repairs_in(&text, &self.registry))
    }

    /// The registry's `lastSyncTime` (its last full read sent whole).
    pub async fn last_sync_time(&self) -> anyhow::Result<Option<String>> {
        let list = self.get(&format!("/v1/registries/{}", self.registry)).await?;
        Ok(list["lastSyncTime"].as_str().map(str::to_string))
    }

    /// Wait until the registry's next periodic full read has been sent (its
    /// `lastSyncTime` moved), at most `timeout`, so that a drift check
    /// covers the run's last changes.
    pub async fn wait_for_full_read(&self, timeout: Duration) {
        let before = self.last_sync_time().await.expect("read /v1/registries");
        let start = Instant::now();
        while self.last_sync_time().await.expect("read /v1/registries") == before {
            assert!(start.elapsed() < timeout, "no periodic full read of {} within {timeout:?}", self.registry);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fail unless the series exists and is 0: no periodic full read had to
    /// correct a change the watcher missed.
    pub async fn assert_no_drift(&self) {
        let drift = self.drift_corrected().await.expect("read /metrics");
        assert_eq!(drift, Some(0), "meshbridge_registry_drift_corrected_total for {}", self.registry);
    }
}

/// A test's run of bursts: the seed, how many are left, and how long each
/// took to converge.
pub struct Bursts {
    what: String,
    seed: u64,
    total: usize,
    done: usize,
    took: Vec<Duration>,
    operations: usize,
}

impl Bursts {
    /// `what` names the test in its figures.
    pub fn from_env(what: &str) -> Bursts {
        let seed = std::env::var("MESHBRIDGE_CONVERGENCE_SEED")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos() as u64);
        let total = std::env::var("MESHBRIDGE_CONVERGENCE_BURSTS")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(DEFAULT_BURSTS);
        println!("{what}: seed={seed} bursts={total} (MESHBRIDGE_CONVERGENCE_SEED={seed} replays it)");
        Bursts { what: what.to_string(), seed, total, done: 0, took: Vec::new(), operations: 0 }
    }

    /// The run's generator.
    pub fn rng(&self) -> Rng {
        Rng::new(self.seed)
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Count `n` operations applied to the registry.
    pub fn applied(&mut self, n: usize) {
        self.operations += n;
    }

    /// Record one burst's convergence time (for a loop that waits itself).
    pub fn record(&mut self, took: Duration) {
        self.took.push(took);
    }

    /// The next burst's number, while any are left.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<usize> {
        (self.done < self.total).then(|| {
            self.done += 1;
            self.done
        })
    }

    /// Wait until `view` equals `truth()` (both read again each time), at
    /// most `deadline`; records the time (once a burst has begun: not the
    /// initial sync's), or panics with the seed, `what` (the burst and its
    /// operations) and the services that differ.
    pub async fn converge<F, Fut>(&mut self, what: &str, view: &AdminView, mut truth: F, deadline: Duration)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Truth>,
    {
        let start = Instant::now();
        loop {
            let want = truth().await;
            let got = view.read().await.unwrap_or_default();
            if got == want {
                if self.done > 0 {
                    self.took.push(start.elapsed());
                }
                return;
            }
            if start.elapsed() > deadline {
                panic!(
                    "{}: seed={} did not converge within {deadline:?} after {what}\n{}",
                    self.what,
                    self.seed,
                    diff(&want, &got)
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Print the convergence figures (`FIGURE` lines, which the test
    /// command collects).
    pub fn report(&self) {
        let mut took = self.took.clone();
        took.sort();
        let at = |q: f64| took.get(((took.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default();
        println!(
            "FIGURE convergence {}: {} bursts, {} operations, seed {}, converged p50 {:?} p99 {:?} max {:?}",
            self.what,
            took.len(),
            self.operations,
            self.seed,
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
}

/// The services on which `want` (the registry) and `got` (meshbridge)
/// differ, one per line.
pub fn diff(want: &Truth, got: &Truth) -> String {
    let hosts: BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    let mut out = String::new();
    for host in hosts {
        let (w, g) = (want.get(host), got.get(host));
        if w != g {
            let _ = writeln!(out, "  {host}:\n    registry:   {w:?}\n    meshbridge: {g:?}");
        }
    }
    out
}

/// Only the services with endpoints, each's endpoints sorted.
pub fn non_empty(mut truth: Truth) -> Truth {
    truth.retain(|_, endpoints| !endpoints.is_empty());
    for endpoints in truth.values_mut() {
        endpoints.sort();
    }
    truth
}

/// Add one endpoint of `host` to `truth` ([`non_empty`] sorts).
pub fn push(truth: &mut Truth, host: &str, endpoint: String) {
    truth.entry(host.to_string()).or_default().push(endpoint);
}

/// The registry half of a [`run`].
#[allow(async_fn_in_trait)]
pub trait Registry {
    /// One operation, printed with a burst that fails.
    type Op: Debug;
    /// The next operation, from the test's own model of what exists.
    fn next_op(&mut self, rng: &mut Rng) -> Self::Op;
    /// Apply `op` to the server (no waiting beyond its own answer).
    async fn apply(&mut self, op: &Self::Op) -> anyhow::Result<()>;
    /// The server's truth, read from the server.
    async fn truth(&mut self) -> anyhow::Result<Truth>;
}

/// meshbridge's half of a [`run`].
#[allow(async_fn_in_trait)]
pub trait View {
    /// meshbridge's view of the registry.
    async fn read(&mut self) -> anyhow::Result<Truth>;
    /// Services the watcher reported as drift so far.
    async fn drift(&mut self) -> anyhow::Result<u64>;
}

impl View for AdminView {
    async fn read(&mut self) -> anyhow::Result<Truth> {
        AdminView::read(self).await
    }

    async fn drift(&mut self) -> anyhow::Result<u64> {
        self.drift_corrected().await?.with_context(|| format!("/metrics has no drift series for {}", self.registry))
    }
}

/// A watcher run alone, its sink calls folded by a [`Recorder`]; drift is
/// what it told `Sink::drift`.
pub struct RecorderView {
    pub recorder: Recorder,
    labels: Vec<String>,
}

impl RecorderView {
    /// Compares the endpoint labels named in `labels`.
    pub fn new(recorder: Recorder, labels: &[&str]) -> RecorderView {
        RecorderView { recorder, labels: labels.iter().map(|l| l.to_string()).collect() }
    }

    /// Services as [`AdminView::read`] writes them.
    pub fn truth_of<'a>(&self, services: impl IntoIterator<Item = &'a Service>) -> Truth {
        let mut truth = Truth::new();
        for s in services {
            let endpoints = truth.entry(s.host.clone()).or_default();
            for e in &s.endpoints {
                let labels: Vec<(&str, &str)> =
                    self.labels.iter().filter_map(|k| Some((k.as_str(), e.labels.get(k)?.as_str()))).collect();
                endpoints.push(endpoint(&e.address, e.port.into(), e.weight.into(), &labels));
            }
            endpoints.sort();
        }
        truth
    }
}

impl View for RecorderView {
    async fn read(&mut self) -> anyhow::Result<Truth> {
        // Take in what the watcher sent so far, without waiting.
        self.recorder.idle(Duration::ZERO).await;
        Ok(self.truth_of(self.recorder.view.values()))
    }

    async fn drift(&mut self) -> anyhow::Result<u64> {
        self.recorder.idle(Duration::ZERO).await;
        Ok(self.recorder.drift_since(0).len() as u64)
    }
}

/// How a [`run`] goes.
#[derive(Debug, Clone)]
pub struct Options {
    /// Names the registry in the seed and `FIGURE` lines.
    pub name: String,
    /// Operations per burst: 1..=max_ops.
    pub max_ops: usize,
    /// How long a burst may take to converge.
    pub deadline: Duration,
    /// How long the state before the first burst may take.
    pub initial_deadline: Duration,
    /// Pause after a burst converged, before the next one: spreads the
    /// bursts over a watcher's periodic read, so that the read races them.
    pub pause: Duration,
}

impl Options {
    pub fn new(name: &str, deadline: Duration) -> Options {
        Options {
            name: name.into(),
            max_ops: 8,
            deadline,
            initial_deadline: Duration::from_secs(30),
            pause: Duration::ZERO,
        }
    }
}

/// Poll both sides until their services with endpoints agree: the time it
/// took and the truth then, or the difference once `deadline` passed.
pub async fn converge<R: Registry, V: View>(
    registry: &mut R,
    view: &mut V,
    deadline: Duration,
) -> Result<(Duration, Truth), String> {
    let start = Instant::now();
    loop {
        // A failed read is tried again until the deadline: it says nothing
        // about convergence yet.
        let want = registry.truth().await.map(non_empty).map_err(|e| format!("reading the registry: {e:#}"));
        let got = view.read().await.map(non_empty).map_err(|e| format!("reading meshbridge: {e:#}"));
        match (want, got) {
            (Ok(want), Ok(got)) if got == want => return Ok((start.elapsed(), want)),
            (Ok(want), Ok(got)) if start.elapsed() > deadline => return Err(diff(&want, &got)),
            (Err(e), _) | (_, Err(e)) if start.elapsed() > deadline => return Err(e),
            _ => {}
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Run the bursts: 1..=`max_ops` operations each, back to back, then wait
/// for agreement; panics with the seed, the burst, its operations and the
/// diverging services, or when the watcher reported drift. Prints the
/// `FIGURE` line. Returns the registry's truth after the last burst.
pub async fn run<R: Registry, V: View>(registry: &mut R, view: &mut V, opts: &Options) -> Truth {
    let mut bursts = Bursts::from_env(&opts.name);
    let mut rng = bursts.rng();
    let seed = bursts.seed();
    if let Err(diverging) = converge(registry, view, opts.initial_deadline).await {
        panic!(
            "{}: seed={seed}: the initial state did not converge within {:?}\n{diverging}",
            opts.name, opts.initial_deadline
        );
    }
    let mut last = Truth::new();
    while let Some(n) = bursts.next() {
        let size = rng.range(1, opts.max_ops);
        let mut ops = Vec::with_capacity(size);
        for _ in 0..size {
            let op = registry.next_op(&mut rng);
            if let Err(e) = registry.apply(&op).await {
                panic!("{}: seed={seed}: burst {n}: applying {op:?}: {e:#}", opts.name);
            }
            ops.push(op);
        }
        bursts.applied(ops.len());
        match converge(registry, view, opts.deadline).await {
            Ok((took, truth)) => {
                bursts.record(took);
                last = truth;
            }
            Err(diverging) => panic!(
                "{}: seed={seed}: burst {n} did not converge within {:?}\noperations:\n{}\ndiverging services:\n{diverging}",
                opts.name,
                opts.deadline,
                ops.iter().map(|op| format!("  {op:?}")).collect::<Vec<_>>().join("\n"),
            ),
        }
        tokio::time::sleep(opts.pause).await;
    }
    bursts.report();
    let drift = view.drift().await.unwrap_or_else(|e| panic!("{}: reading drift: {e:#}", opts.name));
    assert_eq!(drift, 0, "{}: seed={seed}: a periodic read corrected {drift} services the watcher missed", opts.name);
    last
}

/// `addr:port` of every member of every cluster Envoy's `/clusters` lists
/// whose name `cluster_host` maps to a host (e.g. strips `outbound|p||`).
pub async fn envoy_members(envoy: &Envoy, cluster_host: impl Fn(&str) -> Option<String>) -> Truth {
    let body = envoy.admin("/clusters").await.unwrap_or_default();
    let mut truth = Truth::new();
    let mut seen = BTreeSet::new();
    for line in body.lines() {
        let mut parts = line.split("::");
        let (Some(cluster), Some(member)) = (parts.next(), parts.next()) else { continue };
        if member.parse::<SocketAddr>().is_err() {
            continue;
        }
        let Some(host) = cluster_host(cluster) else { continue };
        // A member has a line per statistic: count it once.
        if seen.insert((host.clone(), member.to_string())) {
            push(&mut truth, &host, member.to_string());
        }
    }
    non_empty(truth)
}

/// Only `addr:port` of each endpoint (what Envoy's `/clusters` shows).
pub fn addresses(truth: &Truth) -> Truth {
    let stripped = truth
        .iter()
        .map(|(h, eps)| (h.clone(), eps.iter().map(|e| e.split(' ').next().unwrap_or(e).to_string()).collect()))
        .collect();
    non_empty(stripped)
}

/// Poll Envoy until its members equal `want`'s addresses; after
/// `deadline`, both sides, Envoy's clusters (warming ones too) and its
/// warnings.
pub async fn envoy_converges(
    envoy: &Envoy,
    want: &Truth,
    cluster_host: impl Fn(&str) -> Option<String>,
    deadline: Duration,
) -> Result<Duration, String> {
    let want = addresses(want);
    let start = Instant::now();
    loop {
        let got = envoy_members(envoy, &cluster_host).await;
        if got == want {
            return Ok(start.elapsed());
        }
        if start.elapsed() > deadline {
            let clusters = envoy.admin("/clusters").await.unwrap_or_default();
            let members: Vec<&str> = clusters
                .lines()
                .filter(|l| l.contains("::health_flags::") || l.contains("::added_via_api::"))
                .collect();
            let dump = envoy.admin("/config_dump?resource=dynamic_warming_clusters").await.unwrap_or_default();
            let warming: Vec<&str> =
                dump.lines().filter(|l| l.contains("\"name\": \"outbound")).map(str::trim).collect();
            let log = envoy.log();
            let warnings: Vec<&str> = log.lines().filter(|l| l.contains("reject") || l.contains("[warning]")).collect();
            return Err(format!(
                "Envoy's EDS differs from the registry after {deadline:?} (\"meshbridge\" is Envoy here):\n{}\n\
                 Envoy's clusters:\n{}\nwarming:\n{}\nEnvoy's warnings:\n{}",
                diff(&want, &got),
                members.join("\n"),
                warming.join("\n"),
                warnings.join("\n"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `meshbridge_registry_drift_corrected_total` series of `registry` in
/// a `/metrics` text, by their `kind` label; `None` when there is none.
pub fn repairs_in(metrics: &str, registry: &str) -> Option<BTreeMap<String, u64>> {
    let name = format!("name=\"{registry}\"");
    let mut out = BTreeMap::new();
    for line in
        metrics.lines().filter(|l| l.starts_with("meshbridge_registry_drift_corrected_total{") && l.contains(&name))
    {
        let kind = line.split("kind=\"").nth(1).and_then(|k| k.split('"').next()).unwrap_or("").to_string();
        let value = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0);
        out.insert(kind, value);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_seeded_and_spread() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[a.index(4)] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
        assert!((0..100).all(|_| (3..=5).contains(&a.range(3, 5))));
        assert!(!(0..100).any(|_| a.chance(0.0)));
    }

    #[test]
    fn only_services_with_endpoints_are_compared() {
        let truth = non_empty(Truth::from([("a".into(), vec!["2".into(), "1".into()]), ("e".into(), vec![])]));
        assert_eq!(truth, Truth::from([("a".into(), vec!["1".into(), "2".into()])]));
        let stripped = addresses(&Truth::from([("h".into(), vec![endpoint("1.2.3.4", 5, 2, &[("rev", "7")])])]));
        assert_eq!(stripped["h"], ["1.2.3.4:5"]);
    }
}
