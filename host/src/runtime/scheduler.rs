//! The schedule trigger (SPEC §11): a scheduled service runs once per fire time, on the
//! leader, each run in its own instance: Spin's cron world (`handle-cron-event`, the fire
//! time in `metadata.timestamp`) or a `wasi:cli` command (the fire time in `VVM_FIRE_TIME`).
//!
//! **At most once per fire time, cluster-wide.** Before a run starts, the leader records its
//! fire time under `schedule/NAME` (`keys::fire_key`) with one fenced insert-if-absent
//! (`KvOp::Swap` from absent, in one transaction with the check of its term): of two hosts
//! that ever see the same fire time, one records it and runs it; the other finds it taken.
//! A stale term records nothing and runs nothing. The run's outcome is written over the
//! record when it ends, fenced the same way; a record that stays `started` under an older
//! term than the reader's was cut (its leader lost the lease or died), and a new leader
//! marks it `cut`, or starts it again if `retry-cut-runs` and the deadline allow.
//!
//! **At least once while some host leads within the starting deadline.** A leader looks at
//! the last recorded fire time when it begins, and at every fire time after: what is due
//! is [`crate::schedule::Schedule::due`]'s answer (the deadline, the catch-up policy), on
//! the wall clock in whole seconds.
//!
//! A run is cut by the fence as any guest call is (its instance traps past the deadline), by
//! `run-timeout`, and by the stop (dropped at once: neither world hears a stop signal). A run
//! still going at the next fire time skips it (`concurrency = "skip"`, recorded `skipped`)
//! or runs beside it (`allow`). The last [`KEEP`] records are kept per service.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::Instant;
use wasmtime::component::ResourceTableError;
use wasmtime_wasi::I32Exit;

use super::component::{Loaded, Pre};
use super::engine::Runtime;
use super::imports::new_store;
use super::restart::Tracker;
use super::supervisor::{FirstStart, created, instantiate};
use crate::config::ScheduleSettings;
use crate::interfaces::bindings::spin_cron::fermyon::spin_cron::cron_types::{
    Error as CronError, Metadata,
};
use crate::interfaces::{Fenced, ServiceEnv};
use crate::keys::{fire_key, fire_time_of, schedule_space};
use crate::lease_value::{RunStatus, ScheduleStatus};
use crate::schedule::{Concurrency, FireTime};
use crate::store::{Fence, KvAnswer, KvDone, KvOp, KvQuota, KvWrite, StoreError};

/// How many run records are kept per service; older ones are deleted as new ones come.
pub(crate) const KEEP: usize = 100;

/// The environment variable that tells a command its fire time, in Unix seconds.
pub(crate) const FIRE_TIME_VAR: &str = "VVM_FIRE_TIME";

/// How long to wait before looking again when the store could not be read or written.
const RETRY: Duration = Duration::from_secs(1);

/// A run's record, the value under its fire time's key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    /// The term it was started (or skipped) under.
    term: u64,
    /// The host that started it.
    holder: String,
    /// When it started, Unix milliseconds.
    started_ms: u64,
    /// `started` while it runs; then `ok`, `error`, `cut` or `skipped`; `scheduled` for the
    /// fire time before the first, where a new schedule begins.
    outcome: String,
    /// What went wrong, for `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// How long it ran, for a run that ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    duration_ms: Option<u64>,
}

/// How a run ended.
#[derive(Debug)]
enum Ended {
    Ok,
    Error(String),
    /// The lease deadline passed, or the service was stopped.
    Cut,
}

/// Runs the scheduled service `svc` under `env`'s lease until it must stop: once per fire
/// time of `settings`, recording each in the store first. `first` hears at once (a scheduled
/// service has no first instance to wait for); `tracker` carries the last run and the next
/// fire time to `status`.
pub(crate) async fn run(
    rt: Arc<Runtime>,
    svc: Arc<Loaded>,
    env: Arc<ServiceEnv>,
    first: FirstStart,
    mut tracker: Tracker,
    mut settings: ScheduleSettings,
) {
    let service = &*env.name;
    created(&mut Some(first)).await;
    let schedule = &settings.schedule;
    let leading_since = wall_seconds();
    tracing::info!(
        service,
        schedule = schedule.expression(),
        timezone = schedule.timezone(),
        "service scheduled"
    );
    let mut status = ScheduleStatus {
        schedule: schedule.expression().to_owned(),
        timezone: schedule.timezone().to_owned(),
        last: None,
        next: None,
    };
    let mut runs: JoinSet<(i64, Option<RunStatus>)> = JoinSet::new();
    let mut last_started: Option<FireTime> = None;
    let mut looked = false;
    let mut reported: Option<FireTime> = None;
    while !env.stopping.is_cancelled() {
        if env.deadline.has_passed() {
            if !pause(&env, RETRY).await {
                break;
            }
            continue;
        }
        // A schedule changed by a reload (SIGHUP) applies from the next fire time.
        if let Some(now) = rt.grants().get(service).and_then(|g| g.schedule.clone())
            && now != settings
        {
            tracing::info!(
                service,
                schedule = now.schedule.expression(),
                timezone = now.schedule.timezone(),
                "schedule changed"
            );
            status.schedule = now.schedule.expression().to_owned();
            status.timezone = now.schedule.timezone().to_owned();
            settings = now;
        }
        let schedule = &settings.schedule;
        if !looked {
            match look_back(&env, &settings).await {
                Ok((last, retry)) => {
                    last_started = last;
                    looked = true;
                    if let Some(fire) = retry {
                        begin(&rt, &svc, &env, &settings, fire, &mut runs);
                    }
                }
                Err(e) => {
                    tracing::warn!(service, error = %e, "run records unreadable; trying again");
                    if !pause(&env, RETRY).await {
                        break;
                    }
                    continue;
                }
            }
        }
        let now = wall_seconds();
        let due = schedule.due(&settings.due_query(now, last_started, leading_since));
        report_missed(&env, &due.missed, &mut reported, &mut status);
        if !start_due(
            &rt,
            &svc,
            &env,
            &settings,
            &due.start,
            leading_since,
            &mut last_started,
            &mut runs,
            &mut status,
        )
        .await
        {
            break;
        }
        status.next = due.next.map(FireTime::unix);
        tracker.scheduled(status.clone());
        // Until the next fire time, a run's end (to report it), or the stop.
        let wait = due.next.map_or(Duration::from_hours(24), until);
        tokio::select! {
            biased;
            () = env.stopping.cancelled() => break,
            Some(ended) = runs.join_next(), if !runs.is_empty() => {
                if let Ok((_, Some(run))) = ended {
                    status.last = Some(run);
                    tracker.scheduled(status.clone());
                }
            }
            () = tokio::time::sleep(wait) => {}
        }
    }
    // Neither world hears a stop: what still runs is dropped, and stays recorded `started`
    // (the next leader says it was cut).
    runs.shutdown().await;
    tracker.stopped(None);
}

/// Says each of the fire times `missed` once (the next look finds the same ones again):
/// a log line, `/metrics`, and the status.
fn report_missed(
    env: &ServiceEnv,
    missed: &[crate::schedule::Missed],
    reported: &mut Option<FireTime>,
    status: &mut ScheduleStatus,
) {
    let service = &*env.name;
    let seen = *reported;
    for missed in missed.iter().filter(|m| seen.is_none_or(|r| m.at > r)) {
        *reported = Some(reported.map_or(missed.at, |r| r.max(missed.at)));
        tracing::warn!(service, fire_time = %missed.at, reason = missed.reason.as_str(),
            "scheduled run missed");
        env.ops.schedule_run(service, "missed");
        status.last = Some(RunStatus {
            fire: missed.at.unix(),
            outcome: "missed".to_owned(),
            error: Some(missed.reason.as_str().to_owned()),
            duration_ms: None,
            term: env.lease.term,
        });
    }
}

/// Claims and starts each of the fire times `due`, oldest first. While a run goes and overlap
/// is not allowed, a fire time that came due during this leadership is recorded skipped, and
/// one caught up from before it waits for the run to end. `false` once this host no longer
/// leads.
#[allow(clippy::too_many_arguments)]
async fn start_due(
    rt: &Arc<Runtime>,
    svc: &Arc<Loaded>,
    env: &Arc<ServiceEnv>,
    settings: &ScheduleSettings,
    due: &[FireTime],
    leading_since: i64,
    last_started: &mut Option<FireTime>,
    runs: &mut JoinSet<(i64, Option<RunStatus>)>,
    status: &mut ScheduleStatus,
) -> bool {
    let service = &*env.name;
    for &fire in due {
        let busy = !runs.is_empty() && settings.concurrency == Concurrency::Skip;
        if busy && fire.unix() <= leading_since {
            // Caught up from before this leadership: they run one after another, the next
            // when this one ends (or are missed once past the deadline).
            return true;
        }
        *last_started = Some(last_started.map_or(fire, |l| l.max(fire)));
        match claim(env, fire, busy).await {
            Ok(Claim::Run) => begin(rt, svc, env, settings, fire, runs),
            Ok(Claim::Skipped) => {
                tracing::warn!(service, fire_time = %fire,
                    "scheduled run skipped: the last one still runs (concurrency = \"skip\")");
                env.ops.schedule_run(service, "skipped");
                status.last = Some(RunStatus {
                    fire: fire.unix(),
                    outcome: "skipped".to_owned(),
                    error: None,
                    duration_ms: None,
                    term: env.lease.term,
                });
            }
            Ok(Claim::Taken) => {
                tracing::info!(service, fire_time = %fire,
                    "scheduled run already started by another leader");
            }
            Ok(Claim::Stale) => return false,
            Err(e) => {
                tracing::warn!(service, fire_time = %fire, error = %e,
                    "scheduled run not started: the store failed");
            }
        }
    }
    true
}

/// The wall clock, Unix seconds.
fn wall_seconds() -> i64 {
    i64::try_from(crate::clock::unix_seconds()).unwrap_or(i64::MAX)
}

/// How long until the wall clock reads `fire` (at least a millisecond, so that a fire time
/// is looked at once its second has begun).
fn until(fire: FireTime) -> Duration {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let at = Duration::from_secs(u64::try_from(fire.unix()).unwrap_or(0));
    at.saturating_sub(now).max(Duration::from_millis(1))
}

/// Waits `d`, or returns `false` once the service must stop.
async fn pause(env: &ServiceEnv, d: Duration) -> bool {
    tokio::select! {
        () = env.stopping.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// What a claim of a fire time found.
enum Claim {
    /// Recorded `started` here: run it.
    Run,
    /// Recorded `skipped` here.
    Skipped,
    /// Already recorded, by this leader or another.
    Taken,
    /// Not leading any more: nothing was recorded.
    Stale,
}

/// The fence of `env`'s writes.
fn fence(env: &ServiceEnv) -> Fence<'_> {
    Fence {
        writer: &env.name,
        lease_key: &env.lease.key,
        term: env.lease.term,
    }
}

/// A fenced write of `op` in `env`'s schedule namespace.
async fn write(env: &ServiceEnv, op: &KvOp<'_>) -> Result<KvAnswer, StoreError> {
    let space = schedule_space(&env.name);
    (env.store)
        .kv_apply(&fence(env), &space, op, &KvQuota::UNLIMITED)
        .await
}

/// A new record of `outcome` under `env`'s lease, now.
fn record(env: &ServiceEnv, outcome: &str) -> Record {
    Record {
        term: env.lease.term,
        holder: env.lease.holder.clone(),
        started_ms: wall_millis(),
        outcome: outcome.to_owned(),
        error: None,
        duration_ms: None,
    }
}

fn wall_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Records `fire` as started (or skipped, if `skip`) if no host has recorded it: one fenced
/// insert-if-absent. Then deletes the records past the last [`KEEP`].
async fn claim(env: &ServiceEnv, fire: FireTime, skip: bool) -> Result<Claim, StoreError> {
    let Some(key) = fire_key(fire.unix()) else {
        return Ok(Claim::Taken);
    };
    let outcome = if skip { "skipped" } else { "started" };
    let value = serde_json::to_vec(&record(env, outcome)).unwrap_or_default();
    let op = KvOp::Swap {
        key: &key,
        expected: None,
        new: &value,
    };
    let claim = match write(env, &op).await? {
        Ok(KvDone::Swapped(true)) => {
            if skip {
                Claim::Skipped
            } else {
                Claim::Run
            }
        }
        Ok(_) => Claim::Taken,
        Err(refusal) => {
            tracing::info!(service = &*env.name, fire_time = %fire, %refusal,
                "scheduled run not recorded");
            Claim::Stale
        }
    };
    if matches!(claim, Claim::Run | Claim::Skipped) {
        prune(env).await;
    }
    Ok(claim)
}

/// Deletes the oldest records past the last [`KEEP`] (best effort: a failure leaves them
/// for the next time).
async fn prune(env: &ServiceEnv) {
    let Ok(keys) = fire_keys(env).await else {
        return;
    };
    let Some(excess) = keys.len().checked_sub(KEEP).filter(|n| *n > 0) else {
        return;
    };
    let writes: Vec<KvWrite<'_>> = keys[..excess]
        .iter()
        .map(|key| KvWrite::Delete { key })
        .collect();
    let _ = write(env, &KvOp::Batch(&writes)).await;
}

/// Every run record's key of `env`'s service, oldest first.
async fn fire_keys(env: &ServiceEnv) -> Result<Vec<String>, StoreError> {
    let space = schedule_space(&env.name);
    let mut keys = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = env
            .store
            .kv_list(&space, crate::keys::FIRE_PREFIX, after.as_deref(), 1000)
            .await?;
        after = page.keys.last().cloned();
        keys.extend(page.keys);
        if !page.more {
            return Ok(keys);
        }
    }
}

/// What a leader finds when it begins: the last fire time recorded (started, ended or
/// skipped), and the one to start again, if the last was cut and may be. A run left
/// `started` under an older term was cut: it is recorded so, or claimed again under this
/// term if `retry-cut-runs` and the starting deadline allow.
async fn look_back(
    env: &ServiceEnv,
    settings: &ScheduleSettings,
) -> Result<(Option<FireTime>, Option<FireTime>), StoreError> {
    let keys = fire_keys(env).await?;
    let Some(key) = keys.last() else {
        return Ok((scheduled_from(env, settings).await?, None));
    };
    let last = fire_time_of(key).map(FireTime::from_unix);
    let space = schedule_space(&env.name);
    let Some(bytes) = env.store.kv_get(&space, key).await? else {
        return Ok((last, None));
    };
    let Ok(old) = serde_json::from_slice::<Record>(&bytes) else {
        return Ok((last, None));
    };
    if old.outcome != "started" || old.term >= env.lease.term {
        return Ok((last, None));
    }
    let Some(fire) = last else {
        return Ok((last, None));
    };
    let now = wall_seconds();
    let deadline = settings.starting_deadline.unwrap_or_else(|| {
        settings
            .schedule
            .default_starting_deadline(FireTime::from_unix(now))
    });
    let within = u64::try_from(now - fire.unix()).is_ok_and(|late| late <= deadline.as_secs());
    let retry = settings.retry_cut_runs && within;
    let new = if retry {
        record(env, "started")
    } else {
        Record {
            outcome: "cut".to_owned(),
            ..old
        }
    };
    let value = serde_json::to_vec(&new).unwrap_or_default();
    let op = KvOp::Swap {
        key,
        expected: Some(&bytes),
        new: &value,
    };
    let swapped = matches!(write(env, &op).await?, Ok(KvDone::Swapped(true)));
    tracing::warn!(service = &*env.name, fire_time = %fire, term = new.term,
        retried = retry && swapped, "scheduled run was cut by a takeover");
    env.ops.schedule_run(&env.name, "cut");
    Ok((last, (retry && swapped).then_some(fire)))
}

/// For a service with no run record yet (newly scheduled): records the last fire time before
/// now as `scheduled`, where the schedule begins, and returns it. The fire times before it
/// are no service's (none is missed or caught up), and a leader that takes over before the
/// first run still starts the fire times since.
async fn scheduled_from(
    env: &ServiceEnv,
    settings: &ScheduleSettings,
) -> Result<Option<FireTime>, StoreError> {
    let Some(from) = settings
        .schedule
        .latest_at_or_before(FireTime::from_unix(wall_seconds().saturating_sub(1)))
    else {
        return Ok(None);
    };
    let Some(key) = fire_key(from.unix()) else {
        return Ok(None);
    };
    let value = serde_json::to_vec(&record(env, "scheduled")).unwrap_or_default();
    let op = KvOp::Swap {
        key: &key,
        expected: None,
        new: &value,
    };
    // Taken: another leader began the schedule at this very fire time; either way it is where
    // the schedule begins.
    match write(env, &op).await? {
        Ok(_) => Ok(Some(from)),
        Err(refusal) => Err(StoreError::permanent(
            format!("schedule of {}", env.name),
            refusal.to_string(),
        )),
    }
}

/// Starts the run of `fire` (claimed here) on its own task.
fn begin(
    rt: &Arc<Runtime>,
    svc: &Arc<Loaded>,
    env: &Arc<ServiceEnv>,
    settings: &ScheduleSettings,
    fire: FireTime,
    runs: &mut JoinSet<(i64, Option<RunStatus>)>,
) {
    let (rt, svc, env) = (Arc::clone(rt), Arc::clone(svc), Arc::clone(env));
    let timeout = settings.run_timeout;
    runs.spawn(async move {
        let status = run_one(&rt, &svc, &env, fire, timeout).await;
        (fire.unix(), status)
    });
}

/// One run of `fire`, from instantiation to its outcome's record; its status for `status`.
async fn run_one(
    rt: &Runtime,
    svc: &Loaded,
    env: &Arc<ServiceEnv>,
    fire: FireTime,
    timeout: Option<Duration>,
) -> Option<RunStatus> {
    let service = &*env.name;
    let started = Instant::now();
    let late_ms = wall_millis().saturating_sub(u64::try_from(fire.unix()).unwrap_or(0) * 1000);
    let ended = match timeout {
        Some(t) => match tokio::time::timeout(t, call(rt, svc, env, fire)).await {
            Ok(ended) => ended,
            Err(_) => Ended::Error(format!("run-timeout {t:?} passed")),
        },
        None => call(rt, svc, env, fire).await,
    };
    let duration = started.elapsed();
    let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let (outcome, error) = match &ended {
        Ended::Ok => ("ok", None),
        Ended::Error(e) => ("error", Some(crate::lease_value::cut(e))),
        Ended::Cut => ("cut", None),
    };
    env.ops.schedule_run(service, outcome);
    env.ops
        .schedule_times(service, Duration::from_millis(late_ms), duration);
    if let Ended::Error(e) = &ended {
        tracing::warn!(service, fire_time = %fire, outcome, ?duration, late_ms,
            term = env.lease.term, error = %e, "scheduled run ended");
    } else {
        tracing::info!(service, fire_time = %fire, outcome, ?duration, late_ms,
            term = env.lease.term, "scheduled run ended");
    }
    if matches!(ended, Ended::Cut) {
        // Past the deadline nothing may be written; a stopped run stays `started`, which the
        // next leader reads as cut.
        return None;
    }
    let key = fire_key(fire.unix())?;
    let value = serde_json::to_vec(&Record {
        error: error.clone(),
        duration_ms: Some(duration_ms),
        ..record(env, outcome)
    })
    .unwrap_or_default();
    let writes = [KvWrite::Set {
        key: &key,
        value: &value,
    }];
    if let Err(e) = write(env, &KvOp::Batch(&writes)).await {
        tracing::warn!(service, fire_time = %fire, error = %e, "run outcome not recorded");
    }
    Some(RunStatus {
        fire: fire.unix(),
        outcome: outcome.to_owned(),
        error,
        duration_ms: Some(duration_ms),
        term: env.lease.term,
    })
}

/// Instantiates `svc` for `fire` and calls its handler (or its `run`).
async fn call(rt: &Runtime, svc: &Loaded, env: &Arc<ServiceEnv>, fire: FireTime) -> Ended {
    let service = &*env.name;
    let grants = rt.grants();
    let handles = rt.handle_cap(service, &grants);
    let fire_env = [(FIRE_TIME_VAR, fire.unix().to_string())];
    let mut store = match new_store(
        &rt.engine,
        env,
        &rt.config,
        grants.get(service),
        handles,
        &fire_env,
    ) {
        Ok(store) => store,
        Err(e) => return Ended::Error(format!("cannot set up its sandbox: {e:#}")),
    };
    let answer = match &svc.pre {
        Pre::Cron(pre) => {
            let Some(instance) = instantiate(env, pre.instantiate_async(&mut store)).await else {
                return Ended::Cut;
            };
            let instance = match instance {
                Ok(i) => i,
                Err(e) => return ended(Err(e), handles),
            };
            let metadata = Metadata {
                timestamp: u64::try_from(fire.unix()).unwrap_or(0),
            };
            let call = instance.call_handle_cron_event(&mut store, metadata);
            until_stopped(env, call).await.map(|r| {
                r.map(|r| {
                    r.map_err(|e| match e {
                        CronError::Other(m) => m,
                    })
                })
            })
        }
        Pre::Command(pre) => {
            let Some(instance) = instantiate(env, pre.instantiate_async(&mut store)).await else {
                return Ended::Cut;
            };
            let instance = match instance {
                Ok(i) => i,
                Err(e) => return ended(Err(e), handles),
            };
            let call = instance.wasi_cli_run().call_run(&mut store);
            until_stopped(env, call)
                .await
                .map(|r| r.map(|r| r.map_err(|()| "the command exited with an error".to_owned())))
        }
        Pre::Service(_) | Pre::Http => Some(Ok(Err(
            "a scheduled service is a wasi:cli command or Spin's cron world".to_owned(),
        ))),
    };
    match answer {
        Some(r) => ended(r, handles),
        None => Ended::Cut,
    }
}

/// Awaits `call`, or `None` once the service must stop (the instance is dropped).
async fn until_stopped<T>(env: &ServiceEnv, call: impl Future<Output = T>) -> Option<T> {
    tokio::select! {
        biased;
        r = call => Some(r),
        () = env.stopping.cancelled() => None,
    }
}

/// What a call's result `r` amounts to; `handles` is the instance's handle cap.
fn ended(r: wasmtime::Result<Result<(), String>>, handles: usize) -> Ended {
    match r {
        Ok(Ok(())) => Ended::Ok,
        Ok(Err(message)) => Ended::Error(format!(
            "returned an error: {}",
            crate::interfaces::output::guest_text(&message)
        )),
        Err(e) if e.is::<Fenced>() => Ended::Cut,
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(I32Exit(0)) => Ended::Ok,
            Some(I32Exit(code)) => Ended::Error(format!("exited with code {code}")),
            None if matches!(
                e.root_cause().downcast_ref::<ResourceTableError>(),
                Some(ResourceTableError::Full)
            ) =>
            {
                Ended::Error(format!("trapped: more than its {handles} handles at once"))
            }
            None => Ended::Error(format!("trapped: {e:#}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interfaces::env::tests::env;

    /// Of two claims of one fire time, the first records it and runs it, the second finds it
    /// taken; a claim while a run goes and overlap is not allowed records it skipped.
    #[tokio::test]
    async fn a_fire_time_is_claimed_once() {
        let (_clock, env) = env().await;
        let fire = FireTime::from_unix(1_795_467_600);
        assert!(matches!(claim(&env, fire, false).await, Ok(Claim::Run)));
        assert!(matches!(claim(&env, fire, false).await, Ok(Claim::Taken)));
        assert!(matches!(claim(&env, fire, true).await, Ok(Claim::Taken)));
        let next = FireTime::from_unix(1_795_467_601);
        assert!(matches!(claim(&env, next, true).await, Ok(Claim::Skipped)));
        let keys = fire_keys(&env).await.unwrap();
        assert_eq!(keys.len(), 2);
        let space = schedule_space(&env.name);
        let bytes = env.store.kv_get(&space, &keys[1]).await.unwrap().unwrap();
        let record: Record = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(record.outcome, "skipped");
        assert_eq!(record.term, env.lease.term);
    }

    /// Past the last [`KEEP`] records, the oldest go.
    #[tokio::test]
    async fn the_last_records_are_kept() {
        let (_clock, env) = env().await;
        for n in 0..KEEP + 5 {
            let fire = FireTime::from_unix(1_795_467_600 + i64::try_from(n).unwrap());
            assert!(matches!(claim(&env, fire, false).await, Ok(Claim::Run)));
        }
        let keys = fire_keys(&env).await.unwrap();
        assert_eq!(keys.len(), KEEP);
        assert_eq!(fire_time_of(&keys[0]), Some(1_795_467_605));
    }

    /// A record left `started` under an older term was cut: a new leader records it so. Here
    /// the record's term is made older than the reader's by hand.
    #[tokio::test]
    async fn a_run_left_started_by_an_older_term_is_recorded_cut() {
        let (_clock, env) = env().await;
        let fire = FireTime::from_unix(crate::clock::unix_seconds().try_into().unwrap());
        let key = fire_key(fire.unix()).unwrap();
        let old = Record {
            term: env.lease.term - 1,
            ..record(&env, "started")
        };
        let value = serde_json::to_vec(&old).unwrap();
        let writes = [KvWrite::Set {
            key: &key,
            value: &value,
        }];
        write(&env, &KvOp::Batch(&writes)).await.unwrap().unwrap();
        let settings = crate::config::ScheduleSettings {
            schedule: crate::schedule::Schedule::parse("* * * * * *", "UTC").unwrap(),
            starting_deadline: None,
            catch_up: crate::schedule::CatchUp::Latest,
            concurrency: Concurrency::Skip,
            run_timeout: None,
            retry_cut_runs: false,
        };
        let (last, retry) = look_back(&env, &settings).await.unwrap();
        assert_eq!((last, retry), (Some(fire), None));
        let space = schedule_space(&env.name);
        let bytes = env.store.kv_get(&space, &key).await.unwrap().unwrap();
        let record: Record = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(record.outcome, "cut");

        // With retry-cut-runs, within the deadline, it is claimed again under this term.
        write(&env, &KvOp::Batch(&writes)).await.unwrap().unwrap();
        let retrying = crate::config::ScheduleSettings {
            retry_cut_runs: true,
            ..settings
        };
        let (_, retry) = look_back(&env, &retrying).await.unwrap();
        assert_eq!(retry, Some(fire));
        let bytes = env.store.kv_get(&space, &key).await.unwrap().unwrap();
        let record: Record = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            (record.outcome.as_str(), record.term),
            ("started", env.lease.term)
        );
    }

    /// A newly scheduled service begins at the last fire time before now: nothing older is
    /// due, missed or caught up.
    #[tokio::test]
    async fn a_new_schedule_begins_now() {
        let (_clock, env) = env().await;
        let settings = crate::config::ScheduleSettings {
            schedule: crate::schedule::Schedule::parse("* * * * * *", "UTC").unwrap(),
            starting_deadline: None,
            catch_up: crate::schedule::CatchUp::All,
            concurrency: Concurrency::Skip,
            run_timeout: None,
            retry_cut_runs: false,
        };
        let before = wall_seconds();
        let (last, _) = look_back(&env, &settings).await.unwrap();
        let last = last.unwrap().unix();
        assert!(
            last >= before - 1 && last < wall_seconds(),
            "{last} {before}"
        );
        assert_eq!(fire_keys(&env).await.unwrap().len(), 1);
    }
}
