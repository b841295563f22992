//! What every admin handler shares: the state. A leaf
//! of `admin`, so handlers in child modules do not reach back into
//! `admin.rs`.

use std::sync::Arc;

use tokio::sync::watch;

use super::auth::Auth;
use crate::cache::Cache;
use crate::metrics::Metrics;
use crate::publish::Published;
use crate::xds::Clients;

#[derive(Clone)]
pub struct AdminState {
    pub cache: Arc<Cache>,
    pub config: watch::Receiver<Arc<Published>>,
    pub clients: Arc<Clients>,
    pub metrics: Arc<Metrics>,
    pub auth: Auth,
}
