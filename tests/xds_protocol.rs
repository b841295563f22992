//! The ADS server's protocol rules, driven by an in-process client over real
//! gRPC: ACK, NACK, stale nonces, EDS-only pushes, delta reconnects.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshbridge::testing::{DeltaClient, SotwClient, XdsFixture};
use meshbridge::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};
use meshbridge_registries::{Endpoint, Protocol, Service, ServicePort, Update};
use prost::Message;

const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const QUIET: Duration = Duration::from_millis(300);

fn svc(host: &str, addrs: &[&str]) -> Service {
    let eps = addrs
        .iter()
        .map(|a| Endpoint { address: a.to_string(), port: 9000, weight: 1, labels: Default::default() })
        .collect();
    Service::new(host, vec![ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() }], eps)
}

fn cluster(host: &str) -> String {
    format!("outbound|8080||{host}")
}

fn endpoints_of(any: &envoy_types::pb::google::protobuf::Any) -> (String, usize) {
    let cla = ClusterLoadAssignment::decode(any.value.as_slice()).unwrap();
    (cla.cluster_name, cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum())
}

#[tokio::test]
async fn sotw_cds_then_eds_ack_and_endpoint_only_push() {
    let f = XdsFixture::start(vec![svc("a.dc1.consul", &["10.0.0.1"]), svc("b.dc1.consul", &["10.0.0.2"])]).await;
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let cds = c.recv().await;
    assert_eq!(cds.type_url, CLUSTER_TYPE);
    let names: Vec<String> = cds.resources.iter().map(|r| Cluster::decode(r.value.as_slice()).unwrap().name).collect();
    assert_eq!(names, vec![cluster("a.dc1.consul"), cluster("b.dc1.consul")]);
    c.ack(&cds, &[]).await;

    let wanted = [cluster("a.dc1.consul"), cluster("b.dc1.consul")];
    let wanted: Vec<&str> = wanted.iter().map(String::as_str).collect();
    c.send(SotwClient::request(ENDPOINT_TYPE, &wanted, "", "")).await;
    let eds = c.recv().await;
    assert_eq!(eds.resources.len(), 2, "EDS answers every cluster sent");
    c.ack(&eds, &wanted).await;
    assert!(c.recv_within(QUIET).await.is_none(), "an ACK must not trigger a push");

    // An endpoint-only change pushes EDS for that cluster alone.
    f.sink.update(Update::Upsert(svc("a.dc1.consul", &["10.0.0.1", "10.0.0.3"])));
    let push = c.recv().await;
    assert_eq!(push.type_url, ENDPOINT_TYPE);
    assert_eq!(push.resources.len(), 1);
    assert_eq!(endpoints_of(&push.resources[0]), (cluster("a.dc1.consul"), 2));
    assert_ne!(push.version_info, eds.version_info);
    c.ack(&push, &wanted).await;
    assert!(c.recv_within(QUIET).await.is_none(), "no CDS push for an endpoint change");

    // The client's ACK is recorded against the version we sent.
    let status = f.clients.snapshot();
    assert_eq!(status[0].node_id, "test-envoy");
    assert_eq!(status[0].types[ENDPOINT_TYPE].last_ack.as_deref(), Some(push.version_info.as_str()));
}

#[tokio::test]
async fn sotw_nack_keeps_last_good_and_stale_nonce_is_ignored() {
    let f = XdsFixture::start(vec![svc("a.dc1.consul", &["10.0.0.1"])]).await;
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let first = c.recv().await;
    c.ack(&first, &[]).await;

    f.sink.update(Update::Upsert(svc("z.dc1.consul", &["10.0.0.9"])));
    let second = c.recv().await;
    assert_eq!(second.resources.len(), 2);
    c.nack(&second, &[], &first.version_info, "cluster z rejected").await;
    assert!(c.recv_within(QUIET).await.is_none(), "a NACK must not be answered with the same config");
    let status = &f.clients.snapshot()[0].types[CLUSTER_TYPE];
    assert_eq!(status.last_nack_detail.as_deref(), Some("cluster z rejected"));
    assert_eq!(status.last_ack.as_deref(), Some(first.version_info.as_str()));

    // A request carrying an old nonce is stale: even a changed subscription
    // in it gets no answer.
    c.send(SotwClient::request(CLUSTER_TYPE, &["x"], &first.version_info, &first.nonce)).await;
    assert!(c.recv_within(QUIET).await.is_none(), "stale nonce must be ignored");

    // The next real change is pushed again.
    f.sink.update(Update::Remove("z.dc1.consul".into()));
    let third = c.recv().await;
    assert_eq!(third.resources.len(), 1);
    assert_eq!(third.version_info, first.version_info, "versions are content hashes");
}

#[tokio::test]
async fn sotw_cluster_change_resends_its_eds_and_unknown_types_get_empty_answers() {
    let f = XdsFixture::start(vec![svc("a.dc1.consul", &["10.0.0.1"])]).await;
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    // A type we never produce (SDS here) still gets an answer, empty.
    c.send(SotwClient::request(SECRET_TYPE, &[], "", "")).await;
    let sds = c.recv().await;
    assert_eq!((sds.type_url.as_str(), sds.resources.len()), (SECRET_TYPE, 0));
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let cds = c.recv().await;
    c.ack(&cds, &[]).await;
    let name = cluster("a.dc1.consul");
    c.send(SotwClient::request(ENDPOINT_TYPE, &[&name], "", "")).await;
    let eds = c.recv().await;
    c.ack(&eds, &[&name]).await;

    // Changing the port's protocol changes the cluster, not its endpoints:
    // CDS goes first and EDS for that cluster follows, so it can warm.
    let mut grpc = svc("a.dc1.consul", &["10.0.0.1"]);
    grpc.ports[0].protocol = Protocol::Grpc;
    f.sink.update(Update::Upsert(grpc));
    let first = c.recv().await;
    let second = c.recv().await;
    assert_eq!((first.type_url.as_str(), second.type_url.as_str()), (CLUSTER_TYPE, ENDPOINT_TYPE));
    assert_eq!(endpoints_of(&second.resources[0]), (name, 1));
}

#[tokio::test]
async fn delta_sends_only_differences_and_honours_initial_versions() {
    let f = XdsFixture::start(vec![svc("a.dc1.consul", &["10.0.0.1"]), svc("b.dc1.consul", &["10.0.0.2"])]).await;
    let mut c = DeltaClient::connect(f.addr).await.unwrap();
    c.send(DeltaClient::subscribe(CLUSTER_TYPE, &["*"])).await;
    let cds = c.recv().await;
    assert_eq!(cds.resources.len(), 2);
    c.ack(&cds).await;
    let versions: std::collections::HashMap<String, String> =
        cds.resources.iter().map(|r| (r.name.clone(), r.version.clone())).collect();

    let a = cluster("a.dc1.consul");
    c.send(DeltaClient::subscribe(ENDPOINT_TYPE, &[&a])).await;
    let eds = c.recv().await;
    assert_eq!(eds.resources.len(), 1);
    c.ack(&eds).await;
    assert!(c.recv_within(QUIET).await.is_none());

    // Removing b: CDS carries only the removal; b's EDS was never wanted.
    f.sink.update(Update::Remove("b.dc1.consul".into()));
    let removal = c.recv().await;
    assert_eq!(removal.type_url, CLUSTER_TYPE);
    assert!(removal.resources.is_empty());
    assert_eq!(removal.removed_resources, vec![cluster("b.dc1.consul")]);
    c.nack(&removal, "pretend rejection").await;
    assert!(c.recv_within(QUIET).await.is_none(), "NACKed delta is not re-sent");

    // Reconnect with what we had: only the difference (b gone) comes back.
    drop(c);
    let mut c = DeltaClient::connect(f.addr).await.unwrap();
    let mut req = DeltaClient::subscribe(CLUSTER_TYPE, &["*"]);
    req.initial_resource_versions = versions;
    c.send(req).await;
    let resync = c.recv().await;
    assert!(resync.resources.is_empty(), "unchanged clusters are not re-sent: {:?}", resync.resources);
    assert_eq!(resync.removed_resources, vec![cluster("b.dc1.consul")]);
}

#[tokio::test]
async fn sotw_first_request_of_a_type_is_answered_whatever_its_nonce() {
    let f = XdsFixture::start(vec![svc("a.dc1.consul", &["10.0.0.1"])]).await;
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    // Istio's ADSC `WatchConfig()`: the first request carries
    // `time.Now().String()` as its nonce.
    let initial = SotwClient::adsc_initial(CLUSTER_TYPE);
    c.send(initial.clone()).await;
    let cds = c.recv().await;
    assert_eq!((cds.type_url.as_str(), cds.resources.len()), (CLUSTER_TYPE, 1));
    assert_eq!(
        f.clients.snapshot()[0].types[CLUSTER_TYPE].last_ack,
        None,
        "a nonce we never sent acknowledges nothing"
    );
    c.ack(&cds, &[]).await;
    assert!(c.recv_within(QUIET).await.is_none());

    // Once the type has been sent, nonces are checked: the foreign one is now stale.
    c.send(SotwClient::request(CLUSTER_TYPE, &["x"], "", &initial.response_nonce)).await;
    assert!(c.recv_within(QUIET).await.is_none(), "stale nonce of a type already sent must be ignored");

    // Another type's first request with the nonce of a different type is answered too.
    let name = cluster("a.dc1.consul");
    c.send(SotwClient::request(ENDPOINT_TYPE, &[&name], "", &cds.nonce)).await;
    let eds = c.recv().await;
    assert_eq!(endpoints_of(&eds.resources[0]), (name.clone(), 1));

    // A client reconnecting to a new server sends its old stream's nonces
    // (and may still be NACKing there): every type is answered in full.
    drop(c);
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[], &cds.version_info, &cds.nonce)).await;
    let again = c.recv().await;
    assert_eq!((again.resources.len(), again.version_info.as_str()), (1, cds.version_info.as_str()));
    let mut nack = SotwClient::request(ENDPOINT_TYPE, &[&name], &eds.version_info, &eds.nonce);
    nack.error_detail = Some(envoy_types::pb::google::rpc::Status { code: 3, message: "old".into(), details: vec![] });
    c.send(nack).await;
    let eds_again = c.recv().await;
    assert_eq!(endpoints_of(&eds_again.resources[0]), (name, 1));
}

#[tokio::test]
async fn delta_first_request_with_an_old_streams_nonce_is_answered() {
    let f = XdsFixture::start(vec![svc("a.dc1.consul", &["10.0.0.1"])]).await;
    let mut c = DeltaClient::connect(f.addr).await.unwrap();
    c.send(DeltaClient::subscribe(CLUSTER_TYPE, &["*"])).await;
    let cds = c.recv().await;
    c.ack(&cds).await;
    drop(c);

    // Reconnect carrying the old stream's nonce, with nothing held: full answer.
    let mut c = DeltaClient::connect(f.addr).await.unwrap();
    let mut req = DeltaClient::subscribe(CLUSTER_TYPE, &["*"]);
    req.response_nonce = cds.nonce.clone();
    c.send(req).await;
    let resync = c.recv().await;
    assert_eq!(resync.resources.len(), 1);
    let status = f.clients.snapshot();
    let me = status.iter().find(|s| s.types.contains_key(CLUSTER_TYPE)).unwrap();
    assert_eq!(me.types[CLUSTER_TYPE].last_ack, None, "the old stream's nonce acknowledges nothing here");
}

/// The push window over real gRPC: the stream's timer sends what the window
/// held back, once, with the newest state, and not before the window ends.
#[tokio::test]
async fn sotw_push_window_holds_a_burst_of_cluster_changes_to_one_response() {
    const WINDOW: Duration = Duration::from_millis(400);
    let limits = meshbridge::xds::XdsLimits { sotw_push_window: WINDOW, ..Default::default() };
    let f = XdsFixture::start_with(vec![svc("a.dc1.consul", &["10.0.0.1"])], limits).await;
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let cds = c.recv().await;
    c.ack(&cds, &[]).await;
    // A quiet window: the next change goes out at once.
    tokio::time::sleep(WINDOW).await;
    let started = std::time::Instant::now();
    f.sink.update(Update::Upsert(svc("b.dc1.consul", &["10.0.0.2"])));
    let first = c.recv().await;
    let pushed = std::time::Instant::now();
    assert!(pushed - started < WINDOW, "a lone change waited {:?}", pushed - started);
    assert_eq!(first.resources.len(), 2);
    c.ack(&first, &[]).await;
    // A burst right after it: one response, when the window ends.
    for host in ["c.dc1.consul", "d.dc1.consul", "e.dc1.consul"] {
        f.sink.update(Update::Upsert(svc(host, &["10.0.0.3"])));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = c.recv().await;
    let waited = pushed.elapsed();
    assert!(waited >= WINDOW - Duration::from_millis(5), "pushed again after {waited:?}");
    let names: Vec<String> = held.resources.iter().map(|r| Cluster::decode(r.value.as_slice()).unwrap().name).collect();
    assert_eq!(names.len(), 5, "the newest state: {names:?}");
    c.ack(&held, &[]).await;
    assert!(c.recv_within(WINDOW * 2).await.is_none(), "nothing more");
}
