//! Is meshbridge running under a McpBridge CRD that drops fields it reads?
//!
//! The API server prunes every field a structural CRD schema does not
//! declare, before storing the object, so meshbridge never sees them and
//! cannot tell a pruned `registryTls` from one nobody wrote. Higress's own
//! CRD declares none of meshbridge's additions. The one signal is the CRD
//! itself: this reads `mcpbridges.networking.higress.io` (the ClusterRole
//! grants `get` on that one object) and compares its schema with the fields
//! the config code reads. The result goes to a WARN naming the fields and
//! to the `FieldsPreserved` condition of every McpBridge's status.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;
use serde_json::Value;
use tokio::sync::watch;
use tracing::{info, warn};

use super::args::{MCPBRIDGE_GROUP, MCPBRIDGE_PLURAL, MCPBRIDGE_VERSION};
use crate::config::{PROXY_FIELDS, REGISTRY_FIELDS};

/// How often the CRD is read again.
const RECHECK: Duration = Duration::from_secs(60);

/// The fields of object-valued entry fields that meshbridge reads too.
const NESTED: &[(&str, &[&str])] = &[
    ("registryTls", &["enabled", "caKey", "serverName"]),
    ("meshbridgeWatch", &["mode", "include"]),
    ("meshbridgeMigration", &["weight", "priority"]),
    ("vport", &["default", "services"]),
];

/// What the installed CRD keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrdFields {
    /// Not known (not checked yet, no RBAC to read the CRD, or no schema
    /// for our version).
    Unknown(String),
    /// Every field meshbridge reads is kept.
    Complete,
    /// These fields are pruned, as paths (`spec.registries[].registryTls`).
    Pruned(Vec<String>),
}

/// What Higress's own McpBridge CRD prunes of the fields meshbridge reads
/// (a test derives it from that CRD's schema): `meshbridge check` warns of
/// each one it finds.
pub const HIGRESS_CRD_PRUNES: [&str; 5] = [
    "spec.registries[].nacosTimeout",
    "spec.registries[].ecdhCurves",
    "spec.registries[].meshbridgeWatch",
    "spec.registries[].meshbridgeMigration",
    "spec.registries[].registryTls",
];

/// The name of the McpBridge CRD.
pub fn crd_name() -> String {
    format!("{MCPBRIDGE_PLURAL}.{MCPBRIDGE_GROUP}")
}

/// The fields meshbridge reads that `crd_spec` (a CRD's `spec` as JSON)
/// prunes in version `v1`; `None` when it has no schema for it.
pub fn pruned_fields(crd_spec: &Value) -> Option<Vec<String>> {
    let version = crd_spec.get("versions")?.as_array()?.iter().find(|v| v["name"] == MCPBRIDGE_VERSION)?;
    let root = version.pointer("/schema/openAPIV3Schema")?;
    let mut pruned = Vec::new();
    let spec = Schema::Declared(root).child("spec", "spec", &mut pruned);
    let lists: [(&str, &[&str]); 2] = [("registries", REGISTRY_FIELDS), ("proxies", PROXY_FIELDS)];
    for (list, fields) in lists {
        let path = format!("spec.{list}");
        let item = match spec.child(list, &path, &mut pruned) {
            Schema::Declared(node) => match node.get("items") {
                Some(items) => Schema::Declared(items),
                None if keeps_unknown(node) => Schema::KeepsAll,
                None => {
                    pruned.push(format!("{path}[]"));
                    continue;
                }
            },
            other => other,
        };
        for field in fields.iter() {
            let at = format!("{path}[].{field}");
            let node = item.child(field, &at, &mut pruned);
            if let Some((_, nested)) = NESTED.iter().find(|(n, _)| n == field)
                && matches!(node, Schema::Declared(_))
            {
                for sub in nested.iter() {
                    node.child(sub, &format!("{at}.{sub}"), &mut pruned);
                }
            }
        }
    }
    Some(pruned)
}

/// A schema node, or one under which everything is kept.
#[derive(Clone, Copy)]
enum Schema<'a> {
    Declared(&'a Value),
    KeepsAll,
    Pruned,
}

impl<'a> Schema<'a> {
    /// The schema of property `name`, recording `path` as pruned when the
    /// node neither declares it nor keeps unknown fields.
    fn child(self, name: &str, path: &str, pruned: &mut Vec<String>) -> Schema<'a> {
        match self {
            Schema::KeepsAll => Schema::KeepsAll,
            Schema::Pruned => Schema::Pruned,
            Schema::Declared(node) => match node.get("properties").and_then(|p| p.get(name)) {
                Some(prop) if keeps_unknown(prop) && prop.get("properties").is_none() => Schema::KeepsAll,
                Some(prop) => Schema::Declared(prop),
                None if keeps_unknown(node) => Schema::KeepsAll,
                None => {
                    pruned.push(path.to_owned());
                    Schema::Pruned
                }
            },
        }
    }
}

fn keeps_unknown(node: &Value) -> bool {
    node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

/// Read the CRD once and say what it keeps.
pub(super) async fn check(client: &Client) -> CrdFields {
    let name = crd_name();
    match Api::<CustomResourceDefinition>::all(client.clone()).get(&name).await {
        Ok(crd) => match serde_json::to_value(&crd.spec).ok().as_ref().and_then(pruned_fields) {
            Some(p) if p.is_empty() => CrdFields::Complete,
            Some(p) => CrdFields::Pruned(p),
            None => CrdFields::Unknown(format!("CRD {name} has no schema for {MCPBRIDGE_VERSION}")),
        },
        Err(error) => CrdFields::Unknown(format!("cannot read CRD {name}: {error}")),
    }
}

/// Log what the CRD keeps (a WARN naming every pruned field).
pub(super) fn report(fields: &CrdFields) {
    let crd = crd_name();
    match fields {
        CrdFields::Pruned(p) => warn!(
            %crd,
            fields = %p.join(", "),
            "the installed McpBridge CRD does not declare fields meshbridge reads: the API server drops them from \
             every McpBridge, so they have no effect; install deploy/kubernetes/crd-mcpbridge.yaml (a superset of \
             Higress's) to keep them"
        ),
        CrdFields::Complete => info!(%crd, "the McpBridge CRD keeps every field meshbridge reads"),
        CrdFields::Unknown(why) => {
            warn!(%crd, reason = %why, "cannot tell whether the McpBridge CRD prunes fields meshbridge reads")
        }
    }
}

/// Reads the CRD again every [`RECHECK`] (it can be replaced while we
/// run) and publishes a change.
pub(super) async fn run(client: Client, tx: watch::Sender<CrdFields>) {
    loop {
        tokio::time::sleep(RECHECK).await;
        let fields = check(&client).await;
        if *tx.borrow() != fields {
            report(&fields);
            tx.send_replace(fields);
        }
    }
}

/// The `FieldsPreserved` condition's status, reason and message.
pub fn condition(fields: &CrdFields) -> (&'static str, &'static str, String) {
    match fields {
        CrdFields::Complete => {
            ("True", "SchemaComplete", "the McpBridge CRD keeps every field meshbridge reads".into())
        }
        CrdFields::Pruned(p) => {
            ("False", "PrunedByCRD", format!("the installed McpBridge CRD drops {}: they have no effect", p.join(", ")))
        }
        CrdFields::Unknown(why) => ("Unknown", "CRDNotChecked", why.clone()),
    }
}
