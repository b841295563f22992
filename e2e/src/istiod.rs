//! A REAL istiod (`pilot-discovery discovery`, built by `e2e/setup.sh
//! istiod istiod-1.27`: one [`Version`] each) reading its config from
//! meshbridge over MCP (mesh config `configSources: [{address: xds://…}]`),
//! with the real API server of [`crate::apiserver`] as its Kubernetes, on
//! free loopback ports in a temp dir; killed when the value drops. Each
//! istiod test runs its scenario once per version ([`istiod_tests!`]).
//!
//! How it runs outside a cluster, and why (istio.io/istio
//! `pilot/pkg/bootstrap`, `pilot/pkg/features`):
//! - `--kubeconfig` with the admin's kubeconfig; `POD_NAMESPACE`
//!   `istio-system` (created here; its leader-election Leases and the
//!   namespace controller's ConfigMaps land there and in the other
//!   namespaces of this test's own API server, nowhere else), `POD_NAME`,
//!   `REVISION=default`;
//! - every listener on a free loopback port: `--grpcAddr` (plaintext xDS,
//!   15010 in a cluster), `--httpAddr` (`/ready` and the `/debug/...`
//!   endpoints, 8080), `--monitoringAddr` (metrics and debug, 15014),
//!   `--ctrlz_port` (9876); `--secureGRPCAddr ""` and `--httpsAddr ""`
//!   turn off the TLS xDS port (15012) and the webhook port (15017: its
//!   handlers move onto `--httpAddr`), which need the certificates of a CA
//!   ([`Options::secure_xds`] turns the TLS xDS port on, with a test CA's
//!   certificate given as `--tlsCertFile`/`--tlsKeyFile`/`--caCertFile`);
//! - `ENABLE_CA_SERVER=false`: no CA, so no `istio-ca-secret` and no DNS
//!   certificate (`PILOT_CERT_PROVIDER` is then "not implemented", a warning);
//!   `VALIDATION_WEBHOOK_CONFIG_NAME=""`: no webhook configuration to patch;
//!   the injector finds no `istio-sidecar-injector` ConfigMap and stays off;
//! - mesh config: only `xds://` in `configSources`, so istiod reads no
//!   Istio CRDs at all (none are installed); `ingressControllerMode: OFF`,
//!   so Ingresses reach it only through meshbridge;
//! - `PILOT_ENABLE_METADATA_EXCHANGE=false`, only when asked
//!   ([`Options::upstream_envoy`]): without it every cluster carries Istio's
//!   `istio.metadata_exchange` upstream filter, which only Istio's Envoy
//!   build has, and a stock Envoy rejects the whole CDS update;
//!   `enableAutoMtls: false` likewise, since auto mTLS gives each cluster a
//!   TLS transport socket fed by SDS from the `sds-grpc` cluster of Istio's
//!   bootstrap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::apiserver::ApiServer;
use crate::envoy::{AdsMode, Envoy, Node};
use crate::process::{ChildGuard, binary_from_env, free_port};

/// istiod's own namespace (`POD_NAMESPACE`), and its root namespace.
pub const NAMESPACE: &str = "istio-system";
/// Until `/ready` answers 200: the API server's informers and the first
/// answer to every MCP collection istiod asked meshbridge for.
/// An Istio gateway node with the labels meshbridge's Ingress Gateway
/// selects (a documentation address: istiod never connects to it).
pub const GATEWAY_NODE: &str = "router~192.0.2.10~higress-gateway-e2e.higress-system~higress-system.svc.cluster.local";
pub const GATEWAY_LABELS: [(&str, &str); 1] = [("higress", "higress-system-higress-gateway")];
/// The gateway's Kubernetes Service, as Higress's chart names it.
const GATEWAY_SERVICE: &str = "higress-gateway";
const GATEWAY_NAMESPACE: &str = "higress-system";

/// [`GATEWAY_LABELS`] as a YAML flow mapping's inside.
fn gateway_selector() -> String {
    let pairs: Vec<String> = GATEWAY_LABELS.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    pairs.join(", ")
}

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// An istiod build the tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// master: 1.31-dev, istio.io/istio commit `eed52ebb66ad` of
    /// 2026-08-27 (`e2e/setup.sh istiod`, `MESHBRIDGE_ISTIOD_BIN`).
    Master,
    /// Istio 1.27.9, commit `b9159ca3e5d5` of 2026-04-03 (`e2e/setup.sh
    /// istiod-1.27`, `MESHBRIDGE_ISTIOD_127_BIN`): the release line Higress
    /// ships.
    Istio127,
}

impl Version {
    /// Every build, each test runs once per.
    pub const ALL: [Version; 2] = [Version::Master, Version::Istio127];

    /// The variable `e2e/env.sh` sets to its `pilot-discovery`.
    pub fn env_var(self) -> &'static str {
        match self {
            Version::Master => "MESHBRIDGE_ISTIOD_BIN",
            Version::Istio127 => "MESHBRIDGE_ISTIOD_127_BIN",
        }
    }

    /// The loopback address for instance `n` (from 0) of one service.
    ///
    /// Istio 1.27 gives a ServiceEntry's inline endpoints no workload name
    /// (`serviceentry` `convertEndpoint` with an empty `configKey`), and
    /// istiod's EDS change check (`model.endpointUpdateRequiresPush`) keys
    /// endpoints by `IstioEndpoint.Key()`: address, workload name and port
    /// *name*, not port. Two instances on one address are then one key:
    /// when one of them goes, the survivor is compared with whichever of
    /// the two the map kept, and when that is itself istiod finds no change
    /// and pushes nothing: seen in 3 runs of 4 here (the Envoy keeps both
    /// endpoints until some full push, though `/debug/endpointShardz` and a
    /// new stream have only the survivor). Master names each inline
    /// endpoint `<ServiceEntry>-<index>` and pushes every time. So on 1.27
    /// each instance of a service has its own address, and master keeps
    /// them all on 127.0.0.1, the case 1.27 misses (docs/src/compatibility.md).
    pub fn instance_address(self, n: u8) -> String {
        match self {
            Version::Master => "127.0.0.1".to_owned(),
            Version::Istio127 => format!("127.0.0.{}", n + 1),
        }
    }

    /// The release it is, as figures and messages name it.
    pub fn release(self) -> &'static str {
        match self {
            Version::Master => "1.31-dev",
            Version::Istio127 => "1.27.9",
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "istiod {}", self.release())
    }
}

/// Two tests for each scenario named, `async fn scenario(version:
/// Version)` in the calling file: `scenario::master` and
/// `scenario::istio_1_27`, so every test name, and every panic (its thread
/// is named after the test), says which istiod it ran. Attributes given
/// before a name (`#[ignore = "…"]`) go on both. A build that is not
/// installed fails its test: [`Istiod::start`] needs its binary.
#[macro_export]
macro_rules! istiod_tests {
    ($($(#[$attr:meta])* $scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn master() {
                super::$scenario($crate::istiod::Version::Master).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$attr])*
            async fn istio_1_27() {
                super::$scenario($crate::istiod::Version::Istio127).await
            }
        }
    )+};
}

/// Which istiod, and what to turn on or off beside the defaults.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// The build to run.
    pub version: Version,
    /// Serve a stock (upstream) Envoy: no metadata-exchange filters and no
    /// auto mTLS (see the module doc).
    pub upstream_envoy: bool,
    /// Also leave Istio's ALPN filter (`istio.alpn`) out of the HTTP
    /// connection managers it builds (`PILOT_ENABLE_ALPN_FILTER=false`), so
    /// that a stock Envoy takes its gateway listeners too
    /// ([`Istiod::gateway_envoy`]). The filter only rewrites the ALPN an
    /// Istio proxy offers upstream for protocol sniffing, which a gateway
    /// to plain backends does not use.
    pub stock_gateway_listeners: bool,
    /// Also serve xDS over TLS (15012 in a cluster), with a certificate of
    /// the test's own CA, authenticating proxies by a client certificate
    /// that CA signed ([`Istiod::secure_gateway_envoy`]): istiod serves a
    /// `credentialName` Secret over SDS only to a proxy it has identified.
    pub secure_xds: bool,
}

/// Starts tried when a port picked free was taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// A running istiod.
pub struct Istiod {
    /// The build running.
    pub version: Version,
    /// Plaintext gRPC xDS (15010 in a cluster).
    pub grpc_addr: SocketAddr,
    /// With [`Options::secure_xds`]: xDS over TLS (15012 in a cluster),
    /// and the CA that signed its certificate and signs the proxies'.
    pub secure: Option<(SocketAddr, std::sync::Arc<meshbridge::testing::pki::TestPki>)>,
    /// `/ready` and `/debug/...` (8080 in a cluster).
    pub http_addr: SocketAddr,
    /// Prometheus metrics (15014 in a cluster).
    pub monitoring_addr: SocketAddr,
    /// With [`Options::stock_gateway_listeners`]: the gateway Service's
    /// target port, which [`Istiod::gateway_envoy`] listens on.
    pub gateway_port: Option<u16>,
    /// With [`Options::stock_gateway_listeners`]: the target port of the
    /// gateway Service's port 443, where istiod puts the listener of the
    /// Gateway's HTTPS servers.
    pub gateway_https_port: Option<u16>,
    http: reqwest::Client,
    guard: ChildGuard,
    dir: tempfile::TempDir,
}

impl Istiod {
    /// Start istiod with `mcp` (meshbridge's xDS address) as its only
    /// config source, against `api`, and wait until `/ready` says 200.
    pub async fn start(api: &ApiServer, mcp: SocketAddr, options: Options) -> anyhow::Result<Istiod> {
        let version = options.version;
        let bin = binary_from_env(version.env_var()).with_context(|| format!("{version}"))?;
        match api.kubectl(&["create", "namespace", NAMESPACE]).await {
            Err(e) if !e.to_string().contains("AlreadyExists") => return Err(e),
            _ => {}
        }
        // A port picked free can be taken before istiod binds it (tests
        // run side by side): then istiod exits saying so, and starts again
        // on fresh ports.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::tempdir()?;
            let mesh = dir.path().join("mesh.yaml");
            let mut mesh_yaml = format!(
                "configSources:\n  - address: xds://{mcp}\ningressControllerMode: \"OFF\"\nrootNamespace: {NAMESPACE}\n"
            );
            if options.upstream_envoy {
                mesh_yaml.push_str("enableAutoMtls: false\n");
            }
            std::fs::write(&mesh, mesh_yaml)?;
            let grpc_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let http_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let monitoring_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut cmd = Command::new(&bin);
            cmd.arg("discovery")
                .arg("--kubeconfig")
                .arg(&api.admin_kubeconfig)
                .arg("--meshConfig")
                .arg(&mesh)
                // Absent: istiod's default mesh networks.
                .arg("--networksConfig")
                .arg(dir.path().join("mesh-networks.yaml"))
                .args(["--grpcAddr", &grpc_addr.to_string()])
                .args(["--httpAddr", &http_addr.to_string()])
                .args(["--monitoringAddr", &monitoring_addr.to_string()])
                .args(["--httpsAddr", ""])
                .args(["--ctrlz_address", "127.0.0.1", "--ctrlz_port", &free_port().to_string()])
                .args(["--log_output_level", "default:info"])
                // Relative paths it reads (./var/lib/istio/inject, ./etc/...)
                // resolve inside the temp dir.
                .current_dir(dir.path())
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("POD_NAMESPACE", NAMESPACE)
                .env("POD_NAME", "istiod-e2e")
                .env("REVISION", "default")
                .env("ENABLE_CA_SERVER", "false")
                .env("VALIDATION_WEBHOOK_CONFIG_NAME", "")
                // Go's runtime sizes itself by the cores it sees: 2 here.
                .env("GOMAXPROCS", "2");
            let secure = if options.secure_xds {
                let ca = meshbridge::testing::pki::TestPki::new("istiod e2e ca")?;
                let cert = ca.server("istiod", &["istiod.istio-system.svc"], &[])?;
                let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
                cmd.args(["--secureGRPCAddr", &addr.to_string()])
                    .arg("--tlsCertFile")
                    .arg(&cert.cert)
                    .arg("--tlsKeyFile")
                    .arg(&cert.key)
                    .arg("--caCertFile")
                    .arg(&ca.ca.cert);
                Some((addr, std::sync::Arc::new(ca)))
            } else {
                cmd.args(["--secureGRPCAddr", ""]);
                None
            };
            if options.upstream_envoy {
                cmd.env("PILOT_ENABLE_METADATA_EXCHANGE", "false");
            }
            if options.stock_gateway_listeners {
                cmd.env("PILOT_ENABLE_ALPN_FILTER", "false");
            }
            let guard = ChildGuard::spawn("istiod", cmd, dir.path().join("istiod.log"))?;
            let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
            let (gateway_port, gateway_https_port) = (None, None);
            let mut istiod = Istiod {
                version,
                grpc_addr,
                secure,
                http_addr,
                monitoring_addr,
                gateway_port,
                gateway_https_port,
                http,
                guard,
                dir,
            };
            match istiod.wait_ready().await {
                Ok(()) if options.stock_gateway_listeners => {
                    let (http, https) = istiod.add_gateway_service(api).await?;
                    (istiod.gateway_port, istiod.gateway_https_port) = (Some(http), Some(https));
                    return Ok(istiod);
                }
                Ok(()) => return Ok(istiod),
                Err(e) if attempt < START_ATTEMPTS && istiod.guard.log().contains("address already in use") => {
                    eprintln!("{version}: a port was taken ({e:#}); starting again on fresh ports");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Write the gateway's Service (ports 80 and 443 to free target
    /// ports), wait until istiod lists it, and return the target ports.
    /// Gateway proxies that connect later still need
    /// [`Istiod::refresh_gateway`] on 1.27.
    async fn add_gateway_service(&self, api: &ApiServer) -> anyhow::Result<(u16, u16)> {
        match api.kubectl(&["create", "namespace", GATEWAY_NAMESPACE]).await {
            Err(e) if !e.to_string().contains("AlreadyExists") => return Err(e),
            _ => {}
        }
        let (target, https_target) = (free_port(), free_port());
        api.apply(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{ name: {GATEWAY_SERVICE}, namespace: {GATEWAY_NAMESPACE} }}\n\
             spec:\n  selector: {{ {} }}\n  ports:\n    - {{ name: http-80, port: 80, targetPort: {target} }}\n    \
             - {{ name: https-443, port: 443, targetPort: {https_target} }}\n",
            gateway_selector()
        ))
        .await?;
        let host = format!("{GATEWAY_SERVICE}.{GATEWAY_NAMESPACE}.svc.cluster.local");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.debug_text("registryz").await.unwrap_or_default().contains(&host) {
            anyhow::ensure!(Instant::now() < deadline, "{} never listed the gateway Service {host}", self.version);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok((target, https_target))
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let url = format!("http://{}/ready", self.http_addr);
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < READY_TIMEOUT {
            anyhow::ensure!(self.guard.is_running(), "{} exited\n{}", self.version, self.guard.log_tail(6000));
            match self.http.get(&url).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = r.status().to_string(),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        anyhow::bail!("{} not ready in {READY_TIMEOUT:?} (last: {last})\n{}", self.version, self.guard.log_tail(6000))
    }

    /// A stock Envoy as the Ingress Gateway ([`GATEWAY_NODE`], with its
    /// labels in the node metadata), taking everything from istiod:
    /// listeners, routes, clusters and endpoints.
    ///
    /// It listens on [`Istiod::gateway_port`], not on the Gateway's 80: as
    /// in a cluster, the gateway's Kubernetes Service (`higress-gateway` in
    /// `higress-system`, selecting the gateway's labels, written to the API
    /// server once istiod is ready) maps port 80 to the pods' target port,
    /// and istiod builds the listener on the target port (it finds the
    /// Service from the proxy's namespace and labels, with no pod). The
    /// listener binds `0.0.0.0`, as istiod writes it; tests send to it on
    /// loopback ([`Envoy::get_with`]). Needs
    /// [`Options::stock_gateway_listeners`].
    pub async fn gateway_envoy(&self, api: &ApiServer) -> anyhow::Result<Envoy> {
        let listen_port = self
            .gateway_port
            .with_context(|| format!("{}: started without Options::stock_gateway_listeners", self.version))?;
        let node = Node {
            id: GATEWAY_NODE.into(),
            cluster: GATEWAY_SERVICE.into(),
            // NAMESPACE as an Istio agent sends it (from POD_NAMESPACE):
            // istiod 1.27 takes the proxy's namespace only from there, and
            // looks the gateway's Service up in it.
            metadata: Some(format!("{{ LABELS: {{ {} }}, NAMESPACE: {GATEWAY_NAMESPACE} }}", gateway_selector())),
        };
        let envoy = Envoy::start_gateway_as(&node, self.grpc_addr, AdsMode::Sotw, listen_port).await?;
        self.wait_gateway_listener(api, envoy, listen_port).await
    }

    /// [`Istiod::gateway_envoy`] over istiod's TLS xDS port, presenting a
    /// client certificate of the gateway's identity
    /// (`spiffe://cluster.local/ns/higress-system/sa/higress-gateway`), as
    /// an Istio agent does for it: istiod then serves it the Secrets its
    /// clusters name (`credentialName`), where the ServiceAccount may list
    /// Secrets (a SubjectAccessReview). Needs [`Options::secure_xds`].
    pub async fn secure_gateway_envoy(&self, api: &ApiServer) -> anyhow::Result<Envoy> {
        let listen_port = self
            .gateway_port
            .with_context(|| format!("{}: started without Options::stock_gateway_listeners", self.version))?;
        let (addr, ca) =
            self.secure.as_ref().with_context(|| format!("{}: started without secure_xds", self.version))?;
        let identity = format!("URI:spiffe://cluster.local/ns/{GATEWAY_NAMESPACE}/sa/{GATEWAY_SERVICE}");
        let client = ca.issue("gateway", &[identity])?;
        let pem = |p: &std::path::Path| -> anyhow::Result<String> {
            Ok(serde_json::to_string(&std::fs::read_to_string(p)?)?)
        };
        // CLUSTER_ID as the agent sends it: istiod reads the proxy's
        // Secrets from the cluster it names (istiod's own is `Kubernetes`).
        let node = Node {
            id: GATEWAY_NODE.into(),
            cluster: GATEWAY_SERVICE.into(),
            metadata: Some(format!(
                "{{ LABELS: {{ {} }}, NAMESPACE: {GATEWAY_NAMESPACE}, CLUSTER_ID: Kubernetes }}",
                gateway_selector()
            )),
        };
        let mut yaml =
            crate::envoy::bootstrap(&node, *addr, AdsMode::Sotw, 0, listen_port, crate::envoy::Listeners::Ads);
        let socket = format!(
            "      transport_socket:\n        name: envoy.transport_sockets.tls\n        typed_config:\n          \
             \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n          \
             sni: istiod.istio-system.svc\n          common_tls_context:\n            alpn_protocols: [h2]\n            \
             tls_certificates:\n              - certificate_chain: {{ inline_string: {} }}\n                \
             private_key: {{ inline_string: {} }}\n            validation_context:\n              \
             trusted_ca: {{ inline_string: {} }}\n",
            pem(&client.cert)?,
            pem(&client.key)?,
            pem(&ca.ca.cert)?
        );
        let at = yaml.find("      connect_timeout: 1s\n").context("the xds cluster in the bootstrap")?;
        yaml.insert_str(at, &socket);
        let envoy = Envoy::start_bootstrap(&yaml, 0, listen_port).await?;
        self.wait_gateway_listener(api, envoy, listen_port).await
    }

    /// Let the gateway's ServiceAccount read Secrets in its namespace, as
    /// istiod checks (a SubjectAccessReview) before it serves a proxy a
    /// `credentialName` Secret over SDS.
    pub async fn allow_gateway_secrets(&self, api: &ApiServer) -> anyhow::Result<()> {
        let ns = GATEWAY_NAMESPACE;
        api.apply(&format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{ name: gateway-secrets, namespace: {ns} }}\n\
             rules: [{{ apiGroups: [\"\"], resources: [secrets], verbs: [get, list, watch] }}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{ name: gateway-secrets, namespace: {ns} }}\n\
             roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: gateway-secrets }}\n\
             subjects: [{{ kind: ServiceAccount, name: {GATEWAY_SERVICE}, namespace: {ns} }}]\n"
        ))
        .await?;
        Ok(())
    }

    async fn wait_gateway_listener(&self, api: &ApiServer, envoy: Envoy, listen_port: u16) -> anyhow::Result<Envoy> {
        // Until its listener is on the target port: see
        // [`Istiod::refresh_gateway`] (1.27 needs one relabelling once the
        // Envoy is connected; master has it at once).
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut touches = 0;
        loop {
            let listeners = envoy.admin("/listeners").await.unwrap_or_default();
            if listeners.lines().any(|l| l.ends_with(&format!(":{listen_port}"))) {
                return Ok(envoy);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{}: the gateway Envoy has no listener on {listen_port} (it has: {listeners})",
                self.version
            );
            if !listeners.trim().is_empty() {
                touches += 1;
                self.refresh_gateway(api, touches).await?;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `GET /debug/{what}` on the HTTP port: the body as text.
    pub async fn debug_text(&self, what: &str) -> anyhow::Result<String> {
        let url = format!("http://{}/debug/{what}", self.http_addr);
        let resp = self.http.get(&url).send().await.with_context(|| format!("GET {url}"))?;
        let status = resp.status();
        let body = resp.text().await?;
        anyhow::ensure!(status.is_success(), "{}: GET {url}: {status}: {body}", self.version);
        Ok(body)
    }

    /// `GET /debug/{what}` as JSON.
    pub async fn debug(&self, what: &str) -> anyhow::Result<serde_json::Value> {
        let text = self.debug_text(what).await?;
        serde_json::from_str(&text).with_context(|| format!("{}: /debug/{what} is not JSON: {text:.300}", self.version))
    }

    /// The config objects istiod holds (`/debug/configz`), as
    /// `Kind namespace/name` → the object.
    pub async fn configs(&self) -> anyhow::Result<std::collections::BTreeMap<String, serde_json::Value>> {
        let all = self.debug("configz").await?;
        let list = all.as_array().with_context(|| format!("{}: /debug/configz is not a list", self.version))?;
        Ok(list
            .iter()
            .map(|c| {
                let m = &c["metadata"];
                let key = format!(
                    "{} {}/{}",
                    c["kind"].as_str().unwrap_or_default(),
                    m["namespace"].as_str().unwrap_or_default(),
                    m["name"].as_str().unwrap_or_default()
                );
                (key, c.clone())
            })
            .collect())
    }

    /// The first VirtualService istiod holds, waiting up to 30 s for one.
    pub async fn virtual_service(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let configs = self.configs().await.unwrap_or_default();
            if let Some(vs) = configs.values().find(|c| c["kind"] == "VirtualService") {
                return vs.clone();
            }
            assert!(Instant::now() < deadline, "{} has no VirtualService\n{}", self.version, self.log_tail(4000));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The routes istiod builds for `host` in the Ingress Gateway's
    /// ([`GATEWAY_NODE`]) RouteConfiguration for the Gateway's port 80,
    /// once there are at least `at_least` of them, waiting up to 30 s.
    /// istiod names it after the listener's port: `http.` and the gateway
    /// Service's target port. Needs [`Options::stock_gateway_listeners`].
    ///
    /// Asked over a stream of its own that stays open while the gateway
    /// Service is relabelled ([`Istiod::refresh_gateway`]), since istiod
    /// 1.27 resolves a new gateway proxy's Service only on such an event.
    pub async fn gateway_routes(
        &self,
        api: &ApiServer,
        host: &str,
        at_least: usize,
    ) -> Vec<envoy_types::pb::envoy::config::route::v3::Route> {
        use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
        use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
        use prost::Message;
        const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
        let port = self.gateway_port.expect("istiod started with Options::stock_gateway_listeners");
        let name = format!("http.{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        let request = |version: &str, nonce: &str| {
            let mut r = meshbridge::testing::SotwClient::request(ROUTE_TYPE, &[&name], version, nonce);
            r.node = Some(node_proto(GATEWAY_NODE, &GATEWAY_LABELS));
            r
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tx.send(request("", "")).await.expect("queue the request");
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{}", self.grpc_addr))
            .await
            .unwrap_or_else(|e| panic!("{}: connect: {e}", self.version));
        let mut stream = client
            .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap_or_else(|e| panic!("{}: ADS: {e}", self.version))
            .into_inner();
        let mut touches = 0;
        loop {
            assert!(
                Instant::now() < deadline,
                "{} built no routes for {host} in {name} (last: {last})\n{}",
                self.version,
                self.log_tail(4000)
            );
            match tokio::time::timeout(Duration::from_secs(2), stream.message()).await {
                Ok(Ok(Some(resp))) => {
                    let _ = tx.send(request(&resp.version_info, &resp.nonce)).await;
                    let vhost = resp
                        .resources
                        .iter()
                        .filter_map(|a| RouteConfiguration::decode(a.value.as_slice()).ok())
                        .flat_map(|rc| rc.virtual_hosts)
                        .find(|v| v.domains.iter().any(|d| d == host));
                    match vhost {
                        Some(v) if v.routes.len() >= at_least => return v.routes,
                        Some(v) => last = format!("{} routes", v.routes.len()),
                        None => last = format!("{} route configs, none for the host", resp.resources.len()),
                    }
                }
                Ok(Ok(None)) => panic!("{} closed the stream", self.version),
                Ok(Err(e)) => panic!("{}: {e}", self.version),
                Err(_) => last = "no answer in 2 s".into(),
            }
            touches += 1;
            self.refresh_gateway(api, touches).await.unwrap_or_else(|e| panic!("{}: {e:#}", self.version));
        }
    }

    /// Relabel the gateway's Service, an event that makes istiod resolve
    /// the Service of every connected gateway proxy again.
    ///
    /// istiod 1.27 resolves a new proxy's Services before it reads the
    /// proxy's labels; a gateway with no pod (as here) is matched to its
    /// Service by those labels, so at first it gets none, and with no
    /// Service its listener goes on the Gateway's port 80. It resolves
    /// them again, labels known, on the next event for a Service in the
    /// proxy's namespace. In a cluster the gateway's pod, found by its IP,
    /// gives the Service without labels; master reads the labels first.
    pub async fn refresh_gateway(&self, api: &ApiServer, n: u32) -> anyhow::Result<()> {
        let label = format!("e2e-refresh={n}");
        api.kubectl(&["label", "--overwrite", "-n", GATEWAY_NAMESPACE, "service", GATEWAY_SERVICE, &label]).await?;
        Ok(())
    }

    /// Ask istiod's xDS for `type_url` (`names`, or all) as the proxy `id`
    /// (`router~IP~name.ns~ns.svc.cluster.local`) with workload `labels`,
    /// over a stream of its own, and return the first answer: what istiod
    /// builds for that proxy, whether or not an Envoy could load it.
    pub async fn fetch(
        &self,
        id: &str,
        labels: &[(&str, &str)],
        type_url: &str,
        names: &[&str],
    ) -> anyhow::Result<Vec<envoy_types::pb::google::protobuf::Any>> {
        use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
        let mut request = meshbridge::testing::SotwClient::request(type_url, names, "", "");
        request.node = Some(node_proto(id, labels));
        // Queued before the call: istiod (grpc-go) sends the response
        // headers with its first message, which waits for this request.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(request).await?;
        let wait = Duration::from_secs(10);
        let call = async {
            let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{}", self.grpc_addr)).await?;
            let mut stream =
                client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
            anyhow::Ok(stream.message().await?)
        };
        let response = tokio::time::timeout(wait, call)
            .await
            .with_context(|| format!("{} sent no {type_url} in {wait:?}", self.version))??;
        let response = response.with_context(|| format!("{} closed the stream without a {type_url}", self.version))?;
        drop(tx);
        Ok(response.resources)
    }

    /// istiod's process id (for its CPU time in `/proc`).
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    /// istiod's log so far.
    pub fn log(&self) -> String {
        self.guard.log()
    }

    /// The last `max` bytes or so of the log.
    pub fn log_tail(&self, max: usize) -> String {
        self.guard.log_tail(max)
    }

    /// The temp dir it runs in.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

/// A proxy's node as an Istio agent would send it: the id, and metadata
/// with `LABELS` and the `NAMESPACE` (the first label of the id's domain,
/// `ns.svc.cluster.local`; istiod 1.27 reads the namespace only there).
fn node_proto(id: &str, labels: &[(&str, &str)]) -> envoy_types::pb::envoy::config::core::v3::Node {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
    let text = |s: &str| Value { kind: Some(Kind::StringValue(s.to_owned())) };
    let labels = labels.iter().map(|(k, v)| (k.to_string(), text(v))).collect();
    let mut metadata = Struct {
        fields: [("LABELS".to_owned(), Value { kind: Some(Kind::StructValue(Struct { fields: labels })) })].into(),
    };
    if let Some(ns) = id.rsplit('~').next().and_then(|d| d.split('.').next()).filter(|ns| !ns.is_empty()) {
        metadata.fields.insert("NAMESPACE".to_owned(), text(ns));
    }
    Node { id: id.to_owned(), metadata: Some(metadata), ..Default::default() }
}

/// Wait (up to 30 s) until `envoy`, fed by `istiod`, answers `path` on
/// `host` with a 200: its listener, route, cluster and endpoints have all
/// arrived and been accepted.
pub async fn wait_for_route(envoy: &Envoy, host: &str, path: &str, istiod: &Istiod) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match envoy.get_host(path, host).await {
            Ok((200, _)) => return,
            last if Instant::now() > deadline => {
                let listeners = envoy.admin("/listeners").await.unwrap_or_default();
                panic!(
                    "{host}{path} never answered 200 through {}'s gateway on port {} (last: {last:?})\n\
                     --- Envoy's listeners ---\n{listeners}\n--- envoy ---\n{}\n--- istiod ---\n{}",
                    istiod.version,
                    envoy.listen_port,
                    envoy.log(),
                    istiod.log_tail(4000)
                )
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
