//! The request half of an ADS stream, decoded here instead of by tonic.
//!
//! tonic's `Streaming` decodes into one buffer per stream and keeps that
//! buffer's capacity for as long as the stream lives: after a large request
//! (Envoy's first EDS request names every cluster: about 300–600 KB at 10k
//! services) each stream held a buffer of that size. Measured with heaptrack
//! on the bench's meshbridge child (BENCHMARKS.md, "xDS memory"): 62 MiB
//! over 103 streams at 10k services. [`Requests`] reads gRPC's
//! length-prefixed messages ("Length-Prefixed-Message" in gRPC's
//! PROTOCOL-HTTP2) the same way, with the same limits and errors, but lets
//! go of a buffer larger than [`KEEP`] once the message that needed it is
//! decoded.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::Stream;
use hyper::body::{Body, Bytes};
use prost::Message;
use prost::bytes::{Buf, BytesMut};
use tonic::Status;

/// gRPC's message prefix: compressed flag and big-endian length.
const PREFIX: usize = 5;

/// A buffer up to this size is kept between messages (most requests, ACKs
/// of a few types, fit); a larger one is freed once it holds no more than
/// half of this (its rest is copied to a new buffer).
pub(super) const KEEP: usize = 16 << 10;

/// The decoded requests of one stream. Ends with `None` when the client
/// ends its half of the stream; a malformed or oversized message ends it
/// with an error (what tonic would answer).
pub struct Requests<D> {
    body: Pin<Box<tonic::body::Body>>,
    buf: BytesMut,
    max_message: usize,
    /// The body ended (or failed): only what is buffered is left.
    done: bool,
    _message: PhantomData<fn() -> D>,
}

impl<D> Requests<D> {
    pub(super) fn new<B>(body: B, max_message: usize) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<tonic::codegen::StdError>,
    {
        let body = Box::pin(tonic::body::Body::new(body));
        Requests { body, buf: BytesMut::new(), max_message, done: false, _message: PhantomData }
    }

    /// How many bytes the stream's buffer holds on to now (tests).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

impl<D: Message + Default> Requests<D> {
    /// The next whole message in the buffer, if one is there.
    fn decode_one(&mut self) -> Option<Result<D, Status>> {
        if self.buf.len() < PREFIX {
            return None;
        }
        if self.buf[0] != 0 {
            // tonic's answer to a compressed flag with no grpc-encoding
            // (compressed requests were already refused by their header).
            return Some(Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            )));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max_message {
            return Some(Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.max_message
            ))));
        }
        if self.buf.len() < PREFIX + len {
            // Room for the rest of this message in one allocation.
            self.buf.reserve(PREFIX + len - self.buf.len());
            return None;
        }
        self.buf.advance(PREFIX);
        let message = self.buf.split_to(len).freeze();
        if self.buf.capacity() > KEEP && self.buf.len() <= KEEP / 2 {
            // The message's bytes are freed with it; what is left (the
            // start of the next message, if any) moves to a small buffer.
            self.buf = BytesMut::from(&self.buf[..]);
        }
        // gRPC status codes: a message that does not parse is INTERNAL.
        Some(D::decode(message).map_err(|e| Status::internal(e.to_string())))
    }
}

impl<D: Message + Default> Stream for Requests<D> {
    type Item = Result<D, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(item) = this.decode_one() {
                if item.is_err() {
                    // Nothing after a broken message can be framed.
                    this.done = true;
                    this.buf = BytesMut::new();
                }
                return Poll::Ready(Some(item));
            }
            if this.done {
                if this.buf.is_empty() {
                    return Poll::Ready(None);
                }
                this.buf = BytesMut::new();
                return Poll::Ready(Some(Err(Status::internal("Unexpected EOF decoding stream."))));
            }
            match ready!(this.body.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // Trailers from a client carry nothing we use.
                    if let Ok(data) = frame.into_data() {
                        this.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(status)) => {
                    this.done = true;
                    this.buf = BytesMut::new();
                    return Poll::Ready(Some(Err(status)));
                }
                None => this.done = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::framed::framed;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use futures::StreamExt;
    use hyper::body::Frame;

    /// A body that yields `chunks` as data frames.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(Bytes::from(c)))))
        }
    }

    fn body(chunks: Vec<Vec<u8>>) -> Chunks {
        Chunks(chunks.into())
    }

    fn request(names: usize) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: "t".into(),
            resource_names: (0..names).map(|i| format!("cluster-{i:05}")).collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn messages_split_across_frames_decode_and_a_large_buffer_is_let_go() {
        let (big, small) = (request(5_000), request(1));
        let bytes = [framed(&big), framed(&small), framed(&small)].concat();
        // Frames of 1000 bytes: messages straddle them.
        let chunks: Vec<Vec<u8>> = bytes.chunks(1000).map(<[u8]>::to_vec).collect();
        let mut r = Requests::<DiscoveryRequest>::new(body(chunks), 1 << 20);
        assert_eq!(r.next().await.expect("one").expect("ok"), big);
        assert!(r.buffer_capacity() <= KEEP, "the big request's buffer went with it: {}", r.buffer_capacity());
        assert_eq!(r.next().await.expect("two").expect("ok"), small);
        assert_eq!(r.next().await.expect("three").expect("ok"), small);
        assert!(r.next().await.is_none());
    }

    #[tokio::test]
    async fn oversized_truncated_and_compressed_messages_are_errors() {
        let m = framed(&request(10));
        let mut r = Requests::<DiscoveryRequest>::new(body(vec![m.clone()]), m.len() - PREFIX - 1);
        let e = r.next().await.expect("an item").expect_err("over the limit");
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(e.message().contains("too large"), "{}", e.message());
        assert!(r.next().await.is_none(), "the stream ends after the error");

        let mut r = Requests::<DiscoveryRequest>::new(body(vec![m[..m.len() - 1].to_vec()]), 1 << 20);
        assert_eq!(r.next().await.expect("an item").expect_err("truncated").code(), tonic::Code::Internal);

        let mut compressed = m.clone();
        compressed[0] = 1;
        let mut r = Requests::<DiscoveryRequest>::new(body(vec![compressed]), 1 << 20);
        assert_eq!(r.next().await.expect("an item").expect_err("compressed").code(), tonic::Code::Internal);

        let mut garbage = vec![0, 0, 0, 0, 3];
        garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
        let mut r = Requests::<DiscoveryRequest>::new(body(vec![garbage]), 1 << 20);
        assert_eq!(r.next().await.expect("an item").expect_err("does not parse").code(), tonic::Code::Internal);
    }
}
