//! Kubernetes mode end to end: an Ingress and an McpBridge in the FAKE
//! kube-apiserver route traffic through a real Envoy gateway (LDS/RDS/CDS/EDS
//! over ADS), and editing the Ingress in the API server moves the traffic.
//! Same path as the directory source: `Desired` → publisher → ADS.

use meshbridge::kube::KubeArgs;
use meshbridge::run::GatewayArgs;
use meshbridge_e2e::apiserver::launch_meshbridge;
use meshbridge_e2e::backend::Backend;
use meshbridge_e2e::envoy::{AdsMode, Envoy};
use meshbridge_e2e::free_port;
use meshbridge_e2e::kube_fake::KubeFake;
use meshbridge_e2e::traffic::wait_for_traffic;
use serde_json::{Value, json};

fn ingress(destination: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "apps", "annotations": {"higress.io/destination": destination}},
        "spec": {"ingressClassName": "higress", "rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"resource": {"apiGroup": "networking.higress.io", "kind": "McpBridge", "name": "default"}}}]}}]},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_edits_in_the_api_server_move_envoy_traffic() {
    let v1 = Backend::start("127.0.0.1", "v1").await.unwrap();
    let v2 = Backend::start("127.0.0.1", "v2").await.unwrap();
    let fake = KubeFake::with_mcpbridge().await.unwrap();
    fake.put(json!({
        "apiVersion": "networking.higress.io/v1", "kind": "McpBridge",
        "metadata": {"name": "default", "namespace": "higress-system"},
        "spec": {"registries": [
            {"type": "static", "name": "shop-v1", "domain": v1.addr.to_string(), "port": 80},
            {"type": "static", "name": "shop-v2", "domain": v2.addr.to_string(), "port": 80},
        ]},
    }));
    fake.put(ingress("shop-v1.static:80"));

    let gateway_port = free_port();
    let kube = KubeArgs { leader_elect: Some(false), ..KubeArgs::at(fake.url()) };
    let gateway = GatewayArgs { gateway_http_port: vec![gateway_port], ..GatewayArgs::default() };
    let app = launch_meshbridge(kube, gateway).await.unwrap();
    let envoy = Envoy::start_gateway(app.xds_addr, AdsMode::Sotw, gateway_port).await.expect("start envoy");
    wait_for_traffic(&envoy, 200, &["v1"], "Ingress from the API server").await;

    fake.put(ingress("shop-v2.static:80"));
    wait_for_traffic(&envoy, 200, &["v2"], "edited Ingress").await;

    fake.delete("networking.k8s.io/ingresses", "apps", "shop");
    wait_for_traffic(&envoy, 404, &[], "deleted Ingress").await;
    app.stop().await;
}
