//! A REAL kube-apiserver with its etcd, built by `e2e/setup.sh
//! kube-apiserver` (`MESHBRIDGE_KUBE_APISERVER_BIN`, `MESHBRIDGE_ETCD_BIN`),
//! on free loopback ports in a temp dir, both killed when the value drops.
//!
//! - TLS: a serving certificate for `127.0.0.1` and `localhost` from the
//!   test PKI (`meshbridge::testing::pki`, the openssl CLI);
//! - authentication: a static token file with one admin in
//!   `system:masters`, and ServiceAccount tokens (the TokenRequest API,
//!   `kubectl create token`) signed by a key made here;
//! - authorization: `--authorization-mode=RBAC` only, so a ServiceAccount
//!   can do what its Roles grant and nothing else;
//! - no controller manager, scheduler or kubelet: objects are stored and
//!   served, nothing reconciles them (no pods run, namespaces are not
//!   finalized on delete, Service IPs are allocated but nothing routes).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use meshbridge::kube::KubeArgs;
use meshbridge::run::{AdminArgs, App, GatewayArgs, RunArgs, RunCommand};
use meshbridge::testing::pki;

use crate::process::{ChildGuard, binary_from_env, free_port, stdout_of};

/// `--service-account-issuer` and the audience tokens are made for.
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The API server's own readiness, with every post-start hook done.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running etcd + kube-apiserver pair.
pub struct ApiServer {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// A kubeconfig for the admin (`system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The CA that signed the serving certificate.
    pub ca_file: PathBuf,
    admin_token: String,
    kubectl: PathBuf,
    // Dropped in this order: the API server before its etcd, then the files.
    apiserver: ChildGuard,
    etcd: ChildGuard,
    _pki: pki::TestPki,
    dir: tempfile::TempDir,
}

impl ApiServer {
    /// Start etcd and the API server and wait until `/readyz` answers ok.
    pub async fn start() -> anyhow::Result<ApiServer> {
        let apiserver_bin = binary_from_env("MESHBRIDGE_KUBE_APISERVER_BIN")?;
        let etcd_bin = binary_from_env("MESHBRIDGE_ETCD_BIN")?;
        let kubectl = binary_from_env("MESHBRIDGE_KUBECTL_BIN")?;
        let dir = tempfile::tempdir()?;
        let pki = pki::TestPki::new("meshbridge test apiserver ca")?;
        let serving = pki.server("apiserver", &["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
        // The ServiceAccount signing key: any ECDSA key will do, and the
        // PKI makes P-256 ones (ES256 tokens).
        let signer = pki.issue("service-account-signer", &["DNS:service-accounts.invalid".to_owned()])?;
        let admin_token = format!("admin-{}-{}", std::process::id(), free_port());
        // An audit record of every request a ServiceAccount makes, to see
        // which of its permissions it actually uses.
        let audit_policy = dir.path().join("audit-policy.yaml");
        std::fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
             - level: Metadata\n  userGroups: [system:serviceaccounts]\n- level: None\n",
        )?;
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(&tokens, format!("{admin_token},admin,admin-uid,system:masters\n"))?;

        let (client_port, peer_port) = (free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = Command::new(&etcd_bin);
        cmd.args(["--name", "e2e", "--data-dir"])
            .arg(dir.path().join("etcd"))
            .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("e2e={peer_url}")])
            // Test data: an fsync per write only slows the tests down.
            .arg("--unsafe-no-fsync");
        let etcd = ChildGuard::spawn("etcd", cmd, dir.path().join("etcd.log"))?;

        let port = free_port();
        let mut cmd = Command::new(&apiserver_bin);
        cmd.args(["--etcd-servers", &etcd_url])
            .args(["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1"])
            .args(["--secure-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(&serving.cert)
            .arg("--tls-private-key-file")
            .arg(&serving.key)
            .arg("--cert-dir")
            .arg(dir.path().join("certs"))
            .arg("--token-auth-file")
            .arg(&tokens)
            .args(["--authorization-mode", "RBAC"])
            .args(["--service-account-issuer", ISSUER, "--api-audiences", ISSUER])
            // The public half, as the certificate that carries it.
            .arg("--service-account-key-file")
            .arg(&signer.cert)
            .arg("--service-account-signing-key-file")
            .arg(&signer.key)
            // Allocated to the `kubernetes` Service only; nothing routes it.
            .args(["--service-cluster-ip-range", "10.96.0.0/24"])
            // No endpoints for the `kubernetes` Service: its address would
            // be loopback, and no pod reads it.
            .args(["--endpoint-reconciler-type", "none"])
            .arg("--audit-policy-file")
            .arg(&audit_policy)
            .arg("--audit-log-path")
            .arg(dir.path().join("audit.log"))
            .args(["--profiling=false", "--v=1"]);
        let apiserver = ChildGuard::spawn("kube-apiserver", cmd, dir.path().join("apiserver.log"))?;

        let url = format!("https://127.0.0.1:{port}");
        let admin_kubeconfig = dir.path().join("admin.kubeconfig");
        let server = ApiServer {
            url,
            admin_kubeconfig,
            ca_file: pki.ca.cert.clone(),
            admin_token,
            kubectl,
            apiserver,
            etcd,
            _pki: pki,
            dir,
        };
        server.write_kubeconfig(&server.admin_kubeconfig, "admin", &server.admin_token)?;
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.ca_file)?)?;
        let http = reqwest::Client::builder().add_root_certificate(ca).timeout(Duration::from_secs(5)).build()?;
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < READY_TIMEOUT {
            match http.get(format!("{}/readyz", self.url)).bearer_auth(&self.admin_token).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::bail!(
            "kube-apiserver not ready in {READY_TIMEOUT:?} (last: {last})\n--- apiserver log (tail) ---\n{}\n--- etcd log (tail) ---\n{}",
            tail(&self.apiserver.log(), 40),
            tail(&self.etcd.log(), 20)
        )
    }

    /// A kubeconfig at `path` for `user` authenticating with `token`.
    pub fn write_kubeconfig(&self, path: &Path, user: &str, token: &str) -> anyhow::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             contexts:\n- name: {user}\n  context:\n    cluster: e2e\n    user: {user}\n\
             current-context: {user}\nusers:\n- name: {user}\n  user:\n    token: {token}\n",
            self.url,
            self.ca_file.display()
        );
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
    }

    /// A kubeconfig (in the temp dir) for ServiceAccount `namespace/name`,
    /// with a token from the TokenRequest API (`kubectl create token`).
    pub async fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> anyhow::Result<PathBuf> {
        let token = self.kubectl(&["-n", namespace, "create", "token", name, "--duration", "1h"]).await?;
        let path = self.dir.path().join(format!("{namespace}-{name}.kubeconfig"));
        self.write_kubeconfig(&path, &format!("system:serviceaccount:{namespace}:{name}"), token.trim())?;
        Ok(path)
    }

    /// `kubectl ARGS` as the admin: stdout, or an error with stderr.
    pub async fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        self.kubectl_as(&self.admin_kubeconfig, args).await
    }

    /// `kubectl ARGS` with `kubeconfig`: stdout, or an error with stderr.
    pub async fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = tokio::process::Command::new(&self.kubectl);
        cmd.arg("--kubeconfig").arg(kubeconfig).args(["--request-timeout", "30s"]).args(args);
        stdout_of(cmd, &format!("kubectl {}", args.join(" "))).await
    }

    /// `kubectl apply -f -` of `yaml` as the admin.
    pub async fn apply(&self, yaml: &str) -> anyhow::Result<String> {
        let file = tempfile::NamedTempFile::new_in(self.dir.path())?;
        std::fs::write(file.path(), yaml)?;
        self.kubectl(&["apply", "-f", &file.path().to_string_lossy()]).await
    }

    /// `kubectl get KIND NAME -n NS -o json` (with `managedFields`) as the
    /// admin, or `None` when it does not exist.
    pub async fn get(&self, kind: &str, namespace: &str, name: &str) -> anyhow::Result<Option<serde_json::Value>> {
        let out = self
            .kubectl(&["get", kind, name, "-n", namespace, "-o", "json", "--show-managed-fields", "--ignore-not-found"])
            .await?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&out)?))
    }

    /// Install what `deploy/kubernetes` ships (`kubectl apply -k`, with
    /// the namespace `higress-system` it expects) and wait until the
    /// McpBridge CRD is served.
    pub async fn install_shipped(&self) -> anyhow::Result<()> {
        self.kubectl(&["create", "namespace", "higress-system"]).await?;
        let kustomization = repo().join("deploy/kubernetes");
        self.kubectl(&["apply", "-k", &kustomization.to_string_lossy()]).await?;
        self.wait_crd().await
    }

    /// Install `crd` (a file) and only the shipped namespace, ServiceAccount
    /// and RBAC: meshbridge as deployed beside an existing CRD (Higress's).
    pub async fn install_with_crd(&self, crd: &Path) -> anyhow::Result<()> {
        self.kubectl(&["create", "namespace", "higress-system"]).await?;
        self.kubectl(&["apply", "-f", &crd.to_string_lossy()]).await?;
        for file in ["namespace.yaml", "serviceaccount.yaml", "rbac.yaml"] {
            let path = repo().join("deploy/kubernetes").join(file);
            self.kubectl(&["apply", "-f", &path.to_string_lossy()]).await?;
        }
        self.wait_crd().await
    }

    async fn wait_crd(&self) -> anyhow::Result<()> {
        self.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "crd/mcpbridges.networking.higress.io"])
            .await?;
        Ok(())
    }

    /// Whether `user` may do `args` (`kubectl auth can-i ARGS --as USER`).
    pub async fn can_i(&self, user: &str, args: &[&str]) -> anyhow::Result<bool> {
        let out = tokio::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(["auth", "can-i", "--as", user])
            .args(args)
            .output()
            .await
            .context("run kubectl")?;
        match String::from_utf8_lossy(&out.stdout).trim() {
            "yes" => Ok(true),
            "no" => Ok(false),
            other => {
                anyhow::bail!("kubectl auth can-i {}: {other} {}", args.join(" "), String::from_utf8_lossy(&out.stderr))
            }
        }
    }

    /// What `user` has done so far, from the audit log: one
    /// `verb group/resource[/subresource]` per kind of request that the API
    /// server allowed (the core group is empty: `list /secrets`).
    pub fn requests_by(&self, user: &str) -> anyhow::Result<std::collections::BTreeSet<String>> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines() {
            let event: serde_json::Value = serde_json::from_str(line)?;
            // A watch still open has only reached ResponseStarted.
            let stage = event["stage"].as_str().unwrap_or_default();
            if event["user"]["username"] != user || !matches!(stage, "ResponseStarted" | "ResponseComplete") {
                continue;
            }
            if event["annotations"]["authorization.k8s.io/decision"] != "allow" {
                continue;
            }
            let o = &event["objectRef"];
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            let mut what = format!("{} {}/{}", text(&event["verb"]), text(&o["apiGroup"]), text(&o["resource"]));
            if let Some(sub) = o["subresource"].as_str() {
                what = format!("{what}/{sub}");
            }
            seen.insert(what);
        }
        Ok(seen)
    }

    /// Every request `user` made on a Secret, allowed or not, from the
    /// audit log: `verb namespace/name` (no name for a list or watch).
    pub fn secrets_read_by(&self, user: &str) -> anyhow::Result<std::collections::BTreeSet<String>> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines() {
            let event: serde_json::Value = serde_json::from_str(line)?;
            let o = &event["objectRef"];
            if event["user"]["username"] != user || o["resource"] != "secrets" {
                continue;
            }
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            seen.insert(format!("{} {}/{}", text(&event["verb"]), text(&o["namespace"]), text(&o["name"])));
        }
        Ok(seen)
    }

    /// The admin's bearer token (`system:masters`), for a harness that
    /// calls the API directly rather than through kubectl.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The API server's log so far.
    pub fn log(&self) -> String {
        self.apiserver.log()
    }

    /// The temp dir the servers and files live in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// meshbridge in process in Kubernetes mode (`kube`), on loopback ports,
/// with default admin options.
pub async fn launch_meshbridge(kube: KubeArgs, gateway: GatewayArgs) -> anyhow::Result<App> {
    App::launch(RunCommand {
        args: RunArgs { config_dir: None, ..RunArgs::loopback("") },
        admin: AdminArgs::default(),
        gateway,
        kube,
        lifecycle: Default::default(),
        xds: Default::default(),
    })
    .await
}

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
