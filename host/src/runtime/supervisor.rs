//! Supervision of one service (SPEC §6): run it, restart it on its own with backoff when it
//! fails ([`super::restart`]), hand the slot over only where the operator asked for it
//! (`on-failure = "hand-over"`), and stop it (grace period, then drop).
//!
//! A failure stays with its service: it never stops, restarts or delays another one, and
//! never costs the host its lease, since a guest's failure is the same on every host.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmtime::Trap;
use wasmtime::component::ResourceTableError;
use wasmtime_wasi::I32Exit;

use super::component::{Loaded, Pre};
use super::engine::Runtime;
use super::imports::new_store;
use super::restart::{Backoff, Tracker};
use crate::config::{HAND_OVER_MEMORY, OnFailure};
use crate::interfaces::Fenced;
use crate::interfaces::ServiceEnv;
use crate::keys::hand_over_key;
use crate::lease_value;
use crate::problem::Problem;

/// How one run of a service ended.
#[derive(Debug)]
pub(super) enum Outcome {
    /// `run` returned `ok` (or the command exited 0): the service is done.
    Returned,
    /// Stopped by the host (it returned in its grace period, or was dropped).
    Stopped,
    /// Interrupted because the lease deadline passed: not the guest's fault.
    Fenced,
    /// `run` returned an error, trapped, or could not be instantiated.
    Failed(String),
}

/// The first start of a supervised service, as the leadership's start sees it.
pub(crate) struct FirstStart {
    /// Sent once the first instance is created, or dropped if it could not be.
    pub created: oneshot::Sender<()>,
    /// Cancelled once every service the leadership started with has its first instance (or
    /// the start is over): only then does this one's guest begin. Guests that begin while
    /// other services are still being instantiated compete with them for the two cores and
    /// for the process's mmap lock (their first page faults take it while instantiations
    /// write it). Measured (benches/runtime.rs, median of 7 starts of 100 services, 2 worker
    /// threads, four pairs in two runs) against a mere yield: on-demand 4.2-4.7 -> 2.2-2.5 ms,
    /// pooling 3.1-4.1 -> 1.8-2.4 ms.
    pub begin: CancellationToken,
    /// The services of that start whose first instance is not created yet: the last one to
    /// be created does not wait for `begin`, so that a single service (a takeover) waits for
    /// no other task.
    pub pending: Arc<AtomicUsize>,
}

/// Runs `svc` until it returns, is stopped, or is handed over; restarts it with backoff
/// whenever it fails, and keeps `tracker` (its state for `status`, `/metrics` and the log)
/// up to date. `first` hears when the first instance is created and says when its guest may
/// begin; restarts do not wait.
pub(crate) async fn supervise(
    rt: Arc<Runtime>,
    svc: Arc<Loaded>,
    env: Arc<ServiceEnv>,
    first: FirstStart,
    mut tracker: Tracker,
) {
    let service = &*env.name;
    let policy = &rt.config.restart;
    let mut started = Some(first);
    let mut backoff = Backoff::new(policy);
    let mut restart = false;
    while !env.stopping.is_cancelled() {
        if env.deadline.has_passed() {
            // Not leading (for now): wait for a renewal or the stop, without counting.
            started.take();
            if !pause(&env, policy.initial_backoff).await {
                break;
            }
            continue;
        }
        if std::mem::take(&mut restart) {
            tracker.restarting();
        }
        let run_started = Instant::now();
        match run_once(&rt, &svc, &env, &mut started).await {
            Outcome::Returned => {
                tracing::info!(service, "service returned; not restarted");
                tracker.stopped(Some("returned"));
                break;
            }
            Outcome::Stopped => break,
            Outcome::Fenced => {
                tracing::warn!(service, "service interrupted: lease deadline passed");
            }
            Outcome::Failed(reason) => {
                rt.ops.service_failed(service);
                let grants = rt.grants();
                let grant = grants.get(service);
                if grant.is_some_and(|g| g.on_failure == OnFailure::HandOver)
                    && hand_over(&env, &reason, tracker.restarts()).await
                {
                    tracker.stopped(Some(&reason));
                    break;
                }
                let max = grant
                    .and_then(|g| g.restart_backoff_max)
                    .unwrap_or(policy.max_backoff);
                let wait = backoff.failed(run_started.elapsed(), max);
                tracker.backing_off(&reason, wait);
                if !pause(&env, wait).await {
                    break;
                }
                restart = true;
            }
        }
    }
    tracker.stopped(None);
    tracing::debug!(service, "supervisor ended");
}

/// Hands the lease over after the service failed for `reason` (`on-failure = "hand-over"`),
/// unless it was handed over already within [`HAND_OVER_MEMORY`] (by any host): the record
/// of the hand-over (service, holder, term, time) is written first, in one
/// insert-if-absent, so that of two hosts the failure follows, one moves the slot and the
/// other keeps the service in backoff. Returns whether it was handed over.
async fn hand_over(env: &ServiceEnv, reason: &str, restarts: u32) -> bool {
    let service = &*env.name;
    if env.deadline.has_passed() {
        return false;
    }
    let key = hand_over_key(service);
    let at = crate::clock::unix_seconds();
    let record = serde_json::json!({
        "service": service,
        "holder": env.lease.holder,
        "term": env.lease.term,
        "at": at,
        "reason": lease_value::cut(reason),
    })
    .to_string();
    match env
        .store
        .insert_if_absent(&key, &record, HAND_OVER_MEMORY)
        .await
    {
        Ok(Some(_)) => {
            tracing::warn!(
                service,
                restarts,
                term = env.lease.term,
                lease = env.lease.key,
                "service failed; handing the lease over (on-failure = hand-over)"
            );
            env.problems.report(Problem::Service {
                name: service.to_owned(),
                reason: format!(
                    "handed over (on-failure = hand-over) after: {}",
                    lease_value::cut(reason)
                ),
            });
            true
        }
        Ok(None) => {
            let before = env.store.get(&key).await.ok().flatten();
            let before = before.as_ref().map_or("", |r| r.value.as_str());
            tracing::warn!(
                service,
                handed_over = before,
                "service failed again after a hand-over; kept here in backoff"
            );
            false
        }
        Err(e) => {
            tracing::warn!(service, error = %e,
                "the hand-over cannot be recorded; kept here in backoff");
            false
        }
    }
}

/// Sleeps `d` unless the service is told to stop first; returns false if it was.
async fn pause(env: &ServiceEnv, d: Duration) -> bool {
    tokio::select! {
        () = env.stopping.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// One instance of `svc`, from instantiation to the end of its `run`.
async fn run_once(
    rt: &Runtime,
    svc: &Loaded,
    env: &Arc<ServiceEnv>,
    started: &mut Option<FirstStart>,
) -> Outcome {
    let service = &*env.name;
    let (mut store, handles) = match new_store(rt, &svc.engine, env, &[]) {
        Ok(made) => made,
        Err(e) => {
            started.take();
            return Outcome::Failed(format!("cannot set up its sandbox: {e:#}"));
        }
    };
    let grace = rt.config.grace_period;
    match &svc.pre {
        Pre::Service(pre) => {
            let Some(instance) = instantiate(env, pre.instantiate_async(&mut store)).await else {
                started.take();
                return Outcome::Stopped;
            };
            created(started).await;
            let instance = match instance {
                Ok(i) => i,
                Err(e) => return not_instantiated(&e),
            };
            tracing::info!(service, kind = "service", "service running");
            let _running = env.ops.service_running();
            finish(env, Some(grace), handles, instance.call_run(&mut store)).await
        }
        Pre::Command(pre) => {
            let Some(instance) = instantiate(env, pre.instantiate_async(&mut store)).await else {
                started.take();
                return Outcome::Stopped;
            };
            created(started).await;
            let instance = match instance {
                Ok(i) => i,
                Err(e) => return not_instantiated(&e),
            };
            tracing::info!(service, kind = "command", "service running");
            let _running = env.ops.service_running();
            let run = async {
                let r = instance.call_run(&mut store).await;
                r.map(|r| r.map_err(|()| "the command exited with an error".to_owned()))
            };
            // A command cannot hear the stop signal: no grace period.
            finish(env, None, handles, run).await
        }
        Pre::Http => {
            // Served per request (`crate::interfaces::incoming`): each request has its own store and instance.
            drop(store);
            created(started).await;
            tracing::info!(service, kind = "http", "service running");
            let _running = env.ops.service_running();
            env.stopping.cancelled().await;
            Outcome::Stopped
        }
        Pre::Cron(_) => {
            // Called per fire time (`scheduler`): without a schedule, never.
            drop(store);
            created(started).await;
            tracing::error!(
                service,
                "not run: it exports Spin's cron handler \
                (handle-cron-event) but has no `schedule` in [service.NAME]"
            );
            env.stopping.cancelled().await;
            Outcome::Stopped
        }
    }
}

/// Runs an instantiation (which runs the guest's start functions, if it has any: guest code
/// that may never end) until it ends, or `None` once the service must stop: a guest still
/// being instantiated cannot have heard the stop, so it gets no grace period.
pub(super) async fn instantiate<T>(
    env: &ServiceEnv,
    instantiation: impl Future<Output = wasmtime::Result<T>>,
) -> Option<wasmtime::Result<T>> {
    tokio::select! {
        biased;
        instance = instantiation => Some(instance),
        () = env.stopping.cancelled() => {
            tracing::info!(service = &*env.name, "stopping: dropped while being instantiated");
            None
        }
    }
}

/// What an instantiation that failed with `e` amounts to.
fn not_instantiated(e: &wasmtime::Error) -> Outcome {
    if e.is::<Fenced>() {
        Outcome::Fenced
    } else {
        failed("cannot instantiate", e)
    }
}

/// After the first instantiation (whether it worked or not): says so, and waits until the
/// guest may begin ([`FirstStart::begin`]).
pub(super) async fn created(started: &mut Option<FirstStart>) {
    if let Some(first) = started.take() {
        let _ = first.created.send(());
        let counted = first
            .pending
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        // The last one goes on; the others' begin stays the reconciler's, so that they do not
        // compete with the end of the start.
        if counted != Ok(1) {
            first.begin.cancelled().await;
        }
    }
}

/// Awaits `run`, or, once the service must stop, gives it `grace` (if any) and then drops it.
/// `handles` is the instance's handle cap, for the reason of a failure at it.
async fn finish(
    env: &ServiceEnv,
    grace: Option<Duration>,
    handles: usize,
    run: impl Future<Output = wasmtime::Result<Result<(), String>>>,
) -> Outcome {
    let service = &*env.name;
    tokio::pin!(run);
    tokio::select! {
        biased;
        r = &mut run => outcome(r, handles),
        () = env.stopping.cancelled() => {
            let Some(grace) = grace else {
                tracing::info!(service, "stopping: command dropped at once");
                return Outcome::Stopped;
            };
            if let Ok(r) = tokio::time::timeout(grace, &mut run).await { tracing::info!(service, outcome = ?outcome(r, handles), "stopped within grace") } else { tracing::warn!(service, ?grace, "grace period over: instance dropped") }
            Outcome::Stopped
        }
    }
}

/// What a run's result `r` amounts to; `handles` is the instance's handle cap, for the
/// reason of a failure at it.
pub(super) fn outcome(r: wasmtime::Result<Result<(), String>>, handles: usize) -> Outcome {
    match r {
        Ok(Ok(())) => Outcome::Returned,
        Ok(Err(message)) => Outcome::Failed(format!(
            "run returned an error: {}",
            crate::interfaces::output::guest_text(&message)
        )),
        Err(e) if e.is::<Fenced>() => Outcome::Fenced,
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(I32Exit(0)) => Outcome::Returned,
            Some(I32Exit(code)) => Outcome::Failed(format!("exited with code {code}")),
            None if matches!(
                e.root_cause().downcast_ref::<ResourceTableError>(),
                Some(ResourceTableError::Full)
            ) =>
            {
                Outcome::Failed(format!(
                    "trapped: it tried to hold more than its {handles} handles at once \
                     (files, sockets, streams, timers; see handle-limit)"
                ))
            }
            None => failed("trapped", &e),
        },
    }
}

fn failed(what: &str, e: &wasmtime::Error) -> Outcome {
    let reason = match e.downcast_ref::<Trap>() {
        Some(trap) => format!("{what}: {trap}: {}", e.root_cause()),
        None => format!("{what}: {}", e.root_cause()),
    };
    Outcome::Failed(reason)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use testkit::{guests, logs};

    use super::*;
    use crate::interfaces::env::tests::env;
    use crate::lease_value::RunningReport;
    use crate::runtime::component::{Compiler, LoadStats, ServiceFile};
    use crate::runtime::{RuntimeConfig, imports};

    /// A supervised rust-ticker named `name` whose first start counts `pending` services
    /// (itself included) still to be created: its task, its environment, the start's `begin`
    /// and the signal of its first instance.
    async fn ticker(
        name: &str,
        pending: usize,
    ) -> (
        tokio::task::JoinHandle<()>,
        Arc<ServiceEnv>,
        CancellationToken,
        oneshot::Receiver<()>,
    ) {
        logs::init();
        let dir = tempfile::tempdir().unwrap();
        guests::install(dir.path(), &[("rust-ticker", name)]);
        let config = RuntimeConfig::new(dir.path());
        let engines = imports::engines(&config).unwrap();
        let mut compiler = Compiler {
            engines: &engines,
            cache_dir: dir.path(),
            stats: LoadStats::default(),
        };
        let svc = Arc::new(
            compiler
                .load(&ServiceFile::read(&dir.path().join(format!("{name}.wasm"))).unwrap())
                .unwrap(),
        );
        let (_clock, env) = env().await;
        let rt = Arc::new(Runtime::start(config, engines, env.ops.clone()).unwrap());
        let Ok(mut env) = Arc::try_unwrap(env) else {
            unreachable!("a fresh environment has one owner")
        };
        env.name = name.into();
        let env = Arc::new(env);
        let (created, was_created) = oneshot::channel();
        let begin = CancellationToken::new();
        let first = FirstStart {
            created,
            begin: begin.clone(),
            pending: Arc::new(AtomicUsize::new(pending)),
        };
        let tracker = Tracker::new(RunningReport::detached(), env.ops.clone(), name, "v");
        let task = tokio::spawn(supervise(rt, svc, Arc::clone(&env), first, tracker));
        (task, env, begin, was_created)
    }

    /// Waits (at most 10 s) until service `name` has logged `line` once.
    async fn logged(name: &str, line: &str) {
        let since = std::time::Instant::now();
        while logs::count(name, line) == 0 {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "never logged {line:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The first instance is created at once, but while another service of the start has no
    /// instance yet its guest begins only when told: until then it has not said a word, even
    /// long after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_first_instance_waits_for_the_begin_before_its_guest_runs() {
        let (task, env, begin, was_created) = ticker("waits", 2).await;
        was_created.await.expect("the first instance is created");
        // Without the wait, the ticker logs its first line right after its instantiation.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(logs::count("waits", "ticker started"), 0);

        begin.cancel();
        logged("waits", "ticker started").await;
        env.stopping.cancel();
        task.await.unwrap();
        assert_eq!(logs::count("waits", "ticker stopping"), 1);
    }

    /// The last service of a start to be created (the only one, on a takeover) begins at
    /// once: it waits for no other task, while `begin` stays for the reconciler to give.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_first_instance_begins_at_once() {
        let (task, env, begin, was_created) = ticker("last", 1).await;
        was_created.await.expect("the first instance is created");
        logged("last", "ticker started").await;
        assert!(
            !begin.is_cancelled(),
            "the others' begin is the reconciler's"
        );
        env.stopping.cancel();
        task.await.unwrap();
    }
}
