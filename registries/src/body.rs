//! Byte-capped reads of HTTP answers, for every watcher on HTTP (Consul,
//! Nacos 1.x, the Nacos login and address server, Eureka). A registry is a
//! peer, not a trusted component: an answer is streamed chunk by chunk and
//! the read stops as soon as it passes the cap, so a broken or hostile
//! server costs at most [`MAX_BODY_BYTES`] per call in flight, never its
//! whole answer.

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::watcher::RegistryError;

/// The most bytes read from one registry answer: 64 MiB. The largest a
/// watcher reads is Consul's `/v1/health/state/critical` when every check
/// fails: 100k checks are about 36 MB (measured on `/v1/health/state/any`);
/// anything beyond this is treated as a broken answer.
pub const MAX_BODY_BYTES: usize = 64 << 20;

/// The body of `resp`, at most `cap` bytes. An answer that declares or
/// streams more is a [`RegistryError::BadResponse`] for `what`; a failure
/// while reading goes through `read_error` (the watcher's own wording).
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    cap: usize,
    registry: &str,
    what: &str,
    read_error: impl Fn(&reqwest::Error) -> RegistryError,
) -> Result<Vec<u8>, RegistryError> {
    let too_large = || too_large(registry, what, cap);
    let declared = resp.content_length().unwrap_or(0);
    if declared > cap as u64 {
        return Err(too_large());
    }
    // Trust a declared length only up to 1 MiB for the first allocation.
    let mut body = Vec::with_capacity(usize::try_from(declared).unwrap_or(0).min(1 << 20));
    while let Some(chunk) = resp.chunk().await.map_err(|e| read_error(&e))? {
        if body.len() + chunk.len() > cap {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The error for an answer over the cap.
pub(crate) fn too_large(registry: &str, what: &str, cap: usize) -> RegistryError {
    RegistryError::BadResponse {
        registry: registry.to_string(),
        what: what.to_string(),
        reason: format!("answer larger than the {cap} byte cap"),
    }
}

/// Why [`collect_capped`] stopped.
#[derive(Debug)]
pub(crate) enum Capped<E> {
    /// More than the cap was declared or sent.
    TooLarge,
    /// Reading failed.
    Read(E),
}

/// [`read_capped`] for a bare hyper body (the Consul watcher's own
/// connections): frame by frame, stopping past `cap`.
pub(crate) async fn collect_capped<B>(mut body: B, cap: usize) -> Result<Vec<u8>, Capped<B::Error>>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    let declared = hyper::body::Body::size_hint(&body).lower();
    if declared > cap as u64 {
        return Err(Capped::TooLarge);
    }
    let mut out = Vec::with_capacity(usize::try_from(declared).unwrap_or(0).min(1 << 20));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Capped::Read)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > cap {
                return Err(Capped::TooLarge);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A server that answers one request with `len` bytes, chunked (no
    /// declared length) when `chunked`, and reports how many it managed to
    /// write before the client hung up.
    async fn server(len: usize, chunked: bool) -> (String, tokio::task::JoinHandle<usize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/big", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = conn.read(&mut buf).await;
            let head = if chunked {
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_string()
            } else {
                format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n")
            };
            if conn.write_all(head.as_bytes()).await.is_err() {
                return 0;
            }
            let block = vec![b'x'; 64 * 1024];
            let mut sent = 0;
            while sent < len {
                let n = block.len().min(len - sent);
                let ok = if chunked {
                    let frame = [format!("{n:x}\r\n").as_bytes(), &block[..n], b"\r\n"].concat();
                    conn.write_all(&frame).await.is_ok()
                } else {
                    conn.write_all(&block[..n]).await.is_ok()
                };
                if !ok {
                    break;
                }
                sent += n;
            }
            if chunked && sent == len {
                let _ = conn.write_all(b"0\r\n\r\n").await;
            }
            sent
        });
        (url, task)
    }

    fn read_error(e: &reqwest::Error) -> RegistryError {
        RegistryError::Unreachable { registry: "r".into(), reason: e.to_string() }
    }

    #[tokio::test]
    async fn small_answers_are_read_whole() {
        for chunked in [false, true] {
            let (url, task) = server(200_000, chunked).await;
            let resp = reqwest::get(&url).await.unwrap();
            let body = read_capped(resp, 1 << 20, "r", "/big", read_error).await.unwrap();
            assert_eq!(body.len(), 200_000);
            assert_eq!(task.await.unwrap(), 200_000);
        }
    }

    #[tokio::test]
    async fn oversized_answers_stop_at_the_cap() {
        const CAP: usize = 1 << 20;
        // Declared: refused before reading a byte of the body.
        let (url, _task) = server(200 << 20, false).await;
        let resp = reqwest::get(&url).await.unwrap();
        let err = read_capped(resp, CAP, "r", "/big", read_error).await.unwrap_err();
        assert!(
            matches!(&err, RegistryError::BadResponse { what, reason, .. }
            if what == "/big" && reason.contains("cap")),
            "{err}"
        );

        // Streamed without a length: the read stops just past the cap and the
        // server cannot push the rest (200 MiB) into us.
        let (url, task) = server(200 << 20, true).await;
        let resp = reqwest::get(&url).await.unwrap();
        let err = read_capped(resp, CAP, "r", "/big", read_error).await.unwrap_err();
        assert!(matches!(err, RegistryError::BadResponse { .. }), "{err}");
        let sent = task.await.unwrap();
        assert!(sent < 32 << 20, "the server wrote {sent} bytes; the client should have hung up near {CAP}");
    }
}
