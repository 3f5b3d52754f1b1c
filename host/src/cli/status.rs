//! `vvm-host status` and `vvm-host check`: read-only views for operators.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::StoreArgs;
use crate::config::{self, Placement};
use std::collections::BTreeMap;

use crate::keys::{CANDIDATE_PREFIX, HAND_OVER_PREFIX, MEMBER_PREFIX, SERVICE_PREFIX, slot_key};
use crate::lease_value::{self, Rejected, ServiceState, ServiceStatus, Versions};
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
/// for an HTTP service, `{"max_requests", "max_concurrent", "idle_ms"}`, else `null`), and
/// `"rejected": {name: reason}`, the services whose latest file or source the leader refused.
/// The services are those the leader wrote with its last renewal ([`crate::lease_value`]). Under spread placement (or whenever there
/// are any), the members and each service's claim instead (JSON: `"members": [{"holder",
/// "time_left_ms"}]`, `"claims": [{"service", "holder", "term", "time_left_ms"}]`, always
/// present). Services handed over after a failure within the last hour are listed too (JSON:
/// `"hand_overs": [{"service", "record", "time_left_ms"}]`, the record as the host wrote it).
/// Then, if any host stands by or any differs, every host of the store (SPEC §13): leaders,
/// standbys and spread members, with the
/// version of each service it has loaded where its record says, and each service whose
/// hosts hold different versions, flagged (JSON: `"hosts": [{"holder", "role", "slot",
/// "services", "rejected"}]`, `role` `leader`, `standby` or `member`, `services` `{name:
/// version}` or `null`, `rejected` `{name: reason}`; `"differences": [{"service", "versions":
/// {holder: version or null}}]`). A host that refused a service is listed even when it
/// differs in nothing.
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
        print_hosts(&mut out, &seen.hosts())?;
    } else {
        print_slots(&mut out, &seen.slots)?;
        print_hand_overs(&mut out, &seen.hand_overs)?;
        print_hosts(&mut out, &seen.hosts())?;
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
    /// The standbys' candidacies whose process may be alive (a dead one's record outlives it
    /// on redb; [`crate::holder::can_take_over`]).
    candidates: Vec<(String, Record)>,
}

/// One host of the store, as its record shows it.
struct HostSeen {
    holder: String,
    role: &'static str,
    slot: Option<u32>,
    /// The version of each service it has loaded, if its record says.
    services: Option<Versions>,
    /// The services whose latest version it refused, with why.
    rejected: Rejected,
}

/// Which host holds which version of one service, when they are not all the same (`None`:
/// the host does not have it).
type Difference = (String, BTreeMap<String, Option<String>>);

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
            candidates: under(CANDIDATE_PREFIX)
                .into_iter()
                .filter(|(_, r)| crate::holder::can_take_over(lease_value::holder(&r.value)))
                .collect(),
        }
    }

    /// Every host: the slots' leaders, the standbys, the spread members.
    fn hosts(&self) -> Vec<HostSeen> {
        let host = |r: &Record, role, slot| HostSeen {
            holder: lease_value::holder(&r.value).to_owned(),
            role,
            slot,
            services: lease_value::versions(&r.value),
            rejected: lease_value::rejected(&r.value),
        };
        let leaders = (self.slots.iter())
            .filter_map(|(slot, record)| Some(host(record.as_ref()?, "leader", Some(*slot))));
        let standbys = self
            .candidates
            .iter()
            .map(|(_, r)| host(r, "standby", None));
        let members = self.members.iter().map(|(_, r)| host(r, "member", None));
        leaders.chain(standbys).chain(members).collect()
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
                    "rejected": lease_value::rejected(&r.value),
                }),
                None => serde_json::json!({
                    "slot": slot, "holder": null, "term": null, "time_left_ms": null,
                    "services": null, "rejected": null,
                }),
            })
            .collect();
        let members: Vec<_> = self
            .members
            .iter()
            .map(|(_, r)| {
                let holder = lease_value::holder(&r.value);
                serde_json::json!({ "holder": holder, "time_left_ms": ms(r) })
            })
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
        let seen_hosts = self.hosts();
        let hosts: Vec<_> = seen_hosts
            .iter()
            .map(|h| {
                serde_json::json!({
                    "holder": h.holder, "role": h.role, "slot": h.slot, "services": h.services,
                    "rejected": h.rejected,
                })
            })
            .collect();
        let differences: Vec<_> = differences(&seen_hosts)
            .into_iter()
            .map(
                |(service, versions)| serde_json::json!({"service": service, "versions": versions}),
            )
            .collect();
        serde_json::json!({
            "slots": slots, "members": members, "claims": claims, "hand_overs": hand_overs,
            "hosts": hosts, "differences": differences,
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
                print_rejected(out, &lease_value::rejected(&record.value))?;
            }
            None => {
                writeln!(out, "{slot:<6} {:<48} {:>8} {:>10}", "(free)", "-", "-")?;
            }
        }
    }
    Ok(())
}

/// The services a host refused, as lines of the table under its slot.
fn print_rejected(out: &mut impl Write, rejected: &Rejected) -> std::io::Result<()> {
    for (name, reason) in rejected {
        let reason = crate::log_output::escaped(reason);
        writeln!(out, "{:<6}   service {name} rejected: {reason}", "")?;
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
        let holder = lease_value::holder(&m.value);
        let held = claims.iter().filter(|(_, c)| c.value == holder).count();
        writeln!(
            out,
            "{:<48} {:>10} {:>8.1}s",
            holder,
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

/// The services whose hosts (those whose records say what they have loaded) do not all hold
/// the same version, by name.
fn differences(hosts: &[HostSeen]) -> Vec<Difference> {
    let known: Vec<(&str, &Versions)> = hosts
        .iter()
        .filter_map(|h| Some((h.holder.as_str(), h.services.as_ref()?)))
        .collect();
    let mut names: Vec<&String> = known.iter().flat_map(|(_, v)| v.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let versions: BTreeMap<String, Option<String>> = known
                .iter()
                .map(|(holder, v)| ((*holder).to_owned(), v.get(name).cloned()))
                .collect();
            let first = versions.values().next()?;
            let differ = versions.values().any(|v| v != first);
            differ.then(|| (name.clone(), versions))
        })
        .collect()
}

/// Every host, with the versions it has loaded, the services whose hosts differ, and those a
/// host refused; nothing when no host stands by, none differs and none refused a service
/// (the holders are in the table above).
fn print_hosts(out: &mut impl Write, hosts: &[HostSeen]) -> std::io::Result<()> {
    let differences = differences(hosts);
    if differences.is_empty()
        && hosts
            .iter()
            .all(|h| h.role != "standby" && h.rejected.is_empty())
    {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "{:<8} {:<48} SERVICES", "HOST", "HOLDER")?;
    for h in hosts {
        let services = h.services.as_ref().map_or_else(
            || "(not reported)".to_owned(),
            |v| {
                let each: Vec<String> = v.iter().map(|(n, v)| format!("{n} {v}")).collect();
                each.join(", ")
            },
        );
        writeln!(out, "{:<8} {:<48} {services}", h.role, h.holder)?;
    }
    for (service, versions) in differences {
        let each: Vec<String> = versions
            .iter()
            .map(|(holder, v)| format!("{} on {holder}", v.as_deref().unwrap_or("none")))
            .collect();
        writeln!(out, "DIFFERS  {service}: {}", each.join("; "))?;
    }
    for h in hosts {
        for (service, reason) in &h.rejected {
            let reason = crate::log_output::escaped(reason);
            writeln!(out, "REJECTED {service} on {}: {reason}", h.holder)?;
        }
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
