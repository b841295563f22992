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

/// How often the free heap is looked at, and how much of it may stay.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
const FREE_HEAP_KEPT: usize = 64 << 20;

/// glibc returns freed memory to the system only from the top of its heap:
/// what a catalog-sized read frees in the middle (Eureka's full read of
/// 100k apps, a snapshot's translation) stays resident, though free, until
/// the process ends. A thread of its own looks every [`TRIM_EVERY`] and,
/// when more than [`FREE_HEAP_KEPT`] of resident memory is free heap, gives
/// the free pages back ([`trim_free_heap`]; BENCHMARKS.md, Eureka at 100k).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn return_free_heap() {
    let spawned = std::thread::Builder::new().name("heap-trim".into()).spawn(|| {
        loop {
            std::thread::sleep(TRIM_EVERY);
            let started = std::time::Instant::now();
            if let Some(free) = trim_free_heap(FREE_HEAP_KEPT) {
                tracing::debug!(target: "meshbridge::heap", free_resident_bytes = free, took = ?started.elapsed(), "free heap returned");
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("meshbridge: free heap will not be returned: {e}");
    }
}

/// When more than `kept` bytes of the process's resident memory are heap
/// that malloc holds free (resident anonymous memory less what malloc has
/// handed out), has `malloc_trim` give every free page back, and returns
/// that many bytes. Once given back they are no longer resident, so the
/// next look trims again only when as much is free and resident again.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim_free_heap(kept: usize) -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut pages = statm.split_whitespace().skip(1).map(|n| n.parse::<usize>().ok());
    let (resident, shared) = (pages.next()??, pages.next()??);
    // SAFETY: sysconf only reads a system constant.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    // SAFETY: mallinfo2 only reads malloc's statistics.
    let info = unsafe { libc::mallinfo2() };
    let idle = resident.saturating_sub(shared).saturating_mul(page).saturating_sub(info.uordblks + info.hblkhd);
    if idle <= kept {
        return None;
    }
    // SAFETY: malloc_trim only releases free pages; any thread may call it
    // at any time.
    unsafe {
        libc::malloc_trim(0);
    }
    Some(idle)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_free_heap() {}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::trim_free_heap;

    fn rss_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    /// Free memory in the middle of the heap (small blocks, most of them
    /// freed, a few kept on every page run) stays resident until trimmed.
    #[test]
    fn free_heap_in_the_middle_is_given_back_above_the_limit_only() {
        let blocks: Vec<Vec<u8>> = (0..400_000).map(|i| vec![i as u8; 500]).collect();
        let kept: Vec<Vec<u8>> = blocks.into_iter().step_by(64).collect();
        assert_eq!(trim_free_heap(usize::MAX), None, "below the limit nothing is trimmed");
        let before = rss_bytes();
        let free = trim_free_heap(64 << 20).expect("about 200 MB were freed");
        let after = rss_bytes();
        assert!(free > 150 << 20, "free {free}");
        assert!(before.saturating_sub(after) > 100 << 20, "RSS {before} -> {after}");
        assert_eq!(trim_free_heap(64 << 20), None, "what was given back is not resident: no second trim");
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
