//! A scheduled service's run records (SPEC §11): one per fire time under `schedule/NAME`
//! (`keys::fire_key`), each written by one fenced write (the term check in the same
//! transaction): the claim that starts a run is an insert-if-absent, so no fire time is
//! started twice; the outcome is written over it; a leader that begins reads the last one.

use serde::{Deserialize, Serialize};

use crate::config::ScheduleSettings;
use crate::interfaces::ServiceEnv;
use crate::keys::{fire_key, fire_time_of, schedule_space};
use crate::schedule::FireTime;
use crate::store::{Fence, KvAnswer, KvDone, KvOp, KvQuota, KvWrite, StoreError};

/// How many run records are kept per service; older ones are deleted as new ones come.
pub(crate) const KEEP: usize = 100;

/// A run's record, the value under its fire time's key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Record {
    /// The term it was started (or skipped) under.
    pub(super) term: u64,
    /// The host that started it.
    pub(super) holder: String,
    /// When it started, Unix milliseconds.
    pub(super) started_ms: u64,
    /// `started` while it runs; then `ok`, `error`, `cut` or `skipped`; `scheduled` for the
    /// fire time before the first, where a new schedule begins.
    pub(super) outcome: String,
    /// What went wrong, for `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<String>,
    /// How long it ran, for a run that ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) duration_ms: Option<u64>,
}

/// What a claim of a fire time found.
pub(super) enum Claim {
    /// Recorded `started` here: run it.
    Run,
    /// Recorded `skipped` here.
    Skipped,
    /// Already recorded, by this leader or another.
    Taken,
    /// Not leading any more: nothing was recorded.
    Stale,
}

/// The wall clock, Unix seconds.
pub(super) fn wall_seconds() -> i64 {
    i64::try_from(crate::clock::unix_seconds()).unwrap_or(i64::MAX)
}

/// The fence of `env`'s writes.
pub(super) fn fence(env: &ServiceEnv) -> Fence<'_> {
    Fence {
        writer: &env.name,
        lease_key: &env.lease.key,
        term: env.lease.term,
    }
}

/// A fenced write of `op` in `env`'s schedule namespace.
pub(super) async fn write(env: &ServiceEnv, op: &KvOp<'_>) -> Result<KvAnswer, StoreError> {
    let space = schedule_space(&env.name);
    (env.store)
        .kv_apply(&fence(env), &space, op, &KvQuota::UNLIMITED)
        .await
}

/// A new record of `outcome` under `env`'s lease, now.
pub(super) fn record(env: &ServiceEnv, outcome: &str) -> Record {
    Record {
        term: env.lease.term,
        holder: env.lease.holder.clone(),
        started_ms: crate::clock::unix_millis(),
        outcome: outcome.to_owned(),
        error: None,
        duration_ms: None,
    }
}

/// Records `fire` as started (or skipped, if `skip`) if no host has recorded it: one fenced
/// insert-if-absent. Then deletes the records past the last [`KEEP`].
pub(super) async fn claim(
    env: &ServiceEnv,
    fire: FireTime,
    skip: bool,
) -> Result<Claim, StoreError> {
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
pub(super) async fn prune(env: &ServiceEnv) {
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
pub(super) async fn fire_keys(env: &ServiceEnv) -> Result<Vec<String>, StoreError> {
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
pub(super) async fn look_back(
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
pub(super) async fn scheduled_from(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interfaces::env::tests::env;
    use crate::schedule::Concurrency;

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
