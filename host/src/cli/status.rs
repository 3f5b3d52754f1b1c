//! `vvm-host status` and `vvm-host check`: read-only views for operators.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::StoreArgs;
use crate::config::{self, Placement};
use crate::keys::{HAND_OVER_PREFIX, MEMBER_PREFIX, SERVICE_PREFIX, slot_key};
use crate::lease_value::{self, ServiceState, ServiceStatus};
use crate::runtime::RuntimeConfig;
use crate::store::{self, Record};

/// Prints who holds each slot, with term and time left, and the services there: since when,
/// their state (running, backing off until when, stopped), restarts and last reason. A table,
/// or with `json` one JSON object (`{"slots": [{"slot", "holder", "term", "time_left_ms",
/// "services": [{"name", "version", "since", "state", "restarts", "reason",
/// "backing_off_until", "schedule", "reuse"}]}]}`, `since` in Unix seconds,
/// `backing_off_until` in Unix milliseconds or `null`, `null`s for a free slot; `schedule`,
/// for a scheduled service, `{"schedule", "timezone", "last": {"fire", "outcome", "error",
/// "duration_ms", "term"}, "next"}` with fire times in Unix seconds, else `null`; `reuse`,
/// for an HTTP service, `{"max_requests", "max_concurrent", "idle_ms"}`, else `null`). The services are those the leader wrote
/// with its last renewal ([`crate::lease_value`]). Under spread placement (or whenever there
/// are any), the members and each service's claim instead (JSON: `"members": [{"holder",
/// "time_left_ms"}]`, `"claims": [{"service", "holder", "term", "time_left_ms"}]`, always
/// present). Services handed over after a failure within the last hour are listed too (JSON:
/// `"hand_overs": [{"service", "record", "time_left_ms"}]`, the record as the host wrote it).
/// Safe while hosts serve.
pub(super) async fn status(args: &StoreArgs, json: bool) -> anyhow::Result<ExitCode> {
    let settings = args.settings()?;
    let opened = store::open(&settings.store_settings(), true).await?;
    let store = opened.shared();
    // Every record in one read: one committed state of the store, so that what is shown
    // never mixes two (a slot before a handover, a claim after it).
    let records = store.list("").await;
    drop(store);
    opened.close().await;
    let seen = Seen::of(&records?, settings.cluster_size);
    let mut out = Vec::new();
    if json {
        writeln!(out, "{}", seen.json())?;
    } else if settings.placement == Placement::Spread
        || !seen.members.is_empty()
        || !seen.claims.is_empty()
    {
        print_spread(&mut out, &seen.members, &seen.claims)?;
        print_hand_overs(&mut out, &seen.hand_overs)?;
    } else {
        print_slots(&mut out, &seen.slots)?;
        print_hand_overs(&mut out, &seen.hand_overs)?;
    }
    emit(&out)?;
    Ok(ExitCode::SUCCESS)
}

/// What `status` read from the store.
struct Seen {
    slots: Vec<(u32, Option<Record>)>,
    members: Vec<(String, Record)>,
    claims: Vec<(String, Record)>,
    hand_overs: Vec<(String, Record)>,
}

impl Seen {
    /// The slots `1..=cluster_size`, members, claims and handovers among `records` (every
    /// live record of the store, sorted by key).
    fn of(records: &[(String, Record)], cluster_size: u32) -> Self {
        let under = |prefix: &str| -> Vec<(String, Record)> {
            records
                .iter()
                .filter(|(key, _)| key.starts_with(prefix))
                .cloned()
                .collect()
        };
        let slots = (1..=cluster_size)
            .map(|slot| {
                let key = slot_key(slot);
                let record = records
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, r)| r.clone());
                (slot, record)
            })
            .collect();
        Self {
            slots,
            members: under(MEMBER_PREFIX),
            claims: under(SERVICE_PREFIX),
            hand_overs: under(HAND_OVER_PREFIX),
        }
    }

    /// The JSON object [`status`] documents.
    fn json(&self) -> serde_json::Value {
        let slots: Vec<_> = self
            .slots
            .iter()
            .map(|(slot, record)| match record {
                Some(r) => serde_json::json!({
                    "slot": slot,
                    "holder": lease_value::holder(&r.value),
                    "term": r.term,
                    "time_left_ms": ms(r),
                    "services": lease_value::services(&r.value)
                        .iter()
                        .map(service_json)
                        .collect::<Vec<_>>(),
                }),
                None => serde_json::json!({
                    "slot": slot, "holder": null, "term": null, "time_left_ms": null,
                    "services": null,
                }),
            })
            .collect();
        let members: Vec<_> = self
            .members
            .iter()
            .map(|(_, r)| serde_json::json!({ "holder": r.value, "time_left_ms": ms(r) }))
            .collect();
        let claims: Vec<_> = self
            .claims
            .iter()
            .map(|(key, r)| {
                serde_json::json!({
                    "service": key.strip_prefix(SERVICE_PREFIX).unwrap_or(key),
                    "holder": r.value, "term": r.term, "time_left_ms": ms(r),
                })
            })
            .collect();
        let hand_overs: Vec<_> = self
            .hand_overs
            .iter()
            .map(|(key, r)| {
                serde_json::json!({
                    "service": key.strip_prefix(HAND_OVER_PREFIX).unwrap_or(key),
                    "record": serde_json::from_str::<serde_json::Value>(&r.value)
                        .unwrap_or_else(|_| r.value.clone().into()),
                    "time_left_ms": ms(r),
                })
            })
            .collect();
        serde_json::json!({
            "slots": slots, "members": members, "claims": claims, "hand_overs": hand_overs,
        })
    }
}

/// Together placement's view: each slot's holder, term and time left, and its services.
fn print_slots(out: &mut impl Write, slots: &[(u32, Option<Record>)]) -> std::io::Result<()> {
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
                    print_service(out, &s)?;
                }
            }
            None => {
                writeln!(out, "{slot:<6} {:<48} {:>8} {:>10}", "(free)", "-", "-")?;
            }
        }
    }
    Ok(())
}

/// One service under a slot, as JSON.
fn service_json(s: &ServiceStatus) -> serde_json::Value {
    let until = match s.state {
        ServiceState::BackingOff { until_ms } => Some(until_ms),
        _ => None,
    };
    serde_json::json!({
        "name": s.name, "version": s.version, "since": s.since,
        "state": s.state.name(), "restarts": s.restarts, "reason": s.reason,
        "backing_off_until": until, "schedule": s.schedule, "reuse": s.reuse,
    })
}

/// One service under a slot, as a line of the table (and a second with its last reason).
fn print_service(out: &mut impl Write, s: &ServiceStatus) -> std::io::Result<()> {
    let at = |since: std::time::SystemTime| humantime::format_rfc3339_seconds(since);
    let since = std::time::UNIX_EPOCH + std::time::Duration::from_secs(s.since);
    let state = match s.state {
        ServiceState::BackingOff { until_ms } => {
            let until = std::time::UNIX_EPOCH + std::time::Duration::from_millis(until_ms);
            format!("backing off until {}", at(until))
        }
        state => state.name().to_owned(),
    };
    writeln!(
        out,
        "{:<6}   service {} {} since {}: {state}, {} restarts",
        "",
        s.name,
        s.version,
        at(since),
        s.restarts
    )?;
    if let Some(reason) = &s.reason {
        let reason = crate::log_output::escaped(reason);
        writeln!(out, "{:<6}     last: {reason}", "")?;
    }
    if let Some(schedule) = &s.schedule {
        print_schedule(out, schedule)?;
    }
    if let Some(reuse) = &s.reuse {
        writeln!(
            out,
            "{:<6}     instances: {} requests each, {} at once, idle {} ms",
            "", reuse.max_requests, reuse.max_concurrent, reuse.idle_ms
        )?;
    }
    Ok(())
}

/// A scheduled service's schedule, last fire time and next, as lines of the table.
fn print_schedule(
    out: &mut impl Write,
    s: &crate::lease_value::ScheduleStatus,
) -> std::io::Result<()> {
    let at = |unix: i64| {
        let t = std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(u64::try_from(unix).unwrap_or(0));
        humantime::format_rfc3339_seconds(t).to_string()
    };
    let escaped = |text: &str| crate::log_output::escaped(text).into_owned();
    writeln!(
        out,
        "{:<6}     schedule \"{}\" ({})",
        "",
        escaped(&s.schedule),
        escaped(&s.timezone)
    )?;
    if let Some(run) = &s.last {
        write!(
            out,
            "{:<6}     last fire {}: {}",
            "",
            at(run.fire),
            escaped(&run.outcome)
        )?;
        if let Some(ms) = run.duration_ms {
            write!(out, " in {ms} ms")?;
        }
        write!(out, ", term {}", run.term)?;
        if let Some(error) = &run.error {
            write!(out, ": {}", escaped(error))?;
        }
        writeln!(out)?;
    }
    if let Some(next) = s.next {
        writeln!(out, "{:<6}     next fire {}", "", at(next))?;
    }
    Ok(())
}

/// The services handed over after a failure, if any.
fn print_hand_overs(out: &mut impl Write, hand_overs: &[(String, Record)]) -> std::io::Result<()> {
    for (key, r) in hand_overs {
        writeln!(
            out,
            "handed over: {} {} (remembered {:.0}s more)",
            key.strip_prefix(HAND_OVER_PREFIX).unwrap_or(key),
            crate::log_output::escaped(&r.value),
            r.time_left.as_secs_f64()
        )?;
    }
    Ok(())
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
pub(super) fn emit(text: &[u8]) -> std::io::Result<()> {
    match std::io::stdout().lock().write_all(text) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written,
    }
}

/// Validates every component in the directory `path`, or the one file `path` (world,
/// imports), without serving.
pub(super) async fn check(path: Option<PathBuf>, args: &StoreArgs) -> anyhow::Result<ExitCode> {
    let mut settings = args.settings()?;
    let mut file = None;
    if let Some(path) = path {
        let dir = if path.is_file() {
            // Its own directory is its services directory: its cache, its neighbours' grants.
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            let dir = dir.unwrap_or(Path::new(".")).to_owned();
            file = Some(path);
            dir
        } else {
            path
        };
        settings.cache_dir = config::default_cache_dir(&dir);
        settings.services = dir;
    }
    let config = RuntimeConfig::from_settings(&settings)?;
    let report = tokio::task::spawn_blocking(move || crate::runtime::check(config, file)).await??;
    let mut out = Vec::new();
    for (name, world) in &report.services {
        writeln!(out, "ok    {name} ({world})")?;
        for n in report.notes.iter().filter(|n| n.service == *name) {
            writeln!(out, "  note: {}\n  help: {}", n.note, n.help)?;
        }
    }
    for e in &report.errors {
        writeln!(out, "error {e}")?;
        if let Some(help) = crate::runtime::help(&e.kind) {
            writeln!(out, "  help: {help}")?;
        }
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
