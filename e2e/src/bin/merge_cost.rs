//! `merge_cost`: what merging a host that several registries report costs
//! translation (issue 34), in process, with no server: `--services` hosts,
//! each with `--instances` endpoints in registry `old` (nacos) and the same
//! hosts with other endpoints in registry `new` (nacos2), against the same
//! catalog in one registry alone.
//!
//! For each catalog: the first full translation, then the median and worst
//! of 200 single-service changes (one endpoint moved: cache →
//! `take_changes` → `Translator::apply`), then a migration step (a new
//! `meshbridgeMigration` weight on one registry, which merges again every
//! host it shares and only those).
//!
//! ```sh
//! cargo run --release -p meshbridge-e2e --bin merge_cost -- --services 10000
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use meshbridge::cache::{Cache, RegistryKey};
use meshbridge::translate::{Inputs, Translator};
use meshbridge_registries::{Endpoint, Migration, Protocol, RegistryKind, Service, ServicePort, Update};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(default)
}

fn service(i: usize, side: u8, instances: usize, moved: usize) -> Service {
    let eps = (0..instances)
        .map(|n| Endpoint {
            address: format!("10.{side}.{}.{}", (i / 250) % 250, (i + n + moved) % 250),
            port: 8080,
            weight: 1,
            labels: Default::default(),
        })
        .collect();
    let port = ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() };
    Service::new(format!("s{i}.DEFAULT-GROUP.shop.nacos"), vec![port], eps)
}

fn median(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (v[v.len() / 2].as_secs_f64() * 1e3, v[v.len() - 1].as_secs_f64() * 1e3)
}

fn run(services: usize, instances: usize, shared: bool) {
    let cache = Cache::new();
    let old = RegistryKey::new(RegistryKind::Nacos, "old");
    let new = RegistryKey::new(RegistryKind::Nacos2, "new");
    let a = cache.attach(&old);
    a.update(Update::Snapshot((0..services).map(|i| service(i, 1, instances, 0)).collect()));
    let b = cache.attach(&new);
    if shared {
        b.update(Update::Snapshot((0..services).map(|i| service(i, 2, instances, 0)).collect()));
    }
    let mut t = Translator::new();
    let inputs = Inputs::default();
    let started = Instant::now();
    t.apply(cache.take_all(), &inputs, true);
    let full = started.elapsed();

    let mut changes = Vec::new();
    for k in 0..200 {
        let i = (k * 7919) % services;
        a.update(Update::Upsert(service(i, 1, instances, k + 1)));
        let started = Instant::now();
        t.apply(cache.take_changes(), &inputs, false);
        changes.push(started.elapsed());
    }
    let (p50, max) = median(changes);

    let step = Inputs {
        registry_migration: BTreeMap::from([(old.clone(), Migration { weight: Some(90), priority: 0 })]),
        ..Inputs::default()
    };
    let started = Instant::now();
    t.apply(cache.take_changes(), &step, true);
    let migration = started.elapsed();
    let catalog = if shared { "two registries, every host shared" } else { "one registry" };
    println!(
        "FIGURE merge_cost services={services} instances={instances} catalog=\"{catalog}\" full_ms={:.0} change_p50_ms={p50:.2} change_max_ms={max:.2} migration_step_ms={:.0}",
        full.as_secs_f64() * 1e3,
        migration.as_secs_f64() * 1e3
    );
}

fn main() {
    let services = arg("--services", 10_000);
    let instances = arg("--instances", 10);
    run(services, instances, false);
    run(services, instances, true);
}
