//! The xDS server's bounds: request size, stream caps, client-chosen
//! strings, slow clients, handshake and idle timeouts.

use std::time::Duration;

use meshbridge::testing::{SotwClient, XdsFixture};
use meshbridge::translate::envoy::CLUSTER_TYPE;
use meshbridge::xds::XdsLimits;
use meshbridge_registries::{Endpoint, Protocol, Service, ServicePort, Update};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(5);

fn svc(i: usize, addr: &str) -> Service {
    let eps = vec![Endpoint { address: addr.into(), port: 9000, weight: 1, labels: Default::default() }];
    // Long names make each cluster a few hundred bytes.
    let host = format!("service-with-a-rather-long-name-{i:05}.some-namespace.dc1.consul");
    Service::new(host, vec![ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() }], eps)
}

#[tokio::test]
async fn oversized_requests_and_long_strings_are_refused() {
    let limits = XdsLimits { max_request_bytes: 64 << 10, ..XdsLimits::default() };
    let f = XdsFixture::start_with(vec![svc(0, "10.0.0.1")], limits).await;

    let mut c = SotwClient::connect(f.addr).await.unwrap();
    let names: Vec<String> = (0..200).map(|i| format!("{i:0>500}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    c.try_send(SotwClient::request(CLUSTER_TYPE, &names, "", "")).await;
    let status = c.next_within(WAIT).await.expect_err("a 100 KB request is refused");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");

    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(&format!("example.com/v1/{}", "W".repeat(300)), &[], "", "")).await;
    let status = c.next_within(WAIT).await.expect_err("a 300-byte type URL is refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("type_url"), "{}", status.message());

    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[&"n".repeat(2000)], "", "")).await;
    let status = c.next_within(WAIT).await.expect_err("a 2000-byte name is refused");
    assert_eq!(status.code(), Code::InvalidArgument);

    // Inventing type URLs: a stream may ask for 64, then it is closed.
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    let mut refused = None;
    for i in 0..100 {
        if !c.try_send(SotwClient::request(&format!("example.com/v1/Widget{i}"), &[], "", "")).await {
            break;
        }
        match c.next_within(WAIT).await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("no answer"),
            Err(status) => {
                refused = Some((i, status));
                break;
            }
        }
    }
    let (i, status) = refused.expect("the stream is closed after 64 types");
    assert_eq!((i, status.code()), (64, Code::InvalidArgument));
    // All of them count under one metric series.
    let m = f.clients.metrics();
    let labels = meshbridge::xds::metrics::XdsLabels { type_url: "other".into(), mode: "sotw" };
    assert_eq!(m.pushes.get_or_create(&labels).get(), 64);

    // The server still serves.
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    assert_eq!(c.recv().await.resources.len(), 1);
}

#[tokio::test]
async fn streams_beyond_the_global_cap_are_refused() {
    let limits = XdsLimits { max_streams: 2, ..XdsLimits::default() };
    let f = XdsFixture::start_with(vec![svc(0, "10.0.0.1")], limits).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut c = SotwClient::connect(f.addr).await.unwrap();
        c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
        c.recv().await;
        open.push(c);
    }
    let status = SotwClient::connect(f.addr).await.err().expect("a third stream is refused");
    assert!(format!("{status:#}").contains("too many open xDS streams"), "{status:#}");
    // Closing one frees its slot.
    drop(open.pop());
    let mut ok = None;
    for _ in 0..50 {
        if let Ok(c) = SotwClient::connect(f.addr).await {
            ok = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut c = ok.expect("a slot frees up when a stream closes");
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    assert_eq!(c.recv().await.resources.len(), 1);
}

#[tokio::test]
async fn non_reading_clients_hold_a_bounded_number_of_responses() {
    const SERVICES: usize = 2000;
    const STUCK: usize = 50;
    const CHANGES: usize = 12;
    let f = XdsFixture::start((0..SERVICES).map(|i| svc(i, "10.0.0.1")).collect()).await;
    let mut stuck = Vec::new();
    for _ in 0..STUCK {
        let c = SotwClient::connect(f.addr).await.unwrap();
        c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
        stuck.push(c); // never reads: each CDS is far beyond the HTTP/2 window
    }
    for change in 0..CHANGES {
        f.sink.update(Update::Upsert(svc(SERVICES + change, "10.0.0.2")));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let buffered = f.clients.buffered();
    println!("{STUCK} non-reading streams after {CHANGES} CDS changes: {buffered} responses buffered");
    // One in the channel and at most one per type waiting: never a backlog
    // (with one response per type in flight, none is even built).
    assert!(buffered <= 2 * STUCK, "{buffered} responses buffered for {STUCK} streams");

    // A new client is served the newest state meanwhile.
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let newest = c.recv().await;
    assert_eq!(newest.resources.len(), SERVICES + CHANGES);
    let size = prost::Message::encoded_len(&newest);

    // A stuck client that reads (and ACKs) again gets what was in flight,
    // then the newest state: not one response per change. (The next
    // response of a type waits for the answer to the last one.)
    let mut late = stuck.pop().unwrap();
    let mut got = Vec::new();
    while let Some(resp) = late.recv_within(Duration::from_millis(500)).await {
        got.push(resp.resources.len());
        late.ack(&resp, &[]).await;
    }
    println!("CDS of {size} bytes; a client that reads again gets {} responses: {got:?}", got.len());
    assert_eq!(got.last(), Some(&(SERVICES + CHANGES)), "it ends with the newest state");
    assert!(got.len() < CHANGES + 1, "not one response per change: {got:?}");
    drop(stuck);
}

/// True if the server closes `raw` within `wait`.
async fn closed_within(raw: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let read_all = async {
        while let Ok(n) = raw.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(wait, read_all).await.is_ok()
}

#[tokio::test]
async fn silent_and_idle_connections_are_closed() {
    let limits = XdsLimits {
        handshake_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(600),
        keepalive_interval: Duration::ZERO,
        ..XdsLimits::default()
    };
    let f = XdsFixture::start_with(vec![svc(0, "10.0.0.1")], limits).await;

    // No HTTP/2 preface: closed after the handshake timeout.
    let mut raw = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    let closed = closed_within(&mut raw, WAIT).await;
    assert!(closed, "a silent connection is closed");

    // A preface and settings but no stream: closed after the idle timeout.
    let mut raw = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    raw.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.unwrap();
    let started = std::time::Instant::now();
    let closed = closed_within(&mut raw, WAIT).await;
    assert!(closed, "an idle connection is closed");
    assert!(started.elapsed() >= Duration::from_millis(500), "not before the idle timeout");

    // A connection with an open stream is not idle, however quiet.
    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let first = c.recv().await;
    c.ack(&first, &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    f.sink.update(Update::Upsert(svc(1, "10.0.0.2")));
    assert_eq!(c.recv().await.resources.len(), 2);
}

/// An Envoy's first EDS request names every cluster: at 100k clusters of
/// the bench's names (about 63 bytes each) it is 6.3 MB, which the old
/// 4 MiB default refused, so Envoy never got an endpoint (BENCHMARKS.md,
/// "100k services"). The default takes it and answers.
#[tokio::test]
async fn the_default_limit_takes_an_eds_request_naming_100k_clusters() {
    use meshbridge::translate::envoy::{ENDPOINT_TYPE, cluster_name};
    let f = XdsFixture::start_with(vec![svc(0, "10.0.0.1")], XdsLimits::default()).await;
    let known = cluster_name(8080, "", &svc(0, "10.0.0.1").host);
    let mut names: Vec<String> =
        (1..100_000).map(|i| cluster_name(8080, "", &format!("providers:com.bench.Svc{i}:1.0.0:.zookeeper"))).collect();
    names.push(known.clone());
    let bytes: usize = names.iter().map(|n| n.len() + 2).sum();
    assert!(bytes > 4 << 20, "the request passes the old 4 MiB default: {bytes} bytes");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();

    let mut c = SotwClient::connect(f.addr).await.unwrap();
    c.send(SotwClient::request(ENDPOINT_TYPE, &names, "", "")).await;
    let resp = c.next_within(WAIT).await.expect("not refused").expect("an answer");
    assert_eq!(resp.type_url, ENDPOINT_TYPE);
    assert!(!resp.resources.is_empty(), "the known cluster's endpoints are sent");
}
