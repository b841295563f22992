//! HTTP/1.1 connections to one Consul agent, at most `cap` of them, each
//! used by one request at a time, or lent raw ([`Pool::checkout_raw`]) for
//! a batch of pipelined index probes (`pipeline.rs`).
//!
//! Owned here rather than left to reqwest's pool because the cap must be a
//! hard bound on TCP connections, not on requests: a pooling client starts
//! a new connection whenever no idle one is *ready* at that instant, and an
//! HTTP/1 connection goes back to its pool a moment after its answer is
//! read, so bursts of short reads open extra connections (measured: 10 with
//! 8 requests in flight at most). Here a request waits for a free
//! connection, or opens one only while fewer than `cap` exist.
//!
//! When Consul refuses a new connection for its per-client limit (other
//! clients on this host hold the rest), the pool keeps the connections it
//! has and stops opening more ([`Pool::limit_reached`]) instead of failing
//! call after call; it tries its full cap again after [`RETRY_FULL_CAP`].

use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::error_chain::{causes, error_chain};

type Sender = SendRequest<Empty<Bytes>>;

/// A connected stream, plain or TLS.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}
pub(crate) type Io = Box<dyn Stream>;

/// A connection lent raw for pipelined probes. A plain TCP one is kept out
/// of tokio's reactor (`Polled`): its answers arrive one TCP segment each
/// (Consul writes every answer on its own, with `TCP_NODELAY`), and a
/// socket in the reactor wakes a parked worker for every segment, which
/// was most of a probe's CPU (`pipeline.rs` reads it on a timer instead).
/// A TLS one stays an ordinary stream.
pub(crate) enum Raw {
    Polled(std::net::TcpStream),
    Stream(Io),
}

impl Raw {
    /// Back into the reactor, for hyper.
    fn into_io(self) -> io::Result<Io> {
        match self {
            Raw::Polled(tcp) => Ok(Box::new(TcpStream::from_std(tcp)?)),
            Raw::Stream(io) => Ok(io),
        }
    }
}

/// An idle connection: driven by hyper, or raw (last used for pipelined
/// probes; hyper takes it over with a handshake, which sends nothing).
enum Idle {
    Http(Sender),
    Raw(Raw),
}

/// How long a pooled connection may take to say it is ready again.
const READY_TIMEOUT: Duration = Duration::from_secs(1);
/// After Consul's connection limit shrank the pool, how long before the
/// pool tries to open connections up to its full cap again.
const RETRY_FULL_CAP: Duration = Duration::from_secs(60);

/// Why no connection could be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    #[error("connect failed: {0}")]
    Connect(io::Error),
    #[error("connect failed: timed out")]
    ConnectTimeout,
    /// The TLS handshake failed (already described by `tls::tls_failure`
    /// when rustls said why).
    #[error("connect failed: {0}")]
    Tls(String),
    #[error("connect failed: {0}")]
    Handshake(hyper::Error),
}

/// TLS to Consul: the connector and the name to verify.
#[derive(Clone)]
pub(crate) struct PoolTls {
    pub connector: tokio_rustls::TlsConnector,
    pub server_name: rustls::pki_types::ServerName<'static>,
}

pub(crate) struct Pool {
    /// Host to connect to (IPv6 without brackets) and port.
    host: String,
    port: u16,
    /// The configured cap.
    cap: usize,
    connect_timeout: Duration,
    /// `None`: plain HTTP.
    tls: Option<PoolTls>,
    state: Mutex<State>,
    /// A connection went idle or away.
    changed: Notify,
}

struct State {
    idle: Vec<Idle>,
    /// Connections that exist or are being opened (idle ones included).
    live: usize,
    /// The cap in force: the configured one, or fewer since Consul's
    /// connection limit was reached (and when).
    cap: usize,
    shrunk_at: Option<Instant>,
}

impl Pool {
    pub fn new(host: &str, port: u16, cap: usize, connect_timeout: Duration, tls: Option<PoolTls>) -> Pool {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        let cap = cap.max(1);
        let state = State { idle: Vec::new(), live: 0, cap, shrunk_at: None };
        Pool { host, port, cap, connect_timeout, tls, state: Mutex::new(state), changed: Notify::new() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state, with the full cap back once a shrink has lasted
    /// `RETRY_FULL_CAP`.
    fn state_for_checkout(&self) -> MutexGuard<'_, State> {
        let mut st = self.state();
        if st.shrunk_at.is_some_and(|at| at.elapsed() >= RETRY_FULL_CAP) {
            st.cap = self.cap;
            st.shrunk_at = None;
        }
        st
    }

    /// A connection for one request: an idle one, a new one while fewer
    /// than `cap` exist, or else the next one freed.
    pub async fn checkout(&self) -> Result<Lease<'_>, PoolError> {
        loop {
            // `None`: a place for a new connection.
            let idle = self
                .claim(|st| {
                    // An idle hyper connection first: raw ones are kept for
                    // sweeps (taking one over is free, going back is not).
                    let http = st.idle.iter().rposition(|c| matches!(c, Idle::Http(_)));
                    let idle = match http {
                        Some(at) => Some(st.idle.swap_remove(at)),
                        None => st.idle.pop(),
                    };
                    if idle.is_some() {
                        Some(idle)
                    } else if st.live < st.cap {
                        st.live += 1;
                        Some(None)
                    } else {
                        None
                    }
                })
                .await;
            // Holds the place: dropped without a connection, it frees it.
            let mut slot = Lease { pool: self, conn: None, reusable: false, reused: false };
            match idle {
                Some(Idle::Http(mut conn)) => {
                    if matches!(tokio::time::timeout(READY_TIMEOUT, conn.ready()).await, Ok(Ok(()))) {
                        slot.conn = Some(conn);
                        slot.reused = true;
                        return Ok(slot);
                    }
                    // Closed by Consul while idle: forget it (dropping the
                    // slot frees its place) and look again.
                    debug!("idle consul connection closed");
                }
                Some(Idle::Raw(raw)) => {
                    slot.conn = Some(handshake(raw.into_io().map_err(PoolError::Connect)?).await?);
                    slot.reused = true;
                    return Ok(slot);
                }
                None => {
                    slot.conn = Some(handshake(self.connect().await?).await?);
                    return Ok(slot);
                }
            }
        }
    }

    /// A connection for a batch of pipelined requests: an idle raw one, a
    /// new one while fewer than `cap` exist, a new one in place of an idle
    /// hyper one (closed: its state cannot be taken back from hyper), or
    /// else the next one freed.
    pub async fn checkout_raw(&self) -> Result<RawLease<'_>, PoolError> {
        // `None`: a place for a new connection.
        let idle = self
            .claim(|st| {
                if let Some(at) = st.idle.iter().rposition(|c| matches!(c, Idle::Raw(_))) {
                    match st.idle.swap_remove(at) {
                        Idle::Raw(raw) => Some(Some(raw)),
                        Idle::Http(_) => unreachable!("position of a raw connection"),
                    }
                } else if st.live < st.cap {
                    st.live += 1;
                    Some(None)
                } else if let Some(http) = st.idle.pop() {
                    // Its place goes to the new connection (`live` unchanged).
                    drop(http);
                    Some(None)
                } else {
                    None
                }
            })
            .await;
        let mut slot = RawLease { pool: self, io: None, reusable: false };
        slot.io = Some(match idle {
            Some(raw) => raw,
            None if self.tls.is_some() => Raw::Stream(self.connect().await?),
            None => Raw::Polled(self.connect_tcp().await?.into_std().map_err(PoolError::Connect)?),
        });
        Ok(slot)
    }

    /// Wait until `pick` takes something from the state: it is asked now
    /// and again after every release (`None`: all `cap` are in use).
    async fn claim<T>(&self, mut pick: impl FnMut(&mut State) -> Option<T>) -> T {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            // Registered before looking, so a release in between wakes us.
            notified.as_mut().enable();
            if let Some(found) = pick(&mut self.state_for_checkout()) {
                return found;
            }
            notified.await;
        }
    }

    async fn connect_tcp(&self) -> Result<TcpStream, PoolError> {
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(PoolError::Connect(e)),
            Err(_) => return Err(PoolError::ConnectTimeout),
        };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    async fn connect(&self) -> Result<Io, PoolError> {
        let stream = self.connect_tcp().await?;
        let Some(tls) = &self.tls else {
            return Ok(Box::new(stream));
        };
        // The handshake counts against the connect timeout too.
        let connect = tls.connector.connect(tls.server_name.clone(), stream);
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                let reason = crate::tls::tls_failure(&e).unwrap_or_else(|| format!("TLS handshake failed: {e}"));
                return Err(PoolError::Tls(reason));
            }
            Err(_) => return Err(PoolError::Tls("TLS handshake timed out".into())),
        };
        Ok(Box::new(stream))
    }

    /// Consul refused a connection for its per-client limit, while the
    /// refused connection's lease still counts as live: keep the others and
    /// open no more for a while (at least one stays allowed).
    pub fn limit_reached(&self) {
        let mut st = self.state();
        let cap = st.live.saturating_sub(1).max(1);
        if cap < st.cap {
            warn!(cap, configured = self.cap, "consul connection limit reached: using fewer connections");
            st.cap = cap;
        }
        st.shrunk_at = Some(Instant::now());
    }

    /// How many connections exist now (idle or in use).
    #[cfg(test)]
    pub fn live(&self) -> usize {
        self.state().live
    }
}

/// HTTP/1.1 on a connected stream (plain or TLS). The connection's own task
/// ends when its sender is dropped or the peer closes.
async fn handshake(stream: Io) -> Result<Sender, PoolError> {
    let (sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(PoolError::Handshake)?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            debug!(error = %e, "consul connection ended");
        }
    });
    Ok(sender)
}

/// One connection, lent for one request. Dropped: back to the pool if the
/// request completed ([`Lease::done`]), closed otherwise.
pub(crate) struct Lease<'a> {
    pool: &'a Pool,
    conn: Option<Sender>,
    reusable: bool,
    /// The connection served a request before (it was idle in the pool).
    reused: bool,
}

impl Lease<'_> {
    /// The connection was idle in the pool, not opened for this request: a
    /// load balancer or NAT may have dropped it meanwhile without a word.
    pub fn reused(&self) -> bool {
        self.reused
    }

    pub async fn send(&mut self, req: hyper::Request<Empty<Bytes>>) -> Result<hyper::Response<Incoming>, SendError> {
        match self.conn.as_mut() {
            Some(conn) => conn.send_request(req).await.map_err(|e| SendError(Some(e))),
            None => Err(SendError(None)),
        }
    }

    /// The answer was read whole: the connection can serve another request.
    pub fn done(&mut self) {
        self.reusable = true;
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut st = self.pool.state();
        match self.conn.take() {
            Some(conn) if self.reusable && !conn.is_closed() => st.idle.push(Idle::Http(conn)),
            _ => st.live = st.live.saturating_sub(1),
        }
        drop(st);
        self.pool.changed.notify_one();
    }
}

/// One raw connection, lent for a batch of pipelined requests. Dropped:
/// back to the pool if every answer was read whole ([`RawLease::done`]),
/// closed otherwise (answers may still be on their way).
pub(crate) struct RawLease<'a> {
    pool: &'a Pool,
    io: Option<Raw>,
    reusable: bool,
}

impl RawLease<'_> {
    pub fn io(&mut self) -> Option<&mut Raw> {
        self.io.as_mut()
    }

    /// Every answer was read and nothing more was sent: reusable.
    pub fn done(&mut self) {
        self.reusable = true;
    }
}

impl Drop for RawLease<'_> {
    fn drop(&mut self) {
        let mut st = self.pool.state();
        match self.io.take() {
            Some(io) if self.reusable => st.idle.push(Idle::Raw(io)),
            _ => st.live = st.live.saturating_sub(1),
        }
        drop(st);
        self.pool.changed.notify_one();
    }
}

/// A request that failed on its connection (`None`: it had none).
#[derive(Debug, thiserror::Error)]
#[error("request failed: {}", self.0.as_ref().map_or_else(|| "no connection".to_string(), |e| error_chain(e)))]
pub(crate) struct SendError(Option<hyper::Error>);

impl SendError {
    /// The peer closed (or reset) the connection before any answer.
    pub fn closed_before_answer(&self) -> bool {
        let Some(e) = &self.0 else { return true };
        if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
            return true;
        }
        // The first io::Error among the causes says how it ended.
        let io = causes(e).skip(1).find_map(|s| s.downcast_ref::<io::Error>());
        use io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
        io.is_some_and(|io| matches!(io.kind(), ConnectionReset | ConnectionAborted | BrokenPipe))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A keep-alive HTTP server that answers every request after `delay`,
    /// counting the connections it accepted.
    async fn server(delay: Duration) -> (u16, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        tokio::time::sleep(delay).await;
                        let resp = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                        if conn.write_all(resp.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (port, accepted)
    }

    async fn get(pool: &Pool) {
        let mut lease = pool.checkout().await.unwrap();
        request(&mut lease).await;
    }

    async fn request(lease: &mut Lease<'_>) {
        use http_body_util::BodyExt;
        let req = hyper::Request::get("/").header("host", "x").body(Empty::new()).unwrap();
        let resp = lease.send(req).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
        lease.done();
    }

    #[tokio::test]
    async fn never_more_connections_than_the_cap() {
        let (port, accepted) = server(Duration::from_millis(5)).await;
        let pool = Arc::new(Pool::new("127.0.0.1", port, 3, Duration::from_secs(1), None));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..40 {
            let pool = pool.clone();
            tasks.spawn(async move {
                for _ in 0..5 {
                    get(&pool).await;
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "200 requests over exactly 3 connections");
        assert_eq!(pool.live(), 3);
    }

    #[tokio::test]
    async fn a_reached_limit_shrinks_the_pool_to_what_it_holds() {
        let (port, accepted) = server(Duration::from_millis(5)).await;
        let pool = Arc::new(Pool::new("127.0.0.1", port, 4, Duration::from_secs(1), None));
        // Two connections work, a third is refused by the limit.
        let (mut a, mut b) = (pool.checkout().await.unwrap(), pool.checkout().await.unwrap());
        request(&mut a).await;
        request(&mut b).await;
        let c = pool.checkout().await.unwrap();
        pool.limit_reached();
        drop(c);
        drop((a, b));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..10 {
            let pool = pool.clone();
            tasks.spawn(async move { get(&pool).await });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "no new connection after the limit");
        assert!(pool.live() <= 2, "{}", pool.live());
    }

    /// One request on a raw connection, which plain TCP lends polled.
    async fn raw_get(raw: &mut Raw) {
        use std::io::{ErrorKind, Read, Write};
        let Raw::Polled(tcp) = raw else { panic!("plain TCP is lent polled") };
        (&*tcp).write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let mut buf = [0u8; 64];
        let mut got = 0;
        while !buf[..got].ends_with(b"ok") {
            match (&*tcp).read(&mut buf[got..]) {
                Ok(0) => panic!("closed"),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => tokio::time::sleep(Duration::from_millis(1)).await,
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[tokio::test]
    async fn raw_and_http_leases_share_the_cap_and_the_connections() {
        let (port, accepted) = server(Duration::from_millis(1)).await;
        let pool = Pool::new("127.0.0.1", port, 2, Duration::from_secs(1), None);
        // A raw lease given back whole is taken over by hyper: no new connection.
        let mut raw = pool.checkout_raw().await.unwrap();
        raw_get(raw.io().unwrap()).await;
        raw.done();
        drop(raw);
        get(&pool).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // With the cap held by an http lease and an idle http connection, a
        // raw lease takes the idle one's place.
        let busy = pool.checkout().await.unwrap();
        get(&pool).await;
        assert_eq!(pool.live(), 2);
        let raw = pool.checkout_raw().await.unwrap();
        assert_eq!(pool.live(), 2, "never over the cap");
        // The server counts a connection once its accept loop ran.
        for _ in 0..100 {
            if accepted.load(Ordering::SeqCst) == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        // Not given back whole: closed, its place freed.
        drop(raw);
        assert_eq!(pool.live(), 1);
        drop(busy);
    }

    #[tokio::test]
    async fn a_failed_connect_frees_its_place() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let pool = Pool::new("127.0.0.1", port, 1, Duration::from_secs(1), None);
        for _ in 0..3 {
            assert!(matches!(pool.checkout().await, Err(PoolError::Connect(_))));
        }
        assert_eq!(pool.live(), 0);
    }
}
