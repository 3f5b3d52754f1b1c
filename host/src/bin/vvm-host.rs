//! The `vvm-host` binary: a thin `main` over [`vvm_host::cli`].

use std::process::ExitCode;

use clap::Parser;
use vvm_host::cli::{self, Cli};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    cli::init_logging(cli.log_format);
    cli::run(cli).await
}
