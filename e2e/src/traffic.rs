//! meshbridge in-process in front of a real Envoy, and what Envoy then
//! does: the traffic it serves and when it ACKs an EDS update.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use meshbridge::run::{AdminArgs, App, GatewayArgs, RunArgs, RunCommand};
use meshbridge::translate::envoy::ENDPOINT_TYPE;

use crate::envoy::Envoy;

/// Write `bridge` (an McpBridge) into `dir` and start meshbridge on it,
/// in-process, with xDS and admin on free loopback ports.
pub async fn start_meshbridge(dir: &Path, bridge: &str) -> anyhow::Result<App> {
    std::fs::write(dir.join("mcpbridge.yaml"), bridge)?;
    App::start(RunArgs::loopback(dir)).await
}

/// The McpBridge `default` in `higress-system` with `registries`, each a
/// YAML flow mapping (`{type: eureka, name: e, ...}`).
pub fn mcpbridge(registries: &[String]) -> String {
    let mut yaml = String::from(
        "apiVersion: networking.higress.io/v1\nkind: McpBridge\n\
         metadata: { name: default, namespace: higress-system }\nspec:\n  registries:\n",
    );
    for r in registries {
        yaml.push_str("    - ");
        yaml.push_str(r);
        yaml.push('\n');
    }
    yaml
}

/// meshbridge on `dir` (already written) as the config source of a
/// standalone Envoy gateway listening on `gateway_port`.
pub async fn start_gateway(dir: &Path, gateway_port: u16) -> anyhow::Result<App> {
    start_https_gateway(dir, gateway_port, GatewayArgs::default().gateway_https_port).await
}

/// [`start_gateway`], with the gateway's HTTPS listener on `https_port`.
pub async fn start_https_gateway(dir: &Path, http_port: u16, https_port: u16) -> anyhow::Result<App> {
    App::launch(RunCommand {
        args: RunArgs::loopback(dir),
        admin: AdminArgs::default(),
        gateway: GatewayArgs {
            gateway_http_port: vec![http_port],
            gateway_https_port: https_port,
            ..GatewayArgs::default()
        },
        lifecycle: Default::default(),
        xds: Default::default(),
        kube: Default::default(),
    })
    .await
}

/// Send `n` requests through Envoy and collect the statuses and bodies.
pub async fn sample(envoy: &Envoy, n: usize) -> (BTreeSet<u16>, BTreeSet<String>) {
    let mut statuses = BTreeSet::new();
    let mut bodies = BTreeSet::new();
    for _ in 0..n {
        match envoy.get("/").await {
            Ok((status, body)) => {
                statuses.insert(status);
                if status == 200 {
                    bodies.insert(body);
                }
            }
            Err(_) => {
                statuses.insert(0);
            }
        }
    }
    (statuses, bodies)
}

/// Poll until 20 requests in a row give exactly `want` (bodies of 200s, or
/// the single status when `want_status` is not 200).
pub async fn wait_for_traffic(envoy: &Envoy, want_status: u16, want: &[&str], what: &str) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (statuses, bodies) = sample(envoy, 20).await;
        if statuses == BTreeSet::from([want_status]) && bodies == want {
            return;
        }
        if Instant::now() > deadline {
            panic!("{what}: got statuses {statuses:?} bodies {bodies:?}, want {want_status} {want:?}\n{}", envoy.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Poll until Envoy's endpoints for `cluster` are exactly `want`
/// (`ip:port`s), for 20 s.
pub async fn wait_for_members(envoy: &Envoy, cluster: &str, want: &[&str], what: &str) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = envoy.members(cluster).await;
        if got == want {
            return;
        }
        if Instant::now() > deadline {
            let clusters = envoy.admin("/clusters").await.unwrap_or_default();
            panic!("{what}: members {got:?}, want {want:?}\n/clusters:\n{clusters}\n{}", envoy.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Time from `since` until Envoy ACKs an EDS response sent after it.
pub async fn eds_ack_after(app: &App, since: SystemTime) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let acked = app.clients.snapshot().into_iter().filter_map(|c| c.types.get(ENDPOINT_TYPE)?.last_ack_time).max();
        if let Some(t) = acked.filter(|t| *t > since) {
            return t.duration_since(since).unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "no EDS ACK after the change");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The first warning on meshbridge's `/v1/config` whose `object` is
/// `object` (e.g. `Ingress shop/web`), waiting up to 15 s for it.
pub async fn config_warning(admin_addr: std::net::SocketAddr, object: &str) -> serde_json::Value {
    let url = format!("http://{admin_addr}/v1/config");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
        if let Some(w) = v["warnings"].as_array().and_then(|w| w.iter().find(|w| w["object"] == object)) {
            return w.clone();
        }
        assert!(Instant::now() < deadline, "no warning for {object}: {v:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `static` registry entry named `name` whose one endpoint is `addr`,
/// served on port 80 (`name.static:80` to a `destination`), for
/// [`mcpbridge`].
pub fn static_registry(name: &str, addr: std::net::SocketAddr) -> String {
    format!("{{type: static, name: {name}, domain: \"{addr}\", port: 80}}")
}

/// An Ingress in namespace `shop`, created on 2026-01-`day`, routing
/// `paths` (Prefix) on `host` to the McpBridge service `destination`, with
/// more `annotations`.
pub fn mcp_ingress(
    name: &str,
    day: u32,
    host: &str,
    destination: &str,
    annotations: &[(&str, &str)],
    paths: &[&str],
) -> String {
    let mut yaml = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  \
         creationTimestamp: \"2026-01-{day:02}T00:00:00Z\"\n  annotations:\n    \
         higress.io/destination: {destination}\n"
    );
    for (k, v) in annotations {
        yaml.push_str(&format!("    {k}: {}\n", serde_json::to_string(v).unwrap()));
    }
    yaml.push_str(&format!(
        "spec:\n  ingressClassName: higress\n  rules:\n    - host: {host}\n      http:\n        paths:\n"
    ));
    for path in paths {
        yaml.push_str(&format!(
            "          - {{ path: {}, pathType: Prefix, backend: {{ resource: \
             {{ apiGroup: networking.higress.io, kind: McpBridge, name: default }} }} }}\n",
            // Quoted: a regex path may hold YAML's flow characters.
            serde_json::to_string(path).unwrap()
        ));
    }
    yaml
}

/// The canary Ingresses the canary tests share, on `host`: a main Ingress
/// (`main.static:80`) on `/app` and `/split`; a canary (`canary.static:80`)
/// on `/app` by header `x-canary` and cookie `beta_user`
/// (`nginx.ingress.kubernetes.io/` keys); and one on `/split` by the same
/// header and a weight of 3 out of a total of 10 (`higress.io/` keys).
pub fn canary_ingresses(host: &str) -> Vec<String> {
    let nginx = |key: &str| format!("nginx.ingress.kubernetes.io/{key}");
    let (canary, by_header, by_cookie) = (nginx("canary"), nginx("canary-by-header"), nginx("canary-by-cookie"));
    vec![
        mcp_ingress("shop", 1, host, "main.static:80", &[], &["/app", "/split"]),
        mcp_ingress(
            "shop-canary-app",
            2,
            host,
            "canary.static:80",
            &[(&canary, "true"), (&by_header, "x-canary"), (&by_cookie, "beta_user")],
            &["/app"],
        ),
        mcp_ingress(
            "shop-canary-split",
            3,
            host,
            "canary.static:80",
            &[
                ("higress.io/canary", "true"),
                ("higress.io/canary-by-header", "x-canary"),
                ("higress.io/canary-weight", "3"),
                ("higress.io/canary-weight-total", "10"),
            ],
            &["/split"],
        ),
    ]
}

/// `n` requests for `path` on `host`; the body (a [`crate::backend::Backend`]
/// answers with its name) or the status of each, counted.
pub async fn count_answers(
    envoy: &Envoy,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        let (status, body) = envoy.get_with(path, host, headers).await.unwrap();
        let key = if status == 200 { body } else { format!("status {status}") };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// Traffic through a gateway serving [`canary_ingresses`] on `host`, with
/// the backends `main` and `canary`: by header, by cookie, the header
/// before the cookie and before the weight, and the 30/70 split. The same
/// checks run on the standalone gateway and through istiod. Returns how
/// many of 200 unpinned `/split` requests reached the canary.
pub async fn check_canary_routing(envoy: &Envoy, host: &str) -> u32 {
    let count = |path: &'static str, headers: Vec<(&'static str, &'static str)>, n| async move {
        count_answers(envoy, host, path, &headers, n).await
    };
    let only = |name: &str, n: u32| BTreeMap::from([(name.to_owned(), n)]);
    // The header sends every request to the canary.
    assert_eq!(count("/app/x", vec![("x-canary", "always")], 20).await, only("canary", 20));
    assert_eq!(count("/app/x", vec![], 20).await, only("main", 20));
    assert_eq!(count("/app", vec![("x-canary", "never")], 20).await, only("main", 20));
    // Any other value leaves it to the cookie.
    let beta = vec![("x-canary", "maybe"), ("cookie", "theme=dark; beta_user=always; lang=en")];
    assert_eq!(count("/app", beta, 20).await, only("canary", 20));
    assert_eq!(count("/app", vec![("cookie", "beta_user=always")], 20).await, only("canary", 20));
    assert_eq!(count("/app", vec![("cookie", "beta_user=never")], 20).await, only("main", 20));
    // Not the cookie, only one named like it.
    assert_eq!(count("/app", vec![("cookie", "old_beta_user=always")], 20).await, only("main", 20));
    // The header comes before the cookie.
    let header_wins = vec![("x-canary", "never"), ("cookie", "beta_user=always")];
    assert_eq!(count("/app", header_wins, 20).await, only("main", 20));

    // The header comes before the weight.
    assert_eq!(count("/split", vec![("x-canary", "always")], 20).await, only("canary", 20));
    assert_eq!(count("/split", vec![("x-canary", "never")], 20).await, only("main", 20));
    let counts = count("/split", vec![], 200).await;
    let to_canary = counts.get("canary").copied().unwrap_or(0);
    let to_main = counts.get("main").copied().unwrap_or(0);
    assert_eq!(to_canary + to_main, 200, "{counts:?}");
    // 30/70 over 200 draws: the standard deviation is about 6.5, so ±27 is
    // over four sigma.
    assert!((33..=87).contains(&to_canary), "split off 30/70: {counts:?}");
    to_canary
}
