//! The route policy annotations through a REAL istiod (`pilot-discovery`,
//! see `e2e/tests/istiod.rs` for the setup): istiod takes the
//! VirtualService's new fields over MCP (its `/debug/configz` decodes
//! them), and the routes it builds for the gateway hold the Envoy config
//! the standalone gateway gets from meshbridge directly: the HTTPS
//! redirect for `:scheme` http only, a URL redirect, the route timeout,
//! the retry policy, the headers, the Host rewrite and the CORS policy.
//!
//! Then a stock Envoy fed only by istiod, as the Ingress Gateway, carries
//! real requests to an echo backend, as `ingress_policy_envoy.rs` and
//! `ingress_traffic_envoy.rs` do on the standalone gateway: the redirects
//! (HTTPS, permanent, temporal, app-root), a timeout that gives a 504, a
//! 503 retried, the headers added and removed, the Host rewrite, a path
//! rewrite, a CORS preflight and the mirror.
//!
//! Runs once per istiod build (`istiod_tests!`). Needs `source e2e/env.sh
//! envoy kubetools kube-apiserver istiod istiod-1.27`.

use envoy_types::pb::envoy::config::route::v3::{
    redirect_action::RedirectResponseCode, route, route_action::HostRewriteSpecifier,
};
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
use std::time::{Duration, Instant};

use meshbridge::run::{App, RunArgs};
use meshbridge_e2e::apiserver::ApiServer;
use meshbridge_e2e::backend::EchoBackend;
use meshbridge_e2e::istiod::{Istiod, Options, Version, wait_for_route};
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{mcp_ingress, mcpbridge};
use reqwest::Method;
use reqwest::header::HeaderMap;

const HOST: &str = "shop.example.com";

/// The policies of `/api` (behind the HTTPS redirect) and `/tuned` (plain
/// HTTP, for traffic).
const POLICIES: [(&str, &str); 7] = [
    ("nginx.ingress.kubernetes.io/proxy-next-upstream-tries", "2"),
    ("nginx.ingress.kubernetes.io/proxy-next-upstream", "error http_503"),
    ("higress.io/request-header-control-add", "x-env staging"),
    ("higress.io/response-header-control-remove", "x-powered-by"),
    ("nginx.ingress.kubernetes.io/upstream-vhost", "web.internal"),
    ("nginx.ingress.kubernetes.io/enable-cors", "true"),
    ("nginx.ingress.kubernetes.io/cors-allow-origin", "https://app.example.com"),
];

fn ingresses() -> String {
    let ingress = |name, day, annotations, path| mcp_ingress(name, day, HOST, "web.static:80", annotations, &[path]);
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
        extra.iter().chain(&POLICIES).copied().collect()
    };
    [
        // The policies without the HTTPS redirect, for plain HTTP traffic
        // (a 1 s timeout, to see it); and a path rewrite.
        ingress("tuned", 4, &with(&[("higress.io/timeout", "1")]), "/tuned"),
        // `/` on the host: a 302 to /tuned.
        ingress(
            "moved",
            5,
            &[("higress.io/rewrite-target", "/v2"), ("nginx.ingress.kubernetes.io/app-root", "/tuned")],
            "/v1",
        ),
        ingress(
            "api",
            1,
            &with(&[("nginx.ingress.kubernetes.io/ssl-redirect", "true"), ("higress.io/timeout", "5")]),
            "/api",
        ),
        ingress("old", 2, &[("higress.io/permanent-redirect", "https://new.example.com/catalog")], "/old"),
        // temporal-redirect wins over permanent-redirect, with a 302.
        ingress(
            "sale",
            6,
            &[
                ("nginx.ingress.kubernetes.io/temporal-redirect", "https://sale.example.com/now"),
                ("higress.io/permanent-redirect", "https://never.example.com/"),
            ],
            "/sale",
        ),
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

/// One request through the gateway on loopback, redirects not followed:
/// (status, headers, body).
async fn send(port: u16, method: Method, path: &str, headers: &[(&str, &str)]) -> (u16, HeaderMap, String) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut req = client.request(method, format!("http://127.0.0.1:{port}{path}")).header("host", HOST);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"));
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.text().await.unwrap_or_default())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

istiod_tests!(policy_annotations_reach_istiod_and_carry_traffic_through_its_gateway);

async fn policy_annotations_reach_istiod_and_carry_traffic_through_its_gateway(version: Version) {
    let backend = EchoBackend::start("127.0.0.1", "echo").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[format!("{{type: static, name: web, domain: \"{}\", port: 80}}", backend.addr)]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), ingresses()).unwrap();
    let app = App::start(RunArgs::loopback(dir.path())).await.expect("start meshbridge");
    let api = ApiServer::start().await.expect("start kube-apiserver (source e2e/env.sh kube-apiserver kubetools)");
    let options = Options { version, upstream_envoy: true, stock_gateway_listeners: true, secure_xds: false };
    let istiod = Istiod::start(&api, app.xds_addr, options)
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
    let sale = &by_name("shop-sale-0")["redirect"];
    assert_eq!((sale["authority"].as_str(), sale["redirectCode"].as_i64()), (Some("sale.example.com"), Some(302)));
    let root = &by_name("shop-moved-app-root")["redirect"];
    assert_eq!((root["uri"].as_str(), root["redirectCode"].as_i64()), (Some("/tuned"), Some(302)), "{vs}");
    assert_eq!(http[0]["name"], "shop-moved-app-root", "app-root goes before every route of the host: {vs}");
    let shadowed = by_name("shop-shadowed-0");
    assert_eq!(
        (shadowed["mirror"]["host"].as_str(), shadowed["mirrorPercentage"]["value"].as_f64()),
        (Some("web.static"), Some(25.0)),
        "{shadowed}"
    );

    // The routes istiod builds for the gateway from them.
    // Two Envoy routes for each Prefix path and for the HTTPS redirect of
    // one, one for the regex path and for app-root's `/`.
    let routes = istiod.gateway_routes(&api, HOST, 14).await;
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

    // temporal-redirect: 302 to the URL's scheme, host and path.
    let sale = named("shop-sale-0");
    let Some(route::Action::Redirect(redirect)) = &sale.action else { panic!("{sale:?}") };
    assert_eq!(
        (redirect.host_redirect.as_str(), redirect.response_code),
        ("sale.example.com", RedirectResponseCode::Found as i32)
    );
    // app-root: `/` exactly, first in the host, 302 to the root.
    let root = named("shop-moved-app-root");
    assert_eq!(routes[0].name, root.name, "app-root is not first: {routes:?}");
    let Some(route::Action::Redirect(redirect)) = &root.action else { panic!("{root:?}") };
    assert_eq!(redirect.response_code, RedirectResponseCode::Found as i32, "{redirect:?}");

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

    // Real requests through an Envoy that istiod alone configures.
    let envoy = istiod.gateway_envoy(&api).await.expect("start envoy (source e2e/env.sh envoy)");
    wait_for_route(&envoy, HOST, "/tuned", &istiod).await;
    let gateway_port = envoy.listen_port;
    let get = |path: &'static str| send(gateway_port, Method::GET, path, &[]);

    // The HTTPS redirect, for plain HTTP: 308, path and query kept.
    let (status, h, _) = get("/api/cart?id=7").await;
    assert_eq!((status, header(&h, "location")), (308, Some("https://shop.example.com/api/cart?id=7")));
    // permanent-redirect: 301 to the URL's scheme, host and path.
    let (status, h, _) = get("/old/page").await;
    assert_eq!((status, header(&h, "location")), (301, Some("https://new.example.com/catalog")));
    // temporal-redirect: 302, the URL as given.
    let (status, h, _) = get("/sale").await;
    assert_eq!((status, header(&h, "location")), (302, Some("https://sale.example.com/now")));
    // app-root: `/` on the host, 302 to the root; a deeper path is routed.
    let (status, h, _) = get("/").await;
    assert_eq!((status, header(&h, "location")), (302, Some("http://shop.example.com/tuned")));
    for path in ["/api/cart?id=7", "/old/page", "/sale", "/"] {
        assert_eq!(backend.hits(path), 0, "a redirect of {path} reached the backend");
    }

    // Headers: one added for the backend, one removed from the answer; the
    // Host rewritten.
    let (status, h, body) = get("/tuned/x").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("echo\nGET /tuned/x HTTP/1.1\n"), "{body}");
    assert!(body.contains("\nx-env: staging\n"), "{body}");
    assert!(body.contains("\nhost: web.internal\n"), "{body}");
    assert_eq!(header(&h, "x-powered-by"), None, "{h:?}");
    assert_eq!(header(&h, "x-backend"), Some("echo"), "{h:?}");

    // `timeout: 1`: Envoy gives up on the 3 s answer after 1 s, with a 504.
    let t = Instant::now();
    let (status, _, _) = get("/tuned/slow").await;
    let took = t.elapsed();
    assert_eq!(status, 504);
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(2500), "{took:?}");
    // A first 503 is retried, and the retry answers.
    assert_eq!(get("/tuned/flaky/1").await.0, 200);
    assert_eq!(backend.hits("/tuned/flaky/1"), 2);

    // A CORS preflight from the allowed origin is answered by Envoy; one
    // from another origin gets no CORS headers.
    let preflight = |origin| [("origin", origin), ("access-control-request-method", "GET")];
    let (status, h, _) = send(gateway_port, Method::OPTIONS, "/tuned/c", &preflight("https://app.example.com")).await;
    assert_eq!((status, header(&h, "access-control-allow-origin")), (200, Some("https://app.example.com")), "{h:?}");
    assert_eq!(backend.hits("/tuned/c"), 0, "the preflight reached the backend");
    let (_, h, _) = send(gateway_port, Method::OPTIONS, "/tuned/c", &preflight("https://evil.example.com")).await;
    assert_eq!(header(&h, "access-control-allow-origin"), None, "{h:?}");

    // rewrite-target: the matched path replaced.
    let (status, _, body) = get("/v1/items?q=1").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("echo\nGET /v2/items?q=1 HTTP/1.1\n"), "{body}");

    // The mirror: each request answered once, and about a quarter copied
    // to the mirror service (here the same backend, which counts both).
    for _ in 0..200 {
        assert_eq!(get("/shadowed/m").await.0, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut copies = backend.hits("/shadowed/m") - 200;
    while copies < 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        copies = backend.hits("/shadowed/m") - 200;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    copies = backend.hits("/shadowed/m") - 200;
    println!("FIGURE istiod_mirror copies={copies} of 200 (want about 50)");
    // 25 % of 200: the standard deviation is about 6.1, so 20..=80 is
    // beyond four sigma on either side.
    assert!((20..=80).contains(&copies), "{copies} of 200 mirrored, want about 50");
    app.stop().await;
}
