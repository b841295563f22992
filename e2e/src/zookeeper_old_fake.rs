//! A fake ZooKeeper older than 3.6, for the one thing it does differently:
//! it does not know `addWatch` (opcode 106). This is a protocol-faithful
//! fake, not a ZooKeeper: it speaks the jute framing (4-byte length, then
//! the record), grants every session, answers pings, and answers any other
//! request the way ZooKeeper 3.5's `UnimplementedRequestProcessor` does: a
//! reply header with error `UNIMPLEMENTED` (-6), then the connection closed.
//! Debian ships ZooKeeper 3.8 only, so no real 3.5 server can be had here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const PING_XID: i32 = -2;
const UNIMPLEMENTED: i32 = -6;
/// The largest frame we accept; a real client sends far less here.
const MAX_FRAME: usize = 1 << 20;

pub struct OldZooKeeperFake {
    pub addr: SocketAddr,
    /// Requests answered `UNIMPLEMENTED`, by opcode seen last.
    refused: Arc<AtomicUsize>,
    last_opcode: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl OldZooKeeperFake {
    pub async fn start() -> anyhow::Result<OldZooKeeperFake> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (refused, last_opcode) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (r, l) = (refused.clone(), last_opcode.clone());
        let task = tokio::spawn(async move {
            let mut session = 0x100_i64;
            while let Ok((conn, _)) = listener.accept().await {
                session += 1;
                tokio::spawn(serve(conn, session, r.clone(), l.clone()));
            }
        });
        Ok(OldZooKeeperFake { addr, refused, last_opcode, task })
    }

    /// How many requests were refused as unimplemented.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// The opcode of the last refused request.
    pub fn last_refused_opcode(&self) -> usize {
        self.last_opcode.load(Ordering::SeqCst)
    }
}

impl Drop for OldZooKeeperFake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_frame(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let len = usize::try_from(conn.read_i32().await.ok()?).ok().filter(|l| *l <= MAX_FRAME)?;
    let mut buf = vec![0; len];
    conn.read_exact(&mut buf).await.ok()?;
    Some(buf)
}

async fn write_frame(conn: &mut TcpStream, body: &[u8]) -> Option<()> {
    conn.write_i32(i32::try_from(body.len()).ok()?).await.ok()?;
    conn.write_all(body).await.ok()
}

async fn serve(mut conn: TcpStream, session: i64, refused: Arc<AtomicUsize>, last_opcode: Arc<AtomicUsize>) {
    // ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly.
    let Some(req) = read_frame(&mut conn).await else { return };
    let timeout = req.get(12..16).map_or(4000, |b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    // ConnectResponse: protocolVersion, timeOut, sessionId, passwd, readOnly.
    let mut resp = Vec::new();
    resp.extend_from_slice(&0i32.to_be_bytes());
    resp.extend_from_slice(&timeout.to_be_bytes());
    resp.extend_from_slice(&session.to_be_bytes());
    resp.extend_from_slice(&16i32.to_be_bytes());
    resp.extend_from_slice(&[7u8; 16]);
    resp.push(0);
    if write_frame(&mut conn, &resp).await.is_none() {
        return;
    }
    // Requests: RequestHeader (xid, type) then the body.
    while let Some(req) = read_frame(&mut conn).await {
        let Some(head) = req.get(0..8) else { return };
        let xid = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let opcode = i32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        // ReplyHeader: xid, zxid, err.
        let reply = |err: i32| {
            let mut r = Vec::new();
            r.extend_from_slice(&xid.to_be_bytes());
            r.extend_from_slice(&1i64.to_be_bytes());
            r.extend_from_slice(&err.to_be_bytes());
            r
        };
        if xid == PING_XID {
            if write_frame(&mut conn, &reply(0)).await.is_none() {
                return;
            }
            continue;
        }
        refused.fetch_add(1, Ordering::SeqCst);
        last_opcode.store(usize::try_from(opcode).unwrap_or(0), Ordering::SeqCst);
        let _ = write_frame(&mut conn, &reply(UNIMPLEMENTED)).await;
        // ZooKeeper 3.5 then closes the session's connection.
        return;
    }
}
