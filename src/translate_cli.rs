//! `meshbridge translate`: print what meshbridge would serve, offline.
//!
//! The config is read as `meshbridge check` reads it ([`crate::check::load`]),
//! the registries' services come from a `--state-dir` dump (the files
//! `meshbridge run --state-dir` writes, one per registry; a `static`
//! registry without one is its config), and the one
//! [`Translator`] the server runs turns both into the Istio objects sent to
//! istiod over MCP. They are printed as Kubernetes YAML, one document per
//! object, in the order `/debug/configz` lists them. Objects that fail
//! Pilot's rules are not sent over MCP and are not printed; the warnings
//! say why, on stderr.
//!
//! With `--envoy` it prints what the standalone gateway's Envoys get over
//! ADS instead: clusters, listeners, routes and endpoints, as one JSON
//! document in the shape of Envoy's `/config_dump?include_eds` (see
//! [`envoy_dump`]). Secrets are left out: they hold private keys.

use std::io::Write;
use std::path::PathBuf;

use meshbridge_registries::fixed::StaticWatcher;
use meshbridge_registries::{RegistryKind, Update};

use crate::cache::{Cache, RegistryKey};
use crate::check::{EXIT_OK, EXIT_PROBLEMS, EXIT_UNREADABLE};
use crate::dump::StateDir;
use crate::publish::GatewayArgs;
use crate::translate::{ConfigSet, Translator, mcp};

/// `meshbridge translate`.
#[derive(Debug, Clone, clap::Args)]
pub struct TranslateCommand {
    /// A config directory, a YAML file, or `-` for standard input.
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    /// A state directory (`meshbridge run --state-dir`) whose dumps give the
    /// registries' services; without it every registry is empty.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the standalone gateway's Envoy config (clusters, listeners,
    /// routes, endpoints) as Envoy's config-dump JSON, instead of the Istio
    /// objects.
    #[arg(long)]
    pub envoy: bool,
    #[command(flatten)]
    pub gateway: GatewayArgs,
}

/// Run the command: the objects on stdout, problems on stderr; returns the
/// exit status (1 when the config has errors, 2 when an input cannot be
/// read at all).
pub fn main(cmd: &TranslateCommand) -> i32 {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    match run(cmd, &mut stdout.lock(), &mut stderr.lock()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("meshbridge translate: {e}");
            EXIT_UNREADABLE
        }
    }
}

/// What [`main`] does, writing to `out` and `err`.
pub fn run(cmd: &TranslateCommand, out: &mut impl Write, err: &mut impl Write) -> anyhow::Result<i32> {
    let mut state = crate::check::load(&cmd.path)?;
    let desired = state.desired();
    for e in &desired.errors {
        writeln!(err, "error: {e}")?;
    }
    for w in state.warnings() {
        writeln!(err, "warning [config]: {w}")?;
    }
    let cache = Cache::new();
    let dumps = cmd.state_dir.as_ref().map(StateDir::open).transpose()?;
    for r in &desired.registries {
        let key = RegistryKey::new(r.kind, r.name.clone());
        let dumped = match &dumps {
            Some(dumps) => dumps.read(&key).map_err(|e| anyhow::anyhow!("registry {key}: {e}"))?,
            None => None,
        };
        match dumped {
            Some(services) => cache.load_dump(&key, services),
            // A static registry's one service is its config.
            None if r.kind == RegistryKind::Static => {
                let service = StaticWatcher::new(r.clone())?.service().clone();
                cache.attach(&key).update(Update::Snapshot(vec![service]));
            }
            None => writeln!(err, "note: registry {key}: no dump, so no services")?,
        }
    }
    let opts = cmd.gateway.publish_options();
    let inputs = crate::publish::inputs(&desired, &opts);
    let mut translator = Translator::new();
    translator.apply(cache.take_all(), &inputs, true);
    let set = translator.set();
    for w in set.warnings.values().flat_map(|ws| ws.iter()) {
        writeln!(err, "warning [{}]: {}: {}", w.reason.as_str(), w.object, w.detail)?;
    }
    if cmd.envoy {
        let dump = envoy_dump(set)?;
        serde_json::to_writer_pretty(&mut *out, &dump)?;
        writeln!(out)?;
    } else {
        write_objects(set, out)?;
    }
    Ok(if desired.errors.is_empty() { EXIT_OK } else { EXIT_PROBLEMS })
}

/// The objects sent over MCP, as a YAML stream.
fn write_objects(set: &ConfigSet, out: &mut impl Write) -> anyhow::Result<()> {
    for obj in set.istio.values() {
        let name = format!("{}/{}", obj.metadata.namespace, obj.metadata.name);
        let sent = set.mcp.get(&mcp::collection_of(obj)).is_some_and(|r| r.contains(&name));
        if !sent {
            continue;
        }
        let value = serde_json::to_value(&**obj)?;
        let yaml = serde_saphyr::to_string(&value)?;
        writeln!(out, "---")?;
        out.write_all(yaml.as_bytes())?;
        if !yaml.ends_with('\n') {
            writeln!(out)?;
        }
    }
    Ok(())
}

/// The Envoy resource types in a config dump, in the order Envoy's admin
/// writes them: (type URL, the dump message's type, its list field, the
/// field of each entry that holds the resource).
const DUMP_TYPES: [(&str, &str, &str, &str); 4] = [
    (crate::translate::envoy::CLUSTER_TYPE, "ClustersConfigDump", "dynamic_active_clusters", "cluster"),
    (crate::translate::envoy::LISTENER_TYPE, "ListenersConfigDump", "dynamic_listeners", "listener"),
    (crate::translate::envoy::ROUTE_TYPE, "RoutesConfigDump", "dynamic_route_configs", "route_config"),
    (crate::translate::envoy::ENDPOINT_TYPE, "EndpointsConfigDump", "dynamic_endpoint_configs", "endpoint_config"),
];

/// The Envoy resources of `set` in the shape of Envoy's
/// `/config_dump?include_eds`: `{"configs": [...]}`, one entry per type,
/// each resource with the version meshbridge would send. The fields Envoy
/// adds from its own state (`last_updated`, `error_state`) are not there.
pub fn envoy_dump(set: &ConfigSet) -> anyhow::Result<serde_json::Value> {
    use serde_json::{Value, json};
    let mut configs = Vec::new();
    for (type_url, dump_type, list, field) in DUMP_TYPES {
        let mut entries = Vec::new();
        for r in set.envoy.get(type_url).into_iter().flat_map(|t| t.iter()) {
            let resource = meshbridge_proto::envoy::to_json(r.body.type_url(), &r.body.value())
                .map_err(|e| anyhow::anyhow!("{} {}: {e}", dump_type, r.name))?;
            let entry = if list == "dynamic_listeners" {
                json!({"name": &*r.name, "active_state": {"version_info": &*r.version, field: resource}})
            } else {
                json!({"version_info": &*r.version, field: resource})
            };
            entries.push(entry);
        }
        let mut config = serde_json::Map::new();
        config.insert("@type".into(), Value::String(format!("type.googleapis.com/envoy.admin.v3.{dump_type}")));
        // Envoy keeps a type-wide version for CDS and LDS only.
        if let Some(t) = set.envoy.get(type_url).filter(|_| field == "cluster" || field == "listener") {
            config.insert("version_info".into(), Value::String(t.version()));
        }
        config.insert(list.into(), Value::Array(entries));
        configs.push(Value::Object(config));
    }
    Ok(json!({ "configs": configs }))
}

#[cfg(test)]
#[path = "translate_cli_tests.rs"]
mod tests;
