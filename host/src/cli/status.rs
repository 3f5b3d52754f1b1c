//! `vvm-host status` and `vvm-host check`: read-only views for operators.

use std::path::PathBuf;
use std::process::ExitCode;

use super::{Settings, StoreArgs};
use crate::vvm::slot_key;

/// Prints who holds each slot, with term and time left. Safe while hosts serve.
pub(super) async fn status(args: &StoreArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::resolve(args, None)?;
    let store = settings.open_store().await?;
    println!("{:<6} {:<48} {:>8} {:>10}", "SLOT", "HOLDER", "TERM", "TIME LEFT");
    for slot in 1..=settings.cluster_size {
        match store.get(&slot_key(slot)).await? {
            Some(record) => println!(
                "{:<6} {:<48} {:>8} {:>9.1}s",
                slot,
                record.value,
                record.term,
                record.time_left.as_secs_f64()
            ),
            None => println!("{slot:<6} {:<48} {:>8} {:>10}", "(free)", "-", "-"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Validates every component in `dir` (world, imports) without serving.
pub(super) async fn check(dir: Option<PathBuf>, args: &StoreArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::resolve(args, None)?;
    let dir = dir.unwrap_or(settings.services);
    let report = crate::runtime::check_dir(&dir).await?;
    let mut bad = 0;
    for entry in &report {
        match &entry.result {
            Ok(world) => println!("ok    {} ({world})", entry.path.display()),
            Err(e) => {
                bad += 1;
                println!("error {}: {e}", entry.path.display());
            }
        }
    }
    println!("{} ok, {bad} bad", report.len() - bad);
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
