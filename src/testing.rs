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

#[path = "testing_pki.rs"]
pub mod pki;

async fn channel(
    addr: std::net::SocketAddr,
) -> anyhow::Result<AggregatedDiscoveryServiceClient<tonic::transport::Channel>> {
    // As big an answer as Envoy takes (its gRPC client has no cap).
    Ok(AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await?.max_decoding_message_size(256 << 20))
}

fn client(channel: tonic::transport::Channel) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(256 << 20)
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

    /// A stream on a channel of the caller's (e.g. [`pki::tls_channel`]).
    pub async fn on(channel: tonic::transport::Channel) -> anyhow::Result<SotwClient> {
        let (tx, rx) = mpsc::channel(16);
        let resp = client(channel).stream_aggregated_resources(ReceiverStream::new(rx)).await?;
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
        let stamp = crate::time::rfc3339(std::time::SystemTime::now()).replace('T', " ").replace('Z', "");
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

    /// A stream on a channel of the caller's (e.g. [`pki::tls_channel`]).
    pub async fn on(channel: tonic::transport::Channel) -> anyhow::Result<DeltaClient> {
        let (tx, rx) = mpsc::channel(16);
        let resp = client(channel).delta_aggregated_resources(ReceiverStream::new(rx)).await?;
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

/// The MCP type URLs a real istiod asks for when it starts on a `configSources`
/// entry `xds://…` (istio.io/istio `pkg/adsc` `ConfigInitialRequests`: the
/// mesh config, then every collection of Pilot's schema at its stored
/// version, `pkg/config/schema/collections`): Istio 1.27.9's. Master
/// (1.31-dev, commit `eed52ebb66ad`) asks for these and
/// [`ISTIOD_MASTER_ALSO_ASKS_FOR`].
pub const ISTIOD_1_27_ASKS_FOR: [&str; 15] = [
    "core/v1alpha1/MeshConfig",
    "extensions.istio.io/v1alpha1/WasmPlugin",
    "networking.istio.io/v1/DestinationRule",
    "networking.istio.io/v1/Gateway",
    "networking.istio.io/v1/ServiceEntry",
    "networking.istio.io/v1/Sidecar",
    "networking.istio.io/v1/VirtualService",
    "networking.istio.io/v1/WorkloadEntry",
    "networking.istio.io/v1/WorkloadGroup",
    "networking.istio.io/v1alpha3/EnvoyFilter",
    "networking.istio.io/v1beta1/ProxyConfig",
    "security.istio.io/v1/AuthorizationPolicy",
    "security.istio.io/v1/PeerAuthentication",
    "security.istio.io/v1/RequestAuthentication",
    "telemetry.istio.io/v1/Telemetry",
];

/// What istiod master asks for beside [`ISTIOD_1_27_ASKS_FOR`]: the
/// TrafficExtension collection, added after 1.27.
pub const ISTIOD_MASTER_ALSO_ASKS_FOR: [&str; 1] = ["extensions.istio.io/v1alpha1/TrafficExtension"];

/// An ADS server on a free port fed from a cache, the way the binary wires
/// them (cache → publisher → server), with one registry's sink to drive it.
pub struct XdsFixture {
    pub addr: std::net::SocketAddr,
    pub cache: std::sync::Arc<crate::cache::Cache>,
    pub sink: std::sync::Arc<dyn meshbridge_registries::Sink>,
    pub clients: std::sync::Arc<crate::xds::Clients>,
    pub config: tokio::sync::watch::Receiver<std::sync::Arc<crate::publish::Published>>,
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
        let config = crate::publish::spawn(
            &cache,
            desired,
            Default::default(),
            crate::startup::StartupGate::new(std::time::Duration::ZERO),
            &mut tasks,
        );
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

/// A minimal reader of the text exposition, for tests:
/// it checks the syntax strictly enough to catch a malformed line.
pub mod exposition {
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq)]
    pub struct Sample {
        pub name: String,
        pub labels: BTreeMap<String, String>,
        pub value: f64,
    }

    /// Parse the OpenMetrics/Prometheus text format. Every sample must
    /// belong to a family declared by a `# TYPE` line, and the text must end
    /// with `# EOF`.
    pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
        let mut families: BTreeMap<String, String> = BTreeMap::new();
        let mut samples = Vec::new();
        let mut eof = false;
        for (i, line) in text.lines().enumerate() {
            let at = |e: String| format!("line {}: {e}: {line:?}", i + 1);
            if eof {
                return Err(at("content after # EOF".into()));
            }
            if let Some(comment) = line.strip_prefix("# ") {
                let mut parts = comment.splitn(3, ' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some("EOF"), None, None) => eof = true,
                    (Some("TYPE"), Some(name), Some(kind)) => {
                        valid_name(name).map_err(at)?;
                        families.insert(name.to_string(), kind.to_string());
                    }
                    (Some("HELP" | "UNIT"), Some(name), _) => valid_name(name).map_err(at)?,
                    _ => return Err(at("unknown comment".into())),
                }
                continue;
            }
            let sample = sample(line).map_err(at)?;
            let family = ["_total", "_bucket", "_sum", "_count", "_created", ""]
                .iter()
                .find_map(|suffix| sample.name.strip_suffix(suffix).filter(|f| families.contains_key(*f)));
            if family.is_none() {
                return Err(at("sample of an undeclared family".into()));
            }
            samples.push(sample);
        }
        if !eof {
            return Err("no # EOF".into());
        }
        Ok(samples)
    }

    fn valid_name(name: &str) -> Result<(), String> {
        let ok = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if ok { Ok(()) } else { Err(format!("bad metric name {name:?}")) }
    }

    fn sample(line: &str) -> Result<Sample, String> {
        let end = line.find(['{', ' ']).ok_or("no value")?;
        let name = &line[..end];
        valid_name(name)?;
        let mut rest = &line[end..];
        let mut labels = BTreeMap::new();
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            loop {
                let start = chars.peek().map(|(i, _)| *i).ok_or("unterminated labels")?;
                if body[start..].starts_with('}') {
                    rest = &body[start + 1..];
                    break;
                }
                let eq = body[start..].find("=\"").ok_or("label without =\"")? + start;
                let key = &body[start..eq];
                valid_name(key)?;
                while chars.peek().is_some_and(|(i, _)| *i <= eq + 1) {
                    chars.next();
                }
                let mut value = String::new();
                loop {
                    match chars.next().ok_or("unterminated label value")? {
                        (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                            'n' => value.push('\n'),
                            c @ ('\\' | '"') => value.push(c),
                            c => return Err(format!("bad escape \\{c}")),
                        },
                        (_, '"') => break,
                        (_, c) => value.push(c),
                    }
                }
                labels.insert(key.to_string(), value);
                if chars.peek().is_some_and(|(_, c)| *c == ',') {
                    chars.next();
                }
            }
        }
        let mut fields = rest.trim_start().split(' ');
        let value = fields.next().ok_or("no value")?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse::<f64>().map_err(|e| format!("bad value {v:?}: {e}"))?,
        };
        Ok(Sample { name: name.to_string(), labels, value })
    }

    /// The value of the sample `name` whose labels include `labels`; the
    /// sum when several match (e.g. across modes).
    pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .map(|s| s.value)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }
}
