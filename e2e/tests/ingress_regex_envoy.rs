//! Regex paths through a gateway Envoy: `rewrite-target` with `$n`
//! captures, `use-regex` (with `ignore-path-case`) and
//! `higress.io/full-path-regex`, beside a plain `/` route and the plain
//! rewrites (`rewrite-target` on a path with no regex, `rewrite-path`). Each backend is
//! an echo server of a static registry that answers with its name and the
//! request line it got, so the test sees both where a request went and the
//! path it arrived with. The same requests run on the standalone gateway
//! and through a REAL istiod (both builds).

use std::time::{Duration, Instant};

use meshbridge_e2e::backend::EchoBackend;
use meshbridge_e2e::envoy::Envoy;
use meshbridge_e2e::gateway::{Gateway, Via};
use meshbridge_e2e::istiod::Version;
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{mcp_ingress, mcpbridge, static_registry};

const HOST: &str = "re.example.com";

/// `backend path` for a GET of `path`: the backend that answered and the
/// path (with query) it was sent, or the status, or why there was no answer.
async fn sent(envoy: &Envoy, path: &str) -> String {
    match envoy.get_host(path, HOST).await {
        Ok((200, body)) => {
            let mut lines = body.lines();
            let name = lines.next().unwrap_or_default();
            let target = lines.next().unwrap_or_default().split(' ').nth(1).unwrap_or_default();
            format!("{name} {target}")
        }
        Ok((status, _)) => format!("status {status}"),
        Err(e) => format!("no answer: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_paths_route_and_rewrite_on_the_standalone_gateway() {
    regex_paths(Via::Standalone).await;
}

// Once per istiod build. Needs `source e2e/env.sh envoy kubetools
// kube-apiserver istiod istiod-1.27`.
istiod_tests!(regex_paths_route_and_rewrite_through_istiod);

async fn regex_paths_route_and_rewrite_through_istiod(version: Version) {
    regex_paths(Via::Istiod(version)).await;
}

async fn regex_paths(via: Via) {
    let names = ["api", "items", "cdn", "web"];
    let mut backends = Vec::new();
    for name in names {
        backends.push(EchoBackend::start("127.0.0.1", name).await.unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let registries: Vec<String> = names.iter().zip(&backends).map(|(name, b)| static_registry(name, b.addr)).collect();
    std::fs::write(dir.path().join("mcpbridge.yaml"), mcpbridge(&registries)).unwrap();
    let ingress = |name: &str, day, to: &str, annotations: &[(&str, &str)], path: &str| {
        mcp_ingress(name, day, HOST, &format!("{to}.static:80"), annotations, &[path])
    };
    let yaml = [
        ingress("captures", 1, "api", &[("nginx.ingress.kubernetes.io/rewrite-target", "/$2")], "/something(/|$)(.*)"),
        ingress(
            "regex",
            2,
            "items",
            &[("higress.io/use-regex", "true"), ("higress.io/ignore-path-case", "true")],
            "/v[0-9]+/items",
        ),
        ingress("full", 3, "cdn", &[("higress.io/full-path-regex", "true")], r"/img/[a-z]+\.png"),
        ingress("fallback", 4, "web", &[], "/"),
        // Beside them, the plain rewrites: no regex path.
        ingress("moved", 5, "api", &[("higress.io/rewrite-target", "/v2")], "/v1"),
        ingress("renamed", 6, "api", &[("higress.io/rewrite-path", "/new")], "/old"),
    ]
    .join("---\n");
    std::fs::write(dir.path().join("re.yaml"), yaml).unwrap();
    let gw = Gateway::start(dir.path(), via).await.expect("start meshbridge and the gateway");
    let envoy = &gw.envoy;

    let deadline = Instant::now() + Duration::from_secs(30);
    while sent(envoy, "/something/new").await != "api /new" {
        if Instant::now() > deadline {
            let listeners = envoy.admin("/listeners").await.unwrap_or_default();
            panic!(
                "routes never arrived ({via:?}); last: {}; listeners: {listeners}\n{}\n{}",
                sent(envoy, "/something/new").await,
                envoy.log(),
                gw.istiod_log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cases = [
        // The captures fill the target; the query stays.
        ("/something/new", "api /new"),
        ("/something", "api /"),
        ("/something/a/b?x=1", "api /a/b?x=1"),
        // `(/|$)` needs a `/` or the end after the prefix.
        ("/somethingelse", "web /somethingelse"),
        // use-regex: the start of the path, any case; no rewrite.
        ("/v2/items/7", "items /v2/items/7"),
        ("/V10/ITEMS", "items /V10/ITEMS"),
        ("/vx/items", "web /vx/items"),
        // full-path-regex: all of the path, case as written.
        ("/img/logo.png", "cdn /img/logo.png"),
        ("/img/logo.png/x", "web /img/logo.png/x"),
        ("/img/Logo.png", "web /img/Logo.png"),
        // rewrite-target on a plain path: the path's prefix replaced.
        ("/v1/x?y=1", "api /v2/x?y=1"),
        ("/v1", "api /v2"),
        ("/v10", "web /v10"),
        // rewrite-path: the matched prefix, `/old/` or all of `/old`.
        ("/old/x", "api /new/x"),
        ("/old", "api /new/"),
    ];
    for (path, want) in cases {
        assert_eq!(sent(envoy, path).await, want, "GET {path} ({via:?})");
    }
    gw.app.stop().await;
}
