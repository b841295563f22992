//! `bench`: the benchmark harness (see `meshbridge_e2e::bench` and
//! BENCHMARKS.md). Needs `source e2e/env.sh consul envoy rnacos zookeeper`.
//! It builds the meshbridge binary it runs as a child (same profile and
//! target directory) unless `MESHBRIDGE_BIN` names one.
//!
//! ```sh
//! cargo run --release -p meshbridge-e2e --bin bench -- --sizes 1000,10000
//! ```

use std::time::Duration;

use anyhow::{Context, bail};
use meshbridge_e2e::bench::{Options, child, registry::Kind, run_blocking};
use meshbridge_e2e::envoy::Stats;

const USAGE: &str = "usage: bench [--sizes 1000,10000] [--instances 10] [--changes 200] [--fanout 100] \
[--registries consul,nacos,nacos1,zookeeper] [--peer-rounds 5] [--sync-timeout-secs 300] \
[--meshbridge-env KEY=VALUE,...] [--envoy-stats istio|all] [--idle-secs 5]";

fn list<T>(v: &str, parse: impl Fn(&str) -> Option<T>) -> anyhow::Result<Vec<T>> {
    v.split(',').map(|s| parse(s.trim()).with_context(|| format!("bad list item {s:?}"))).collect()
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = || value.parse::<usize>().with_context(|| format!("{flag}: not a number: {value}"));
        match flag.as_str() {
            "--sizes" => o.sizes = list(value, |s| s.parse().ok())?,
            "--instances" => o.per = num()?,
            "--changes" => o.changes = num()?,
            "--fanout" => o.fanout = num()?,
            "--registries" => o.registries = list(value, Kind::parse)?,
            "--peer-rounds" => o.peer_rounds = num()?,
            "--sync-timeout-secs" => o.sync_timeout = Duration::from_secs(num()? as u64),
            "--idle-secs" => o.idle = Duration::from_secs(num()? as u64),
            "--meshbridge-env" => {
                o.meshbridge_env = list(value, |kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))?
            }
            "--envoy-stats" => {
                o.envoy_stats = match value.as_str() {
                    "istio" => Stats::Istio,
                    "all" => Stats::All,
                    _ => bail!("--envoy-stats: istio or all, not {value}"),
                }
            }
            _ => bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    // ring only, as the meshbridge binary does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = parse(&args)?;
    opts.meshbridge_bin = Some(child::binary(true)?);
    eprintln!("bench: {opts:?}");
    print!("{}", run_blocking(opts)?);
    Ok(())
}
