//! Start and stop: the options that decide what a restart or a registry
//! outage costs (`--state-dir`, `--initial-sync-timeout`, `--max-stale`,
//! `--drain`), and the graceful shutdown sequence.
//!
//! Shutdown, on SIGTERM or Ctrl-C ([`crate::run::App::shutdown`]):
//! 1. `/ready` turns 503 and new xDS streams get UNAVAILABLE, so a load
//!    balancer and reconnecting clients move to another replica;
//! 2. existing streams keep being served (config changes included) for up
//!    to `--drain`, or until the last one disconnects;
//! 3. the state dump is flushed;
//! 4. the remaining streams are closed and the process exits 0.
//!
//! In Kubernetes, give the pod a `terminationGracePeriodSeconds` longer than
//! the drain, or the kubelet's SIGKILL cuts it short.

use std::path::PathBuf;
use std::time::Duration;

/// Lifecycle options of `meshbridge run`.
#[derive(Debug, Clone, clap::Args)]
pub struct LifecycleArgs {
    /// Directory where each registry's last answered services are kept, and
    /// loaded from at start (warm restart during a registry outage). Unset:
    /// nothing is kept.
    #[arg(long, env = "MESHBRIDGE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// How long xDS/MCP clients wait at start for every registry's first
    /// sync (or its dump) before being sent an incomplete config.
    #[arg(long, env = "MESHBRIDGE_INITIAL_SYNC_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub initial_sync_timeout: Duration,
    /// Withdraw a registry's endpoints once it has been unreachable this
    /// long. Unset (the default): keep the last known endpoints forever.
    #[arg(long, env = "MESHBRIDGE_MAX_STALE", value_parser = parse_duration)]
    pub max_stale: Option<Duration>,
    /// On SIGTERM, how long existing xDS streams keep being served.
    #[arg(long, env = "MESHBRIDGE_DRAIN", default_value = "5s", value_parser = parse_duration)]
    pub drain: Duration,
}

impl Default for LifecycleArgs {
    fn default() -> Self {
        LifecycleArgs {
            state_dir: None,
            initial_sync_timeout: Duration::from_secs(30),
            max_stale: None,
            drain: Duration::from_secs(5),
        }
    }
}

use crate::time::parse_duration;
