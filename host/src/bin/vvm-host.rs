//! The `vvm-host` binary: a thin `main` over [`vvm_host::cli`].

use std::process::ExitCode;

use clap::Parser;
use vvm_host::cli::{self, Cli};

/// Exit code for a command line clap rejects (as clap's own).
const EXIT_USAGE: u8 = 2;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // A bad flag or value is one clear line; help and version print as clap formats them.
        Err(e) if e.use_stderr() => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            eprintln!("vvm-host: {first}");
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => e.exit(),
    };
    cli::init_logging(&cli);
    cli::run(cli).await
}
