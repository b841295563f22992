//! The state directory (`--state-dir`): each registry's last answered
//! services, kept on disk so that a restart during a registry outage comes
//! back with the last known endpoints instead of an empty view.
//!
//! One file per registry, `registry-{type}-{name}.json`, holding a header
//! (`format`, `version`, the registry's type and name, when it was written)
//! and the services exactly as the cache has them. Services carry hosts,
//! ports, addresses and labels, never the spec, so no credential is ever
//! written.
//!
//! - **Written on change**, rate-limited (at most one pass per interval; a
//!   burst of changes is one write), only for registries that answered
//!   themselves (not one still serving its dump, nor one `--max-stale`
//!   emptied). Each write is a temporary file, `fsync`, then `rename`, so a
//!   crash leaves the old file or the new one, never half of one.
//! - **Loaded at start**, before any watcher runs and before any client is
//!   served, for the registries the config names; the cache marks them
//!   `stale` until they answer. A file for a registry not in the config is
//!   never loaded; a registry removed while running has its file deleted.
//! - **Old or corrupt files** (another format or version, wrong registry,
//!   bad JSON, too large) are reported and ignored, never fatal.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshbridge_registries::{RegistryKind, Service};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::cache::{Cache, RegistryKey};

/// The `format` every file carries.
pub const FORMAT: &str = "meshbridge.io/registry-state";
/// The layout version this build reads and writes.
pub const VERSION: u32 = 1;
/// Files larger than this are not read (100k endpoints are ~20 MB).
const MAX_FILE_BYTES: u64 = 256 << 20;
/// Default rate limit between write passes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// What can go wrong with one file.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Reading, writing, renaming or listing failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file is not JSON of our layout.
    #[error("{path}: not a registry state file: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// Another format or version: written by an older or newer meshbridge.
    #[error("{path}: format {format:?} version {version}, this build reads {FORMAT:?} version {VERSION}")]
    Version { path: PathBuf, format: String, version: u32 },
    /// The header names another registry than the file name does.
    #[error("{path}: holds registry {found}, expected {expected}")]
    WrongRegistry { path: PathBuf, found: String, expected: String },
    /// Larger than [`MAX_FILE_BYTES`].
    #[error("{path}: {size} bytes, more than the {MAX_FILE_BYTES} allowed")]
    TooLarge { path: PathBuf, size: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    format: String,
    version: u32,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateFile {
    format: String,
    version: u32,
    #[serde(rename = "type")]
    kind: String,
    name: String,
    /// Unix seconds.
    written_at: u64,
    services: Vec<Service>,
}

/// The state directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    /// Use (and create if needed) `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<StateDir, DumpError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| DumpError::Io { path: dir.clone(), source })?;
        Ok(StateDir { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `registry-{type}-{name}.json`, with anything but `[A-Za-z0-9._]` in
    /// the name escaped as `-XX`, so that every name maps to one file.
    pub fn path(&self, key: &RegistryKey) -> PathBuf {
        let mut name = String::new();
        for b in key.name.bytes() {
            if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' {
                name.push(b as char);
            } else {
                name.push_str(&format!("-{b:02x}"));
            }
        }
        self.dir.join(format!("registry-{}-{name}.json", key.kind.as_str()))
    }

    /// The services saved for `key`, `Ok(None)` if there is no file.
    pub fn read(&self, key: &RegistryKey) -> Result<Option<Vec<Service>>, DumpError> {
        let path = self.path(key);
        let io = |source| DumpError::Io { path: path.clone(), source };
        let size = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        if size > MAX_FILE_BYTES {
            return Err(DumpError::TooLarge { path, size });
        }
        let bytes = std::fs::read(&path).map_err(io)?;
        let corrupt = |e: serde_json::Error| DumpError::Corrupt { path: path.clone(), reason: e.to_string() };
        // The header first, so that another version is reported as such
        // rather than as whatever field it renamed.
        let header: Header = serde_json::from_slice(&bytes).map_err(corrupt)?;
        if header.format != FORMAT || header.version != VERSION {
            return Err(DumpError::Version { path, format: header.format, version: header.version });
        }
        let file: StateFile = serde_json::from_slice(&bytes).map_err(corrupt)?;
        let found = RegistryKind::parse(&file.kind).map(|k| RegistryKey::new(k, file.name.clone()));
        if found.as_ref() != Some(key) {
            return Err(DumpError::WrongRegistry {
                path,
                found: format!("{}/{}", file.kind, file.name),
                expected: key.to_string(),
            });
        }
        Ok(Some(file.services))
    }

    /// Atomically replace `key`'s file with `services`.
    pub fn write(&self, key: &RegistryKey, services: &[&Service]) -> Result<(), DumpError> {
        let path = self.path(key);
        let tmp = path.with_extension("json.tmp");
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| DumpError::Io { path: p, source }
        };
        let written_at = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Out<'a> {
            format: &'a str,
            version: u32,
            #[serde(rename = "type")]
            kind: &'a str,
            name: &'a str,
            written_at: u64,
            services: &'a [&'a Service],
        }
        let out =
            Out { format: FORMAT, version: VERSION, kind: key.kind.as_str(), name: &key.name, written_at, services };
        let bytes =
            serde_json::to_vec(&out).map_err(|e| DumpError::Corrupt { path: path.clone(), reason: e.to_string() })?;
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(&bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        // Make the rename itself durable.
        if let Ok(d) = std::fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// Delete `key`'s file, if any.
    pub fn remove(&self, key: &RegistryKey) -> Result<(), DumpError> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DumpError::Io { path, source: e }),
            _ => Ok(()),
        }
    }

    /// Load the saved services of each of `keys` into the cache (marked
    /// stale). Every problem is logged and skipped. Returns how many
    /// registries were loaded.
    pub fn load_into(&self, cache: &Cache, keys: &[RegistryKey]) -> usize {
        let mut loaded = 0;
        for key in keys {
            match self.read(key) {
                Ok(Some(services)) => {
                    let endpoints: usize = services.iter().map(|s| s.endpoints.len()).sum();
                    info!(registry = %key, services = services.len(), endpoints, "loaded registry state from the dump; stale until the registry answers");
                    cache.load_dump(key, services);
                    loaded += 1;
                }
                Ok(None) => debug!(registry = %key, "no saved state"),
                Err(error) => warn!(registry = %key, %error, "ignoring saved registry state"),
            }
        }
        loaded
    }
}

/// Writes the cache's registries to the state directory as they change.
pub struct Dumper {
    dir: StateDir,
    cache: Arc<Cache>,
    /// What each registry's file holds now (shared `Arc`s, so comparing
    /// with the cache is mostly pointer checks).
    written: tokio::sync::Mutex<BTreeMap<RegistryKey, BTreeMap<String, Arc<Service>>>>,
}

impl Dumper {
    /// Registries already loaded from the dump count as written: their
    /// files hold exactly that.
    pub fn new(dir: StateDir, cache: Arc<Cache>) -> Arc<Dumper> {
        let written = cache
            .registries()
            .into_iter()
            .filter(|r| r.status.stale)
            .filter_map(|r| Some((r.key.clone(), cache.registry_services(&r.key)?)))
            .collect();
        Arc::new(Dumper { dir, cache, written: tokio::sync::Mutex::new(written) })
    }

    /// Write every registry whose answered state differs from its file, and
    /// delete the files of registries removed since. Returns how many files
    /// were written.
    pub async fn flush(&self) -> usize {
        let mut written = self.written.lock().await;
        let reports = self.cache.registries();
        let present: BTreeSet<RegistryKey> = reports.iter().map(|r| r.key.clone()).collect();
        let mut todo = Vec::new();
        for r in &reports {
            let st = &r.status;
            // The Kubernetes Services are read again from the API server at
            // start (`kube::services`), never loaded from a dump.
            if !st.ready || st.stale || st.withdrawn || r.key.kind == meshbridge_registries::RegistryKind::Kubernetes {
                continue;
            }
            let Some(services) = self.cache.registry_services(&r.key) else { continue };
            let same = written.get(&r.key).is_some_and(|old| {
                old.len() == services.len()
                    && old.iter().zip(services.iter()).all(|(a, b)| a.0 == b.0 && (Arc::ptr_eq(a.1, b.1) || a.1 == b.1))
            });
            if !same {
                todo.push((r.key.clone(), services));
            }
        }
        let gone: Vec<RegistryKey> = written.keys().filter(|k| !present.contains(*k)).cloned().collect();
        if todo.is_empty() && gone.is_empty() {
            return 0;
        }
        let dir = self.dir.clone();
        let job = (todo, gone);
        let done = tokio::task::spawn_blocking(move || {
            let (todo, gone) = job;
            let mut ok = Vec::new();
            for (key, services) in todo {
                let list: Vec<&Service> = services.values().map(|s| &**s).collect();
                match dir.write(&key, &list) {
                    Ok(()) => {
                        debug!(registry = %key, services = list.len(), "saved registry state");
                        ok.push((key, Some(services)));
                    }
                    Err(error) => warn!(registry = %key, %error, "cannot save registry state"),
                }
            }
            for key in gone {
                match dir.remove(&key) {
                    Ok(()) => ok.push((key, None)),
                    Err(error) => warn!(registry = %key, %error, "cannot delete a removed registry's state"),
                }
            }
            ok
        })
        .await
        .unwrap_or_default();
        let mut count = 0;
        for (key, services) in done {
            match services {
                Some(s) => {
                    count += 1;
                    written.insert(key, s);
                }
                None => {
                    written.remove(&key);
                }
            }
        }
        count
    }

    /// Write on every cache change, at most one pass per `interval`.
    pub fn spawn(self: &Arc<Self>, interval: Duration) -> JoinHandle<()> {
        let me = self.clone();
        let mut changes = me.cache.subscribe();
        tokio::spawn(async move {
            // Registries that answered before this task started.
            me.flush().await;
            while changes.changed().await.is_ok() {
                changes.borrow_and_update();
                me.flush().await;
                tokio::time::sleep(interval).await;
            }
        })
    }
}

#[cfg(test)]
#[path = "dump_tests.rs"]
mod tests;
