//! Per-change cost of the stream state machines: a change to one of many
//! resources compares that resource alone, on SotW and delta streams.

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::Any;
use prost::Message;

use super::delta::DeltaStream;
use super::sotw::SotwStream;
use super::*;
use crate::resources::Resource;
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};

const N: usize = 10_000;

fn res(name: &str, body: &str) -> Resource {
    Resource::new(name, Any { type_url: "t".into(), value: body.as_bytes().to_vec() })
}

fn name(i: usize) -> String {
    format!("outbound|8080||svc-{i:05}.dc1.consul")
}

fn initial() -> ConfigSet {
    let mut set = ConfigSet { revision: 1, ..Default::default() };
    for type_url in [CLUSTER_TYPE, ENDPOINT_TYPE] {
        let t = set.envoy.entry(type_url).or_default();
        for i in 0..N {
            t.insert(1, res(&name(i), &format!("{type_url} {i}")));
        }
    }
    set
}

/// The publisher's next set: the same maps with one change.
fn next(prev: &ConfigSet, type_url: &'static str, i: usize, body: &str) -> ConfigSet {
    let mut set = ConfigSet { revision: prev.revision + 1, envoy: prev.envoy.clone(), ..Default::default() };
    if let Some(t) = set.envoy.get_mut(type_url) {
        t.insert(set.revision, res(&name(i), body));
    }
    set
}

#[test]
fn a_change_to_one_of_many_resources_compares_only_it() {
    let clients = Clients::new();
    let set = initial();
    let all: Vec<String> = (0..N).map(name).collect();

    let mut sotw = SotwStream::new(clients.connect("test", "sotw"));
    let cds = sotw.on_request(&DiscoveryRequest { type_url: CLUSTER_TYPE.into(), ..Default::default() }, &set);
    assert_eq!(cds[0].resources.len(), N);
    let eds = DiscoveryRequest { type_url: ENDPOINT_TYPE.into(), resource_names: all.clone(), ..Default::default() };
    let eds = sotw.on_request(&eds, &set);
    assert_eq!(eds[0].resources.len(), N);
    // The client ACKs every response (the next push of a type waits for it).
    let acks = |sotw: &mut SotwStream, out: &[SotwResponse], set: &ConfigSet| {
        for r in out {
            let names = if r.type_url == ENDPOINT_TYPE { all.clone() } else { Vec::new() };
            assert!(sotw.on_request(&r.ack(&names), set).is_empty(), "an ACK is not answered");
        }
    };
    acks(&mut sotw, &cds, &set);
    acks(&mut sotw, &eds, &set);

    let mut delta = DeltaStream::new(clients.connect("test", "delta"));
    for type_url in [CLUSTER_TYPE, ENDPOINT_TYPE] {
        let req = DeltaDiscoveryRequest {
            type_url: type_url.into(),
            resource_names_subscribe: vec!["*".into()],
            ..Default::default()
        };
        assert_eq!(delta.on_request(&req, &set)[0].resources.len(), N);
    }

    // An endpoint change: one EDS resource compared, one sent.
    let (s0, d0) = (sotw.examined(), delta.examined());
    let set = next(&set, ENDPOINT_TYPE, 42, "new endpoints");
    let out = sotw.on_change(&set);
    assert_eq!(out.iter().map(|r| (r.type_url.as_str(), r.resources.len())).collect::<Vec<_>>(), [(ENDPOINT_TYPE, 1)]);
    acks(&mut sotw, &out, &set);
    let out = delta.on_change(&set);
    assert_eq!(out.iter().map(|r| (r.type_url.as_str(), r.resources.len())).collect::<Vec<_>>(), [(ENDPOINT_TYPE, 1)]);
    assert_eq!((sotw.examined() - s0, delta.examined() - d0), (1, 1));

    // A cluster change: SotW CDS is full state (all N sent), but only the
    // changed cluster and its forced EDS are compared.
    let (s0, d0) = (sotw.examined(), delta.examined());
    let set = next(&set, CLUSTER_TYPE, 7, "new cluster");
    let out = sotw.on_change(&set);
    let got: Vec<_> = out.iter().map(|r| (r.type_url.as_str(), r.resources.len())).collect();
    assert_eq!(got, [(CLUSTER_TYPE, N), (ENDPOINT_TYPE, 1)]);
    acks(&mut sotw, &out, &set);
    let out = delta.on_change(&set);
    let got: Vec<_> = out.iter().map(|r| (r.type_url.as_str(), r.resources.len())).collect();
    assert_eq!(got, [(CLUSTER_TYPE, 1), (ENDPOINT_TYPE, 1)]);
    assert_eq!((sotw.examined() - s0, delta.examined() - d0), (2, 2));

    // No change: nothing compared, nothing sent.
    let (s0, d0) = (sotw.examined(), delta.examined());
    let same = ConfigSet { revision: set.revision + 1, envoy: set.envoy.clone(), ..Default::default() };
    assert!(sotw.on_change(&same).is_empty() && delta.on_change(&same).is_empty());
    assert_eq!((sotw.examined() - s0, delta.examined() - d0), (0, 0));
}

fn small(names: &[(&str, &str)]) -> ConfigSet {
    let mut set = ConfigSet { revision: 1, ..Default::default() };
    let t = set.envoy.entry(ENDPOINT_TYPE).or_default();
    for (n, body) in names {
        t.insert(1, res(n, body));
    }
    set.envoy.entry(CLUSTER_TYPE).or_default();
    set
}

/// The publisher's next set with `edit` applied to the EDS map.
fn edit(prev: &ConfigSet, f: impl FnOnce(&mut crate::resources::TypeResources, u64)) -> ConfigSet {
    let mut set = ConfigSet { revision: prev.revision + 1, envoy: prev.envoy.clone(), ..Default::default() };
    if let Some(t) = set.envoy.get_mut(ENDPOINT_TYPE) {
        f(t, set.revision);
    }
    set
}

fn eds_req(names: &[&str], nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: ENDPOINT_TYPE.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

/// The bodies sent (the test resources' bodies are their content tags).
fn sent_names(out: &[SotwResponse]) -> Vec<String> {
    out.iter().flat_map(|r| r.decoded().resources).map(|a| String::from_utf8_lossy(&a.value).into_owned()).collect()
}

#[test]
fn sotw_named_removals_subscription_changes_and_nacks() {
    let clients = Clients::new();
    let mut s = SotwStream::new(clients.connect("test", "sotw"));
    let set = small(&[("a", "a1"), ("b", "b1"), ("c", "c1")]);
    let first = s.on_request(&eds_req(&["a", "b"], ""), &set);
    assert_eq!(sent_names(&first), ["a1", "b1"]);
    assert!(s.on_request(&eds_req(&["a", "b"], &first[0].nonce), &set).is_empty(), "ACK");

    // b goes away: SotW EDS cannot say so, and sends nothing for it.
    let set = edit(&set, |t, rev| {
        t.remove(rev, "b");
    });
    assert!(s.on_change(&set).is_empty());
    // b comes back unchanged: the client still has it, nothing to send.
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("b", "b1"));
    });
    assert!(s.on_change(&set).is_empty());
    // b comes back changed: sent.
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("b", "b2"));
    });
    let out = s.on_change(&set);
    assert_eq!(sent_names(&out), ["b2"]);
    let nonce = out[0].nonce.clone();

    // Adding a name sends that name alone.
    let out = s.on_request(&eds_req(&["a", "b", "c"], &nonce), &set);
    assert_eq!(sent_names(&out), ["c1"]);
    let nonce = out[0].nonce.clone();

    // A NACK that also drops c and adds nothing: no answer; dropping c
    // forgets it, so subscribing again later sends it again.
    let mut nack = eds_req(&["a", "b"], &nonce);
    nack.error_detail = Some(envoy_types::pb::google::rpc::Status { code: 3, message: "no".into(), details: vec![] });
    assert!(s.on_request(&nack, &set).is_empty());
    let out = s.on_request(&eds_req(&["a", "b", "c"], &nonce), &set);
    assert_eq!(sent_names(&out), ["c1"]);
    let nonce = out[0].nonce.clone();

    // A NACK carrying a newly subscribed name gets no answer; the name is
    // sent with the next change, whatever changed.
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("d", "d1"));
    });
    let mut nack = eds_req(&["a", "b", "c", "d"], &nonce);
    nack.error_detail = Some(envoy_types::pb::google::rpc::Status { code: 3, message: "no".into(), details: vec![] });
    assert!(s.on_request(&nack, &set).is_empty());
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("z", "z1"));
    });
    assert_eq!(sent_names(&s.on_change(&set)), ["d1"]);
}

fn nack(names: &[&str], nonce: &str) -> DiscoveryRequest {
    let detail = envoy_types::pb::google::rpc::Status { code: 3, message: "no".into(), details: vec![] };
    DiscoveryRequest { error_detail: Some(detail), ..eds_req(names, nonce) }
}

#[test]
fn sotw_changes_while_unanswered_go_out_as_one_newer_response() {
    let clients = Clients::new();
    let mut s = SotwStream::new(clients.connect("test", "sotw"));
    let all = ["a", "b", "c"];
    let set = small(&[("a", "a1"), ("b", "b1"), ("c", "c1")]);
    let first = s.on_request(&eds_req(&all, ""), &set);
    assert_eq!(sent_names(&first), ["a1", "b1", "c1"]);

    // A burst before the client answers: nothing goes out yet.
    let mut set = set;
    for (name, body) in [("a", "a2"), ("b", "b2"), ("a", "a3")] {
        set = edit(&set, |t, rev| {
            t.insert(rev, res(name, body));
        });
        assert!(s.on_change(&set).is_empty(), "{name} {body} waits for the answer");
    }
    // A stale nonce is no answer.
    assert!(s.on_request(&eds_req(&all, "stale"), &set).is_empty());
    // The ACK: one response with the newest state of everything changed.
    let out = s.on_request(&eds_req(&all, &first[0].nonce), &set);
    assert_eq!(sent_names(&out), ["a3", "b2"]);
    assert!(s.on_request(&eds_req(&all, &out[0].nonce), &set).is_empty(), "nothing more");

    // A change after the answer goes out at once; one held behind it goes
    // out on the NACK too (the config changed since the rejected response).
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("c", "c2"));
    });
    let out = s.on_change(&set);
    assert_eq!(sent_names(&out), ["c2"]);
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("c", "c3"));
    });
    assert!(s.on_change(&set).is_empty());
    let out = s.on_request(&nack(&all, &out[0].nonce), &set);
    assert_eq!(sent_names(&out), ["c3"]);
    // A NACK with nothing held: nothing re-sent.
    assert!(s.on_request(&nack(&all, &out[0].nonce), &set).is_empty());
}

#[test]
fn sotw_cluster_change_while_eds_unanswered_still_resends_its_endpoints() {
    let clients = Clients::new();
    let mut s = SotwStream::new(clients.connect("test", "sotw"));
    let mut set = small(&[("a", "a1"), ("b", "b1")]);
    let cds_t = set.envoy.get_mut(CLUSTER_TYPE).expect("cds");
    cds_t.insert(1, res("a", "cluster a1"));
    cds_t.insert(1, res("b", "cluster b1"));
    let cds = s.on_request(&DiscoveryRequest { type_url: CLUSTER_TYPE.into(), ..Default::default() }, &set);
    let eds = s.on_request(&eds_req(&["a", "b"], ""), &set);
    assert_eq!(sent_names(&eds), ["a1", "b1"]);
    assert!(s.on_request(&cds[0].ack(&[]), &set).is_empty());

    // Cluster a changes while EDS is unanswered: CDS goes, EDS waits.
    let mut next = ConfigSet { revision: set.revision + 1, envoy: set.envoy.clone(), ..Default::default() };
    next.envoy.get_mut(CLUSTER_TYPE).expect("cds").insert(next.revision, res("a", "cluster a2"));
    let out = s.on_change(&next);
    assert_eq!(out.iter().map(|r| r.type_url.as_str()).collect::<Vec<_>>(), [CLUSTER_TYPE]);
    // The EDS ACK brings a's endpoints, unchanged but owed to the new cluster.
    let out = s.on_request(&eds_req(&["a", "b"], &eds[0].nonce), &next);
    assert_eq!(sent_names(&out), ["a1"]);
}

#[test]
fn sotw_streams_wanting_a_whole_type_share_one_encoding() {
    let clients = Clients::new();
    let set = initial();
    let cds = DiscoveryRequest { type_url: CLUSTER_TYPE.into(), ..Default::default() };
    let mut streams: Vec<SotwStream> = (0..3).map(|_| SotwStream::new(clients.connect("test", "sotw"))).collect();
    let first: Vec<SotwResponse> = streams.iter_mut().map(|s| s.on_request(&cds, &set).remove(0)).collect();
    assert!(first.iter().all(|r| r.resources.shares(&first[0].resources) && r.resources.len() == N));
    // Same version, type and nonce ("1" on each stream): byte-identical.
    let bytes = first[0].encode_to_vec();
    assert!(first.iter().all(|r| r.encode_to_vec() == bytes));
    assert_eq!(first[0].decoded().resources.len(), N);

    let next = next(&set, CLUSTER_TYPE, 7, "new cluster");
    let mut pushed = Vec::new();
    for (s, r) in streams.iter_mut().zip(&first) {
        assert!(s.on_request(&r.ack(&[]), &set).is_empty());
        pushed.push(s.on_change(&next).remove(0));
    }
    assert!(pushed.iter().all(|r| r.resources.shares(&pushed[0].resources)));
    assert!(!pushed[0].resources.shares(&first[0].resources), "a new state, a new encoding");
    let decoded = pushed[0].decoded();
    assert_eq!(decoded.resources.len(), N);
    assert!(decoded.resources.iter().any(|a| a.value == b"new cluster"));
    assert_eq!(decoded.version_info, next.envoy[CLUSTER_TYPE].version());
}

#[test]
fn delta_unsubscribe_sends_no_removal_and_resubscribe_resends() {
    let clients = Clients::new();
    let mut d = DeltaStream::new(clients.connect("test", "delta"));
    let set = small(&[("a", "a1"), ("b", "b1")]);
    let sub = |names: &[&str], unsub: &[&str]| DeltaDiscoveryRequest {
        type_url: ENDPOINT_TYPE.into(),
        resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
        resource_names_unsubscribe: unsub.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    };
    let out = d.on_request(&sub(&["a", "b"], &[]), &set);
    assert_eq!(out[0].resources.len(), 2);
    let out = d.on_request(&sub(&[], &["b"]), &set);
    assert!(out.is_empty(), "an unsubscribe is not answered with a removal: {out:?}");
    // b changes while unsubscribed: nothing; a is removed: reported.
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("b", "b2"));
        t.remove(rev, "a");
    });
    let out = d.on_change(&set);
    assert_eq!((out[0].resources.len(), out[0].removed_resources.clone()), (0, vec!["a".to_string()]));
    let out = d.on_request(&sub(&["b"], &[]), &set);
    assert_eq!(out[0].resources.iter().map(|r| &*r.name).collect::<Vec<_>>(), ["b"]);
}

#[test]
fn secrets_go_only_to_authenticated_streams_on_request_and_on_change() {
    use crate::translate::envoy::SECRET_TYPE;
    let clients = Clients::new();
    let mut set = ConfigSet { revision: 1, ..Default::default() };
    set.envoy.entry(SECRET_TYPE).or_default().insert(1, res("ns/cert", "key-1"));
    let changed = next_secret(&set, "key-2");
    let sotw_req =
        DiscoveryRequest { type_url: SECRET_TYPE.into(), resource_names: vec!["ns/cert".into()], ..Default::default() };
    let delta_req = DeltaDiscoveryRequest {
        type_url: SECRET_TYPE.into(),
        resource_names_subscribe: vec!["ns/cert".into(), "*".into()],
        ..Default::default()
    };
    for (auth, trusted) in [
        (PeerAuth::Plaintext, false),
        (PeerAuth::Tls, false),
        (PeerAuth::Loopback, true),
        (PeerAuth::Mtls { identity: None }, true),
    ] {
        let mut sotw = SotwStream::new(clients.connect_as("p", "sotw", auth.clone()));
        let first = sotw.on_request(&sotw_req, &set);
        assert_eq!(first.len(), 1, "the request is answered either way");
        assert_eq!(first[0].resources.len(), usize::from(trusted), "{auth:?}");
        let acked = DiscoveryRequest { response_nonce: first[0].nonce.clone(), ..sotw_req.clone() };
        assert!(sotw.on_request(&acked, &set).is_empty());
        let pushed: usize = sotw.on_change(&changed).iter().map(|r| r.resources.len()).sum();
        assert_eq!(pushed, usize::from(trusted), "{auth:?} on change");

        let mut delta = DeltaStream::new(clients.connect_as("p", "delta", auth.clone()));
        let first = delta.on_request(&delta_req, &set);
        assert_eq!(first[0].resources.len(), usize::from(trusted), "{auth:?}");
        let pushed: usize = delta.on_change(&changed).iter().map(|r| r.resources.len()).sum();
        assert_eq!(pushed, usize::from(trusted), "{auth:?} on change");
        let snap = clients.snapshot();
        assert!(snap.iter().all(|c| c.secrets_withheld != trusted && c.auth == auth.label()), "{snap:?}");
    }
}

fn next_secret(prev: &ConfigSet, body: &str) -> ConfigSet {
    let mut set = ConfigSet { revision: prev.revision + 1, envoy: prev.envoy.clone(), ..Default::default() };
    if let Some(t) = set.envoy.get_mut(crate::translate::envoy::SECRET_TYPE) {
        t.insert(set.revision, res("ns/cert", body));
    }
    set
}

/// The clusters in the EDS answers, by name, with their endpoint counts.
fn load_assignments(out: &[SotwResponse]) -> Vec<(String, usize)> {
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    out.iter()
        .flat_map(|r| r.decoded().resources)
        .map(|a| {
            assert_eq!(a.type_url, ENDPOINT_TYPE);
            let cla = ClusterLoadAssignment::decode(&a.value[..]).expect("a ClusterLoadAssignment");
            (cla.cluster_name, cla.endpoints.len())
        })
        .collect()
}

#[test]
fn sotw_eds_answers_a_cluster_it_does_not_have_with_no_endpoints() {
    let clients = Clients::new();
    let mut s = SotwStream::new(clients.connect("test", "sotw"));
    let set = small(&[("a", "a1")]);
    let first = s.on_request(&eds_req(&["a"], ""), &set);
    assert_eq!(sent_names(&first), ["a1"]);

    // Envoy learnt of cluster x from CDS, but x went away before its EDS
    // request came: x is answered, with no endpoints, so Envoy's warming of
    // x (and its ACK of CDS) does not wait for a timeout.
    let out = s.on_request(&eds_req(&["a", "x"], &first[0].nonce), &set);
    assert_eq!(load_assignments(&out), [("x".to_string(), 0)]);
    assert!(s.on_request(&eds_req(&["a", "x"], &out[0].nonce), &set).is_empty(), "ACK");
    // A change elsewhere does not repeat it.
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("a", "a2"));
    });
    let out = s.on_change(&set);
    assert_eq!(sent_names(&out), ["a2"]);
    // x arrives: its endpoints are sent as new.
    let ack = eds_req(&["a", "x"], &out[0].nonce);
    assert!(s.on_request(&ack, &set).is_empty());
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("x", "x1"));
    });
    assert_eq!(sent_names(&s.on_change(&set)), ["x1"]);

    // The first request of a stream naming a cluster we lack: the same.
    let mut s2 = SotwStream::new(clients.connect("test", "sotw2"));
    let set = small(&[("a", "a1")]);
    let out = s2.on_request(&eds_req(&["a", "y"], ""), &set);
    assert_eq!(out[0].resources.len(), 2);
    assert_eq!(sent_names(&out)[0], "a1");
    // A wildcard EDS request names nothing, so gets nothing extra.
    let mut s3 = SotwStream::new(clients.connect("test", "sotw3"));
    assert_eq!(sent_names(&s3.on_request(&eds_req(&["*"], ""), &set)), ["a1"]);
}

/// A whole-type (full-state) response's cluster bodies.
fn cds_bodies(out: &[SotwResponse]) -> Vec<String> {
    let cds = out.iter().filter(|r| r.type_url == CLUSTER_TYPE);
    let mut v: Vec<String> =
        cds.flat_map(|r| r.decoded().resources).map(|a| String::from_utf8_lossy(&a.value).into_owned()).collect();
    v.sort();
    v
}

/// `set` with cluster `name`'s body replaced, as the publisher's next set.
fn with_cluster(prev: &ConfigSet, name: &str, body: &str) -> ConfigSet {
    let mut set = ConfigSet { revision: prev.revision + 1, envoy: prev.envoy.clone(), ..Default::default() };
    set.envoy.get_mut(CLUSTER_TYPE).expect("cds").insert(set.revision, res(name, body));
    set
}

#[tokio::test(start_paused = true)]
async fn sotw_push_window_sends_a_full_state_type_at_most_once_per_window() {
    use std::time::Duration;
    use tokio::time::{Instant, advance};
    const WINDOW: Duration = Duration::from_millis(500);
    let clients = Clients::new();
    let mut s = SotwStream::with_window(clients.connect("test", "sotw"), WINDOW);
    let set = with_cluster(&small(&[("a", "a1")]), "x", "x1");
    let cds = s.on_request(&DiscoveryRequest { type_url: CLUSTER_TYPE.into(), ..Default::default() }, &set);
    let eds = s.on_request(&eds_req(&["a"], ""), &set);
    assert!(s.on_request(&cds[0].ack(&[]), &set).is_empty());
    assert!(s.on_request(&eds_req(&["a"], &eds[0].nonce), &set).is_empty());
    assert_eq!(s.due(), None, "nothing waits");

    // A lone change after a quiet window goes out at once.
    advance(WINDOW * 2).await;
    let set = with_cluster(&set, "x", "x2");
    let out = s.on_change(&set);
    assert_eq!(cds_bodies(&out), ["x2"]);
    let pushed = Instant::now();
    assert!(s.on_request(&out[0].ack(&[]), &set).is_empty());

    // Two more within the window: nothing goes out, and the stream says when.
    advance(Duration::from_millis(100)).await;
    let set = with_cluster(&set, "x", "x3");
    assert!(s.on_change(&set).is_empty());
    assert_eq!(s.due(), Some(pushed + WINDOW));
    advance(Duration::from_millis(100)).await;
    let set = with_cluster(&set, "y", "y1");
    assert!(s.on_change(&set).is_empty());
    // Endpoints (not a full-state type) are not held by the window.
    let set = edit(&set, |t, rev| {
        t.insert(rev, res("a", "a2"));
    });
    let out = s.on_change(&set);
    assert_eq!(out.iter().map(|r| r.type_url.as_str()).collect::<Vec<_>>(), [ENDPOINT_TYPE]);
    assert_eq!(sent_names(&out), ["a2"]);
    assert!(s.on_request(&eds_req(&["a"], &out[0].nonce), &set).is_empty());
    assert_eq!(s.due(), Some(pushed + WINDOW), "the held clusters still wait");

    // Still inside the window: a call early changes nothing.
    advance(Duration::from_millis(299)).await;
    assert!(s.on_change(&set).is_empty());
    // When the window ends: one response with the newest state.
    advance(Duration::from_millis(1)).await;
    let out = s.on_change(&set);
    assert_eq!(cds_bodies(&out), ["x3", "y1"]);
    assert_eq!(s.due(), None);
    let pushed = Instant::now();

    // A change held for the client's answer, which comes inside the
    // window: it waits for the window, not only for the answer.
    let set = with_cluster(&set, "x", "x4");
    assert!(s.on_change(&set).is_empty(), "unanswered");
    assert_eq!(s.due(), None, "waits for the answer first");
    advance(Duration::from_millis(50)).await;
    assert!(s.on_request(&out[0].ack(&[]), &set).is_empty(), "inside the window");
    assert_eq!(s.due(), Some(pushed + WINDOW));
    advance(WINDOW).await;
    assert_eq!(cds_bodies(&s.on_change(&set)), ["x4", "y1"]);
}

#[tokio::test(start_paused = true)]
async fn sotw_without_a_push_window_sends_each_answered_change_at_once() {
    let clients = Clients::new();
    let mut s = SotwStream::new(clients.connect("test", "sotw"));
    let mut set = with_cluster(&small(&[]), "x", "x1");
    let mut out = s.on_request(&DiscoveryRequest { type_url: CLUSTER_TYPE.into(), ..Default::default() }, &set);
    for i in 2..5 {
        assert!(s.on_request(&out[0].ack(&[]), &set).is_empty());
        set = with_cluster(&set, "x", &format!("x{i}"));
        out = s.on_change(&set);
        assert_eq!(cds_bodies(&out), [format!("x{i}")]);
        assert_eq!(s.due(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn sotw_routes_wait_behind_clusters_held_by_the_push_window() {
    use std::time::Duration;
    use tokio::time::advance;
    const WINDOW: Duration = Duration::from_millis(500);
    const ROUTE: &str = crate::translate::envoy::ROUTE_TYPE;
    let clients = Clients::new();
    let mut s = SotwStream::with_window(clients.connect("test", "sotw"), WINDOW);
    let mut set = with_cluster(&small(&[]), "x", "x1");
    set.envoy.entry(ROUTE).or_default().insert(set.revision, res("http.80", "to x"));
    let cds = s.on_request(&DiscoveryRequest { type_url: CLUSTER_TYPE.into(), ..Default::default() }, &set);
    let rds = DiscoveryRequest { type_url: ROUTE.into(), resource_names: vec!["http.80".into()], ..Default::default() };
    let routes = s.on_request(&rds, &set);
    assert!(s.on_request(&cds[0].ack(&[]), &set).is_empty());
    assert!(s.on_request(&routes[0].ack(&["http.80".into()]), &set).is_empty());

    // Within CDS's window, a new cluster and a route to it: neither goes yet.
    advance(Duration::from_millis(100)).await;
    let mut next = with_cluster(&set, "y", "y1");
    next.envoy.get_mut(ROUTE).expect("rds").insert(next.revision, res("http.80", "to x and y"));
    assert!(s.on_change(&next).is_empty(), "the route would name a cluster not yet sent");
    // When the window ends: CDS, then the route, in one step.
    advance(WINDOW).await;
    let out = s.on_change(&next);
    assert_eq!(out.iter().map(|r| r.type_url.as_str()).collect::<Vec<_>>(), [CLUSTER_TYPE, ROUTE]);
    assert_eq!(s.due(), None);
}
