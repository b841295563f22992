//! The Secrets config references, and no others: each is read by name with
//! a `get`, when a reference to it appears and again every
//! `--secret-resync-interval` ([`SECRET_RESYNC`] by default). No Secret is listed or watched, so RBAC needs only
//! `get` on Secrets, and only in the namespaces that hold referenced ones:
//! the McpBridges' (`authSecretName`) and the Ingresses' (`spec.tls[]`),
//! or the one a `proxy-ssl-secret` or an `auth-tls-secret` names.
//!
//! The trade-off, against a watch: a changed Secret (a rotated
//! certificate, a new token) is seen within the resync interval, not at once,
//! and each resync costs one `get` per referenced Secret. A watch per
//! namespace would read every Secret there; a watch per name would hold a
//! connection (HTTP/1.1) per referenced Secret.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tracing::{debug, warn};

/// How often every referenced Secret is read again, by default.
pub const SECRET_RESYNC: Duration = Duration::from_secs(30);
/// Reads in flight at once.
const CONCURRENT_GETS: usize = 8;

/// (namespace, name) of a Secret.
pub type SecretRef = (String, String);

/// What one `get` found.
#[derive(Debug, Clone)]
enum Read {
    /// The Secret (managed fields dropped).
    Found(Arc<Secret>),
    /// No such Secret: the builder reports the reference as missing.
    Missing,
    /// It could not be read; the last good copy, if any, stays in force.
    Failed { error: String, last: Option<Arc<Secret>> },
}

/// The referenced Secrets as last read.
pub struct Secrets {
    client: Client,
    read: BTreeMap<SecretRef, Read>,
}

impl Secrets {
    pub fn new(client: Client) -> Secrets {
        Secrets { client, read: BTreeMap::new() }
    }

    /// Read the Secrets of `wanted` not read yet (all of them when `all`),
    /// and forget those no longer wanted. Returns whether anything the
    /// builder sees changed.
    pub async fn sync(&mut self, wanted: &BTreeSet<SecretRef>, all: bool) -> bool {
        let before = self.read.len();
        self.read.retain(|r, _| wanted.contains(r));
        let mut changed = self.read.len() != before;
        let to_read: Vec<SecretRef> = wanted.iter().filter(|r| all || !self.read.contains_key(*r)).cloned().collect();
        if to_read.is_empty() {
            return changed;
        }
        let client = self.client.clone();
        let results: Vec<(SecretRef, Result<Option<Secret>, kube::Error>)> = futures::stream::iter(to_read)
            .map(|r| {
                let api: Api<Secret> = Api::namespaced(client.clone(), &r.0);
                async move {
                    let got = api.get_opt(&r.1).await;
                    (r, got)
                }
            })
            .buffer_unordered(CONCURRENT_GETS)
            .collect()
            .await;
        for (r, got) in results {
            let last = self.read.get(&r).and_then(Read::secret);
            let now = match got {
                Ok(Some(mut s)) => {
                    s.managed_fields_mut().clear();
                    Read::Found(Arc::new(s))
                }
                Ok(None) => Read::Missing,
                Err(e) => {
                    let error = describe(&r, &e);
                    warn!(secret = %format!("{}/{}", r.0, r.1), %error, "cannot read a referenced Secret; keeping its last good copy");
                    Read::Failed { error, last: last.clone() }
                }
            };
            let same = match (self.read.get(&r), &now) {
                (Some(Read::Found(a)), Read::Found(b)) => a.resource_version() == b.resource_version(),
                (Some(Read::Missing), Read::Missing) => true,
                (Some(Read::Failed { error: a, .. }), Read::Failed { error: b, .. }) => a == b,
                _ => false,
            };
            if !same {
                debug!(secret = %format!("{}/{}", r.0, r.1), "referenced Secret read");
                changed = true;
            }
            self.read.insert(r, now);
        }
        changed
    }

    /// The Secrets in force: those read, and the last good copy of those
    /// that could not be read again.
    pub fn present(&self) -> Vec<Arc<Secret>> {
        self.read.values().filter_map(Read::secret).collect()
    }

    /// Why referenced Secrets could not be read, one line each.
    pub fn errors(&self) -> Vec<String> {
        self.read
            .iter()
            .filter_map(|((ns, name), r)| match r {
                Read::Failed { error, last } => Some(format!(
                    "Secret {ns}/{name}: {error}{}",
                    if last.is_some() { "; keeping its last good copy" } else { "" }
                )),
                _ => None,
            })
            .collect()
    }
}

impl Read {
    fn secret(&self) -> Option<Arc<Secret>> {
        match self {
            Read::Found(s) => Some(s.clone()),
            Read::Missing => None,
            Read::Failed { last, .. } => last.clone(),
        }
    }
}

/// A read error in a line: a refusal names the RBAC rule that is missing.
fn describe(r: &SecretRef, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) if status.code == 403 => format!(
            "cannot be read: forbidden; grant this ServiceAccount `get` on secrets in namespace {} \
             (docs/src/kubernetes.md, \"Secrets\")",
            r.0
        ),
        other => format!("cannot be read: {other}"),
    }
}
