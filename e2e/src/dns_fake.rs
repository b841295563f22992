//! A FAKE DNS server for the `dns` registry tests: UDP on a free loopback
//! port, answering A and AAAA queries from a table the test changes.
//!
//! - A name in the table gets its addresses of the asked type, all with the
//!   current TTL (NOERROR with no answers when it has none of that type).
//! - A name not in the table gets NXDOMAIN.
//! - A name marked silent gets no answer at all (the client times out).
//!
//! The wire format (RFC 1035 §4) is written by hand: one question per query,
//! answers point back at it by name compression, and any EDNS record in
//! the query is ignored (the answer has none). No SOA is sent with negative
//! answers, so a resolver does not cache them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context;
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_NXDOMAIN: u16 = 3;
const RCODE_FORMERR: u16 = 1;

#[derive(Default)]
struct Table {
    /// Lower-case name without the final dot -> addresses.
    records: BTreeMap<String, Vec<IpAddr>>,
    ttl: u32,
    silent: BTreeSet<String>,
    /// Name -> queries received (any type).
    queries: BTreeMap<String, usize>,
}

/// A running fake; stops when dropped.
pub struct DnsFake {
    pub addr: SocketAddr,
    table: Arc<Mutex<Table>>,
    task: JoinHandle<()>,
}

impl Drop for DnsFake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl DnsFake {
    /// Serve on a free loopback UDP port; answers carry `ttl` seconds.
    pub async fn start(ttl: u32) -> anyhow::Result<DnsFake> {
        let socket = UdpSocket::bind("127.0.0.1:0").await.context("bind udp 127.0.0.1:0")?;
        let addr = socket.local_addr()?;
        let table = Arc::new(Mutex::new(Table { ttl, ..Table::default() }));
        let task = tokio::spawn(serve(socket, table.clone()));
        Ok(DnsFake { addr, table, task })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Make `name` resolve to `addrs` (v4 and v6 mixed).
    pub fn set(&self, name: &str, addrs: &[&str]) {
        let addrs = addrs.iter().map(|a| a.parse().expect("an IP address")).collect();
        self.table().records.insert(key(name), addrs);
    }

    /// Make `name` NXDOMAIN.
    pub fn remove(&self, name: &str) {
        self.table().records.remove(&key(name));
    }

    /// Drop every query for `name` (or stop doing so).
    pub fn set_silent(&self, name: &str, silent: bool) {
        let mut t = self.table();
        if silent {
            t.silent.insert(key(name));
        } else {
            t.silent.remove(&key(name));
        }
    }

    pub fn set_ttl(&self, ttl: u32) {
        self.table().ttl = ttl;
    }

    /// How many queries (A and AAAA count apart) asked about `name`.
    pub fn queries(&self, name: &str) -> usize {
        self.table().queries.get(&key(name)).copied().unwrap_or(0)
    }
}

async fn serve(socket: UdpSocket, table: Arc<Mutex<Table>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else { continue };
        let answer = {
            let mut t = table.lock().unwrap_or_else(PoisonError::into_inner);
            respond(&buf[..n], &mut t)
        };
        if let Some(answer) = answer {
            let _ = socket.send_to(&answer, from).await;
        }
    }
}

/// The question of a query: its name (dotted, as sent), type, and the byte
/// range of the whole question section.
struct Question {
    name: String,
    qtype: u16,
    end: usize,
}

fn parse_question(msg: &[u8]) -> Option<Question> {
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        // Queries carry no compression pointers; anything else is malformed.
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(msg.get(at..at + len)?).into_owned());
        at += len;
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    let qclass = u16::from_be_bytes([*msg.get(at + 2)?, *msg.get(at + 3)?]);
    (qclass == CLASS_IN).then(|| Question { name: labels.join("."), qtype, end: at + 4 })
}

fn respond(query: &[u8], table: &mut Table) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None; // too short, or itself a response
    }
    let qdcount = u16::from_be_bytes([query[4], query[5]]);
    let opcode_rd = u16::from_be_bytes([query[2], query[3]]) & 0x7900; // opcode and RD
    let Some(q) = parse_question(query).filter(|_| qdcount == 1) else {
        let mut out = query[..12].to_vec();
        out[2..4].copy_from_slice(&(0x8000 | opcode_rd | RCODE_FORMERR).to_be_bytes());
        out[4..12].fill(0);
        return Some(out);
    };
    let name = key(&q.name);
    *table.queries.entry(name.clone()).or_default() += 1;
    if table.silent.contains(&name) {
        return None;
    }
    let (rcode, answers): (u16, Vec<IpAddr>) = match table.records.get(&name) {
        None => (RCODE_NXDOMAIN, Vec::new()),
        Some(addrs) => {
            let wanted = |ip: &&IpAddr| match q.qtype {
                TYPE_A => ip.is_ipv4(),
                TYPE_AAAA => ip.is_ipv6(),
                _ => false,
            };
            (0, addrs.iter().filter(wanted).copied().collect())
        }
    };
    // QR, AA and RA set; opcode and RD echoed.
    let flags = 0x8000 | 0x0400 | 0x0080 | opcode_rd | rcode;
    let mut out = Vec::with_capacity(q.end + answers.len() * 28);
    out.extend_from_slice(&query[0..2]);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&(answers.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&query[12..q.end]);
    for ip in answers {
        out.extend_from_slice(&[0xc0, 0x0c]); // the question's name
        let (rtype, rdata) = match ip {
            IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&table.ttl.to_be_bytes());
        out.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&rdata);
    }
    Some(out)
}
