// No unwrap() outside tests: errors are handled, or expect()ed with a reason.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
use clap::Parser;

fn main() -> anyhow::Result<()> {
    bound_malloc_arenas();
    // aws-lc-rs must never be picked implicitly beside ring (DEPENDENCIES.md).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = meshbridge::run::Cli::parse();
    // Offline and synchronous: no runtime, no log lines among the report.
    match &cli.command {
        meshbridge::run::Command::Check(check) => std::process::exit(meshbridge::check::main(check)),
        meshbridge::run::Command::Translate(t) => std::process::exit(meshbridge::translate_cli::main(t)),
        meshbridge::run::Command::Run(_) => {}
    }
    return_free_heap();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(meshbridge::run::main(cli))
}

/// glibc gives each thread that allocates under contention an arena of its
/// own, up to 8 per core, and keeps what is freed in each. A registry
/// answer decoded on one blocking thread and dropped on another then stays
/// resident: Eureka's catalog-sized deltas grew RSS from 300 to 780 MiB this
/// way, and with two arenas it stayed under 120 (BENCHMARKS.md, Eureka at
/// 10k). `MALLOC_ARENA_MAX` in the environment still wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn bound_malloc_arenas() {
    const ARENAS: libc::c_int = 2;
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a malloc tunable; called before any
        // other thread exists. It returns 0 on failure, which changes nothing.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn bound_malloc_arenas() {}

/// How often resident memory is looked at, and by how much it may grow
/// before free heap is given back.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
const FREE_HEAP_KEPT: usize = 64 << 20;

/// glibc returns freed memory to the system only from the top of its heap:
/// what a catalog-sized read frees in the middle (Eureka's full read of
/// 100k apps, a snapshot's translation) stays resident, though free, until
/// the process ends. A thread of its own looks every [`TRIM_EVERY`] and,
/// when resident memory has grown by more than [`FREE_HEAP_KEPT`] since
/// the last trim, gives the free pages back ([`Trimmer`]; BENCHMARKS.md,
/// Eureka at 100k).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_free_heap() {
    let spawned = std::thread::Builder::new().name("heap-trim".into()).spawn(|| {
        let mut trimmer = Trimmer::new();
        loop {
            std::thread::sleep(TRIM_EVERY);
            let started = std::time::Instant::now();
            if let Some((before, after)) = trimmer.step(FREE_HEAP_KEPT) {
                tracing::debug!(target: "meshbridge::heap", before, after, took = ?started.elapsed(), "free heap returned");
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("meshbridge: free heap will not be returned: {e}");
    }
}

/// Trims when resident memory passes its low point since the last trim by
/// more than a limit. Only `/proc/self/statm` is read between trims:
/// malloc's own statistics (`mallinfo2`) walk every free chunk under the
/// arena's lock, 0.2 s at 100k services.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
struct Trimmer {
    /// Resident anonymous bytes after the last trim, or lower since.
    low: usize,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl Trimmer {
    fn new() -> Trimmer {
        Trimmer { low: anon_resident().unwrap_or(0) }
    }

    /// Resident memory before and after a trim, when one was made.
    #[allow(unsafe_code)]
    fn step(&mut self, kept: usize) -> Option<(usize, usize)> {
        let before = anon_resident()?;
        if before.saturating_sub(self.low) <= kept {
            self.low = self.low.min(before);
            return None;
        }
        // SAFETY: malloc_trim only releases free pages; any thread may call
        // it at any time.
        unsafe {
            libc::malloc_trim(0);
        }
        let after = anon_resident()?;
        self.low = after;
        Some((before, after))
    }
}

/// Resident memory less file-backed pages: the heap, stacks and the like.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn anon_resident() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut pages = statm.split_whitespace().skip(1).map(|n| n.parse::<usize>().ok());
    let (resident, shared) = (pages.next()??, pages.next()??);
    // SAFETY: sysconf only reads a system constant.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    Some(resident.saturating_sub(shared).saturating_mul(page))
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_free_heap() {}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::{Trimmer, anon_resident};

    /// Free memory in the middle of the heap (small blocks, most of them
    /// freed, a few kept on every page run) stays resident until trimmed.
    #[test]
    fn free_heap_in_the_middle_is_given_back_once_resident_memory_grew_past_the_limit() {
        let mut trimmer = Trimmer::new();
        let blocks: Vec<Vec<u8>> = (0..400_000).map(|i| vec![i as u8; 500]).collect();
        let kept: Vec<Vec<u8>> = blocks.into_iter().step_by(64).collect();
        let mut later = Trimmer::new();
        assert_eq!(later.step(64 << 20), None, "no growth since its low point: nothing is trimmed");
        let (before, after) = trimmer.step(64 << 20).expect("resident memory grew by about 200 MB");
        assert!(before.saturating_sub(after) > 100 << 20, "RSS {before} -> {after}");
        assert!(anon_resident().unwrap() < before - (100 << 20));
        assert_eq!(trimmer.step(64 << 20), None, "what was given back is not resident: no second trim");
        assert_eq!(kept.len(), 6250);
    }

    /// The sizing page states the period and the limit the code uses.
    #[test]
    fn the_sizing_page_states_when_free_heap_is_given_back() {
        let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src/sizing.md")).unwrap();
        let stated =
            format!("every {} s, when more than {} MiB", super::TRIM_EVERY.as_secs(), super::FREE_HEAP_KEPT >> 20);
        assert!(page.replace("\n  ", " ").contains(&stated), "docs/src/sizing.md does not say {stated:?}");
    }
}
