// No unwrap() outside tests: errors are handled, or expect()ed with a reason.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
use clap::Parser;

fn main() -> anyhow::Result<()> {
    // aws-lc-rs must never be picked implicitly beside ring (DEPENDENCIES.md).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = meshbridge::run::Cli::parse();
    // Offline and synchronous: no runtime, no log lines among the report.
    if let meshbridge::run::Command::Check(check) = &cli.command {
        std::process::exit(meshbridge::check::main(check));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(meshbridge::run::main(cli))
}

