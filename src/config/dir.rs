//! A directory of YAML files as a config source: loaded once, then watched.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::{EventKind, RecursiveMode, Watcher, event::AccessKind, event::AccessMode};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument, info, info_span, warn};

use super::build::Builder;
use super::state::ConfigState;
use super::types::{ConfigError, Desired};

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
        Self::start_limited(dir, rescan, builder, MAX_FILE_BYTES).await
    }

    pub(crate) async fn start_limited(
        dir: PathBuf,
        rescan: Duration,
        builder: Builder,
        max_bytes: u64,
    ) -> Result<(DirSource, watch::Receiver<Arc<Desired>>), ConfigError> {
        let mut scanner = Scanner::new(dir.clone(), max_bytes, ConfigState::with_builder(builder));
        let (scanner, desired) = tokio::task::spawn_blocking(move || {
            let files = scanner.scan()?;
            apply(&mut scanner.state, files);
            let desired = scanner.state.desired();
            Ok::<_, ConfigError>((scanner, desired))
        })
        .await
        .map_err(|e| ConfigError::Io { path: dir.clone(), source: Arc::new(std::io::Error::other(e.to_string())) })??;
        let mut logged = Logged::default();
        logged.log(&dir, &desired);
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
        let task = tokio::spawn(run(dir.clone(), scanner, tx, event_rx, watcher, rescan, logged).instrument(span));
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
    mut state: Scanner,
    tx: watch::Sender<Arc<Desired>>,
    mut events: mpsc::Receiver<()>,
    // Held so the watch lives as long as the task.
    _watcher: Option<notify::RecommendedWatcher>,
    rescan: Duration,
    mut logged: Logged,
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
        let desired;
        (state, desired) = match tokio::task::spawn_blocking(move || {
            let desired = state.step();
            (state, desired)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => {
                // Only a bug panics in there; the last published config stays.
                warn!(error = %e, "config re-scan failed, stopping the watch");
                return;
            }
        };
        let Some(desired) = desired else { continue };
        if **tx.borrow() != desired {
            logged.log(&dir, &desired);
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

/// The most bytes read from one config file (4 MiB). A bigger file is not
/// read: it keeps its last good config and an error names it. Higress-style
/// YAML for thousands of registries fits many times over.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// What a scan found of one file.
#[derive(Debug)]
pub(crate) enum FileRead {
    /// Same modification time and size as the last good read: not re-read.
    Unchanged,
    Text(String),
    /// Listed but unreadable (a dangling symlink, EACCES, too big, not UTF-8).
    Error(ConfigError),
}

/// The file-reading half of a [`DirSource`]: the directory, the size and
/// modification time of each file last read, and the [`ConfigState`] the
/// texts go to. Blocking I/O and parsing: [`DirSource`] runs it on the
/// blocking pool, never on an async worker (a 50 MB file once cost seconds
/// of CPU there).
#[derive(Debug)]
pub(crate) struct Scanner {
    dir: PathBuf,
    max_bytes: u64,
    /// Path → (modified, len) of the last successful read.
    seen: HashMap<PathBuf, (Option<SystemTime>, u64)>,
    pub(crate) state: ConfigState,
}

impl Scanner {
    pub(crate) fn new(dir: PathBuf, max_bytes: u64, state: ConfigState) -> Scanner {
        Scanner { dir, max_bytes, seen: HashMap::new(), state }
    }

    /// Read what changed and return the new [`Desired`] if anything did.
    pub(crate) fn step(&mut self) -> Option<Desired> {
        let changed = match self.scan() {
            Ok(files) => {
                let source = self.state.set_source_error(None);
                apply(&mut self.state, files) | source
            }
            Err(e) => {
                warn!(dir = %self.dir.display(), error = %e, "cannot read config directory, keeping last good config");
                self.state.set_source_error(Some(e))
            }
        };
        changed.then(|| self.state.desired())
    }

    /// Every config file in the directory, in name order, read unless unchanged.
    pub(crate) fn scan(&mut self) -> Result<Vec<(String, FileRead)>, ConfigError> {
        let io_err = |source| ConfigError::Io { path: self.dir.clone(), source: Arc::new(source) };
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
            // Hidden files are editor swap files, Kubernetes volume internals
            // (`..data`) and the like.
            if yaml && !name.starts_with('.') {
                paths.push(entry.path());
            }
        }
        paths.sort();
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            // `metadata` follows symlinks, as a ConfigMap volume needs.
            let read = match std::fs::metadata(&path) {
                Ok(m) if !m.is_file() => continue,
                Ok(m) => self.read(&path, &m),
                // Gone since read_dir: a removal, not an error.
                Err(_) if std::fs::symlink_metadata(&path).is_err() => continue,
                // Listed but unreadable: a dangling symlink, or no permission
                // on the way to the target. Not a removal: its last good
                // config stays.
                Err(e) => FileRead::Error(ConfigError::Io { path: path.clone(), source: Arc::new(e) }),
            };
            if matches!(read, FileRead::Error(_)) {
                // Re-read once it is readable again, whatever its stamp.
                self.seen.remove(&path);
            }
            files.push((path.display().to_string(), read));
        }
        let listed: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        self.seen.retain(|p, _| listed.contains(&p.display().to_string().as_str()));
        Ok(files)
    }

    fn read(&mut self, path: &Path, meta: &std::fs::Metadata) -> FileRead {
        let stamp = (meta.modified().ok(), meta.len());
        if self.seen.get(path) == Some(&stamp) {
            return FileRead::Unchanged;
        }
        if meta.len() > self.max_bytes {
            return FileRead::Error(ConfigError::TooLarge {
                path: path.to_owned(),
                size: meta.len(),
                max: self.max_bytes,
            });
        }
        let read = std::fs::File::open(path).map(|f| read_text(path, f, meta.len(), self.max_bytes));
        match read {
            Ok(Ok(text)) => {
                self.seen.insert(path.to_owned(), stamp);
                FileRead::Text(text)
            }
            Ok(Err(e)) => FileRead::Error(e),
            Err(e) => FileRead::Error(ConfigError::Io { path: path.to_owned(), source: Arc::new(e) }),
        }
    }
}

/// Read config text from `r` (`path` names it in errors): at most `max`
/// bytes, however much more there is, and valid UTF-8. `size_hint` (a
/// file's length at stat) sizes the buffer.
pub(crate) fn read_text(path: &Path, r: impl Read, size_hint: u64, max: u64) -> Result<String, ConfigError> {
    let io = |e| ConfigError::Io { path: path.to_owned(), source: Arc::new(e) };
    // The file may grow between stat and read: never read past the cap.
    let mut bytes = Vec::with_capacity(usize::try_from(size_hint.min(max)).unwrap_or(0));
    r.take(max + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(ConfigError::TooLarge { path: path.to_owned(), size: bytes.len() as u64, max });
    }
    String::from_utf8(bytes).map_err(|_| io(std::io::Error::new(std::io::ErrorKind::InvalidData, "not valid UTF-8")))
}

/// Read a directory once, as [`DirSource`] reads it at start, into a
/// [`ConfigState`] (`meshbridge check`). Errors only if the directory
/// cannot be listed; a bad file is in the state's errors.
pub fn load_once(dir: &Path) -> Result<ConfigState, ConfigError> {
    let mut scanner = Scanner::new(dir.to_owned(), MAX_FILE_BYTES, ConfigState::new());
    let files = scanner.scan()?;
    apply(&mut scanner.state, files);
    Ok(scanner.state)
}

/// Make `state` match a fresh scan. Returns whether anything changed.
fn apply(state: &mut ConfigState, files: Vec<(String, FileRead)>) -> bool {
    let gone: Vec<String> =
        state.files().filter(|known| !files.iter().any(|(name, _)| name == known)).map(str::to_owned).collect();
    let mut changed = false;
    for name in gone {
        info!(file = %name, "config file removed");
        changed |= state.remove_file(&name);
    }
    for (name, read) in files {
        changed |= match read {
            FileRead::Unchanged => false,
            FileRead::Text(text) => state.set_file(&name, text),
            FileRead::Error(e) => state.set_file_error(&name, e),
        };
    }
    changed
}

/// The config problems already logged: each is logged at WARN once, when it
/// appears, not again on every later edit of the directory.
#[derive(Debug, Default)]
pub(crate) struct Logged(BTreeSet<String>);

impl Logged {
    fn log(&mut self, dir: &Path, desired: &Desired) {
        info!(
            dir = %dir.display(),
            registries = desired.registries.len(),
            proxies = desired.proxies.len(),
            ingresses = desired.ingresses.len(),
            errors = desired.errors.len(),
            "config loaded"
        );
        for error in self.fresh(&desired.errors) {
            warn!(error = %error, "config problem");
        }
    }

    /// The errors not logged before; forgets those that are gone, so one
    /// that comes back is logged again.
    pub(crate) fn fresh<'a>(&mut self, errors: &'a [String]) -> Vec<&'a String> {
        self.0.retain(|e| errors.contains(e));
        errors.iter().filter(|e| self.0.insert((*e).clone())).collect()
    }
}

#[cfg(test)]
#[path = "dir_tests.rs"]
mod tests;
