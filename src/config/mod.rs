//! What meshbridge should be doing, read from Higress-style Kubernetes YAML:
//! `McpBridge` (registries and proxies), the `Secret`s their
//! `authSecretName`s point at, and `Ingress`es (kept raw for the Ingress
//! translator).
//!
//! The flow is `parse` (text to [`Document`]s) → `validate` (one entry to
//! one spec) → `build` (documents to [`Desired`], with last-good fallback)
//! → a source such as [`DirSource`] that publishes each new [`Desired`].
//!
//! Problems are never fatal: a file that does not parse keeps its last good
//! documents, an invalid registry keeps its last good spec (or is left out),
//! and every current problem is listed in [`Desired::errors`] with the object
//! and field it concerns, for example
//! `McpBridge higress-system/default: spec.registries[2].port: must be 1..65535`.
//! Unknown fields only warn, as Kubernetes does for forward compatibility.
//! Credentials are never printed: `Secret` redacts itself and raw entries
//! redact their credential fields.

mod build;
mod dir;
mod model;
mod parse;
mod state;
mod types;
mod validate;

#[cfg(test)]
mod config_tests;
#[cfg(test)]
mod registry_tls_tests;

pub use build::Builder;
pub(crate) use dir::read_text;
pub use dir::{DirSource, MAX_FILE_BYTES, load_once};
#[cfg(test)]
pub(crate) use model::REGISTRY_IGNORED_FIELDS;
pub use model::{Document, IngressDoc, McpBridgeDoc, RawEntry, SecretDoc};
pub(crate) use model::{PROXY_FIELDS, REGISTRY_FIELDS};
pub use parse::{parse_documents, parse_object};
pub use state::ConfigState;
pub use types::{CaSecret, ConfigError, DEFAULT_PROXY_CONNECT_TIMEOUT, Desired, FileStatus, ProxySpec, TlsSecret};
pub use validate::FieldError;
pub use validate::MIN_REFRESH_INTERVAL;

/// Build [`Desired`] from documents, in source order, with no memory of
/// earlier builds (tests; sources keep a [`Builder`] for last good specs).
pub fn build_desired<'a>(docs: impl IntoIterator<Item = &'a Document>) -> Desired {
    Builder::default().build(docs)
}

/// The Ingresses of a YAML fixture, for tests.
#[cfg(test)]
pub(crate) fn ingress_docs(yaml: &str) -> Vec<IngressDoc> {
    parse_documents("test.yaml", yaml)
        .expect("fixture parses")
        .into_iter()
        .filter_map(|d| match d {
            Document::Ingress(i) => Some(i),
            _ => None,
        })
        .collect()
}
