//! In-process ADS clients that follow everything meshbridge serves, the way
//! Envoy (SotW or delta) or Istio Pilot (MCP over SotW) would: subscribe to
//! every cluster, then to the endpoints of each, ACK every response, and
//! count the bytes and the time of each update.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use meshbridge::testing::{DeltaClient, SotwClient};
use meshbridge::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};
use prost::Message;
use tokio::task::JoinHandle;

/// The collections Pilot asks an MCP config source for (those meshbridge
/// can serve).
pub const MCP_COLLECTIONS: [&str; 5] = [
    "networking.istio.io/v1alpha3/ServiceEntry",
    "networking.istio.io/v1alpha3/WorkloadEntry",
    "networking.istio.io/v1alpha3/VirtualService",
    "networking.istio.io/v1alpha3/DestinationRule",
    "networking.istio.io/v1alpha3/Gateway",
];

/// How a follower talks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Envoy over SotW ADS: CDS, then EDS naming every cluster.
    Sotw,
    /// Envoy over delta ADS.
    Delta,
    /// Pilot over MCP (SotW): every collection, wildcard.
    Mcp,
}

/// What a follower has received so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tally {
    /// Encoded size of every response, all types.
    pub bytes: u64,
    /// Responses that can carry an endpoint change: EDS, or any MCP one.
    pub updates: u64,
    /// When the last of those arrived.
    pub last: Option<Instant>,
}

/// One following client; dropping it closes its stream.
pub struct Follower {
    tally: Arc<Mutex<Tally>>,
    task: JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A day: "wait for the next response" without a practical limit.
const FOREVER: Duration = Duration::from_secs(86_400);

impl Follower {
    pub async fn start(kind: Kind, addr: SocketAddr) -> anyhow::Result<Follower> {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let t = tally.clone();
        let task = match kind {
            Kind::Sotw => {
                let client = SotwClient::connect(addr).await?;
                tokio::spawn(follow_sotw(client, t))
            }
            Kind::Mcp => {
                let client = SotwClient::connect(addr).await?;
                tokio::spawn(follow_mcp(client, t))
            }
            Kind::Delta => {
                let client = DeltaClient::connect(addr).await?;
                tokio::spawn(follow_delta(client, t))
            }
        };
        Ok(Follower { tally, task })
    }

    pub fn tally(&self) -> Tally {
        *self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn record(tally: &Mutex<Tally>, bytes: usize, update: bool) {
    let mut t = tally.lock().unwrap_or_else(PoisonError::into_inner);
    t.bytes += bytes as u64;
    if update {
        t.updates += 1;
        t.last = Some(Instant::now());
    }
}

async fn follow_sotw(mut client: SotwClient, tally: Arc<Mutex<Tally>>) {
    client.send(SotwClient::request(CLUSTER_TYPE, &[], "", "")).await;
    let mut names: Vec<String> = Vec::new();
    let (mut eds_version, mut eds_nonce) = (String::new(), String::new());
    while let Some(resp) = client.recv_within(FOREVER).await {
        let is_eds = resp.type_url == ENDPOINT_TYPE;
        record(&tally, resp.encoded_len(), is_eds);
        if resp.type_url == CLUSTER_TYPE {
            client.ack(&resp, &[]).await;
            let now: Vec<String> = resp
                .resources
                .iter()
                .filter_map(|any| Cluster::decode(any.value.as_slice()).ok())
                .map(|c| c.name)
                .collect();
            if now != names {
                names = now;
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                client.send(SotwClient::request(ENDPOINT_TYPE, &refs, &eds_version, &eds_nonce)).await;
            }
        } else if is_eds {
            eds_version.clone_from(&resp.version_info);
            eds_nonce.clone_from(&resp.nonce);
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            client.ack(&resp, &refs).await;
        }
    }
}

async fn follow_delta(mut client: DeltaClient, tally: Arc<Mutex<Tally>>) {
    client.send(DeltaClient::subscribe(CLUSTER_TYPE, &[])).await;
    let mut subscribed = BTreeSet::new();
    while let Some(resp) = client.recv_within(FOREVER).await {
        let is_eds = resp.type_url == ENDPOINT_TYPE;
        record(&tally, resp.encoded_len(), is_eds);
        client.ack(&resp).await;
        if resp.type_url == CLUSTER_TYPE {
            let new: Vec<&str> =
                resp.resources.iter().map(|r| r.name.as_str()).filter(|n| !subscribed.contains(*n)).collect();
            if !new.is_empty() {
                client.send(DeltaClient::subscribe(ENDPOINT_TYPE, &new)).await;
                subscribed.extend(new.into_iter().map(String::from));
            }
        }
    }
}

async fn follow_mcp(mut client: SotwClient, tally: Arc<Mutex<Tally>>) {
    for collection in MCP_COLLECTIONS {
        client.send(SotwClient::request(collection, &[], "", "")).await;
    }
    while let Some(resp) = client.recv_within(FOREVER).await {
        record(&tally, resp.encoded_len(), true);
        client.ack(&resp, &[]).await;
    }
}
