//! The ADS gRPC server (Envoy, and later Istio Pilot over MCP).
//!
//! Each client stream runs in its own task with its own protocol state
//! ([`sotw::SotwStream`] or [`delta::DeltaStream`]). The translated config
//! arrives on a `watch` channel: a burst of changes coalesces into one push
//! of the newest state, and a slow client can never lag behind a queue.

pub mod clients;
pub mod delta;
pub mod sotw;
pub mod tracker;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_server::{AggregatedDiscoveryService, AggregatedDiscoveryServiceServer},
};
use futures::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, info_span};

pub use clients::{ClientHandle, Clients};

use crate::resources::TypeResources;
use crate::translate::ConfigSet;
use crate::translate::envoy::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};

/// What a client asked for, for one type. Names are shared `Arc<str>`,
/// the published resource's own name where there is one, so a stream's
/// subscription costs a pointer per name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    pub wildcard: bool,
    pub names: BTreeSet<Arc<str>>,
}

impl Subscription {
    /// From a SotW `resource_names` list or the first delta subscribe list.
    /// An empty list is the legacy wildcard, but only for types where the
    /// client may not know names up front (all but EDS and RDS, which are
    /// always named: an empty EDS list means "nothing"). Names the type
    /// holds share its resources' names.
    pub fn from_names(type_url: &str, names: &[String], known: &TypeResources) -> Subscription {
        let mut sub = Subscription::default();
        let named_only = type_url == ENDPOINT_TYPE || type_url == ROUTE_TYPE;
        sub.wildcard = names.is_empty() && !named_only;
        for n in names {
            sub.add(n, known);
        }
        sub
    }

    /// Add a name (`*` turns wildcard on). True if it was not there.
    pub fn add(&mut self, name: &str, known: &TypeResources) -> bool {
        if name == "*" {
            let was = self.wildcard;
            self.wildcard = true;
            return !was;
        }
        if self.names.contains(name) {
            return false;
        }
        self.names.insert(known.get(name).map(|r| r.name.clone()).unwrap_or_else(|| name.into()))
    }

    pub fn remove(&mut self, name: &str) {
        if name == "*" {
            self.wildcard = false;
        } else {
            self.names.remove(name);
        }
    }

    pub fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

/// The resources a type URL names in `set`, empty when it has none.
pub fn type_resources<'a>(set: &'a ConfigSet, type_url: &str) -> &'a TypeResources {
    static EMPTY: std::sync::LazyLock<TypeResources> = std::sync::LazyLock::new(TypeResources::default);
    set.resources(type_url).unwrap_or(&EMPTY)
}

/// Types whose every response must list all resources (xDS: Listener and
/// Cluster are "full state" in SotW), and any type we do not know, which
/// Pilot's MCP client treats the same way.
pub fn is_full_state(type_url: &str) -> bool {
    type_url != ENDPOINT_TYPE && type_url != ROUTE_TYPE
}

/// go-control-plane's order: CDS, EDS, LDS, RDS, then anything else.
pub fn push_order<'a>(types: impl Iterator<Item = &'a String>) -> Vec<String> {
    let rank = |t: &str| match t {
        CLUSTER_TYPE => 0,
        ENDPOINT_TYPE => 1,
        LISTENER_TYPE => 2,
        ROUTE_TYPE => 3,
        _ => 4,
    };
    let mut v: Vec<String> = types.cloned().collect();
    v.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    v
}

/// The ADS service. Cheap to clone.
#[derive(Clone)]
pub struct AdsServer {
    config: watch::Receiver<Arc<ConfigSet>>,
    clients: Arc<Clients>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl AdsServer {
    pub fn new(config: watch::Receiver<Arc<ConfigSet>>, clients: Arc<Clients>) -> Self {
        AdsServer { config, clients }
    }

    pub fn into_service(self) -> AggregatedDiscoveryServiceServer<AdsServer> {
        AggregatedDiscoveryServiceServer::new(self)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(256 << 20)
    }

    /// Serve on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .add_service(self.into_service())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }
}

/// The protocol state of one stream, SotW or delta.
pub trait StreamState: Send + 'static {
    type Req: Send + 'static;
    type Resp: Send + 'static;
    fn on_request(&mut self, req: &Self::Req, set: &ConfigSet) -> Vec<Self::Resp>;
    fn on_change(&mut self, set: &ConfigSet) -> Vec<Self::Resp>;
}

impl StreamState for sotw::SotwStream {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    fn on_request(&mut self, req: &DiscoveryRequest, set: &ConfigSet) -> Vec<DiscoveryResponse> {
        sotw::SotwStream::on_request(self, req, set)
    }
    fn on_change(&mut self, set: &ConfigSet) -> Vec<DiscoveryResponse> {
        sotw::SotwStream::on_change(self, set)
    }
}

impl StreamState for delta::DeltaStream {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaDiscoveryResponse;
    fn on_request(&mut self, req: &DeltaDiscoveryRequest, set: &ConfigSet) -> Vec<DeltaDiscoveryResponse> {
        delta::DeltaStream::on_request(self, req, set)
    }
    fn on_change(&mut self, set: &ConfigSet) -> Vec<DeltaDiscoveryResponse> {
        delta::DeltaStream::on_change(self, set)
    }
}

/// Drive one stream: requests and config changes in, responses out.
async fn drive<S: StreamState>(
    mut state: S,
    mut inbound: Streaming<S::Req>,
    mut config: watch::Receiver<Arc<ConfigSet>>,
    tx: mpsc::Sender<Result<S::Resp, Status>>,
) {
    loop {
        let out = tokio::select! {
            msg = inbound.next() => match msg {
                Some(Ok(req)) => {
                    // Not borrow_and_update: other types may still owe a push
                    // for this config, which the change branch will make.
                    let set = config.borrow().clone();
                    state.on_request(&req, &set)
                }
                Some(Err(status)) => { debug!(%status, "stream error"); break }
                None => break,
            },
            changed = config.changed() => {
                if changed.is_err() { break }
                let set = config.borrow_and_update().clone();
                state.on_change(&set)
            }
        };
        for resp in out {
            if tx.send(Ok(resp)).await.is_err() {
                return;
            }
        }
    }
}

fn peer(addr: Option<SocketAddr>) -> String {
    addr.map(|a| a.to_string()).unwrap_or_else(|| "unknown".into())
}

impl AdsServer {
    /// Start the task that serves one stream and hand back its responses.
    fn open<S: StreamState>(
        &self,
        mode: &'static str,
        remote: Option<SocketAddr>,
        inbound: Streaming<S::Req>,
        state: impl FnOnce(ClientHandle) -> S,
    ) -> BoxStream<S::Resp> {
        let peer = peer(remote);
        let client = self.clients.connect(&peer, mode);
        let span = info_span!("ads", mode, stream = client.id(), %peer);
        let (tx, rx) = mpsc::channel(16);
        let state = state(client);
        let config = self.config.clone();
        tokio::spawn(
            async move {
                info!("stream opened");
                drive(state, inbound, config, tx).await;
                info!("stream closed");
            }
            .instrument(span),
        );
        Box::pin(ReceiverStream::new(rx))
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = BoxStream<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = BoxStream<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let remote = request.remote_addr();
        Ok(Response::new(self.open("sotw", remote, request.into_inner(), sotw::SotwStream::new)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let remote = request.remote_addr();
        Ok(Response::new(self.open("delta", remote, request.into_inner(), delta::DeltaStream::new)))
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod stream_tests;
