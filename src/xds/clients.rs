//! Who is connected and what they acknowledged: the data behind the
//! `/debug/xdsz` admin endpoint.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

/// Per type URL, what happened last on one stream.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeStatus {
    pub last_sent_version: Option<String>,
    pub last_sent_time: Option<SystemTime>,
    pub last_ack: Option<String>,
    pub last_ack_time: Option<SystemTime>,
    pub last_nack: Option<String>,
    pub last_nack_detail: Option<String>,
    pub last_nack_time: Option<SystemTime>,
    pub pushes: u64,
    pub nacks: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientStatus {
    pub id: u64,
    pub node_id: String,
    pub peer: String,
    pub mode: &'static str,
    pub connected_at: SystemTime,
    pub types: BTreeMap<String, TypeStatus>,
}

/// All connected clients.
#[derive(Debug, Default)]
pub struct Clients {
    next_id: AtomicU64,
    streams: Mutex<BTreeMap<u64, ClientStatus>>,
}

impl Clients {
    pub fn new() -> Arc<Clients> {
        Arc::new(Clients::default())
    }

    pub fn connect(self: &Arc<Self>, peer: &str, mode: &'static str) -> ClientHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let status = ClientStatus {
            id,
            node_id: String::new(),
            peer: peer.to_string(),
            mode,
            connected_at: SystemTime::now(),
            types: BTreeMap::new(),
        };
        self.lock().insert(id, status);
        ClientHandle { clients: self.clone(), id }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, ClientStatus>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> Vec<ClientStatus> {
        self.lock().values().cloned().collect()
    }
}

/// One stream's handle; dropping it marks the client disconnected.
#[derive(Debug)]
pub struct ClientHandle {
    clients: Arc<Clients>,
    id: u64,
}

impl ClientHandle {
    pub fn id(&self) -> u64 {
        self.id
    }

    fn with(&self, f: impl FnOnce(&mut ClientStatus)) {
        if let Some(c) = self.clients.lock().get_mut(&self.id) {
            f(c)
        }
    }

    fn with_type(&self, type_url: &str, f: impl FnOnce(&mut TypeStatus)) {
        self.with(|c| f(c.types.entry(type_url.to_string()).or_default()))
    }

    pub fn set_node(&self, node_id: &str) {
        self.with(|c| {
            if c.node_id != node_id {
                c.node_id = node_id.to_string();
            }
        })
    }

    pub fn sent(&self, type_url: &str, version: &str) {
        self.with_type(type_url, |t| {
            t.last_sent_version = Some(version.to_string());
            t.last_sent_time = Some(SystemTime::now());
            t.pushes += 1;
        })
    }

    pub fn ack(&self, type_url: &str, version: &str) {
        self.with_type(type_url, |t| {
            t.last_ack = Some(version.to_string());
            t.last_ack_time = Some(SystemTime::now());
        })
    }

    pub fn nack(&self, type_url: &str, version: &str, detail: &str) {
        self.with_type(type_url, |t| {
            t.last_nack = Some(version.to_string());
            t.last_nack_detail = Some(detail.to_string());
            t.last_nack_time = Some(SystemTime::now());
            t.nacks += 1;
        })
    }
}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        self.clients.lock().remove(&self.id);
    }
}
