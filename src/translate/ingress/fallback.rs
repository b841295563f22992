//! `default-backend` and `custom-http-errors`, as Higress reads them
//! (`pkg/ingress/kube/annotations/default_backend.go`), under both prefixes
//! (`higress.io/` first).
//!
//! - **`default-backend`** names a Service, `[namespace/]name` (the
//!   Ingress's namespace by default), whose first port Higress takes. Its
//!   routes get it as `fallbackClusters`: the service of last resort when
//!   the route's own has no endpoint. As `mirror-target-service`, it may
//!   also give a port (`name:8080`) or name a registry service as
//!   `higress.io/destination` does (`errors.static:80`).
//! - **`custom-http-errors`** (`404,503`) works only with a default
//!   backend, as in Higress: an upstream answer with one of these codes is
//!   replaced by the default backend's answer to the same request (Higress's
//!   `internalActiveRedirect`; ingress-nginx's `error_page`). A code that is
//!   not a whole number from 400 to 599 is reported and left out.
//!
//! Neither is an Istio field: the standalone gateway serves them (see
//! `gateway/fallback.rs`), and through istiod they are a `standalone_only`
//! warning.

use meshbridge_registries::clip;

use super::syntax::whole_number;
use super::traffic::Lookup;
use crate::model::ingress::{MirrorTarget, TargetError, service_target};

pub const DEFAULT_BACKEND: &str = "default-backend";
pub const CUSTOM_HTTP_ERRORS: &str = "custom-http-errors";

/// The default backend an Ingress's annotations name, before its host is
/// looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// The annotation that named it, for warnings.
    pub key: String,
    /// A Kubernetes Service or a registry service (never an FQDN).
    pub target: MirrorTarget,
    /// The codes whose answers it replaces: ascending, each once.
    pub codes: Vec<u16>,
}

/// Why `default-backend` or an entry of `custom-http-errors` was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FallbackError {
    /// `default-backend` is not `[namespace/]name[:port]` nor a registry
    /// service.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// An entry that is not a whole number (shown clipped).
    #[error("{0:?} is not a status code")]
    NotCode(String),
    /// A code that is not an error status.
    #[error("{0} is not an error status from 400 to 599")]
    Range(u64),
    /// `custom-http-errors` alone: Higress needs a default backend to send
    /// the request to.
    #[error("has no effect without {DEFAULT_BACKEND}")]
    NoBackend,
}

/// Read `default-backend` and `custom-http-errors`; bad values go to
/// `warnings`, each naming its annotation and what was done instead.
pub fn read_fallback(get: &mut Lookup<'_>, warnings: &mut Vec<String>) -> Option<Fallback> {
    let backend = get(DEFAULT_BACKEND, true);
    let codes = get(CUSTOM_HTTP_ERRORS, true).filter(|(_, v)| !v.trim().is_empty());
    let mut warn = |key: &str, e: FallbackError, then: &str| warnings.push(format!("annotation {key}: {e}; {then}"));
    let Some((key, value)) = backend else {
        if let Some((key, _)) = codes {
            warn(&key, FallbackError::NoBackend, "ignored");
        }
        return None;
    };
    let target = match service_target(value.trim()) {
        Ok(t) => t,
        Err(e) => {
            let then = if codes.is_some() { "no default backend, and no answer is replaced" } else { "ignored" };
            warn(&key, e.into(), then);
            return None;
        }
    };
    let mut list = Vec::new();
    if let Some((codes_key, v)) = &codes {
        for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match status(entry) {
                Ok(code) => list.push(code),
                Err(e) => warn(codes_key, e, "left out"),
            }
        }
    }
    list.sort_unstable();
    list.dedup();
    Some(Fallback { key, target, codes: list })
}

/// An error status code, 400 to 599.
fn status(entry: &str) -> Result<u16, FallbackError> {
    let code = whole_number(entry).ok_or_else(|| FallbackError::NotCode(clip(entry).into_owned()))?;
    match u16::try_from(code) {
        Ok(c @ 400..=599) => Ok(c),
        _ => Err(FallbackError::Range(code)),
    }
}
