//! Loopback relays between nacos-sdk and the Nacos servers' gRPC ports, one
//! set per client: nacos-sdk connects to them, never to the servers, for two
//! reasons.
//!
//! **Closing a client's connection.** A nacos-sdk client has no way to be
//! shut down: the task reading its bi-directional stream answers the
//! server's connection checks for ever, and keeps the connection open after
//! every handle on the client is gone (a replaced client kept its
//! connection as long as the process lived: `grpc_replaced_client_goes_away`
//! in `e2e/tests/nacos_registry.rs`). Dropping the relays closes it.
//!
//! **TLS** (`registryTls` on `nacos2`/`nacos3`). nacos-sdk 0.8 cannot be
//! given a TLS config: its `tls` feature switches
//! *every* client in the process to https at compile time, brings OpenSSL
//! (reqwest's native-tls), and reads its CA from one process-wide variable
//! (`NACOS_CLIENT_TLS_CA_CERT`), panicking when the file cannot be read. So
//! TLS is originated here instead, per registry: the relay carries each
//! connection over a verified rustls connection (ALPN `h2`) to the server's
//! real gRPC port. Plain bytes exist only inside this host's loopback; the
//! credentials still travel only inside the TLS connection to Nacos.
//! Without `registryTls` the relay copies plain TCP.
//!
//! Bounded: one listener per server, at most [`MAX_CONNS`] relayed
//! connections each (nacos-sdk holds one), all closed with the client
//! (the listeners and every relayed connection). The cost is one loopback
//! hop: two sockets in this process beside the one to Nacos.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsConnector;
use tracing::{debug, warn};

use super::servers::{GRPC_PORT_OFFSET, grpc_addr};
use crate::tls::{RegistryTls, client_config, server_name, tls_failure};
use crate::watcher::RegistryError;

/// Relayed connections per server at once.
const MAX_CONNS: usize = 4;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Tries at a loopback port above [`GRPC_PORT_OFFSET`] (nacos-sdk dials
/// the port it is given plus that offset).
const BIND_TRIES: usize = 16;

/// One server's relay target.
#[derive(Clone)]
struct Target {
    /// `host:grpcPort` of the real server.
    addr: String,
    /// The name its certificate must carry (TLS only).
    name: Option<ServerName<'static>>,
}

/// The loopback relays of one gRPC client; dropped, they stop, and every
/// connection they carry is closed.
pub(crate) struct Relays {
    /// What nacos-sdk is given: `127.0.0.1:{relay port - offset}`.
    local: Vec<String>,
    targets: Vec<Target>,
    /// With `registryTls`; plain TCP without.
    connector: Option<TlsConnector>,
    registry: String,
    tasks: Vec<JoinHandle<()>>,
    /// The last relay failure, to explain a failed connect.
    last_error: Arc<Mutex<Option<String>>>,
}

impl Relays {
    /// Start one relay per server (`host:httpPort`), over TLS with `tls`.
    pub async fn start(registry: &str, servers: &[String], tls: Option<&RegistryTls>) -> Result<Relays, RegistryError> {
        let config = |reason: String| RegistryError::Config {
            registry: registry.to_string(),
            field: "registryTls".into(),
            reason,
        };
        let connector = match tls {
            Some(tls) => Some(TlsConnector::from(client_config(tls, &[b"h2"]).map_err(config)?)),
            None => None,
        };
        let last_error = Arc::new(Mutex::new(None));
        let mut relays = Relays {
            local: Vec::new(),
            targets: Vec::new(),
            connector,
            registry: registry.to_string(),
            tasks: Vec::new(),
            last_error,
        };
        for server in servers {
            let addr = grpc_addr(server).ok_or_else(|| RegistryError::Config {
                registry: registry.to_string(),
                field: "port".into(),
                reason: format!("{server:?}: no port, or none 1000 above it for gRPC"),
            })?;
            let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(&addr);
            let name = match tls {
                Some(tls) => Some(server_name(tls, host).map_err(config)?),
                None => None,
            };
            let target = Target { name, addr };
            let listener = bind_loopback().await.map_err(|e| RegistryError::Unreachable {
                registry: registry.to_string(),
                reason: format!("gRPC relay: cannot bind a loopback port: {e}"),
            })?;
            let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
            relays.local.push(format!("127.0.0.1:{}", port - GRPC_PORT_OFFSET));
            let relay = Relay {
                target: target.clone(),
                connector: relays.connector.clone(),
                last_error: relays.last_error.clone(),
            };
            relays.tasks.push(tokio::spawn(relay.serve(listener)));
            relays.targets.push(target);
        }
        Ok(relays)
    }

    /// The server list to give nacos-sdk.
    pub fn local_servers(&self) -> &[String] {
        &self.local
    }

    /// One TLS handshake with some server, so that a certificate problem is
    /// reported as such before nacos-sdk hides it behind "connect failed".
    /// Nothing to check without TLS.
    pub async fn check(&self) -> Result<(), RegistryError> {
        let Some(connector) = &self.connector else {
            return Ok(());
        };
        let mut reasons = Vec::new();
        for target in &self.targets {
            match open_tls(connector, target).await {
                Ok(_) => return Ok(()),
                Err(reason) => reasons.push(format!("{}: {reason}", target.addr)),
            }
        }
        Err(RegistryError::Unreachable { registry: self.registry.clone(), reason: reasons.join("; ") })
    }

    /// Why the last relayed connection failed, if one did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

struct Relay {
    target: Target,
    connector: Option<TlsConnector>,
    last_error: Arc<Mutex<Option<String>>>,
}

impl Relay {
    async fn serve(self, listener: TcpListener) {
        let slots = Arc::new(Semaphore::new(MAX_CONNS));
        let relay = Arc::new(self);
        // Owned here, so stopping the relay (aborting this task) closes
        // every relayed connection too.
        let mut conns = JoinSet::new();
        while let Ok((local, peer)) = listener.accept().await {
            while conns.try_join_next().is_some() {}
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                warn!(%peer, max = MAX_CONNS, "nacos gRPC relay: connection limit reached, closing");
                continue;
            };
            let relay = relay.clone();
            conns.spawn(async move {
                relay.pipe(local).await;
                drop(slot);
            });
        }
    }

    async fn pipe(&self, mut local: TcpStream) {
        let _ = local.set_nodelay(true);
        let copied = match &self.connector {
            Some(connector) => match open_tls(connector, &self.target).await {
                Ok(mut remote) => Ok(tokio::io::copy_bidirectional(&mut local, &mut remote).await),
                Err(reason) => Err(reason),
            },
            None => match open_tcp(&self.target).await {
                Ok(mut remote) => Ok(tokio::io::copy_bidirectional(&mut local, &mut remote).await),
                Err(reason) => Err(reason),
            },
        };
        match copied {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => debug!(target = %self.target.addr, error = %e, "nacos gRPC relay: connection ended"),
            Err(reason) => {
                debug!(target = %self.target.addr, %reason, "nacos gRPC relay: connect failed");
                *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
            }
        }
    }
}

/// A TCP connection to `target`, or why not.
async fn open_tcp(target: &Target) -> Result<TcpStream, String> {
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&target.addr)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return Err(format!("connect failed: {e}")),
        Err(_) => return Err("connect failed: timed out".into()),
    };
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// A verified TLS connection to `target`, or why not.
async fn open_tls(
    connector: &TlsConnector,
    target: &Target,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let tcp = open_tcp(target).await?;
    let name = target.name.clone().ok_or("no server name")?;
    match tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => Err(tls_failure(&e).unwrap_or_else(|| format!("TLS handshake failed: {e}"))),
        Err(_) => Err("TLS handshake timed out".into()),
    }
}

/// A loopback listener whose port is above the gRPC offset.
async fn bind_loopback() -> std::io::Result<TcpListener> {
    for _ in 0..BIND_TRIES {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        if listener.local_addr()?.port() > GRPC_PORT_OFFSET {
            return Ok(listener);
        }
    }
    Err(std::io::Error::other("no free port above 1000"))
}
