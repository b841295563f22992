//! Randomized, seeded convergence runs: a test applies bursts of a real
//! registry's own operations, back to back, and after each burst waits
//! until meshbridge's view of every service (read through its admin API)
//! equals the registry's truth (read from the registry by the test), or
//! fails with the seed, the burst and the diverging services.
//!
//! `MESHBRIDGE_CONVERGENCE_SEED` replays a seed; `MESHBRIDGE_CONVERGENCE_BURSTS`
//! sets how many bursts a test runs (default [`DEFAULT_BURSTS`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meshbridge::run::App;
use serde_json::Value;

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
        let resp = self.http.get(format!("{}{path}", self.base)).timeout(Duration::from_secs(5)).send().await?;
        anyhow::ensure!(resp.status().is_success(), "GET {path}: {}", resp.status());
        Ok(resp.json().await?)
    }

    /// Every service the registry serves, with its endpoints.
    pub async fn read(&self) -> anyhow::Result<Truth> {
        let list = self.get(&format!("/v1/registries/{}?services=true", self.registry)).await?;
        let mut view = Truth::new();
        for host in list["serviceList"].as_array().into_iter().flatten().filter_map(|s| s["host"].as_str()) {
            let detail = self.get(&format!("/v1/registries/{}/services/{host}", self.registry)).await?;
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
    /// `/metrics`; `None` when the series is missing.
    pub async fn drift_corrected(&self) -> anyhow::Result<Option<u64>> {
        let text = self.http.get(format!("{}/metrics", self.base)).send().await?.text().await?;
        let name = format!("name=\"{}\"", self.registry);
        Ok(text
            .lines()
            .filter(|l| l.starts_with("meshbridge_registry_drift_corrected_total{") && l.contains(&name))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok()))
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
        Bursts { what: what.to_string(), seed, total, done: 0, took: Vec::new() }
    }

    /// The run's generator.
    pub fn rng(&self) -> Rng {
        Rng::new(self.seed)
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
    /// most `deadline`; records the time, or panics with the seed, `what`
    /// (the burst and its operations) and the services that differ.
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
                self.took.push(start.elapsed());
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
            "FIGURE convergence {}: {} bursts, seed {}, converged p50 {:?} p99 {:?} max {:?}",
            self.what,
            took.len(),
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
