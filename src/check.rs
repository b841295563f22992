//! `meshbridge check`: validate config offline, as `nginx -t` does.
//!
//! Each argument (a config directory, one YAML file, or `-` for stdin) is
//! read and built exactly as the server reads it ([`crate::config`]), then
//! translated with no registry contents ([`crate::translate`]). What it
//! prints are the server's own errors and warnings, as `/v1/config` lists
//! them, plus one warning per field that Higress's McpBridge CRD would prune.
//!
//! A file given by name that is not YAML, or whose documents have no
//! `kind` (an Envoy bootstrap beside the config, say), is skipped and
//! said so: `meshbridge check deploy/examples/*` checks the config there.
//! A directory is read whole, as `--config-dir` reads it.
//!
//! Offline, the registries' services are unknown, so a route to a registry
//! service cannot be told from a route to nothing: those `no_cluster`
//! warnings are left to the running server (`/v1/config`).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use serde::Serialize;

use crate::cache::Changes;
use crate::config::{ConfigState, Document, MAX_FILE_BYTES, read_text};
use crate::publish::GatewayArgs;
use crate::translate::{Reason, Translator, Warning};

/// Exit status: nothing wrong (or only warnings without `--strict`).
pub const EXIT_OK: i32 = 0;
/// Exit status: errors, or warnings under `--strict`.
pub const EXIT_PROBLEMS: i32 = 1;
/// Exit status: an argument could not be read at all.
pub const EXIT_UNREADABLE: i32 = 2;

/// `meshbridge check`.
#[derive(Debug, Clone, clap::Args)]
pub struct CheckCommand {
    /// Config directories (`*.yaml` and `*.yml` in each, as --config-dir
    /// reads them), YAML files, or `-` for standard input. Each is checked
    /// on its own.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Exit non-zero on warnings too.
    #[arg(long)]
    pub strict: bool,
    /// `text` for people, `json` for pipelines.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The objects are for Kubernetes mode (`--kube`), where Service
    /// backends are read from the cluster: do not warn that a config
    /// directory cannot reach them.
    #[arg(long, env = "MESHBRIDGE_KUBE")]
    pub kube: bool,
    #[command(flatten)]
    pub gateway: GatewayArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// What one argument holds and what is wrong with it.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The argument as given.
    pub path: String,
    /// Objects read, by kind.
    pub mcp_bridges: usize,
    pub ingresses: usize,
    pub secrets: usize,
    /// Valid registries and proxies.
    pub registries: usize,
    pub proxies: usize,
    /// Problems that leave something out, each naming its object and field.
    pub errors: Vec<String>,
    /// Problems that do not (unknown fields, ignored annotations, pruned
    /// fields, routes that answer 503).
    pub warnings: Vec<Problem>,
    /// Why a file given by name was not checked: it is not YAML, or holds
    /// no Kubernetes object (an Envoy bootstrap, say), so it is not config.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// One warning, shaped as `/v1/config` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub object: String,
    pub reason: &'static str,
    pub detail: String,
}

impl Report {
    fn failed(&self, strict: bool) -> bool {
        !self.errors.is_empty() || (strict && !self.warnings.is_empty())
    }
}

/// Why an argument could not be checked at all.
#[derive(Debug, thiserror::Error)]
pub enum Unreadable {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}")]
    Config(crate::config::ConfigError),
}

/// Run the command: print the reports and return the exit status.
pub fn main(cmd: &CheckCommand) -> i32 {
    let mut reports = Vec::new();
    let mut unreadable = Vec::new();
    for path in &cmd.paths {
        match check_path(path, cmd) {
            Ok(r) => reports.push(r),
            Err(e) => unreadable.push(e.to_string()),
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let written = match cmd.output {
        Output::Json => write_json(&mut out, &reports, &unreadable),
        Output::Text => write_text(&mut out, &reports, &unreadable),
    };
    if let Err(e) = written.and_then(|()| out.flush()) {
        eprintln!("meshbridge check: writing the report: {e}");
        return EXIT_UNREADABLE;
    }
    if !unreadable.is_empty() {
        EXIT_UNREADABLE
    } else if reports.iter().any(|r| r.failed(cmd.strict)) {
        EXIT_PROBLEMS
    } else {
        EXIT_OK
    }
}

/// Check one argument.
pub fn check_path(path: &Path, cmd: &CheckCommand) -> Result<Report, Unreadable> {
    let shown = path.display().to_string();
    // A file that exists: a missing path is an error, in `load`.
    if !path.is_file() {
        return Ok(check_state(shown, load(path)?, cmd));
    }
    let skip = |why: &str| Report { path: shown.clone(), skipped: Some(why.to_owned()), ..Report::default() };
    if !path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
        return Ok(skip("not a .yaml or .yml file"));
    }
    let text = read_file(path)?;
    if holds_no_object(&text) {
        return Ok(skip("no Kubernetes object in it (no document has a kind)"));
    }
    Ok(check_state(shown.clone(), state_of(&shown, text), cmd))
}

/// Whether `text` parses as YAML and no document of it has a `kind` (a file
/// that does not parse is left to the parser, which says where).
fn holds_no_object(text: &str) -> bool {
    match serde_saphyr::from_multiple::<serde_json::Value>(text) {
        Ok(docs) => !docs.iter().any(|d| d.get("kind").is_some()),
        Err(_) => false,
    }
}

/// Read one argument (a directory, a file or `-`) as the server would.
pub fn load(path: &Path) -> Result<ConfigState, Unreadable> {
    if path == Path::new("-") {
        const STDIN: &str = "<stdin>";
        let stdin = std::io::stdin().lock();
        let text = read_text(Path::new(STDIN), stdin, 0, MAX_FILE_BYTES).map_err(Unreadable::Config)?;
        Ok(state_of(STDIN, text))
    } else if path.is_dir() {
        crate::config::load_once(path).map_err(Unreadable::Config)
    } else {
        let text = read_file(path)?;
        Ok(state_of(&path.display().to_string(), text))
    }
}

/// One file's text, read as the directory source reads it.
fn read_file(path: &Path) -> Result<String, Unreadable> {
    let io = |source| Unreadable::Io { path: path.display().to_string(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    read_text(path, file, size, MAX_FILE_BYTES).map_err(Unreadable::Config)
}

/// A config of one file's text.
fn state_of(name: &str, text: String) -> ConfigState {
    let mut state = ConfigState::new();
    state.set_file(name, text);
    state
}

/// Build and translate what `state` holds, and report on it.
pub fn check_state(path: String, mut state: ConfigState, cmd: &CheckCommand) -> Report {
    let desired = state.desired();
    let mut report = Report {
        path,
        ingresses: desired.ingresses.len(),
        registries: desired.registries.len(),
        proxies: desired.proxies.len(),
        errors: desired.errors.clone(),
        ..Report::default()
    };
    report.warnings.extend(state.warnings().iter().map(|w| config_warning(w)));
    for doc in state.documents() {
        match doc {
            Document::McpBridge(b) => {
                report.mcp_bridges += 1;
                report.warnings.extend(pruned_by_higress(b));
            }
            Document::Secret(_) => report.secrets += 1,
            Document::Ingress(_) => {}
        }
    }
    let opts = cmd.gateway.publish_options();
    let inputs = crate::publish::inputs(&desired, &opts);
    let mut translator = Translator::new();
    translator.apply(Changes::default(), &inputs, true);
    let translated = translator.set().warnings.values().flat_map(|ws| ws.iter());
    report.warnings.extend(translated.filter(|w| offline_knowable(w, cmd.kube)).map(|w| Problem {
        object: w.object.clone(),
        reason: w.reason.as_str(),
        detail: w.detail.clone(),
    }));
    report
}

/// A config warning (`McpBridge ns/name: field: why`) in `/v1/config`'s
/// shape.
fn config_warning(w: &str) -> Problem {
    let (object, detail) = match w.split_once(": ") {
        Some((object, detail)) => (object.to_owned(), detail.to_owned()),
        None => (String::new(), w.to_owned()),
    };
    Problem { object, reason: "config", detail }
}

/// Whether a translation warning holds whatever the registries hold.
/// `no_cluster` for a host no registry has yet is left out (offline, every
/// registry service is such a host), and so is a Kubernetes Service in
/// Kubernetes mode, where its endpoints are read from the cluster.
fn offline_knowable(w: &Warning, kube: bool) -> bool {
    if w.reason != Reason::NoCluster {
        return true;
    }
    let registry_dependent = w.detail.contains("(not a registry service)");
    let kube_service = w.detail.contains("is a Kubernetes Service the standalone gateway has no endpoints for");
    !(registry_dependent || (kube && kube_service))
}

/// One warning per field of `bridge` that Higress's McpBridge CRD prunes:
/// in a cluster where that CRD is installed, the API server drops it.
fn pruned_by_higress(bridge: &crate::config::McpBridgeDoc) -> Vec<Problem> {
    let mut found = Vec::new();
    for (list, entries) in [("registries", &bridge.registries), ("proxies", &bridge.proxies)] {
        for (i, entry) in entries.iter().enumerate() {
            for path in crate::kube::HIGRESS_CRD_PRUNES {
                let Some(field) = path.strip_prefix(&format!("spec.{list}[].")) else { continue };
                if entry.0.get(field).is_some() {
                    found.push(Problem {
                        object: format!("McpBridge {}", bridge.id()),
                        reason: "pruned_by_higress_crd",
                        detail: format!(
                            "spec.{list}[{i}].{field}: Higress's McpBridge CRD prunes this field, so the API server \
                             drops it where that CRD is installed; install meshbridge's \
                             (deploy/kubernetes/crd-mcpbridge.yaml) to keep it"
                        ),
                    });
                }
            }
        }
    }
    found
}

fn write_text(out: &mut impl Write, reports: &[Report], unreadable: &[String]) -> std::io::Result<()> {
    for e in unreadable {
        writeln!(out, "error: {e}")?;
    }
    for r in reports {
        if let Some(why) = &r.skipped {
            writeln!(out, "{}: skipped: {why}", r.path)?;
            continue;
        }
        let plural = |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        writeln!(
            out,
            "{}: {}, {}, {}; {}, {}",
            r.path,
            plural(r.mcp_bridges, "McpBridge", "McpBridges"),
            plural(r.ingresses, "Ingress", "Ingresses"),
            plural(r.secrets, "Secret", "Secrets"),
            plural(r.errors.len(), "error", "errors"),
            plural(r.warnings.len(), "warning", "warnings"),
        )?;
        for e in &r.errors {
            writeln!(out, "  error: {e}")?;
        }
        for w in &r.warnings {
            writeln!(out, "  warning [{}]: {}: {}", w.reason, w.object, w.detail)?;
        }
    }
    Ok(())
}

fn write_json(out: &mut impl Write, reports: &[Report], unreadable: &[String]) -> std::io::Result<()> {
    let doc = serde_json::json!({
        "errors": reports.iter().map(|r| r.errors.len()).sum::<usize>() + unreadable.len(),
        "warnings": reports.iter().map(|r| r.warnings.len()).sum::<usize>(),
        "unreadable": unreadable,
        "sources": reports,
    });
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
