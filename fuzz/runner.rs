//! The runner of every property-test fuzz target, shared by path
//! (`#[path = ".../fuzz/runner.rs"]`) between `tests/fuzz.rs` and
//! `registries/src/fuzz_tests.rs`, so both crates fuzz the same way.
//!
//! A target runs `default_cases` cases, fast enough for CI. `PROPTEST_CASES`
//! sets the total instead (the long run of RELIABILITY.md), and
//! `MESHBRIDGE_FUZZ_SECS` stops a long run early after that many seconds.
//! Cases run in chunks of fresh runners, each with a new random seed; a
//! failure is shrunk and its seed saved in `fuzz/regressions/<target>.txt`,
//! which every later run replays first. Seed inputs in
//! `fuzz/corpus/<target>/` are replayed by [`corpus`].

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};

const CHUNK: u32 = 20_000;
const BUDGET_CHUNK: u32 = 500;

/// The repository root, given the calling crate's `CARGO_MANIFEST_DIR`.
pub fn repo_root(manifest_dir: &str) -> PathBuf {
    let dir = Path::new(manifest_dir);
    if dir.join("fuzz").is_dir() { dir.to_owned() } else { dir.parent().expect("crate has a parent").to_owned() }
}

/// Run `test` on values of `strategy`; panics with the shrunk input on failure.
pub fn fuzz<S: Strategy>(
    root: &Path,
    target: &str,
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let total: u64 = env_num("PROPTEST_CASES").unwrap_or(u64::from(default_cases));
    let budget = env_num("MESHBRIDGE_FUZZ_SECS").map(Duration::from_secs);
    let regressions: &'static str =
        Box::leak(root.join("fuzz/regressions").join(format!("{target}.txt")).display().to_string().into_boxed_str());
    let started = Instant::now();
    let mut done = 0u64;
    while done < total && budget.is_none_or(|b| started.elapsed() < b) {
        // A time budget is checked between chunks: keep them short then.
        let chunk = if budget.is_some() { BUDGET_CHUNK } else { CHUNK };
        let cases = u32::try_from(total - done).unwrap_or(u32::MAX).min(chunk);
        let config = Config {
            cases,
            failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
            source_file: Some(file!()),
            // Rejections are not failures; keep generating.
            max_global_rejects: cases.saturating_mul(4),
            ..Config::default()
        };
        let mut runner = TestRunner::new(config);
        if let Err(e) = runner.run(&strategy, &test) {
            // The shrunk input can be megabytes; the regression file keeps it whole.
            let e = e.to_string();
            let shown: String = e.chars().take(4000).collect();
            panic!("fuzz target {target} failed after {done} earlier cases ({} bytes of report): {shown}", e.len());
        }
        done += u64::from(cases);
    }
    let secs = started.elapsed().as_secs_f64();
    println!("FIGURE fuzz {target}: {done} cases in {secs:.1} s ({:.0}/s)", done as f64 / secs.max(1e-9));
}

/// Every seed input kept in `fuzz/corpus/<target>/`, with its file name.
pub fn corpus(root: &Path, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = root.join("fuzz/corpus").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("corpus entry").path();
            let name = path.file_name().expect("file name").to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("corpus file reads"))
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "{}: no seed inputs", dir.display());
    out
}

fn env_num(var: &str) -> Option<u64> {
    std::env::var(var).ok()?.trim().parse().ok()
}
