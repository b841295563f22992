//! Kubernetes mode's flags, constants, errors and options: the leaf the
//! source (`mod.rs`) and its parts (watch, status, leader, ports) share.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::Client;

use crate::time::parse_duration;

/// `networking.higress.io/v1` `McpBridge`, as Higress's CRD names it.
pub const MCPBRIDGE_GROUP: &str = "networking.higress.io";
pub const MCPBRIDGE_VERSION: &str = "v1";
pub const MCPBRIDGE_KIND: &str = "McpBridge";
pub const MCPBRIDGE_PLURAL: &str = "mcpbridges";
/// The McpBridge Higress reads when nothing widens the selection.
pub const DEFAULT_MCPBRIDGE: &str = "default";

/// `meshbridge run --kube` options.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Read McpBridges, Ingresses and Secrets from the Kubernetes API. The
    /// default inside a pod when --config-dir is not given.
    #[arg(long, env = "MESHBRIDGE_KUBE", conflicts_with = "config_dir")]
    pub kube: bool,
    /// Namespace of the McpBridges (and of the leader-election Lease).
    #[arg(long, env = "MESHBRIDGE_NAMESPACE", default_value = "higress-system")]
    pub namespace: String,
    /// Read the McpBridges in --namespace matching this label selector
    /// instead of only the one named `default`.
    #[arg(long, env = "MESHBRIDGE_MCPBRIDGE_SELECTOR", conflicts_with = "all_mcpbridges")]
    pub mcpbridge_selector: Option<String>,
    /// Read every McpBridge in --namespace instead of only `default`.
    #[arg(long, env = "MESHBRIDGE_ALL_MCPBRIDGES")]
    pub all_mcpbridges: bool,
    /// Read Ingresses (and their TLS Secrets) in this namespace only; all
    /// namespaces when unset.
    #[arg(long, env = "MESHBRIDGE_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// Elect a leader with a Lease; only the leader writes status and
    /// listener ports. Default: on inside a pod, off elsewhere.
    #[arg(long, env = "MESHBRIDGE_LEADER_ELECT", num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: Option<bool>,
    /// Name of the Lease in --namespace.
    #[arg(long, env = "MESHBRIDGE_LEADER_LEASE", default_value = "meshbridge")]
    pub leader_lease: String,
    /// This replica's identity in the Lease. Default: $POD_NAME, else $HOSTNAME.
    #[arg(long, env = "MESHBRIDGE_LEADER_IDENTITY")]
    pub leader_identity: Option<String>,
    /// How long a Lease holds without renewal (`15s`, `500ms`).
    #[arg(long, env = "MESHBRIDGE_LEADER_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_lease_duration: Duration,
    /// The leader stops writing when it could not renew for this long.
    #[arg(long, env = "MESHBRIDGE_LEADER_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_renew_deadline: Duration,
    /// How often the Lease is tried or renewed.
    #[arg(long, env = "MESHBRIDGE_LEADER_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_retry_period: Duration,
    /// At most one status write per McpBridge this often.
    #[arg(long, env = "MESHBRIDGE_STATUS_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub status_interval: Duration,
    /// API server URL, instead of in-cluster config or KUBECONFIG; plain
    /// `http://` works (`kubectl proxy`, tests).
    #[arg(long, env = "MESHBRIDGE_KUBE_API_URL", conflicts_with = "kubeconfig")]
    pub kube_api_url: Option<String>,
    /// A kubeconfig file (its current context), instead of in-cluster
    /// config or $KUBECONFIG.
    #[arg(long, env = "MESHBRIDGE_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Give up starting when the first list of every resource has not
    /// completed in this time.
    #[arg(long, env = "MESHBRIDGE_KUBE_SYNC_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub kube_sync_timeout: Duration,
    /// How often each Secret that config references is read again, by
    /// name: a rotated certificate or token is seen within this time.
    /// Secrets are never listed or watched.
    #[arg(long, env = "MESHBRIDGE_SECRET_RESYNC_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub secret_resync_interval: Duration,
    /// Read the Services that Ingress backends name, and their
    /// EndpointSlices, for the standalone gateway (`false`: such backends
    /// answer 503 there; istiod reads Services itself either way).
    #[arg(
        long,
        env = "MESHBRIDGE_KUBE_SERVICE_ENDPOINTS",
        default_value_t = true,
        num_args = 0..=1,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub kube_service_endpoints: bool,
}

impl Default for KubeArgs {
    fn default() -> Self {
        KubeArgs {
            kube: false,
            namespace: "higress-system".into(),
            mcpbridge_selector: None,
            all_mcpbridges: false,
            watch_namespace: None,
            leader_elect: None,
            leader_lease: "meshbridge".into(),
            leader_identity: None,
            leader_lease_duration: Duration::from_secs(15),
            leader_renew_deadline: Duration::from_secs(10),
            leader_retry_period: Duration::from_secs(2),
            status_interval: Duration::from_secs(5),
            kube_api_url: None,
            kubeconfig: None,
            kube_sync_timeout: Duration::from_secs(60),
            secret_resync_interval: crate::kube::secrets::SECRET_RESYNC,
            kube_service_endpoints: true,
        }
    }
}

impl KubeArgs {
    /// Kubernetes mode against `url` (a fake API server or `kubectl proxy`).
    pub fn at(url: impl Into<String>) -> KubeArgs {
        KubeArgs { kube: true, kube_api_url: Some(url.into()), ..KubeArgs::default() }
    }

    /// Kubernetes mode with the current context of this kubeconfig file.
    pub fn with_kubeconfig(path: impl Into<std::path::PathBuf>) -> KubeArgs {
        KubeArgs { kube: true, kubeconfig: Some(path.into()), ..KubeArgs::default() }
    }
}

/// Whether this process runs in a pod (the API server's env is injected).
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

/// Errors of Kubernetes mode.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// Neither --kube-api-url, --kubeconfig, a kubeconfig file nor in-cluster
    /// config gave a usable API server config.
    #[error("kubernetes client config: {0}")]
    Config(String),
    /// The client could not be built (TLS, proxy settings).
    #[error("kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The first list of a resource did not complete in time.
    #[error("kubernetes: {resource} not listed within {timeout:?} (check RBAC and the API server)")]
    SyncTimeout { resource: &'static str, timeout: Duration },
}

/// A kube client for `args`: --kube-api-url, else --kubeconfig, else what
/// kube-rs infers (`Config::infer`: KUBECONFIG or `~/.kube/config` if
/// present, then the pod's service account). TLS is rustls with ring, the
/// binary's one provider.
pub async fn client(args: &KubeArgs) -> Result<Client, KubeError> {
    let config = match (&args.kube_api_url, &args.kubeconfig) {
        (Some(url), _) => {
            let uri = url.parse().map_err(|e| KubeError::Config(format!("--kube-api-url {url:?}: {e}")))?;
            let mut config = kube::Config::new(uri);
            config.default_namespace = args.namespace.clone();
            config
        }
        (None, Some(path)) => {
            let bad = |e: &dyn std::fmt::Display| KubeError::Config(format!("--kubeconfig {}: {e}", path.display()));
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(&e))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| bad(&e))?
        }
        (None, None) => kube::Config::infer().await.map_err(|e| KubeError::Config(e.to_string()))?,
    };
    Client::try_from(config).map_err(KubeError::Client)
}

/// What the Kubernetes source needs from the rest of the binary.
pub struct SourceOptions {
    pub args: KubeArgs,
    /// `--ingress-class`: Ingresses of this class are read.
    pub ingress_class: String,
    /// Gateway listener ports, never given to proxies.
    pub reserved_ports: BTreeSet<u16>,
    /// `--anti-entropy-interval`, set on every registry.
    pub anti_entropy_interval: Option<std::time::Duration>,
}
