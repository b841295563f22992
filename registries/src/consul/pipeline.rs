//! HTTP/1.1 pipelining of index probes: a sweep writes a batch of probe
//! requests in one write on one raw pooled connection and reads the answers
//! in order. Consul's Go `net/http` server reads pipelined requests off a
//! keep-alive connection and answers them one after the other, in order
//! (RFC 9112 §9.3.2: a server "MUST send its responses to those requests in
//! the same order that the requests were received").
//!
//! Only the status line and the headers are parsed (`X-Consul-Index`,
//! `Content-Length`, `Connection`, `Transfer-Encoding`); the body (`[]`) is
//! skipped. Every read is capped. Anything unexpected (not 200, `Connection:
//! close`, a body without `Content-Length`, no index, over a cap) ends the
//! batch: the probes not answered go through the one-request path, which
//! reports errors as every other call does, and the connection is closed.
//!
//! A plain TCP connection is read on a shared tick rather than through
//! tokio's reactor ([`Raw::Polled`], [`POLL_TICK`]): Consul sends each
//! answer as its own segment, and the reactor woke a worker for every one.

use std::io::{ErrorKind, Read, Write};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::pool::{Io, Raw};

/// The most header bytes of one answer (Consul's are about 300).
pub(crate) const MAX_HEAD_BYTES: usize = 8 << 10;
/// The most body bytes of one probe answer: `[]`, unless an instance
/// carries the probe tag after all; more goes through the one-request path.
pub(crate) const MAX_PROBE_BODY_BYTES: usize = 64 << 10;
/// Headers parsed per answer at most (Consul sends 8).
const MAX_HEADERS: usize = 32;
/// Bytes asked of the stream per read.
const READ_CHUNK: usize = 16 << 10;
/// Bytes asked of a polled socket per read (on the stack).
const POLLED_CHUNK: usize = 8 << 10;

/// Why a batch ended before its last answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Oddity {
    /// An answer other than 200 (the one-request path says what it means).
    Status(u16),
    /// `Connection: close`, or an HTTP/1.0 answer.
    Close,
    /// A body without `Content-Length` (chunked or until close).
    NoLength,
    /// No usable `X-Consul-Index`.
    NoIndex,
    /// The header section is over [`MAX_HEAD_BYTES`] or has too many headers.
    HeadTooLarge,
    /// The body is over [`MAX_PROBE_BODY_BYTES`].
    BodyTooLarge,
    /// Not an HTTP/1.1 answer.
    Malformed,
    /// The connection ended or failed.
    Closed,
    /// Bytes after the last answer expected.
    Extra,
}

/// Answers parsed off a byte stream, in order.
#[derive(Default)]
pub(crate) struct Answers {
    buf: Vec<u8>,
    /// Where the next answer starts in `buf` (parsed bytes are dropped on
    /// the next feed, not one answer at a time).
    start: usize,
    /// Body bytes of every answer parsed.
    pub body_bytes: u64,
}

impl Answers {
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.drain(..self.start);
        self.start = 0;
        self.buf.extend_from_slice(bytes);
    }

    /// Parse every whole answer there is into `indexes`, up to `count` of
    /// them (more is left pending: [`Oddity::Extra`]).
    pub fn take_into(&mut self, indexes: &mut Vec<u64>, count: usize) -> Result<(), Oddity> {
        while indexes.len() < count {
            match self.next()? {
                Some(index) => indexes.push(index),
                None => break,
            }
        }
        Ok(())
    }

    /// Bytes received and not yet part of a parsed answer.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next whole answer's `X-Consul-Index`, `Ok(None)` when more bytes
    /// are needed. An error ends the batch: the buffer is left as it was.
    pub fn next(&mut self) -> Result<Option<u64>, Oddity> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut headers);
        let buf = &self.buf[self.start..];
        let head_len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => return Err(Oddity::HeadTooLarge),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Oddity::HeadTooLarge),
            Err(_) => return Err(Oddity::Malformed),
        };
        if head_len > MAX_HEAD_BYTES {
            return Err(Oddity::HeadTooLarge);
        }
        if resp.version != Some(1) {
            return Err(Oddity::Close);
        }
        let status = resp.code.unwrap_or(0);
        if status != 200 {
            return Err(Oddity::Status(status));
        }
        let (mut length, mut index) = (None, None);
        for h in resp.headers.iter() {
            let value = std::str::from_utf8(h.value).map(str::trim);
            if h.name.eq_ignore_ascii_case("content-length") {
                let n = value.ok().and_then(|v| v.parse::<usize>().ok()).ok_or(Oddity::NoLength)?;
                if length.is_some_and(|l| l != n) {
                    return Err(Oddity::NoLength);
                }
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(Oddity::NoLength);
            } else if h.name.eq_ignore_ascii_case("connection") {
                if value.is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close"))) {
                    return Err(Oddity::Close);
                }
            } else if h.name.eq_ignore_ascii_case("x-consul-index") {
                index = Some(value.ok().and_then(|v| v.parse::<u64>().ok()).ok_or(Oddity::NoIndex)?);
            }
        }
        let length = length.ok_or(Oddity::NoLength)?;
        if length > MAX_PROBE_BODY_BYTES {
            return Err(Oddity::BodyTooLarge);
        }
        let index = index.ok_or(Oddity::NoIndex)?;
        if buf.len() < head_len + length {
            return Ok(None);
        }
        self.start += head_len + length;
        self.body_bytes += length as u64;
        Ok(Some(index))
    }
}

/// How often a polled connection ([`Raw::Polled`]) is read while a batch
/// is out. Every polled connection of the process is read on the same
/// ticks (multiples of this since one epoch), so one timer wake-up serves
/// every batch in flight: about 1 / `POLL_TICK` wake-ups a second while a
/// sweep runs, instead of one per answer. An answer waits at most this long
/// to be read.
pub(crate) const POLL_TICK: Duration = Duration::from_millis(5);

/// Write `requests` (`count` of them) on `raw` and read their answers'
/// indexes in order. Returns the indexes read, and why it stopped early if
/// it did; the connection is reusable only when all `count` came with
/// nothing extra.
pub(crate) async fn exchange(raw: &mut Raw, requests: &[u8], count: usize) -> (Vec<u64>, Answers, Option<Oddity>) {
    match raw {
        Raw::Polled(tcp) => exchange_polled(tcp, requests, count).await,
        Raw::Stream(io) => exchange_stream(io, requests, count).await,
    }
}

/// [`exchange`] on a non-blocking socket outside the reactor: written and
/// read without waiting, then again at the next [`POLL_TICK`] until done.
async fn exchange_polled(
    tcp: &std::net::TcpStream,
    requests: &[u8],
    count: usize,
) -> (Vec<u64>, Answers, Option<Oddity>) {
    let mut answers = Answers::default();
    let mut indexes = Vec::with_capacity(count);
    let mut chunk = [0u8; POLLED_CHUNK];
    let mut written = 0;
    loop {
        while written < requests.len() {
            match (&*tcp).write(&requests[written..]) {
                Ok(0) => return (indexes, answers, Some(Oddity::Closed)),
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return (indexes, answers, Some(Oddity::Closed)),
            }
        }
        loop {
            match (&*tcp).read(&mut chunk) {
                Ok(0) => {
                    // Whatever came before the hang-up still counts.
                    if let Err(odd) = answers.take_into(&mut indexes, count) {
                        return (indexes, answers, Some(odd));
                    }
                    return (indexes, answers, Some(Oddity::Closed));
                }
                Ok(n) => answers.feed(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return (indexes, answers, Some(Oddity::Closed)),
            }
            // Parse as it comes, so that a full socket buffer never holds
            // more than one chunk unparsed.
            if let Err(odd) = answers.take_into(&mut indexes, count) {
                return (indexes, answers, Some(odd));
            }
        }
        if indexes.len() == count {
            let extra = (answers.pending() > 0).then_some(Oddity::Extra);
            return (indexes, answers, extra);
        }
        tokio::time::sleep_until(next_tick(Instant::now(), POLL_TICK).into()).await;
    }
}

/// The first multiple of `tick` after `now`, counted from one epoch for
/// the whole process, so that every connection polled on that tick is
/// read on the same timer wake-up.
pub(crate) fn next_tick(now: Instant, tick: Duration) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let tick_ns = tick.as_nanos().max(1);
    let ticks = now.saturating_duration_since(epoch).as_nanos() / tick_ns + 1;
    let at = u64::try_from(ticks * tick_ns).unwrap_or(u64::MAX);
    epoch + Duration::from_nanos(at)
}

/// [`exchange`] on a stream in the reactor (TLS). Answers are read while
/// the requests are still being written, so a batch larger than the socket
/// buffers cannot deadlock.
async fn exchange_stream(io: &mut Io, requests: &[u8], count: usize) -> (Vec<u64>, Answers, Option<Oddity>) {
    let (mut rd, mut wr) = tokio::io::split(io);
    let write = async move {
        let written = wr.write_all(requests).await;
        written.and(wr.flush().await)
    };
    let read = async move {
        let mut answers = Answers::default();
        let mut indexes = Vec::with_capacity(count);
        let mut chunk = vec![0u8; READ_CHUNK];
        while indexes.len() < count {
            match answers.next() {
                Ok(Some(index)) => {
                    indexes.push(index);
                    continue;
                }
                Ok(None) => {}
                Err(odd) => return (indexes, answers, Some(odd)),
            }
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return (indexes, answers, Some(Oddity::Closed)),
                Ok(n) => answers.feed(&chunk[..n]),
            }
        }
        let extra = (answers.pending() > 0).then_some(Oddity::Extra);
        (indexes, answers, extra)
    };
    tokio::pin!(write, read);
    let mut writing = true;
    loop {
        tokio::select! {
            written = &mut write, if writing => {
                if written.is_err() {
                    return (Vec::new(), Answers::default(), Some(Oddity::Closed));
                }
                writing = false;
            }
            // Every answer read means every request was written.
            done = &mut read => return done,
        }
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
