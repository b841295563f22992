//! The `static` and `dns` watchers. DNS tests resolve against the fake DNS
//! server (`e2e/src/dns_fake.rs`) with a 1 s TTL, the shortest re-resolve
//! period the watcher allows; every assertion waits on the recorded sink
//! calls with a 10 s deadline.

use std::time::Duration;

use meshbridge_e2e::dns_fake::DnsFake;
use meshbridge_e2e::recorder::{self, Event};
use meshbridge_registries::dns::DnsWatcher;
use meshbridge_registries::{
    Protocol, RegistryError, RegistryKind, RegistrySpec, Service, Tls, Update, Watcher, watcher_for,
};

const DEADLINE: Duration = Duration::from_secs(10);

/// Records a `static` or `dns` watcher: its one service is the view.
type Recorder = recorder::Recorder<Option<Service>>;

/// Run `watcher`, recording its sink calls.
fn watch(watcher: Box<dyn Watcher>) -> Recorder {
    Recorder::start(watcher, DEADLINE)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn static_registry_sends_one_snapshot_with_ipv6() {
    let mut spec = RegistrySpec::new(RegistryKind::Static, "local-echo", "127.0.0.1:10081, [::1]:10082", 80);
    spec.protocol = Some("http".into());
    let mut rec = watch(watcher_for(&spec, meshbridge_registries::Selector::all()).expect("static is supported"));
    rec.until("snapshot and health", |r| r.events.len() >= 2).await;
    assert!(matches!(rec.events[..], [Event::Update(Update::Snapshot(_)), Event::Healthy]), "{:#?}", rec.events);
    let svc = rec.view.clone().unwrap();
    assert_eq!(svc.host, "local-echo.static");
    assert_eq!((svc.ports[0].number, svc.ports[0].protocol), (80, Protocol::Http));
    assert_eq!(rec.endpoints().unwrap(), strings(&["127.0.0.1|10081", "::1|10082"]));
    assert!(!rec.task.is_finished(), "the watcher idles until dropped");
}

fn dns_watcher(dns: &DnsFake, domain: &str, protocol: Option<&str>) -> Box<dyn Watcher> {
    let mut spec = RegistrySpec::new(RegistryKind::Dns, "ext", domain, 8443);
    spec.protocol = protocol.map(str::to_string);
    let watcher = DnsWatcher::new(spec)
        .expect("valid spec")
        .with_resolver_addr(dns.addr)
        .with_lookup_timeout(Duration::from_millis(500));
    Box::new(watcher)
}

#[tokio::test]
async fn dns_follows_the_records_after_their_ttl() {
    let dns = DnsFake::start(1).await.unwrap();
    dns.set("api.example.test", &["127.0.0.10", "::10"]);
    let mut rec = watch(dns_watcher(&dns, "api.example.test", Some("https")));
    rec.until("first answer", |r| r.view.is_some()).await;
    assert!(matches!(rec.updates_since(0).first(), Some(Update::Snapshot(_))), "{:#?}", rec.events);
    let svc = rec.view.clone().unwrap();
    assert_eq!(svc.host, "ext.dns");
    assert_eq!((svc.ports[0].number, svc.ports[0].protocol), (8443, Protocol::Https));
    assert_eq!(svc.tls, Some(Tls { sni: Some("api.example.test".into()) }), "one host: it is the SNI");
    assert_eq!(rec.endpoints().unwrap(), strings(&["127.0.0.10|8443", "::10|8443"]));

    let mark = rec.mark();
    dns.set("api.example.test", &["127.0.0.11"]);
    rec.until("the new address", |r| r.endpoints() == Some(strings(&["127.0.0.11|8443"]))).await;
    assert!(matches!(rec.updates_since(mark)[..], [Update::Upsert(_)]), "{:#?}", rec.updates_since(mark));
    assert!(rec.errors_since(0).is_empty(), "{:#?}", rec.errors_since(0));
    // Re-resolved on the TTL, not on every change: several queries by now.
    assert!(dns.queries("api.example.test") >= 4);
}

#[tokio::test]
async fn nxdomain_and_timeouts_keep_the_last_addresses() {
    let dns = DnsFake::start(1).await.unwrap();
    dns.set("api.example.test", &["127.0.0.10"]);
    let mut rec = watch(dns_watcher(&dns, "api.example.test", None));
    rec.until("first answer", |r| r.view.is_some()).await;
    let kept = strings(&["127.0.0.10|8443"]);

    let mark = rec.mark();
    dns.remove("api.example.test");
    rec.until("an NXDOMAIN error", |r| {
        r.errors_since(mark)
            .iter()
            .any(|e| matches!(e, RegistryError::BadResponse { reason, .. } if reason.contains("NXDOMAIN")))
    })
    .await;
    assert!(rec.updates_since(mark).is_empty(), "{:#?}", rec.events);
    assert_eq!(rec.endpoints(), Some(kept.clone()));

    let mark = rec.mark();
    dns.set("api.example.test", &["127.0.0.10"]);
    dns.set_silent("api.example.test", true);
    rec.until("a timeout error", |r| {
        r.errors_since(mark)
            .iter()
            .any(|e| matches!(e, RegistryError::Unreachable { reason, .. } if reason.contains("timed out")))
    })
    .await;
    assert!(rec.updates_since(mark).is_empty(), "{:#?}", rec.events);
    assert_eq!(rec.endpoints(), Some(kept));

    // Answers again, with a new address: picked up after the backoff.
    dns.set("api.example.test", &["127.0.0.12"]);
    dns.set_silent("api.example.test", false);
    rec.until("recovery", |r| r.endpoints() == Some(strings(&["127.0.0.12|8443"]))).await;
}

#[tokio::test]
async fn several_hosts_make_one_service() {
    let dns = DnsFake::start(1).await.unwrap();
    dns.set("a.example.test", &["127.0.0.21"]);
    dns.set("b.example.test", &["127.0.0.22", "127.0.0.21"]);
    let mut rec = watch(dns_watcher(&dns, "a.example.test,b.example.test,gone.example.test", Some("grpcs")));
    rec.until("first answer", |r| r.view.is_some()).await;
    assert_eq!(rec.endpoints().unwrap(), strings(&["127.0.0.21|8443", "127.0.0.22|8443"]));
    let svc = rec.view.clone().unwrap();
    assert_eq!((svc.ports[0].name.as_str(), svc.tls.clone()), ("grpc-8443", Some(Tls { sni: None })));
    assert!(rec.errors_since(0).iter().any(|e| e.to_string().contains("gone.example.test")), "{:#?}", rec.events);

    // One host failing later keeps its share of the addresses.
    let mark = rec.mark();
    dns.remove("b.example.test");
    rec.until("b fails", |r| r.errors_since(mark).iter().any(|e| e.to_string().contains("b.example.test"))).await;
    assert_eq!(rec.endpoints().unwrap(), strings(&["127.0.0.21|8443", "127.0.0.22|8443"]));
    dns.set("a.example.test", &["127.0.0.23"]);
    rec.until("a changes", |r| {
        r.endpoints() == Some(strings(&["127.0.0.21|8443", "127.0.0.22|8443", "127.0.0.23|8443"]))
    })
    .await;
}
