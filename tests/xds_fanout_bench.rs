//! Benchmark (ignored by default; prints figures, never fails on a number):
//! the per-change cost of the xDS stream state machines over a large set,
//! with many streams, without gRPC in the way.
//!
//! ```sh
//! cargo test -p meshbridge --release --test xds_fanout_bench -- --ignored --nocapture
//! ```

use std::time::Instant;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::Any;
use meshbridge::resources::{Resource, TypeResources};
use meshbridge::translate::ConfigSet;
use meshbridge::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};
use meshbridge::xds::Clients;
use meshbridge::xds::delta::DeltaStream;
use meshbridge::xds::sotw::SotwStream;

fn res(name: &str, body: &str) -> Resource {
    Resource::new(name, Any { type_url: "t".into(), value: body.as_bytes().to_vec() })
}

fn initial(n: usize) -> ConfigSet {
    let mut set = ConfigSet { revision: 1, ..Default::default() };
    let mut cds = TypeResources::default();
    let mut eds = TypeResources::default();
    for i in 0..n {
        let name = format!("outbound|8080||svc-{i}.dc1.consul");
        cds.insert(1, res(&name, "cluster v1"));
        eds.insert(1, res(&name, &format!("endpoints of {i} v1")));
    }
    set.envoy.insert(CLUSTER_TYPE, cds);
    set.envoy.insert(ENDPOINT_TYPE, eds);
    set
}

/// The next set, as the publisher makes it: the previous maps with one change.
fn next(prev: &ConfigSet, type_url: &'static str, name: &str, body: &str) -> ConfigSet {
    let mut set = ConfigSet { revision: prev.revision + 1, envoy: prev.envoy.clone(), ..Default::default() };
    set.envoy.get_mut(type_url).expect("type").insert(set.revision, res(name, body));
    set
}

#[test]
#[ignore = "benchmark: prints figures"]
fn per_change_cost_with_many_streams() {
    for (n, streams) in [(1_000usize, 100usize), (20_000, 100)] {
        let clients = Clients::new();
        let mut set = initial(n);
        let names: Vec<String> = set.envoy[ENDPOINT_TYPE].names().map(|n| n.to_string()).collect();
        let mut sotw: Vec<SotwStream> = Vec::new();
        let mut delta: Vec<DeltaStream> = Vec::new();
        let t0 = Instant::now();
        for _ in 0..streams {
            let mut s = SotwStream::new(clients.connect("bench", "sotw"));
            for (type_url, names) in [(CLUSTER_TYPE, Vec::new()), (ENDPOINT_TYPE, names.clone())] {
                let req = DiscoveryRequest { type_url: type_url.into(), resource_names: names, ..Default::default() };
                for resp in s.on_request(&req, &set) {
                    s.on_request(&resp.ack(&req.resource_names), &set);
                }
            }
            sotw.push(s);
            let mut d = DeltaStream::new(clients.connect("bench", "delta"));
            for type_url in [CLUSTER_TYPE, ENDPOINT_TYPE] {
                let req = DeltaDiscoveryRequest {
                    type_url: type_url.into(),
                    resource_names_subscribe: vec!["*".into()],
                    ..Default::default()
                };
                d.on_request(&req, &set);
            }
            delta.push(d);
        }
        let subscribe = t0.elapsed();
        let changes = 20;
        let mut sent = 0usize;
        let t = Instant::now();
        for i in 0..changes {
            set = next(&set, ENDPOINT_TYPE, &names[i * 7 % n], &format!("changed {i}"));
            // Each SotW push is ACKed (the next one waits for it), naming
            // every cluster as Envoy's EDS ACK does: part of the change's cost.
            for s in &mut sotw {
                for resp in s.on_change(&set) {
                    sent += resp.resources.len();
                    let wanted = if resp.type_url == ENDPOINT_TYPE { &names[..] } else { &[] };
                    s.on_request(&resp.ack(wanted), &set);
                }
            }
            for d in &mut delta {
                sent += d.on_change(&set).iter().map(|r| r.resources.len()).sum::<usize>();
            }
        }
        let per_change = t.elapsed() / changes as u32;
        println!(
            "resources {n:>6} × 2 types, {streams} SotW + {streams} delta streams: subscribe all {subscribe:>10.1?}, \
             one EDS change {per_change:>10.2?} for all streams ({:>6.1?} per stream), {} resources sent per change",
            per_change / (2 * streams) as u32,
            sent / changes
        );
    }
}

/// Fan-out over real gRPC: 100 in-process delta clients (wildcard CDS and
/// EDS) receive a one-endpoint change; time to the last client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn fanout_to_100_delta_clients() {
    use meshbridge::testing::{DeltaClient, XdsFixture};
    use meshbridge_registries::{Endpoint, Protocol, Service, ServicePort, Update};

    let svc = |i: usize, addr: &str| {
        let eps = vec![Endpoint { address: addr.into(), port: 9000, weight: 1, labels: Default::default() }];
        let port = ServicePort { number: 8080, protocol: Protocol::Http, name: "http-8080".into() };
        Service::new(format!("svc-{i}.dc1.consul"), vec![port], eps)
    };
    let services = 1_000;
    let f = XdsFixture::start((0..services).map(|i| svc(i, "10.0.0.1")).collect()).await;
    let mut clients = Vec::new();
    for _ in 0..100 {
        let mut c = DeltaClient::connect(f.addr).await.expect("connect");
        for type_url in [CLUSTER_TYPE, ENDPOINT_TYPE] {
            c.send(DeltaClient::subscribe(type_url, &["*"])).await;
            let resp = c.recv().await;
            c.ack(&resp).await;
        }
        clients.push(c);
    }
    let mut times = Vec::new();
    let mut publish = Vec::new();
    let mut config = f.config.clone();
    config.borrow_and_update();
    for change in 0..20 {
        let started = Instant::now();
        f.sink.update(Update::Upsert(svc(change, &format!("10.0.1.{change}"))));
        config.changed().await.expect("publisher");
        publish.push(started.elapsed());
        let mut last = std::time::Duration::ZERO;
        for c in &mut clients {
            let resp = c.recv().await;
            assert_eq!((resp.type_url.as_str(), resp.resources.len()), (ENDPOINT_TYPE, 1));
            last = last.max(started.elapsed());
            c.ack(&resp).await;
        }
        times.push(last);
    }
    times.sort();
    publish.sort();
    println!(
        "{services} services, 100 delta clients, one endpoint change → last client: p50 {:?}, max {:?} \
         (20 changes); of which the publisher (translation): p50 {:?}",
        times[times.len() / 2],
        times[times.len() - 1],
        publish[publish.len() / 2]
    );
}
