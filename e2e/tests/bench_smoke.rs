//! The benchmark harness at a tiny size (50 services × 10, 20 changes, 10
//! fan-out clients, one peer round): it must run to the end and print its
//! tables. It checks that the tables are there, never a figure in them.
//!
//! Needs `source e2e/env.sh consul envoy rnacos zookeeper`, and the
//! meshbridge binary of the same profile, which `cargo test --workspace`
//! (e2e/test.sh) builds; alone: `cargo build -p meshbridge --bin
//! meshbridge` first, or set `MESHBRIDGE_BIN`.

use std::time::Duration;

use meshbridge_e2e::bench::{Options, run_blocking};

#[test]
fn bench_completes_at_a_tiny_size_and_prints_its_tables() {
    let opts = Options {
        sizes: vec![50],
        changes: 20,
        fanout: 10,
        peer_rounds: 1,
        sync_timeout: Duration::from_secs(60),
        ..Options::default()
    };
    let tables = run_blocking(opts).expect("bench run");
    println!("{tables}");
    for heading in ["## Sync, memory, connections", "## Single-instance changes", "## Failing health check"] {
        assert!(tables.contains(heading), "no {heading:?} in:\n{tables}");
    }
    for registry in ["consul", "nacos", "zookeeper"] {
        assert!(tables.contains(&format!("| {registry} | 50 |")), "no {registry} row in:\n{tables}");
    }
}
