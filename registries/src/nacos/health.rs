//! Health reporting shared by every loop of a watcher: the crate's
//! [`health::Health`] (with its recovery signal), plus the count of
//! credential refusals the Nacos loops act on.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::api::is_auth_error;
use super::auth;
use crate::health;
use crate::watcher::{RegistryError, Sink};

/// Reports health to the sink and notices recovery.
pub(super) struct Health {
    report: health::Health,
    /// Credential refusals in a row (logins excluded).
    pub auth_failures: AtomicU32,
}

impl Health {
    pub fn new(sink: Arc<dyn Sink>) -> Health {
        Health { report: health::Health::new(sink, "nacos"), auth_failures: AtomicU32::new(0) }
    }

    pub fn ok(&self) {
        self.auth_failures.store(0, Ordering::SeqCst);
        self.report.ok();
    }

    /// Signalled when a call succeeds after a failure.
    pub fn recovered(&self) -> &tokio::sync::Notify {
        &self.report.recovered
    }

    pub fn fail(&self, e: &RegistryError) {
        if is_auth_error(e) && !auth::is_login_error(e) {
            self.auth_failures.fetch_add(1, Ordering::SeqCst);
        }
        self.report.fail(e);
    }
}
