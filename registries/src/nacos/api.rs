//! What a Nacos watcher reads, whichever protocol carries it: the seam
//! between the watcher loops (`nacos.rs`) and the gRPC and HTTP clients.

use std::future::Future;
use std::sync::Arc;

use super::decode::{Instance, ServiceKey};
use super::pushed::Pushed;
use crate::watcher::RegistryError;

/// What a watcher reads from Nacos, whichever protocol carries it.
pub(crate) trait Api: Send + Sync + 'static {
    /// Every service name in `group` (all pages).
    fn list_services(&self, group: &str) -> impl Future<Output = Result<Vec<String>, RegistryError>> + Send;
    /// Every instance of a service, healthy or not.
    fn instances(&self, key: &ServiceKey) -> impl Future<Output = Result<Vec<Instance>, RegistryError>> + Send;
    /// A cheap real call, to tell whether the server answers: how many
    /// services `group` holds, as the server counts them.
    fn probe(&self, group: &str) -> impl Future<Output = Result<usize, RegistryError>> + Send;

    /// Whether the server pushes changes to subscribers.
    const PUSH: bool = false;
    /// Queue `key` in `pushed` whenever the server pushes a change of it.
    fn subscribe(
        &self,
        _key: &ServiceKey,
        _pushed: Arc<Pushed>,
    ) -> impl Future<Output = Result<(), RegistryError>> + Send {
        async { Ok(()) }
    }
    fn unsubscribe(&self, _key: &ServiceKey) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Resolves once the client has a connection again after losing it
    /// (gRPC only: its supervisor reconnects); never otherwise.
    fn reachable_again(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// A request refused for its credentials.
pub(crate) fn is_auth_error(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Status { status: 401 | 403, .. })
}
