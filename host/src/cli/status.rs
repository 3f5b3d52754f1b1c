//! `vvm-host status` and `vvm-host check`: read-only views for operators.

use std::path::PathBuf;
use std::process::ExitCode;

use super::StoreArgs;
use crate::config;
use crate::lease_value;
use crate::runtime::RuntimeConfig;
use crate::store;
use crate::vvm::slot_key;

/// Prints who holds each slot, with term and time left, and the services running there and
/// since when: a table, or with `json` one JSON object (`{"slots": [{"slot", "holder",
/// "term", "time_left_ms", "services": [{"name", "version", "since"}]}]}`, `since` in Unix
/// seconds, `null`s for a free slot). The services are those the leader wrote with its last
/// renewal ([`crate::lease_value`]). Safe while hosts serve.
pub(super) async fn status(args: &StoreArgs, json: bool) -> anyhow::Result<ExitCode> {
    let settings = args.settings()?;
    let opened = store::open(&settings, true).await?;
    let store = opened.shared();
    let mut slots = Vec::new();
    for slot in 1..=settings.cluster_size {
        slots.push((slot, store.get(&slot_key(slot)).await?));
    }
    drop(store);
    opened.close().await;
    if json {
        let slots: Vec<_> = slots
            .iter()
            .map(|(slot, record)| match record {
                Some(r) => serde_json::json!({
                    "slot": slot,
                    "holder": lease_value::holder(&r.value),
                    "term": r.term,
                    "time_left_ms": u64::try_from(r.time_left.as_millis()).unwrap_or(u64::MAX),
                    "services": lease_value::services(&r.value)
                        .iter()
                        .map(|s| serde_json::json!({
                            "name": s.name, "version": s.version, "since": s.since,
                        }))
                        .collect::<Vec<_>>(),
                }),
                None => serde_json::json!({
                    "slot": slot, "holder": null, "term": null, "time_left_ms": null,
                    "services": null,
                }),
            })
            .collect();
        println!("{}", serde_json::json!({ "slots": slots }));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<6} {:<48} {:>8} {:>10}",
        "SLOT", "HOLDER", "TERM", "TIME LEFT"
    );
    for (slot, record) in slots {
        match record {
            Some(record) => {
                println!(
                    "{:<6} {:<48} {:>8} {:>9.1}s",
                    slot,
                    lease_value::holder(&record.value),
                    record.term,
                    record.time_left.as_secs_f64()
                );
                for s in lease_value::services(&record.value) {
                    let since = std::time::UNIX_EPOCH + std::time::Duration::from_secs(s.since);
                    println!(
                        "{:<6}   service {} {} since {}",
                        "",
                        s.name,
                        s.version,
                        humantime::format_rfc3339_seconds(since)
                    );
                }
            }
            None => println!("{slot:<6} {:<48} {:>8} {:>10}", "(free)", "-", "-"),
        }
    }
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
