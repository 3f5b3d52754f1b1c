//! The VVM lifecycle (SPEC §5): provide, launch, leadership monitor, ordered shutdown.
//!
//! Problems are reported through [`crate::problem`]; the first one ends the VVM's run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::elections::{ElectionError, Elections, Leadership};
use crate::holder_lock::{DeadHolders, HolderLockDir};
use crate::keys::{CANDIDATE_PREFIX, SLOT_PREFIX, slot_key};
use crate::killer::Killer;
use crate::lease::{renew_every, retry_pause};
use crate::lease_value;
use crate::ops::Ops;
use crate::problem::{Problem, ProblemReporter};
use crate::services::{LeaseInfo, RunningServices, ServiceContext, ServiceError, Services};
use crate::store::{Candidates, Record, Store, StoreError, Term};

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
}

impl Default for VvmConfig {
    fn default() -> Self {
        Self {
            cluster_size: crate::config::DEFAULT_CLUSTER_SIZE,
            lease: crate::config::DEFAULT_LEASE,
            acquisition_timeout: crate::config::DEFAULT_ACQUISITION_TIMEOUT,
            holder: holder_value(),
        }
    }
}

/// A holder value unique per process run, not just per machine: `host/pid/start-nanos/seq`.
///
/// The pid tells processes on one machine apart, the nanos of the first call tell apart runs
/// that reuse a pid, and `seq` counts calls so two VVMs in one process never share a value.
pub fn holder_value() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!("{}/{}", this_run(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// This process's part of its holder values: node name, pid and start time.
fn this_run() -> &'static str {
    static RUN: OnceLock<String> = OnceLock::new();
    RUN.get_or_init(|| {
        // No control characters: a newline ends the holder in a record's value (`lease_value`).
        let host = node_name();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{host}/{}/{nanos:x}", std::process::id())
    })
}

/// The hosts our slot may be handed to: those standing under [`CANDIDATE_PREFIX`] that
/// [`can_take_over`].
fn candidates() -> Candidates {
    Candidates {
        prefix: CANDIDATE_PREFIX.to_owned(),
        eligible: Arc::new(can_take_over),
    }
}

/// Whether the host of `holder` (a [`holder_value`]) can take a lease over now: not when it
/// runs on this machine and its process is stopped (SIGSTOP, a debugger) or gone; a stopped
/// standby handed a slot would leave it idle until the record expires. Nor when it is a
/// campaign of this very process: a process runs one campaign at a time and the releasing
/// one has withdrawn its candidacy, so such a record is left over from an earlier campaign
/// (a candidacy write still under way when its campaign ended lands after the delete). A
/// host on another machine, or whose process this one cannot see (another pid namespace),
/// is taken as able.
pub fn can_take_over(holder: &str) -> bool {
    if holder
        .strip_prefix(this_run())
        .is_some_and(|campaign| campaign.starts_with('/'))
    {
        return false;
    }
    let mut parts = holder.rsplitn(4, '/');
    let (Some(_seq), Some(_nanos), Some(pid), Some(host)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return true;
    };
    if host != node_name() || pid.parse::<u32>().is_err() {
        return true;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        // No such process here: gone, or in another pid namespace. Either way it cannot be
        // told from a live one, and a delete is the safe fallback.
        return false;
    };
    // `pid (comm) state ...`: the command may hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("T" | "t" | "Z" | "X" | "x"))
}

/// This machine's node name as a holder value carries it.
fn node_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .replace(char::is_control, "_")
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
    killer: Arc<Killer>,
    clock: Arc<dyn Clock>,
    holder_locks: Option<Arc<HolderLockDir>>,
}

impl Vvm {
    /// Builds a VVM and starts nothing. Its lease deadlines run on `CLOCK_BOOTTIME`, and the
    /// killer exits the process when it fires.
    pub fn provide(config: VvmConfig, store: Arc<dyn Store>, services: Arc<dyn Services>) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::local());
        Self {
            config,
            store,
            services,
            killer: Arc::new(
                Killer::new(Arc::clone(&clock))
                    .reporting(|armed| Ops::global().killer_armed(armed)),
            ),
            clock,
            holder_locks: None,
        }
    }

    /// Takes this VVM's holder lock in `dir` before it campaigns, and keeps it until its
    /// shutdown sequence has ended; while campaigning, waits on the locks of the holders it
    /// finds there, and deletes a holder's record as soon as its lock is free (the crash lock,
    /// see [`crate::holder_lock`]). `None`: wait out the lease of every holder.
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
        );
        elections.hand_over_to(candidates());
        let killer = Arc::clone(&self.killer);
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
                crate::ops::Ops::global().stepped_down();
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
        // write; we then find our holder in the record and take it over by reading it.
        let candidacy = self.elections.stand(
            &format!("{CANDIDATE_PREFIX}{}", config.holder),
            &config.holder,
            self.vvm.store.candidacy_ttl(config.lease),
            config.lease,
        );
        // Shutdown may come while a store call hangs: stop campaigning at once. An insert
        // dropped mid-write is remembered by the elections, whose cleanup deletes it.
        let campaign = tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Ok(None),
            campaign = self.campaign() => campaign,
        };
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
        crate::ops::Ops::global().leading(slot, term, leadership.deadline());
        // Services hear the stop on shutdown or on leadership loss, whichever is first.
        let stopping = self.shutdown.child_token();
        let monitor_stop = CancellationToken::new();
        let monitor = tokio::spawn(monitor_leadership(
            leadership.clone(),
            self.problems.clone(),
            stopping.clone(),
            monitor_stop.clone(),
        ));
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
        let listed =
            within_quarter_lease(config.lease, "list", SLOT_PREFIX, store.list(SLOT_PREFIX));
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
            match within_quarter_lease(config.lease, "hand_over", &key, hand_on).await {
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
        crate::ops::Ops::global().stepped_down();
        self.state.send_replace(VvmState::ShutDown);
        tracing::info!("shut down");
    }

    /// Deletes the record with `value` at `key`, whose holder's process is gone (its crash
    /// lock is free). By the exact value only (fencing, SPEC §4): a record rewritten since by
    /// anyone else stays. Whether it was deleted, or `None` if the store call failed.
    async fn delete_dead_holder(
        &self,
        key: &str,
        value: &str,
        dead: &mut DeadHolders,
    ) -> Option<bool> {
        let lease = self.vvm.config.lease;
        let holder = lease_value::holder(value);
        let delete = self.vvm.store.compare_and_delete(key, value);
        match within_quarter_lease(lease, "compare_and_delete", key, delete).await {
            Ok(deleted) => {
                tracing::info!(
                    key,
                    holder,
                    deleted,
                    "deleting the record of a holder that is gone"
                );
                dead.forget(holder);
                Some(deleted)
            }
            Err(e) => {
                tracing::warn!(key, holder, error = %e,
                    "deleting the record of a holder that is gone failed");
                None
            }
        }
    }

    /// Takes over the slot `key` if its record names us (a handover), with no write: as the
    /// release that woke us left it, if the store saw that ([`crate::store::TtlStore::handed`]),
    /// else read.
    async fn take_over_if_ours(&self, key: &str) -> Result<Option<Leadership>, ElectionError> {
        let Vvm { config, store, .. } = &self.vvm;
        let read_start = self.vvm.clock.now();
        let record = match store.handed(key) {
            Some(record) => Ok(Some(record)),
            None => within_quarter_lease(config.lease, "get", key, store.get(key)).await,
        };
        match record {
            Ok(Some(record)) if lease_value::holder(&record.value) == config.holder => {
                self.adopt(key, &record, read_start).await
            }
            _ => Ok(None),
        }
    }

    /// Takes over `record`, read from `key` from `read_start` on, which names us.
    async fn adopt(
        &self,
        key: &str,
        record: &Record,
        read_start: Timestamp,
    ) -> Result<Option<Leadership>, ElectionError> {
        let Vvm { config, .. } = &self.vvm;
        let adopt = self
            .elections
            .adopt(key, &config.holder, record, read_start, config.lease);
        adopt.await
    }

    /// Tries every slot each round until one is acquired, shutdown begins (`Ok(None)`), or
    /// the acquisition timeout passes. Between rounds it sleeps until the earliest record can
    /// expire, waking early when the store reports a release.
    async fn campaign(&self) -> Result<Option<(u32, Leadership)>, Problem> {
        let Vvm { config, store, .. } = &self.vvm;
        let elections = &self.elections;
        let give_up_at = crate::clock::tokio_after(Instant::now(), config.acquisition_timeout);
        tracing::info!(
            slots = config.cluster_size,
            holder = config.holder,
            "campaigning"
        );
        let mut dead = DeadHolders::new(self.vvm.holder_locks.clone());
        // Slots held by another host at the last look, where a handover may reach us, and
        // whether a release, or a holder's exit, woke us since.
        let mut held_by_others = std::collections::HashSet::new();
        let mut may_be_handed = false;
        'round: loop {
            let mut wait = give_up_at.saturating_duration_since(Instant::now());
            // Listen for releases *before* looking at the slots: a release between our look
            // and our sleep would otherwise be missed, and we would sleep until its expiry.
            let released = store.wait_released(wait);
            tokio::pin!(released);
            let released_already = tokio::select! {
                biased;
                () = &mut released => true,
                () = std::future::ready(()) => false,
            };
            let mut seen_live = false;
            let handed_to_us = std::mem::take(&mut held_by_others);
            for slot in 1..=config.cluster_size {
                if self.shutdown.is_cancelled() {
                    return Ok(None);
                }
                let key = slot_key(slot);
                // Held by another at our last look and released since (or its holder is gone):
                // it may have been handed to us, which a read tells without the write an insert
                // attempt is.
                if (may_be_handed || released_already) && handed_to_us.contains(&slot) {
                    match self.take_over_if_ours(&key).await {
                        Ok(Some(leadership)) => return Ok(Some((slot, leadership))),
                        Ok(None) => {}
                        Err(_) => return Ok(None),
                    }
                }
                // No store call may hold the campaign up for ever: past L/4 it counts as a
                // transient failure (the insert, if it lands, is ours and is retaken or
                // cleaned up; see below).
                let attempt = elections.acquire(&key, &config.holder, config.lease);
                match within_quarter_lease(config.lease, "acquire", &key, attempt).await {
                    Ok(Some(leadership)) => return Ok(Some((slot, leadership))),
                    Ok(None) => {}
                    Err(ElectionError::CleanedUp) => return Ok(None),
                    Err(ElectionError::Store(e)) if e.is_transient() => {
                        tracing::warn!(slot, error = %e, "acquire failed, will retry");
                        wait = wait.min(retry_pause(config.lease));
                        continue;
                    }
                    Err(ElectionError::Store(e)) => return Err(e.into()),
                }
                let read_start = self.vvm.clock.now();
                match within_quarter_lease(config.lease, "get", &key, store.get(&key)).await {
                    // A record with our holder value (unique per campaign) is ours: a leader
                    // handed it to us as it released it, or an earlier insert of ours failed
                    // (a timeout, an error) yet was applied. Take it over as it stands.
                    Ok(Some(record)) if lease_value::holder(&record.value) == config.holder => {
                        match self.adopt(&key, &record, read_start).await {
                            Ok(Some(leadership)) => return Ok(Some((slot, leadership))),
                            // Too little time left: it was deleted; the slot is free.
                            Ok(None) => wait = Duration::ZERO,
                            // Adopting fails only once the elections are cleaned up.
                            Err(_) => return Ok(None),
                        }
                    }
                    // The crash lock is named by the holder; the record's value may also carry
                    // its running services (`lease_value`), and is deleted whole.
                    Ok(Some(record)) if dead.is_gone(lease_value::holder(&record.value)) => {
                        match self
                            .delete_dead_holder(&key, &record.value, &mut dead)
                            .await
                        {
                            // Progress, not a spin: the slot may be free now.
                            Some(true) => continue 'round,
                            // Rewritten meanwhile: look again soon.
                            Some(false) => wait = Duration::ZERO,
                            None => wait = wait.min(retry_pause(config.lease)),
                        }
                    }
                    Ok(Some(record)) => {
                        seen_live = true;
                        held_by_others.insert(slot);
                        wait = wait.min(record.time_left);
                        dead.watch(&key, lease_value::holder(&record.value));
                    }
                    Ok(None) => wait = Duration::ZERO,
                    Err(e) => {
                        tracing::warn!(slot, error = %e, "reading the lease failed");
                        wait = wait.min(retry_pause(config.lease));
                    }
                }
            }
            if Instant::now() >= give_up_at {
                return Err(Problem::AcquisitionTimeout {
                    slots: config.cluster_size,
                    timeout: config.acquisition_timeout,
                });
            }
            if !seen_live || released_already {
                // Released between our insert and our read, or a store that cannot wait and
                // answered at once: try again soon, but never spin.
                wait = wait.max(Duration::from_millis(1));
            }
            // A release during the round has already completed `released`: look again at once.
            crate::ops::Ops::global()
                .health()
                .step_due_in(wait, config.lease);
            may_be_handed = false;
            tokio::select! {
                () = self.shutdown.cancelled() => return Ok(None),
                () = &mut released, if !released_already => may_be_handed = true,
                () = tokio::time::sleep(wait) => {}
                // Its process is gone: look again at once. A holder that shut down in order
                // released first, and lets go of its lock right after, often before we hear of
                // the release: as after a release, look for a handover to us, then insert
                // (a record deleted, the insert wins; a crashed holder's, the round deletes it).
                () = dead.next() => may_be_handed = true,
            }
        }
    }
}

/// Awaits a store call of the campaign for at most `L/4`; past that it is a transient
/// failure, so no store call holds the campaign up for ever.
async fn within_quarter_lease<T, E: From<StoreError>>(
    lease: Duration,
    op: &str,
    key: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    crate::ops::Ops::global()
        .health()
        .step_due_in(renew_every(lease), lease);
    tokio::time::timeout(renew_every(lease), call)
        .await
        .unwrap_or_else(|_| {
            Err(StoreError::transient(format!("{op} {key}"), "no answer within L/4").into())
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A holder value of a process of this machine.
    fn local_holder(pid: u32) -> String {
        format!("{}/{pid}/1a2b/0", node_name())
    }

    /// A candidacy left over from an earlier campaign of this process (its write landed
    /// after the campaign withdrew it; on redb it would live an hour) is never handed a slot:
    /// its holder is alive but no campaign of it waits. The release deletes the record, and
    /// the slot is free at once.
    #[tokio::test]
    async fn a_left_over_candidacy_of_this_process_is_never_handed_a_slot() {
        use crate::store::{HandOver, MemStore, TtlStore};
        let store = MemStore::new(Arc::new(crate::clock::ManualClock::default()));
        let left_over = holder_value();
        let lease = Duration::from_secs(20);
        store
            .insert_if_absent(&format!("{CANDIDATE_PREFIX}{left_over}"), &left_over, lease)
            .await
            .unwrap()
            .unwrap();
        let leader = holder_value();
        store
            .insert_if_absent(&slot_key(1), &leader, lease)
            .await
            .unwrap()
            .unwrap();
        let handed = store
            .hand_over(&slot_key(1), &leader, &candidates(), lease)
            .await
            .unwrap();
        assert_eq!(handed, HandOver::Deleted);
    }

    #[test]
    fn a_stopped_or_gone_local_process_cannot_take_over_any_other_can() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let holder = local_holder(child.id());
        assert!(can_take_over(&holder), "a running process");
        let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
        // The state changes once the signal is delivered.
        let stopped = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(2));
            !can_take_over(&holder)
        });
        assert!(stopped, "a stopped process");
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
        let resumed = (0..1000).any(|_| {
            std::thread::sleep(Duration::from_millis(2));
            can_take_over(&holder)
        });
        assert!(resumed, "running again");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!can_take_over(&holder), "gone");
        // Not ours to judge: another machine, or no pid in the value.
        assert!(can_take_over(&format!("elsewhere/{}/1a2b/0", child.id())));
        assert!(can_take_over("not a holder value"));
        // A campaign of this process: left over, never handed a slot.
        assert!(!can_take_over(&holder_value()), "this process");
    }
}
