//! The binary's glue: CLI, startup, the publisher task and shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use meshbridge_registries::Secret;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::admin::Auth;
use crate::cache::Cache;
use crate::config::DirSource;
use crate::kube::{KubeArgs, KubeSource, SourceOptions};
use crate::metrics::Metrics;
use crate::publish::PublishOptions;
use crate::reconcile::Reconciler;
use crate::translate::ConfigSet;
use crate::translate::gateway::GatewayOptions;
use crate::translate::ingress::IngressOptions;
use crate::xds::{AdsServer, Clients};

#[derive(Debug, Parser)]
#[command(name = "meshbridge", version, about = "Service registries to Istio MCP and Envoy ADS")]
pub struct Cli {
    #[arg(long, env = "MESHBRIDGE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Watch the registries described by a config source and serve xDS.
    Run(RunCommand),
}

/// `meshbridge run`: what [`App::start_with`] takes.
#[derive(Debug, Clone, clap::Args)]
pub struct RunCommand {
    #[command(flatten)]
    pub args: RunArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// How Ingresses are read and what the standalone Envoy gateway listens on.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayArgs {
    /// Only Ingresses of this class count; an empty value means all.
    #[arg(long, env = "MESHBRIDGE_INGRESS_CLASS", default_value = crate::translate::ingress::DEFAULT_INGRESS_CLASS)]
    pub ingress_class: String,
    /// Ports of the HTTP listeners served to Envoy over LDS (comma list).
    #[arg(long, env = "MESHBRIDGE_GATEWAY_HTTP_PORT", default_value = "80", value_delimiter = ',')]
    pub gateway_http_port: Vec<u16>,
    /// Port of the HTTPS listener, made when an Ingress TLS Secret is present.
    #[arg(long, env = "MESHBRIDGE_GATEWAY_HTTPS_PORT", default_value_t = 443)]
    pub gateway_https_port: u16,
    /// Namespace and name of the Istio Gateway that Ingresses are bound to.
    #[arg(long, env = "MESHBRIDGE_GATEWAY_NAMESPACE", default_value = "higress-system")]
    pub gateway_namespace: String,
    #[arg(long, env = "MESHBRIDGE_GATEWAY_NAME", default_value = "higress-gateway")]
    pub gateway_name: String,
}

impl Default for GatewayArgs {
    fn default() -> Self {
        GatewayArgs {
            ingress_class: crate::translate::ingress::DEFAULT_INGRESS_CLASS.into(),
            gateway_http_port: vec![80],
            gateway_https_port: 443,
            gateway_namespace: "higress-system".into(),
            gateway_name: "higress-gateway".into(),
        }
    }
}

impl GatewayArgs {
    fn publish_options(&self) -> PublishOptions {
        PublishOptions {
            ingress: IngressOptions {
                ingress_class: Some(self.ingress_class.clone()),
                gateway_namespace: self.gateway_namespace.clone(),
                gateway_name: self.gateway_name.clone(),
                known_secrets: Default::default(),
            },
            gateway: GatewayOptions { http_ports: self.gateway_http_port.clone(), https_port: self.gateway_https_port },
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Directory of YAML files (McpBridge, Ingress, Secret), watched for
    /// edits. Without it, --kube (or running in a pod) reads the API server.
    #[arg(long, env = "MESHBRIDGE_CONFIG_DIR")]
    pub config_dir: Option<PathBuf>,
    /// ADS / MCP gRPC listen address.
    #[arg(long, env = "MESHBRIDGE_XDS_ADDR", default_value = "0.0.0.0:15051")]
    pub xds_addr: SocketAddr,
    /// Admin HTTP listen address.
    #[arg(long, env = "MESHBRIDGE_ADMIN_ADDR", default_value = "127.0.0.1:8888")]
    pub admin_addr: SocketAddr,
}

impl RunArgs {
    /// Free loopback ports for xDS and admin: how tests run meshbridge.
    pub fn loopback(config_dir: impl Into<PathBuf>) -> RunArgs {
        RunArgs {
            config_dir: Some(config_dir.into()),
            xds_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

/// Admin API options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AdminArgs {
    /// Bearer token for the admin API. Required (for all but /ready and
    /// /healthz) when --admin-addr is not a loopback address; enforced
    /// whenever set.
    #[arg(long, env = "MESHBRIDGE_ADMIN_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub admin_token: Option<Secret>,
}

fn parse_secret(s: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(s))
}

pub async fn main(cli: Cli) -> anyhow::Result<()> {
    init_tracing(cli.log_format);
    let Command::Run(cmd) = cli.command;
    let args = &cmd.args;
    info!(config_dir = ?args.config_dir, kube = ?cmd.kube, xds_addr = %args.xds_addr, admin_addr = %args.admin_addr, gateway = ?cmd.gateway, "starting meshbridge");
    let app = App::launch(cmd).await?;
    shutdown_signal().await;
    info!("shutting down");
    app.stop().await;
    Ok(())
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("install SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// A running meshbridge. Tests start one in-process on port 0.
pub struct App {
    pub xds_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub cache: Arc<Cache>,
    pub config: watch::Receiver<Arc<ConfigSet>>,
    pub clients: Arc<Clients>,
    pub metrics: Arc<Metrics>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Kubernetes mode's leader flag and observations; `None` otherwise.
    pub kube: Option<Arc<KubeSource>>,
    _source: Option<DirSource>,
}

impl App {
    /// Start with default admin options (no token).
    pub async fn start(args: RunArgs) -> anyhow::Result<App> {
        App::start_with(args, AdminArgs::default()).await
    }

    /// Start with these admin options and default gateway options.
    pub async fn start_with(args: RunArgs, admin: AdminArgs) -> anyhow::Result<App> {
        App::launch(RunCommand { args, admin, gateway: GatewayArgs::default(), kube: KubeArgs::default() }).await
    }

    pub async fn launch(cmd: RunCommand) -> anyhow::Result<App> {
        let RunCommand { args, admin, gateway, kube } = cmd;
        let cache = Cache::new();
        let (source, kube, mut desired) = match &args.config_dir {
            Some(dir) if !kube.kube => {
                let (source, desired) =
                    DirSource::start(dir.clone()).await.with_context(|| format!("config dir {}", dir.display()))?;
                (Some(source), None, desired)
            }
            _ if kube.kube || crate::kube::in_cluster() => {
                let reserved = gateway.gateway_http_port.iter().copied().chain([gateway.gateway_https_port]).collect();
                let opts = SourceOptions {
                    args: kube,
                    ingress_class: gateway.ingress_class.clone(),
                    reserved_ports: reserved,
                };
                let (source, desired) = KubeSource::start(opts, cache.clone()).await?;
                (None, Some(Arc::new(source)), desired)
            }
            _ => anyhow::bail!("no config source: give --config-dir, or --kube to read the Kubernetes API"),
        };
        let clients = Clients::new();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // Reconciler: desired registries → watcher tasks.
        let mut reconciler = Reconciler::new(cache.clone());
        let first = desired.borrow_and_update().clone();
        log_desired(&first);
        reconciler.apply(&first.registries);
        let config = crate::publish::spawn(&cache, desired.clone(), gateway.publish_options(), &mut tasks);
        tasks.push(tokio::spawn(async move {
            while desired.changed().await.is_ok() {
                let d = desired.borrow_and_update().clone();
                log_desired(&d);
                reconciler.apply(&d.registries);
            }
        }));

        let xds_listener =
            TcpListener::bind(args.xds_addr).await.with_context(|| format!("bind xds {}", args.xds_addr))?;
        let xds_addr = xds_listener.local_addr()?;
        let ads = AdsServer::new(config.clone(), clients.clone());
        let stop = wait_true(shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = ads.serve(xds_listener, stop).await {
                error!(error = %e, "xds server failed");
            }
        }));

        let admin_listener =
            TcpListener::bind(args.admin_addr).await.with_context(|| format!("bind admin {}", args.admin_addr))?;
        let admin_addr = admin_listener.local_addr()?;
        let auth = Auth::new(admin_addr, admin.admin_token);
        if matches!(auth, Auth::Unconfigured) {
            warn!(
                %admin_addr,
                "admin API on a non-loopback address without --admin-token: \
                 every endpoint but /ready and /healthz answers 401 until a token is set"
            );
        }
        let metrics = Arc::new(Metrics::new(cache.clone(), clients.clone(), config.clone()));
        let router = crate::admin::router(crate::admin::AdminState {
            cache: cache.clone(),
            config: config.clone(),
            clients: clients.clone(),
            metrics: metrics.clone(),
            auth,
        });
        let stop = wait_true(shutdown_rx);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(admin_listener, router).with_graceful_shutdown(stop).await {
                error!(error = %e, "admin server failed");
            }
        }));
        info!(%xds_addr, %admin_addr, "serving");
        Ok(App { xds_addr, admin_addr, cache, config, clients, metrics, shutdown, tasks, kube, _source: source })
    }

    pub async fn stop(self) {
        if let Some(kube) = &self.kube {
            kube.release().await;
        }
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The config source already warned about each problem; this logs what is
/// in force. Specs redact their secrets in Debug.
fn log_desired(d: &crate::config::Desired) {
    info!(registries = ?d.registries, problems = d.errors.len(), "effective config");
}

async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use clap::Parser;
    use meshbridge_registries::{RegistryKind, RegistrySpec, Secret};

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn effective_config_log_redacts_secrets() {
        let mut spec = RegistrySpec::new(RegistryKind::Nacos2, "n", "127.0.0.1", 8848);
        spec.auth.insert("nacosUsername".into(), Secret::new("user-6b1f"));
        spec.auth.insert("nacosPassword".into(), Secret::new("pw-6b1f"));
        spec.auth.insert("consulToken".into(), Secret::new("tok-6b1f"));
        spec.nacos_access_key = Some(Secret::new("ak-6b1f"));
        spec.nacos_secret_key = Some(Secret::new("sk-6b1f"));
        let desired = crate::config::Desired { registries: vec![spec], ..Default::default() };

        let buf = Buffer::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || log_desired(&desired));
        let logged = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(logged.contains("effective config") && logged.contains("<redacted>"), "{logged}");
        assert!(!logged.contains("6b1f"), "a secret was logged: {logged}");
    }

    #[test]
    fn admin_token_is_never_shown() {
        let cli =
            Cli::try_parse_from(["meshbridge", "run", "--config-dir", "/tmp", "--admin-token", "tok-93c2"]).unwrap();
        let Command::Run(run) = &cli.command;
        assert_eq!(run.admin.admin_token.as_ref().map(Secret::expose), Some("tok-93c2"));
        assert!(!format!("{cli:?}").contains("tok-93c2"));
    }
}
