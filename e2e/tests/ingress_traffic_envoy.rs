//! The traffic group through a standalone Envoy (listeners and routes over
//! ADS): `mirror-target-service` sends a copy of each request to a second
//! backend, all of them or `mirror-percentage` of them, while the client
//! gets the main backend's answer. Both backends are static registry
//! services echoing their name ([`EchoBackend`], which counts the requests
//! each path got), so Envoy is the only real server. A percentage over 100
//! and an unknown service are reported on `/v1/config`, and the paths of
//! those Ingresses still route.
//!
//! `whitelist-source-range` and `denylist-source-range`, from clients bound
//! to loopback addresses of their own (127.0.0.1, .2, .3): Envoy answers
//! 403 to a client the ranges leave out and routes the others, on the
//! standalone gateway and through a REAL istiod (both builds), where the
//! ranges are AuthorizationPolicies.
//!
//! `route-limit-rpm`: the route's token bucket, 429 once it is empty, while
//! an open route answers, on the standalone gateway and through a REAL
//! istiod (both builds), where the limit is an EnvoyFilter.

use std::time::{Duration, Instant};

use meshbridge_e2e::backend::EchoBackend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::gateway::{Gateway, Via};
use meshbridge_e2e::istiod::Version;
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{config_warning, mcp_ingress, mcpbridge, start_gateway, static_registry};

const HOST: &str = "shop.example.com";

fn ingresses() -> String {
    let ingress = |name, day, annotations, path| mcp_ingress(name, day, HOST, "main.static:80", annotations, &[path]);
    [
        ingress("all", 1, &[("nginx.ingress.kubernetes.io/mirror-target-service", "shadow.static:80")], "/all"),
        ingress(
            "some",
            2,
            &[("higress.io/mirror-target-service", "shadow.static:80"), ("higress.io/mirror-percentage", "30")],
            "/some",
        ),
        ingress(
            "too-much",
            3,
            &[("higress.io/mirror-target-service", "shadow.static:80"), ("higress.io/mirror-percentage", "150")],
            "/too-much",
        ),
        ingress("lost", 4, &[("higress.io/mirror-target-service", "nowhere.static:80")], "/lost"),
    ]
    .join("---\n")
}

/// Send `n` GETs for `path`; every answer must be the main backend's.
async fn send(envoy: &Envoy, path: &str, n: u32) {
    for _ in 0..n {
        let (status, body) = envoy.get_host(path, HOST).await.unwrap();
        assert_eq!((status, body.lines().next()), (200, Some("main")), "{path}: {body}");
    }
}

/// The shadow's count for `path` once it stops rising (mirrored requests
/// are sent beside the main one and may land a little later).
async fn settled(shadow: &EchoBackend, path: &str, at_least: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = shadow.hits(path);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = shadow.hits(path);
        if (now == last && now >= at_least) || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirror_copies_requests_to_a_second_backend_through_envoy() {
    let main = EchoBackend::start("127.0.0.1", "main").await.unwrap();
    let shadow = EchoBackend::start("127.0.0.1", "shadow").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[static_registry("main", main.addr), static_registry("shadow", shadow.addr)]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), ingresses()).unwrap();
    let gateway_port = free_port();
    let app = start_gateway(dir.path(), gateway_port).await.expect("start meshbridge");

    // Bad values name the Ingress and the annotation.
    let too_much = config_warning(app.admin_addr, "Ingress shop/too-much").await;
    assert_eq!(too_much["reason"], "invalid_ingress", "{too_much}");
    assert_eq!(
        too_much["detail"],
        "annotation higress.io/mirror-percentage: \"150\" is not a whole percentage from 0 to 100; mirror left out"
    );
    let lost = config_warning(app.admin_addr, "Ingress shop/lost").await;
    assert_eq!(lost["reason"], "invalid_ingress", "{lost}");
    assert_eq!(
        lost["detail"],
        "annotation higress.io/mirror-target-service: no registry service \"nowhere.static\"; mirror left out"
    );

    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, gateway_port).await.expect("start envoy");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let clusters = envoy.admin("/clusters").await.unwrap_or_default();
        let ready = [&main, &shadow].iter().all(|b| clusters.contains(&b.addr.to_string()));
        // The mirror comes with the routes once the shadow service is known,
        // which may be after the first routes.
        let routes = envoy.admin("/config_dump?resource=dynamic_route_configs").await.unwrap_or_default();
        let mirrored = routes.contains("request_mirror_policies");
        if ready && mirrored && matches!(envoy.get_host("/all/ready", HOST).await, Ok((200, _))) {
            break;
        }
        assert!(Instant::now() < deadline, "routes, mirror or endpoints never arrived:\n{clusters}\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every request copied; the client only ever sees main's answer.
    send(&envoy, "/all/x", 20).await;
    assert_eq!(main.hits("/all/x"), 20);
    assert_eq!(settled(&shadow, "/all/x", 20).await, 20, "not every request was mirrored");

    // 30 % of them: over 200 draws the standard deviation is about 6.5,
    // so 60 ± 27 is over four sigma.
    send(&envoy, "/some/x", 200).await;
    assert_eq!(main.hits("/some/x"), 200);
    let mirrored = settled(&shadow, "/some/x", 1).await;
    println!("FIGURE ingress_mirror_share mirrored={mirrored} of 200 (want 60)");
    assert!((33..=87).contains(&mirrored), "mirror share off 30 %: {mirrored} of 200");

    // The reported Ingresses still route, without a mirror.
    send(&envoy, "/too-much/x", 10).await;
    send(&envoy, "/lost/x", 10).await;
    assert_eq!((settled(&shadow, "/too-much/x", 0).await, settled(&shadow, "/lost/x", 0).await), (0, 0));
    assert_eq!((main.hits("/too-much/x"), main.hits("/lost/x")), (10, 10));
    app.stop().await;
}

fn ranged_ingresses() -> String {
    let ingress = |name, day, annotations, path| mcp_ingress(name, day, HOST, "main.static:80", annotations, &[path]);
    [
        ingress("office", 1, &[("nginx.ingress.kubernetes.io/whitelist-source-range", "127.0.0.1/32")], "/office"),
        ingress("blocked", 2, &[("nginx.ingress.kubernetes.io/denylist-source-range", "127.0.0.2")], "/blocked"),
        ingress(
            "both",
            3,
            &[
                ("higress.io/whitelist-source-range", "127.0.0.0/29"),
                ("higress.io/denylist-source-range", "127.0.0.3/32"),
            ],
            "/both",
        ),
        // The bad entry is left out: only 127.0.0.3 is let in.
        ingress("typo", 4, &[("higress.io/whitelist-source-range", "127.0.0.1/33, 127.0.0.3")], "/typo"),
    ]
    .join("---\n")
}

/// The status of a GET for `path` sent from `source` to the gateway.
async fn status_from(source: &str, port: u16, path: &str) -> u16 {
    let client = reqwest::Client::builder().local_address(source.parse::<std::net::IpAddr>().ok()).build().unwrap();
    let url = format!("http://127.0.0.1:{port}{path}");
    match client.get(url).header("host", HOST).timeout(Duration::from_secs(5)).send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_ranges_allow_and_deny_clients_by_address_through_envoy() {
    source_ranges(Via::Standalone).await;
}

// Through istiod, each ranged Ingress is an AuthorizationPolicy (DENY, on
// `remoteIpBlocks`) that istiod turns into the gateway's RBAC filter.
// Needs `source e2e/env.sh envoy kubetools kube-apiserver istiod istiod-1.27`.
istiod_tests!(source_ranges_allow_and_deny_clients_by_address_through_istiod);

async fn source_ranges_allow_and_deny_clients_by_address_through_istiod(version: Version) {
    source_ranges(Via::Istiod(version)).await;
}

async fn source_ranges(via: Via) {
    let main = EchoBackend::start("127.0.0.1", "main").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[static_registry("main", main.addr)]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), ranged_ingresses()).unwrap();
    let gw = Gateway::start(dir.path(), via).await.expect("start meshbridge and the gateway");
    let typo = config_warning(gw.app.admin_addr, "Ingress shop/typo").await;
    assert_eq!(typo["reason"], "invalid_ingress", "{typo}");
    assert_eq!(
        typo["detail"],
        "annotation higress.io/whitelist-source-range: \"127.0.0.1/33\" is not an address or CIDR; left out"
    );

    let (envoy, port) = (&gw.envoy, gw.envoy.listen_port);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Ready once the routes and the policies are in: /office answers
    // 127.0.0.1 and refuses 127.0.0.2.
    loop {
        let office = matches!(envoy.get_host("/office", HOST).await, Ok((200, _)));
        if office && status_from("127.0.0.2", port, "/office").await == 403 {
            break;
        }
        assert!(Instant::now() < deadline, "routes never arrived ({via:?}):\n{}\n{}", envoy.log(), gw.istiod_log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cases = [
        ("/office", [200, 403, 403]),
        ("/office/desk", [200, 403, 403]),
        ("/blocked", [200, 403, 200]),
        ("/both", [200, 200, 403]),
        ("/typo", [403, 403, 200]),
    ];
    for (path, want) in cases {
        let mut got = [0; 3];
        for (i, source) in ["127.0.0.1", "127.0.0.2", "127.0.0.3"].iter().enumerate() {
            got[i] = status_from(source, port, path).await;
        }
        assert_eq!(got, want, "{path} from 127.0.0.1, .2, .3 ({via:?})");
    }
    // Only the requests let through reached the backend.
    let hits: Vec<u32> = ["/blocked", "/both", "/typo", "/office/desk"].iter().map(|p| main.hits(p)).collect();
    assert_eq!(hits, [2, 2, 1, 1], "backend hits ({via:?})");
    gw.app.stop().await;
}

/// Higress's local rate limit: `route-limit-rpm: 2` with a burst
/// multiplier of 1 is a bucket of two tokens, refilled once a minute, so of
/// four quick requests the first two reach the backend and the others get
/// a 429; a route without a limit on the same gateway keeps answering 200.
/// No warning: both paths enforce it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_limit_answers_429_once_its_tokens_are_spent_through_envoy() {
    route_limit(Via::Standalone).await;
}

// Through istiod, the limit is an EnvoyFilter on the gateway's pods: the
// filter before the router, and the bucket merged into the route by name.
// Needs `source e2e/env.sh envoy kubetools kube-apiserver istiod istiod-1.27`.
istiod_tests!(a_route_limit_answers_429_once_its_tokens_are_spent_through_istiod);

async fn a_route_limit_answers_429_once_its_tokens_are_spent_through_istiod(version: Version) {
    route_limit(Via::Istiod(version)).await;
}

async fn route_limit(via: Via) {
    let main = EchoBackend::start("127.0.0.1", "main").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[static_registry("main", main.addr)]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    let ingress = |name, day, annotations, path| mcp_ingress(name, day, HOST, "main.static:80", annotations, &[path]);
    let limits = [("higress.io/route-limit-rpm", "2"), ("higress.io/route-limit-burst-multiplier", "1")];
    let yaml = [ingress("limited", 1, &limits, "/limited"), ingress("open", 2, &[], "/open")].join("---\n");
    std::fs::write(dir.path().join("shop.yaml"), yaml).unwrap();
    let gw = Gateway::start(dir.path(), via).await.expect("start meshbridge and the gateway");
    let envoy = &gw.envoy;

    // Ready once the open route answers and the limit is in the Envoy: the
    // filter in its listener and the bucket in its routes (asking the
    // limited route would spend its tokens).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let open = matches!(envoy.get_host("/open", HOST).await, Ok((200, _)));
        let listeners = envoy.admin("/config_dump?resource=dynamic_listeners").await.unwrap_or_default();
        let routes = envoy.admin("/config_dump?resource=dynamic_route_configs").await.unwrap_or_default();
        let limited =
            listeners.contains("envoy.filters.http.local_ratelimit") && routes.contains("route_local_rate_limit");
        if open && limited {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "routes or the limit never arrived ({via:?}; open: {open}):\n{routes}\n{}\n{}",
            envoy.log(),
            gw.istiod_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let url = format!("http://{}/v1/config", gw.app.admin_addr);
    let config: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    let said: Vec<&serde_json::Value> = config["warnings"].as_array().into_iter().flatten().collect();
    assert!(said.is_empty(), "{via:?}: {said:?}");

    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(envoy.get_host("/limited", HOST).await.map(|(status, _)| status).unwrap_or_default());
    }
    assert_eq!(got, [200, 200, 429, 429], "two tokens, then none for a minute ({via:?})");
    assert_eq!(main.hits("/limited"), 2, "the limited requests never reached the backend ({via:?})");
    for _ in 0..5 {
        let status = envoy.get_host("/open", HOST).await.map(|(s, _)| s).unwrap_or_default();
        assert_eq!(status, 200, "an open route on the same gateway ({via:?})");
    }
    gw.app.stop().await;
}
