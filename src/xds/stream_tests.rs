//! Per-change cost of the stream state machines: a change to one of many
//! resources compares that resource alone, on SotW and delta streams.

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::Any;

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
    assert_eq!(sotw.on_request(&eds, &set)[0].resources.len(), N);

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
