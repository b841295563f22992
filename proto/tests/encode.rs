//! JSON → protobuf → JSON round trips of realistic Istio specs, field
//! numbers read back off the wire, and the errors Pilot would never report.

use meshbridge_proto::{EncodeError, decode_to_json, encode_json, istio::networking::v1alpha3 as net};
use prost::Message;
use serde_json::{Value, json};

fn kind(k: &str) -> String {
    format!("{}.{k}", meshbridge_proto::NETWORKING_PACKAGE)
}

fn round_trip(k: &str, spec: Value) -> Vec<u8> {
    let bytes = encode_json(&kind(k), &spec).unwrap_or_else(|e| panic!("{k}: {e}"));
    let back = decode_to_json(&kind(k), &bytes).unwrap();
    assert_eq!(back, spec, "{k} round trip");
    bytes
}

/// Top-level (field number, wire type) pairs, in wire order.
fn tags(mut bytes: &[u8]) -> Vec<(u32, u8)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return v;
            }
            shift += 7;
        }
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes);
        let wire = (key & 7) as u8;
        match wire {
            0 => {
                varint(&mut bytes);
            }
            1 => bytes = &bytes[8..],
            2 => {
                let len = varint(&mut bytes) as usize;
                bytes = &bytes[len..];
            }
            5 => bytes = &bytes[4..],
            w => panic!("unexpected wire type {w}"),
        }
        out.push(((key >> 3) as u32, wire));
    }
    out
}

fn virtual_service() -> Value {
    json!({
        "hosts": ["reviews.prod.svc.cluster.local"],
        "gateways": ["istio-system/public", "mesh"],
        "http": [{
            "name": "v2-paths",
            "match": [
                {"uri": {"prefix": "/wpcatalog"}, "headers": {"end-user": {"exact": "jason"}}},
                {"uri": {"exact": "/consumercatalog"}, "ignoreUriCase": true}
            ],
            "rewrite": {"uri": "/newcatalog"},
            "route": [
                {"destination": {"host": "reviews.prod.svc.cluster.local", "subset": "v2", "port": {"number": 9080}}, "weight": 25},
                {"destination": {"host": "reviews.prod.svc.cluster.local", "subset": "v1"}, "weight": 75}
            ],
            "timeout": "5s",
            "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "gateway-error,connect-failure"},
            "headers": {"request": {"set": {"x-b": "2", "x-a": "1"}}, "response": {"remove": ["server"]}},
            "mirrors": [{"destination": {"host": "shadow"}, "percentage": {"value": 12.5}}]
        }],
        "tcp": [{"match": [{"port": 27017}], "route": [{"destination": {"host": "mongo.backup"}}]}],
        "tls": [{"match": [{"sniHosts": ["login.example.com"], "port": 443}], "route": [{"destination": {"host": "login"}}]}],
        "exportTo": ["."]
    })
}

fn destination_rule() -> Value {
    json!({
        "host": "ratings.prod.svc.cluster.local",
        "trafficPolicy": {
            "loadBalancer": {"simple": "LEAST_REQUEST"},
            "connectionPool": {"tcp": {"maxConnections": 100, "connectTimeout": "0.030s"}, "http": {"http2MaxRequests": 1000}},
            "outlierDetection": {"consecutive5xxErrors": 7, "interval": "300s", "baseEjectionTime": "900s"},
            "portLevelSettings": [{
                "port": {"number": 443},
                "tls": {"mode": "SIMPLE", "sni": "ratings.example.com", "insecureSkipVerify": false}
            }]
        },
        "subsets": [
            {"name": "v1", "labels": {"version": "v1", "track": "stable"}},
            {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}}
        ],
        "exportTo": ["*"]
    })
}

fn gateway() -> Value {
    json!({
        "selector": {"istio": "ingressgateway"},
        "servers": [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*.example.com"], "tls": {"httpsRedirect": true}},
            {
                "port": {"number": 443, "name": "https", "protocol": "HTTPS"},
                "hosts": ["bookinfo/*.example.com"],
                "tls": {"mode": "SIMPLE", "credentialName": "example-cert", "minProtocolVersion": "TLSV1_2"}
            }
        ]
    })
}

fn service_entry() -> Value {
    json!({
        "hosts": ["web.dc1.consul"],
        "addresses": ["240.240.0.1"],
        "ports": [{"number": 8080, "protocol": "HTTP", "name": "http-8080"}, {"number": 9090, "protocol": "GRPC", "name": "grpc"}],
        "location": "MESH_INTERNAL",
        "resolution": "STATIC",
        "endpoints": [
            {"address": "10.0.0.1", "ports": {"http-8080": 8081, "grpc": 9091}, "labels": {"app": "web", "zone": "a"}, "weight": 2},
            {"address": "10.0.0.2", "ports": {"http-8080": 8081}, "weight": 1, "locality": "us-east/a"}
        ],
        "exportTo": ["*"],
        "subjectAltNames": ["spiffe://cluster.local/ns/web/sa/web"]
    })
}

fn envoy_filter() -> Value {
    json!({
        "workloadSelector": {"labels": {"app": "reviews"}},
        "configPatches": [{
            "applyTo": "CLUSTER",
            "match": {"context": "SIDECAR_OUTBOUND"},
            "patch": {
                "operation": "ADD",
                "value": {
                    "name": "lua_cluster",
                    "type": "STRICT_DNS",
                    "connect_timeout": "0.5s",
                    "load_assignment": {"cluster_name": "lua_cluster", "endpoints": [{"lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": "internal.org.net", "port_value": 8888.0}}}}
                    ]}]},
                    "http2": true,
                    "extra": null
                }
            }
        }, {
            "applyTo": "HTTP_FILTER",
            "match": {"listener": {"portNumber": 8080, "filterChain": {"filter": {
                "name": "envoy.filters.network.http_connection_manager",
                "subFilter": {"name": "envoy.filters.http.router"}
            }}}},
            "patch": {"operation": "INSERT_BEFORE", "filterClass": "AUTHZ", "value": {"name": "envoy.filters.http.lua"}}
        }]
    })
}

#[test]
fn virtual_service_round_trips() {
    let bytes = round_trip("VirtualService", virtual_service());
    // hosts 1, gateways 2, http 3, tcp 4, tls 5, export_to 6; all length-delimited.
    assert_eq!(tags(&bytes), [(1, 2), (2, 2), (2, 2), (3, 2), (4, 2), (5, 2), (6, 2)]);
}

#[test]
fn destination_rule_round_trips() {
    let bytes = round_trip("DestinationRule", destination_rule());
    // host 1, traffic_policy 2, subsets 3, export_to 4.
    assert_eq!(tags(&bytes), [(1, 2), (2, 2), (3, 2), (3, 2), (4, 2)]);
}

#[test]
fn gateway_round_trips() {
    let bytes = round_trip("Gateway", gateway());
    // servers 1 (twice), selector 2.
    assert_eq!(tags(&bytes), [(1, 2), (1, 2), (2, 2)]);
}

#[test]
fn service_entry_round_trips() {
    let bytes = round_trip("ServiceEntry", service_entry());
    // hosts 1, addresses 2, ports 3, location 4, resolution 5 (varints),
    // endpoints 6, export_to 7, subject_alt_names 8.
    assert_eq!(tags(&bytes), [(1, 2), (2, 2), (3, 2), (3, 2), (4, 0), (5, 0), (6, 2), (6, 2), (7, 2), (8, 2)]);
    // The generated prost structs read the same bytes.
    let se = net::ServiceEntry::decode(bytes.as_slice()).unwrap();
    assert_eq!(se.resolution, net::service_entry::Resolution::Static as i32);
    assert_eq!(se.endpoints[0].ports.get("grpc"), Some(&9091));
    assert_eq!(se.endpoints[1].locality, "us-east/a");
}

#[test]
fn envoy_filter_round_trips() {
    let bytes = round_trip("EnvoyFilter", envoy_filter());
    // workload_selector 3, config_patches 4.
    assert_eq!(tags(&bytes), [(3, 2), (4, 2), (4, 2)]);
    let ef = net::EnvoyFilter::decode(bytes.as_slice()).unwrap();
    let value = ef.config_patches[0].patch.as_ref().unwrap().value.as_ref().unwrap();
    assert!(value.fields.contains_key("load_assignment"));
}

#[test]
fn encoding_is_deterministic() {
    // Several maps with several keys each: prost-reflect's own encoding
    // would order their entries differently from one message to the next.
    for (k, spec) in
        [("ServiceEntry", service_entry()), ("EnvoyFilter", envoy_filter()), ("VirtualService", virtual_service())]
    {
        let first = encode_json(&kind(k), &spec).unwrap();
        for _ in 0..20 {
            assert_eq!(encode_json(&kind(k), &spec).unwrap(), first, "{k}");
        }
    }
}

#[test]
fn unknown_field_is_named_with_its_path() {
    let mut spec = virtual_service();
    spec["http"][0]["route"][1]["destination"]["hots"] = json!("typo");
    let err = encode_json(&kind("VirtualService"), &spec).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(&err, EncodeError::Json { path: Some(p), .. } if p == "http[0].route[1].destination"), "{msg}");
    assert!(msg.contains("hots"), "{msg}");

    let err = encode_json(&kind("ServiceEntry"), &json!({"hosts": ["a"], "workloadSelectorr": {}})).unwrap_err();
    assert!(matches!(&err, EncodeError::Json { path: None, .. }), "{err}");
    assert!(err.to_string().contains("workloadSelectorr"), "{err}");
}

#[test]
fn unmodelled_fields_are_rejected() {
    // DestinationRule.workload_selector is reserved, not silently dropped.
    let err = encode_json(&kind("DestinationRule"), &json!({"host": "a", "workloadSelector": {"matchLabels": {}}}));
    assert!(err.is_err());
}

#[test]
fn bad_enum_and_wrong_type_are_errors() {
    let mut spec = destination_rule();
    spec["trafficPolicy"]["portLevelSettings"][0]["tls"]["mode"] = json!("MUTUAL_TLS");
    let err = encode_json(&kind("DestinationRule"), &spec).unwrap_err().to_string();
    assert!(err.contains("MUTUAL_TLS") && err.contains("trafficPolicy.portLevelSettings[0].tls.mode"), "{err}");

    let err = encode_json(&kind("ServiceEntry"), &json!({"hosts": "web.dc1.consul"})).unwrap_err().to_string();
    assert!(err.contains("hosts"), "{err}");

    let err = encode_json(&kind("HTTPRoute"), &json!({"timeout": "five seconds"})).unwrap_err().to_string();
    assert!(err.contains("timeout"), "{err}");

    let err = encode_json(&kind("StringMatch"), &json!({"exact": "a", "prefix": "b"})).unwrap_err().to_string();
    assert!(err.contains("oneof"), "{err}");
}

#[test]
fn unknown_kind_is_an_error() {
    let err = encode_json(&kind("Sidecar"), &json!({})).unwrap_err();
    assert!(matches!(err, EncodeError::UnknownMessage(ref m) if m == "istio.networking.v1alpha3.Sidecar"), "{err}");
}

#[test]
fn every_kind_meshbridge_may_emit_is_in_the_pool() {
    let pool = meshbridge_proto::descriptor_pool();
    for k in ["VirtualService", "DestinationRule", "Gateway", "ServiceEntry", "EnvoyFilter", "WorkloadEntry"] {
        assert!(pool.get_message_by_name(&kind(k)).is_some(), "{k}");
    }
    assert!(pool.get_message_by_name("istio.mcp.v1alpha1.Resource").is_some());
}
