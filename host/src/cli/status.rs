//! `vvm-host status` and `vvm-host check`: read-only views for operators.

use std::path::PathBuf;
use std::process::ExitCode;

use super::StoreArgs;
use crate::config;
use crate::runtime::RuntimeConfig;
use crate::store;
use crate::vvm::slot_key;

/// Prints who holds each slot, with term and time left. Safe while hosts serve.
pub(super) async fn status(args: &StoreArgs) -> anyhow::Result<ExitCode> {
    let settings = args.settings()?;
    let opened = store::open(&settings, true).await?;
    let store = opened.shared();
    println!(
        "{:<6} {:<48} {:>8} {:>10}",
        "SLOT", "HOLDER", "TERM", "TIME LEFT"
    );
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
    drop(store);
    opened.close().await;
    Ok(ExitCode::SUCCESS)
}

/// Validates every component in `dir` (world, imports) without serving.
pub(super) async fn check(dir: Option<PathBuf>, args: &StoreArgs) -> anyhow::Result<ExitCode> {
    let mut settings = args.settings()?;
    if let Some(dir) = dir {
        settings.cache_dir = config::default_cache_dir(&dir);
        settings.services = dir;
    }
    let config = RuntimeConfig::from_settings(&settings)?;
    let report = tokio::task::spawn_blocking(move || crate::runtime::check(config)).await??;
    for (name, world) in &report.services {
        println!("ok    {name} ({world})");
    }
    for e in &report.errors {
        println!("error {e}");
    }
    println!("{} ok, {} bad", report.services.len(), report.errors.len());
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
