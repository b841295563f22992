//! Bounds on what one xDS client can make the server hold or do, and the
//! connection wrapper that enforces the handshake and idle timeouts tonic
//! does not have.
//!
//! | bound | default | enforced by |
//! | --- | --- | --- |
//! | request size | 4 MiB | tonic decoder (`max_decoding_message_size`) |
//! | streams per connection | 16 | HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` |
//! | open streams, all clients | 4096 | a semaphore: `RESOURCE_EXHAUSTED` beyond it |
//! | keepalive | ping every 30 s, dead after 10 s | hyper HTTP/2 keepalive |
//! | connection age | 30 min, then GOAWAY; closed 10 s later | tonic `max_connection_age(_grace)` |
//! | handshake | 10 s to send the HTTP/2 preface | [`Conn`] |
//! | idle | 5 min without an open stream | [`Conn`] |
//! | type URL / resource name | 256 / 1024 bytes; 64 types per stream | the stream task: `INVALID_ARGUMENT` |
//! | TLS handshakes in progress | 256, each within the handshake timeout | [`super::tls::incoming`] |

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tonic::transport::server::Connected;

use super::auth::PeerAuth;

/// Longest type URL accepted (Envoy's and Istio's are under 100 bytes).
pub const MAX_TYPE_URL_BYTES: usize = 256;
/// Longest resource name accepted (a cluster name is at most ~300 bytes).
pub const MAX_RESOURCE_NAME_BYTES: usize = 1024;
/// `--xds-max-request-bytes`'s default: 32 MiB. It was 4 MiB (istiod's
/// gRPC default), which an Envoy with 100k clusters passes with its first
/// EDS request (BENCHMARKS.md, "100k services").
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 32 << 20;
/// Distinct type URLs one stream may ask for.
pub const MAX_TYPES_PER_STREAM: usize = 64;

use crate::time::parse_duration;

/// xDS server limits (`meshbridge run` flags). Durations take `ms`, `s`,
/// `m` or `h`; `0` turns a timeout off.
#[derive(Debug, Clone, clap::Args)]
pub struct XdsLimits {
    /// Largest request accepted from a client, in bytes. An Envoy's first
    /// EDS request names every cluster (SotW and delta alike), about 63
    /// bytes a name in the benches: 6.3 MB at 100k clusters, so the
    /// default leaves room for several hundred thousand.
    #[arg(long = "xds-max-request-bytes", env = "MESHBRIDGE_XDS_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,
    /// Open ADS streams, all clients together; more are refused with RESOURCE_EXHAUSTED.
    #[arg(long = "xds-max-streams", env = "MESHBRIDGE_XDS_MAX_STREAMS", default_value_t = 4096)]
    pub max_streams: usize,
    /// Concurrent streams on one HTTP/2 connection.
    #[arg(
        long = "xds-max-streams-per-connection",
        env = "MESHBRIDGE_XDS_MAX_STREAMS_PER_CONNECTION",
        default_value_t = 16
    )]
    pub max_streams_per_connection: u32,
    /// HTTP/2 keepalive ping interval.
    #[arg(long = "xds-keepalive-interval", env = "MESHBRIDGE_XDS_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,
    /// A connection whose ping is not answered within this is closed.
    #[arg(long = "xds-keepalive-timeout", env = "MESHBRIDGE_XDS_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,
    /// After this, a connection gets a GOAWAY (clients reconnect, spreading
    /// load after a restart); its streams are closed after the grace period.
    #[arg(long = "xds-max-connection-age", env = "MESHBRIDGE_XDS_MAX_CONNECTION_AGE", default_value = "30m", value_parser = parse_duration)]
    pub max_connection_age: Duration,
    #[arg(long = "xds-max-connection-age-grace", env = "MESHBRIDGE_XDS_MAX_CONNECTION_AGE_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub max_connection_age_grace: Duration,
    /// A connection that has not sent the HTTP/2 preface within this is closed.
    #[arg(long = "xds-handshake-timeout", env = "MESHBRIDGE_XDS_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// A connection without an open stream for this long is closed.
    #[arg(long = "xds-idle-timeout", env = "MESHBRIDGE_XDS_IDLE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// A state-of-the-world stream pushes each full-state type (every MCP
    /// collection to istiod, CDS and LDS) at most once per this window; the
    /// first change after a quiet window goes out at once. 0s: no window.
    #[arg(long = "xds-sotw-push-window", env = "MESHBRIDGE_XDS_SOTW_PUSH_WINDOW", default_value = "500ms", value_parser = parse_duration)]
    pub sotw_push_window: Duration,
    /// TLS and mTLS (not a limit, but the same server's flags).
    #[command(flatten)]
    pub tls: XdsTlsArgs,
}

impl Default for XdsLimits {
    fn default() -> Self {
        XdsLimits {
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_streams: 4096,
            max_streams_per_connection: 16,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(30 * 60),
            max_connection_age_grace: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(5 * 60),
            sotw_push_window: Duration::from_millis(500),
            tls: Default::default(),
        }
    }
}

/// TLS for the xDS server. Without `--xds-tls-cert` the server speaks
/// plaintext, and only loopback clients get Secrets.
#[derive(Debug, Clone, clap::Args)]
pub struct XdsTlsArgs {
    /// PEM certificate chain the xDS server presents; with --xds-tls-key
    /// the server speaks TLS only.
    #[arg(long = "xds-tls-cert", env = "MESHBRIDGE_XDS_TLS_CERT", requires = "xds_tls_key")]
    pub xds_tls_cert: Option<PathBuf>,
    /// PEM private key of --xds-tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long = "xds-tls-key", env = "MESHBRIDGE_XDS_TLS_KEY", requires = "xds_tls_cert")]
    pub xds_tls_key: Option<PathBuf>,
    /// PEM CA bundle: every client must present a certificate it signed
    /// (mTLS). Such clients are authenticated and get Secrets.
    #[arg(long = "xds-client-ca", env = "MESHBRIDGE_XDS_CLIENT_CA", requires = "xds_tls_cert")]
    pub xds_client_ca: Option<PathBuf>,
    /// With --xds-client-ca: also accept clients without a certificate
    /// (istiod's `xds://` config source speaks TLS without one). They get
    /// everything but Secrets; a certificate, when presented, must verify.
    #[arg(long = "xds-client-cert-optional", env = "MESHBRIDGE_XDS_CLIENT_CERT_OPTIONAL", requires = "xds_client_ca")]
    pub xds_client_cert_optional: bool,
    /// How often the three files are checked for change; `0`: never.
    #[arg(long = "xds-tls-reload-interval", env = "MESHBRIDGE_XDS_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub xds_tls_reload_interval: Duration,
}

impl Default for XdsTlsArgs {
    fn default() -> Self {
        XdsTlsArgs {
            xds_tls_cert: None,
            xds_tls_key: None,
            xds_client_ca: None,
            xds_client_cert_optional: false,
            xds_tls_reload_interval: Duration::from_secs(10),
        }
    }
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

impl XdsLimits {
    pub fn keepalive(&self) -> (Option<Duration>, Option<Duration>) {
        (nonzero(self.keepalive_interval), nonzero(self.keepalive_timeout))
    }
}

/// What the streams of one connection tell its [`Conn`]: how many are open
/// and when the last one closed (ms since `epoch`).
#[derive(Debug)]
struct ConnState {
    streams: AtomicUsize,
    last_busy_ms: AtomicU64,
}

/// Connections by peer address, so a stream can find its own.
#[derive(Debug)]
pub struct Connections {
    epoch: Instant,
    by_peer: Mutex<HashMap<SocketAddr, Weak<ConnState>>>,
}

impl Default for Connections {
    fn default() -> Self {
        Connections { epoch: Instant::now(), by_peer: Mutex::default() }
    }
}

/// Held by a stream while it is open.
pub struct StreamGuard {
    conn: Arc<ConnState>,
    epoch: Instant,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.conn.last_busy_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.conn.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connections {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Wrap a plaintext connection.
    pub fn accept_plain(self: &Arc<Self>, io: TcpStream, limits: &XdsLimits) -> Conn {
        let auth = PeerAuth::unverified(io.peer_addr().ok(), false);
        self.accept(Io::Plain(io), auth, limits)
    }

    /// Wrap an accepted connection whose peer authenticated as `auth`, its
    /// socket set to [`no_delay`].
    pub fn accept(self: &Arc<Self>, io: Io, auth: PeerAuth, limits: &XdsLimits) -> Conn {
        no_delay(io.tcp());
        let state = Arc::new(ConnState { streams: AtomicUsize::new(0), last_busy_ms: AtomicU64::new(self.now_ms()) });
        let remote = io.tcp().peer_addr().ok();
        if let Some(peer) = remote {
            let mut map = self.by_peer.lock().unwrap_or_else(PoisonError::into_inner);
            // Closed connections are swept as the map doubles: amortised O(1).
            if map.len() >= 64 && map.len().is_power_of_two() {
                map.retain(|_, c| c.strong_count() > 0);
            }
            map.insert(peer, Arc::downgrade(&state));
        }
        Conn {
            info: ConnInfo { remote, auth },
            io,
            handshake: nonzero(limits.handshake_timeout).map(|d| Box::pin(tokio::time::sleep(d))),
            preface_left: PREFACE_LEN,
            idle: nonzero(limits.idle_timeout),
            idle_timer: None,
            state,
            connections: self.clone(),
        }
    }

    /// A stream opened on the connection from `peer`.
    pub fn stream_opened(&self, peer: Option<SocketAddr>) -> Option<StreamGuard> {
        let conn = self.by_peer.lock().unwrap_or_else(PoisonError::into_inner).get(&peer?)?.upgrade()?;
        conn.streams.fetch_add(1, Ordering::Relaxed);
        Some(StreamGuard { conn, epoch: self.epoch })
    }
}

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`
const PREFACE_LEN: usize = 24;

/// An accepted TCP connection with a handshake deadline (the HTTP/2
/// preface must arrive in time) and an idle deadline (no open stream for
/// too long). Both end the connection with a read error, which hyper turns
/// into closing it.
pub struct Conn {
    info: ConnInfo,
    io: Io,
    handshake: Option<Pin<Box<Sleep>>>,
    preface_left: usize,
    idle: Option<Duration>,
    idle_timer: Option<Pin<Box<Sleep>>>,
    state: Arc<ConnState>,
    connections: Arc<Connections>,
}

impl Conn {
    /// `Err` once the connection has been without a stream for too long.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(idle) = self.idle else { return Ok(()) };
        let now = self.connections.now_ms();
        if self.state.streams.load(Ordering::Relaxed) > 0 {
            self.state.last_busy_ms.store(now, Ordering::Relaxed);
        }
        let since = Duration::from_millis(now.saturating_sub(self.state.last_busy_ms.load(Ordering::Relaxed)));
        if since >= idle {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "xds connection idle: no open stream"));
        }
        // Wake up when the idle period could end, to check again.
        let timer = self.idle_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        timer.as_mut().reset(tokio::time::Instant::now() + (idle - since));
        let _ = timer.as_mut().poll(cx);
        Ok(())
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(t) = this.handshake.as_mut()
            && t.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "xds handshake: no HTTP/2 preface in time",
            )));
        }
        if let Err(e) = this.check_idle(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let res = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.handshake.is_some() {
            this.preface_left = this.preface_left.saturating_sub(buf.filled().len() - before);
            if this.preface_left == 0 {
                this.handshake = None;
            }
        }
        res
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// What a request knows of its connection (a request extension).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    pub auth: PeerAuth,
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

/// A connection's transport: plain TCP, or TLS over it.
pub enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(io) => io,
            Io::Tls(io) => io.get_ref().0,
        }
    }
}

/// Forward one `AsyncRead`/`AsyncWrite` call to whichever transport it is.
macro_rules! each_io {
    ($self:expr, $io:ident => $e:expr) => {
        match $self.get_mut() {
            Io::Plain($io) => $e,
            Io::Tls($io) => $e,
        }
    };
}

impl AsyncRead for Io {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each_io!(self, io => Pin::new(io).poll_read(cx, buf))
    }
}

impl AsyncWrite for Io {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each_io!(self, io => Pin::new(io).poll_write(cx, buf))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_io!(self, io => Pin::new(io).poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_io!(self, io => Pin::new(io).poll_shutdown(cx))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each_io!(self, io => Pin::new(io).poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(io) => io.is_write_vectored(),
            Io::Tls(io) => io.is_write_vectored(),
        }
    }
}

/// At most one log line per period: `check` says whether to log now, and
/// how many were left unlogged since the last one.
#[derive(Debug)]
pub struct LogLimit {
    every: Duration,
    last: Mutex<(Option<Instant>, u64)>,
}

impl LogLimit {
    pub fn new(every: Duration) -> LogLimit {
        LogLimit { every, last: Mutex::default() }
    }

    pub fn check(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, skipped) = &mut *last;
        if at.is_some_and(|t| t.elapsed() < self.every) {
            *skipped += 1;
            return None;
        }
        *at = Some(Instant::now());
        Some(std::mem::take(skipped))
    }
}

/// Why a request broke a cap (the stream then ends with
/// `INVALID_ARGUMENT` and this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestRefused {
    #[error("type_url: {bytes} bytes, the limit is {MAX_TYPE_URL_BYTES}")]
    TypeUrlTooLong { bytes: usize },
    /// `type_url` is already truncated for display.
    #[error("resource name [{index}] of {type_url}: {bytes} bytes, the limit is {MAX_RESOURCE_NAME_BYTES}")]
    NameTooLong { index: usize, type_url: String, bytes: usize },
    #[error("type_url: more than {MAX_TYPES_PER_STREAM} types on one stream")]
    TooManyTypes,
}

/// Check the client-chosen strings of a request against the caps.
pub fn check_request<S: AsRef<str>>(type_url: &str, names: impl IntoIterator<Item = S>) -> Result<(), RequestRefused> {
    if type_url.len() > MAX_TYPE_URL_BYTES {
        return Err(RequestRefused::TypeUrlTooLong { bytes: type_url.len() });
    }
    for (index, n) in names.into_iter().enumerate() {
        let n = n.as_ref();
        if n.len() > MAX_RESOURCE_NAME_BYTES {
            let type_url = truncate(type_url, 100).into_owned();
            return Err(RequestRefused::NameTooLong { index, type_url, bytes: n.len() });
        }
    }
    Ok(())
}

/// At most `max` bytes of `s` (cut at a char boundary), marked when cut:
/// what logs and `/debug/xdsz` show of client-supplied text.
pub fn truncate(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return s.into();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len()).into()
}

/// [`truncate`] to 128 bytes: for nonces and versions a client sends.
pub fn short(s: &str) -> std::borrow::Cow<'_, str> {
    truncate(s, 128)
}

/// Send each write at once (`TCP_NODELAY`), as tonic does for connections
/// it accepts itself, which these are not. Without it, a response written
/// in two pieces (a gRPC frame's header and body, or an HTTP/2 frame past
/// 16 KB) waits for the client's delayed ACK, about 40 ms on Linux, before
/// its second piece leaves.
fn no_delay(tcp: &TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "TCP_NODELAY not set");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `TCP_NODELAY`, a response written in two pieces waited for
    /// the client's delayed ACK (about 40 ms): every accepted socket has it.
    #[tokio::test]
    async fn accepted_connections_send_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        assert!(!accepted.nodelay().unwrap(), "off by default: the test would prove nothing");
        let conn = Arc::new(Connections::default()).accept_plain(accepted, &XdsLimits::default());
        assert!(conn.io.tcp().nodelay().unwrap());
    }

    #[test]
    fn truncation() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate("ééééé", 3);
        assert!(cut.starts_with("é…") && cut.ends_with("(10 bytes)"), "{cut}");
        assert!(check_request(&"t".repeat(300), [""; 0]).unwrap_err().to_string().starts_with("type_url: 300 bytes"));
        let long = vec!["n".repeat(2000)];
        assert!(check_request("t", &long).unwrap_err().to_string().contains("resource name [0]"));
    }
}
