//! Higress's request conditions (`match-method`, `exact-`/`prefix-`/
//! `regex-match-header-*`, `*-match-query-*`) through a gateway Envoy: on
//! one host and path `/`, an Ingress per model header value (as Higress's
//! AI routing writes them), one that also needs POST and a query
//! parameter, and one with no conditions. Each backend is a static
//! registry service answering with its name; the same requests run on the
//! standalone gateway and through a REAL istiod (both builds).

use std::time::{Duration, Instant};

use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::Envoy;
use meshbridge_e2e::gateway::{Gateway, Via};
use meshbridge_e2e::istiod::Version;
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{mcp_ingress, mcpbridge, static_registry};
use reqwest::Method;

const HOST: &str = "ai.example.com";

/// Which backend answers `method path` with `headers`, or the status, or
/// why there was no answer.
async fn who(envoy: &Envoy, method: Method, path: &str, headers: &[(&str, &str)]) -> String {
    let url = format!("http://127.0.0.1:{}{path}", envoy.listen_port);
    let mut req = reqwest::Client::new().request(method, url).header("host", HOST).timeout(Duration::from_secs(5));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    // Refused until the listener arrives (through istiod, LDS comes after
    // the Envoy starts): the first wait below polls through it.
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => return format!("no answer: {e}"),
    };
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    if status == 200 { body } else { format!("status {status}") }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_conditions_route_on_the_standalone_gateway() {
    conditions(Via::Standalone).await;
}

// Once per istiod build. Needs `source e2e/env.sh envoy kubetools
// kube-apiserver istiod istiod-1.27`.
istiod_tests!(request_conditions_route_through_istiod);

async fn request_conditions_route_through_istiod(version: Version) {
    conditions(Via::Istiod(version)).await;
}

async fn conditions(via: Via) {
    let names = ["model-a", "model-b", "fallback"];
    let mut backends = Vec::new();
    for name in names {
        backends.push(Backend::start("127.0.0.1", name).await.unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let registries: Vec<String> = names.iter().zip(&backends).map(|(name, b)| static_registry(name, b.addr)).collect();
    std::fs::write(dir.path().join("mcpbridge.yaml"), mcpbridge(&registries)).unwrap();
    let ingress = |name: &str, day, annotations: &[(&str, &str)]| {
        mcp_ingress(name, day, HOST, &format!("{name}.static:80"), annotations, &["/"])
    };
    let yaml = [
        ingress("fallback", 1, &[]),
        ingress("model-a", 2, &[("higress.io/exact-match-header-x-higress-llm-model", "qwen")]),
        ingress(
            "model-b",
            3,
            &[
                ("higress.io/prefix-match-header-x-higress-llm-model", "deepseek-"),
                ("higress.io/match-method", "POST"),
                ("higress.io/regex-match-query-api", "v[12]"),
            ],
        ),
    ]
    .join("---\n");
    std::fs::write(dir.path().join("ai.yaml"), yaml).unwrap();
    let gw = Gateway::start(dir.path(), via).await.expect("start meshbridge and the gateway");
    let envoy = &gw.envoy;

    let model = |m| [("x-higress-llm-model", m)];
    let deadline = Instant::now() + Duration::from_secs(30);
    while who(envoy, Method::GET, "/", &model("qwen")).await != "model-a" {
        if Instant::now() > deadline {
            let listeners = envoy.admin("/listeners").await.unwrap_or_default();
            panic!("routes never arrived ({via:?}); listeners: {listeners}\n{}\n{}", envoy.log(), gw.istiod_log());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cases: [(Method, &str, Option<&str>, &str); 9] = [
        (Method::GET, "/chat", Some("qwen"), "model-a"),
        // Header values match exactly, and case matters.
        (Method::GET, "/chat", Some("Qwen"), "fallback"),
        (Method::GET, "/chat", None, "fallback"),
        // model-b needs all three: the prefix, POST and the query.
        (Method::POST, "/chat?api=v1", Some("deepseek-r1"), "model-b"),
        (Method::POST, "/chat?api=v2&x=1", Some("deepseek-v3"), "model-b"),
        (Method::GET, "/chat?api=v1", Some("deepseek-r1"), "fallback"),
        (Method::POST, "/chat?api=v3", Some("deepseek-r1"), "fallback"),
        (Method::POST, "/chat", Some("deepseek-r1"), "fallback"),
        (Method::POST, "/chat?api=v1", Some("qwen"), "model-a"),
    ];
    for (method, path, header, want) in cases {
        let headers: Vec<(&str, &str)> = header.map(|h| ("x-higress-llm-model", h)).into_iter().collect();
        let got = who(envoy, method.clone(), path, &headers).await;
        assert_eq!(got, want, "{via:?}: {method} {path} with model {header:?}");
    }
    gw.app.stop().await;
}
