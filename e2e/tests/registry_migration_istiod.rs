//! One service in two registries through a REAL istiod (issue 34): two
//! Consul servers, each holding an instance of `web` in datacenter `dc1`,
//! so both registries make the host `web.dc1.consul`. meshbridge sends
//! istiod one merged ServiceEntry; a stock Envoy fed by istiod (as in
//! `istiod.rs`, an Istio gateway node with labels) sends traffic to both
//! registries' instances. With `meshbridgeMigration.priority` on one of
//! them, istiod gets the failover DestinationRule and its Envoy sends
//! everything to the preferred registry, and to the other once the
//! preferred one has no instance left.
//!
//! Runs once per istiod build (`istiod_tests!`). Needs `source e2e/env.sh
//! consul envoy kubetools kube-apiserver istiod istiod-1.27`.

use std::time::{Duration, Instant};

use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::consul::Consul;
use meshbridge_e2e::envoy::{AdsMode, Envoy, Node};
use meshbridge_e2e::istiod::{Istiod, Options, Version};
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::wait_for_traffic;
use serde_json::{Value, json};

const CLUSTER: &str = "outbound|8080||web.dc1.consul";
const GATEWAY_ID: &str = "higress-gateway-e2e.higress-system";

fn bridge(east: &Consul, west: &Consul, west_migration: &str) -> String {
    let entry = |name: &str, c: &Consul, m: &str| {
        let m = if m.is_empty() { String::new() } else { format!(", meshbridgeMigration: {m}") };
        format!(
            "{{type: consul, name: {name}, domain: 127.0.0.1, port: {}, consulDatacenter: dc1, \
             vport: {{default: 8080}}{m}}}",
            c.http_port
        )
    };
    meshbridge_e2e::traffic::mcpbridge(&[entry("east", east, ""), entry("west", west, west_migration)])
}

fn instance(id: &str, backend: &Backend) -> Value {
    json!({
        "ID": id,
        "Name": "web",
        "Address": backend.addr.ip().to_string(),
        "Port": backend.addr.port(),
        "Check": { "CheckID": format!("{id}-ttl"), "TTL": "300s", "Status": "passing" },
    })
}

/// istiod's `/debug/configz` entries of `kind` for the host.
async fn istiod_objects(istiod: &Istiod, kind: &str) -> Vec<Value> {
    let all = istiod.debug("configz").await.unwrap_or_default();
    all.as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("web.dc1")))
        .cloned()
        .collect()
}

async fn wait_for_object(istiod: &Istiod, kind: &str, want: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = istiod_objects(istiod, kind).await;
        if let Some(o) = found.iter().find(|o| want(o)) {
            return o.clone();
        }
        assert!(Instant::now() < deadline, "{} has no such {kind}: {found:#?}", istiod.version);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

istiod_tests!(a_service_in_two_registries_reaches_istiod_merged_and_fails_over_by_priority);

async fn a_service_in_two_registries_reaches_istiod_merged_and_fails_over_by_priority(version: Version) {
    let east = Consul::start().await.expect("start consul (source e2e/env.sh consul)");
    let west = Consul::start().await.expect("start a second consul");
    // On one address but for 1.27, which misses a change there
    // (`Version::instance_address`).
    let b1 = Backend::start(&version.instance_address(0), "east-1").await.unwrap();
    let b2 = Backend::start(&version.instance_address(1), "west-1").await.unwrap();
    east.register(instance("web-east", &b1)).await.unwrap();
    west.register(instance("web-west", &b2)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge(&east, &west, "")).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.expect("start meshbridge");
    let api = ApiServer::start().await.expect("start kube-apiserver (source e2e/env.sh kube-apiserver kubetools)");
    let istiod = Istiod::start(
        &api,
        app.xds_addr,
        Options { version, upstream_envoy: true, stock_gateway_listeners: false, secure_xds: false },
    )
    .await
    .unwrap_or_else(|e| panic!("start {version} (source e2e/env.sh istiod istiod-1.27): {e:#}"));

    // One ServiceEntry with both registries' endpoints, each labelled.
    let se =
        wait_for_object(&istiod, "ServiceEntry", |o| o["spec"]["endpoints"].as_array().map(Vec::len) == Some(2)).await;
    let mut registries: Vec<&str> = se["spec"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["labels"]["meshbridge.io/registry"].as_str())
        .collect();
    registries.sort();
    assert_eq!(registries, ["east", "west"], "{version}: {se:#}");

    let node = Node {
        id: format!("router~192.0.2.10~{GATEWAY_ID}~higress-system.svc.cluster.local"),
        cluster: "higress-gateway".into(),
        metadata: Some("{ LABELS: { higress: higress-system-higress-gateway } }".into()),
    };
    let envoy = Envoy::start_as(&node, istiod.grpc_addr, AdsMode::Sotw, CLUSTER).await.expect("start envoy");
    wait_for_traffic(&envoy, 200, &["east-1", "west-1"], &format!("both registries serve through {version}")).await;

    // West becomes the fallback: istiod gets the failover rule, and sends
    // the east instance alone traffic while it is there.
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge(&east, &west, "{priority: 1}")).unwrap();
    let dr = wait_for_object(&istiod, "DestinationRule", |_| true).await;
    let locality = &dr["spec"]["trafficPolicy"]["loadBalancer"]["localityLbSetting"];
    assert_eq!(locality["failoverPriority"][0], "meshbridge.io/priority=0", "{version}: {dr:#}");
    assert!(dr["spec"]["trafficPolicy"]["outlierDetection"].is_object(), "{version}: {dr:#}");
    wait_for_traffic(&envoy, 200, &["east-1"], &format!("{version}'s Envoy prefers the east registry")).await;
    let gone = Instant::now();
    east.deregister("web-east").await.unwrap();
    wait_for_traffic(&envoy, 200, &["west-1"], &format!("{version}'s Envoy fails over to the west registry")).await;
    println!("FIGURE istiod_registry_failover istiod={} ms={}", version.release(), gone.elapsed().as_millis());
    app.stop().await;
}
