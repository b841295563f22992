//! The response half of an ADS stream, framed here instead of by tonic.
//!
//! tonic's server body encodes every message into one buffer per stream and
//! keeps that buffer's capacity for as long as the stream lives: after a
//! stream's first response (all clusters and endpoints, megabytes at 10k
//! services) each stream held a buffer of that size. Measured by the bench
//! (BENCHMARKS.md, run 4): 105 blocks of about 8.4 MB, 72 % of meshbridge's
//! heap with 104 streams connected. Here each message is framed on its own
//! (gRPC's 5-byte prefix, then the message: "Length-Prefixed-Message" in
//! gRPC's PROTOCOL-HTTP2) into buffers that are freed once sent, and a SotW
//! response's shared resource encoding ([`super::response`]) is sent as it
//! is, without a copy.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::StreamExt;
use hyper::body::{Body, Bytes, Frame};
use prost::Message;
use prost::bytes::{BufMut, BytesMut};
use tonic::Status;
use tonic::codegen::http::HeaderMap;

use super::BoxStream;
use super::response::SotwResponse;

/// gRPC's message prefix: a compressed flag (0: we never compress) and the
/// length, big-endian.
const PREFIX: usize = 5;

/// A message as the chunks of its gRPC frame.
pub(super) trait Frames: Message {
    /// Push the next chunks of the frame of `self`, whose encoding is `len`
    /// bytes long; `at` is the caller's cursor, 0 at the start, kept between
    /// calls. True once the whole frame has been pushed.
    fn frames(&self, len: usize, at: &mut usize, out: &mut VecDeque<Bytes>) -> bool;
}

/// About how much of a delta response is encoded at a time: the body
/// encodes the next part only when h2 has taken the last one.
pub(super) const DELTA_PART_BYTES: usize = 256 * 1024;

fn prefix(buf: &mut BytesMut, len: usize) {
    buf.put_u8(0);
    // The caller has checked `len` against the response limit (well under 4 GiB).
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
}

/// A delta response is encoded a part at a time, as h2 takes them: a
/// client's first response holds every cluster or every endpoint (several
/// MB at 10k services), and 100 Envoys reconnecting at once each held
/// theirs whole in memory until sent.
impl Frames for super::response::DeltaResponse {
    fn frames(&self, len: usize, at: &mut usize, out: &mut VecDeque<Bytes>) -> bool {
        let mut buf = BytesMut::with_capacity((PREFIX + len).min(DELTA_PART_BYTES + DELTA_PART_BYTES / 8));
        if *at == 0 {
            prefix(&mut buf, len);
        }
        let done = self.encode_part(at, DELTA_PART_BYTES, &mut buf);
        out.push_back(buf.freeze());
        done
    }
}

/// A SotW response is its own few bytes around the shared encoding: all of
/// it at once.
impl Frames for SotwResponse {
    fn frames(&self, len: usize, _at: &mut usize, out: &mut VecDeque<Bytes>) -> bool {
        let shared = self.resources.chunks();
        let own = len - self.resources.encoded_len();
        let mut head = BytesMut::with_capacity(PREFIX + own);
        prefix(&mut head, len);
        self.encode_head(&mut head);
        let mut tail = head.split_off(head.len());
        self.encode_tail(&mut tail);
        out.push_back(head.freeze());
        out.extend(shared.iter().cloned());
        if !tail.is_empty() {
            out.push_back(tail.freeze());
        }
        true
    }
}

/// A server-streaming gRPC response body: each message's frame, then the
/// `grpc-status` trailers (OK at the end of the stream, or the stream's
/// error, as tonic sends them).
pub(super) struct FramedBody<M> {
    stream: BoxStream<M>,
    queue: VecDeque<Bytes>,
    /// A message partly framed: the message, its length and its cursor.
    current: Option<(M, usize, usize)>,
    max_message: usize,
    /// The trailers went out.
    done: bool,
}

/// The message is never pinned (it is only read, by reference).
impl<M> Unpin for FramedBody<M> {}

impl<M> FramedBody<M> {
    pub fn new(stream: BoxStream<M>, max_message: usize) -> Self {
        FramedBody { stream, queue: VecDeque::new(), current: None, max_message, done: false }
    }

    fn end(&mut self, status: Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.done = true;
        let mut trailers = HeaderMap::new();
        // A status whose message cannot be a header value: say so, plainly.
        if let Err(e) = status.add_header(&mut trailers) {
            trailers.clear();
            let _ = Status::internal(format!("unsendable status: {}", e.code())).add_header(&mut trailers);
        }
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }
}

impl<M: Frames + Send + 'static> Body for FramedBody<M> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(chunk) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if let Some((message, len, at)) = this.current.as_mut() {
                if message.frames(*len, at, &mut this.queue) {
                    this.current = None;
                }
                continue;
            }
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(this.stream.poll_next_unpin(cx)) {
                Some(Ok(message)) => {
                    let len = message.encoded_len();
                    if len > this.max_message {
                        // What tonic answers for a message over its send limit.
                        return this.end(Status::out_of_range(format!(
                            "Error, encoded message length too large: found {len} bytes, the limit is: {} bytes",
                            this.max_message
                        )));
                    }
                    this.current = Some((message, len, 0));
                }
                Some(Err(status)) => return this.end(status),
                None => return this.end(Status::ok("")),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.queue.is_empty()
    }
}

/// `message` as one uncompressed gRPC frame (tests).
#[cfg(test)]
pub(crate) fn framed(message: &impl prost::Message) -> Vec<u8> {
    let body = message.encode_to_vec();
    let mut out = vec![0];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Body as ResourceBody, EncodedResources};
    use crate::xds::response::DeltaResponse;
    use envoy_types::pb::google::protobuf::Any;

    /// Every frame of `body`, polled to its end: (data, trailers).
    fn drain<M: Frames + Send + 'static>(mut body: FramedBody<M>) -> (Vec<Bytes>, Vec<HeaderMap>) {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let (mut data, mut trailers) = (Vec::new(), Vec::new());
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => data.push(d),
                    Err(frame) => trailers.push(frame.into_trailers().expect("data or trailers")),
                },
                Poll::Ready(Some(Err(e))) => panic!("body error {e}"),
                Poll::Ready(None) => break,
                Poll::Pending => panic!("a ready stream must not pend"),
            }
        }
        assert!(body.is_end_stream());
        (data, trailers)
    }

    fn stream<M: Send + 'static>(items: Vec<Result<M, Status>>) -> BoxStream<M> {
        Box::pin(futures::stream::iter(items))
    }

    fn sotw(nonce: &str) -> SotwResponse {
        let bodies: Vec<ResourceBody> = (0..3u8)
            .map(|i| ResourceBody::new(Any { type_url: format!("type.googleapis.com/t{i}"), value: vec![i; 40] }))
            .collect();
        SotwResponse {
            version_info: "v1".into(),
            resources: EncodedResources::encode(bodies.iter()),
            type_url: "type.googleapis.com/t".into(),
            nonce: nonce.into(),
        }
    }

    fn status_of(trailers: &HeaderMap) -> (String, String) {
        let get = |k: &str| trailers.get(k).map(|v| v.to_str().expect("ascii").to_string()).unwrap_or_default();
        (get("grpc-status"), get("grpc-message"))
    }

    #[test]
    fn messages_are_length_prefixed_then_ok_trailers() {
        let (a, b) = (sotw("1"), sotw("2"));
        let (data, trailers) = drain(FramedBody::new(stream(vec![Ok(a.clone()), Ok(b.clone())]), 1 << 20));
        let sent: Vec<u8> = data.iter().flat_map(|d| d.iter().copied()).collect();
        assert_eq!(sent, [framed(&a), framed(&b)].concat());
        assert_eq!(trailers.len(), 1);
        assert_eq!(status_of(&trailers[0]).0, "0");
    }

    #[test]
    fn a_sotw_response_sends_its_shared_encoding_without_a_copy() {
        let a = sotw("1");
        let (data, _) = drain(FramedBody::new(stream(vec![Ok(a.clone())]), 1 << 20));
        let shared = a.resources.chunks();
        assert!(!shared.is_empty());
        for chunk in shared {
            assert!(
                data.iter().any(|d| d.as_ptr() == chunk.as_ptr() && d.len() == chunk.len()),
                "the resources went out as the shared buffers themselves"
            );
        }
    }

    #[test]
    fn delta_responses_frame_whole() {
        let r = DeltaResponse {
            type_url: "t".into(),
            nonce: "n".into(),
            removed_resources: vec!["x".into()],
            ..Default::default()
        };
        let (data, trailers) = drain(FramedBody::new(stream(vec![Ok(r.clone())]), 1 << 20));
        assert_eq!(data.concat(), framed(&r));
        assert_eq!(status_of(&trailers[0]).0, "0");
    }

    #[test]
    fn a_large_delta_response_is_encoded_a_part_at_a_time() {
        use crate::resources::Resource;
        use std::sync::Arc;
        // About 2 MB: eight parts or so.
        let resources: Vec<Arc<Resource>> = (0..2000u32)
            .map(|i| {
                let body = Any { type_url: "type.googleapis.com/t".into(), value: vec![(i % 200) as u8; 1000] };
                Arc::new(Resource::new(format!("r{i:05}"), body))
            })
            .collect();
        let r = DeltaResponse {
            resources,
            type_url: "t".into(),
            nonce: "n".into(),
            removed_resources: vec!["gone".into()],
        };
        let mut body = FramedBody::new(stream(vec![Ok(r.clone()), Ok(r.clone())]), 64 << 20);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        // The first poll encodes the first part only.
        let Poll::Ready(Some(Ok(first))) = Pin::new(&mut body).poll_frame(&mut cx) else { panic!("a frame") };
        let first = first.into_data().expect("data");
        assert!(first.len() >= DELTA_PART_BYTES && first.len() < DELTA_PART_BYTES + 2048, "{}", first.len());
        assert!(body.queue.is_empty(), "nothing encoded ahead of h2");
        let (rest, trailers) = drain(body);
        let sent = [vec![first], rest].concat();
        assert!(sent.len() > 2 * (r.encoded_len() / DELTA_PART_BYTES));
        assert_eq!(sent.concat(), [framed(&r), framed(&r)].concat());
        assert_eq!(status_of(&trailers[0]).0, "0");
    }

    #[test]
    fn a_stream_error_ends_with_its_status() {
        let items = vec![Ok(sotw("1")), Err(Status::resource_exhausted("too many streams"))];
        let (data, trailers) = drain(FramedBody::new(stream(items), 1 << 20));
        assert_eq!(data.concat(), framed(&sotw("1")));
        // grpc-message is percent-encoded (gRPC PROTOCOL-HTTP2).
        assert_eq!(status_of(&trailers[0]), ("8".to_string(), "too%20many%20streams".to_string()));
    }

    #[test]
    fn a_message_over_the_limit_ends_the_stream_out_of_range() {
        let big = sotw("1");
        let limit = big.encoded_len() - 1;
        let (data, trailers) = drain(FramedBody::new(stream(vec![Ok(big), Ok(sotw("2"))]), limit));
        assert!(data.is_empty(), "nothing of the oversized message, nor anything after it");
        let (code, message) = status_of(&trailers[0]);
        assert_eq!(code, "11");
        assert!(message.contains("too%20large"), "{message}");
    }
}
