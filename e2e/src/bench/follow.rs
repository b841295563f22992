//! In-process ADS clients that follow everything meshbridge serves, the way
//! Envoy (SotW or delta) or Istio Pilot (MCP over SotW) would: subscribe to
//! every cluster, then to the endpoints of each, ACK every response, and
//! count the bytes and the time of each update.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
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
        let tally = Arc::new(Mutex::new(Tally::default()));
        let t = tally.clone();
        let mut grpc = client(addr).await?;
        let task = match kind {
            Kind::Sotw | Kind::Mcp => {
                let (tx, rx) = mpsc::channel(16);
                let rx = grpc.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
                let stream = Stream { tx, rx };
                if kind == Kind::Sotw {
                    tokio::spawn(follow_sotw(stream, t))
                } else {
                    tokio::spawn(follow_mcp(stream, t))
                }
            }
            Kind::Delta => {
                let (tx, rx) = mpsc::channel(16);
                let rx = grpc.delta_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
                tokio::spawn(follow_delta(Stream { tx, rx }, t))
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

async fn follow_sotw(mut s: Sotw, tally: Arc<Mutex<Tally>>) {
    s.send(sotw_request(CLUSTER_TYPE, &[], "", "")).await;
    let mut names: Vec<String> = Vec::new();
    let (mut eds_version, mut eds_nonce) = (String::new(), String::new());
    while let Some(resp) = s.recv().await {
        let is_eds = resp.type_url == ENDPOINT_TYPE;
        record(&tally, resp.encoded_len(), is_eds);
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

async fn follow_delta(mut s: Delta, tally: Arc<Mutex<Tally>>) {
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
