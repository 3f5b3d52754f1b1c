//! Spread placement (SPEC §6 "Placement", seed 003's claim scheme): each service is a claim of
//! its own, and the hosts of a group share the services out between them.
//!
//! - **Claims.** The service `NAME` runs only under the record `service/NAME`, inserted with
//!   this host's holder value and its own term. Guests see that term (`slot` is 0) and their
//!   key-value writes are fenced by it.
//! - **Membership.** Each host keeps `member/<holder>`. A host's share is its part of the
//!   services split over the live members ([`super::fair_share`]): below it, the host claims
//!   free (or expired) services; above it, it hands its surplus over gracefully (stop signal,
//!   grace period, drop, then delete the claim, which wakes the others at once). A joining
//!   host wakes the others too ([`crate::keys::ANNOUNCE_PREFIX`]), so they hand over at once.
//! - **One renewal.** Every `L/4` one store write renews every record carrying this host's
//!   holder value ([`crate::store::TtlStore::renew_all`]). What it returns is what the host
//!   holds: its own memory of its claims is never trusted (seed 003). A claim the renewal did
//!   not return is lost: its deadline becomes *now* and its service alone is stopped. A
//!   renewal that fails three times (`L/20` apart, each bounded by `L/10`) loses every claim.
//! - **Deadlines and the killer.** Each claim has its own local deadline (start of its last
//!   successful write + 0.8·L, see [`crate::lease::LeaseDeadline`]); the killer is armed at
//!   the earliest of them and disarmed only while no claim is held (no service runs then).
//! - **Rules per claim** (SPEC §4–§6): services are compiled before anything is claimed (the
//!   catalogue is loaded before [`Spread::run`]); a service starts only after its claim is
//!   written; stopping is ordered: stop signal, grace period, drop, then the claim is deleted;
//!   a shutdown leaves the group first (membership deleted, so the others' shares grow at
//!   once), then hands over every claim that way, and disarms the killer last.
//!
//! Not here: the crash lock ([`crate::holder::crash_lock`]); a killed host's claims are waited out
//! (the others sleep exactly until the earliest of them expires).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::keys::{ANNOUNCE_PREFIX, MEMBER_PREFIX, SERVICE_PREFIX, member_key, service_key};
use crate::killer::Killer;
use crate::lease::{
    LeaseDeadline, attempt_patience, release_patience, renew_every, retry_pause, valid_until,
};
use crate::lease_value::RunningReport;
use crate::ops::{Ops, RenewalOutcome};
use crate::problem::{Problem, ProblemReporter};
use crate::services::{LeaseInfo, RunningServices, SeparateServices, ServiceContext, ServiceError};
use crate::store::{Record, Store, StoreError, Term};

/// Renewal attempts per round before every claim is given up (as for a slot, SPEC §4).
const RENEW_ATTEMPTS: u32 = 3;

/// How a host places services under spread placement.
#[derive(Clone, Debug)]
pub struct SpreadConfig {
    /// Lease duration `L` of every claim and of the membership record.
    pub lease: Duration,
    /// This host's holder value, unique per process run ([`crate::holder::holder_value`]).
    pub holder: String,
}

/// A host under spread placement, built and not yet running.
pub struct Spread {
    config: SpreadConfig,
    store: Arc<dyn Store>,
    services: Arc<dyn SeparateServices>,
    killer: Arc<Killer>,
    clock: Arc<dyn Clock>,
}

impl Spread {
    /// A host placing `services` through `store`. Deadlines run on `CLOCK_BOOTTIME`; the
    /// killer exits the process when it fires.
    pub fn new(
        config: SpreadConfig,
        store: Arc<dyn Store>,
        services: Arc<dyn SeparateServices>,
    ) -> Self {
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
        }
    }

    /// Replaces the clock of the deadlines and the killer (tests follow tokio's paused clock;
    /// `killer` must run on `clock`).
    #[must_use]
    pub fn with_clock_and_killer(mut self, clock: Arc<dyn Clock>, killer: Arc<Killer>) -> Self {
        self.clock = clock;
        self.killer = killer;
        self
    }

    /// Joins the group and places services until `shutdown` is cancelled, then leaves in
    /// order: membership deleted, every service stopped and its claim deleted, killer
    /// disarmed. Store failures are retried; they never end the run.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut host = Host {
            member: member_key(&self.config.holder),
            s: self,
            claims: BTreeMap::new(),
            last_renewal: None,
            member_known: false,
            cooldown: HashMap::new(),
            next_expiry: None,
            wake: Arc::new(Notify::new()),
        };
        tracing::info!(
            holder = host.s.config.holder,
            lease_ms = host.s.config.lease.as_millis(),
            "placement: spread"
        );
        let store = Arc::clone(&host.s.store);
        while !shutdown.is_cancelled() {
            let released = store.wait_released(host.s.config.lease);
            tokio::pin!(released);
            // Interest in releases is registered at the first poll: before looking.
            let released_already = tokio::select! {
                biased;
                () = &mut released => true,
                () = std::future::ready(()) => false,
            };
            // `/healthz` (SPEC §8): a round whose store calls and starts are each bounded well
            // within L/2, then the sleep; a host stuck past either by L/4 is wedged.
            let lease = host.s.config.lease;
            Ops::global().health().step_due_in(lease / 2, lease);
            host.step(false).await;
            // A release during the round (or a store that answers at once): look again soon,
            // but never spin.
            let wait = if released_already {
                Duration::from_millis(1)
            } else {
                host.next_wait()
            };
            Ops::global().health().step_due_in(wait, lease);
            let woken = host.wake.notified();
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = &mut released, if !released_already => {}
                () = woken => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        host.leave().await;
        Ops::global().health().idle();
    }
}

/// Wakes the other hosts now rather than at their next renewal, so they see a new member
/// and hand over at once: a record written and deleted straight away is a release every
/// waiting host hears ([`crate::store::TtlStore::wait_released`]; its spurious wake-ups are
/// allowed, so nothing else minds). Best effort: failing that, they see it within `L/4`.
async fn announce(store: &dyn Store, holder: &str, lease: Duration) {
    let key = format!("{ANNOUNCE_PREFIX}{holder}");
    let announce = async {
        store.insert_if_absent(&key, holder, lease).await?;
        store.compare_and_delete(&key, holder).await
    };
    if let Ok(Err(e)) = tokio::time::timeout(attempt_patience(lease), announce).await {
        tracing::debug!(error = %e, "announcing the join failed; the others see it at their next renewal");
    }
}

/// The live membership and claim records, or `None` (logged) if the store failed.
async fn look(
    store: &dyn Store,
    lease: Duration,
) -> Option<(Vec<(String, Record)>, Vec<(String, Record)>)> {
    let look = async {
        let members = store.list(MEMBER_PREFIX).await?;
        let claims = store.list(SERVICE_PREFIX).await?;
        Ok::<_, StoreError>((members, claims))
    };
    match tokio::time::timeout(attempt_patience(lease), look).await {
        Ok(Ok(looked)) => Some(looked),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "looking at the claims failed; will retry");
            None
        }
        Err(_) => {
            tracing::warn!("looking at the claims timed out; will retry");
            None
        }
    }
}

/// A claim this host holds (or is still stopping the service of).
struct Claim {
    key: String,
    term: Term,
    /// Start of the last successful write of the claim + 0.8·L: the killer's part.
    written_until: Timestamp,
    /// The guests' deadline: `written_until` while running, *now* once lost.
    deadline: watch::Sender<Timestamp>,
    problems: ProblemReporter,
    phase: Phase,
    /// Wakes the loop when the service reports a problem.
    _problem_watch: AbortOnDropHandle<()>,
}

enum Phase {
    /// Written, nothing started under it yet (or it runs nothing here: a stray).
    Claimed,
    Running {
        stopping: CancellationToken,
        services: Box<dyn RunningServices>,
    },
    /// Stop signal, grace period, drop, then the claim's delete: a task, so renewals go on
    /// meanwhile. It ends with whether the delete was answered.
    Stopping(JoinHandle<bool>),
}

/// How many leases a host waits before it claims again a service whose release (a
/// compare-and-delete by our holder value) went unanswered. Store writes are bounded far below
/// this: redb's by its lock patience (L/10) and commit, etcd's by its request timeout.
const UNANSWERED_RELEASE_PAUSE: u32 = 2;

/// The run of one host.
struct Host {
    s: Spread,
    member: String,
    /// By service name.
    claims: BTreeMap<String, Claim>,
    /// Start of the last renewal round.
    last_renewal: Option<Timestamp>,
    /// Whether the last renewal (or insert) found our membership record.
    member_known: bool,
    /// Services this host does not claim again before a time: they failed here.
    cooldown: HashMap<String, tokio::time::Instant>,
    /// When the earliest claim of another holder expires, if this host has room for it.
    next_expiry: Option<Duration>,
    /// Woken by stop tasks and problem reports.
    wake: Arc<Notify>,
}

impl Host {
    fn lease(&self) -> Duration {
        self.s.config.lease
    }

    fn holder(&self) -> &str {
        &self.s.config.holder
    }

    /// One round: renew if due (or `force`), finish stops, act on problems, balance.
    async fn step(&mut self, leaving: bool) {
        let due = self.last_renewal.is_none_or(|last| {
            last.after(renew_every(self.lease()))
                .left_from(self.s.clock.now())
                .is_none()
        });
        if due {
            self.renew().await;
        }
        self.reap();
        if !leaving {
            self.handle_problems();
            self.balance().await;
        }
    }

    /// How long to sleep before the next round (a release or a stop ending wakes it earlier).
    fn next_wait(&self) -> Duration {
        let renewal = self.last_renewal.map_or(Duration::ZERO, |last| {
            last.after(renew_every(self.lease()))
                .left_from(self.s.clock.now())
                .unwrap_or_default()
        });
        let cooldown = self
            .cooldown
            .values()
            .map(|t| t.saturating_duration_since(tokio::time::Instant::now()))
            .min();
        [Some(renewal), self.next_expiry, cooldown]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(renewal)
            .max(Duration::from_millis(1))
    }

    /// Renews every record of ours in one write (retried as a slot's renewal is), then
    /// compares what the store says we hold with what runs here.
    async fn renew(&mut self) {
        let lease = self.lease();
        let mut attempt = 1;
        loop {
            let start = self.s.clock.now();
            let renew = self.s.store.renew_all(
                &[SERVICE_PREFIX, MEMBER_PREFIX],
                &self.s.config.holder,
                lease,
            );
            let outcome = tokio::time::timeout(attempt_patience(lease), renew)
                .await
                .unwrap_or_else(|_| {
                    Err(StoreError::transient("renew_all", "no answer within L/10"))
                });
            let took = self
                .s
                .clock
                .now()
                .since_boot
                .saturating_sub(start.since_boot);
            let answer = outcome.as_ref().map(|_| true).map_err(|_| ());
            Ops::global().renewal(RenewalOutcome::of(&answer), took);
            match outcome {
                Ok(renewed) => {
                    self.last_renewal = Some(start);
                    self.renewed(start, &renewed);
                    return;
                }
                Err(e) if attempt < RENEW_ATTEMPTS => {
                    tracing::warn!(attempt, error = %e, "renewal failed, retrying");
                    attempt += 1;
                    tokio::time::sleep(retry_pause(lease)).await;
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "renewal failed: every claim is lost");
                    self.last_renewal = Some(start);
                    self.member_known = false;
                    let names: Vec<String> = self.claims.keys().cloned().collect();
                    for name in names {
                        self.lose(&name);
                    }
                    self.arm_killer();
                    return;
                }
            }
        }
    }

    /// Applies a renewal that started at `start` and renewed `renewed`.
    fn renewed(&mut self, start: Timestamp, renewed: &[(String, Term)]) {
        let until = valid_until(start, self.lease());
        let renewed: HashMap<&str, Term> = renewed.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        self.member_known = renewed.contains_key(self.member.as_str());
        let mut lost = Vec::new();
        for (name, claim) in &mut self.claims {
            if renewed.get(claim.key.as_str()) == Some(&claim.term) {
                // Only a successful write moves a deadline later.
                claim.written_until = until;
                if matches!(claim.phase, Phase::Running { .. }) {
                    claim.deadline.send_replace(until);
                }
            } else if matches!(claim.phase, Phase::Running { .. }) {
                lost.push(name.clone());
            }
        }
        for name in lost {
            tracing::warn!(service = name, "claim lost: the record changed or expired");
            self.lose(&name);
        }
        // Records of ours that run nothing here (an insert whose answer was lost, a delete
        // that failed): hand them back rather than start anything under them.
        let strays: Vec<(String, Term)> = renewed
            .iter()
            .filter_map(|(key, term)| Some((key.strip_prefix(SERVICE_PREFIX)?, *term)))
            .filter(|(name, _)| !self.claims.contains_key(*name))
            .map(|(name, term)| (name.to_owned(), term))
            .collect();
        for (name, term) in strays {
            tracing::info!(
                service = name,
                term,
                "releasing a claim of ours that runs nothing"
            );
            let claim = self.new_claim(&name, term, until);
            self.claims.insert(name.clone(), claim);
            self.begin_stop(&name);
        }
        self.arm_killer();
    }

    /// A claim lost: no guest effect from now on, and its service stops.
    fn lose(&mut self, name: &str) {
        if let Some(claim) = self.claims.get(name)
            && matches!(claim.phase, Phase::Running { .. })
        {
            claim.deadline.send_replace(self.s.clock.now());
            self.begin_stop(name);
        }
    }

    /// Starts the ordered stop of `name`'s service: stop signal, grace period, drop, then the
    /// delete of the claim (if it is still ours). The claim stays until that has ended, so it
    /// is renewed meanwhile and the killer keeps guarding it.
    fn begin_stop(&mut self, name: &str) {
        let (holder, lease) = (self.holder().to_owned(), self.lease());
        let store = Arc::clone(&self.s.store);
        let wake = Arc::clone(&self.wake);
        let Some(claim) = self.claims.get_mut(name) else {
            return;
        };
        if matches!(claim.phase, Phase::Stopping(_)) {
            return;
        }
        let services = match std::mem::replace(&mut claim.phase, Phase::Claimed) {
            Phase::Running { stopping, services } => {
                stopping.cancel();
                Some(services)
            }
            Phase::Claimed | Phase::Stopping(_) => None,
        };
        let key = claim.key.clone();
        let name = name.to_owned();
        claim.phase = Phase::Stopping(tokio::spawn(async move {
            if let Some(services) = services {
                services.stop().await;
                tracing::info!(service = name, "service stopped");
            }
            let delete = store.compare_and_delete(&key, &holder);
            let answered = match tokio::time::timeout(release_patience(lease), delete).await {
                Ok(Ok(deleted)) => {
                    tracing::info!(service = name, deleted, "claim released");
                    true
                }
                Ok(Err(e)) => {
                    tracing::warn!(service = name, error = %e, "release failed; the claim will expire");
                    false
                }
                Err(_) => {
                    tracing::warn!(service = name, "release timed out; the claim will expire");
                    false
                }
            };
            wake.notify_one();
            answered
        }));
    }

    /// Forgets the claims whose stop has ended.
    ///
    /// A claim whose delete went unanswered is not claimed again by this host for
    /// [`UNANSWERED_RELEASE_PAUSE`] leases: the delete may still land, and, carrying our holder
    /// value, it would delete a new claim of ours while its service runs here, so another host
    /// could claim it and run it too. Other hosts are not affected (their values differ).
    fn reap(&mut self) {
        let before = self.claims.len();
        let mut unanswered = Vec::new();
        self.claims.retain(|name, c| {
            let Phase::Stopping(task) = &mut c.phase else {
                return true;
            };
            if !task.is_finished() {
                return true;
            }
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            // A finished task is ready; a panicked one answered nothing either.
            if !matches!(
                std::pin::Pin::new(task).poll(&mut cx),
                std::task::Poll::Ready(Ok(true))
            ) {
                unanswered.push(name.clone());
            }
            false
        });
        let until = tokio::time::Instant::now() + self.lease() * UNANSWERED_RELEASE_PAUSE;
        for name in unanswered {
            tracing::warn!(
                service = name,
                "not claiming again here until its release has surely landed or failed"
            );
            self.cooldown.insert(name, until);
        }
        if self.claims.len() != before {
            self.arm_killer();
            self.log_running();
        }
    }

    /// A service that failed here (its supervisor gave up): hand it over, and leave it to a
    /// healthy host for a while (`L`).
    fn handle_problems(&mut self) {
        let failed: Vec<(String, Problem)> = self
            .claims
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Running { .. }))
            .filter_map(|(name, c)| Some((name.clone(), c.problems.get()?)))
            .collect();
        for (name, problem) in failed {
            tracing::warn!(service = name, %problem, "handing over a service that fails here");
            let until = tokio::time::Instant::now() + self.lease();
            self.cooldown.insert(name.clone(), until);
            self.begin_stop(&name);
        }
        let now = tokio::time::Instant::now();
        self.cooldown.retain(|_, until| *until > now);
    }

    /// Writes our membership record unless the last renewal found it.
    async fn join_if_needed(&mut self) {
        if self.member_known {
            return;
        }
        let lease = self.lease();
        let insert = self
            .s
            .store
            .insert_if_absent(&self.member, self.holder(), lease);
        match tokio::time::timeout(attempt_patience(lease), insert).await {
            // Holder values are unique: a live record under our key is ours.
            Ok(Ok(inserted)) => {
                self.member_known = true;
                tracing::info!(member = self.member, "joined");
                if inserted.is_some() {
                    announce(&*self.s.store, self.holder(), lease).await;
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "joining failed; will retry"),
            Err(_) => tracing::warn!("joining timed out; will retry"),
        }
    }

    /// Looks at the members and claims, then hands over surplus or claims free services.
    async fn balance(&mut self) {
        self.join_if_needed().await;
        let Some((members, records)) = look(&*self.s.store, self.lease()).await else {
            return;
        };
        let names = self.s.services.names();
        let mut held_by: HashMap<&str, usize> = HashMap::new();
        for (_, r) in &records {
            *held_by.entry(r.value.as_str()).or_default() += 1;
        }
        let counts: Vec<(String, usize)> = members
            .iter()
            .map(|(_, r)| {
                let n = held_by.get(r.value.as_str()).copied().unwrap_or(0);
                (r.value.clone(), n)
            })
            .collect();
        let share = super::fair_share(names.len(), &counts, self.holder());
        let running: Vec<String> = self
            .claims
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Running { .. }))
            .map(|(n, _)| n.clone())
            .collect();
        // Gone from the directory: its service has stopped already; give the claim back.
        let known: BTreeSet<&String> = names.iter().collect();
        for name in running.iter().filter(|n| !known.contains(n)) {
            tracing::info!(service = name, "releasing the claim of a removed service");
            self.begin_stop(name);
        }
        let mut running: Vec<String> = running.into_iter().filter(|n| known.contains(n)).collect();
        if running.len() > share {
            // Surplus: the last ones by name (every host agrees on nothing here; any choice works).
            for name in running.split_off(share) {
                tracing::info!(service = name, share, "handing over");
                self.begin_stop(&name);
            }
            self.log_running();
        }
        let claimed: HashMap<&str, &Record> = records
            .iter()
            .filter_map(|(k, r)| Some((k.strip_prefix(SERVICE_PREFIX)?, r)))
            .collect();
        let mut room = share.saturating_sub(running.len());
        // Whatever another holder stops renewing (a host that died) is looked at again the
        // moment it expires, not at our next renewal.
        let next_expiry = records
            .iter()
            .chain(members.iter())
            .filter(|(_, r)| r.value != self.holder())
            .map(|(_, r)| r.time_left + Duration::from_millis(1))
            .min();
        self.next_expiry = next_expiry;
        if room == 0 {
            return;
        }
        // Start at a place of our own in the list, so hosts joining together try different
        // services first.
        let offset = self.holder().bytes().map(usize::from).sum::<usize>() % names.len().max(1);
        let free: Vec<&String> = names
            .iter()
            .cycle()
            .skip(offset)
            .take(names.len())
            .filter(|n| {
                !claimed.contains_key(n.as_str())
                    && !self.claims.contains_key(*n)
                    && !self.cooldown.contains_key(*n)
            })
            .collect();
        let mut changed = false;
        for name in free {
            if room == 0 {
                break;
            }
            if self.claim(name).await {
                room -= 1;
                changed = true;
            }
        }
        if changed {
            self.log_running();
        }
    }

    /// Tries to claim `name`; on success starts its service under the claim.
    async fn claim(&mut self, name: &str) -> bool {
        let lease = self.lease();
        let key = service_key(name);
        let start = self.s.clock.now();
        let insert = self.s.store.insert_if_absent(&key, self.holder(), lease);
        let term = match tokio::time::timeout(attempt_patience(lease), insert).await {
            Ok(Ok(Some(term))) => term,
            Ok(Ok(None)) => return false,
            // It may have landed all the same: the next renewal finds it and hands it back.
            Ok(Err(e)) => {
                tracing::warn!(service = name, error = %e, "claiming failed");
                return false;
            }
            Err(_) => {
                tracing::warn!(service = name, "claiming timed out");
                return false;
            }
        };
        let until = valid_until(start, lease);
        let mut claim = self.new_claim(name, term, until);
        if until.left_from(self.s.clock.now()).is_none() {
            tracing::warn!(service = name, term, "claimed too late to use; releasing");
            self.claims.insert(name.to_owned(), claim);
            self.begin_stop(name);
            return false;
        }
        // Armed before any guest can run under the claim.
        let earliest = self.killer_deadline().map_or(until, |d| d.min(until));
        self.s.killer.arm(earliest);
        tracing::info!(service = name, term, "claimed");
        let stopping = CancellationToken::new();
        let ctx = ServiceContext {
            lease: LeaseInfo {
                slot: 0,
                key: key.clone(),
                holder: self.holder().to_owned(),
                term,
                lease,
            },
            deadline: LeaseDeadline::from_sender(Arc::clone(&self.s.clock), &claim.deadline),
            stopping: stopping.clone(),
            problems: claim.problems.clone(),
            store: Arc::clone(&self.s.store),
            running: RunningReport::detached(),
        };
        // Renewals wait meanwhile: a start that takes longer than L/4 is given up (dropping it
        // drops whatever it started), and the claim handed back.
        let started =
            tokio::time::timeout(renew_every(lease), self.s.services.start_one(name, ctx))
                .await
                .unwrap_or_else(|_| {
                    Err(ServiceError::Start {
                        name: name.to_owned(),
                        reason: "did not start within L/4".to_owned(),
                    })
                });
        match started {
            Ok(services) => {
                claim.phase = Phase::Running { stopping, services };
                self.claims.insert(name.to_owned(), claim);
                true
            }
            Err(e) => {
                tracing::warn!(service = name, error = %e, "service did not start; handing it over");
                self.cooldown
                    .insert(name.to_owned(), tokio::time::Instant::now() + lease);
                self.claims.insert(name.to_owned(), claim);
                self.begin_stop(name);
                false
            }
        }
    }

    /// A claim record just written (`until` = its start + 0.8·L), not running anything yet.
    fn new_claim(&self, name: &str, term: Term, until: Timestamp) -> Claim {
        let problems = ProblemReporter::default();
        let watch = {
            let (problems, wake) = (problems.clone(), Arc::clone(&self.wake));
            tokio::spawn(async move {
                problems.wait().await;
                wake.notify_one();
            })
        };
        Claim {
            key: service_key(name),
            term,
            written_until: until,
            deadline: watch::Sender::new(until),
            problems,
            phase: Phase::Claimed,
            _problem_watch: AbortOnDropHandle::new(watch),
        }
    }

    fn killer_deadline(&self) -> Option<Timestamp> {
        self.claims.values().map(|c| c.written_until).min()
    }

    /// The killer at the earliest deadline of every claim; disarmed while none is held (no
    /// service can run then).
    fn arm_killer(&self) {
        match self.killer_deadline() {
            Some(deadline) => self.s.killer.arm(deadline),
            None => {
                if self.s.killer.deadline().is_some() {
                    self.s.killer.disarm();
                }
            }
        }
    }

    /// One log line with the services running here now (tests and operators count them).
    fn log_running(&self) {
        let running: Vec<&str> = self
            .claims
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Running { .. }))
            .map(|(n, _)| n.as_str())
            .collect();
        tracing::info!(
            count = running.len(),
            services = running.join(","),
            "spread: running"
        );
    }

    /// Leaves the group in order: the membership record goes first (the others' shares grow
    /// at once, and each claim deleted below is taken over as soon as it is free); then every
    /// service is stopped and its claim deleted, renewing meanwhile; the killer is disarmed
    /// last.
    async fn leave(mut self) {
        tracing::info!("leaving the group");
        let lease = self.lease();
        let delete = self.s.store.compare_and_delete(&self.member, self.holder());
        if let Ok(Err(e)) = tokio::time::timeout(release_patience(lease), delete).await {
            tracing::warn!(error = %e, "deleting the membership failed; it will expire");
        }
        let names: Vec<String> = self.claims.keys().cloned().collect();
        for name in &names {
            self.begin_stop(name);
        }
        self.log_running();
        let wake = Arc::clone(&self.wake);
        while !self.claims.is_empty() {
            let woken = wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            self.step(true).await;
            if self.claims.is_empty() {
                break;
            }
            let wait = self.next_wait();
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
        self.s.killer.disarm();
        tracing::info!("left the group");
    }
}

#[cfg(test)]
mod tests;
