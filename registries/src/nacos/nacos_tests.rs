//! The shared loop against an in-memory [`Api`]: snapshot and removal
//! rules, answer ordering, partial refusals, outage and recovery.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize};

use tokio::sync::mpsc;

use super::api::PROBE_PAGE;
use super::decode::Instance;
use super::servers::grpc_addr;
use super::*;
use crate::model::Endpoint;

/// What a sink was told.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Update(Update),
    Healthy,
    Error(RegistryError),
    Drift(RepairKind, Vec<String>),
}

struct ChannelSink(mpsc::UnboundedSender<Event>);

impl Sink for ChannelSink {
    fn update(&self, update: Update) {
        let _ = self.0.send(Event::Update(update));
    }
    fn healthy(&self) {
        let _ = self.0.send(Event::Healthy);
    }
    fn error(&self, error: &RegistryError) {
        let _ = self.0.send(Event::Error(error.clone()));
    }
    fn repaired(&self, kind: RepairKind, hosts: &[String]) {
        let _ = self.0.send(Event::Drift(kind, hosts.to_vec()));
    }
}

/// An in-memory Nacos: group -> service -> instances.
#[derive(Default)]
struct FakeApi {
    data: Mutex<BTreeMap<String, BTreeMap<String, Vec<Instance>>>>,
    down: AtomicBool,
    /// Services whose instance reads are refused with this status.
    refuse: Mutex<BTreeMap<String, u16>>,
    /// Every call refused with this status.
    refuse_all: Mutex<Option<u16>>,
    /// Instance reads answered, per service name.
    reads: Mutex<BTreeMap<String, usize>>,
    /// Services whose next instance read is refused with a 500.
    fail_once: Mutex<BTreeSet<String>>,
    /// Services whose instance reads take this long.
    slow: Mutex<BTreeMap<String, Duration>>,
    /// The queue a push client's subscriptions feed ([`PushFake`]).
    pushed: Mutex<Option<Arc<Pushed>>>,
    /// Instance reads in flight now, and the most there were.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl FakeApi {
    fn set(&self, group: &str, service: &str, instances: Vec<Instance>) {
        let mut data = self.data.lock().unwrap();
        data.entry(group.into()).or_default().insert(service.into(), instances);
    }

    fn delete(&self, group: &str, service: &str) {
        self.data.lock().unwrap().entry(group.into()).or_default().remove(service);
    }

    fn check(&self) -> Result<(), RegistryError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(RegistryError::Unreachable { registry: "n".into(), reason: "down".into() });
        }
        if let Some(status) = *self.refuse_all.lock().unwrap() {
            return Err(RegistryError::Status { registry: "n".into(), what: "list".into(), status });
        }
        Ok(())
    }
}

impl Api for FakeApi {
    async fn list_services(&self, group: &str) -> Result<Vec<String>, RegistryError> {
        self.check()?;
        Ok(self.data.lock().unwrap().get(group).map(|s| s.keys().cloned().collect()).unwrap_or_default())
    }

    async fn instances(&self, key: &ServiceKey) -> Result<Vec<Instance>, RegistryError> {
        self.check()?;
        let slow = self.slow.lock().unwrap().get(&key.name).copied();
        if let Some(slow) = slow {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(slow).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        if self.fail_once.lock().unwrap().remove(&key.name) {
            return Err(RegistryError::Status { registry: "n".into(), what: "instances".into(), status: 500 });
        }
        if let Some(status) = self.refuse.lock().unwrap().get(&key.name) {
            return Err(RegistryError::Status { registry: "n".into(), what: "instances".into(), status: *status });
        }
        *self.reads.lock().unwrap().entry(key.name.clone()).or_default() += 1;
        let data = self.data.lock().unwrap();
        Ok(data.get(&key.group).and_then(|s| s.get(&key.name)).cloned().unwrap_or_default())
    }

    async fn probe(&self, group: &str) -> Result<Probe, RegistryError> {
        self.check()?;
        let data = self.data.lock().unwrap();
        let names: Vec<String> =
            data.get(group).map(|s| s.keys().take(PROBE_PAGE).cloned().collect()).unwrap_or_default();
        Ok(Probe::new(data.get(group).map_or(0, |s| s.len()), names))
    }
}

fn instance(ip: &str, port: i64) -> Instance {
    Instance { ip: ip.into(), port, weight: 1.0, healthy: true, enabled: true, metadata: BTreeMap::new() }
}

fn ctx(groups: &[&str]) -> (Arc<Ctx>, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink: Arc<dyn Sink> = Arc::new(ChannelSink(tx));
    let spec = RegistrySpec::new(RegistryKind::Nacos2, "n", "127.0.0.1", 8848);
    let ctx = Ctx {
        naming: Naming::new(&spec),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        refresh: Duration::from_secs(2),
        anti_entropy: Duration::from_secs(20),
        health: Health::new(sink.clone()),
        sink,
        state: Mutex::default(),
        seq: AtomicU64::new(0),
        selection: Mutex::new(crate::select::Selection::all()),
    };
    (Arc::new(ctx), rx)
}

/// Run `session` as a task against one fixed server.
fn spawn_session<A: Api>(session: Session<A>) -> tokio::task::JoinHandle<End> {
    let current = vec!["127.0.0.1:8848".to_string()];
    let servers = Servers::Fixed(current.clone());
    tokio::spawn(async move { session.run(&servers, &current, &mut crate::Selector::all()).await })
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Event>) -> Vec<Event> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

fn updates(events: &[Event]) -> Vec<&Update> {
    events.iter().filter_map(|e| if let Event::Update(u) = e { Some(u) } else { None }).collect()
}

fn hosts(update: &Update) -> Vec<(String, usize)> {
    match update {
        Update::Snapshot(all) => all.iter().map(|s| (s.host.clone(), s.endpoints.len())).collect(),
        other => panic!("not a snapshot: {other:?}"),
    }
}

const WEB: &str = "web.DEFAULT-GROUP.public.nacos";

#[tokio::test]
async fn syncs_are_snapshots_and_leavers_are_removed() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP", "shop_v2"]);
    let api = FakeApi::default();
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    api.set("shop_v2", "cart", vec![]);
    api.set("DEFAULT_GROUP", "consumers:com.foo.Api::", vec![instance("10.0.0.9", 1)]);
    api.set("other", "hidden", vec![instance("10.0.0.8", 1)]);
    ctx.sync(&api, None).await.unwrap();
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert_eq!(ups.len(), 1, "{events:?}");
    assert_eq!(hosts(ups[0]), vec![("cart.shop-v2.public.nacos".to_string(), 0), (WEB.to_string(), 1)]);
    assert!(events.contains(&Event::Healthy));

    api.delete("shop_v2", "cart");
    api.set("DEFAULT_GROUP", "web", vec![]);
    ctx.sync(&api, None).await.unwrap();
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert_eq!(ups[0], &Update::Remove("cart.shop-v2.public.nacos".into()));
    // An empty list is an answer: web stays, empty, with its last port.
    assert_eq!(hosts(ups[1]), vec![(WEB.to_string(), 0)]);
    let Update::Snapshot(all) = ups[1] else { unreachable!() };
    assert_eq!(all[0].ports[0].number, 80);
}

#[tokio::test]
async fn an_older_answer_never_overwrites_a_newer_one() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let api = FakeApi::default();
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    ctx.sync(&api, None).await.unwrap();
    let key = ServiceKey::new("DEFAULT_GROUP", "web");
    let old = ctx.next_seq();
    let new = ctx.next_seq();
    ctx.apply_one(&key, new, endpoints(vec![instance("10.0.0.2", 80)]));
    ctx.apply_one(&key, old, endpoints(vec![instance("10.0.0.3", 80)]));
    // A read for a service no longer watched is dropped too.
    ctx.apply_one(&ServiceKey::new("DEFAULT_GROUP", "gone"), ctx.next_seq(), endpoints(vec![instance("10.0.0.4", 80)]));
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert_eq!(ups.len(), 2, "{events:?}");
    let Update::Upsert(svc) = ups[1] else { panic!("{ups:?}") };
    assert_eq!(svc.endpoints[0].address, "10.0.0.2");
    // A full sync whose read of web was asked before that push keeps the push's.
    let answers = vec![(key.clone(), old, Some(endpoints(vec![instance("10.0.0.5", 80)])))];
    ctx.apply_sync(Read { listed_at: old, probed: Vec::new(), answers }, true, None);
    let events = drain(&mut rx);
    let Update::Snapshot(all) = updates(&events)[0] else { panic!() };
    assert_eq!(all[0].endpoints[0].address, "10.0.0.2");
}

#[tokio::test]
async fn one_refused_service_keeps_its_state_but_outages_fail_the_sync() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let api = FakeApi::default();
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    api.set("DEFAULT_GROUP", "api", vec![instance("10.0.0.2", 81)]);
    ctx.sync(&api, None).await.unwrap();
    drain(&mut rx);

    api.refuse.lock().unwrap().insert("api".into(), 500);
    api.set("DEFAULT_GROUP", "api", vec![]);
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80), instance("10.0.0.3", 80)]);
    ctx.sync(&api, None).await.unwrap();
    let events = drain(&mut rx);
    assert!(events.iter().any(|e| matches!(e, Event::Error(RegistryError::Status { status: 500, .. }))));
    let Update::Snapshot(all) = updates(&events)[0] else { panic!("{events:?}") };
    let got: Vec<(String, usize)> = all.iter().map(|s| (s.host.clone(), s.endpoints.len())).collect();
    assert_eq!(got, vec![("api.DEFAULT-GROUP.public.nacos".into(), 1), (WEB.into(), 2)]);

    // Refused for credentials, or unreachable: no update at all.
    api.refuse.lock().unwrap().insert("api".into(), 403);
    assert!(matches!(ctx.sync(&api, None).await, Err(RegistryError::Status { status: 403, .. })));
    api.down.store(true, Ordering::SeqCst);
    assert!(matches!(ctx.sync(&api, None).await, Err(RegistryError::Unreachable { .. })));
    assert!(updates(&drain(&mut rx)).is_empty());
}

/// A full read takes seconds at 10k services (over HTTP, 8 reads at a
/// time). A new service is read at the next probe all the same, one
/// deleted meanwhile leaves at the next probe, and the full read, which
/// listed before either, undoes neither when it ends.
#[tokio::test(start_paused = true)]
async fn services_come_and_go_during_a_full_read_in_progress() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let api = Arc::new(FakeApi::default());
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    api.set("DEFAULT_GROUP", "api", vec![instance("10.0.0.2", 81)]);
    let task = spawn_session(Session::new_shared(api.clone(), ctx.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(updates(&drain(&mut rx)).len(), 1);
    // The next full read (the refresh, at 2 s) takes 10 s: web's read.
    api.slow.lock().unwrap().insert("web".into(), Duration::from_secs(10));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(api.in_flight.load(Ordering::SeqCst), 1, "the full read is under way");
    let is = |name: &str, host: &str| host.starts_with(&format!("{name}."));

    api.set("DEFAULT_GROUP", "cart", vec![instance("10.0.0.9", 90)]);
    tokio::time::sleep(PROBE_EVERY + Duration::from_millis(100)).await;
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert!(ups.iter().any(|u| matches!(u, Update::Upsert(s) if is("cart", &s.host))), "cart late: {events:?}");

    api.delete("DEFAULT_GROUP", "api");
    tokio::time::sleep(PROBE_EVERY + Duration::from_millis(100)).await;
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert!(ups.iter().any(|u| matches!(u, Update::Remove(h) if is("api", h))), "api stays: {events:?}");

    // The full read ends: cart stays, api stays gone.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let events = drain(&mut rx);
    let ups = updates(&events);
    let Some(Update::Snapshot(all)) = ups.last() else { panic!("no snapshot: {events:?}") };
    let hosts: Vec<&str> = all.iter().map(|s| s.host.split('.').next().unwrap_or_default()).collect();
    assert_eq!(hosts, ["cart", "web"], "{events:?}");
    assert!(!ups.iter().any(|u| matches!(u, Update::Remove(h) if is("cart", h))), "{events:?}");
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn session_keeps_endpoints_through_an_outage_and_resyncs_after() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let api = Arc::new(FakeApi::default());
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    let task = spawn_session(Session::new_shared(api.clone(), ctx.clone()));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(hosts(updates(&drain(&mut rx))[0]), vec![(WEB.to_string(), 1)]);

    api.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(7)).await;
    let events = drain(&mut rx);
    assert!(events.iter().filter(|e| matches!(e, Event::Error(_))).count() >= 3, "{events:?}");
    assert!(updates(&events).is_empty(), "{events:?}");

    // Back: the probe notices within its period and a snapshot follows at once.
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80), instance("10.0.0.2", 80)]);
    api.down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert!(!ups.is_empty(), "{events:?}");
    assert_eq!(hosts(ups[0]), vec![(WEB.to_string(), 2)]);
    task.abort();
}

/// The fake as a push client (a subscription only keeps the queue, so
/// that a test can push).
struct PushFake(Arc<FakeApi>);

impl Api for PushFake {
    async fn list_services(&self, group: &str) -> Result<Vec<String>, RegistryError> {
        self.0.list_services(group).await
    }
    async fn instances(&self, key: &ServiceKey) -> Result<Vec<Instance>, RegistryError> {
        self.0.instances(key).await
    }
    async fn probe(&self, group: &str) -> Result<Probe, RegistryError> {
        self.0.probe(group).await
    }
    const READS_IN_FLIGHT: usize = GrpcApi::READS_IN_FLIGHT;
    const PUSH: bool = true;
    async fn subscribe(&self, _key: &ServiceKey, pushed: Arc<Pushed>) -> Result<(), RegistryError> {
        *self.0.pushed.lock().unwrap() = Some(pushed);
        Ok(())
    }
}

impl FakeApi {
    /// Push `service` (no instances announced), as the server would.
    fn push(&self, group: &str, service: &str) {
        let pushed = self.pushed.lock().unwrap().clone().expect("subscribed");
        pushed.mark(&ServiceKey::new(group, service), None);
    }
}

/// A push client whose calls fail (server down, or hung) is kept: it
/// reconnects by itself, and a new client could do no better.
#[tokio::test(start_paused = true)]
async fn a_failing_push_client_is_not_replaced() {
    let fake = Arc::new(FakeApi::default());
    fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    let (ctx, _rx) = ctx(&["DEFAULT_GROUP"]);
    let run = spawn_session(Session::new(PushFake(fake.clone()), ctx));
    // Failing (down, or hung): the same client goes on.
    tokio::time::sleep(Duration::from_millis(10)).await;
    fake.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!run.is_finished());
    run.abort();
}

#[tokio::test(start_paused = true)]
async fn refused_tokens_rebuild_a_client_that_worked_only() {
    let fake = Arc::new(FakeApi::default());
    fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);

    // Worked, then refused: the session ends for a new client.
    let (ctx1, _rx) = ctx(&["DEFAULT_GROUP"]);
    let run = spawn_session(Session::new(PushFake(fake.clone()), ctx1));
    tokio::time::sleep(Duration::from_millis(10)).await;
    *fake.refuse_all.lock().unwrap() = Some(403);
    let end = tokio::time::timeout(Duration::from_secs(10), run).await.expect("session ends").unwrap();
    assert!(matches!(end, End::Reconnect));

    // Never worked: keeps trying with the same client, errors only.
    let (ctx2, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let run = spawn_session(Session::new(PushFake(fake.clone()), ctx2));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!run.is_finished());
    run.abort();
    let events = drain(&mut rx);
    assert!(events.iter().filter(|e| matches!(e, Event::Error(_))).count() >= 3);
    assert!(updates(&events).is_empty());
}

/// Between full reads a push client lists again and reads only new
/// services (and unsubscribed ones), sending only what changed; every
/// anti-entropy interval it reads everything.
#[tokio::test(start_paused = true)]
async fn push_clients_read_only_new_services_between_full_reads() {
    let fake = Arc::new(FakeApi::default());
    fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    fake.set("DEFAULT_GROUP", "cart", vec![instance("10.0.0.2", 80)]);
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let (refresh, anti_entropy) = (ctx.refresh, ctx.anti_entropy);
    let run = spawn_session(Session::new(PushFake(fake.clone()), ctx));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(hosts(updates(&drain(&mut rx))[0]).len(), 2);

    // A change nobody announced is not read; a new service and a leaver are.
    fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.9", 80)]);
    fake.set("DEFAULT_GROUP", "api", vec![instance("10.0.0.3", 81)]);
    fake.delete("DEFAULT_GROUP", "cart");
    tokio::time::sleep(refresh).await;
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert_eq!(ups.len(), 2, "{events:?}");
    assert_eq!(ups[0], &Update::Remove("cart.DEFAULT-GROUP.public.nacos".into()));
    assert!(matches!(ups[1], Update::Upsert(s) if s.host == "api.DEFAULT-GROUP.public.nacos"), "{ups:?}");
    tokio::time::sleep(anti_entropy - refresh * 2).await;
    assert!(updates(&drain(&mut rx)).is_empty());
    let reads = |name: &str| fake.reads.lock().unwrap().get(name).copied().unwrap_or(0);
    assert_eq!((reads("web"), reads("api")), (1, 1));

    // The full read: the unannounced change is seen, in a snapshot.
    tokio::time::sleep(refresh).await;
    let events = drain(&mut rx);
    let ups = updates(&events);
    assert_eq!(ups.len(), 1, "{events:?}");
    let Update::Snapshot(all) = ups[0] else { panic!("{ups:?}") };
    assert_eq!(all[1].endpoints[0].address, "10.0.0.9");
    assert_eq!(reads("web"), 2);
    run.abort();
}

/// A new service is read within a probe period (500 ms), not a refresh
/// interval: the probe counts the services, and a count that differs from
/// the last listing's lists again and reads only the new services. Both for
/// push (gRPC) and polling (HTTP) clients.
#[tokio::test(start_paused = true)]
async fn a_changed_service_count_lists_again_within_a_probe_period() {
    async fn check<A: Api>(api: Arc<A>, fake: Arc<FakeApi>) {
        let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
        let Ok(mut ctx) = Arc::try_unwrap(ctx) else { panic!("one owner") };
        ctx.refresh = Duration::from_secs(600);
        ctx.anti_entropy = Duration::from_secs(600);
        let run = spawn_session(Session::new_shared(api, Arc::new(ctx)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(hosts(updates(&drain(&mut rx))[0]).len(), 1);

        fake.set("DEFAULT_GROUP", "api", vec![instance("10.0.0.3", 81)]);
        tokio::time::sleep(PROBE_EVERY + Duration::from_millis(10)).await;
        let events = drain(&mut rx);
        let ups = updates(&events);
        assert_eq!(ups.len(), 1, "{events:?}");
        assert!(matches!(ups[0], Update::Upsert(s) if s.host == "api.DEFAULT-GROUP.public.nacos"), "{ups:?}");
        let reads = |name: &str| fake.reads.lock().unwrap().get(name).copied().unwrap_or(0);
        assert_eq!((reads("web"), reads("api")), (1, 1), "only the new service is read");

        fake.delete("DEFAULT_GROUP", "api");
        tokio::time::sleep(PROBE_EVERY).await;
        let events = drain(&mut rx);
        assert_eq!(updates(&events), vec![&Update::Remove("api.DEFAULT-GROUP.public.nacos".into())]);

        // The same count: nothing is listed or read until the refresh.
        tokio::time::sleep(PROBE_EVERY * 3).await;
        assert!(updates(&drain(&mut rx)).is_empty());
        assert_eq!(reads("web"), 1);
        run.abort();
    }
    for push in [true, false] {
        let fake = Arc::new(FakeApi::default());
        fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
        if push {
            check(Arc::new(PushFake(fake.clone())), fake).await;
        } else {
            check(fake.clone(), fake).await;
        }
    }
}

/// A push announcing the endpoints already sent is not read, and counts as
/// the newest answer; one announcing anything else is read.
#[tokio::test]
async fn announcements_of_what_was_sent_are_not_read() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let api = FakeApi::default();
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    ctx.sync(&api, None).await.unwrap();
    drain(&mut rx);
    let key = ServiceKey::new("DEFAULT_GROUP", "web");
    let asked_before = ctx.next_seq();
    assert!(ctx.already_sent(&key, vec![instance("10.0.0.1", 80)]));
    // A read asked before that announcement and answered after it is older.
    ctx.apply_one(&key, asked_before, endpoints(vec![instance("10.0.0.7", 80)]));
    assert!(updates(&drain(&mut rx)).is_empty());
    assert!(!ctx.already_sent(&key, vec![instance("10.0.0.1", 80), instance("10.0.0.2", 80)]));
    assert!(!ctx.already_sent(&key, vec![instance("localhost", 80)]), "host names are resolved, so read");
    assert!(!ctx.already_sent(&ServiceKey::new("DEFAULT_GROUP", "other"), vec![]));
}

#[test]
fn grpc_port_is_the_http_port_plus_1000() {
    assert_eq!(grpc_addr("127.0.0.1:8848").as_deref(), Some("127.0.0.1:9848"));
    assert_eq!(grpc_addr("[::1]:8848").as_deref(), Some("[::1]:9848"));
    assert_eq!(grpc_addr("h:65000"), None);
    assert_eq!(grpc_addr("h"), None);
}

#[tokio::test]
async fn host_names_resolve_and_bad_ones_drop_alone() {
    let ep = |a: &str| Endpoint { address: a.into(), port: 80, weight: 1, labels: Default::default() };
    let decoded = Endpoints {
        endpoints: vec![ep("10.0.0.1"), ep("localhost"), ep("no-such-host.invalid")],
        ..Default::default()
    };
    let out = resolve(decoded).await;
    assert_eq!(out.endpoints[0].address, "10.0.0.1");
    assert!(out.endpoints[1..].iter().all(|e| e.address.parse::<IpAddr>().unwrap().is_loopback()), "{out:?}");
    assert_eq!(out.skipped, 1);
}

#[test]
fn spec_rules() {
    let mut spec = RegistrySpec::new(RegistryKind::Nacos, "n", "127.0.0.1", 8848);
    spec.nacos_groups = vec!["".into(), "a".into(), " a ".into(), "b".into()];
    spec.nacos_refresh_interval = Some(Duration::from_millis(10));
    let w = NacosWatcher::new(spec.clone()).unwrap();
    assert_eq!((w.protocol, w.groups.clone(), w.refresh), (Protocol::Http, vec!["a".into(), "b".into()], MIN_REFRESH));
    assert_eq!(w.namespace_id, "public");
    spec.kind = RegistryKind::Nacos3;
    spec.nacos_groups.clear();
    spec.nacos_namespace_id = Some("dev".into());
    let w = NacosWatcher::new(spec.clone()).unwrap();
    assert_eq!(
        (w.protocol, w.groups.clone(), w.namespace_id.clone()),
        (Protocol::Grpc, vec![DEFAULT_GROUP.to_string()], "dev".into())
    );
    spec.kind = RegistryKind::Consul;
    assert!(NacosWatcher::new(spec).is_err());
}

#[test]
fn drift_is_only_a_push_taken_and_not_applied() {
    let svc = |port| {
        let ep = Endpoint { address: "10.0.0.1".into(), port, weight: 1, labels: Default::default() };
        Service::new("web.DEFAULT-GROUP.public.nacos", vec![], vec![ep])
    };
    let read = svc(8081);
    let pushed = Some(Announced { digest: digest(&read), seq: 5 });
    assert!(missed_push(pushed, &read, 9, false), "pushed, taken, done, and still not sent");
    assert!(!missed_push(pushed, &read, 9, true), "still queued or being read");
    assert!(!missed_push(pushed, &read, 4, false), "taken after the full read was asked for");
    let other = Some(Announced { digest: digest(&svc(8080)), seq: 5 });
    assert!(!missed_push(other, &read, 9, false), "the last push announced something else: not pushed yet");
    assert!(!missed_push(None, &read, 9, false), "never pushed (rnacos does not push heartbeat health)");
}

/// A push a reader took but whose change never reached the sink is drift
/// at the next periodic full read; a change never pushed is not, and
/// neither is a service still waiting for a reader.
#[tokio::test]
async fn a_periodic_full_read_counts_a_push_taken_but_not_applied() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let api = FakeApi::default();
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    api.set("DEFAULT_GROUP", "api", vec![instance("10.0.0.2", 81)]);
    api.set("DEFAULT_GROUP", "cart", vec![instance("10.0.0.3", 82)]);
    ctx.sync(&api, None).await.unwrap();
    drain(&mut rx);
    let pushed = Pushed::default();
    let key = |name: &str| ServiceKey::new("DEFAULT_GROUP", name);

    // web: pushed and taken (the reader then loses it); api: changed and
    // never pushed; cart: pushed, still queued.
    let web = vec![instance("10.0.0.1", 80), instance("10.0.0.4", 80)];
    assert!(!ctx.already_sent(&key("web"), web.clone()), "a change");
    api.set("DEFAULT_GROUP", "web", web);
    api.set("DEFAULT_GROUP", "api", vec![]);
    let cart = vec![instance("10.0.0.5", 82)];
    assert!(!ctx.already_sent(&key("cart"), cart.clone()));
    api.set("DEFAULT_GROUP", "cart", cart);
    pushed.mark(&key("cart"), None);

    ctx.sync(&api, Some(&pushed)).await.unwrap();
    let events = drain(&mut rx);
    let drift: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::Drift(..))).collect();
    assert_eq!(drift, [&Event::Drift(RepairKind::MissedChange, vec![WEB.to_string()])], "{events:?}");
    let first = events.iter().position(|e| matches!(e, Event::Drift(..))).unwrap();
    assert!(events[first..].iter().any(|e| matches!(e, Event::Update(Update::Snapshot(_)))), "the correction follows");

    // Not periodic (after a failure, at start): never judged.
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.6", 80)]);
    assert!(!ctx.already_sent(&key("web"), vec![instance("10.0.0.6", 80)]));
    ctx.sync(&api, None).await.unwrap();
    assert!(!drain(&mut rx).iter().any(|e| matches!(e, Event::Drift(..))));
}

/// The probe covers every group of `nacosGroups`, and sees a service
/// swapped for another (the count unchanged): both are read within a probe
/// period, not a refresh interval (issue 33, H1).
#[tokio::test(start_paused = true)]
async fn a_new_service_in_any_group_and_a_swap_are_read_within_a_probe_period() {
    async fn check<A: Api>(api: Arc<A>, fake: Arc<FakeApi>) {
        let (ctx, mut rx) = ctx(&["DEFAULT_GROUP", "shop_v2"]);
        let Ok(mut ctx) = Arc::try_unwrap(ctx) else { panic!("one owner") };
        ctx.refresh = Duration::from_secs(600);
        ctx.anti_entropy = Duration::from_secs(600);
        let run = spawn_session(Session::new_shared(api, Arc::new(ctx)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(hosts(updates(&drain(&mut rx))[0]).len(), 1);

        fake.set("shop_v2", "cart", vec![instance("10.0.0.3", 81)]);
        tokio::time::sleep(PROBE_EVERY + Duration::from_millis(10)).await;
        let events = drain(&mut rx);
        let ups = updates(&events);
        assert_eq!(ups.len(), 1, "{events:?}");
        assert!(matches!(ups[0], Update::Upsert(s) if s.host == "cart.shop-v2.public.nacos"), "{ups:?}");

        // One service deleted and another created between two probes.
        fake.delete("DEFAULT_GROUP", "web");
        fake.set("DEFAULT_GROUP", "api", vec![instance("10.0.0.4", 82)]);
        tokio::time::sleep(PROBE_EVERY).await;
        let events = drain(&mut rx);
        let ups = updates(&events);
        assert_eq!(ups.len(), 2, "{events:?}");
        assert_eq!(ups[0], &Update::Remove(WEB.into()));
        assert!(matches!(ups[1], Update::Upsert(s) if s.host == "api.DEFAULT-GROUP.public.nacos"), "{ups:?}");

        // Nothing moved: nothing is listed or read until the refresh.
        let reads = fake.reads.lock().unwrap().clone();
        tokio::time::sleep(PROBE_EVERY * 3).await;
        assert!(updates(&drain(&mut rx)).is_empty());
        assert_eq!(*fake.reads.lock().unwrap(), reads);
        run.abort();
    }
    for push in [true, false] {
        let fake = Arc::new(FakeApi::default());
        fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
        if push {
            check(Arc::new(PushFake(fake.clone())), fake).await;
        } else {
            check(fake.clone(), fake).await;
        }
    }
}

/// A push whose read fails while a full read is under way (the full read
/// read the service before the change, and its success clears the failure)
/// is read again after a backoff, not at the next full read (issue 33, H9).
#[tokio::test(start_paused = true)]
async fn a_failed_push_read_during_a_full_read_is_read_again() {
    let fake = Arc::new(FakeApi::default());
    fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    fake.set("DEFAULT_GROUP", "slow", vec![instance("10.0.0.2", 80)]);
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let Ok(mut ctx) = Arc::try_unwrap(ctx) else { panic!("one owner") };
    ctx.refresh = Duration::from_secs(600);
    ctx.anti_entropy = Duration::from_secs(20);
    let run = spawn_session(Session::new(PushFake(fake.clone()), Arc::new(ctx)));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(hosts(updates(&drain(&mut rx))[0]).len(), 2);

    // The full read at 20 s reads web at once and slow for 3 s.
    fake.slow.lock().unwrap().insert("slow".into(), Duration::from_secs(3));
    tokio::time::sleep(Duration::from_millis(20_500)).await;
    assert_eq!(fake.reads.lock().unwrap()["web"], 2, "the full read read web");
    fake.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.9", 80)]);
    fake.fail_once.lock().unwrap().insert("web".into());
    fake.push("DEFAULT_GROUP", "web");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(fake.fail_once.lock().unwrap().is_empty(), "the push read failed");

    // Well before the next full read (40 s), web is read again.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let events = drain(&mut rx);
    let web = |s: &Service| s.host == WEB && s.endpoints[0].address == "10.0.0.9";
    let sent = updates(&events).iter().any(|u| match u {
        Update::Upsert(s) => web(s),
        Update::Snapshot(all) => all.iter().any(web),
        Update::Remove(_) => false,
    });
    assert!(sent, "{events:?}");
    assert!(!events.iter().any(|e| matches!(e, Event::Drift(..))), "a retried read is no repair: {events:?}");
    run.abort();
}

/// A service whose read a sync refused keeps its last record (and the
/// error is reported); the next sync that reads it with a difference
/// counts it as `Unreadable`, and one that reads it unchanged counts
/// nothing.
#[tokio::test]
async fn a_service_unreadable_then_read_with_a_difference_is_counted() {
    let (ctx, mut rx) = ctx(&["DEFAULT_GROUP"]);
    let api = FakeApi::default();
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.1", 80)]);
    api.set("DEFAULT_GROUP", "api", vec![instance("10.0.0.2", 81)]);
    ctx.sync(&api, None).await.unwrap();
    drain(&mut rx);

    api.refuse.lock().unwrap().insert("web".into(), 500);
    api.refuse.lock().unwrap().insert("api".into(), 500);
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.3", 80)]);
    ctx.sync(&api, None).await.unwrap();
    let events = drain(&mut rx);
    assert!(events.iter().any(|e| matches!(e, Event::Error(RegistryError::Status { status: 500, .. }))));
    let Update::Snapshot(all) = updates(&events)[0] else { panic!("{events:?}") };
    assert_eq!(all[1].endpoints[0].address, "10.0.0.1", "kept");
    assert!(!events.iter().any(|e| matches!(e, Event::Drift(..))), "{events:?}");

    api.refuse.lock().unwrap().clear();
    ctx.sync(&api, None).await.unwrap();
    let events = drain(&mut rx);
    let drift: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::Drift(..))).collect();
    assert_eq!(drift, [&Event::Drift(RepairKind::Unreadable, vec![WEB.to_string()])], "{events:?}");
    let Update::Snapshot(all) = updates(&events)[0] else { panic!("{events:?}") };
    assert_eq!(all[1].endpoints[0].address, "10.0.0.3", "repaired");

    // Readable since: nothing more is counted.
    api.set("DEFAULT_GROUP", "web", vec![instance("10.0.0.4", 80)]);
    ctx.sync(&api, None).await.unwrap();
    assert!(!drain(&mut rx).iter().any(|e| matches!(e, Event::Drift(..))));
}

/// A full read keeps its client's reads in flight: 8 over HTTP, 64 on
/// gRPC's one connection ([`PushFake`] stands in for it).
async fn reads_in_flight<A: Api>(api: &A, fake: &FakeApi) -> usize {
    let (ctx, _rx) = ctx(&["DEFAULT_GROUP"]);
    for i in 0..200 {
        let name = format!("svc-{i}");
        fake.set("DEFAULT_GROUP", &name, vec![instance("10.0.0.1", 80)]);
        fake.slow.lock().unwrap().insert(name, Duration::from_millis(10));
    }
    ctx.sync(api, None).await.unwrap();
    fake.max_in_flight.load(Ordering::SeqCst)
}

#[tokio::test(start_paused = true)]
async fn a_full_read_keeps_its_clients_reads_in_flight() {
    let http = FakeApi::default();
    assert_eq!(reads_in_flight(&http, &http).await, FakeApi::READS_IN_FLIGHT);
    assert_eq!(FakeApi::READS_IN_FLIGHT, 8);
    let grpc = PushFake(Arc::new(FakeApi::default()));
    assert_eq!(reads_in_flight(&grpc, &grpc.0).await, PushFake::READS_IN_FLIGHT);
    assert_eq!(PushFake::READS_IN_FLIGHT, GrpcApi::READS_IN_FLIGHT);
}

/// The Nacos page states the probe period and the listing page size this
/// watcher uses.
#[test]
fn the_registry_page_states_the_probe_period_and_the_listing_page() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/registries/nacos.md");
    let page = std::fs::read_to_string(path).expect("docs/src/registries/nacos.md");
    let stated = format!("A health probe every {} ms", PROBE_EVERY.as_millis());
    assert!(page.contains(&stated), "docs/src/registries/nacos.md does not say {stated:?}");
    let thousands = super::api::LIST_PAGE / 1000;
    let stated = format!("A listing asks for {thousands},000 names a page");
    assert!(
        super::api::LIST_PAGE.is_multiple_of(1000) && page.contains(&stated),
        "docs/src/registries/nacos.md does not say {stated:?}"
    );
}
