//! One connection to a Nacos 2.x/3.x server over its gRPC protocol, our
//! own client (no nacos-sdk).
//!
//! The protocol (alibaba/nacos `nacos_grpc_service.proto` and the request
//! classes of `com.alibaba.nacos.api`): the gRPC port is the HTTP port +
//! 1000; every message is a `Payload` whose metadata names the request or
//! response class (`type`) and carries the headers (the `accessToken`, the
//! AK/SK signature), and whose body is an `Any` holding the JSON of the
//! request. Requests go through the unary `/Request/request`; the server's
//! own requests (pushes, connection checks) come over the one bi-stream
//! `/BiRequestStream/requestBiStream`, which the client opens with a
//! `ConnectionSetupRequest` and answers on.
//!
//! The server ties a client's requests to its bi-stream by the TCP
//! connection they arrive on, so a [`Conn`] is exactly one HTTP/2
//! connection (one tonic `Channel` to one address, never reconnected by
//! itself: a broken connection is replaced as a whole by the session,
//! see `session.rs`). One task reads the bi-stream; it ends with the
//! connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::{debug, trace};

use super::decode::{Instance, ServiceKey};
use crate::error_chain::error_chain;
use crate::tls::RegistryTls;
use crate::watcher::RegistryError;

/// `Metadata` of `nacos_grpc_service.proto`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Metadata {
    /// The Java simple class name of the request or response.
    #[prost(string, tag = "3")]
    pub r#type: String,
    #[prost(map = "string, string", tag = "7")]
    pub headers: HashMap<String, String>,
    #[prost(string, tag = "8")]
    pub client_ip: String,
}

/// `Payload` of `nacos_grpc_service.proto`; the body's value is JSON.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Payload {
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<Metadata>,
    #[prost(message, optional, tag = "3")]
    pub body: Option<Body>,
}

/// The `google.protobuf.Any` body of a [`Payload`], its value held as
/// `Bytes`: decoding takes a slice of the frame the stream read instead of
/// copying it into a buffer of its own (a push at 10k services arrives
/// tens of times a second).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Body {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

const REQUEST_PATH: &str = "/Request/request";
const BI_STREAM_PATH: &str = "/BiRequestStream/requestBiStream";
/// The largest message read from a server: a service list page or one
/// service's instances (100k instances of ~300 bytes fit).
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Sent as `clientVersion` and the `app` header.
const CLIENT_VERSION: &str = concat!("meshbridge:", env!("CARGO_PKG_VERSION"));
/// Answers the client owes the server on the bi-stream, queued.
const OUTBOX: usize = 1024;
/// The error code of a request on a connection whose bi-stream the server
/// has not registered (yet).
const UNREGISTERED: u16 = 301;
/// How often a new connection asks whether it is registered.
const REGISTER_POLL: Duration = Duration::from_millis(20);
/// HTTP/2 pings on an idle connection notice a dead peer between health
/// checks.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// A request's headers: the token and the signature (see `auth.rs`).
pub(crate) type Headers = Vec<(&'static str, String)>;

/// Where a connection hands the pushes it reads.
pub(crate) type PushSink = Arc<dyn Fn(Push) + Send + Sync>;

/// A service's instances pushed by the server (`NotifySubscriberRequest`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Push {
    pub key: ServiceKey,
    pub instances: Vec<Instance>,
}

/// The `serviceInfo` of a subscribe or query answer, or of a push.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServiceInfo {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub group_name: Option<String>,
    #[serde(default)]
    pub hosts: Option<Vec<Instance>>,
}

/// The fields every response carries.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BaseResponse {
    #[serde(default)]
    result_code: i64,
    #[serde(default)]
    error_code: i64,
}

/// One HTTP/2 connection with its bi-stream open.
pub(crate) struct Conn {
    registry: String,
    /// `host:port` of the gRPC server.
    pub addr: String,
    grpc: tonic::client::Grpc<Channel>,
    /// Set by the reader once the bi-stream ended.
    closed: Arc<Closed>,
    /// Held for its `Drop`: ends the bi-stream (and so the reader).
    _outbox: mpsc::Sender<Payload>,
    reader: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Closed {
    done: AtomicBool,
    notify: Notify,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Conn {
    /// Connect to `addr` (the gRPC `host:port`), check the server, open the
    /// bi-stream as a client of `namespace`; pushes go to `pushes`.
    pub async fn connect(
        registry: &str,
        addr: &str,
        tls: Option<&RegistryTls>,
        namespace: &str,
        deadline: Duration,
        headers: Headers,
        pushes: PushSink,
    ) -> Result<Conn, RegistryError> {
        let unreachable = |reason: String| RegistryError::Unreachable {
            registry: registry.to_string(),
            reason: format!("connect {addr}: {reason}"),
        };
        let channel = tokio::time::timeout(deadline, channel(registry, addr, tls, deadline))
            .await
            .map_err(|_| unreachable(format!("timed out after {deadline:?}")))??;
        let grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let (outbox, rx) = mpsc::channel::<Payload>(OUTBOX);
        let closed = Arc::new(Closed::default());
        let mut conn = Conn {
            registry: registry.to_string(),
            addr: addr.to_string(),
            grpc,
            closed: closed.clone(),
            _outbox: outbox.clone(),
            reader: tokio::spawn(async {}),
        };
        conn.request("ServerCheckRequest", json!({}), Vec::new(), deadline).await?;
        // The bi-stream: its first message sets the connection up. With an
        // `abilityTable` (even an empty one) Nacos 2.3+ answers at once with
        // a `SetupAckRequest`, as it does for the Java client; without one
        // it sends nothing until the first push.
        let setup = json!({
            "clientVersion": CLIENT_VERSION,
            "tenant": namespace,
            "labels": {"source": "sdk", "module": "naming"},
            "abilities": {
                "remoteAbility": {"supportRemoteConnection": true},
                "configAbility": {"supportRemoteMetrics": false},
                "namingAbility": {"supportDeltaPush": false, "supportRemoteMetric": false}
            },
            "abilityTable": {},
        });
        outbox
            .send(payload("ConnectionSetupRequest", "internal", setup, Vec::new()))
            .await
            .map_err(|_| unreachable("bi-stream closed".into()))?;
        let stream = tokio_stream_from(rx);
        let mut grpc = conn.grpc.clone();
        grpc.ready().await.map_err(|e| unreachable(e.to_string()))?;
        // Opening resolves with the server's response headers, which a
        // grpc-java server sends with its first message: Nacos 2.3+ sends a
        // `SetupAckRequest` at once (the `abilityTable` above), older ones
        // nothing until the first push. So the reader opens the stream
        // and the registration below, bounded by `deadline`, is what says
        // the connection is up.
        let reader_registry = registry.to_string();
        conn.reader = tokio::spawn(async move {
            let path = PathAndQuery::from_static(BI_STREAM_PATH);
            match grpc.streaming(tonic::Request::new(stream), path, codec()).await {
                Ok(inbound) => read_stream(reader_registry, inbound.into_inner(), outbox, pushes, closed).await,
                Err(status) => {
                    debug!(registry = reader_registry, code = ?status.code(), "nacos bi-stream not opened");
                    closed.done.store(true, Ordering::SeqCst);
                    closed.notify.notify_waiters();
                }
            }
        });
        // The server registers the bi-stream asynchronously, and refuses
        // requests on the connection until it has (rnacos and Nacos answer
        // 301, "unregistered"): a subscription made before would be lost.
        let registered = async {
            loop {
                match conn.request("HealthCheckRequest", json!({}), headers.clone(), deadline).await {
                    Ok(_) => return Ok(()),
                    Err(RegistryError::Status { status: UNREGISTERED, .. }) if !conn.is_closed() => {
                        tokio::time::sleep(REGISTER_POLL).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        tokio::time::timeout(deadline, registered)
            .await
            .map_err(|_| unreachable(format!("the server did not register the connection within {deadline:?}")))??;
        Ok(conn)
    }

    /// Whether the bi-stream ended (the connection is gone).
    pub fn is_closed(&self) -> bool {
        self.closed.done.load(Ordering::SeqCst)
    }

    /// Resolves once the bi-stream ended.
    pub async fn closed(&self) {
        loop {
            let notified = self.closed.notify.notified();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }

    /// One unary request of class `kind` with body `body`: the body of a
    /// successful response. A refused request is a `Status` error with the
    /// server's error code.
    pub async fn request(
        &self,
        kind: &str,
        body: Value,
        headers: Headers,
        deadline: Duration,
    ) -> Result<Bytes, RegistryError> {
        let what = kind.trim_end_matches("Request");
        let unreachable = |reason: String| RegistryError::Unreachable {
            registry: self.registry.clone(),
            reason: format!("{what}: {reason}"),
        };
        let module = if kind.starts_with("Service") || kind.starts_with("Subscribe") { "naming" } else { "internal" };
        let mut grpc = self.grpc.clone();
        let call = async {
            grpc.ready().await.map_err(|e| unreachable(e.to_string()))?;
            let request = tonic::Request::new(payload(kind, module, body, headers));
            grpc.unary(request, PathAndQuery::from_static(REQUEST_PATH), codec())
                .await
                .map_err(|s| unreachable(format!("{:?}: {}", s.code(), s.message())))
        };
        let response = tokio::time::timeout(deadline, call)
            .await
            .map_err(|_| unreachable(format!("timed out after {deadline:?}")))??
            .into_inner();
        let bytes = response.body.map(|b| b.value).unwrap_or_default();
        let bad = |reason: String| RegistryError::BadResponse {
            registry: self.registry.clone(),
            what: what.to_string(),
            reason,
        };
        let base: BaseResponse = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        let kind = response.metadata.map(|m| m.r#type).unwrap_or_default();
        if base.result_code != 200 || kind == "ErrorResponse" {
            let code = if base.error_code > 0 { base.error_code } else { base.result_code };
            return Err(RegistryError::Status {
                registry: self.registry.clone(),
                what: what.to_string(),
                status: u16::try_from(code).ok().filter(|c| (100..600).contains(c)).unwrap_or(500),
            });
        }
        Ok(bytes)
    }
}

fn codec() -> tonic_prost::ProstCodec<Payload, Payload> {
    tonic_prost::ProstCodec::default()
}

/// A request payload: the JSON body with its `requestId`, `module` and
/// headers (the headers ride in the metadata, as the Nacos clients send
/// them).
fn payload(kind: &str, module: &str, mut body: Value, headers: Headers) -> Payload {
    static SEQ: AtomicU64 = AtomicU64::new(1);
    let mut map: HashMap<String, String> = headers.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    map.insert("app".into(), "meshbridge".into());
    if let Some(obj) = body.as_object_mut() {
        obj.entry("requestId").or_insert_with(|| SEQ.fetch_add(1, Ordering::Relaxed).to_string().into());
        obj.entry("module").or_insert_with(|| module.into());
        obj.entry("headers").or_insert_with(|| json!({}));
    }
    answer(kind, body, map)
}

/// A payload of class `kind` carrying `body` as is.
fn answer(kind: &str, body: Value, headers: HashMap<String, String>) -> Payload {
    Payload {
        metadata: Some(Metadata { r#type: kind.to_string(), headers, client_ip: String::new() }),
        body: Some(Body { type_url: String::new(), value: body.to_string().into() }),
    }
}

fn tokio_stream_from(rx: mpsc::Receiver<Payload>) -> impl futures::Stream<Item = Payload> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|p| (p, rx)) })
}

/// Read what the server sends on the bi-stream and answer every request
/// (see [`ServerRequest`]); a `ConnectResetRequest` or the end of the
/// stream closes the connection, and the session connects again.
async fn read_stream(
    registry: String,
    mut inbound: tonic::Streaming<Payload>,
    outbox: mpsc::Sender<Payload>,
    pushes: PushSink,
    closed: Arc<Closed>,
) {
    loop {
        let message = match inbound.next().await {
            Some(Ok(message)) => message,
            Some(Err(status)) => {
                debug!(registry, code = ?status.code(), "nacos bi-stream failed");
                break;
            }
            None => break,
        };
        let kind = message.metadata.as_ref().map(|m| m.r#type.as_str()).unwrap_or_default();
        let body = message.body.as_ref().map(|b| &b.value[..]).unwrap_or_default();
        let request = ServerRequest::read(kind, body);
        let reply = request.answer();
        let reset = match request {
            ServerRequest::Push(push, _) => {
                trace!(registry, bytes = body.len(), "nacos push");
                match push {
                    Ok(push) => pushes(push),
                    Err(reason) => debug!(registry, %reason, "nacos push ignored"),
                }
                false
            }
            ServerRequest::Detection(_) => false,
            ServerRequest::Reset(_) => {
                debug!(registry, "nacos server asked to reconnect");
                true
            }
            ServerRequest::SetupAck => {
                debug!(registry, "nacos server acknowledged the connection setup");
                false
            }
            ServerRequest::Unknown(request_id) => {
                debug!(registry, kind, %request_id, "nacos server request not known: answered with an error");
                false
            }
            ServerRequest::NotARequest => {
                debug!(registry, kind, "nacos bi-stream message that is not a request ignored");
                false
            }
        };
        if let Some(reply) = reply
            && outbox.try_send(reply).is_err()
        {
            debug!(registry, "nacos bi-stream outbox full or closed");
            break;
        }
        if reset {
            // Answered first, as the Java client does; the answer is sent
            // if the stream still runs when the session drops this
            // connection.
            break;
        }
    }
    closed.done.store(true, Ordering::SeqCst);
    closed.notify.notify_waiters();
}

/// One message the server sent on the bi-stream, and how the client answers
/// it, as the Java client does (`GrpcClient.bindRequestStream`, the
/// `ServerRequestHandler`s of `RpcClient` and `NamingGrpcClientProxy`):
/// every `ServerRequest` gets a response carrying its `requestId`.
#[derive(Debug)]
pub(crate) enum ServerRequest {
    /// `NotifySubscriberRequest`: the service's instances (or why they could
    /// not be read); answered `NotifySubscriberResponse` either way.
    Push(Result<Push, BadPush>, Value),
    /// `ClientDetectionRequest`: the server checks the client is alive;
    /// answered `ClientDetectionResponse`.
    Detection(Value),
    /// `ConnectResetRequest`: answered `ConnectResetResponse`, then the
    /// connection is closed and the session connects again. (The Java
    /// client may switch to the `serverIp`/`serverPort` it names; the
    /// session goes on with its own server list.)
    Reset(Value),
    /// `SetupAckRequest` (Nacos 2.3+): the server's abilities after a setup
    /// that carried an `abilityTable` (ours does, empty). The server sends it
    /// without waiting for an answer (`sendRequestNoAck`) and the Java
    /// client sends none: an answer would reach the server as the ack of an
    /// unknown request, which it logs as a warning.
    SetupAck,
    /// Any other request (config pushes, fuzzy-watch notifications, metric
    /// queries: what a naming client never asked for, or a newer server's
    /// requests): answered with an `ErrorResponse` carrying its
    /// `requestId`, so the server does not wait for its timeout.
    Unknown(Value),
    /// A response (`…Response`): the server answers our requests on the
    /// unary call, so nothing is owed; ignored, as the Java client does.
    NotARequest,
}

impl ServerRequest {
    /// Decode the message of class `kind` with JSON `body`: only what is
    /// needed to answer it. A push is decoded straight into its fields:
    /// the server pushes every service once after its subscription (10k
    /// pushes at 10k services), and rnacos again whenever its health checks
    /// of persistent instances touch one (15–20 a second at 10k, at rest).
    pub(crate) fn read(kind: &str, body: &[u8]) -> ServerRequest {
        match kind {
            "NotifySubscriberRequest" => {
                let (push, request_id) = decode_push(body);
                ServerRequest::Push(push, request_id)
            }
            "ClientDetectionRequest" => ServerRequest::Detection(request_id(body)),
            "ConnectResetRequest" => ServerRequest::Reset(request_id(body)),
            "SetupAckRequest" => ServerRequest::SetupAck,
            _ if kind.ends_with("Response") => ServerRequest::NotARequest,
            _ => ServerRequest::Unknown(request_id(body)),
        }
    }

    /// The answer owed to the server, if any.
    pub(crate) fn answer(&self) -> Option<Payload> {
        let ok = |kind: &str, request_id: &Value| {
            answer(kind, json!({"resultCode": 200, "errorCode": 0, "requestId": request_id}), HashMap::new())
        };
        match self {
            ServerRequest::Push(_, id) => Some(ok("NotifySubscriberResponse", id)),
            ServerRequest::Detection(id) => Some(ok("ClientDetectionResponse", id)),
            ServerRequest::Reset(id) => Some(ok("ConnectResetResponse", id)),
            // `ErrorResponse.build(NacosException.CLIENT_ERROR, …)`: result
            // code 500 (`ResponseCode.FAIL`), error code -500.
            ServerRequest::Unknown(id) => Some(answer(
                "ErrorResponse",
                json!({"resultCode": 500, "errorCode": -500, "message": "request not supported by this client",
                       "requestId": id}),
                HashMap::new(),
            )),
            ServerRequest::SetupAck | ServerRequest::NotARequest => None,
        }
    }
}

/// The fields of a `NotifySubscriberRequest` a push is read from.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NotifySubscriber {
    #[serde(default)]
    request_id: Value,
    #[serde(default)]
    service_name: Option<String>,
    #[serde(default)]
    group_name: Option<String>,
    service_info: Option<ServiceInfo>,
}

/// The `requestId` of a server's request, to answer it with.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestId {
    #[serde(default)]
    request_id: Value,
}

fn request_id(body: &[u8]) -> Value {
    serde_json::from_slice::<RequestId>(body).map(|r| r.request_id).unwrap_or(Value::Null)
}

/// Why a `NotifySubscriberRequest` could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadPush {
    #[error("not a NotifySubscriberRequest: {0}")]
    Json(serde_json::Error),
    #[error("no serviceInfo")]
    NoServiceInfo,
    #[error("no serviceName")]
    NoServiceName,
}

/// The service and instances of a `NotifySubscriberRequest`'s JSON body
/// (or why none), and the `requestId` to answer it with.
pub(crate) fn decode_push(body: &[u8]) -> (Result<Push, BadPush>, Value) {
    let push: NotifySubscriber = match serde_json::from_slice(body) {
        Ok(push) => push,
        Err(e) => return (Err(BadPush::Json(e)), request_id(body)),
    };
    let Some(info) = push.service_info else {
        return (Err(BadPush::NoServiceInfo), push.request_id);
    };
    let text = |v: Option<String>| v.filter(|s| !s.is_empty());
    let Some(name) = text(push.service_name).or(info.name) else {
        return (Err(BadPush::NoServiceName), push.request_id);
    };
    let key = match (name.split_once("@@"), text(push.group_name).or(info.group_name)) {
        (Some((g, n)), _) => ServiceKey::new(g, n),
        (None, Some(g)) => ServiceKey::new(g, name),
        (None, None) => ServiceKey::new(super::decode::DEFAULT_GROUP, name),
    };
    (Ok(Push { key, instances: info.hosts.unwrap_or_default() }), push.request_id)
}

/// A channel of exactly one HTTP/2 connection to `addr`, over TLS with
/// `tls`.
async fn channel(
    registry: &str,
    addr: &str,
    tls: Option<&RegistryTls>,
    deadline: Duration,
) -> Result<Channel, RegistryError> {
    let unreachable = |reason: String| RegistryError::Unreachable {
        registry: registry.to_string(),
        reason: format!("connect {addr}: {reason}"),
    };
    let config = |reason: crate::tls::TlsConfigError| RegistryError::Config {
        registry: registry.to_string(),
        field: "registryTls".into(),
        reason: reason.to_string(),
    };
    let uri: Uri = format!("http://{addr}").parse().map_err(|e| unreachable(format!("{e}")))?;
    let endpoint = Endpoint::from(uri)
        .connect_timeout(deadline)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(deadline)
        .keep_alive_while_idle(true);
    let Some(tls) = tls else {
        return endpoint
            .connect()
            .await
            .map_err(|e| unreachable(crate::tls::tls_failure(&e).unwrap_or(error_chain(&e))));
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let name = crate::tls::server_name(tls, host).map_err(config)?;
    let connector = tokio_rustls::TlsConnector::from(crate::tls::client_config(tls, &[b"h2"]).map_err(config)?);
    let target = addr.to_string();
    let connect = tower::service_fn(move |_: Uri| {
        let (connector, name, target) = (connector.clone(), name.clone(), target.clone());
        async move {
            let tcp = tokio::net::TcpStream::connect(&target).await?;
            tcp.set_nodelay(true)?;
            let stream = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    endpoint
        .connect_with_connector(connect)
        .await
        .map_err(|e| unreachable(crate::tls::tls_failure(&e).unwrap_or(error_chain(&e))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn payload_field_numbers_match_the_nacos_proto() {
        let p = answer("X", json!({"a": 1}), HashMap::from([("k".to_string(), "v".to_string())]));
        let bytes = p.encode_to_vec();
        // Field 2 (metadata, length-delimited) first, then field 3 (body).
        assert_eq!(bytes[0], (2 << 3) | 2);
        let meta_len = bytes[1] as usize;
        assert_eq!(bytes[2 + meta_len], (3 << 3) | 2);
        // Inside metadata: type is field 3, headers field 7.
        assert_eq!(bytes[2], (3 << 3) | 2);
        assert!(bytes[2..2 + meta_len].contains(&((7 << 3) | 2)));
        assert_eq!(Payload::decode(bytes.as_slice()).unwrap(), p);
    }

    #[test]
    fn requests_carry_id_module_and_headers() {
        let p = payload("ServiceListRequest", "naming", json!({"pageNo": 1}), vec![("accessToken", "t".into())]);
        let meta = p.metadata.unwrap();
        assert_eq!(meta.r#type, "ServiceListRequest");
        assert_eq!(meta.headers.get("accessToken").map(String::as_str), Some("t"));
        let body: Value = serde_json::from_slice(&p.body.unwrap().value).unwrap();
        assert_eq!(body["module"], "naming");
        assert_eq!(body["pageNo"], 1);
        assert!(body["requestId"].is_string());
    }

    fn push(body: Value) -> (Result<Push, BadPush>, Value) {
        decode_push(&serde_json::to_vec(&body).unwrap())
    }

    #[test]
    fn pushes_name_their_service() {
        let body = json!({"requestId": "7", "serviceName": "web", "groupName": "g1", "serviceInfo": {"name": "web", "hosts": [{"ip": "10.0.0.1", "port": 80}]}});
        let (decoded, id) = push(body);
        let decoded = decoded.unwrap();
        assert_eq!(decoded.key, ServiceKey::new("g1", "web"));
        assert_eq!(decoded.instances.len(), 1);
        assert_eq!(id, "7");
        let grouped = json!({"serviceInfo": {"name": "g2@@api", "hosts": null}});
        assert_eq!(push(grouped).0.unwrap(), Push { key: ServiceKey::new("g2", "api"), instances: vec![] });
        let empty_name = json!({"serviceName": "", "serviceInfo": {"name": "api", "groupName": "g3"}});
        assert_eq!(push(empty_name).0.unwrap().key, ServiceKey::new("g3", "api"));
        let (decoded, id) = push(json!({"requestId": "8", "serviceInfo": {}}));
        assert!(matches!(decoded, Err(BadPush::NoServiceName)) && id == "8");
        let (decoded, id) = push(json!({"requestId": "9"}));
        assert!(matches!(decoded, Err(BadPush::NoServiceInfo)) && id == "9");
        assert_eq!(push(json!({"requestId": "10", "serviceInfo": null})).1, json!("10"));
    }

    #[test]
    fn a_push_not_understood_is_still_answered_with_its_request_id() {
        let (decoded, id) = push(json!({"requestId": "11", "serviceInfo": {"hosts": "not a list"}}));
        let reason = decoded.unwrap_err().to_string();
        assert!(reason.starts_with("not a NotifySubscriberRequest: invalid type"), "{reason}");
        assert_eq!(id, "11");
        let (decoded, id) = decode_push(b"not json");
        assert!(decoded.is_err());
        assert_eq!(id, Value::Null);
    }

    /// The class and JSON body of the answer to a server's `kind` request.
    fn answered(kind: &str, body: Value) -> Option<(String, Value)> {
        let reply = ServerRequest::read(kind, &serde_json::to_vec(&body).unwrap()).answer()?;
        let body = serde_json::from_slice(&reply.body.unwrap().value).unwrap();
        Some((reply.metadata.unwrap().r#type, body))
    }

    #[test]
    fn every_server_request_is_answered_with_its_request_id() {
        let push = json!({"requestId": "1", "serviceName": "web", "serviceInfo": {"name": "web", "hosts": []}});
        let ok = |id: &str| json!({"resultCode": 200, "errorCode": 0, "requestId": id});
        assert_eq!(answered("NotifySubscriberRequest", push), Some(("NotifySubscriberResponse".into(), ok("1"))));
        assert_eq!(
            answered("ClientDetectionRequest", json!({"requestId": "2", "module": "internal"})),
            Some(("ClientDetectionResponse".into(), ok("2")))
        );
        let reset = json!({"requestId": "3", "serverIp": "10.0.0.2", "serverPort": "8848", "module": "internal"});
        assert_eq!(answered("ConnectResetRequest", reset), Some(("ConnectResetResponse".into(), ok("3"))));
        // Requests a naming client never asked for, and one from a server
        // newer than this client: an error, with the id.
        for kind in
            ["ConfigChangeNotifyRequest", "NamingFuzzyWatchSyncRequest", "ClientConfigMetricRequest", "NextRequest"]
        {
            let (class, body) = answered(kind, json!({"requestId": "4", "module": "x"})).expect(kind);
            assert_eq!(class, "ErrorResponse", "{kind}");
            assert_eq!(
                body,
                json!({"resultCode": 500, "errorCode": -500, "message": "request not supported by this client", "requestId": "4"})
            );
        }
        // A body that is not JSON still gets an answer (no id to give).
        let reply = ServerRequest::read("NextRequest", b"not json").answer().unwrap();
        let body: Value = serde_json::from_slice(&reply.body.unwrap().value).unwrap();
        assert_eq!(body["requestId"], Value::Null);
    }

    #[test]
    fn setup_acks_and_responses_are_not_answered_and_a_reset_closes() {
        let abilities = json!({"requestId": "5", "abilityTable": {"supportPersistentInstanceByGrpc": true}});
        assert!(matches!(
            ServerRequest::read("SetupAckRequest", abilities.to_string().as_bytes()),
            ServerRequest::SetupAck
        ));
        assert_eq!(answered("SetupAckRequest", abilities), None);
        assert_eq!(answered("ServerCheckResponse", json!({"requestId": "6", "resultCode": 200})), None);
        assert!(matches!(ServerRequest::read("ConnectResetRequest", b"{}"), ServerRequest::Reset(Value::Null)));
    }
}
