//! Kubernetes mode: McpBridges, Ingresses and Secrets read from the API
//! server instead of a directory, feeding the same [`Desired`] channel, so
//! the reconciler, translation and xDS serving are the ones the directory
//! source uses.
//!
//! - [`watch`]: reflectors (kube-rs `watcher` with `default_backoff`) on
//!   McpBridge, Ingress and IngressClass; every change rebuilds the
//!   documents and runs them through `config::Builder`.
//! - [`secrets`]: the Secrets those reference, each read by name (`get`),
//!   never listed or watched.
//! - [`status`]: the leader writes `McpBridge.status` with server-side apply.
//! - [`leader`]: a `coordination.k8s.io/v1` Lease decides the leader.
//! - [`ports`]: the leader pins assigned proxy listener ports into the spec.
//! - [`services`]: the Services Ingress backends name, with endpoints from
//!   their EndpointSlices, for the standalone gateway (every replica).
//!
//! Every replica watches and serves xDS; only the leader writes.

mod args;
mod crd;
mod leader;
mod ports;
pub mod secrets;
pub mod services;
mod status;
mod watch;

#[cfg(test)]
mod kube_tests;

use std::sync::Arc;

use tokio::sync::watch as channel;
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span};

use crate::cache::Cache;
use crate::config::Desired;

pub use args::{
    DEFAULT_MCPBRIDGE, KubeArgs, KubeError, MCPBRIDGE_GROUP, MCPBRIDGE_KIND, MCPBRIDGE_PLURAL, MCPBRIDGE_VERSION,
    SourceOptions, client, in_cluster,
};
pub use crd::{CrdFields, HIGRESS_CRD_PRUNES, crd_name, pruned_fields};
pub use leader::{LeaderConfig, LeaderElector};
pub use status::{BridgeStatus, FIELD_MANAGER, bridge_status, with_fields_condition};
pub use watch::{Observed, ObservedBridge};

/// The running Kubernetes source. Dropping it stops its watches, the
/// election and the writers.
pub struct KubeSource {
    tasks: Vec<JoinHandle<()>>,
    /// The election task and what [`KubeSource::release`] needs.
    elector: Option<(JoinHandle<()>, kube::Api<k8s_openapi::api::coordination::v1::Lease>, LeaderConfig)>,
    /// Whether this replica currently writes status and ports.
    pub leader: channel::Receiver<bool>,
    /// The McpBridges as last observed, with the config built from them.
    pub observed: channel::Receiver<Arc<Observed>>,
}

impl KubeSource {
    /// Connect, wait for the first list of every watched resource, and
    /// start the election and the writers.
    pub async fn start(
        opts: SourceOptions,
        cache: Arc<Cache>,
    ) -> Result<(KubeSource, channel::Receiver<Arc<Desired>>), KubeError> {
        let client = client(&opts.args).await?;
        let args = &opts.args;
        let mut tasks = Vec::new();
        let (desired, observed) = watch::start(client.clone(), &opts, &mut tasks).await?;
        if args.kube_service_endpoints {
            services::prepare(&cache, &desired.borrow());
            let span = info_span!("services");
            tasks.push(tokio::spawn(services::run(client.clone(), cache.clone(), desired.clone()).instrument(span)));
        }

        let elect = args.leader_elect.unwrap_or_else(in_cluster);
        let mut election = None;
        let leader = if elect {
            let config = LeaderConfig::from_args(args);
            info!(lease = %config.lease, identity = %config.identity, "leader election on");
            let (elector, rx) = LeaderElector::new(client.clone(), config.clone());
            let api = elector.api();
            election = Some((tokio::spawn(elector.run().instrument(info_span!("leader"))), api, config));
            rx
        } else {
            info!("leader election off: this replica writes status");
            // The sender lives in a task that never ends, so `true` stays.
            let (tx, rx) = channel::channel(true);
            tasks.push(tokio::spawn(async move { tx.closed().await }));
            rx
        };

        let fields = crd::check(&client).await;
        crd::report(&fields);
        let (fields_tx, fields) = channel::channel(fields);
        tasks.push(tokio::spawn(crd::run(client.clone(), fields_tx).instrument(info_span!("crd"))));
        let writer = status::StatusWriter::new(client.clone(), cache, args.status_interval, fields);
        tasks.push(tokio::spawn(writer.run(observed.clone(), leader.clone()).instrument(info_span!("status"))));
        let pinner = ports::PortPinner::new(client, opts.reserved_ports.clone());
        tasks.push(tokio::spawn(pinner.run(observed.clone(), leader.clone()).instrument(info_span!("ports"))));
        Ok((KubeSource { tasks, elector: election, leader, observed }, desired))
    }

    /// On a clean shutdown: stop the writers and the election, and give the
    /// Lease up so another replica takes over at once. Errors only log: the
    /// Lease then simply expires.
    pub async fn release(&self) {
        for t in &self.tasks {
            t.abort();
        }
        let Some((task, api, config)) = &self.elector else { return };
        task.abort();
        if let Err(error) = LeaderElector::release(api, config).await {
            tracing::warn!(%error, "cannot release the lease; it expires on its own");
        }
    }
}

impl Drop for KubeSource {
    fn drop(&mut self) {
        for t in self.tasks.iter().chain(self.elector.as_ref().map(|(t, _, _)| t)) {
            t.abort();
        }
    }
}
