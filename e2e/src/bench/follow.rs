//! In-process ADS clients that follow everything meshbridge serves, the way
//! Envoy (SotW or delta) or Istio Pilot (MCP over SotW) would: subscribe to
//! every cluster, then to the endpoints of each, ACK every response, and
//! count the bytes and the time of each update. A tracking follower
//! ([`Follower::start_tracking`]) also keeps, per cluster, how many
//! endpoints its last ClusterLoadAssignment held and when it arrived.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
};
use meshbridge::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE};
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// Largest response a follower takes: a full SotW or MCP collection at
/// 10k services is several MiB, over tonic's 4 MiB default.
const MAX_RESPONSE: usize = 256 << 20;

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

/// The last ClusterLoadAssignment a tracking follower received for one
/// cluster.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Its `lb_endpoints`, over every locality.
    pub endpoints: usize,
    /// When the response that carried it arrived.
    pub at: Instant,
}

type Loads = Arc<Mutex<HashMap<String, Load>>>;

/// One following client; dropping it closes its stream.
pub struct Follower {
    tally: Arc<Mutex<Tally>>,
    loads: Option<Loads>,
    task: JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One ADS stream: requests go in `tx`, responses come from `rx`.
struct Stream<Req, Resp> {
    tx: mpsc::Sender<Req>,
    rx: Streaming<Resp>,
}

impl<Req, Resp> Stream<Req, Resp> {
    /// False once the stream is gone.
    async fn send(&self, req: Req) -> bool {
        self.tx.send(req).await.is_ok()
    }

    async fn recv(&mut self) -> Option<Resp> {
        self.rx.message().await.ok().flatten()
    }
}

type Sotw = Stream<DiscoveryRequest, DiscoveryResponse>;
type Delta = Stream<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

async fn client(addr: SocketAddr) -> anyhow::Result<AggregatedDiscoveryServiceClient<tonic::transport::Channel>> {
    Ok(AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await?
        .max_decoding_message_size(MAX_RESPONSE))
}

fn node() -> Option<Node> {
    Some(Node { id: "bench-follower".into(), cluster: "bench".into(), ..Default::default() })
}

fn sotw_request(type_url: &str, names: &[String], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        node: node(),
        type_url: type_url.into(),
        resource_names: names.to_vec(),
        version_info: version.into(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

impl Follower {
    pub async fn start(kind: Kind, addr: SocketAddr) -> anyhow::Result<Follower> {
        Self::start_inner(kind, addr, None).await
    }

    /// An Envoy-like follower (SotW or delta) that also decodes each
    /// ClusterLoadAssignment it receives ([`Follower::load`]).
    pub async fn start_tracking(kind: Kind, addr: SocketAddr) -> anyhow::Result<Follower> {
        anyhow::ensure!(kind != Kind::Mcp, "an MCP follower receives no ClusterLoadAssignment");
        Self::start_inner(kind, addr, Some(Loads::default())).await
    }

    async fn start_inner(kind: Kind, addr: SocketAddr, loads: Option<Loads>) -> anyhow::Result<Follower> {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let t = tally.clone();
        let l = loads.clone();
        let mut grpc = client(addr).await?;
        let task = match kind {
            Kind::Sotw | Kind::Mcp => {
                let (tx, rx) = mpsc::channel(16);
                let rx = grpc.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
                let stream = Stream { tx, rx };
                if kind == Kind::Sotw {
                    tokio::spawn(follow_sotw(stream, t, l))
                } else {
                    tokio::spawn(follow_mcp(stream, t))
                }
            }
            Kind::Delta => {
                let (tx, rx) = mpsc::channel(16);
                let rx = grpc.delta_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
                tokio::spawn(follow_delta(Stream { tx, rx }, t, l))
            }
        };
        Ok(Follower { tally, loads, task })
    }

    pub fn tally(&self) -> Tally {
        *self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What a tracking follower last received for `cluster`.
    pub fn load(&self, cluster: &str) -> Option<Load> {
        let loads = self.loads.as_ref()?.lock().unwrap_or_else(PoisonError::into_inner);
        loads.get(cluster).copied()
    }

    /// Clusters with a ClusterLoadAssignment, and their endpoints in all.
    pub fn loads_total(&self) -> (usize, usize) {
        let Some(loads) = &self.loads else { return (0, 0) };
        let loads = loads.lock().unwrap_or_else(PoisonError::into_inner);
        (loads.len(), loads.values().map(|l| l.endpoints).sum())
    }
}

/// Note each ClusterLoadAssignment of an EDS response that arrived `at`.
fn track<'a>(loads: &Option<Loads>, at: Instant, assignments: impl Iterator<Item = &'a [u8]>, removed: &[String]) {
    let Some(loads) = loads else { return };
    let mut loads = loads.lock().unwrap_or_else(PoisonError::into_inner);
    for bytes in assignments {
        let Ok(cla) = ClusterLoadAssignment::decode(bytes) else { continue };
        let endpoints = cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum();
        loads.insert(cla.cluster_name, Load { endpoints, at });
    }
    for name in removed {
        loads.remove(name);
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

async fn follow_sotw(mut s: Sotw, tally: Arc<Mutex<Tally>>, loads: Option<Loads>) {
    s.send(sotw_request(CLUSTER_TYPE, &[], "", "")).await;
    let mut names: Vec<String> = Vec::new();
    let (mut eds_version, mut eds_nonce) = (String::new(), String::new());
    while let Some(resp) = s.recv().await {
        let is_eds = resp.type_url == ENDPOINT_TYPE;
        record(&tally, resp.encoded_len(), is_eds);
        if is_eds {
            track(&loads, Instant::now(), resp.resources.iter().map(|a| a.value.as_slice()), &[]);
        }
        let ok = if resp.type_url == CLUSTER_TYPE {
            let acked = s.send(sotw_request(CLUSTER_TYPE, &[], &resp.version_info, &resp.nonce)).await;
            let now: Vec<String> = resp
                .resources
                .iter()
                .filter_map(|any| Cluster::decode(any.value.as_slice()).ok())
                .map(|c| c.name)
                .collect();
            if acked && now != names {
                names = now;
                s.send(sotw_request(ENDPOINT_TYPE, &names, &eds_version, &eds_nonce)).await
            } else {
                acked
            }
        } else if is_eds {
            eds_version.clone_from(&resp.version_info);
            eds_nonce.clone_from(&resp.nonce);
            s.send(sotw_request(ENDPOINT_TYPE, &names, &eds_version, &eds_nonce)).await
        } else {
            true
        };
        if !ok {
            return;
        }
    }
}

async fn follow_delta(mut s: Delta, tally: Arc<Mutex<Tally>>, loads: Option<Loads>) {
    let subscribe = |type_url: &str, names: Vec<String>| DeltaDiscoveryRequest {
        node: node(),
        type_url: type_url.into(),
        resource_names_subscribe: names,
        ..Default::default()
    };
    s.send(subscribe(CLUSTER_TYPE, Vec::new())).await;
    let mut subscribed = BTreeSet::new();
    while let Some(resp) = s.recv().await {
        let is_eds = resp.type_url == ENDPOINT_TYPE;
        record(&tally, resp.encoded_len(), is_eds);
        if is_eds {
            let assignments = resp.resources.iter().filter_map(|r| Some(r.resource.as_ref()?.value.as_slice()));
            track(&loads, Instant::now(), assignments, &resp.removed_resources);
        }
        let ack = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        };
        if !s.send(ack).await {
            return;
        }
        if resp.type_url == CLUSTER_TYPE {
            let new: Vec<String> =
                resp.resources.iter().map(|r| r.name.clone()).filter(|n| !subscribed.contains(n)).collect();
            if !new.is_empty() {
                subscribed.extend(new.iter().cloned());
                if !s.send(subscribe(ENDPOINT_TYPE, new)).await {
                    return;
                }
            }
        }
    }
}

async fn follow_mcp(mut s: Sotw, tally: Arc<Mutex<Tally>>) {
    for collection in MCP_COLLECTIONS {
        s.send(sotw_request(collection, &[], "", "")).await;
    }
    while let Some(resp) = s.recv().await {
        record(&tally, resp.encoded_len(), true);
        if !s.send(sotw_request(&resp.type_url, &[], &resp.version_info, &resp.nonce)).await {
            return;
        }
    }
}
