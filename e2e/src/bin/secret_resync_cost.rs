//! `secret_resync_cost`: what reading only referenced Secrets costs, against
//! a REAL kube-apiserver and etcd (`source e2e/env.sh kube-apiserver
//! kubetools`), in this process, with meshbridge's own reader
//! (`meshbridge::kube::secrets::Secrets`) and the admin kubeconfig.
//!
//! `--secrets N` TLS-sized Secrets (`tls.crt` and `tls.key`, about 3 KB)
//! are created in namespace `bench`, and `--unreferenced M` more beside
//! them. Measured, `--rounds` times each:
//!
//! - the first read of the N referenced Secrets (one `get` each, 8 in
//!   flight), and a resync of all N;
//! - for comparison, one `list` of every Secret in the namespace, which
//!   is what a watch of the namespace starts with (and it reads the
//!   unreferenced ones too).
//!
//! Wall time and this process's CPU for each.
//!
//! ```sh
//! source e2e/env.sh kube-apiserver kubetools
//! cargo run --release -p meshbridge-e2e --bin secret_resync_cost -- --secrets 1000 --unreferenced 1000
//! ```

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use meshbridge::kube::KubeArgs;
use meshbridge::kube::secrets::Secrets;
use meshbridge_e2e::apiserver::ApiServer;

const NS: &str = "bench";

fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(") ").map(|(_, r)| r.split(' ').collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime, fields 14 and 15 (1-based), 12 and 13 after the name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn arg(args: &[String], name: &str, default: usize) -> anyhow::Result<usize> {
    match args.iter().position(|a| a == name) {
        Some(i) => args.get(i + 1).context("a value")?.parse().with_context(|| name.to_owned()),
        None => Ok(default),
    }
}

fn secret(name: String) -> Secret {
    let pem = "x".repeat(1500);
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": NS},
        "stringData": {"tls.crt": pem, "tls.key": pem},
    }))
    .expect("a Secret")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (n, extra, rounds) =
        (arg(&args, "--secrets", 1000)?, arg(&args, "--unreferenced", 1000)?, arg(&args, "--rounds", 5)?);
    let api = ApiServer::start().await?;
    api.kubectl(&["create", "namespace", NS]).await?;
    let client = meshbridge::kube::client(&KubeArgs::with_kubeconfig(&api.admin_kubeconfig)).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let names: Vec<String> =
        (0..n).map(|i| format!("ref-{i}")).chain((0..extra).map(|i| format!("other-{i}"))).collect();
    let created = Instant::now();
    let results: Vec<_> = futures::stream::iter(names)
        .map(|name| {
            let secrets = secrets.clone();
            async move { secrets.create(&PostParams::default(), &secret(name)).await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for r in results {
        r?;
    }
    eprintln!("secret_resync_cost: {} Secrets created in {:.1?}", n + extra, created.elapsed());

    let wanted: BTreeSet<(String, String)> = (0..n).map(|i| (NS.to_owned(), format!("ref-{i}"))).collect();
    println!("| what | Secrets read | wall (ms, median of {rounds}) | CPU of the reader (ms, median) |");
    println!("| --- | --- | --- | --- |");
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1000.0
    };
    let (mut first_wall, mut first_cpu, mut re_wall, mut re_cpu, mut list_wall, mut list_cpu) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let mut reader = Secrets::new(client.clone());
        let (t, c) = (Instant::now(), cpu());
        reader.sync(&wanted, false).await;
        first_wall.push(t.elapsed());
        first_cpu.push(cpu().saturating_sub(c));
        anyhow::ensure!(reader.present().len() == n, "read {} of {n}", reader.present().len());
        let (t, c) = (Instant::now(), cpu());
        reader.sync(&wanted, true).await;
        re_wall.push(t.elapsed());
        re_cpu.push(cpu().saturating_sub(c));
        let (t, c) = (Instant::now(), cpu());
        let listed = secrets.list(&ListParams::default()).await?;
        list_wall.push(t.elapsed());
        list_cpu.push(cpu().saturating_sub(c));
        anyhow::ensure!(listed.items.len() == n + extra, "listed {}", listed.items.len());
    }
    println!(
        "| first read of the referenced Secrets (`get` each) | {n} | {:.0} | {:.0} |",
        median(first_wall),
        median(first_cpu)
    );
    println!("| a resync of them (`get` each) | {n} | {:.0} | {:.0} |", median(re_wall), median(re_cpu));
    println!(
        "| one `list` of the namespace (a watch's start) | {} | {:.0} | {:.0} |",
        n + extra,
        median(list_wall),
        median(list_cpu)
    );
    Ok(())
}
