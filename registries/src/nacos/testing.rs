//! A plain Nacos gRPC client for benchmarks (feature `testing`): one
//! connection of the watcher's own wire layer ([`Conn`]), nothing else. It
//! subscribes and queries as any naming client does, and hands every push to
//! a callback as it is read, with no queue, reader or diff of the watcher's
//! in between: what it sees is the server's own push delay.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::decode::ServiceKey;
use super::grpc::service_hosts;
use super::wire::{Conn, Push, PushSink};
use crate::watcher::RegistryError;

const NAME: &str = "plain-subscriber";

/// One instance as the server sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Host {
    pub ip: String,
    pub port: i64,
    pub weight: f64,
    pub healthy: bool,
    pub enabled: bool,
}

/// One `NotifySubscriberRequest`: the service (`group`, `name`) and its
/// instances.
#[derive(Debug, Clone)]
pub struct Pushed {
    pub group: String,
    pub name: String,
    pub hosts: Vec<Host>,
}

/// A naming client on one connection (no auth, no TLS, no reconnect).
pub struct Subscriber {
    conn: Conn,
    namespace: String,
}

fn hosts(instances: Vec<super::decode::Instance>) -> Vec<Host> {
    instances
        .into_iter()
        .map(|i| Host { ip: i.ip, port: i.port, weight: i.weight, healthy: i.healthy, enabled: i.enabled })
        .collect()
}

impl Subscriber {
    /// Connect to the gRPC `addr` (`host:port`) as a client of `namespace`;
    /// every push goes to `on_push` from the connection's reader task.
    pub async fn connect(
        addr: &str,
        namespace: &str,
        timeout: Duration,
        on_push: impl Fn(Pushed) + Send + Sync + 'static,
    ) -> Result<Subscriber, RegistryError> {
        let sink: PushSink = Arc::new(move |push: Push| {
            let Push { key: ServiceKey { group, name }, instances } = push;
            on_push(Pushed { group, name, hosts: hosts(instances) })
        });
        let conn = Conn::connect(NAME, addr, None, namespace, timeout, Vec::new(), sink).await?;
        Ok(Subscriber { conn, namespace: namespace.to_string() })
    }

    /// `HealthCheckRequest`, as a client sends on an idle connection (the
    /// Java client every 5 s) so that the server keeps it.
    pub async fn health_check(&self, timeout: Duration) -> Result<(), RegistryError> {
        self.conn.request("HealthCheckRequest", json!({}), Vec::new(), timeout).await.map(drop)
    }

    /// Whether the connection is gone (the server closed it).
    pub fn is_closed(&self) -> bool {
        self.conn.is_closed()
    }

    /// `SubscribeServiceRequest`: the instances its answer carries.
    pub async fn subscribe(&self, group: &str, name: &str, timeout: Duration) -> Result<Vec<Host>, RegistryError> {
        let body = json!({
            "namespace": self.namespace, "serviceName": name, "groupName": group,
            "subscribe": true, "clusters": "",
        });
        self.service("SubscribeServiceRequest", body, timeout).await
    }

    /// `ServiceQueryRequest`, the read the watcher makes of every service
    /// in a full sync.
    pub async fn query(&self, group: &str, name: &str, timeout: Duration) -> Result<Vec<Host>, RegistryError> {
        let body = json!({
            "namespace": self.namespace, "serviceName": name, "groupName": group,
            "cluster": "", "healthyOnly": false, "udpPort": 0,
        });
        self.service("ServiceQueryRequest", body, timeout).await
    }

    async fn service(
        &self,
        kind: &str,
        body: serde_json::Value,
        timeout: Duration,
    ) -> Result<Vec<Host>, RegistryError> {
        let bytes = self.conn.request(kind, body, Vec::new(), timeout).await?;
        service_hosts(NAME, kind, &bytes).map(hosts)
    }
}
