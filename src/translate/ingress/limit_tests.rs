//! The local rate limit for istiod: one EnvoyFilter on the gateway's pods,
//! the filter before the router and each limited route's bucket merged by
//! route name, in stable bytes.

use serde_json::json;

use super::ingress_tests::{run, shop_ingress};
use super::*;
use crate::translate::mcp;

const LIMIT: [(&str, &str); 2] =
    [("higress.io/route-limit-rpm", "120"), ("higress.io/route-limit-burst-multiplier", "2")];

fn filters(t: &IngressTranslation) -> Vec<&IstioObject> {
    t.objects.iter().filter(|o| o.kind() == "EnvoyFilter").collect()
}

/// The per-route config every limited route gets: the standalone gateway's
/// bucket in Envoy's JSON.
fn bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval: &str) -> serde_json::Value {
    json!({"typed_per_filter_config": {"envoy.filters.http.local_ratelimit": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
        "stat_prefix": "route_local_rate_limit",
        "status": {"code": "TooManyRequests"},
        "token_bucket": {"max_tokens": max_tokens, "tokens_per_fill": tokens_per_fill, "fill_interval": fill_interval},
        "filter_enabled": {"default_value": {"numerator": 100}},
        "filter_enforced": {"default_value": {"numerator": 100}},
    }}})
}

fn route_patch(name: &str, value: serde_json::Value) -> serde_json::Value {
    json!({
        "applyTo": "HTTP_ROUTE",
        "match": {"context": "GATEWAY", "routeConfiguration": {"vhost": {"route": {"name": name}}}},
        "patch": {"operation": "MERGE", "value": value},
    })
}

/// Every route of a limited Ingress (its HTTPS redirect too, as on the
/// standalone gateway) is patched by name; the open Ingress's are not. No
/// `standalone_only` warning: istiod's gateway limits too.
#[test]
fn limited_routes_are_patched_by_name_in_one_envoy_filter_on_the_gateway() {
    let mut limited: Vec<(&str, &str)> = LIMIT.to_vec();
    limited.push(("nginx.ingress.kubernetes.io/ssl-redirect", "true"));
    let yaml = [
        shop_ingress("api", 3, &limited, &[("/api", "Prefix", "web")]),
        shop_ingress("open", 1, &[], &[("/open", "Prefix", "web")]),
        shop_ingress("fast", 2, &[("higress.io/route-limit-rps", "10")], &[("/fast", "Exact", "web")]),
    ]
    .join("---\n");
    let t = run(&yaml);
    assert_eq!(t.warnings, vec![]);
    let filters = filters(&t);
    assert_eq!(filters.len(), 1, "{filters:#?}");
    let filter = filters[0];
    assert_eq!(
        (filter.metadata.namespace.as_str(), filter.metadata.name.as_str()),
        ("higress-system", "higress-gateway-local-rate-limit")
    );
    // As old as the oldest VirtualService with a limited route (the host's
    // oldest Ingress: "open", 2026-01-01).
    assert_eq!(filter.metadata.created, Some(1_767_225_600));
    assert_eq!(
        filter.spec.to_json(),
        json!({
            "workloadSelector": {"labels": {"higress": "higress-system-higress-gateway"}},
            "configPatches": [
                {
                    "applyTo": "HTTP_FILTER",
                    "match": {"context": "GATEWAY", "listener": {"filterChain": {"filter": {
                        "name": "envoy.filters.network.http_connection_manager",
                        "subFilter": {"name": "envoy.filters.http.router"},
                    }}}},
                    "patch": {"operation": "INSERT_BEFORE", "value": {
                        "name": "envoy.filters.http.local_ratelimit",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                            "stat_prefix": "local_rate_limit",
                        },
                    }},
                },
                route_patch("shop-api-0", bucket(240, 120, "60s")),
                route_patch("shop-api-0-ssl-redirect", bucket(240, 120, "60s")),
                route_patch("shop-fast-0", bucket(50, 10, "1s")),
            ],
        })
    );
    // Istio's schema takes it, as MCP sends it.
    mcp::resource(filter, 0).unwrap_or_else(|w| panic!("{w}"));
}

/// No limited route, no EnvoyFilter.
#[test]
fn no_limit_no_envoy_filter() {
    let t = run(&shop_ingress("open", 1, &[], &[("/open", "Prefix", "web")]));
    assert!(filters(&t).is_empty());
}

/// A canary shares its main route's limit, on its own routes too.
#[test]
fn canary_routes_carry_the_main_routes_limit() {
    let yaml = [
        shop_ingress("api", 1, &LIMIT, &[("/api", "Prefix", "web")]),
        shop_ingress(
            "api-canary",
            2,
            &[("nginx.ingress.kubernetes.io/canary", "true"), ("nginx.ingress.kubernetes.io/canary-by-header", "x-b")],
            &[("/api", "Prefix", "web-b")],
        ),
    ]
    .join("---\n");
    let t = run(&yaml);
    let spec = filters(&t)[0].spec.to_json();
    let names: Vec<&str> = spec["configPatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["match"]["routeConfiguration"]["vhost"]["route"]["name"].as_str())
        .collect();
    assert_eq!(names, ["shop-api-0", "shop-api-canary-0-canary-header"]);
}

/// The same Ingresses, in any order and translated again, give the same
/// bytes and version: no map's iteration order reaches the output.
#[test]
fn the_same_ingresses_give_the_same_bytes() {
    let docs: Vec<String> = (0..6)
        .map(|i| {
            let rps = (i + 1).to_string();
            let path = format!("/p{i}");
            shop_ingress(
                &format!("ing-{i}"),
                i + 1,
                &[("higress.io/route-limit-rps", &rps)],
                &[(&path, "Prefix", "web")],
            )
        })
        .collect();
    let encode = |docs: &[String]| {
        let t = run(&docs.join("---\n"));
        let filter = filters(&t)[0].clone();
        let r = mcp::resource(&filter, filter.metadata.created.unwrap_or(0)).unwrap_or_else(|w| panic!("{w}"));
        (r.version.clone(), r.body.value().to_vec())
    };
    let first = encode(&docs);
    let mut reversed = docs.clone();
    reversed.reverse();
    assert_eq!(encode(&reversed), first);
    let mut rotated = docs.clone();
    rotated.rotate_left(2);
    assert_eq!(encode(&rotated), first);
    assert_eq!(encode(&docs), first);
}

/// `a-b/c` and `a/b-c` name their routes alike (`a-b-c-0`): with
/// different limits neither is patched, since istiod would give both one
/// limit, and a warning says so; the same limit is patched once.
#[test]
fn routes_that_share_a_name_with_different_limits_are_not_patched() {
    let ingress = |ns: &str, name: &str, host: &str, limit: &str| {
        format!(
            "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
             annotations: {{higress.io/route-limit-rps: \"{limit}\"}}\nspec:\n  ingressClassName: higress\n  rules:\n    \
             - host: {host}\n      http:\n        paths:\n          \
             - {{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{number: 80}}}}}}}}\n"
        )
    };
    let t = run(
        &[ingress("a-b", "c", "one.example.com", "10"), ingress("a", "b-c", "two.example.com", "20")].join("---\n")
    );
    assert!(filters(&t).is_empty(), "{:#?}", filters(&t));
    let said: Vec<String> = t.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("route a-b-c-0, a name other routes with another limit share,"), "{said:?}");
    assert_eq!(t.warnings[0].reason, Reason::StandaloneOnly);

    let t = run(
        &[ingress("a-b", "c", "one.example.com", "10"), ingress("a", "b-c", "two.example.com", "10")].join("---\n")
    );
    assert_eq!(t.warnings, vec![]);
    assert_eq!(filters(&t)[0].spec.to_json()["configPatches"].as_array().unwrap().len(), 2);
}
