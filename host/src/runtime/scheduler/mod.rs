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
//! or runs beside it (`allow`). The last `records::KEEP` records are kept per service.
//!
//! `records` holds the run records in the store; `run` one run, from instance to outcome.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use super::component::Loaded;
use super::engine::Runtime;
use super::restart::Tracker;
use super::supervisor::{FirstStart, created};
use crate::config::ScheduleSettings;
use crate::interfaces::ServiceEnv;
use crate::lease_value::{RunStatus, ScheduleStatus};
use crate::schedule::{Concurrency, FireTime};
use records::{Claim, claim, look_back, wall_seconds};

mod records;
mod run;

/// The environment variable that tells a command its fire time, in Unix seconds.
pub(crate) const FIRE_TIME_VAR: &str = "VVM_FIRE_TIME";

/// How long to wait before looking again when the store could not be read or written.
const RETRY: Duration = Duration::from_secs(1);

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

/// How long until the wall clock reads `fire` (at least a millisecond, so that a fire time
/// is looked at once its second has begun).
fn until(fire: FireTime) -> Duration {
    // Milliseconds read down: the wait ends at or after the fire time's second begins.
    let at = u64::try_from(fire.unix()).unwrap_or(0).saturating_mul(1000);
    Duration::from_millis(at.saturating_sub(crate::clock::unix_millis()))
        .max(Duration::from_millis(1))
}

/// Waits `d`, or returns `false` once the service must stop.
async fn pause(env: &ServiceEnv, d: Duration) -> bool {
    tokio::select! {
        () = env.stopping.cancelled() => false,
        () = tokio::time::sleep(d) => true,
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
        let status = run::run_one(&rt, &svc, &env, fire, timeout).await;
        (fire.unix(), status)
    });
}
