//! The route policy annotations through a REAL istiod (`pilot-discovery`,
//! see `e2e/tests/istiod.rs` for the setup): istiod takes the
//! VirtualService's new fields over MCP (its `/debug/configz` decodes
//! them), and the routes it builds for the gateway hold the Envoy config
//! the standalone gateway gets from meshbridge directly: the HTTPS
//! redirect for `:scheme` http only, a URL redirect, the route timeout,
//! the retry policy, the headers, the Host rewrite and the CORS policy.
//! The routes are fetched from istiod's xDS as the gateway proxy; no
//! Envoy is needed (istiod's gateway listeners carry Istio-only filters).
//!
//! Runs once per istiod build (`istiod_tests!`). Needs `source e2e/env.sh
//! kubetools kube-apiserver istiod istiod-1.27`.

use envoy_types::pb::envoy::config::route::v3::{
    redirect_action::RedirectResponseCode, route, route_action::HostRewriteSpecifier,
};
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::free_port;
use meshbridge_e2e::istiod::{Istiod, Options, Version};
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{mcp_ingress, mcpbridge};

const HOST: &str = "shop.example.com";

fn ingresses() -> String {
    let ingress = |name, day, annotations, path| mcp_ingress(name, day, HOST, "web.static:80", annotations, &[path]);
    [
        ingress(
            "api",
            1,
            &[
                ("nginx.ingress.kubernetes.io/ssl-redirect", "true"),
                ("higress.io/timeout", "5"),
                ("nginx.ingress.kubernetes.io/proxy-next-upstream-tries", "2"),
                ("nginx.ingress.kubernetes.io/proxy-next-upstream", "error http_503"),
                ("higress.io/request-header-control-add", "x-env staging"),
                ("higress.io/response-header-control-remove", "x-powered-by"),
                ("nginx.ingress.kubernetes.io/upstream-vhost", "web.internal"),
                ("nginx.ingress.kubernetes.io/enable-cors", "true"),
                ("nginx.ingress.kubernetes.io/cors-allow-origin", "https://app.example.com"),
            ],
            "/api",
        ),
        ingress("old", 2, &[("higress.io/permanent-redirect", "https://new.example.com/catalog")], "/old"),
        ingress(
            "shadowed",
            3,
            &[("higress.io/mirror-target-service", "web.static:80"), ("higress.io/mirror-percentage", "25")],
            "/shadowed",
        ),
    ]
    .join("---\n")
}

/// Per how many a `FractionalPercent` counts.
fn denominator(d: i32) -> u64 {
    match DenominatorType::try_from(d) {
        Ok(DenominatorType::Hundred) => 100,
        Ok(DenominatorType::TenThousand) => 10_000,
        _ => 1_000_000,
    }
}

istiod_tests!(policy_annotations_reach_istiod_and_its_gateway_routes);

async fn policy_annotations_reach_istiod_and_its_gateway_routes(version: Version) {
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[format!("{{type: static, name: web, domain: \"127.0.0.1:{}\", port: 80}}", free_port())]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), ingresses()).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.expect("start meshbridge");
    let api = ApiServer::start().await.expect("start kube-apiserver (source e2e/env.sh kube-apiserver kubetools)");
    let istiod = Istiod::start(&api, app.xds_addr, Options { version, upstream_envoy: true })
        .await
        .unwrap_or_else(|e| panic!("start {version} (source e2e/env.sh istiod istiod-1.27): {e:#}"));

    // istiod decoded every new field of the VirtualService.
    let vs = istiod.virtual_service().await;
    let http = vs["spec"]["http"].as_array().unwrap();
    let by_name =
        |name: &str| http.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{version}: {name}: {vs}"));
    let main = by_name("shop-api-0");
    assert_eq!((main["timeout"].as_str(), main["retries"]["attempts"].as_i64()), (Some("5s"), Some(2)), "{main}");
    assert_eq!(main["corsPolicy"]["allowOrigins"][0]["exact"], "https://app.example.com", "{main}");
    assert_eq!(main["headers"]["request"]["add"]["x-env"], "staging", "{main}");
    assert_eq!(by_name("shop-api-0-ssl-redirect")["match"][0]["scheme"]["exact"], "http", "{vs}");
    assert_eq!(by_name("shop-old-0")["redirect"]["authority"], "new.example.com", "{vs}");
    let shadowed = by_name("shop-shadowed-0");
    assert_eq!(
        (shadowed["mirror"]["host"].as_str(), shadowed["mirrorPercentage"]["value"].as_f64()),
        (Some("web.static"), Some(25.0)),
        "{shadowed}"
    );

    // The routes istiod builds for the gateway from them.
    let routes = istiod.gateway_routes(HOST, 5).await;
    let named = |name: &str| {
        routes.iter().find(|r| r.name == name).unwrap_or_else(|| {
            let names: Vec<&String> = routes.iter().map(|r| &r.name).collect();
            panic!("{version}: no route {name} among {names:?}")
        })
    };

    let ssl = named("shop-api-0-ssl-redirect");
    let Some(route::Action::Redirect(redirect)) = &ssl.action else { panic!("{ssl:?}") };
    assert_eq!(redirect.response_code, RedirectResponseCode::PermanentRedirect as i32, "{redirect:?}");
    let scheme = ssl.r#match.as_ref().unwrap().headers.iter().find(|h| h.name == ":scheme");
    assert!(scheme.is_some(), "{version}: the HTTPS redirect is not for plain HTTP only: {ssl:?}");

    let old = named("shop-old-0");
    let Some(route::Action::Redirect(redirect)) = &old.action else { panic!("{old:?}") };
    assert_eq!((redirect.host_redirect.as_str(), redirect.response_code), ("new.example.com", 0), "{redirect:?}");

    let main = named("shop-api-0");
    let Some(route::Action::Route(ra)) = &main.action else { panic!("{main:?}") };
    assert_eq!(ra.timeout.as_ref().map(|d| d.seconds), Some(5), "{ra:?}");
    let retry = ra.retry_policy.as_ref().unwrap_or_else(|| panic!("{version}: no retry policy: {ra:?}"));
    assert_eq!(retry.num_retries.as_ref().map(|n| n.value), Some(2), "{retry:?}");
    assert!(retry.retry_on.contains("5xx") && retry.retriable_status_codes.contains(&503), "{retry:?}");
    assert_eq!(ra.host_rewrite_specifier, Some(HostRewriteSpecifier::HostRewriteLiteral("web.internal".into())));
    let added: Vec<&str> =
        main.request_headers_to_add.iter().filter_map(|h| h.header.as_ref()).map(|h| h.key.as_str()).collect();
    assert!(added.contains(&"x-env"), "{added:?}");
    assert!(main.response_headers_to_remove.contains(&"x-powered-by".to_owned()), "{main:?}");
    assert!(
        main.typed_per_filter_config.contains_key("envoy.filters.http.cors"),
        "{version}: no CORS policy: {main:?}"
    );

    // The mirror, as the standalone gateway sends it: a quarter, per million.
    let shadowed = named("shop-shadowed-0");
    let Some(route::Action::Route(ra)) = &shadowed.action else { panic!("{shadowed:?}") };
    let mirrors: Vec<(&str, Option<u64>)> = ra
        .request_mirror_policies
        .iter()
        .map(|m| {
            let fraction = m.runtime_fraction.as_ref().and_then(|f| f.default_value.as_ref());
            (m.cluster.as_str(), fraction.map(|f| u64::from(f.numerator) * 1_000_000 / denominator(f.denominator)))
        })
        .collect();
    assert_eq!(mirrors, [("outbound|80||web.static", Some(250_000))], "{ra:?}");
    app.stop().await;
}
