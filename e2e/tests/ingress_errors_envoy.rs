//! `default-backend` and `custom-http-errors` through a standalone Envoy
//! (listeners, routes and clusters over ADS), as Higress and ingress-nginx
//! serve them, from stock Envoy's `custom_response` filter and aggregate
//! clusters.
//!
//! - An answer with a listed code is replaced by the default backend's
//!   answer to `GET /` (the original code kept), which gets ingress-nginx's
//!   `X-Code`, `X-Namespace`, `X-Ingress-Name`, `X-Service-Name` and
//!   `X-Service-Port`; a code not listed passes through, and so does every
//!   answer of a route without the annotations.
//! - A service with no endpoint left (its last Consul check failing) is
//!   answered by the default backend, and by its own instance again once
//!   the check passes; a route to a service the gateway has no cluster for
//!   goes to the default backend.
//!
//! Backends are static registry services echoing their name and the
//! request ([`EchoBackend`]); the service that loses its endpoint is in a
//! REAL Consul. Needs `source e2e/env.sh consul envoy`.

use std::time::{Duration, Instant};

use meshbridge::run::App;
use meshbridge_e2e::backend::EchoBackend;
use meshbridge_e2e::consul::{CheckStatus, Consul};
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::traffic::{mcp_ingress, mcpbridge, start_gateway, static_registry};
use serde_json::json;

const HOST: &str = "shop.example.com";

/// The warning on `/v1/config` whose object contains `object` and whose
/// detail contains `detail`, once there is one (an early translation, before
/// every registry has answered, may say other things).
async fn warning(admin: std::net::SocketAddr, object: &str, detail: &str) -> serde_json::Value {
    let url = format!("http://{admin}/v1/config");
    let deadline = Instant::now() + Duration::from_secs(15);
    let has = |w: &&serde_json::Value, field: &str, part: &str| w[field].as_str().is_some_and(|v| v.contains(part));
    loop {
        let v: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
        let found = v["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|w| has(w, "object", object) && has(w, "detail", detail));
        if let Some(w) = found {
            return w.clone();
        }
        assert!(Instant::now() < deadline, "no warning for {object} saying {detail:?}: {v:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// meshbridge on an McpBridge of `registries` and the Ingresses
/// `ingresses`, for a gateway Envoy on the port returned (the directory
/// lives as long as it is held).
async fn start(registries: &[String], ingresses: &[String]) -> (tempfile::TempDir, App, u16) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mcpbridge.yaml"), mcpbridge(registries)).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), ingresses.join("---\n")).unwrap();
    let port = free_port();
    let app = start_gateway(dir.path(), port).await.expect("start meshbridge");
    (dir, app, port)
}

/// Wait until `path` answers `status` with a body from `backend`.
async fn wait_for(envoy: &Envoy, path: &str, status: u16, backend: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((s, body)) = envoy.get_host(path, HOST).await
            && s == status
            && body.lines().next() == Some(backend)
        {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {path} never answered {status} from {backend}:\n{}", envoy.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The echoed request head: the request line, then `name: value` lines.
fn echoed(body: &str) -> (String, Vec<(String, String)>) {
    let mut lines = body.lines().skip(1);
    let request_line = lines.next().unwrap_or_default().to_owned();
    let headers = lines.filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    (request_line, headers)
}

/// `custom-http-errors: 404,503` with a default backend (ingress-nginx's
/// keys): the upstream's 503 and 404 come back with the default backend's
/// body and ingress-nginx's headers, its 500 passes through, and so does
/// every answer of a route without the annotations. Bad values are reported
/// on `/v1/config` naming the Ingress and the annotation, and the Ingress
/// still routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listed_codes_are_answered_by_the_default_backend_through_envoy() {
    let main = EchoBackend::start("127.0.0.1", "main").await.unwrap();
    let errors = EchoBackend::start("127.0.0.1", "errors").await.unwrap();
    let ingress = |name, day, annotations, path| mcp_ingress(name, day, HOST, "main.static:80", annotations, &[path]);
    let listed = [
        ("nginx.ingress.kubernetes.io/default-backend", "errors.static:80"),
        ("nginx.ingress.kubernetes.io/custom-http-errors", "404,503"),
    ];
    let bad = [("higress.io/default-backend", "errors.static:80"), ("higress.io/custom-http-errors", "503,5xx")];
    let (_dir, app, port) = start(
        &[static_registry("main", main.addr), static_registry("errors", errors.addr)],
        &[ingress("errs", 1, &listed, "/app"), ingress("plain", 2, &[], "/plain"), ingress("bad", 3, &bad, "/bad")],
    )
    .await;

    let said = warning(app.admin_addr, "Ingress shop/errs", "custom-http-errors are served by the standalone").await;
    assert_eq!(said["reason"], "standalone_only", "{said}");
    let said = warning(app.admin_addr, "Ingress shop/bad", "custom-http-errors:").await;
    assert_eq!(said["detail"], "annotation higress.io/custom-http-errors: \"5xx\" is not a status code; left out");
    assert_eq!(said["reason"], "invalid_ingress", "{said}");

    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, port).await.expect("start envoy");
    wait_for(&envoy, "/app/ok", 200, "main", "routes").await;

    for code in [503, 404] {
        let (status, body) = envoy.get_host(&format!("/app/status/{code}?q=1"), HOST).await.unwrap();
        assert_eq!((status, body.lines().next()), (code, Some("errors")), "{body}");
        let (request_line, headers) = echoed(&body);
        assert_eq!(request_line, "GET /?q=1 HTTP/1.1", "the default backend is asked for /");
        let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let code = code.to_string();
        assert_eq!(
            ["host", "x-code", "x-namespace", "x-ingress-name", "x-service-name", "x-service-port"].map(header),
            [Some(HOST), Some(code.as_str()), Some("shop"), Some("errs"), Some("main.static"), Some("80")],
            "{body}"
        );
    }
    // Not listed: the upstream's own answer.
    let (status, body) = envoy.get_host("/app/status/500", HOST).await.unwrap();
    assert_eq!((status, body.lines().next()), (500, Some("main")), "{body}");
    // No annotations: nothing replaced.
    let (status, body) = envoy.get_host("/plain/status/503", HOST).await.unwrap();
    assert_eq!((status, body.lines().next()), (503, Some("main")), "{body}");
    // The valid code of the Ingress with a bad one.
    let (status, body) = envoy.get_host("/bad/status/503", HOST).await.unwrap();
    assert_eq!((status, body.lines().next()), (503, Some("errors")), "{body}");

    assert_eq!(
        ["/app/status/503?q=1", "/app/status/404?q=1", "/app/status/500", "/plain/status/503"].map(|p| main.hits(p)),
        [1, 1, 1, 1],
        "each request reached its upstream once"
    );
    assert_eq!(errors.hits("/?q=1"), 2, "the default backend got the two listed answers' requests");
    app.stop().await;
}

/// `default-backend` alone: while the Consul service has a passing
/// instance it answers; once its last check fails the default backend
/// does (the route still names the same aggregate cluster), and the
/// instance again once the check passes. A route to a service the gateway
/// has no cluster for goes to the default backend too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_backend_answers_while_the_service_has_no_endpoint_through_envoy() {
    let consul = Consul::start().await.expect("start consul");
    let web = EchoBackend::start("127.0.0.1", "web").await.unwrap();
    let errors = EchoBackend::start("127.0.0.1", "errors").await.unwrap();
    consul
        .register(json!({
            "ID": "web-1",
            "Name": "web",
            "Address": "127.0.0.1",
            "Port": web.addr.port(),
            "Check": { "CheckID": "web-1-ttl", "TTL": "300s", "Status": "passing" },
        }))
        .await
        .unwrap();
    let consul_entry = format!(
        "{{type: consul, name: local, domain: 127.0.0.1, port: {}, consulDatacenter: dc1, vport: {{default: 8080}}}}",
        consul.http_port
    );
    let fallback = [("higress.io/default-backend", "errors.static")];
    let (_dir, app, port) = start(
        &[consul_entry, static_registry("errors", errors.addr)],
        &[
            mcp_ingress("web", 1, HOST, "web.dc1.consul:8080", &fallback, &["/web"]),
            mcp_ingress("gone", 2, HOST, "gone.static:80", &fallback, &["/gone"]),
        ],
    )
    .await;
    let said = warning(app.admin_addr, "(shop-gone-0)", "the default backend answers").await;
    assert_eq!(said["reason"], "no_cluster", "{said}");
    let want = "host gone.static has no cluster in the standalone gateway (not a registry service); the default \
                backend answers";
    assert_eq!(said["detail"], want);

    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, port).await.expect("start envoy");
    wait_for(&envoy, "/web", 200, "web", "routes").await;
    wait_for(&envoy, "/gone", 200, "errors", "no cluster").await;

    consul.set_ttl_check("web-1-ttl", CheckStatus::Fail).await.unwrap();
    wait_for(&envoy, "/web", 200, "errors", "last instance failing").await;
    let (_, body) = envoy.get_host("/web/page", HOST).await.unwrap();
    assert_eq!(echoed(&body).0, "GET /web/page HTTP/1.1", "the request as it was: {body}");

    consul.set_ttl_check("web-1-ttl", CheckStatus::Pass).await.unwrap();
    wait_for(&envoy, "/web", 200, "web", "instance passing again").await;
    app.stop().await;
}
