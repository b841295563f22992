//! The typed encoding against the schema-checked reflection path it
//! replaced (`meshbridge_proto::encode_json`): byte for byte, for specs
//! that set every field the model has. Every object any other unit test
//! translates is compared the same way in `mcp::resource`.

use serde_json::json;

use super::*;
use crate::translate::model::Spec;

fn both(kind: &str, spec: serde_json::Value) -> (Vec<u8>, Vec<u8>) {
    let typed = Spec::from_json(kind, spec.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"));
    // The model reads back exactly what it was given: nothing set above is
    // dropped on the way in, so the comparison covers it.
    assert_eq!(typed.to_json(), spec, "{kind}: the model does not hold every field of the fixture");
    let message = format!("{}.{kind}", meshbridge_proto::NETWORKING_PACKAGE);
    let reflected = meshbridge_proto::encode_json(&message, &spec).unwrap_or_else(|e| panic!("{kind}: {e}"));
    (encode(&typed).unwrap_or_else(|e| panic!("{kind}: {e}")), reflected)
}

fn assert_same(kind: &str, spec: serde_json::Value) {
    let (typed, reflected) = both(kind, spec);
    assert!(!typed.is_empty(), "{kind}: nothing encoded");
    assert_eq!(typed, reflected, "{kind}: the typed encoding differs from the reflected one");
}

#[test]
fn service_entry_with_every_field_the_model_has() {
    assert_same(
        "ServiceEntry",
        json!({
            "hosts": ["web.dc1.consul", "web"],
            "ports": [{"number": 8080, "protocol": "HTTP", "name": "http-8080"},
                      {"number": 9090, "protocol": "GRPC", "name": "grpc-9090"}],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "endpoints": [
                {"address": "10.0.0.2", "ports": {"http-8080": 8081, "grpc-9090": 9091},
                 "labels": {"version": "v2", "app": "web"}, "weight": 3},
                {"address": "2001:db8::1", "ports": {"http-8080": 8080}, "weight": 1},
            ],
        }),
    );
    // Enum values at the proto's zero are left out on both paths.
    assert_same(
        "ServiceEntry",
        json!({"hosts": ["a"], "ports": [], "location": "MESH_EXTERNAL", "resolution": "NONE", "endpoints": []}),
    );
}

#[test]
fn destination_rule_with_tls_and_subsets() {
    assert_same(
        "DestinationRule",
        json!({
            "host": "web.dc1.consul",
            "trafficPolicy": {"portLevelSettings": [
                {"port": {"number": 8443}, "tls": {"mode": "SIMPLE", "sni": "web.example"}},
                {"port": {"number": 9443}, "tls": {"mode": "SIMPLE"}},
            ]},
            "subsets": [{"name": "v1", "labels": {"version": "v1", "zone": "a"}}, {"name": "all", "labels": {}}],
        }),
    );
}

#[test]
fn gateway_with_plain_and_tls_servers() {
    assert_same(
        "Gateway",
        json!({
            "selector": {"higress": "higress-system-higress-gateway", "app": "gw"},
            "servers": [
                {"port": {"number": 80, "protocol": "HTTP", "name": "http-80-a"}, "hosts": ["a.example", "*.b.example"]},
                {"port": {"number": 443, "protocol": "HTTPS", "name": "https-443-a"}, "hosts": ["a.example"],
                 "tls": {"httpsRedirect": true, "mode": "SIMPLE", "credentialName": "kubernetes-ingress://c/ns/a"}},
                {"port": {"number": 8443, "protocol": "HTTPS", "name": "https-8443"}, "hosts": ["*"],
                 "tls": {"mode": "PASSTHROUGH"}},
            ],
        }),
    );
}

#[test]
fn virtual_service_with_matches_weights_and_rewrites() {
    assert_same(
        "VirtualService",
        json!({
            "hosts": ["a.example"],
            "gateways": ["higress-system/a-example"],
            "http": [
                {"name": "exact", "match": [{"uri": {"exact": "/x"}, "ignoreUriCase": true,
                                             "headers": {"x-canary": {"exact": "always"}, "x-b": {"regex": "a.*"}}}],
                 "route": [{"destination": {"host": "web", "subset": "v1", "port": {"number": 8080}}, "weight": 80},
                           {"destination": {"host": "web2"}, "weight": 20}],
                 "rewrite": {"uri": "/", "authority": "b.example"}},
                {"name": "regex", "match": [{"uri": {"regex": "/api/(.*)"}}, {"uri": {"prefix": "/v2"}}],
                 "route": [{"destination": {"host": "web"}}],
                 "rewrite": {"uriRegexRewrite": {"match": "/api/(.*)", "rewrite": "/\\1"}}},
                {"route": [{"destination": {"host": "default", "port": {"number": 80}}, "weight": 0}]},
            ],
        }),
    );
}

#[test]
fn virtual_service_with_redirects_timeouts_retries_headers_and_cors() {
    assert_same(
        "VirtualService",
        json!({
            "hosts": ["a.example"],
            "gateways": ["higress-system/higress-gateway"],
            "http": [
                {"name": "app-root", "match": [{"uri": {"exact": "/"}}], "route": [],
                 "redirect": {"uri": "/app", "redirectCode": 302}},
                {"name": "ssl", "match": [{"uri": {"prefix": "/a/"}, "scheme": {"exact": "http"}}], "route": [],
                 "redirect": {"scheme": "https", "redirectCode": 308},
                 "headers": {"response": {"remove": ["server"]}}},
                {"name": "moved", "match": [{"uri": {"exact": "/old"}}], "route": [],
                 "redirect": {"uri": "/new", "authority": "b.example:8080", "scheme": "https"}},
                {"name": "main", "match": [{"uri": {"prefix": "/a/"}}],
                 "route": [{"destination": {"host": "web", "port": {"number": 80}}, "weight": 75,
                            "headers": {"response": {"add": {"x-side": "main"}}}},
                           {"destination": {"host": "web-canary"}, "weight": 25,
                            "headers": {"request": {"remove": ["x-a"]}}}],
                 "rewrite": {"authority": "web.internal"},
                 "timeout": "5s",
                 "retries": {"attempts": 2, "perTryTimeout": "0.5s", "retryOn": "5xx,retriable-status-codes,503"},
                 "corsPolicy": {"allowOrigins": [{"exact": "https://app.example"}, {"regex": "https://[^/]+\\.b\\.example"}],
                                "allowMethods": ["GET", "POST"], "allowHeaders": ["x-token"],
                                "exposeHeaders": ["x-request-id"], "maxAge": "1728000s", "allowCredentials": false},
                 "headers": {"request": {"set": {"x-user": "meshbridge"}, "add": {"x-env": "prod", "x-a": "1"},
                                         "remove": ["x-debug", "x-trace"]},
                             "response": {"set": {"x-served-by": "gw"}}}},
                {"name": "no-retries", "route": [{"destination": {"host": "web"}}], "retries": {"attempts": 0}},
            ],
        }),
    );
}

#[test]
fn virtual_service_with_a_mirror() {
    assert_same(
        "VirtualService",
        json!({
            "hosts": ["a.example"],
            "gateways": ["higress-system/higress-gateway"],
            "http": [
                {"name": "some", "route": [{"destination": {"host": "web"}}],
                 "mirror": {"host": "shadow.shop.svc.cluster.local", "port": {"number": 8080}},
                 "mirrorPercentage": {"value": 25.0}},
                {"name": "all", "route": [{"destination": {"host": "web"}}], "mirror": {"host": "shadow.static"}},
            ],
        }),
    );
}

#[test]
fn envoy_filter_with_a_nested_struct_value() {
    assert_same(
        "EnvoyFilter",
        json!({
            "configPatches": [
                {"applyTo": "CLUSTER", "match": {"context": "GATEWAY", "cluster": {"name": "outbound|80||a"}},
                 "patch": {"operation": "REMOVE"}},
                {"applyTo": "LISTENER", "match": {"context": "GATEWAY"},
                 "patch": {"operation": "ADD", "value": {
                     "name": "tunnel", "port": 15001, "ratio": 0.25, "on": true, "off": false, "none": null,
                     "list": [1, "two", {"three": [3.5]}], "@type": "type.googleapis.com/x.y.Z",
                     "nested": {"deeper": {"z": "last", "a": "first"}},
                 }}},
            ],
        }),
    );
}

#[test]
fn envoy_filter_with_a_workload_selector_and_listener_and_route_matches() {
    assert_same(
        "EnvoyFilter",
        json!({
            "workloadSelector": {"labels": {"higress": "higress-system-higress-gateway", "app": "gw"}},
            "configPatches": [
                {"applyTo": "HTTP_FILTER", "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.http_connection_manager",
                    "subFilter": {"name": "envoy.filters.http.router"}}}}},
                 "patch": {"operation": "INSERT_BEFORE", "value": {"name": "envoy.filters.http.local_ratelimit"}}},
                {"applyTo": "NETWORK_FILTER", "match": {"context": "ANY", "listener": {"filterChain": {"filter": {
                    "name": "envoy.filters.network.tcp_proxy"}}}},
                 "patch": {"operation": "REMOVE"}},
                {"applyTo": "HTTP_ROUTE",
                 "match": {"context": "GATEWAY", "routeConfiguration": {"vhost": {"route": {"name": "shop-api-0"}}}},
                 "patch": {"operation": "MERGE", "value": {"typed_per_filter_config": {"x": {"tokens": 240}}}}},
            ],
        }),
    );
}

#[test]
fn a_match_naming_two_objects_is_an_error_naming_the_patch() {
    let spec = Spec::from_json(
        "EnvoyFilter",
        json!({"configPatches": [
            {"applyTo": "CLUSTER", "match": {"context": "GATEWAY", "cluster": {"name": "a"}},
             "patch": {"operation": "REMOVE"}},
            {"applyTo": "HTTP_ROUTE", "match": {"context": "GATEWAY", "cluster": {"name": "a"},
             "routeConfiguration": {"vhost": {"route": {"name": "r"}}}},
             "patch": {"operation": "REMOVE"}},
        ]}),
    )
    .expect("the model holds both");
    assert_eq!(encode(&spec).expect_err("a oneof"), PbError::PatchMatchObjects { index: 1 });
}

#[test]
fn a_patch_value_that_is_not_an_object_is_an_error_naming_the_patch() {
    let spec = Spec::from_json(
        "EnvoyFilter",
        json!({"configPatches": [
            {"applyTo": "CLUSTER", "match": {"context": "GATEWAY"}, "patch": {"operation": "ADD", "value": {}}},
            {"applyTo": "CLUSTER", "match": {"context": "GATEWAY"}, "patch": {"operation": "ADD", "value": "x"}},
        ]}),
    )
    .expect("the model takes any JSON value");
    let err = encode(&spec).expect_err("a string is not a Struct");
    assert_eq!(err, PbError::PatchValueNotObject { index: 1, got: "a string" });
    assert!(err.to_string().starts_with("configPatches[1].patch.value: must be a JSON object"), "{err}");
}
