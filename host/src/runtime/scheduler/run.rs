//! One run of a scheduled service (SPEC §11): a fresh instance for its fire time, its
//! handler called (Spin's cron world) or its `run` (a command, the fire time in
//! [`super::FIRE_TIME_VAR`]), cut by the fence, by `run-timeout` or by the stop; then its
//! outcome logged, counted and written over its record.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::FIRE_TIME_VAR;
use super::records::{Record, record, write};
use crate::interfaces::ServiceEnv;
use crate::interfaces::bindings::spin_cron::fermyon::spin_cron::cron_types::{
    Error as CronError, Metadata,
};
use crate::keys::fire_key;
use crate::lease_value::RunStatus;
use crate::runtime::component::{Loaded, Pre};
use crate::runtime::engine::Runtime;
use crate::runtime::imports::new_store;
use crate::runtime::supervisor::{Outcome, instantiate, outcome};
use crate::schedule::FireTime;
use crate::store::{KvOp, KvWrite};

/// How a run ended.
#[derive(Debug)]
enum Ended {
    Ok,
    Error(String),
    /// The lease deadline passed, or the service was stopped.
    Cut,
}

/// One run of `fire`, from instantiation to its outcome's record; its status for `status`.
pub(super) async fn run_one(
    rt: &Runtime,
    svc: &Loaded,
    env: &Arc<ServiceEnv>,
    fire: FireTime,
    timeout: Option<Duration>,
) -> Option<RunStatus> {
    let service = &*env.name;
    let started = Instant::now();
    let late_ms =
        crate::clock::unix_millis().saturating_sub(u64::try_from(fire.unix()).unwrap_or(0) * 1000);
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
    let fire_env = [(FIRE_TIME_VAR, fire.unix().to_string())];
    let (mut store, handles) = match new_store(rt, &svc.engine, env, &fire_env) {
        Ok(made) => made,
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
            let call = instance.call_run(&mut store);
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

/// What a call's result `r` amounts to (as a service's run's: the same failures, worded
/// the same); `handles` is the instance's handle cap.
fn ended(r: wasmtime::Result<Result<(), String>>, handles: usize) -> Ended {
    match outcome(r, handles) {
        Outcome::Returned => Ended::Ok,
        Outcome::Stopped | Outcome::Fenced => Ended::Cut,
        Outcome::Failed(reason) => Ended::Error(reason),
    }
}
