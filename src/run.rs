//! The binary's glue: CLI, startup, the publisher task and shutdown.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use meshbridge_registries::Secret;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::admin::{AdminLimits, Auth};
use crate::cache::Cache;
use crate::config::DirSource;
use crate::dump::{Dumper, StateDir};
use crate::kube::{KubeArgs, KubeSource, SourceOptions};
use crate::lifecycle::LifecycleArgs;
use crate::metrics::Metrics;
pub use crate::publish::GatewayArgs;
use crate::publish::Published;
use crate::time::parse_duration;
use crate::xds::{AdsServer, Clients, XdsLimits, XdsTls};

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
    Run(Box<RunCommand>),
    /// Validate config offline (directories, YAML files, or `-` for stdin)
    /// and print its errors and warnings, as `/v1/config` would list them.
    Check(crate::check::CheckCommand),
    /// Print the Istio objects meshbridge would send istiod for a config
    /// and, optionally, a --state-dir snapshot of the registries.
    Translate(crate::translate_cli::TranslateCommand),
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
    pub lifecycle: LifecycleArgs,
    #[command(flatten)]
    pub xds: XdsLimits,
    #[command(flatten)]
    pub kube: KubeArgs,
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
    /// Floor for `nacosRefreshInterval` / `consulRefreshInterval` (e.g. `10s`,
    /// `500ms`). Higress's is 10s; lower it only for tests that need fast
    /// full resyncs.
    #[arg(long, env = "MESHBRIDGE_MIN_REFRESH_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub min_refresh_interval: Duration,
    /// TCP connections each Consul registry may hold to Consul (default 10;
    /// a lower value than 5 is raised to 5). Consul allows 200 per client
    /// address by default, shared with every other client on the host.
    #[arg(long, env = "MESHBRIDGE_CONSUL_MAX_CONNS")]
    pub consul_max_conns: Option<usize>,
    /// How often each registry's anti-entropy pass reads the whole registry
    /// and repairs what the change detectors missed (e.g. `5m`, `90s`; at
    /// least 1s). Its reads are spread over the interval.
    #[arg(long, env = "MESHBRIDGE_ANTI_ENTROPY_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub anti_entropy_interval: Duration,
}

impl RunArgs {
    /// Free loopback ports for xDS and admin: how tests run meshbridge.
    pub fn loopback(config_dir: impl Into<PathBuf>) -> RunArgs {
        RunArgs {
            config_dir: Some(config_dir.into()),
            xds_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            min_refresh_interval: crate::config::MIN_REFRESH_INTERVAL,
            consul_max_conns: None,
            anti_entropy_interval: meshbridge_registries::repair::DEFAULT_INTERVAL,
        }
    }

    /// The same, with every registry's anti-entropy pass every `interval`.
    pub fn with_anti_entropy_interval(self, interval: Duration) -> RunArgs {
        RunArgs { anti_entropy_interval: interval, ..self }
    }

    /// The same, with refresh intervals allowed down to `floor`.
    pub fn with_min_refresh_interval(self, floor: Duration) -> RunArgs {
        RunArgs { min_refresh_interval: floor, ..self }
    }
}

/// Admin API options.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// Bearer token for the admin API. Required (for all but /ready and
    /// /healthz) when --admin-addr is not a loopback address; enforced
    /// whenever set. A flag's value is visible to every local user in `ps`:
    /// prefer --admin-token-file or the environment variable.
    #[arg(long, env = "MESHBRIDGE_ADMIN_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub admin_token: Option<Secret>,
    /// File holding the admin bearer token (surrounding whitespace ignored),
    /// e.g. a mounted Kubernetes Secret; read at startup.
    #[arg(long, env = "MESHBRIDGE_ADMIN_TOKEN_FILE", conflicts_with = "admin_token")]
    pub admin_token_file: Option<PathBuf>,
    /// Time a client has to send a complete request head.
    #[arg(long, env = "MESHBRIDGE_ADMIN_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub admin_header_timeout: std::time::Duration,
    /// Admin connections open at once; more are closed on accept.
    #[arg(long, env = "MESHBRIDGE_ADMIN_MAX_CONNECTIONS", default_value_t = 128)]
    pub admin_max_connections: usize,
}

impl Default for AdminArgs {
    fn default() -> Self {
        let limits = AdminLimits::default();
        AdminArgs {
            admin_token: None,
            admin_token_file: None,
            admin_header_timeout: limits.header_read_timeout,
            admin_max_connections: limits.max_connections,
        }
    }
}

/// Why the admin token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("--admin-token-file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    /// The file is larger than a token can be.
    #[error("--admin-token-file {path}: larger than {max} bytes, not a token")]
    TooLarge { path: String, max: u64 },
    /// The file holds nothing but whitespace.
    #[error("--admin-token-file {path}: empty")]
    Empty { path: String },
}

impl AdminArgs {
    /// The token from `--admin-token` or `--admin-token-file`. The file's
    /// content never appears in an error.
    pub fn token(&self) -> Result<Option<Secret>, TokenError> {
        const MAX: u64 = 4096;
        let Some(path) = &self.admin_token_file else { return Ok(self.admin_token.clone()) };
        let shown = path.display().to_string();
        let read = |e| TokenError::Read { path: shown.clone(), source: e };
        let len = std::fs::metadata(path).map_err(read)?.len();
        if len > MAX {
            return Err(TokenError::TooLarge { path: shown, max: MAX });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        match text.trim() {
            "" => Err(TokenError::Empty { path: shown }),
            t => Ok(Some(Secret::new(t))),
        }
    }

    pub fn limits(&self) -> AdminLimits {
        AdminLimits { header_read_timeout: self.admin_header_timeout, max_connections: self.admin_max_connections }
    }
}

fn parse_secret(s: &str) -> Result<Secret, std::convert::Infallible> {
    Ok(Secret::new(s))
}

pub async fn main(cli: Cli) -> anyhow::Result<()> {
    init_tracing(cli.log_format);
    let cmd = match cli.command {
        Command::Run(cmd) => *cmd,
        Command::Check(check) => std::process::exit(crate::check::main(&check)),
        Command::Translate(t) => std::process::exit(crate::translate_cli::main(&t)),
    };
    let args = &cmd.args;
    let source = match &args.config_dir {
        Some(dir) => format!("config from {}", dir.display()),
        None => format!("config from Kubernetes (McpBridges in namespace {})", cmd.kube.namespace),
    };
    info!(
        "starting meshbridge {}: {source}; xDS on {}, admin API on {}",
        env!("CARGO_PKG_VERSION"),
        args.xds_addr,
        args.admin_addr
    );
    debug!(config_dir = ?args.config_dir, kube = ?cmd.kube, gateway = ?cmd.gateway, lifecycle = ?cmd.lifecycle, "settings");
    if args.min_refresh_interval != crate::config::MIN_REFRESH_INTERVAL {
        warn!(min_refresh_interval = ?args.min_refresh_interval, "the refresh-interval floor is changed (meant for tests)");
    }
    let app = App::launch(cmd).await?;
    shutdown_signal().await;
    app.shutdown().await;
    Ok(())
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        // Colour codes only for a person at a terminal, never in files or pipes.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
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
    pub config: watch::Receiver<Arc<Published>>,
    pub clients: Arc<Clients>,
    pub metrics: Arc<Metrics>,
    dumper: Option<Arc<Dumper>>,
    drain: std::time::Duration,
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
        App::launch(RunCommand {
            args,
            admin,
            gateway: GatewayArgs::default(),
            lifecycle: LifecycleArgs::default(),
            xds: XdsLimits::default(),
            kube: KubeArgs::default(),
        })
        .await
    }

    pub async fn launch(cmd: RunCommand) -> anyhow::Result<App> {
        let RunCommand { args, admin, gateway, lifecycle, xds, kube } = cmd;
        // Before anything starts: a bad file is a startup error.
        let xds_tls = XdsTls::load(&xds.tls).context("xds TLS")?;
        let cache = Cache::new();
        let (source, kube, desired) = match &args.config_dir {
            Some(dir) if !kube.kube => {
                let builder = crate::config::Builder::with_min_refresh_interval(args.min_refresh_interval)
                    .with_consul_max_conns(args.consul_max_conns)
                    .with_anti_entropy_interval(Some(args.anti_entropy_interval));
                let (source, desired) = DirSource::start_with_builder(dir.clone(), builder)
                    .await
                    .with_context(|| format!("config dir {}", dir.display()))?;
                (Some(source), None, desired)
            }
            _ if kube.kube || crate::kube::in_cluster() => {
                let reserved = gateway.gateway_http_port.iter().copied().chain([gateway.gateway_https_port]).collect();
                let opts = SourceOptions {
                    args: kube,
                    ingress_class: gateway.ingress_class.clone(),
                    reserved_ports: reserved,
                    anti_entropy_interval: Some(args.anti_entropy_interval),
                };
                let (source, desired) = KubeSource::start(opts, cache.clone()).await?;
                (None, Some(Arc::new(source)), desired)
            }
            _ => anyhow::bail!("no config source: give --config-dir, or --kube to read the Kubernetes API"),
        };
        let clients = Clients::new();
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = Vec::new();

        // The dump goes in before any watcher can answer (its answer then
        // replaces it) and before the publisher's first set.
        let dumper = match &lifecycle.state_dir {
            Some(dir) => {
                let dir = StateDir::open(dir).with_context(|| format!("state dir {}", dir.display()))?;
                let keys: Vec<_> = desired
                    .borrow()
                    .registries
                    .iter()
                    .map(|r| crate::cache::RegistryKey::new(r.kind, r.name.clone()))
                    .collect();
                dir.load_into(&cache, &keys);
                let dumper = Dumper::new(dir, cache.clone());
                tasks.push(dumper.spawn(crate::dump::DEFAULT_INTERVAL));
                Some(dumper)
            }
            None => None,
        };
        // Reconciler: desired registries → watcher tasks; publisher: cache
        // and desired → the config set.
        crate::reconcile::spawn(&cache, desired.clone(), log_desired, &mut tasks);
        let gate = crate::startup::StartupGate::new(lifecycle.initial_sync_timeout);
        let config = crate::publish::spawn(&cache, desired.clone(), gateway.publish_options(), gate, &mut tasks);
        if let Some(max_stale) = lifecycle.max_stale {
            tasks.push(crate::staleness::spawn(cache.clone(), max_stale));
        }

        let xds_listener =
            TcpListener::bind(args.xds_addr).await.with_context(|| format!("bind xds {}", args.xds_addr))?;
        let xds_addr = xds_listener.local_addr()?;
        debug!(limits = ?xds, "xds limits");
        log_xds_transport(xds_addr, xds_tls.as_deref());
        tasks.extend(xds_tls.as_ref().and_then(|t| t.spawn_reloader()));
        let ads = AdsServer::with_limits(config.clone(), clients.clone(), xds).with_tls(xds_tls);
        let stop = wait_true(shutdown_rx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = ads.serve(xds_listener, stop).await {
                error!(error = %e, "xds server failed");
            }
        }));

        let admin_limits = admin.limits();
        let admin_listener =
            TcpListener::bind(args.admin_addr).await.with_context(|| format!("bind admin {}", args.admin_addr))?;
        let admin_addr = admin_listener.local_addr()?;
        let auth = Auth::new(admin_addr, admin.token()?);
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
            if let Err(e) = crate::admin::serve(admin_listener, router, admin_limits, stop).await {
                error!(error = %e, "admin server failed");
            }
        }));
        info!(%xds_addr, %admin_addr, "serving");
        Ok(App {
            xds_addr,
            admin_addr,
            cache,
            config,
            clients,
            metrics,
            dumper,
            kube,
            drain: lifecycle.drain,
            shutdown,
            tasks,
            _source: source,
        })
    }

    /// Graceful shutdown (see [`crate::lifecycle`]): not ready and no new
    /// streams, existing streams served for the drain period (or until
    /// they leave), dump flushed, then stop.
    pub async fn shutdown(self) {
        self.clients.start_draining();
        let streams = self.clients.snapshot().len();
        info!(
            drain_s = self.drain.as_secs_f64(),
            streams, "shutting down: not ready, refusing new xDS streams, draining"
        );
        let deadline = tokio::time::Instant::now() + self.drain;
        while tokio::time::Instant::now() < deadline && !self.clients.snapshot().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        if let Some(d) = &self.dumper {
            let written = d.flush().await;
            info!(written, "state dump flushed");
        }
        let left = self.clients.snapshot().len();
        info!(streams = left, "closing remaining streams; bye");
        self.stop().await;
    }

    pub async fn stop(self) {
        if let Some(kube) = &self.kube {
            kube.release().await;
        }
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
        // Wait for them to go, so that the listeners are closed (and the
        // ports free for a successor) when this returns.
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// The config source already warned about each problem; this logs what is
/// in force. Specs redact their secrets in Debug.
/// Say who will get private keys (see `xds::auth`).
fn log_xds_transport(addr: SocketAddr, tls: Option<&XdsTls>) {
    let mode = tls.map_or("plaintext", XdsTls::mode);
    if mode.starts_with("mtls") || crate::xds::auth::is_loopback(addr.ip()) {
        info!(%addr, mode, "xds transport");
    } else {
        warn!(
            %addr,
            mode,
            "xds transport: clients are not authenticated (no --xds-client-ca), so only loopback \
             clients get Secrets (TLS private keys); other clients' HTTPS listeners will not serve"
        );
    }
}

fn log_desired(d: &crate::config::Desired) {
    info!("config in force: {}", d.summary());
    debug!(registries = ?d.registries, "effective config");
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
    fn admin_token_file_is_read_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "tok-file-71c4\n").unwrap();
        let file = path.to_str().unwrap();
        let cli =
            Cli::try_parse_from(["meshbridge", "run", "--config-dir", "/tmp", "--admin-token-file", file]).unwrap();
        let Command::Run(run) = &cli.command else { panic!("not run") };
        assert_eq!(run.admin.token().unwrap().as_ref().map(Secret::expose), Some("tok-file-71c4"));
        assert_eq!(run.admin.limits().max_connections, 128);

        std::fs::write(&path, "  \n").unwrap();
        assert!(matches!(run.admin.token(), Err(TokenError::Empty { .. })));
        std::fs::write(&path, "x".repeat(5000)).unwrap();
        let err = run.admin.token().unwrap_err().to_string();
        assert!(err.contains("larger than 4096 bytes") && !err.contains("xxxx"), "{err}");
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(run.admin.token(), Err(TokenError::Read { .. })));
        let both = ["meshbridge", "run", "--config-dir", "/tmp", "--admin-token", "t", "--admin-token-file", file];
        assert!(Cli::try_parse_from(both).is_err(), "the two are exclusive");
    }

    #[test]
    fn admin_token_is_never_shown() {
        let cli =
            Cli::try_parse_from(["meshbridge", "run", "--config-dir", "/tmp", "--admin-token", "tok-93c2"]).unwrap();
        let Command::Run(run) = &cli.command else { panic!("not run") };
        assert_eq!(run.admin.admin_token.as_ref().map(Secret::expose), Some("tok-93c2"));
        assert!(!format!("{cli:?}").contains("tok-93c2"));
    }
}
