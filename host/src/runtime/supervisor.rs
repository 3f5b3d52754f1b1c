//! Supervision of one service (SPEC §6): run it, restart it with exponential backoff when it
//! fails, escalate repeated failures to a VVM problem, and stop it (grace period, then drop).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wasmtime::Trap;
use wasmtime_wasi::I32Exit;

use super::component::{Loaded, Pre};
use super::engine::Runtime;
use super::env::ServiceEnv;
use super::fence::Fenced;
use super::host::new_store;
use crate::ops::Ops;
use crate::problem::Problem;

/// How one run of a service ended.
#[derive(Debug)]
enum Outcome {
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
}

/// Runs `svc` until it returns, is stopped, or fails too often. `first` hears when the first
/// instance is created and says when its guest may begin; restarts do not wait.
pub(crate) async fn supervise(
    rt: Arc<Runtime>,
    svc: Arc<Loaded>,
    env: Arc<ServiceEnv>,
    first: FirstStart,
) {
    let service = &*env.name;
    let policy = &rt.config.restart;
    let mut started = Some(first);
    let mut failures: VecDeque<Instant> = VecDeque::new();
    let mut backoff = policy.initial_backoff;
    while !env.stopping.is_cancelled() {
        if env.deadline.has_passed() {
            // Not leading (for now): wait for a renewal or the stop, without counting.
            started.take();
            if !pause(&env, policy.initial_backoff).await {
                break;
            }
            continue;
        }
        match run_once(&rt, &svc, &env, &mut started).await {
            Outcome::Returned => {
                tracing::info!(service, "service returned; not restarted");
                break;
            }
            Outcome::Stopped => break,
            Outcome::Fenced => {
                tracing::warn!(service, "service interrupted: lease deadline passed");
            }
            Outcome::Failed(reason) => {
                Ops::global().service_failed(service);
                let now = Instant::now();
                while failures
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= policy.window)
                {
                    failures.pop_front();
                }
                if failures.is_empty() {
                    backoff = policy.initial_backoff;
                }
                failures.push_back(now);
                let count = failures.len();
                if u32::try_from(count).unwrap_or(u32::MAX) >= policy.max_failures {
                    tracing::error!(service, count, %reason, "service failed too often");
                    env.problems.report(Problem::Service {
                        name: service.to_owned(),
                        reason: format!(
                            "failed {count} times within {:?}; last: {reason}",
                            policy.window
                        ),
                    });
                    break;
                }
                tracing::warn!(service, count, ?backoff, %reason, "service failed; restarting");
                Ops::global().service_restarted(service);
                if !pause(&env, backoff).await {
                    break;
                }
                backoff = backoff.saturating_mul(2).min(policy.max_backoff);
            }
        }
    }
    tracing::debug!(service, "supervisor ended");
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
    // The grants as they are now: a re-read configuration applies from the next start.
    let grants = rt.grants();
    let mut store = match new_store(&rt.engine, env, &rt.config, grants.get(&*env.name)) {
        Ok(store) => store,
        Err(e) => {
            started.take();
            return Outcome::Failed(format!("cannot set up its sandbox: {e:#}"));
        }
    };
    let grace = rt.config.grace_period;
    match &svc.pre {
        Pre::Service(pre) => {
            let instance = pre.instantiate_async(&mut store).await;
            created(started).await;
            let instance = match instance {
                Ok(i) => i,
                Err(e) => return failed("cannot instantiate", &e),
            };
            tracing::info!(service, kind = "service", "service running");
            let _running = Ops::global().service_running();
            finish(env, Some(grace), instance.call_run(&mut store)).await
        }
        Pre::Command(pre) => {
            let instance = pre.instantiate_async(&mut store).await;
            created(started).await;
            let instance = match instance {
                Ok(i) => i,
                Err(e) => return failed("cannot instantiate", &e),
            };
            tracing::info!(service, kind = "command", "service running");
            let _running = Ops::global().service_running();
            let run = async {
                let r = instance.wasi_cli_run().call_run(&mut store).await;
                r.map(|r| r.map_err(|()| "the command exited with an error".to_owned()))
            };
            // A command cannot hear the stop signal: no grace period.
            finish(env, None, run).await
        }
    }
}

/// After the first instantiation (whether it worked or not): says so, and waits until the
/// guest may begin ([`FirstStart::begin`]).
async fn created(started: &mut Option<FirstStart>) {
    if let Some(first) = started.take() {
        let _ = first.created.send(());
        first.begin.cancelled().await;
    }
}

/// Awaits `run`, or, once the service must stop, gives it `grace` (if any) and then drops it.
async fn finish(
    env: &ServiceEnv,
    grace: Option<Duration>,
    run: impl Future<Output = wasmtime::Result<Result<(), String>>>,
) -> Outcome {
    let service = &*env.name;
    tokio::pin!(run);
    tokio::select! {
        biased;
        r = &mut run => outcome(r),
        () = env.stopping.cancelled() => {
            let Some(grace) = grace else {
                tracing::info!(service, "stopping: command dropped at once");
                return Outcome::Stopped;
            };
            if let Ok(r) = tokio::time::timeout(grace, &mut run).await { tracing::info!(service, outcome = ?outcome(r), "stopped within grace") } else { tracing::warn!(service, ?grace, "grace period over: instance dropped") }
            Outcome::Stopped
        }
    }
}

fn outcome(r: wasmtime::Result<Result<(), String>>) -> Outcome {
    match r {
        Ok(Ok(())) => Outcome::Returned,
        Ok(Err(message)) => Outcome::Failed(format!("run returned an error: {message}")),
        Err(e) if e.is::<Fenced>() => Outcome::Fenced,
        Err(e) => match e.downcast_ref::<I32Exit>() {
            Some(I32Exit(0)) => Outcome::Returned,
            Some(I32Exit(code)) => Outcome::Failed(format!("exited with code {code}")),
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
    use crate::runtime::component::{Compiler, LoadStats};
    use crate::runtime::env::tests::env;
    use crate::runtime::{RuntimeConfig, engine, host};

    /// The first instance is created at once, but its guest begins only when told: until
    /// then it has not said a word, even long after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_first_instance_waits_for_the_begin_before_its_guest_runs() {
        logs::init();
        let dir = tempfile::tempdir().unwrap();
        guests::install(dir.path(), &[("rust-ticker", "svc")]);
        let config = RuntimeConfig::new(dir.path());
        let engine = engine::build(&config).unwrap();
        let linker = host::linker(&engine).unwrap();
        let mut compiler = Compiler {
            engine: &engine,
            cache_dir: dir.path(),
            stats: LoadStats::default(),
        };
        let svc = Arc::new(
            compiler
                .load(&dir.path().join("svc.wasm"), &linker)
                .unwrap(),
        );
        let rt = Arc::new(Runtime::start(config, engine).unwrap());
        let (_clock, env) = env().await;
        let (created, was_created) = oneshot::channel();
        let begin = CancellationToken::new();
        let first = FirstStart {
            created,
            begin: begin.clone(),
        };
        let task = tokio::spawn(supervise(rt, svc, Arc::clone(&env), first));

        was_created.await.expect("the first instance is created");
        // Without the wait, the ticker logs its first line right after its instantiation.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(logs::count("svc", "ticker started"), 0);

        begin.cancel();
        let since = std::time::Instant::now();
        while logs::count("svc", "ticker started") == 0 {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "the guest never began"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        env.stopping.cancel();
        task.await.unwrap();
        assert_eq!(logs::count("svc", "ticker stopping"), 1);
    }
}
