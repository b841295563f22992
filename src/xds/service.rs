//! The ADS gRPC service, routed by hand instead of through envoy-types'
//! generated server, whose trait fixes the SotW response type to the prost
//! `DiscoveryResponse`. Here SotW streams send [`SotwResponse`]s, whose
//! resources are encoded once per type state and shared between streams
//! (see [`super::response`]), and take requests with their resource names
//! packed ([`super::request`]); on the wire these are the same messages. Delta
//! streams send the generated `DeltaDiscoveryResponse` as before.

use std::convert::Infallible;

use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use prost::Message;
use tonic::Status;
use tonic::codegen::{Body as HttpBody, BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;

use super::framed::{FramedBody, Frames};
use super::inbound::Requests;
use super::request::SotwRequest;
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

impl AdsServer {
    /// The ADS service for a tonic server.
    pub fn into_service(self) -> AdsService {
        let max_request = self.limits.max_request_bytes;
        AdsService { server: self, max_request, max_response: 256 << 20 }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = SERVICE_NAME;
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: HttpBody<Data = hyper::body::Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (server, max_request, max_response) = (self.server.clone(), self.max_request, self.max_response);
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                Ok(match request::<SotwRequest, B>(req, max_request) {
                    Ok(request) => respond(server.sotw(request), max_response),
                    Err(status) => status.into_http(),
                })
            }),
            DELTA_PATH => Box::pin(async move {
                Ok(match request::<DeltaDiscoveryRequest, B>(req, max_request) {
                    Ok(request) => respond(server.delta(request), max_response),
                    Err(status) => status.into_http(),
                })
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The request half of a stream ([`Requests`]). Compressed requests are
/// refused as tonic refuses them without its compression features.
fn request<D, B>(req: http::Request<B>, max_request: usize) -> Result<tonic::Request<Requests<D>>, Status>
where
    D: Message + Default + Send + 'static,
    B: HttpBody<Data = hyper::body::Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if let Some(encoding) = req.headers().get("grpc-encoding")
        && encoding.as_bytes() != b"identity"
    {
        return Err(Status::unimplemented(format!(
            "Content is compressed with `{}` which isn't supported",
            String::from_utf8_lossy(encoding.as_bytes())
        )));
    }
    let req = req.map(|body| Requests::new(body, max_request));
    Ok(tonic::Request::from_http(req))
}

/// The response half: each message framed by [`FramedBody`], not tonic.
fn respond<M: Frames + Send + 'static>(
    response: Result<tonic::Response<BoxStream<M>>, Status>,
    max_response: usize,
) -> http::Response<tonic::body::Body> {
    match response {
        Ok(response) => {
            let (metadata, stream, extensions) = response.into_parts();
            let mut http = http::Response::new(tonic::body::Body::new(FramedBody::new(stream, max_response)));
            *http.headers_mut() = metadata.into_headers();
            http.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
            *http.extensions_mut() = extensions;
            http
        }
        Err(status) => status.into_http(),
    }
}
