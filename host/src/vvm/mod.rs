//! The VVM lifecycle (SPEC §5): provide, launch, leadership monitor, ordered shutdown.
//!
//! Problems are reported through [`crate::problem`]; the first one ends the VVM's run.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod agreement;
mod campaign;

use agreement::Agreement;

use crate::clock::{Clock, SystemClock};
use crate::elections::{Elections, Leadership};
use crate::holder::crash_lock::HolderLockDir;
use crate::holder::{candidates, holder_value};
use crate::keys::{CANDIDATE_PREFIX, SLOT_PREFIX, slot_key};
use crate::killer::Killer;
use crate::lease::renew_every;
use crate::lease_value;
use crate::ops::Ops;
use crate::problem::{Problem, ProblemReporter};
use crate::services::{LeaseInfo, RunningServices, ServiceContext, ServiceError, Services};
use crate::store::{Store, StoreError, Term};

/// How a VVM campaigns and holds its lease.
#[derive(Clone, Debug)]
pub struct VvmConfig {
    /// Cluster size N: slots 1..=N are campaigned for. At least 1.
    pub cluster_size: u32,
    /// Lease duration `L` written with every acquire and renew.
    pub lease: Duration,
    /// How long to campaign before reporting [`Problem::AcquisitionTimeout`].
    pub acquisition_timeout: Duration,
    /// This host's holder value; [`holder_value`] makes one unique per process run.
    pub holder: String,
    /// Whether a standby whose services differ from the leader's stays out of the campaign
    /// (`require-same-services`, SPEC §13).
    pub require_same_services: bool,
}

impl Default for VvmConfig {
    fn default() -> Self {
        Self {
            cluster_size: crate::config::DEFAULT_CLUSTER_SIZE,
            lease: crate::config::DEFAULT_LEASE,
            acquisition_timeout: crate::config::DEFAULT_ACQUISITION_TIMEOUT,
            holder: holder_value(),
            require_same_services: false,
        }
    }
}

/// Where a launched VVM is in its life, for logs, status and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VvmState {
    /// Trying to acquire a slot.
    Campaigning,
    /// Holding `slot` with `term`; services are being started or run.
    Leading {
        /// The slot held.
        slot: u32,
        /// Its term.
        term: Term,
    },
    /// Running the shutdown sequence.
    ShuttingDown,
    /// The shutdown sequence has ended: no service runs, no lease is held.
    ShutDown,
}

/// A VVM that has been provided (built) but not launched. Nothing runs yet.
pub struct Vvm {
    config: VvmConfig,
    store: Arc<dyn Store>,
    services: Arc<dyn Services>,
    ops: Ops,
    killer: Arc<Killer>,
    clock: Arc<dyn Clock>,
    holder_locks: Option<Arc<HolderLockDir>>,
}

impl Vvm {
    /// Builds a VVM and starts nothing. Its lease deadlines run on `CLOCK_BOOTTIME`, the
    /// killer exits the process when it fires, and the leadership, the lease's next step and
    /// the killer are reported to `ops`.
    pub fn provide(
        config: VvmConfig,
        store: Arc<dyn Store>,
        services: Arc<dyn Services>,
        ops: Ops,
    ) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::local());
        let killer = Killer::new(Arc::clone(&clock)).reporting({
            let ops = ops.clone();
            move |armed| ops.killer_armed(armed)
        });
        Self {
            config,
            store,
            services,
            ops,
            killer: Arc::new(killer),
            clock,
            holder_locks: None,
        }
    }

    /// Takes this VVM's holder lock in `dir` before it campaigns, and keeps it until its
    /// shutdown sequence has ended; while campaigning, waits on the locks of the holders it
    /// finds there, and deletes a holder's record as soon as its lock is free (the crash lock,
    /// see [`crate::holder::crash_lock`]). `None`: wait out the lease of every holder.
    #[must_use]
    pub fn with_holder_locks(mut self, dir: Option<Arc<HolderLockDir>>) -> Self {
        self.holder_locks = dir;
        self
    }

    /// Replaces the clock of the lease deadlines and the killer (tests follow tokio's paused
    /// clock). `killer` must run on `clock`; tests inject one whose action records instead of
    /// exiting.
    #[must_use]
    pub fn with_clock_and_killer(mut self, clock: Arc<dyn Clock>, killer: Arc<Killer>) -> Self {
        self.clock = clock;
        self.killer = killer;
        self
    }

    /// Starts the VVM in the background and returns at once. Consumes the VVM, so it cannot
    /// be launched twice. Must be called inside a tokio runtime.
    #[must_use = "a launched VVM runs until it is shut down; keep it to shut it down"]
    pub fn launch(self) -> LaunchedVvm {
        let problems = ProblemReporter::default();
        let shutdown = CancellationToken::new();
        let (state_tx, state) = watch::channel(VvmState::Campaigning);
        let elections = Elections::new(
            Arc::clone(&self.store),
            Arc::clone(&self.killer),
            Arc::clone(&self.clock),
            self.ops.clone(),
        );
        elections.hand_over_to(candidates());
        let killer = Arc::clone(&self.killer);
        let ops = self.ops.clone();
        // Its thread waits from now on, so that winning a slot only arms it. The shutdown
        // sequence (or the panic path below) disarms it, which ends the thread.
        killer.prepare();
        // Before any record can carry our holder value: a standby that finds the value in a
        // record also finds our lock held. Without it standbys wait out our lease.
        let holder_lock = self.holder_locks.as_ref().and_then(|dir| {
            dir.lock(&self.config.holder)
                .inspect_err(|e| {
                    tracing::warn!(dir = %dir.path().display(), error = %e,
                        "no holder lock: after a crash standbys wait out the lease");
                })
                .ok()
        });
        let run = tokio::spawn(
            Launcher {
                vvm: self,
                elections: Arc::clone(&elections),
                problems: problems.clone(),
                shutdown: shutdown.clone(),
                state: state_tx.clone(),
            }
            .run(),
        );
        // A panic in the launcher is a bug, but it must not leave a held record behind (or a
        // hang): report it, release everything, and end as a shutdown would.
        let launcher = tokio::spawn({
            let problems = problems.clone();
            async move {
                let Err(e) = run.await else {
                    // The shutdown sequence has ended: no guest of ours can act any more.
                    if let Some(lock) = holder_lock {
                        lock.release();
                    }
                    return;
                };
                let message = match e.try_into_panic() {
                    Ok(panic) => panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "launcher panicked".to_owned()),
                    Err(e) => e.to_string(),
                };
                tracing::error!(%message, "launcher panicked; releasing the lease");
                problems.report(Problem::Internal(message));
                // Unwinding dropped the services: their supervisors are aborted, and the
                // release passes the guests' deadline before it deletes the record.
                elections.cleanup().await;
                killer.disarm();
                ops.stepped_down();
                if let Some(lock) = holder_lock {
                    lock.release();
                }
                state_tx.send_replace(VvmState::ShutDown);
            }
        });
        LaunchedVvm {
            problems,
            shutdown,
            state,
            launcher,
        }
    }
}

/// A launched VVM: wait for its problem, watch its state, shut it down.
pub struct LaunchedVvm {
    problems: ProblemReporter,
    shutdown: CancellationToken,
    state: watch::Receiver<VvmState>,
    launcher: JoinHandle<()>,
}

impl LaunchedVvm {
    /// The problem signal: `problems().wait()` resolves with the first problem.
    pub fn problems(&self) -> &ProblemReporter {
        &self.problems
    }

    /// The VVM's state as it changes.
    pub fn state(&self) -> watch::Receiver<VvmState> {
        self.state.clone()
    }

    /// Runs the shutdown sequence (services → monitor → elections cleanup → killer disarm)
    /// and returns the first problem, if any. May be called at any time after launch.
    pub async fn shutdown(self) -> Option<Problem> {
        self.shutdown.cancel();
        if let Err(e) = self.launcher.await {
            tracing::error!(error = %e, "launcher task failed");
        }
        self.problems.get()
    }
}

/// What a leading launcher hands to the shutdown sequence.
struct Leading {
    /// The slot led.
    slot: u32,
    /// The services, if they started.
    services: Option<Box<dyn RunningServices>>,
    /// Tells the leadership monitor to end.
    monitor_stop: CancellationToken,
    /// The leadership monitor.
    monitor: JoinHandle<()>,
}

/// The launcher task: campaign, monitor, services, then the ordered shutdown.
struct Launcher {
    vvm: Vvm,
    elections: Arc<Elections>,
    problems: ProblemReporter,
    shutdown: CancellationToken,
    state: watch::Sender<VvmState>,
}

impl Launcher {
    /// The launcher's whole life: campaign, lead until told to stop, then the shutdown
    /// sequence.
    async fn run(self) {
        let config = &self.vvm.config;
        // While campaigning, a leader that releases its slot may hand it to us in the same
        // write; we then find our holder in the record and take it over by reading it. The
        // record says which services we have loaded (SPEC §13).
        let inventory = self.vvm.services.inventory();
        let candidacy = self.elections.stand(
            &format!("{CANDIDATE_PREFIX}{}", config.holder),
            &config.holder,
            inventory.clone(),
            self.vvm.store.candidacy_ttl(config.lease),
            config.lease,
        );
        let mut agreement = Agreement::new(
            inventory,
            config.require_same_services,
            self.vvm.ops.clone(),
        );
        // Shutdown may come while a store call hangs: stop campaigning at once. An insert
        // dropped mid-write is remembered by the elections, whose cleanup deletes it.
        let campaign = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Ok(None),
            campaign = self.campaign(&mut agreement) => campaign,
        };
        // Whatever came of it, this host no longer stands by.
        self.vvm.ops.health().refusing(None);
        let leading = match campaign {
            // A slot won just as shutdown began: start nothing, the cleanup releases it.
            Ok(Some((slot, _))) if self.shutdown.is_cancelled() => {
                tracing::info!(slot, "acquired during shutdown; not starting services");
                None
            }
            Ok(Some((slot, leadership))) => Some(self.lead(slot, &leadership).await),
            Ok(None) => None,
            Err(problem) => {
                self.problems.report(problem);
                None
            }
        };
        // Off the takeover's path (the services run): no more handovers to us, and none on
        // to ourselves at our own release. One may have reached us before the withdrawal.
        candidacy.withdraw().await;
        self.hand_on_strays(leading.as_ref().map(|l| l.slot)).await;
        self.shutdown.cancelled().await;
        self.shutdown_sequence(leading).await;
    }

    /// Leads with `slot`: starts the leadership monitor, then the services (SPEC §5 steps 2
    /// and 3). Returns what the shutdown sequence must stop; a service that cannot start is
    /// reported as a problem.
    async fn lead(&self, slot: u32, leadership: &Leadership) -> Leading {
        let Vvm {
            config,
            store,
            services,
            ..
        } = &self.vvm;
        let term = leadership.term();
        tracing::info!(slot, term, "leading");
        self.state.send_replace(VvmState::Leading { slot, term });
        self.vvm.ops.leading(slot, term, leadership.deadline());
        // Services hear the stop on shutdown or on leadership loss, whichever is first.
        let stopping = self.shutdown.child_token();
        let monitor_stop = CancellationToken::new();
        let monitor = tokio::spawn(monitor_leadership(
            leadership.clone(),
            self.problems.clone(),
            stopping.clone(),
            monitor_stop.clone(),
        ));
        // The services this host refused ride along with the renewals, beside the running
        // ones, until the leadership ends (SPEC §13).
        let report = leadership.running_report();
        let mut inventory = services.inventory();
        let led = leadership.clone();
        tokio::spawn(async move {
            loop {
                report.set_rejected(inventory.borrow_and_update().rejected.clone());
                tokio::select! {
                    () = led.lost() => return,
                    changed = inventory.changed() => if changed.is_err() { return },
                }
            }
        });
        let ctx = ServiceContext {
            lease: LeaseInfo {
                slot,
                key: leadership.key().to_owned(),
                holder: config.holder.clone(),
                term,
                lease: config.lease,
            },
            deadline: leadership.deadline(),
            stopping,
            problems: self.problems.clone(),
            store: Arc::clone(store),
            running: leadership.running_report(),
        };
        let services = match services.start(ctx).await {
            Ok(started) => Some(started),
            Err(ServiceError::Start { name, reason }) => {
                self.problems.report(Problem::Service { name, reason });
                None
            }
        };
        Leading {
            slot,
            services,
            monitor_stop,
            monitor,
        }
    }

    /// Hands on any slot besides `ours` (the one we lead, if any) that names us: one handed to
    /// us after our campaign won another or ended, before our candidacy was withdrawn. We
    /// lead one slot at most, and a host that is not campaigning takes none over.
    async fn hand_on_strays(&self, ours: Option<u32>) {
        let Vvm { config, store, .. } = &self.vvm;
        let listed = self.within_quarter_lease("list", SLOT_PREFIX, store.list(SLOT_PREFIX));
        let records = match listed.await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for slots handed to us");
                return;
            }
        };
        for (key, record) in records {
            if ours.is_some_and(|slot| key == slot_key(slot))
                || lease_value::holder(&record.value) != config.holder
            {
                continue;
            }
            let to = candidates();
            let hand_on = store.hand_over(&key, &record.value, &to, config.lease);
            match self.within_quarter_lease("hand_over", &key, hand_on).await {
                Ok(handed) => tracing::info!(key, ?handed, "handed on a slot given to us"),
                Err(e) => {
                    tracing::warn!(key, error = %e, "could not hand on a slot given to us");
                }
            }
        }
    }

    /// The shutdown sequence (SPEC §5), in this order and nowhere else:
    /// 1. stop the services (grace period, then drop every instance still there);
    /// 2. stop the leadership monitor and wait for it;
    /// 3. elections cleanup: the lease is handed to a waiting host, or deleted, so a standby
    ///    can take over at once;
    /// 4. disarm the killer, signal *shut down*.
    async fn shutdown_sequence(&self, leading: Option<Leading>) {
        self.state.send_replace(VvmState::ShuttingDown);
        if let Some(Leading {
            slot: _,
            services,
            monitor_stop,
            monitor,
        }) = leading
        {
            if let Some(services) = services {
                // Meanwhile, the release's read (if its store has one) runs: dropped unfinished
                // once the services have stopped, the release then reads for itself. Done or
                // not, only the services' stop ends this wait.
                let prepare = async {
                    self.elections.prepare_release().await;
                    std::future::pending::<()>().await;
                };
                tokio::select! {
                    () = services.stop() => {}
                    () = prepare => {}
                }
                tracing::info!("services stopped");
            }
            monitor_stop.cancel();
            let _ = monitor.await;
            tracing::debug!("leadership monitor stopped");
        }
        self.elections.cleanup().await;
        self.vvm.killer.disarm();
        self.vvm.ops.stepped_down();
        self.state.send_replace(VvmState::ShutDown);
        tracing::info!("shut down");
    }
}

impl Launcher {
    /// Awaits a store call of the campaign (or of the release) for at most `L/4`; past that
    /// it is a transient failure, so no store call holds the campaign up for ever.
    async fn within_quarter_lease<T, E: From<StoreError>>(
        &self,
        op: &str,
        key: &str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let lease = self.vvm.config.lease;
        self.vvm.ops.health().step_due_in(renew_every(lease), lease);
        tokio::time::timeout(renew_every(lease), call)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::transient(format!("{op} {key}"), "no answer within L/4").into())
            })
    }
}

/// The leadership monitor: on loss, report [`Problem::LeadershipLost`] and tell the services
/// to stop; ends when told to.
async fn monitor_leadership(
    leadership: Leadership,
    problems: ProblemReporter,
    stopping: CancellationToken,
    stop: CancellationToken,
) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = leadership.lost() => {
            tracing::warn!(key = leadership.key(), term = leadership.term(), "lost");
            stopping.cancel();
            problems.report(Problem::LeadershipLost);
        }
    }
}
