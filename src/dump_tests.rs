use meshbridge_registries::{Endpoint, Protocol, RegistryKind, ServicePort, Tls, Update};

use super::*;

fn svc(host: &str, addrs: &[&str]) -> Service {
    let eps = addrs
        .iter()
        .map(|a| Endpoint { address: a.to_string(), port: 80, weight: 1, labels: [("v".into(), "1".into())].into() })
        .collect();
    Service::new(host, vec![ServicePort { number: 80, protocol: Protocol::Grpc, name: "grpc-80".into() }], eps)
}

fn key(name: &str) -> RegistryKey {
    RegistryKey::new(RegistryKind::Consul, name)
}

#[test]
fn round_trip_and_file_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = StateDir::open(tmp.path().join("state")).unwrap();
    let tls = svc("secure.consul", &["10.0.0.9"]).with_tls(Tls { sni: Some("secure".into()) });
    let web = svc("web.consul", &["10.0.0.1", "10.0.0.2"]);
    dir.write(&key("a/b c"), &[&tls, &web]).unwrap();
    assert_eq!(dir.path(&key("a/b c")).file_name().unwrap(), "registry-consul-a-2fb-20c.json");
    assert_eq!(dir.read(&key("a/b c")).unwrap(), Some(vec![tls, web]));
    assert_eq!(dir.read(&key("other")).unwrap(), None);
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.dir()).unwrap().count(), 1);
}

#[test]
fn old_corrupt_and_foreign_files_are_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = StateDir::open(tmp.path()).unwrap();
    let k = key("a");
    std::fs::write(dir.path(&k), b"{\"format\": \"meshbridge.io/registry-state\", \"ver").unwrap();
    assert!(matches!(dir.read(&k), Err(DumpError::Corrupt { .. })), "{:?}", dir.read(&k));
    std::fs::write(dir.path(&k), br#"{"format": "meshbridge.io/registry-state", "version": 0, "services": 3}"#)
        .unwrap();
    let err = dir.read(&k).unwrap_err();
    assert!(matches!(err, DumpError::Version { version: 0, .. }), "{err}");
    dir.write(&key("b"), &[&svc("web.consul", &["10.0.0.1"])]).unwrap();
    std::fs::rename(dir.path(&key("b")), dir.path(&k)).unwrap();
    let err = dir.read(&k).unwrap_err();
    assert!(err.to_string().contains("holds registry consul/b, expected consul/a"), "{err}");

    // Loading skips them all, and the cache stays empty.
    let cache = Cache::new();
    assert_eq!(dir.load_into(&cache, std::slice::from_ref(&k)), 0);
    assert!(cache.registries().is_empty());
}

#[tokio::test]
async fn writes_answered_state_only_and_deletes_removed_registries() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = StateDir::open(tmp.path()).unwrap();
    dir.write(&key("loaded"), &[&svc("old.consul", &["10.0.0.7"])]).unwrap();
    let cache = Cache::new();
    assert_eq!(dir.load_into(&cache, &[key("loaded"), key("live")]), 1);
    let (report, services) = cache.registry(&key("loaded")).unwrap();
    assert!(report.status.stale && !report.status.ready);
    assert_eq!(services["old.consul"].endpoints[0].address, "10.0.0.7");

    let dumper = Dumper::new(dir.clone(), cache.clone());
    let live = cache.attach(&key("live"));
    // The stale registry's file is not rewritten; a registry that has not
    // answered yet has no file.
    assert_eq!(dumper.flush().await, 0);
    live.update(Update::Snapshot(vec![svc("web.consul", &["10.0.0.1"])]));
    assert_eq!(dumper.flush().await, 1);
    assert_eq!(dumper.flush().await, 0, "unchanged: not written again");
    assert_eq!(dir.read(&key("live")).unwrap().unwrap()[0].host, "web.consul");

    // The loaded registry answers: live state replaces the dump, on disk too.
    let loaded = cache.attach(&key("loaded"));
    loaded.update(Update::Snapshot(vec![svc("new.consul", &["10.0.0.8"])]));
    assert!(!cache.registry(&key("loaded")).unwrap().0.status.stale);
    assert_eq!(dumper.flush().await, 1);
    assert_eq!(dir.read(&key("loaded")).unwrap().unwrap()[0].host, "new.consul");

    // Removed from the config: its file goes, so it is never resurrected.
    cache.remove(&key("loaded"));
    dumper.flush().await;
    assert_eq!(dir.read(&key("loaded")).unwrap(), None);
    assert!(dir.read(&key("live")).unwrap().is_some());
}

#[test]
fn withdrawn_registry_is_emptied_and_restored_by_its_answer() {
    let cache = Cache::new();
    let sink = cache.attach(&key("a"));
    sink.update(Update::Snapshot(vec![svc("web.consul", &["10.0.0.1"])]));
    cache.withdraw(&key("a"));
    let (report, services) = cache.registry(&key("a")).unwrap();
    assert!(report.status.withdrawn);
    assert!(services["web.consul"].endpoints.is_empty(), "ports kept, endpoints gone");
    sink.update(Update::Snapshot(vec![svc("web.consul", &["10.0.0.1"])]));
    let (report, services) = cache.registry(&key("a")).unwrap();
    assert!(!report.status.withdrawn);
    assert_eq!(services["web.consul"].endpoints.len(), 1);
}
