//! A Spring Cloud app that registers itself in a real Eureka server (the
//! user's view: `spring-cloud-starter-netflix-eureka-client` and nothing
//! else) gets HTTP traffic through a real Envoy, via meshbridge (in-process,
//! on free ports). meshbridge's Eureka watcher runs at its default 10 s
//! interval here (McpBridge has no field for it), inside the 20 s that each
//! traffic check allows.
//!
//! Needs `source e2e/env.sh eureka-server eureka-client envoy`
//! (MESHBRIDGE_EUREKA_SERVER_JAR, MESHBRIDGE_EUREKA_CLIENT_JAR, MESHBRIDGE_ENVOY_BIN).

use meshbridge::run::App;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::eureka::{EurekaServer, GreeterApp};
use meshbridge_e2e::traffic::{self, wait_for_traffic};

/// vport pins the service port, so the route's cluster name is known up
/// front; endpoints keep the apps' own ports.
const CLUSTER: &str = "outbound|8080||greeter.eureka";

async fn start_meshbridge(eureka: &EurekaServer, dir: &std::path::Path) -> anyhow::Result<App> {
    let registry =
        format!("{{type: eureka, name: eureka, domain: 127.0.0.1, port: {}, vport: {{default: 8080}}}}", eureka.port);
    traffic::start_meshbridge(dir, &traffic::mcpbridge(&[registry])).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spring_cloud_app_in_eureka_gets_traffic_through_envoy() {
    let eureka = EurekaServer::start().await.expect("start the Eureka server (source e2e/env.sh eureka-server)");
    let mut first =
        GreeterApp::start(&eureka, "greeter-1").await.expect("start the Spring app (source e2e/env.sh eureka-client)");
    let dir = tempfile::tempdir().unwrap();
    let app = start_meshbridge(&eureka, dir.path()).await.expect("start meshbridge");
    let envoy = Envoy::start(app.xds_addr, AdsMode::Delta, CLUSTER).await.expect("start envoy");
    wait_for_traffic(&envoy, 200, &["greeter-1"], "the app registered itself and serves").await;

    let second = GreeterApp::start(&eureka, "greeter-2").await.expect("start a second instance");
    wait_for_traffic(&envoy, 200, &["greeter-1", "greeter-2"], "both instances serve").await;

    // Stopped the way a platform stops it: the client cancels its lease on
    // the way out, and traffic goes to the other instance only.
    first.stop_gracefully().await.expect("stop the first instance");
    let listed = eureka.api.apps().await.expect("GET /eureka/apps").to_string();
    assert!(!listed.contains(&first.instance_id()), "the first instance deregistered: {listed}");
    assert!(listed.contains(&second.instance_id()), "{listed}\n{}", second.log());
    wait_for_traffic(&envoy, 200, &["greeter-2"], "the stopped instance left").await;
    app.stop().await;
}
