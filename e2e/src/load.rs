//! A bounded-rate HTTP load generator for fault scenarios: `rate` GETs per
//! second through Envoy, each with a short timeout, counting what failed
//! (a non-200 status or no answer) and when.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// What a run saw.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub sent: u64,
    pub failed: u64,
    /// Seconds since the start of each failure, with its status (0: none).
    pub failures: Vec<(f64, u16)>,
    pub elapsed: Duration,
    /// The slowest answered request (a stall shows here before it fails
    /// requests).
    pub slowest: Duration,
}

impl LoadReport {
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// One line for the scenario's printed figures.
    pub fn summary(&self) -> String {
        let first =
            self.failures.first().map(|f| format!(", first failure at {:.1}s ({})", f.0, f.1)).unwrap_or_default();
        format!(
            "{} requests in {:.1}s ({:.0} req/s), slowest {:.2}s, {} failed{first}",
            self.sent,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.slowest.as_secs_f64(),
            self.failed
        )
    }
}

/// Each request's deadline: no answer by then is a failure.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// A running load; [`Load::stop`] returns the report.
pub struct Load {
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<LoadReport>>,
    task: JoinHandle<()>,
}

impl Load {
    /// `rate` requests per second to `http://127.0.0.1:{port}{path}`, each
    /// with a [`TIMEOUT`]. At most `rate` × [`TIMEOUT`] are in flight, the
    /// most that can be while each either answers or fails in time; one more
    /// counts as failed. (The cap was 64: on a starved 2-core machine a
    /// 0.75 s stall of answers then failed requests that were never sent.)
    pub fn start(port: u16, path: &str, rate: u32) -> Load {
        Load::start_host(port, path, "", rate)
    }

    /// [`Load::start`] with a `Host` header (none when empty): a route of
    /// the standalone gateway.
    pub fn start_host(port: u16, path: &str, host: &str, rate: u32) -> Load {
        let url = format!("http://127.0.0.1:{port}{path}");
        let host = host.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(LoadReport::default()));
        let http = reqwest::Client::builder().timeout(TIMEOUT).build().expect("client");
        let cap = usize::try_from(u64::from(rate) * TIMEOUT.as_secs()).unwrap_or(usize::MAX).max(1);
        let (s, r) = (stop.clone(), report.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let inflight = Arc::new(tokio::sync::Semaphore::new(cap));
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut handles = Vec::new();
            while !s.load(Ordering::Relaxed) {
                tick.tick().await;
                let at = started.elapsed().as_secs_f64();
                let Ok(permit) = inflight.clone().try_acquire_owned() else {
                    let mut rep = r.lock().await;
                    rep.sent += 1;
                    rep.failed += 1;
                    rep.failures.push((at, 0));
                    continue;
                };
                let (http, url, r, host) = (http.clone(), url.clone(), r.clone(), host.clone());
                handles.push(tokio::spawn(async move {
                    let asked = Instant::now();
                    let mut get = http.get(&url);
                    if !host.is_empty() {
                        get = get.header(reqwest::header::HOST, host);
                    }
                    let status = match get.send().await {
                        Ok(resp) => {
                            let st = resp.status().as_u16();
                            let _ = resp.bytes().await;
                            st
                        }
                        Err(_) => 0,
                    };
                    drop(permit);
                    let took = asked.elapsed();
                    let mut rep = r.lock().await;
                    rep.sent += 1;
                    if status != 0 {
                        rep.slowest = rep.slowest.max(took);
                    }
                    if status != 200 {
                        rep.failed += 1;
                        rep.failures.push((at, status));
                    }
                }));
                handles.retain(|h| !h.is_finished());
            }
            for h in handles {
                let _ = h.await;
            }
            let mut rep = r.lock().await;
            rep.elapsed = started.elapsed();
            rep.failures.sort_by(|a, b| a.0.total_cmp(&b.0));
        });
        Load { stop, report, task }
    }

    /// Failed so far.
    pub async fn failed(&self) -> u64 {
        self.report.lock().await.failed
    }

    pub async fn stop(self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.report.lock().await.clone()
    }
}

/// Fault length: `MESHBRIDGE_FAULT_SECS` (the full runs use 60), else
/// `default` (short, for CI).
pub fn fault_secs(default: u64) -> Duration {
    let secs = std::env::var("MESHBRIDGE_FAULT_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    Duration::from_secs(secs)
}
