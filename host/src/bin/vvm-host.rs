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
    // On a worker, not on this thread's `block_on`: a task woken from here waited up to a
    // millisecond for a worker in about half the takeovers measured (the shutdown's cancel to
    // the services at SIGTERM; see BENCHMARKS.md), and from a worker it is at once.
    match tokio::spawn(cli::run(cli)).await {
        Ok(code) => code,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => ExitCode::FAILURE,
    }
}
