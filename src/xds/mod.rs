//! The ADS gRPC server (Envoy, and later Istio Pilot over MCP).
//!
//! Each client stream runs in its own task with its own protocol state
//! ([`sotw::SotwStream`] or [`delta::DeltaStream`]). The translated config
//! arrives on a `watch` channel: a burst of changes coalesces into one push
//! of the newest state, and a slow client can never lag behind a queue.
//!
//! The server speaks plaintext, TLS or mTLS ([`tls`]); how a stream's peer
//! authenticated decides whether it may have Secrets ([`auth`]).

pub mod auth;
pub mod clients;
pub mod delta;
mod framed;
pub mod inbound;
pub mod limits;
pub mod metrics;
pub mod request;
pub mod response;
pub mod service;
pub mod sotw;
pub mod subscription;
pub mod tls;
pub mod tracker;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use futures::Stream;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{Instrument, debug, info, info_span, warn};

use auth::PeerAuth;
pub use clients::{ClientHandle, Clients};
use inbound::Requests;
use limits::{ConnInfo, Connections};
pub use limits::{XdsLimits, XdsTlsArgs};
pub use request::SotwRequest;
pub use response::{DeltaResponse, SotwResponse};
pub use subscription::{Subscription, is_full_state, push_order, type_resources};
pub use tls::{TlsError, XdsTls};

use crate::publish::Published;
use crate::translate::ConfigSet;

/// The ADS service. Cheap to clone.
#[derive(Clone)]
pub struct AdsServer {
    config: watch::Receiver<Arc<Published>>,
    clients: Arc<Clients>,
    limits: Arc<XdsLimits>,
    /// One permit per open stream, all clients together.
    streams: Arc<Semaphore>,
    connections: Arc<Connections>,
    /// `None`: plaintext.
    tls: Option<Arc<XdsTls>>,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;
type BoxIncoming = Pin<Box<dyn Stream<Item = std::io::Result<limits::Conn>> + Send>>;

impl AdsServer {
    /// A server with the default [`XdsLimits`].
    pub fn new(config: watch::Receiver<Arc<Published>>, clients: Arc<Clients>) -> Self {
        AdsServer::with_limits(config, clients, XdsLimits::default())
    }

    pub fn with_limits(config: watch::Receiver<Arc<Published>>, clients: Arc<Clients>, limits: XdsLimits) -> Self {
        let streams = Arc::new(Semaphore::new(limits.max_streams));
        AdsServer { config, clients, limits: Arc::new(limits), streams, connections: Arc::default(), tls: None }
    }

    /// Serve TLS (mTLS when it has a client CA) instead of plaintext.
    pub fn with_tls(mut self, tls: Option<Arc<XdsTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// Serve on `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), tonic::transport::Error> {
        let (connections, limits) = (self.connections.clone(), self.limits.clone());
        let incoming: BoxIncoming = match self.tls.clone() {
            Some(tls) => Box::pin(tls::incoming(listener, tls, connections, limits)),
            None => Box::pin(
                tokio_stream::wrappers::TcpListenerStream::new(listener)
                    .map(move |io| io.map(|io| connections.accept_plain(io, &limits))),
            ),
        };
        let limits = &self.limits;
        let (keepalive_interval, keepalive_timeout) = limits.keepalive();
        let mut builder = tonic::transport::Server::builder()
            .max_concurrent_streams(limits.max_streams_per_connection)
            .http2_keepalive_interval(keepalive_interval)
            .http2_keepalive_timeout(keepalive_timeout);
        if !limits.max_connection_age.is_zero() {
            builder = builder
                .max_connection_age(limits.max_connection_age)
                .max_connection_age_grace(limits.max_connection_age_grace);
        }
        builder.add_service(self.into_service()).serve_with_incoming_shutdown(incoming, shutdown).await
    }
}

/// The protocol state of one stream, SotW or delta.
pub trait StreamState: Send + 'static {
    type Req: prost::Message + Default + Send + 'static;
    type Resp: Send + 'static;
    /// A request breaking a cap (see [`limits`]) ends the stream.
    fn check(&self, req: &Self::Req) -> Result<(), limits::RequestRefused>;
    fn on_request(&mut self, req: &Self::Req, set: &ConfigSet) -> Vec<Self::Resp>;
    fn on_change(&mut self, set: &ConfigSet) -> Vec<Self::Resp>;
    /// When a change waiting for its push window may go out: the stream
    /// then calls [`StreamState::on_change`] with the newest config.
    fn due(&self) -> Option<tokio::time::Instant> {
        None
    }
}

impl StreamState for sotw::SotwStream {
    type Req = SotwRequest;
    type Resp = SotwResponse;
    fn check(&self, req: &SotwRequest) -> Result<(), limits::RequestRefused> {
        limits::check_request(&req.req.type_url, req.names.iter())?;
        check_type_count(self.has_type(&req.req.type_url), self.type_count())
    }
    fn on_request(&mut self, req: &SotwRequest, set: &ConfigSet) -> Vec<SotwResponse> {
        sotw::SotwStream::handle(self, req, set)
    }
    fn on_change(&mut self, set: &ConfigSet) -> Vec<SotwResponse> {
        sotw::SotwStream::on_change(self, set)
    }
    fn due(&self) -> Option<tokio::time::Instant> {
        sotw::SotwStream::due(self)
    }
}

impl StreamState for delta::DeltaStream {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponse;
    fn check(&self, req: &DeltaDiscoveryRequest) -> Result<(), limits::RequestRefused> {
        let names = req
            .resource_names_subscribe
            .iter()
            .chain(&req.resource_names_unsubscribe)
            .chain(req.initial_resource_versions.keys());
        limits::check_request(&req.type_url, names)?;
        check_type_count(self.has_type(&req.type_url), self.type_count())
    }
    fn on_request(&mut self, req: &DeltaDiscoveryRequest, set: &ConfigSet) -> Vec<DeltaResponse> {
        delta::DeltaStream::on_request(self, req, set)
    }
    fn on_change(&mut self, set: &ConfigSet) -> Vec<DeltaResponse> {
        delta::DeltaStream::on_change(self, set)
    }
}

fn check_type_count(known: bool, count: usize) -> Result<(), limits::RequestRefused> {
    if known || count < limits::MAX_TYPES_PER_STREAM { Ok(()) } else { Err(limits::RequestRefused::TooManyTypes) }
}

/// Drive one stream: requests and config changes in, responses out.
///
/// A slow or non-reading client holds at most the responses of one step
/// (one per type) plus the one in the channel: while any is unsent, no
/// request is read and no config change is looked at. Changes coalesce in
/// the watch channel, so once the client reads again it gets the newest
/// state, never a backlog. A change a push window holds back goes out when
/// the window ends ([`StreamState::due`]).
async fn drive<S: StreamState>(
    mut state: S,
    mut inbound: Requests<S::Req>,
    mut config: watch::Receiver<Arc<Published>>,
    tx: mpsc::Sender<Result<Counted<S::Resp>, Status>>,
    clients: Arc<Clients>,
) {
    let mut queue: VecDeque<Counted<S::Resp>> = VecDeque::new();
    loop {
        if let Some(resp) = queue.pop_front() {
            // Only the channel's one slot: the rest wait here, unbuilt work in the watch.
            if tx.send(Ok(resp)).await.is_err() {
                break;
            }
            continue;
        }
        let due = state.due();
        let out = tokio::select! {
            msg = inbound.next() => match msg {
                Some(Ok(req)) => {
                    if let Err(e) = state.check(&req) {
                        warn!(error = %e, "request refused; closing the stream");
                        let _ = tx.send(Err(Status::invalid_argument(e.to_string()))).await;
                        break;
                    }
                    // Not borrow_and_update: other types may still owe a push
                    // for this config, which the change branch will make.
                    let set = config.borrow().clone();
                    state.on_request(&req, &set)
                }
                Some(Err(status)) => {
                    // E.g. a request over --xds-max-request-bytes: tell the client why.
                    debug!(%status, "stream error");
                    let _ = tx.send(Err(status)).await;
                    break
                }
                None => break,
            },
            changed = config.changed() => {
                if changed.is_err() { break }
                let set = config.borrow_and_update().clone();
                state.on_change(&set)
            }
            _ = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)), if due.is_some() => {
                let set = config.borrow_and_update().clone();
                state.on_change(&set)
            }
        };
        queue.extend(out.into_iter().map(|r| Counted::new(r, &clients)));
    }
}

/// A response built but not yet taken by the transport, counted in
/// [`Clients::buffered`] while it lives.
struct Counted<T> {
    resp: Option<T>,
    clients: Arc<Clients>,
}

impl<T> Counted<T> {
    fn new(resp: T, clients: &Arc<Clients>) -> Self {
        clients.buffered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Counted { resp: Some(resp), clients: clients.clone() }
    }

    fn take(mut self) -> Option<T> {
        self.resp.take()
    }
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        self.clients.buffered.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

fn peer(addr: Option<SocketAddr>) -> String {
    addr.map(|a| a.to_string()).unwrap_or_else(|| "unknown".into())
}

/// Where a request comes from and how its peer authenticated. A server
/// run from [`AdsServer::into_service`] on a plain tonic listener (tests,
/// benchmarks) has only the address: loopback is trusted, nothing else.
fn conn_info<T>(request: &Request<T>) -> ConnInfo {
    match request.extensions().get::<ConnInfo>() {
        Some(info) => info.clone(),
        None => {
            let remote = request.remote_addr();
            ConnInfo { remote, auth: PeerAuth::unverified(remote, false) }
        }
    }
}

impl AdsServer {
    /// Shutting down: a new stream gets UNAVAILABLE, so the client
    /// reconnects (to another replica, behind a Service) at once.
    fn refuse_if_draining(&self) -> Result<(), Status> {
        if self.clients.is_draining() {
            return Err(Status::unavailable("meshbridge is shutting down"));
        }
        Ok(())
    }

    /// Start the task that serves one stream and hand back its responses.
    fn open<S: StreamState>(
        &self,
        mode: &'static str,
        ConnInfo { remote, auth }: ConnInfo,
        inbound: Requests<S::Req>,
        state: impl FnOnce(ClientHandle) -> S,
    ) -> Result<BoxStream<S::Resp>, Status> {
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            warn!(peer = %peer(remote), max = self.limits.max_streams, "xds stream refused: too many open streams");
            Status::resource_exhausted(format!(
                "too many open xDS streams (limit {}, --xds-max-streams)",
                self.limits.max_streams
            ))
        })?;
        let conn = self.connections.stream_opened(remote);
        let peer = peer(remote);
        let client = self.clients.connect_as(&peer, mode, auth);
        let span = info_span!("ads", mode, stream = client.id(), %peer, auth = client.auth().label());
        let (tx, rx) = mpsc::channel(1);
        let state = state(client);
        let config = self.config.clone();
        let clients = self.clients.clone();
        tokio::spawn(
            async move {
                info!("stream opened");
                // Startup gate (crate::startup): requests wait in the
                // stream until the first complete set (or the timeout).
                let mut config = config;
                if config.wait_for(|s| !s.readiness.held).await.is_err() {
                    return;
                }
                drive(state, inbound, config, tx, clients).await;
                drop((permit, conn));
                info!("stream closed");
            }
            .instrument(span),
        );
        // A response leaves the count when tonic takes it to encode.
        let responses = ReceiverStream::new(rx).filter_map(|r| r.map(Counted::take).transpose());
        Ok(Box::pin(responses))
    }
}

/// The two ADS methods ([`service::AdsService`] routes to them).
impl AdsServer {
    fn sotw(&self, request: Request<Requests<SotwRequest>>) -> Result<Response<BoxStream<SotwResponse>>, Status> {
        self.refuse_if_draining()?;
        let info = conn_info(&request);
        let window = self.limits.sotw_push_window;
        let state = move |client| sotw::SotwStream::with_window(client, window);
        Ok(Response::new(self.open("sotw", info, request.into_inner(), state)?))
    }

    fn delta(
        &self,
        request: Request<Requests<DeltaDiscoveryRequest>>,
    ) -> Result<Response<BoxStream<DeltaResponse>>, Status> {
        self.refuse_if_draining()?;
        let info = conn_info(&request);
        Ok(Response::new(self.open("delta", info, request.into_inner(), delta::DeltaStream::new)?))
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod stream_tests;
