//! Tiny HTTP/1.1 backends that answer every request with their own name, so
//! a test can tell which endpoint Envoy picked.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub struct Backend {
    pub addr: SocketAddr,
    pub name: String,
    task: JoinHandle<()>,
}

impl Backend {
    /// Listen on `ip:0` and answer `200 {name}` to every request.
    pub async fn start(ip: &str, name: &str) -> anyhow::Result<Backend> {
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let body = name.to_string();
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut seen = Vec::new();
                    // Keep-alive: answer each request head on the connection.
                    loop {
                        let n = match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            let resp = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{}",
                                body.len(),
                                body
                            );
                            if sock.write_all(resp.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Ok(Backend { addr, name: name.to_string(), task })
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}
