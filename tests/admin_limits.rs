//! The admin server's bounds: a request head must arrive in time, and
//! connections beyond the cap are closed at once.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use meshbridge::admin::{AdminLimits, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start(limits: AdminLimits) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Router::new().route("/healthz", get(|| async { "ok\n" }));
    tokio::spawn(serve(listener, router, limits, std::future::pending()));
    addr
}

/// How long until the server closes `conn` (`None`: not within `wait`).
async fn closed_after(conn: &mut TcpStream, wait: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    let read_all = async {
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::time::timeout(wait, read_all).await.ok().map(|_| start.elapsed())
}

async fn healthz(addr: std::net::SocketAddr) -> String {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn half_sent_and_silent_requests_are_closed_after_the_header_timeout() {
    let addr = start(AdminLimits { header_read_timeout: Duration::from_millis(300), max_connections: 16 }).await;
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let took = closed_after(&mut half, Duration::from_secs(5)).await.expect("a half-sent request is closed");
    assert!(took >= Duration::from_millis(250), "not before the timeout: {took:?}");
    assert!(closed_after(&mut silent, Duration::from_secs(5)).await.is_some(), "a silent connection is closed");
    assert!(healthz(addr).await.ends_with("ok\n"));
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let addr = start(AdminLimits { header_read_timeout: Duration::from_secs(2), max_connections: 3 }).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = TcpStream::connect(addr).await.unwrap();
    let took = closed_after(&mut over, Duration::from_secs(1)).await.expect("the fourth is closed");
    assert!(took < Duration::from_millis(500), "closed at once: {took:?}");
    // Once the held ones time out, the server answers again.
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(healthz(addr).await.ends_with("ok\n"));
}
