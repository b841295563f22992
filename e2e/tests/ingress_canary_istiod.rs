//! The canary Ingresses of `ingress_canary_envoy.rs` (`traffic::canary_ingresses`) through a REAL istiod
//! (`pilot-discovery`, see `e2e/tests/istiod.rs` for the setup): istiod
//! takes the canary routes of the VirtualService over MCP, and builds the
//! gateway's routes from them in order (the header before the cookie, the
//! `never` values to the main service, the weighted split 30/70, the main
//! route last). A stock Envoy fed only by istiod, as the Ingress Gateway,
//! then carries real requests to the two backends, and
//! `traffic::check_canary_routing` checks them exactly as it does on the
//! standalone gateway.
//!
//! Runs once per istiod build (`istiod_tests!`). Needs `source e2e/env.sh
//! envoy kubetools kube-apiserver istiod istiod-1.27`.

use envoy_types::pb::envoy::config::route::v3::{
    Route, header_matcher::HeaderMatchSpecifier, route, route_action::ClusterSpecifier,
};
use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::istiod::{Istiod, Options, Version, wait_for_route};
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{canary_ingresses, check_canary_routing, mcpbridge};

const HOST: &str = "shop.example.com";

/// The single cluster `route` sends to, or its weighted clusters.
fn clusters(route: &Route) -> Vec<(String, u32)> {
    let Some(route::Action::Route(ra)) = &route.action else { panic!("not a route action: {route:?}") };
    match &ra.cluster_specifier {
        Some(ClusterSpecifier::Cluster(c)) => vec![(c.clone(), 100)],
        Some(ClusterSpecifier::WeightedClusters(w)) => {
            w.clusters.iter().map(|c| (c.name.clone(), c.weight.as_ref().map_or(0, |w| w.value))).collect()
        }
        other => panic!("unexpected cluster specifier {other:?}"),
    }
}

/// `name`'s header matcher in `route`: exact value or regex.
fn header(route: &Route, name: &str) -> Option<String> {
    let h = route.r#match.as_ref()?.headers.iter().find(|h| h.name == name)?;
    match &h.header_match_specifier {
        Some(HeaderMatchSpecifier::StringMatch(m)) => match &m.match_pattern {
            Some(MatchPattern::Exact(v)) => Some(format!("exact {v}")),
            Some(MatchPattern::SafeRegex(r)) => Some(format!("regex {}", r.regex)),
            other => panic!("unexpected matcher {other:?}"),
        },
        other => panic!("unexpected header matcher {other:?}"),
    }
}

/// The host part of an Istio cluster name (`outbound|80||main.static`).
fn service(cluster: &str) -> &str {
    cluster.rsplit('|').next().unwrap_or(cluster)
}

istiod_tests!(canary_routes_reach_istiod_and_carry_traffic_through_its_gateway);

async fn canary_routes_reach_istiod_and_carry_traffic_through_its_gateway(version: Version) {
    let main = Backend::start("127.0.0.1", "main").await.unwrap();
    let canary = Backend::start("127.0.0.1", "canary").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[
        format!("{{type: static, name: main, domain: \"{}\", port: 80}}", main.addr),
        format!("{{type: static, name: canary, domain: \"{}\", port: 80}}", canary.addr),
    ]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), canary_ingresses(HOST).join("---\n")).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.expect("start meshbridge");
    let api = ApiServer::start().await.expect("start kube-apiserver (source e2e/env.sh kube-apiserver kubetools)");
    let options = Options { version, upstream_envoy: true, stock_gateway_listeners: true, secure_xds: false };
    let istiod = Istiod::start(&api, app.xds_addr, options)
        .await
        .unwrap_or_else(|e| panic!("start {version} (source e2e/env.sh istiod istiod-1.27): {e:#}"));

    // istiod decoded the canary routes of the VirtualService.
    let vs = istiod.virtual_service().await;
    let http = vs["spec"]["http"].as_array().unwrap();
    let names: Vec<&str> = http.iter().filter_map(|r| r["name"].as_str()).collect();
    let app_order = ["shop-shop-canary-app-0-canary-header", "shop-shop-canary-app-0-canary-cookie", "shop-shop-0"];
    let split_order =
        ["shop-shop-canary-split-0-canary-header", "shop-shop-canary-split-0-canary-header-never", "shop-shop-1"];
    for order in [app_order, split_order] {
        let at: Vec<Option<usize>> = order.iter().map(|n| names.iter().position(|m| m == n)).collect();
        assert!(at.iter().all(Option::is_some) && at.is_sorted(), "{version}: want {order:?} in order, got {names:?}");
    }

    // The routes istiod builds for the gateway from them.
    let routes = istiod.gateway_routes(&api, HOST, 6).await;
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    // Every Envoy route of a VirtualService route (one per match: the
    // prefix is an exact and a `/…/` prefix match), in the same order.
    let named = |name: &str| -> Vec<&Route> {
        let found: Vec<&Route> = routes.iter().filter(|r| r.name == name).collect();
        assert!(!found.is_empty(), "{version}: no route {name} among {names:?}");
        found
    };
    let first = |name: &str| names.iter().position(|n| *n == name).unwrap();
    let last = |name: &str| names.iter().rposition(|n| *n == name).unwrap();
    for order in [app_order, split_order] {
        for pair in order.windows(2) {
            assert!(last(pair[0]) < first(pair[1]), "{version}: {} not before {}: {names:?}", pair[0], pair[1]);
        }
    }
    let to = |r: &Route| -> Vec<(String, u32)> {
        clusters(r).into_iter().map(|(c, w)| (service(&c).to_owned(), w)).collect()
    };
    let only = |host: &str| vec![(host.to_owned(), 100)];

    // /app: `x-canary: always` to the canary, then the cookie, then main.
    for r in named("shop-shop-canary-app-0-canary-header") {
        assert_eq!(header(r, "x-canary").as_deref(), Some("exact always"), "{r:?}");
        assert_eq!(to(r), only("canary.static"), "{r:?}");
    }
    for r in named("shop-shop-canary-app-0-canary-cookie") {
        let cookie = header(r, "cookie").unwrap_or_else(|| panic!("no cookie match: {r:?}"));
        // The pattern the standalone gateway's test sends cookies against.
        assert_eq!(cookie, r"regex (.*;\s*)?beta_user=always(;.*)?", "{r:?}");
        assert_eq!(to(r), only("canary.static"), "{r:?}");
    }
    for r in named("shop-shop-0") {
        assert_eq!(r.r#match.as_ref().map(|m| m.headers.len()), Some(0), "{r:?}");
        assert_eq!(to(r), only("main.static"), "{r:?}");
    }

    // /split: the header (always, never), then the weight 3 of 10.
    for r in named("shop-shop-canary-split-0-canary-header") {
        assert_eq!(header(r, "x-canary").as_deref(), Some("exact always"), "{r:?}");
        assert_eq!(to(r), only("canary.static"), "{r:?}");
    }
    for r in named("shop-shop-canary-split-0-canary-header-never") {
        assert_eq!(header(r, "x-canary").as_deref(), Some("exact never"), "{r:?}");
        assert_eq!(to(r), only("main.static"), "{r:?}");
    }
    for r in named("shop-shop-1") {
        let mut split = to(r);
        split.sort();
        assert_eq!(split, [("canary.static".to_owned(), 30), ("main.static".to_owned(), 70)], "{r:?}");
    }

    // Real requests through an Envoy that istiod alone configures.
    let envoy = istiod.gateway_envoy(&api).await.expect("start envoy (source e2e/env.sh envoy)");
    wait_for_route(&envoy, HOST, "/app", &istiod).await;
    let to_canary = check_canary_routing(&envoy, HOST).await;
    println!("FIGURE istiod_canary_weight canary={to_canary} main={} of 200 (want 60/140)", 200 - to_canary);
    app.stop().await;
}
