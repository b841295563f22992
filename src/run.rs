//! The binary's glue: CLI, startup, the publisher task and shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info};

use crate::cache::Cache;
use crate::config::DirSource;
use crate::reconcile::Reconciler;
use crate::translate::{self, ConfigSet};
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
    Run(RunArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Directory of YAML files (McpBridge, Ingress, Secret), watched for edits.
    #[arg(long, env = "MESHBRIDGE_CONFIG_DIR")]
    pub config_dir: PathBuf,
    /// ADS / MCP gRPC listen address.
    #[arg(long, env = "MESHBRIDGE_XDS_ADDR", default_value = "0.0.0.0:15051")]
    pub xds_addr: SocketAddr,
    /// Admin HTTP listen address.
    #[arg(long, env = "MESHBRIDGE_ADMIN_ADDR", default_value = "127.0.0.1:8888")]
    pub admin_addr: SocketAddr,
}

pub async fn main(cli: Cli) -> anyhow::Result<()> {
    init_tracing(cli.log_format);
    let Command::Run(args) = cli.command;
    info!(config_dir = %args.config_dir.display(), xds_addr = %args.xds_addr, admin_addr = %args.admin_addr, "starting meshbridge");
    let app = App::start(args).await?;
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
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _source: DirSource,
}

impl App {
    pub async fn start(args: RunArgs) -> anyhow::Result<App> {
        let (source, mut desired) = DirSource::start(args.config_dir.clone())
            .await
            .with_context(|| format!("config dir {}", args.config_dir.display()))?;
        let cache = Cache::new();
        let clients = Clients::new();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // Reconciler: desired registries → watcher tasks.
        let mut reconciler = Reconciler::new(cache.clone());
        let first = desired.borrow_and_update().clone();
        log_desired(&first);
        reconciler.apply(&first.registries);
        tasks.push(tokio::spawn(async move {
            while desired.changed().await.is_ok() {
                let d = desired.borrow_and_update().clone();
                log_desired(&d);
                reconciler.apply(&d.registries);
            }
        }));

        let config = spawn_publisher(&cache, &mut tasks);

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
        let router = crate::admin::router(crate::admin::AdminState {
            cache: cache.clone(),
            config: config.clone(),
            clients: clients.clone(),
        });
        let stop = wait_true(shutdown_rx);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(admin_listener, router).with_graceful_shutdown(stop).await {
                error!(error = %e, "admin server failed");
            }
        }));
        info!(%xds_addr, %admin_addr, "serving");
        Ok(App { xds_addr, admin_addr, cache, config, clients, shutdown, tasks, _source: source })
    }

    pub async fn stop(self) {
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

/// Translate the cache into a config set whenever it changes. The watch
/// channel coalesces bursts: we always translate the newest state.
fn spawn_publisher(cache: &Arc<Cache>, tasks: &mut Vec<JoinHandle<()>>) -> watch::Receiver<Arc<ConfigSet>> {
    let mut changes = cache.subscribe();
    let (tx, rx) = watch::channel(Arc::new(translate::config_set(&cache.view())));
    let cache = cache.clone();
    tasks.push(tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            changes.borrow_and_update();
            let set = translate::config_set(&cache.view());
            for w in &set.warnings {
                tracing::debug!(warning = %w, "translation");
            }
            tx.send_replace(Arc::new(set));
        }
    }));
    rx
}
