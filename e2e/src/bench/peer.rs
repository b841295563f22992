//! The peer a user would pick without meshbridge: Envoy with a STRICT_DNS
//! cluster on Consul's DNS interface (`<service>.service.consul`), with
//! Envoy's default DNS refresh (5 s) and Consul's default DNS TTL (0).
//! Consul's DNS answers only with instances whose checks pass, so a failing
//! TTL check is what both paths must propagate.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::consul::ConsulDev;
use crate::process::{ChildGuard, binary_from_env, free_port, wait_for_http};

/// The peer service: two instances, on 127.0.0.2 and 127.0.0.3.
pub const SERVICE: &str = "peer";
pub const PORT: u16 = 8080;
pub const KEPT: &str = "127.0.0.2";
pub const FAILED: &str = "127.0.0.3";

/// Register the peer service's two instances, each with a passing TTL check.
pub async fn register(consul: &ConsulDev) -> anyhow::Result<()> {
    for (n, ip) in [(1, KEPT), (2, FAILED)] {
        let body = serde_json::json!({
            "ID": format!("{SERVICE}-{n}"), "Name": SERVICE, "Address": ip, "Port": PORT,
            "Check": { "CheckID": check_id(ip), "TTL": "3600s", "Status": "passing" },
        });
        consul.put("/v1/agent/service/register", Some(body)).await?;
    }
    Ok(())
}

pub fn check_id(ip: &str) -> String {
    format!("{SERVICE}-{ip}-ttl")
}

/// An Envoy whose only cluster resolves the peer service on Consul's DNS.
pub struct PeerEnvoy {
    admin_port: u16,
    _guard: ChildGuard,
    _dir: TempDir,
}

impl PeerEnvoy {
    pub async fn start(dns_port: u16) -> anyhow::Result<PeerEnvoy> {
        let bin = binary_from_env("MESHBRIDGE_ENVOY_BIN")?;
        let dir = tempfile::tempdir()?;
        let admin_port = free_port();
        let config = dir.path().join("peer.yaml");
        std::fs::write(&config, bootstrap(admin_port, dns_port))?;
        let mut cmd = Command::new(bin);
        cmd.arg("-c").arg(&config).args(["--disable-hot-restart", "--concurrency", "1", "-l", "warn"]);
        let guard = ChildGuard::spawn("peer-envoy", cmd, dir.path().join("envoy.log"))?;
        let envoy = PeerEnvoy { admin_port, _guard: guard, _dir: dir };
        wait_for_http(&format!("http://127.0.0.1:{admin_port}/ready"), Duration::from_secs(30)).await?;
        Ok(envoy)
    }

    /// Addresses Envoy currently has in the peer cluster.
    pub async fn members(&self) -> BTreeSet<String> {
        let url = format!("http://127.0.0.1:{}/clusters", self.admin_port);
        let Ok(resp) = reqwest::Client::new().get(url).timeout(Duration::from_secs(2)).send().await else {
            return BTreeSet::new();
        };
        let body = resp.text().await.unwrap_or_default();
        let prefix = format!("{SERVICE}::");
        body.lines()
            .filter_map(|l| l.strip_prefix(&prefix)?.split("::").next())
            .filter_map(|hp| hp.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.ip().to_string())
            .collect()
    }

    /// Poll `/clusters` every 5 ms until `pred(members)`; when it held.
    pub async fn until(&self, limit: Duration, pred: impl Fn(&BTreeSet<String>) -> bool) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if pred(&self.members().await) {
                return Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }
}

fn bootstrap(admin_port: u16, dns_port: u16) -> String {
    format!(
        r#"node: {{ id: bench-peer, cluster: bench }}
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin_port} }} }}
static_resources:
  clusters:
    - name: {SERVICE}
      type: STRICT_DNS
      connect_timeout: 1s
      dns_lookup_family: V4_ONLY
      typed_dns_resolver_config:
        name: envoy.network.dns_resolver.cares
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig
          resolvers:
            - socket_address: {{ address: 127.0.0.1, port_value: {dns_port}, protocol: UDP }}
          dns_resolver_options: {{ no_default_search_domain: true }}
      load_assignment:
        cluster_name: {SERVICE}
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: {SERVICE}.service.consul, port_value: {PORT} }}
"#
    )
}
