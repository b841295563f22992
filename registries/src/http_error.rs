//! reqwest failures as [`RegistryError::Unreachable`], for the watchers on
//! HTTP (Consul, Nacos, Eureka). reqwest's own message carries the URL (which
//! may hold a signature) and says little; the cause ("Connection refused",
//! "operation timed out") is in the source chain, so that is what we report.

use crate::watcher::RegistryError;

/// `{method} {path}: {kind}: {causes}`, where a failure while reading the
/// answer is "reading the answer failed".
pub(crate) fn client_error(registry: &str, method: &str, path: &str, e: &reqwest::Error) -> RegistryError {
    let reading = !e.is_timeout() && !e.is_connect() && (e.is_body() || e.is_decode());
    let kind = if reading { "reading the answer failed" } else { request_kind(e) };
    unreachable(registry, method, path, kind, e)
}

/// As [`client_error`], but a failed read of the answer is "request failed"
/// like any other failure but timeouts and refused connects (the Eureka
/// watcher's wording).
pub(crate) fn request_error(registry: &str, method: &str, path: &str, e: &reqwest::Error) -> RegistryError {
    unreachable(registry, method, path, request_kind(e), e)
}

fn request_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connect failed"
    } else {
        "request failed"
    }
}

fn unreachable(registry: &str, method: &str, path: &str, kind: &str, e: &reqwest::Error) -> RegistryError {
    // A refused certificate says so first, not as the tail of "connect failed".
    if let Some(tls) = crate::tls::tls_failure(e) {
        return RegistryError::Unreachable {
            registry: registry.to_string(),
            reason: format!("{method} {path}: {tls}"),
        };
    }
    let mut reason = String::from(kind);
    if let Some(source) = std::error::Error::source(e) {
        reason.push_str(": ");
        reason.push_str(&crate::error_chain::error_chain(source));
    }
    RegistryError::Unreachable { registry: registry.to_string(), reason: format!("{method} {path}: {reason}") }
}
