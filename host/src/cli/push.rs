//! `vvm-host push FILE.wasm REF` (SPEC §13): pushes a component in the CNCF Wasm layout and
//! prints the reference pinned to its digest, the line to put in `[service.NAME] source`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use super::StoreArgs;
use crate::sources::SourceRef;

/// Pushes `file` to `reference` and prints the pinned reference on stdout.
pub(super) async fn push(
    file: &Path,
    reference: &str,
    args: &StoreArgs,
) -> anyhow::Result<ExitCode> {
    let target: SourceRef = reference
        .parse()
        .with_context(|| format!("reference {reference:?}"))?;
    let options = args.settings()?.registry;
    let file = file.to_owned();
    // The push blocks on a runtime of its own: off the async workers.
    let pinned =
        tokio::task::spawn_blocking(move || crate::sources::push(&file, &target, &options))
            .await??;
    println!("{pinned}");
    Ok(ExitCode::SUCCESS)
}
