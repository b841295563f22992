//! Test helpers (feature `testing`): an in-process ADS client that talks to
//! the server the way Envoy does, for tests and benchmarks.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
};
use envoy_types::pb::google::rpc::Status;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

/// One ADS stream, SotW (`Req = DiscoveryRequest`) or delta.
pub struct AdsClient<Req, Resp> {
    tx: mpsc::Sender<Req>,
    rx: Streaming<Resp>,
}

pub type SotwClient = AdsClient<DiscoveryRequest, DiscoveryResponse>;
pub type DeltaClient = AdsClient<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

fn node(id: &str) -> Option<Node> {
    Some(Node { id: id.to_string(), cluster: "test".into(), ..Default::default() })
}

async fn channel(
    addr: std::net::SocketAddr,
) -> anyhow::Result<AggregatedDiscoveryServiceClient<tonic::transport::Channel>> {
    Ok(AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await?)
}

impl<Req, Resp> AdsClient<Req, Resp> {
    pub async fn send(&self, req: Req) {
        self.tx.send(req).await.expect("ads stream closed");
    }

    /// Send unless the stream is gone; true if sent.
    pub async fn try_send(&self, req: Req) -> bool {
        self.tx.send(req).await.is_ok()
    }

    /// The next response, or `None` if none comes within `wait`.
    pub async fn recv_within(&mut self, wait: Duration) -> Option<Resp> {
        match tokio::time::timeout(wait, self.rx.message()).await {
            Ok(Ok(Some(resp))) => Some(resp),
            _ => None,
        }
    }

    /// The next message within `wait`: a response, the status the server
    /// ended the stream with (`Err`), or `Ok(None)` for nothing in time or
    /// a clean end.
    pub async fn next_within(&mut self, wait: Duration) -> Result<Option<Resp>, tonic::Status> {
        match tokio::time::timeout(wait, self.rx.message()).await {
            Ok(r) => r,
            Err(_) => Ok(None),
        }
    }

    /// The next response; panics after 5 s.
    pub async fn recv(&mut self) -> Resp {
        self.recv_within(Duration::from_secs(5)).await.expect("no response within 5s")
    }
}

impl SotwClient {
    pub async fn connect(addr: std::net::SocketAddr) -> anyhow::Result<SotwClient> {
        let (tx, rx) = mpsc::channel(16);
        let resp = channel(addr).await?.stream_aggregated_resources(ReceiverStream::new(rx)).await?;
        Ok(AdsClient { tx, rx: resp.into_inner() })
    }

    /// A request as Envoy sends it.
    pub fn request(type_url: &str, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            node: node("test-envoy"),
            type_url: type_url.into(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    /// A first request as Istio's ADSC `WatchConfig()` sends it: no version,
    /// no names, and `ResponseNonce = time.Now().String()`, a nonce this
    /// server never sent (Go's `Time.String` layout).
    pub fn adsc_initial(type_url: &str) -> DiscoveryRequest {
        // `2024-05-01 12:34:56.789 +0000 UTC m=+0.012345678`
        let stamp = crate::admin::time::rfc3339(std::time::SystemTime::now()).replace('T', " ").replace('Z', "");
        let nonce = format!("{stamp} +0000 UTC m=+0.012345678");
        let mut req = Self::request(type_url, &[], "", &nonce);
        req.node = node("sidecar~10.0.0.1~adsc.default~default.svc.cluster.local");
        req
    }

    /// ACK `resp`, keeping the subscription `names`.
    pub async fn ack(&self, resp: &DiscoveryResponse, names: &[&str]) {
        self.send(Self::request(&resp.type_url, names, &resp.version_info, &resp.nonce)).await
    }

    /// NACK `resp`, reporting `previous` as the version still in use.
    pub async fn nack(&self, resp: &DiscoveryResponse, names: &[&str], previous: &str, detail: &str) {
        let mut req = Self::request(&resp.type_url, names, previous, &resp.nonce);
        req.error_detail = Some(Status { code: 3, message: detail.into(), details: vec![] });
        self.send(req).await
    }
}

impl DeltaClient {
    pub async fn connect(addr: std::net::SocketAddr) -> anyhow::Result<DeltaClient> {
        let (tx, rx) = mpsc::channel(16);
        let resp = channel(addr).await?.delta_aggregated_resources(ReceiverStream::new(rx)).await?;
        Ok(AdsClient { tx, rx: resp.into_inner() })
    }

    pub fn subscribe(type_url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            node: node("test-envoy"),
            type_url: type_url.into(),
            resource_names_subscribe: names.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    pub async fn ack(&self, resp: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        })
        .await
    }

    pub async fn nack(&self, resp: &DeltaDiscoveryResponse, detail: &str) {
        self.send(DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: Some(Status { code: 3, message: detail.into(), details: vec![] }),
            ..Default::default()
        })
        .await
    }
}

/// An ADS server on a free port fed from a cache, the way the binary wires
/// them (cache → publisher → server), with one registry's sink to drive it.
pub struct XdsFixture {
    pub addr: std::net::SocketAddr,
    pub cache: std::sync::Arc<crate::cache::Cache>,
    pub sink: std::sync::Arc<dyn meshbridge_registries::Sink>,
    pub clients: std::sync::Arc<crate::xds::Clients>,
    pub config: tokio::sync::watch::Receiver<std::sync::Arc<crate::translate::ConfigSet>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl XdsFixture {
    /// Serve `initial` as the full contents of a Consul registry `test`.
    pub async fn start(initial: Vec<meshbridge_registries::Service>) -> XdsFixture {
        XdsFixture::start_with(initial, crate::xds::XdsLimits::default()).await
    }

    /// [`start`](Self::start) with these server limits.
    pub async fn start_with(initial: Vec<meshbridge_registries::Service>, limits: crate::xds::XdsLimits) -> XdsFixture {
        use meshbridge_registries::{RegistryKind, Update};
        let cache = crate::cache::Cache::new();
        let sink = cache.attach(&crate::cache::RegistryKey::new(RegistryKind::Consul, "test"));
        sink.update(Update::Snapshot(initial));
        let mut tasks = Vec::new();
        let desired = tokio::sync::watch::channel(std::sync::Arc::new(crate::config::Desired::default())).1;
        let config = crate::publish::spawn(&cache, desired, Default::default(), &mut tasks);
        let clients = crate::xds::Clients::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = crate::xds::AdsServer::with_limits(config.clone(), clients.clone(), limits);
        tasks.push(tokio::spawn(async move {
            let _ = server.serve(listener, std::future::pending()).await;
        }));
        XdsFixture { addr, cache, sink, clients, config, tasks }
    }
}

impl Drop for XdsFixture {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
