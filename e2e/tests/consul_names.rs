//! Consul instances registered by host name (an ELB, an RDS endpoint),
//! against a real Consul 1.8 agent, with name resolution the test controls:
//! the test runs itself again in a mount namespace of its own (`unshare
//! --mount`, which needs root, as CI has) where `/etc/hosts` is a file of
//! the test's, bind-mounted. Nothing outside that namespace sees it.
//!
//! Consul moves no index when a name's addresses change, so only the
//! watcher's re-reads of named services (every periodic tick) and of names
//! that failed to resolve (with backoff) can follow; both are counted as
//! `name_resolution` repairs.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::recorder::Recorder;
use meshbridge_registries::consul::ConsulWatcher;
use meshbridge_registries::{RegistryKind, RegistrySpec, RepairKind};
use serde_json::json;

/// Set in the re-run: the path of the test's hosts file.
const HOSTS_VAR: &str = "MESHBRIDGE_TEST_HOSTS_FILE";
const DEADLINE: Duration = Duration::from_secs(15);
const EXT: &str = "ext.dc1.consul";

/// Run `test` of this binary again inside a new mount namespace whose
/// `/etc/hosts` is `hosts`, and fail unless it passes there.
fn rerun_in_mount_namespace(test: &str, hosts: &Path) {
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(HOSTS_VAR, hosts)
        .output()
        .expect("run unshare (util-linux)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success(), "{test} in its mount namespace (unshare needs root) failed:\n{text}");
    assert!(text.contains("1 passed"), "{test} did not run in its mount namespace:\n{text}");
}

/// Inside the namespace: put the test's hosts file over `/etc/hosts`.
fn bind_hosts(hosts: &str) {
    let status = Command::new("mount").args(["--bind", hosts, "/etc/hosts"]).status().expect("run mount");
    assert!(status.success(), "mount --bind {hosts} /etc/hosts");
}

/// Rewrite the hosts file in place (the same inode, which the bind mount holds).
fn set_hosts(path: &str, lines: &str) {
    std::fs::write(path, format!("127.0.0.1 localhost\n{lines}")).expect("write the test's hosts file");
}

fn spec(port: u16) -> RegistrySpec {
    let mut spec = RegistrySpec::new(RegistryKind::Consul, "consul-names", "127.0.0.1", port);
    // The periodic tick re-reads named services; the sweep it starts finds
    // nothing (no index moved).
    spec.consul_refresh_interval = Some(Duration::from_secs(2));
    spec.anti_entropy_interval = Some(Duration::from_secs(3600));
    spec
}

fn named_instance(id: &str, name: &str, address: &str) -> serde_json::Value {
    json!({"ID": id, "Name": name, "Address": address, "Port": 80,
           "Check": {"CheckID": id, "TTL": "120s", "Status": "passing"}})
}

/// Hole H2: the name's address changes (an ELB's IPs rotate); a name that
/// did not resolve at the one read after its registration resolves a
/// moment later. Before: the first stayed on the old address, the second
/// stayed missing, until Consul's record itself changed.
#[tokio::test]
async fn a_host_name_that_moves_or_resolves_late_is_followed_and_counted() {
    const TEST: &str = "a_host_name_that_moves_or_resolves_late_is_followed_and_counted";
    let Ok(hosts) = std::env::var(HOSTS_VAR) else {
        let dir = tempfile::tempdir().expect("temp dir");
        let hosts = dir.path().join("hosts");
        set_hosts(hosts.to_str().expect("utf-8 path"), "");
        rerun_in_mount_namespace(TEST, &hosts);
        return;
    };
    bind_hosts(&hosts);
    set_hosts(&hosts, "127.0.0.10 ext.meshbridge.test\n");
    let consul = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
    consul.register(named_instance("ext-1", "ext", "ext.meshbridge.test")).await.unwrap();
    let mut rec: Recorder =
        Recorder::start(Box::new(ConsulWatcher::new(spec(consul.http_port)).expect("spec")), DEADLINE);
    rec.until("ext at its first address", |r| r.endpoints(EXT) == Some(vec!["127.0.0.10:80".into()])).await;

    let mark = rec.mark();
    let t = Instant::now();
    set_hosts(&hosts, "127.0.0.11 ext.meshbridge.test\n");
    rec.until("ext at its new address", |r| r.endpoints(EXT) == Some(vec!["127.0.0.11:80".into()])).await;
    println!("FIGURE consul repair name_moved_ms={:.0} refresh_s=2", t.elapsed().as_secs_f64() * 1e3);
    let repairs = rec.repairs_since(mark);
    assert!(repairs.contains(&(RepairKind::NameResolution, &EXT.to_string())), "{repairs:?}");

    // Registered before its name resolves: dropped with a warning, then
    // read again with backoff until it does.
    let mark = rec.mark();
    consul.register(named_instance("late-1", "late", "late.meshbridge.test")).await.unwrap();
    rec.until("late known, with no endpoint yet", |r| r.endpoints("late.dc1.consul") == Some(vec![])).await;
    let t = Instant::now();
    set_hosts(&hosts, "127.0.0.11 ext.meshbridge.test\n127.0.0.12 late.meshbridge.test\n");
    rec.until("late, once its name resolves", |r| r.endpoints("late.dc1.consul") == Some(vec!["127.0.0.12:80".into()]))
        .await;
    println!("FIGURE consul repair name_resolved_late_ms={:.0}", t.elapsed().as_secs_f64() * 1e3);
    let late = "late.dc1.consul".to_string();
    assert!(rec.repairs_since(mark).contains(&(RepairKind::NameResolution, &late)), "{:?}", rec.repairs_since(mark));
}
