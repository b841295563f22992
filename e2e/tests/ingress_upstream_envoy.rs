//! The upstream annotation group through a standalone Envoy (listeners,
//! routes and clusters over ADS from meshbridge), and through a stock Envoy
//! fed only by a REAL istiod (`e2e/tests/istiod.rs` has the setup) from the
//! DestinationRules meshbridge sends it: each Ingress routes one path to a
//! static registry service of two backends that answer with their own
//! names. The same requests and checks run on both.
//!
//! - `affinity: cookie`: Envoy sets the cookie, and requests carrying it
//!   stay on one backend; requests without it spread.
//! - `upstream-hash-by: $http_x_user`: one user's requests stay on one
//!   backend; users spread.
//! - `load-balance: least_conn`: the cluster's balancer, as Envoy has it.
//! - `backend-protocol: HTTP2`: Envoy opens HTTP/2 (prior knowledge) to the
//!   backend, seen by a backend that records the connection preface.
//! - a bad value is a warning naming the Ingress and the annotation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::Envoy;
use meshbridge_e2e::gateway::{Gateway, Via};
use meshbridge_e2e::istiod::Version;
use meshbridge_e2e::istiod_tests;
use meshbridge_e2e::traffic::{config_warning, mcp_ingress, mcpbridge};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

const HOST: &str = "shop.example.com";
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn ingress(name: &str, day: u32, destination: &str, path: &str, annotations: &[(&str, &str)]) -> String {
    mcp_ingress(name, day, HOST, destination, annotations, &[path])
}

/// A backend that counts connections opening with the HTTP/2 preface, then
/// closes them (it answers nothing).
async fn h2_probe() -> (std::net::SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 24];
                if sock.read_exact(&mut buf).await.is_ok() && buf == H2_PREFACE {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, seen, task)
}

struct Answer {
    status: u16,
    body: String,
    set_cookie: Option<String>,
}

async fn get(envoy: &Envoy, path: &str, headers: &[(&str, &str)]) -> Answer {
    let url = format!("http://127.0.0.1:{}{path}", envoy.listen_port);
    let mut req = reqwest::Client::new().get(url).header("host", HOST).timeout(Duration::from_secs(5));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("a response from Envoy");
    let status = resp.status().as_u16();
    let set_cookie = resp.headers().get("set-cookie").and_then(|v| v.to_str().ok()).map(str::to_owned);
    Answer { status, body: resp.text().await.unwrap_or_default(), set_cookie }
}

/// The backends `n` requests reached, counted.
async fn spread(envoy: &Envoy, path: &str, headers: &[(&str, &str)], n: usize) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let a = get(envoy, path, headers).await;
        let key = if a.status == 200 { a.body } else { format!("status {}", a.status) };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_annotations_steer_envoy() {
    upstream_annotations(Via::Standalone).await;
}

// Once per istiod build. Needs `source e2e/env.sh envoy kubetools
// kube-apiserver istiod istiod-1.27`.
istiod_tests!(upstream_annotations_steer_envoy_through_istiod);

async fn upstream_annotations_steer_envoy_through_istiod(version: Version) {
    upstream_annotations(Via::Istiod(version)).await;
}

async fn upstream_annotations(via: Via) {
    let (a, b) = (Backend::start("127.0.0.1", "a").await.unwrap(), Backend::start("127.0.0.1", "b").await.unwrap());
    let (probe, h2_seen, probe_task) = h2_probe().await;
    let dir = tempfile::tempdir().unwrap();
    let pair = format!("{},{}", a.addr, b.addr);
    let bridge = mcpbridge(&[
        format!("{{type: static, name: sticky, domain: \"{pair}\", port: 80}}"),
        format!("{{type: static, name: hashed, domain: \"{pair}\", port: 80}}"),
        format!("{{type: static, name: least, domain: \"{pair}\", port: 80}}"),
        format!("{{type: static, name: plain, domain: \"{pair}\", port: 80}}"),
        format!("{{type: static, name: h2, domain: \"{probe}\", port: 80}}"),
    ]);
    let nginx = |k: &str| format!("nginx.ingress.kubernetes.io/{k}");
    let yaml = [
        ingress(
            "sticky",
            1,
            "sticky.static:80",
            "/sticky",
            &[
                (&nginx("affinity"), "cookie"),
                (&nginx("session-cookie-name"), "route"),
                (&nginx("session-cookie-max-age"), "600"),
            ],
        ),
        ingress("hashed", 2, "hashed.static:80", "/hashed", &[("higress.io/upstream-hash-by", "$http_x_user")]),
        ingress("least", 3, "least.static:80", "/least", &[(&nginx("load-balance"), "least_conn")]),
        ingress("plain", 4, "plain.static:80", "/plain", &[(&nginx("load-balance"), "ewma")]),
        ingress("h2", 5, "h2.static:80", "/h2", &[(&nginx("backend-protocol"), "HTTP2")]),
    ]
    .join("---\n");
    std::fs::write(dir.path().join("mcpbridge.yaml"), bridge).unwrap();
    std::fs::write(dir.path().join("shop.yaml"), yaml).unwrap();
    let gw = Gateway::start(dir.path(), via).await.expect("start meshbridge and the gateway");
    let (app, envoy) = (&gw.app, &gw.envoy);

    // `ewma` is reported, naming the Ingress and the annotation.
    let bad = config_warning(app.admin_addr, "Ingress shop/plain").await;
    assert_eq!(bad["reason"], "invalid_ingress", "{bad}");
    let detail = bad["detail"].as_str().unwrap();
    assert!(detail.starts_with("annotation nginx.ingress.kubernetes.io/load-balance: \"ewma\""), "{detail}");

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Until the listener is up a request may be refused: not yet an answer.
        let answers = |path| async move { envoy.get_host(path, HOST).await.is_ok_and(|(status, _)| status == 200) };
        let ready = answers("/plain").await && answers("/sticky").await;
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "routes or endpoints never arrived:\n{}\n{}", envoy.log(), gw.istiod_log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Cookie affinity: Envoy generates the cookie with its attributes, and
    // 20 requests carrying it land on one backend.
    let first = get(envoy, "/sticky", &[]).await;
    let set_cookie = first.set_cookie.expect("Envoy sets the affinity cookie");
    assert!(set_cookie.starts_with("route="), "{set_cookie}");
    assert!(set_cookie.contains("Max-Age=600") && set_cookie.contains("Path=/"), "{set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    let sticky = spread(envoy, "/sticky/x", &[("cookie", &cookie)], 20).await;
    assert_eq!(sticky.len(), 1, "one backend for one cookie: {sticky:?}");
    assert!(sticky.contains_key(&first.body), "the cookie's backend is the first answer's: {sticky:?} {}", first.body);
    // Without a cookie each request gets a new one, so requests spread: 40
    // all on one of two backends has a probability of 2^-39.
    let fresh = spread(envoy, "/sticky", &[], 40).await;
    assert_eq!(fresh.keys().cloned().collect::<BTreeSet<_>>(), BTreeSet::from(["a".into(), "b".into()]), "{fresh:?}");

    // Hash by a header: each user stays on one backend, and users spread.
    let mut chosen = BTreeSet::new();
    for user in 0..16 {
        let user = format!("user-{user}");
        let seen = spread(envoy, "/hashed", &[("x-user", &user)], 8).await;
        assert_eq!(seen.len(), 1, "{user} moved between backends: {seen:?}");
        chosen.extend(seen.into_keys());
    }
    assert_eq!(chosen, BTreeSet::from(["a".into(), "b".into()]), "16 users all hashed to one backend");

    // The balancers as Envoy has them, from its own config.
    let dump = envoy.admin("/config_dump?resource=dynamic_active_clusters").await.unwrap();
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let policies: BTreeMap<String, String> = dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let c = &c["cluster"];
            (c["name"].as_str().unwrap().to_owned(), c["lb_policy"].as_str().unwrap_or("ROUND_ROBIN").to_owned())
        })
        .collect();
    // The standalone gateway routes to a policy subset cluster; istiod sets
    // the DestinationRule's policy on the service's own cluster.
    let cluster = |service: &str| match via {
        Via::Standalone => format!("outbound|80|_policy|{service}"),
        Via::Istiod(_) => format!("outbound|80||{service}"),
    };
    let policy = |service: &str| policies.get(&cluster(service)).map(String::as_str);
    assert_eq!(policy("least.static"), Some("LEAST_REQUEST"), "{policies:#?}");
    assert_eq!(policy("sticky.static"), Some("RING_HASH"), "{policies:#?}");
    // A bad balancer makes no policy: no policy cluster on the standalone
    // gateway, Istio's default balancer (least request) through istiod.
    let default = match via {
        Via::Standalone => None,
        Via::Istiod(_) => Some("LEAST_REQUEST"),
    };
    assert_eq!(policy("plain.static"), default, "{policies:#?}");
    assert_eq!(spread(envoy, "/least", &[], 20).await.values().sum::<u32>(), 20);

    // HTTP/2 to the backend: it sees the preface (and answers nothing, so
    // the request fails).
    let before = h2_seen.load(Ordering::SeqCst);
    let answer = get(envoy, "/h2", &[]).await;
    assert_ne!(answer.status, 200, "the probe answers nothing");
    assert!(h2_seen.load(Ordering::SeqCst) > before, "Envoy did not speak HTTP/2 to the backend");

    probe_task.abort();
    gw.app.stop().await;
}
