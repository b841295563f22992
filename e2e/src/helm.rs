//! REAL helm, built from its Go module by `e2e/setup.sh helm`
//! (`MESHBRIDGE_HELM_BIN`), run on the chart in `deploy/helm/meshbridge`.
//! Its cache, config and data dirs are in a temp dir, so a test neither
//! reads nor writes `$HOME`; it talks to a cluster only through the
//! `--kubeconfig` a test passes (the API server of `src/apiserver.rs`).

use std::path::PathBuf;

use anyhow::Context;
use serde_json::Value;

use crate::apiserver::repo;
use crate::process::{binary_from_env, stdout_of};

/// The helm binary with a home of its own.
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    pub fn new() -> anyhow::Result<Helm> {
        Ok(Helm { bin: binary_from_env("MESHBRIDGE_HELM_BIN")?, home: tempfile::tempdir()? })
    }

    /// `helm ARGS`: stdout, or an error with stderr.
    pub async fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let home = self.home.path();
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(args)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("KUBECONFIG");
        stdout_of(cmd, &format!("helm {}", args.join(" "))).await
    }

    /// A values file (YAML; JSON is YAML) in helm's temp dir.
    pub fn values_file(&self, name: &str, values: &Value) -> anyhow::Result<PathBuf> {
        let path = self.home.path().join(name);
        std::fs::write(&path, values.to_string())?;
        Ok(path)
    }
}

/// The chart's directory.
pub fn chart() -> PathBuf {
    repo().join("deploy/helm/meshbridge")
}

/// The objects in a multi-document YAML stream (`helm template`,
/// `kubectl kustomize`), without the empty documents.
pub fn objects(yaml: &str) -> anyhow::Result<Vec<Value>> {
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(yaml).context("parse YAML stream")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// `Kind namespace/name` of an object (`Kind name` when cluster-scoped).
pub fn key(object: &Value) -> String {
    let m = &object["metadata"];
    match m["namespace"].as_str() {
        Some(ns) => format!("{} {ns}/{}", object["kind"].as_str().unwrap_or("?"), m["name"].as_str().unwrap_or("?")),
        None => format!("{} {}", object["kind"].as_str().unwrap_or("?"), m["name"].as_str().unwrap_or("?")),
    }
}
