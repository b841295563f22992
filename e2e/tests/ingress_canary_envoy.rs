//! ingress-nginx / Higress canary Ingresses through a standalone Envoy
//! (listeners and routes over ADS): a main Ingress on `/app` and `/split`,
//! a canary on `/app` by header and cookie (`nginx.ingress.kubernetes.io/`
//! keys), and a canary on `/split` by header and weight (`higress.io/`
//! keys, 3 out of a total of 10). The backends are static registry
//! services, so Envoy is the only real server; each answers with its name.
//! A canary with a bad regex is reported on `/v1/config`.

use std::time::{Duration, Instant};

use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::traffic::{
    canary_ingresses, check_canary_routing, config_warning, mcp_ingress, mcpbridge, start_gateway,
};

const HOST: &str = "shop.example.com";

fn ingresses() -> String {
    let mut all = canary_ingresses(HOST);
    all.push(mcp_ingress(
        "shop-canary-bad",
        4,
        HOST,
        "canary.static:80",
        &[
            ("higress.io/canary", "true"),
            ("higress.io/canary-by-header", "x-user"),
            ("higress.io/canary-by-header-pattern", "(alice"),
        ],
        &["/app"],
    ));
    all.join("---\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_by_header_cookie_and_weight_through_envoy() {
    let main = Backend::start("127.0.0.1", "main").await.unwrap();
    let canary = Backend::start("127.0.0.1", "canary").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bridge = mcpbridge(&[
        format!("{{type: static, name: main, domain: \"{}\", port: 80}}", main.addr),
        format!("{{type: static, name: canary, domain: \"{}\", port: 80}}", canary.addr),
    ]);
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), ingresses()).unwrap();
    let gateway_port = free_port();
    let app = start_gateway(dir.path(), gateway_port).await.expect("start meshbridge");

    // The bad pattern is a config error naming the Ingress and annotation.
    let bad = config_warning(app.admin_addr, "Ingress shop/shop-canary-bad").await;
    assert_eq!(bad["reason"], "invalid_ingress", "{bad}");
    let detail = bad["detail"].as_str().unwrap();
    assert!(detail.starts_with("annotation higress.io/canary-by-header-pattern: \"(alice\""), "{detail}");

    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, gateway_port).await.expect("start envoy");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let clusters = envoy.admin("/clusters").await.unwrap_or_default();
        let ready = [&main, &canary].iter().all(|b| clusters.contains(&b.addr.to_string()));
        if ready && matches!(envoy.get_host("/app", HOST).await, Ok((200, _))) {
            break;
        }
        assert!(Instant::now() < deadline, "routes or endpoints never arrived:\n{clusters}\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let to_canary = check_canary_routing(&envoy, HOST).await;
    println!("FIGURE ingress_canary_weight canary={to_canary} main={} of 200 (want 60/140)", 200 - to_canary);
    app.stop().await;
}
