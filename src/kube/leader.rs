//! Leader election with a `coordination.k8s.io/v1` Lease, the way
//! client-go's `leaderelection` does it: the holder renews `renewTime` every
//! retry period; another replica takes the Lease over once it has seen the
//! same `renewTime` for a whole `leaseDurationSeconds` (by its own clock, so
//! clock skew between nodes does not matter). Writes carry the
//! `resourceVersion` read, so two replicas racing for the Lease cannot both
//! win: the API server answers the loser 409 Conflict.
//!
//! A leader that could not renew for the renew deadline (shorter than the
//! lease duration) steps down on its own, before anyone can take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::args::KubeArgs;

/// Where the Lease is and how this replica takes part.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub namespace: String,
    pub lease: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaderConfig {
    pub fn from_args(args: &KubeArgs) -> Self {
        let identity = args
            .leader_identity
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("meshbridge-{}", std::process::id()));
        LeaderConfig {
            namespace: args.namespace.clone(),
            lease: args.leader_lease.clone(),
            identity,
            lease_duration: args.leader_lease_duration,
            renew_deadline: args.leader_renew_deadline.min(args.leader_lease_duration),
            retry_period: args.leader_retry_period,
        }
    }
}

/// Takes part in the election; publishes whether this replica leads.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderConfig,
    tx: watch::Sender<bool>,
    /// The other holder's (identity, renewTime) and when we first saw it.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
    /// When we last renewed successfully, while leading.
    renewed: Option<Instant>,
}

/// What one attempt did.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Leading,
    Following,
}

impl LeaderElector {
    /// The Lease API this elector uses, for [`LeaderElector::release`].
    pub fn api(&self) -> Api<Lease> {
        self.api.clone()
    }

    pub fn new(client: Client, config: LeaderConfig) -> (Self, watch::Receiver<bool>) {
        let api = Api::namespaced(client, &config.namespace);
        let (tx, rx) = watch::channel(false);
        (LeaderElector { api, config, tx, observed: None, renewed: None }, rx)
    }

    pub async fn run(mut self) {
        loop {
            let result = self.attempt().await;
            let leading = match result {
                Ok(Attempt::Leading) => {
                    self.renewed = Some(Instant::now());
                    true
                }
                Ok(Attempt::Following) => {
                    self.renewed = None;
                    false
                }
                Err(error) => {
                    // Keep leading only until the renew deadline.
                    let within = self.renewed.is_some_and(|t| t.elapsed() < self.config.renew_deadline);
                    warn!(%error, still_leading = within, "lease update failed");
                    within
                }
            };
            self.tx.send_if_modified(|old| {
                let changed = *old != leading;
                if changed {
                    info!(identity = %self.config.identity, leading, "leadership changed");
                    *old = leading;
                }
                changed
            });
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Give the Lease up if this replica holds it, so another takes over
    /// at its next try instead of after the lease duration (client-go's
    /// `ReleaseOnCancel`). Call after the elector task has stopped.
    pub async fn release(api: &Api<Lease>, config: &LeaderConfig) -> Result<bool, kube::Error> {
        let Some(mut lease) = api.get_opt(&config.lease).await? else { return Ok(false) };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        api.replace(&config.lease, &PostParams::default(), &lease).await?;
        info!(lease = %config.lease, "released lease");
        Ok(true)
    }

    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let me = &self.config.identity;
        let duration = i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.config.lease).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.config.lease.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    info!(lease = %self.config.lease, "created lease");
                    Ok(Attempt::Leading)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if holder.as_ref() != Some(me) {
            // Someone else's (or nobody's) lease: take it only once it has
            // not moved for a whole lease duration by our clock.
            let seen = (holder.clone(), spec.renew_time.clone());
            let since = match &self.observed {
                Some((h, r, at)) if (h, r) == (&seen.0, &seen.1) => *at,
                _ => {
                    self.observed = Some((seen.0, seen.1, Instant::now()));
                    Instant::now()
                }
            };
            let their_duration =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration).max(1).unsigned_abs().into());
            if holder.is_some() && since.elapsed() < their_duration {
                debug!(holder = ?holder, "lease held by another replica");
                return Ok(Attempt::Following);
            }
            spec.holder_identity = Some(me.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            info!(previous = ?holder, "taking over expired lease");
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(duration);
        // `replace` sends the resourceVersion we read: a concurrent writer
        // makes this a 409, and the other replica wins.
        match self.api.replace(&lease.name_any(), &PostParams::default(), &lease).await {
            Ok(_) => Ok(Attempt::Leading),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!("lost a race for the lease");
                Ok(Attempt::Following)
            }
            Err(e) => Err(e),
        }
    }
}
