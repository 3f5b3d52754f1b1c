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
//!   The record's value also says what the host has loaded and refused (SPEC §13,
//!   [`crate::lease_value::candidate`]), rewritten as soon as that changes, for `status`.
//! - **One renewal.** Every `L/4` one store write renews every record whose value's holder
//!   part is this host's ([`crate::store::TtlStore::renew_all`]), keeping each value as it
//!   is. What it returns is what the host holds: its own memory of its claims is never
//!   trusted (seed 003). A claim the renewal did not return is lost: its deadline becomes
//!   *now* and its service alone is stopped. A renewal that fails three times (`L/20`
//!   apart, each bounded by `L/10`) loses every claim.
//! - **Deadlines and the killer.** Each claim has its own local deadline (start of its last
//!   successful write + 0.8·L, see [`crate::lease::LeaseDeadline`]); the killer is armed at
//!   the earliest of them and disarmed only while no claim is held (no service runs then).
//! - **The front door.** The host's HTTP listener belongs to its membership, not to any one
//!   claim: it opens when the host first joins and closes when it leaves; on a socket shared
//!   with other hosts it accepts only while the membership's local deadline (start of its last
//!   write + 0.8·L, as a claim's) is ahead, and again once the membership is renewed after a
//!   loss. Each request is judged by its service's claim (`crate::interfaces::incoming`).
//! - **Rules per claim** (SPEC §4–§6): services are compiled before anything is claimed (the
//!   catalogue is loaded before [`Spread::run`]); a service starts only after its claim is
//!   written; stopping is ordered: stop signal, grace period, drop, then the claim is deleted;
//!   a shutdown leaves the group first (membership deleted, so the others' shares grow at
//!   once, and the door stops taking from a shared queue), then hands over every claim that
//!   way, disarms the killer, and closes the door last.
//!
//! `claims` holds a member's claims (renewal, loss, ordered stop, insert and start, the
//! killer), `balance` its fair share (joining, claiming, handing surplus over).
//!
//! Not here: the crash lock ([`crate::holder::crash_lock`]); a killed host's claims are
//! waited out (the others sleep exactly until the earliest of them expires).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::keys::member_key;
use crate::killer::Killer;
use crate::lease::{LocalLease, release_patience, renew_every};
use crate::lease_value::Inventory;
use crate::ops::Ops;
use crate::problem::ProblemReporter;
use crate::services::{Directory, FrontDoor, RunningServices, SeparateServices};
use crate::store::{Store, Term};

/// How a host places services under spread placement.
#[derive(Clone, Debug)]
pub struct SpreadConfig {
    /// Lease duration `L` of every claim and of the membership record.
    pub lease: Duration,
    /// This host's holder value, unique per process run ([`crate::holder::holder_value`]).
    pub holder: String,
    /// Where the other members reach this host's HTTP listener (`advertise-addr`), published
    /// in its membership record for forwarding; `None`: no forwarding to this host.
    pub advertise: Option<std::net::SocketAddr>,
}

/// A host under spread placement, built and not yet running.
pub struct Spread {
    config: SpreadConfig,
    store: Arc<dyn Store>,
    services: Arc<dyn SeparateServices>,
    ops: Ops,
    killer: Arc<Killer>,
    clock: Arc<dyn Clock>,
}

impl Spread {
    /// A host placing `services` through `store`. Deadlines run on `CLOCK_BOOTTIME`; the
    /// killer exits the process when it fires; renewals, the next step due and the killer
    /// are reported to `ops`.
    pub fn new(
        config: SpreadConfig,
        store: Arc<dyn Store>,
        services: Arc<dyn SeparateServices>,
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
        let directory = self.services.directory();
        let mut host = Member {
            record_key: member_key(&self.config.holder),
            inventory: self.services.inventory(),
            published: None,
            differences: Vec::new(),
            s: self,
            claims: BTreeMap::new(),
            last_renewal: None,
            record_known: false,
            membership: None,
            door: None,
            directory,
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
        let directory = host.directory.clone();
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
            host.s.ops.health().step_due_in(lease / 2, lease);
            host.step(false).await;
            // A release during the round (or a store that answers at once): look again soon,
            // but never spin.
            let wait = if released_already {
                Duration::from_millis(1)
            } else {
                host.next_wait()
            };
            host.s.ops.health().step_due_in(wait, lease);
            let woken = host.wake.notified();
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = &mut released, if !released_already => {}
                () = woken => {}
                () = tokio::time::sleep(wait) => {}
                // A double's set never changes (its sender is gone): no branch then.
                Ok(()) = host.inventory.changed() => {}
                // The front door found a holder gone: look again now.
                () = asked(directory.as_deref()) => {}
            }
        }
        let ops = host.s.ops.clone();
        host.leave().await;
        ops.health().idle();
    }
}

/// A claim this host holds (or is still stopping the service of).
struct Claim {
    key: String,
    term: Term,
    /// The killer's part and the guests' deadline (moved while running, *now* once lost).
    local: LocalLease,
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

/// The run of one host: a member of the group.
struct Member {
    s: Spread,
    /// Our membership record's key (`member/<holder>`).
    record_key: String,
    /// What this host has loaded and refused: the membership record's value carries it
    /// ([`crate::lease_value::candidate`]), rewritten when it changes.
    inventory: watch::Receiver<Inventory>,
    /// The membership record's value as we last wrote it, if we know it.
    published: Option<String>,
    /// How our versions differ from the other members', as last said (service, described).
    differences: Vec<(String, String)>,
    /// By service name.
    claims: BTreeMap<String, Claim>,
    /// Start of the last renewal round.
    last_renewal: Option<Timestamp>,
    /// Whether the last renewal (or insert) found our membership record.
    record_known: bool,
    /// Our membership's local lease, once we have joined: the door's deadline.
    membership: Option<LocalLease>,
    /// The front door, open from the first join to the leave.
    door: Option<Box<dyn FrontDoor>>,
    /// Where the front door forwards requests for services other members hold, if it does:
    /// kept as each round finds the claims.
    directory: Option<Arc<Directory>>,
    /// Services this host does not claim again before a time: they failed here.
    cooldown: HashMap<String, tokio::time::Instant>,
    /// When the earliest claim of another holder expires, if this host has room for it.
    next_expiry: Option<Duration>,
    /// Woken by stop tasks and problem reports.
    wake: Arc<Notify>,
}

impl Member {
    fn lease(&self) -> Duration {
        self.s.config.lease
    }

    fn holder(&self) -> &str {
        &self.s.config.holder
    }

    /// One round: renew if due (or `force`), finish stops, act on problems, balance.
    async fn step(&mut self, leaving: bool) {
        let now = self.s.clock.now();
        let due = match self.last_renewal {
            None => true,
            Some(last) => {
                let at = last.after(renew_every(self.lease()));
                let late = at.left_from(now).is_none();
                if late {
                    let late = now.since_boot.saturating_sub(at.since_boot);
                    self.s.ops.renewal_late(late);
                }
                late
            }
        };
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
    /// at once, each claim deleted below is taken over as soon as it is free, and the door
    /// takes nothing more from a shared queue); then every service is stopped and its claim
    /// deleted, renewing meanwhile; the killer is disarmed; the door closes last (its
    /// connections finish their request in progress: by now a 503, or the answer of a service
    /// stopped within its grace period).
    async fn leave(mut self) {
        tracing::info!("leaving the group");
        let lease = self.lease();
        match tokio::time::timeout(release_patience(lease), self.delete_membership()).await {
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "deleting the membership failed; it will expire");
            }
            Err(_) => tracing::warn!("deleting the membership timed out; it will expire"),
            Ok(Ok(())) => {}
        }
        if let Some(membership) = &self.membership {
            membership.pull_in(self.s.clock.now());
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
        if let Some(directory) = &self.directory {
            // No longer a member: this host's view of the claims is no longer kept.
            directory.publish(crate::services::Peers::default());
        }
        if let Some(door) = self.door.take() {
            door.close().await;
        }
        tracing::info!("left the group");
    }
}

/// Resolves when the front door asks for a new look at the claims; never without a directory.
async fn asked(directory: Option<&Directory>) {
    match directory {
        Some(directory) => directory.asked().await,
        None => std::future::pending().await,
    }
}

mod balance;
mod claims;
#[cfg(test)]
mod tests;
