//! What the config sources produce ([`Desired`] and its parts) and how
//! they fail ([`ConfigError`]): the leaf every part of `config` uses.

use std::path::PathBuf;
use std::sync::Arc;

use meshbridge_registries::RegistrySpec;

use super::model::IngressDoc;
pub use crate::model::{CaSecret, DEFAULT_PROXY_CONNECT_TIMEOUT, ProxySpec, TlsSecret};

/// Everything the config sources say we should be doing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Desired {
    /// Validated, secrets resolved, sorted by (kind, name).
    pub registries: Vec<RegistrySpec>,
    /// Validated, sorted by name. Names are unique across all McpBridges.
    pub proxies: Vec<ProxySpec>,
    /// As written, sorted by (namespace, name).
    pub ingresses: Vec<IngressDoc>,
    /// Secrets holding `tls.crt` and `tls.key`, sorted by (namespace, name):
    /// certificates for the standalone gateway's HTTPS listener.
    pub tls_secrets: Vec<TlsSecret>,
    /// Secrets holding CA certificates (`cacert` or `ca.crt`), sorted by
    /// (namespace, name): what client certificates are verified against
    /// (`auth-tls-secret`).
    pub ca_secrets: Vec<CaSecret>,
    /// Every current problem, human-readable, for logs and `/debug`.
    pub errors: Vec<String>,
    /// Each file of a file-based source and whether it is in force
    /// (`/v1/config`); empty for other sources.
    pub files: Vec<FileStatus>,
}

impl Desired {
    /// What is configured, in one line for the log: each registry by kind,
    /// name and address (at most a few), then counts.
    pub fn summary(&self) -> String {
        const NAMED: usize = 4;
        let plural = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut text = plural(self.registries.len(), "registry", "registries");
        let named: Vec<String> = self
            .registries
            .iter()
            .take(NAMED)
            .map(|r| format!("{} {:?} at {}", r.kind, r.name, meshbridge_registries::clip(&r.endpoint())))
            .collect();
        if !named.is_empty() {
            let more = self.registries.len().saturating_sub(NAMED);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            text.push_str(&format!(" ({}{more})", named.join(", ")));
        }
        text.push_str(&format!(
            ", {}, {}, {}",
            plural(self.proxies.len(), "proxy", "proxies"),
            plural(self.ingresses.len(), "Ingress", "Ingresses"),
            plural(self.errors.len(), "problem", "problems"),
        ));
        text
    }
}

/// One config file as `/v1/config` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileStatus {
    pub name: String,
    /// `loaded`, `lastGoodKept` (the current text is broken; the last good
    /// version stays in force) or `ignored` (broken, nothing good before).
    pub state: &'static str,
    /// Why the current version is not in force.
    pub error: Option<String>,
}

/// Errors of config sources. Problems inside a document that parsed (a bad
/// registry, a missing Secret) are not errors of this type: they are listed
/// in [`Desired::errors`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid YAML. `document` (1-based) and `line` are given
    /// when the parser knows where it stopped.
    #[error("{file}{}: {reason}", location(*document, *line))]
    Yaml { file: String, document: Option<usize>, line: Option<u64>, reason: String },
    /// A YAML document is not an object we can use: not a mapping, no `kind`
    /// or `metadata.name`, a `spec` of the wrong shape, or Secret data that
    /// does not decode. The reason names the field, never a Secret value.
    #[error("{file}{}: {reason}", location(Some(*document), *line))]
    Document {
        file: String,
        /// 1-based index among the file's non-empty documents.
        document: usize,
        /// First line of the document, when known.
        line: Option<u64>,
        reason: String,
    },
    /// A file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: Arc<std::io::Error> },
    /// A config file is bigger than the cap (`MAX_FILE_BYTES`); it is
    /// not read.
    #[error("{}: {size} bytes, more than the limit of {max} bytes per config file", path.display())]
    TooLarge { path: PathBuf, size: u64, max: u64 },
}

fn location(document: Option<usize>, line: Option<u64>) -> String {
    match (document, line) {
        (Some(d), Some(l)) => format!(": document {d}, line {l}"),
        (Some(d), None) => format!(": document {d}"),
        (None, Some(l)) => format!(": line {l}"),
        (None, None) => String::new(),
    }
}
