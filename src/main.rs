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
