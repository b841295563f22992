//! Route policy annotations through a standalone Envoy (listeners and
//! routes over ADS), one test per group: redirects (HTTPS, permanent,
//! temporal, app-root), timeouts and retries, header control with
//! upstream-vhost, and CORS. The backend is a static registry service that
//! echoes what it was sent ([`EchoBackend`]: a `/slow` path answers after
//! 3 s, a `/flaky` path fails its first request), so Envoy is the only
//! real server; each test sends requests and checks the statuses, the
//! `Location`s, the headers each side saw, and the warnings of bad values
//! on `/v1/config`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use meshbridge::run::App;
use meshbridge::testing::pki::{Issued, TestPki};
use meshbridge_e2e::backend::EchoBackend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::traffic::{mcp_ingress, mcpbridge, start_https_gateway};
use reqwest::Method;
use reqwest::header::HeaderMap;

const HOST: &str = "shop.example.com";

/// An Ingress routing `paths` on [`HOST`] to the echo backend; `tls`
/// names its TLS Secret for [`HOST`].
fn ingress(name: &str, day: u32, annotations: &[(&str, &str)], paths: &[&str], tls: Option<&str>) -> String {
    let yaml = mcp_ingress(name, day, HOST, "echo.static:80", annotations, paths);
    match tls {
        None => yaml,
        Some(secret) => yaml.replacen(
            "  rules:\n",
            &format!("  tls:\n    - hosts: [{HOST}]\n      secretName: {secret}\n  rules:\n"),
            1,
        ),
    }
}

/// A `kubernetes.io/tls` Secret `shop/{name}` holding `cert`.
fn tls_secret(name: &str, cert: &Issued) -> String {
    let indent = |p: &std::path::Path| -> String {
        std::fs::read_to_string(p).unwrap().lines().map(|l| format!("    {l}\n")).collect()
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{ name: {name}, namespace: shop }}\ntype: kubernetes.io/tls\n\
         stringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(&cert.cert),
        indent(&cert.key)
    )
}

/// meshbridge on `ingresses`, a real Envoy taking its listeners from it,
/// and the echo backend behind both.
struct Gateway {
    app: App,
    envoy: Envoy,
    backend: EchoBackend,
    http_port: u16,
    https_port: u16,
    _dir: tempfile::TempDir,
}

impl Gateway {
    /// Start everything and wait until `ready_path` answers 200.
    async fn start(ingresses: &str, ready_path: &str) -> Gateway {
        let backend = EchoBackend::start("127.0.0.1", "echo").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let bridge = mcpbridge(&[format!("{{type: static, name: echo, domain: \"{}\", port: 80}}", backend.addr)]);
        std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
        std::fs::write(dir.path().join("shop.yaml"), ingresses).unwrap();
        let (http_port, https_port) = (free_port(), free_port());
        let app = start_https_gateway(dir.path(), http_port, https_port).await.expect("start meshbridge");
        let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, http_port).await.expect("start envoy");
        let gw = Gateway { app, envoy, backend, http_port, https_port, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = gw.send(Method::GET, ready_path, &[]).await;
            if got.as_ref().is_ok_and(|(status, _, _)| *status == 200) {
                break;
            }
            assert!(Instant::now() < deadline, "{ready_path} never served: {got:?}\n{}", gw.envoy.log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        gw
    }

    /// One request to the HTTP listener for [`HOST`], redirects not followed.
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> reqwest::Result<(u16, HeaderMap, String)> {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
        let url = format!("http://127.0.0.1:{}{path}", self.http_port);
        let mut req = client.request(method, url).header("host", HOST).timeout(Duration::from_secs(10));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await?;
        let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
        Ok((status, headers, resp.text().await?))
    }

    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> (u16, HeaderMap, String) {
        self.send(Method::GET, path, headers).await.unwrap_or_else(|e| panic!("GET {path}: {e}\n{}", self.envoy.log()))
    }

    /// The warning `/v1/config` has for Ingress `shop/{name}` about
    /// `annotation` (waiting for it): its reason and detail.
    async fn warning(&self, name: &str, annotation: &str) -> (String, String) {
        let url = format!("http://{}/v1/config", self.app.admin_addr);
        let object = format!("Ingress shop/{name}");
        let prefix = format!("annotation {annotation}: ");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let v: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
            let found = v["warnings"].as_array().and_then(|all| {
                all.iter().find(|w| {
                    w["object"] == object.as_str() && w["detail"].as_str().is_some_and(|d| d.starts_with(&prefix))
                })
            });
            if let Some(w) = found {
                return (
                    w["reason"].as_str().unwrap_or_default().into(),
                    w["detail"].as_str().unwrap_or_default().into(),
                );
            }
            assert!(Instant::now() < deadline, "no warning for {object} on {annotation}: {v:#}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_through_envoy() {
    let pki = TestPki::new("meshbridge-e2e-ca").unwrap();
    let cert = pki.server("ingress", &[HOST], &[]).unwrap();
    let ingresses = [
        ingress(
            "secure",
            1,
            &[("nginx.ingress.kubernetes.io/ssl-redirect", "true"), ("higress.io/app-root", "/shop")],
            &["/shop"],
            Some("shop-cert"),
        ),
        tls_secret("shop-cert", &cert),
        ingress("plain", 2, &[], &["/plain"], None),
        ingress(
            "moved",
            3,
            &[("nginx.ingress.kubernetes.io/permanent-redirect", "https://new.example.com/catalog")],
            &["/old"],
            None,
        ),
        ingress(
            "moved-308",
            4,
            &[
                ("higress.io/permanent-redirect", "http://other.example.com"),
                ("higress.io/permanent-redirect-code", "308"),
            ],
            &["/perm"],
            None,
        ),
        ingress(
            "sale",
            5,
            &[
                ("nginx.ingress.kubernetes.io/temporal-redirect", "https://sale.example.com/now"),
                ("nginx.ingress.kubernetes.io/permanent-redirect", "https://never.example.com/"),
            ],
            &["/sale"],
            None,
        ),
        ingress(
            "bad-code",
            6,
            &[
                ("higress.io/permanent-redirect", "https://new.example.com/x"),
                ("higress.io/permanent-redirect-code", "304"),
            ],
            &["/bad"],
            None,
        ),
    ]
    .join("---\n");
    let gw = Gateway::start(&ingresses, "/plain").await;

    // Plain HTTP to the ssl-redirect Ingress: 308 to https, path and query kept.
    let (status, headers, _) = gw.get("/shop/cart?id=7", &[]).await;
    assert_eq!((status, header(&headers, "location")), (308, Some("https://shop.example.com/shop/cart?id=7")));
    // HTTPS reaches the service: the redirect is for plain HTTP only.
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&pki.ca.cert).unwrap()).unwrap())
        .tls_built_in_root_certs(false)
        .resolve(HOST, SocketAddr::from(([127, 0, 0, 1], gw.https_port)))
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = format!("https://{HOST}:{}/shop/cart", gw.https_port);
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let last = match client.get(&url).send().await {
            Ok(r) if r.status() == 200 => break r.text().await.unwrap(),
            Ok(r) => format!("status {} {:?}", r.status(), r.headers().get("location")),
            Err(e) => format!("{e:?}"),
        };
        assert!(Instant::now() < deadline, "HTTPS never served /shop/cart: {last}\n{}", gw.envoy.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(body.starts_with("echo\nGET /shop/cart HTTP/1.1\n"), "{body}");
    // Another Ingress on the host is not redirected.
    assert_eq!(gw.get("/plain/x", &[]).await.0, 200);

    // app-root: `/` on the host, 302 to the root.
    let (status, headers, _) = gw.get("/", &[]).await;
    assert_eq!((status, header(&headers, "location")), (302, Some("http://shop.example.com/shop")));
    // permanent-redirect: 301 to the URL's scheme, host and path.
    let (status, headers, _) = gw.get("/old/page", &[]).await;
    assert_eq!((status, header(&headers, "location")), (301, Some("https://new.example.com/catalog")));
    // Its code; a URL without a path keeps the request's, as in Higress.
    let (status, headers, _) = gw.get("/perm/a", &[]).await;
    assert_eq!((status, header(&headers, "location")), (308, Some("http://other.example.com/perm/a")));
    // temporal-redirect wins over permanent-redirect, with a 302.
    let (status, headers, _) = gw.get("/sale", &[]).await;
    assert_eq!((status, header(&headers, "location")), (302, Some("https://sale.example.com/now")));
    // A code Envoy cannot send is reported, and 301 is sent.
    let (status, headers, _) = gw.get("/bad/y", &[]).await;
    assert_eq!((status, header(&headers, "location")), (301, Some("https://new.example.com/x")));
    let (reason, detail) = gw.warning("bad-code", "higress.io/permanent-redirect-code").await;
    assert_eq!(reason, "invalid_ingress", "{detail}");
    assert!(
        detail.ends_with(r#""304" is not a redirect code Envoy can send (301, 302, 303, 307 or 308); 301 used"#),
        "{detail}"
    );
    // No redirect ever reached the backend.
    for path in ["/shop/cart?id=7", "/", "/old/page", "/perm/a", "/sale", "/bad/y"] {
        assert_eq!(gw.backend.hits(path), 0, "{path}");
    }
    gw.app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_retries_through_envoy() {
    let ingresses = [
        ingress("plain", 1, &[], &["/plain"], None),
        ingress("short", 2, &[("higress.io/timeout", "1")], &["/short"], None),
        ingress(
            "retry",
            3,
            &[
                ("nginx.ingress.kubernetes.io/proxy-next-upstream", "error http_503"),
                ("nginx.ingress.kubernetes.io/proxy-next-upstream-tries", "2"),
            ],
            &["/retry"],
            None,
        ),
        ingress("no-retry", 4, &[("higress.io/proxy-next-upstream", "off")], &["/off"], None),
        ingress(
            "per-try",
            5,
            &[
                ("higress.io/proxy-next-upstream", "timeout"),
                ("higress.io/proxy-next-upstream-tries", "1"),
                ("higress.io/proxy-next-upstream-timeout", "1"),
            ],
            &["/per-try"],
            None,
        ),
        ingress(
            "bad",
            6,
            &[("higress.io/timeout", "-3"), ("higress.io/proxy-next-upstream-tries", "x")],
            &["/bad"],
            None,
        ),
    ]
    .join("---\n");
    let gw = Gateway::start(&ingresses, "/plain").await;

    // Without a timeout the slow backend's answer arrives after 3 s …
    let t = Instant::now();
    let (status, _, body) = gw.get("/plain/slow", &[]).await;
    assert_eq!((status, body.lines().next()), (200, Some("echo")));
    assert!(t.elapsed() >= Duration::from_secs(3), "{:?}", t.elapsed());
    // … with `timeout: 1` Envoy gives up after 1 s: 504.
    let t = Instant::now();
    let (status, _, _) = gw.get("/short/slow", &[]).await;
    let took = t.elapsed();
    assert_eq!(status, 504);
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(2500), "{took:?}");

    // A first 503 is retried, and the retry answers.
    assert_eq!(gw.get("/retry/flaky/1", &[]).await.0, 200);
    assert_eq!(gw.backend.hits("/retry/flaky/1"), 2);
    // Not retried without the annotation, nor with `off`.
    assert_eq!(gw.get("/plain/flaky/1", &[]).await.0, 503);
    assert_eq!(gw.backend.hits("/plain/flaky/1"), 1);
    assert_eq!(gw.get("/off/flaky/1", &[]).await.0, 503);
    assert_eq!(gw.backend.hits("/off/flaky/1"), 1);

    // Each try times out after 1 s and is retried once: two tries, then 504.
    let t = Instant::now();
    let (status, _, _) = gw.get("/per-try/slow", &[]).await;
    let took = t.elapsed();
    assert_eq!(status, 504);
    assert!(took >= Duration::from_millis(1800) && took < Duration::from_millis(2900), "{took:?}");
    assert_eq!(gw.backend.hits("/per-try/slow"), 2);

    // Bad values are reported and the Ingress routes without them.
    for annotation in ["higress.io/timeout", "higress.io/proxy-next-upstream-tries"] {
        let (reason, detail) = gw.warning("bad", annotation).await;
        assert_eq!(reason, "invalid_ingress", "{detail}");
    }
    assert_eq!(gw.get("/bad/x", &[]).await.0, 200);
    gw.app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_control_and_upstream_vhost_through_envoy() {
    let ingresses = [
        ingress("plain", 1, &[], &["/plain"], None),
        ingress(
            "headers",
            2,
            &[
                ("higress.io/request-header-control-add", "x-env staging"),
                ("higress.io/request-header-control-update", "x-user-agent meshbridge"),
                ("higress.io/request-header-control-remove", "x-debug"),
                ("higress.io/response-header-control-update", "x-served-by gateway"),
                ("higress.io/response-header-control-remove", "x-powered-by"),
                ("nginx.ingress.kubernetes.io/upstream-vhost", "web.internal"),
                // A line without a value is reported; the others apply.
                ("higress.io/response-header-control-add", "x-added yes\nbroken"),
            ],
            &["/h"],
            None,
        ),
    ]
    .join("---\n");
    let gw = Gateway::start(&ingresses, "/plain").await;
    let sent = [("x-debug", "1"), ("x-user-agent", "curl"), ("x-env", "dev")];

    let (status, headers, body) = gw.get("/h/x", &sent).await;
    assert_eq!(status, 200);
    let got: Vec<&str> = body.lines().collect();
    assert!(got.contains(&"x-env: dev") && got.contains(&"x-env: staging"), "added, not replaced: {body}");
    assert!(got.contains(&"x-user-agent: meshbridge") && !got.contains(&"x-user-agent: curl"), "{body}");
    assert!(!body.contains("x-debug"), "{body}");
    assert!(got.contains(&"host: web.internal"), "{body}");
    assert_eq!(header(&headers, "x-served-by"), Some("gateway"));
    assert_eq!(header(&headers, "x-added"), Some("yes"));
    assert_eq!(header(&headers, "x-powered-by"), None);
    assert_eq!(header(&headers, "x-backend"), Some("echo"));

    // The other Ingress's route changes nothing.
    let (_, headers, body) = gw.get("/plain/x", &sent).await;
    let got: Vec<&str> = body.lines().collect();
    assert!(got.contains(&"x-debug: 1") && got.contains(&"x-user-agent: curl"), "{body}");
    assert!(got.contains(&format!("host: {HOST}").as_str()), "{body}");
    assert_eq!(header(&headers, "x-powered-by"), Some("echo"));

    let (reason, detail) = gw.warning("headers", "higress.io/response-header-control-add").await;
    assert_eq!(reason, "invalid_ingress", "{detail}");
    assert_eq!(
        detail,
        r#"annotation higress.io/response-header-control-add: line 2: "broken" is not a header name and a value; line left out"#
    );
    gw.app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_through_envoy() {
    let ingresses = [
        ingress("plain", 1, &[], &["/plain"], None),
        ingress(
            "cors",
            2,
            &[
                ("nginx.ingress.kubernetes.io/enable-cors", "true"),
                ("nginx.ingress.kubernetes.io/cors-allow-origin", "https://app.example.com, https://*.example.org"),
                ("nginx.ingress.kubernetes.io/cors-allow-methods", "GET, POST"),
                ("nginx.ingress.kubernetes.io/cors-allow-headers", "x-token"),
                ("nginx.ingress.kubernetes.io/cors-expose-headers", "x-request-id"),
                ("nginx.ingress.kubernetes.io/cors-max-age", "60"),
            ],
            &["/c"],
            None,
        ),
        ingress(
            "cors-default",
            3,
            &[("higress.io/enable-cors", "true"), ("higress.io/cors-allow-credentials", "sometimes")],
            &["/d"],
            None,
        ),
    ]
    .join("---\n");
    let gw = Gateway::start(&ingresses, "/plain").await;
    let preflight = |origin: &'static str| {
        [("origin", origin), ("access-control-request-method", "POST"), ("access-control-request-headers", "x-token")]
    };

    // A preflight from an allowed origin is answered by Envoy.
    let (status, h, _) = gw.send(Method::OPTIONS, "/c/api", &preflight("https://app.example.com")).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(header(&h, "access-control-allow-origin"), Some("https://app.example.com"));
    assert_eq!(header(&h, "access-control-allow-methods"), Some("GET,POST"));
    assert_eq!(header(&h, "access-control-allow-headers"), Some("x-token"));
    assert_eq!(header(&h, "access-control-max-age"), Some("60"));
    assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    assert_eq!(gw.backend.hits("/c/api"), 0, "the preflight reached the backend");
    // A subdomain of the wildcard origin, with its scheme.
    let (_, h, _) = gw.send(Method::OPTIONS, "/c/api", &preflight("https://a.b.example.org")).await.unwrap();
    assert_eq!(header(&h, "access-control-allow-origin"), Some("https://a.b.example.org"));
    // Other origins get no CORS headers (the preflight goes on upstream).
    for origin in ["https://evil.example.com", "http://a.example.org", "https://example.org"] {
        let (_, h, _) = gw.send(Method::OPTIONS, "/c/api", &preflight(origin)).await.unwrap();
        assert_eq!(header(&h, "access-control-allow-origin"), None, "{origin}");
    }
    // A simple request from an allowed origin: the backend answers, Envoy
    // adds the CORS headers.
    let (status, h, body) = gw.get("/c/api", &[("origin", "https://app.example.com")]).await;
    assert_eq!((status, body.lines().next()), (200, Some("echo")));
    assert_eq!(header(&h, "access-control-allow-origin"), Some("https://app.example.com"));
    assert_eq!(header(&h, "access-control-expose-headers"), Some("x-request-id"));
    // No CORS on a route without it.
    let (_, h, _) = gw.get("/plain/api", &[("origin", "https://app.example.com")]).await;
    assert_eq!(header(&h, "access-control-allow-origin"), None);

    // Higress's defaults: any origin, its methods, credentials (the bad
    // boolean is reported and the default kept).
    let (status, h, _) = gw.send(Method::OPTIONS, "/d", &preflight("https://anyone.example.net")).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(header(&h, "access-control-allow-origin"), Some("https://anyone.example.net"));
    assert_eq!(header(&h, "access-control-allow-methods"), Some("GET,PUT,POST,DELETE,PATCH,OPTIONS"));
    assert_eq!(header(&h, "access-control-max-age"), Some("1728000"));
    assert_eq!(header(&h, "access-control-allow-credentials"), Some("true"));
    let (reason, detail) = gw.warning("cors-default", "higress.io/cors-allow-credentials").await;
    assert_eq!(reason, "invalid_ingress", "{detail}");
    assert_eq!(detail, r#"annotation higress.io/cors-allow-credentials: "sometimes" is not a boolean; true used"#);
    gw.app.stop().await;
}
