//! `vvm-host status` and `vvm-host check`: read-only views for operators.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::StoreArgs;
use crate::config;
use crate::lease_value;
use crate::placement::Placement;
use crate::placement::spread::{MEMBER_PREFIX, SERVICE_PREFIX};
use crate::runtime::RuntimeConfig;
use crate::store::{self, Record};
use crate::vvm::slot_key;

/// Prints who holds each slot, with term and time left, and the services running there and
/// since when: a table, or with `json` one JSON object (`{"slots": [{"slot", "holder",
/// "term", "time_left_ms", "services": [{"name", "version", "since"}]}]}`, `since` in Unix
/// seconds, `null`s for a free slot). The services are those the leader wrote with its last
/// renewal ([`crate::lease_value`]). Under spread placement (or whenever there are any), the
/// members and each service's claim instead (JSON: `"members": [{"holder", "time_left_ms"}]`,
/// `"claims": [{"service", "holder", "term", "time_left_ms"}]`, always present). Safe while
/// hosts serve.
pub(super) async fn status(args: &StoreArgs, json: bool) -> anyhow::Result<ExitCode> {
    let settings = args.settings()?;
    let opened = store::open(&settings, true).await?;
    let store = opened.shared();
    let mut slots = Vec::new();
    for slot in 1..=settings.cluster_size {
        slots.push((slot, store.get(&slot_key(slot)).await?));
    }
    let members = store.list(MEMBER_PREFIX).await?;
    let claims = store.list(SERVICE_PREFIX).await?;
    drop(store);
    opened.close().await;
    let mut out = Vec::new();
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
        let members: Vec<_> = members
            .iter()
            .map(|(_, r)| serde_json::json!({ "holder": r.value, "time_left_ms": ms(r) }))
            .collect();
        let claims: Vec<_> = claims
            .iter()
            .map(|(key, r)| {
                serde_json::json!({
                    "service": key.strip_prefix(SERVICE_PREFIX).unwrap_or(key),
                    "holder": r.value, "term": r.term, "time_left_ms": ms(r),
                })
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::json!({ "slots": slots, "members": members, "claims": claims })
        )?;
        emit(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if settings.placement == Placement::Spread || !members.is_empty() || !claims.is_empty() {
        print_spread(&mut out, &members, &claims)?;
        emit(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:<6} {:<48} {:>8} {:>10}",
        "SLOT", "HOLDER", "TERM", "TIME LEFT"
    )?;
    for (slot, record) in slots {
        match record {
            Some(record) => {
                writeln!(
                    out,
                    "{:<6} {:<48} {:>8} {:>9.1}s",
                    slot,
                    lease_value::holder(&record.value),
                    record.term,
                    record.time_left.as_secs_f64()
                )?;
                for s in lease_value::services(&record.value) {
                    let since = std::time::UNIX_EPOCH + std::time::Duration::from_secs(s.since);
                    writeln!(
                        out,
                        "{:<6}   service {} {} since {}",
                        "",
                        s.name,
                        s.version,
                        humantime::format_rfc3339_seconds(since)
                    )?;
                }
            }
            None => {
                writeln!(out, "{slot:<6} {:<48} {:>8} {:>10}", "(free)", "-", "-")?;
            }
        }
    }
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// Time left of a record in milliseconds, for JSON.
fn ms(record: &Record) -> u64 {
    u64::try_from(record.time_left.as_millis()).unwrap_or(u64::MAX)
}

/// Spread placement's view: the live members, and which host runs each service.
fn print_spread(
    out: &mut impl Write,
    members: &[(String, Record)],
    claims: &[(String, Record)],
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<48} {:>10} {:>9}",
        "MEMBER", "SERVICES", "TIME LEFT"
    )?;
    for (_, m) in members {
        let held = claims.iter().filter(|(_, c)| c.value == m.value).count();
        writeln!(
            out,
            "{:<48} {:>10} {:>8.1}s",
            m.value,
            held,
            m.time_left.as_secs_f64()
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<24} {:<48} {:>8} {:>10}",
        "SERVICE", "HOLDER", "TERM", "TIME LEFT"
    )?;
    for (key, c) in claims {
        writeln!(
            out,
            "{:<24} {:<48} {:>8} {:>9.1}s",
            key.strip_prefix(SERVICE_PREFIX).unwrap_or(key),
            c.value,
            c.term,
            c.time_left.as_secs_f64()
        )?;
    }
    Ok(())
}

/// Writes `text` to stdout. A reader that went away (`vvm-host status | head -1`) is not an
/// error: it has what it wanted.
fn emit(text: &[u8]) -> std::io::Result<()> {
    match std::io::stdout().lock().write_all(text) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written,
    }
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
    let mut out = Vec::new();
    for (name, world) in &report.services {
        writeln!(out, "ok    {name} ({world})")?;
    }
    for e in &report.errors {
        writeln!(out, "error {e}")?;
    }
    writeln!(
        out,
        "{} ok, {} bad",
        report.services.len(),
        report.errors.len()
    )?;
    emit(&out)?;
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
