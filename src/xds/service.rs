//! The ADS gRPC service, routed by hand instead of through envoy-types'
//! generated server, whose trait fixes the SotW response type to the prost
//! `DiscoveryResponse`. Here SotW streams send [`SotwResponse`]s, whose
//! resources are encoded once per type state and shared between streams
//! (see [`super::response`]), and take requests with their resource names
//! packed ([`super::request`]); on the wire these are the same messages. Delta
//! streams send the generated `DeltaDiscoveryResponse` as before.

use std::convert::Infallible;
use std::marker::PhantomData;

use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body as HttpBody, BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Status, Streaming};

use super::request::SotwRequest;
use super::response::SotwResponse;
use super::{AdsServer, BoxStream};

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`.
pub const SERVICE_NAME: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The ADS service for a tonic server ([`AdsServer::into_service`]).
#[derive(Clone)]
pub struct AdsService {
    server: AdsServer,
    max_request: usize,
    max_response: usize,
}

impl AdsService {
    pub(super) fn new(server: AdsServer, max_request: usize, max_response: usize) -> Self {
        AdsService { server, max_request, max_response }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = SERVICE_NAME;
}

struct Sotw(AdsServer);

impl StreamingService<SotwRequest> for Sotw {
    type Response = SotwResponse;
    type ResponseStream = BoxStream<SotwResponse>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;
    fn call(&mut self, request: tonic::Request<Streaming<SotwRequest>>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move { server.sotw(request) })
    }
}

struct Delta(AdsServer);

impl StreamingService<DeltaDiscoveryRequest> for Delta {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream = BoxStream<DeltaDiscoveryResponse>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;
    fn call(&mut self, request: tonic::Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move { server.delta(request) })
    }
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: HttpBody + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (server, limits) = (self.server.clone(), (Some(self.max_request), Some(self.max_response)));
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(ProtoCodec::<SotwResponse, SotwRequest>::default())
                    .apply_max_message_size_config(limits.0, limits.1);
                Ok(grpc.streaming(Sotw(server), req).await)
            }),
            DELTA_PATH => Box::pin(async move {
                let mut grpc = Grpc::new(ProtoCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default())
                    .apply_max_message_size_config(limits.0, limits.1);
                Ok(grpc.streaming(Delta(server), req).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// Protobuf over gRPC for any prost message: what tonic-prost's codec
/// does, kept here so that the response type may be our own [`Message`].
struct ProtoCodec<E, D>(PhantomData<fn() -> (E, D)>);

impl<E, D> Default for ProtoCodec<E, D> {
    fn default() -> Self {
        ProtoCodec(PhantomData)
    }
}

impl<E: Message + 'static, D: Message + Default + 'static> Codec for ProtoCodec<E, D> {
    type Encode = E;
    type Decode = D;
    type Encoder = ProtoCodec<E, ()>;
    type Decoder = ProtoCodec<(), D>;

    fn encoder(&mut self) -> Self::Encoder {
        ProtoCodec(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProtoCodec(PhantomData)
    }
}

impl<E: Message> Encoder for ProtoCodec<E, ()> {
    type Item = E;
    type Error = Status;
    fn encode(&mut self, item: E, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // One allocation for the whole message (a SotW collection is
        // megabytes), instead of growing the buffer as it fills.
        buf.reserve(item.encoded_len());
        item.encode(buf).map_err(|e| Status::internal(e.to_string()))
    }
}

impl<D: Message + Default> Decoder for ProtoCodec<(), D> {
    type Item = D;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        // gRPC status codes: a message that does not parse is INTERNAL.
        D::decode(buf).map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}
