//! A directory of YAML files as a config source: loaded once, then watched.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher, event::AccessKind, event::AccessMode};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, debug, info, info_span, warn};

use super::state::ConfigState;
use super::{Builder, ConfigError, Desired};

/// Wait this long after a change for the rest of a burst (editors write,
/// rename and chmod in quick succession).
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Never wait longer than this to apply a change, however busy the directory.
const MAX_DEBOUNCE: Duration = Duration::from_secs(2);
/// Re-scan this often regardless: inotify can miss renames (ConfigMap volume
/// updates swap a symlink) and watches can fail altogether.
const RESCAN: Duration = Duration::from_secs(5);

/// Watches a directory of `*.yaml` / `*.yml` files (non-recursive, hidden
/// files skipped, read in name order) and publishes a new [`Desired`] on
/// every effective change. Dropping it stops the watch.
pub struct DirSource {
    dir: PathBuf,
    task: JoinHandle<()>,
}

impl DirSource {
    /// Load `dir` once, then watch it. Errors only if the directory cannot be
    /// read at start; later problems (bad files, the directory vanishing) are
    /// reported in [`Desired::errors`] and the last good config stays.
    pub async fn start(dir: PathBuf) -> Result<(DirSource, watch::Receiver<Arc<Desired>>), ConfigError> {
        Self::start_with(dir, RESCAN, Builder::default()).await
    }

    /// As [`DirSource::start`], building with `builder`.
    pub async fn start_with_builder(
        dir: PathBuf,
        builder: Builder,
    ) -> Result<(DirSource, watch::Receiver<Arc<Desired>>), ConfigError> {
        Self::start_with(dir, RESCAN, builder).await
    }

    pub(crate) async fn start_with(
        dir: PathBuf,
        rescan: Duration,
        builder: Builder,
    ) -> Result<(DirSource, watch::Receiver<Arc<Desired>>), ConfigError> {
        let mut state = ConfigState::with_builder(builder);
        let files = scan(&dir).await?;
        apply(&mut state, files);
        let desired = state.desired();
        log_desired(&dir, &desired);
        let (tx, rx) = watch::channel(Arc::new(desired));

        // The notify callback runs on notify's own thread; a full channel
        // already means "rescan pending", so dropping the send is fine.
        let (event_tx, event_rx) = mpsc::channel(1);
        let watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) if is_change(&ev.kind) => {
                let _ = event_tx.try_send(());
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "config directory watch error"),
        })
        .and_then(|mut w| w.watch(&dir, RecursiveMode::NonRecursive).map(|()| w));
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(dir = %dir.display(), error = %e, ?rescan, "cannot watch config directory, re-scanning periodically only");
                None
            }
        };

        let span = info_span!("config_dir", dir = %dir.display());
        let task = tokio::spawn(run(dir.clone(), state, tx, event_rx, watcher, rescan).instrument(span));
        Ok((DirSource { dir, task }, rx))
    }

    /// The directory being watched.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for DirSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(
    dir: PathBuf,
    mut state: ConfigState,
    tx: watch::Sender<Arc<Desired>>,
    mut events: mpsc::Receiver<()>,
    // Held so the watch lives as long as the task.
    _watcher: Option<notify::RecommendedWatcher>,
    rescan: Duration,
) {
    let mut tick = tokio::time::interval(rescan);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut events_open = true;
    loop {
        tokio::select! {
            () = tx.closed() => return,
            ev = events.recv(), if events_open => {
                if ev.is_none() {
                    events_open = false;
                    continue;
                }
                debounce(&mut events).await;
            }
            _ = tick.tick() => {}
        }
        let changed = match scan(&dir).await {
            Ok(files) => {
                let source = state.set_source_error(None);
                apply(&mut state, files) | source
            }
            Err(e) => {
                warn!(error = %e, "cannot read config directory, keeping last good config");
                state.set_source_error(Some(e))
            }
        };
        if !changed {
            continue;
        }
        let desired = state.desired();
        if **tx.borrow() != desired {
            log_desired(&dir, &desired);
            tx.send_replace(Arc::new(desired));
        }
    }
}

/// Wait until the directory has been quiet for [`DEBOUNCE`].
async fn debounce(events: &mut mpsc::Receiver<()>) {
    let deadline = tokio::time::Instant::now() + MAX_DEBOUNCE;
    loop {
        let quiet = tokio::time::sleep(DEBOUNCE);
        tokio::select! {
            () = quiet => return,
            () = tokio::time::sleep_until(deadline) => return,
            ev = events.recv() => if ev.is_none() { return },
        }
    }
}

/// Our own reads show up as access events; only mutations matter.
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// A file's name and its text, or why it could not be read.
type Scanned = Vec<(String, Result<String, ConfigError>)>;

/// Read every config file in `dir`.
async fn scan(dir: &Path) -> Result<Scanned, ConfigError> {
    let io_err = |source| ConfigError::Io { path: dir.to_owned(), source: Arc::new(source) };
    let mut entries = tokio::fs::read_dir(dir).await.map_err(io_err)?;
    let mut paths = Vec::new();
    while let Some(entry) = entries.next_entry().await.map_err(io_err)? {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        // Hidden files are editor swap files, Kubernetes volume internals
        // (`..data`) and the like. `metadata` follows symlinks, as a
        // ConfigMap volume needs.
        if !yaml || name.starts_with('.') {
            continue;
        }
        match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_file() => paths.push(path),
            Ok(_) => {}
            // A dangling symlink or a file removed since read_dir.
            Err(e) => debug!(path = %path.display(), error = %e, "skipping unreadable entry"),
        }
    }
    paths.sort();
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let text = tokio::fs::read_to_string(&path)
            .await
            .map_err(|e| ConfigError::Io { path: path.clone(), source: Arc::new(e) });
        files.push((path.display().to_string(), text));
    }
    Ok(files)
}

/// Make `state` match a fresh scan. Returns whether anything changed.
fn apply(state: &mut ConfigState, files: Scanned) -> bool {
    let gone: Vec<String> =
        state.files().filter(|known| !files.iter().any(|(name, _)| name == known)).map(str::to_owned).collect();
    let mut changed = false;
    for name in gone {
        debug!(file = %name, "config file removed");
        changed |= state.remove_file(&name);
    }
    for (name, text) in files {
        changed |= match text {
            Ok(text) => state.set_file(&name, text),
            Err(e) => state.set_file_error(&name, e),
        };
    }
    changed
}

fn log_desired(dir: &Path, desired: &Desired) {
    info!(
        dir = %dir.display(),
        registries = desired.registries.len(),
        proxies = desired.proxies.len(),
        ingresses = desired.ingresses.len(),
        errors = desired.errors.len(),
        "config loaded"
    );
    for error in &desired.errors {
        warn!(error = %error, "config problem");
    }
}
