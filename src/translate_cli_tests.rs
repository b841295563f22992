use clap::Parser;
use meshbridge_registries::{Endpoint, Protocol, Service, ServicePort};
use serde_json::Value;

use super::*;

fn cmd(args: &[&str]) -> TranslateCommand {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        translate: TranslateCommand,
    }
    Cli::try_parse_from(std::iter::once("translate").chain(args.iter().copied())).expect("flags parse").translate
}

/// (exit status, the objects printed, stderr).
fn translate(args: &[&str]) -> (i32, Vec<Value>, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&cmd(args), &mut out, &mut err).expect("translated");
    let out = String::from_utf8(out).unwrap();
    let objects: Vec<Value> = serde_saphyr::from_multiple(&out).expect("the output is YAML");
    (code, objects, String::from_utf8(err).unwrap())
}

fn find<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

#[test]
fn the_standalone_example_is_a_service_entry_and_a_route_to_it() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/standalone");
    let (code, objects, err) = translate(&[dir]);
    assert_eq!(code, 0, "{err}");
    let entries = find(&objects, "ServiceEntry");
    assert_eq!(entries.len(), 1, "{objects:#?}");
    let entry = entries[0];
    assert_eq!(entry["apiVersion"], "networking.istio.io/v1");
    assert_eq!(entry["spec"]["hosts"][0], "local-echo.static");
    assert_eq!(entry["spec"]["endpoints"][0]["address"], "127.0.0.1");
    let routes = find(&objects, "VirtualService");
    assert_eq!(routes.len(), 1, "{objects:#?}");
    assert_eq!(routes[0]["spec"]["hosts"][0], "echo.example.com");
    let destination = &routes[0]["spec"]["http"][0]["route"][0]["destination"];
    assert_eq!(destination["host"], "local-echo.static", "{:#?}", routes[0]);
    assert_eq!(find(&objects, "Gateway").len(), 1, "{objects:#?}");
}

#[test]
fn a_state_dir_gives_the_registries_their_services() {
    let config = tempfile::tempdir().unwrap();
    std::fs::write(
        config.path().join("bridge.yaml"),
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {name: default, namespace: higress-system}\n\
         spec:\n  registries:\n  - {type: nacos2, name: prod, domain: 127.0.0.1, port: 8848}\n  \
         - {type: consul, name: dc1, domain: 127.0.0.1, port: 8500}\n",
    )
    .unwrap();
    let state = tempfile::tempdir().unwrap();
    let dumps = StateDir::open(state.path()).unwrap();
    let endpoint =
        |address: &str| Endpoint { address: address.into(), port: 20880, weight: 1, labels: Default::default() };
    let orders = Service::new(
        "orders.DEFAULT-GROUP.public.nacos",
        vec![ServicePort { number: 20880, protocol: Protocol::Grpc, name: "grpc".into() }],
        vec![endpoint("10.0.0.1"), endpoint("10.0.0.2")],
    );
    dumps.write(&RegistryKey::new(RegistryKind::Nacos2, "prod"), &[&orders]).unwrap();

    let (code, objects, err) =
        translate(&[config.path().to_str().unwrap(), "--state-dir", state.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let entries = find(&objects, "ServiceEntry");
    assert_eq!(entries.len(), 1, "{objects:#?}");
    assert_eq!(entries[0]["spec"]["hosts"][0], "orders.DEFAULT-GROUP.public.nacos");
    let addresses: Vec<&Value> =
        entries[0]["spec"]["endpoints"].as_array().unwrap().iter().map(|e| &e["address"]).collect();
    assert_eq!(addresses, ["10.0.0.1", "10.0.0.2"]);
    // The Consul registry has no dump: said, and served empty.
    assert!(err.contains("registry consul/dc1: no dump"), "{err}");

    // Without the state dir, neither registry has a service.
    let (_, objects, _) = translate(&[config.path().to_str().unwrap()]);
    assert!(find(&objects, "ServiceEntry").is_empty(), "{objects:#?}");
}

#[test]
fn config_errors_go_to_stderr_and_set_the_status() {
    let config = tempfile::tempdir().unwrap();
    std::fs::write(
        config.path().join("bridge.yaml"),
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\nmetadata: {name: default, namespace: higress-system}\n\
         spec:\n  registries:\n  - {type: consul, name: dc1, domain: 127.0.0.1, port: 0}\n",
    )
    .unwrap();
    let (code, objects, err) = translate(&[config.path().to_str().unwrap()]);
    assert_eq!(code, EXIT_PROBLEMS);
    assert!(objects.is_empty(), "{objects:#?}");
    assert!(err.contains("error: McpBridge higress-system/default: spec.registries[0].port"), "{err}");
}

/// `--envoy`: the standalone example as the gateway's Envoy would hold it,
/// in the config-dump shape, every `Any` written out.
#[test]
fn envoy_prints_the_gateway_config_as_a_config_dump() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/standalone");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(&cmd(&[dir, "--envoy"]), &mut out, &mut err).expect("translated");
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let dump: Value = serde_json::from_slice(&out).expect("the output is JSON");
    let configs = dump["configs"].as_array().expect("configs");
    let types: Vec<&str> = configs.iter().map(|c| c["@type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
            "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
            "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
        ]
    );
    let cluster = configs[0]["dynamic_active_clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["cluster"])
        .find(|c| c["name"].as_str().is_some_and(|n| n.ends_with("||local-echo.static")))
        .unwrap_or_else(|| panic!("no cluster of local-echo.static: {dump:#}"));
    assert_eq!(cluster["@type"], "type.googleapis.com/envoy.config.cluster.v3.Cluster");
    assert_eq!(cluster["type"], "EDS", "{cluster:#}");

    let listener = &configs[1]["dynamic_listeners"][0]["active_state"]["listener"];
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    assert_eq!(
        hcm["@type"],
        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "{listener:#}"
    );

    let routes = configs[2]["dynamic_route_configs"].as_array().unwrap();
    let hosts: Vec<&Value> = routes
        .iter()
        .flat_map(|r| r["route_config"]["virtual_hosts"].as_array().into_iter().flatten())
        .flat_map(|vh| vh["domains"].as_array().into_iter().flatten())
        .collect();
    assert!(hosts.iter().any(|h| *h == "echo.example.com"), "{hosts:?}");

    let endpoints = configs[3]["dynamic_endpoint_configs"].as_array().unwrap();
    let cla = endpoints
        .iter()
        .map(|e| &e["endpoint_config"])
        .find(|e| e["cluster_name"] == cluster["name"])
        .unwrap_or_else(|| panic!("no endpoints for {}: {endpoints:#?}", cluster["name"]));
    let address = &cla["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
    assert_eq!(address["address"], "127.0.0.1", "{cla:#}");
    assert_eq!(address["port_value"], 10081, "{cla:#}");
}
