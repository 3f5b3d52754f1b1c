//! A host's claims under spread placement (SPEC §6 "Placement", §4 per claim): the one
//! renewal of every claim and the membership, what a claim's loss stops, the ordered stop
//! of a handed-over claim, a claim's insert and start, and the killer at the earliest
//! deadline.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::{Claim, Member, Phase};
use crate::clock::Timestamp;
use crate::keys::{MEMBER_PREFIX, SERVICE_PREFIX, service_key};
use crate::lease::{
    LocalLease, attempt_patience, earliest, release_patience, renew_every, retry_pause,
};
use crate::lease_value::RunningReport;
use crate::ops::RenewalOutcome;
use crate::problem::{Problem, ProblemReporter};
use crate::services::{LeaseInfo, ServiceContext, ServiceError};
use crate::store::{StoreError, Term};

/// How many leases a host waits before it claims again a service whose release (a
/// compare-and-delete by our holder value) went unanswered. Store writes are bounded far below
/// this: redb's by its lock patience (L/10) and commit, etcd's by its request timeout.
const UNANSWERED_RELEASE_PAUSE: u32 = 2;

impl Member {
    /// Renews every record of ours in one write (retried as a slot's renewal is), then
    /// compares what the store says we hold with what runs here.
    pub(super) async fn renew(&mut self) {
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
            self.s.ops.renewal(RenewalOutcome::of(&answer), took);
            match outcome {
                Ok(renewed) => {
                    self.last_renewal = Some(start);
                    self.renewed(start, &renewed);
                    return;
                }
                Err(e) if attempt < crate::lease::RENEW_ATTEMPTS => {
                    tracing::warn!(attempt, error = %e, "renewal failed, retrying");
                    attempt += 1;
                    tokio::time::sleep(retry_pause(lease)).await;
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "renewal failed: every claim is lost");
                    self.last_renewal = Some(start);
                    self.record_known = false;
                    if let Some(membership) = &self.membership {
                        membership.pull_in(self.s.clock.now());
                    }
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
    pub(super) fn renewed(&mut self, start: Timestamp, renewed: &[(String, Term)]) {
        let lease = self.lease();
        let renewed: HashMap<&str, Term> = renewed.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        self.record_known = renewed.contains_key(self.record_key.as_str());
        if self.record_known {
            self.membership_written(start);
        } else if let Some(membership) = &self.membership {
            // Expired or deleted: the door takes nothing from a shared queue until we join
            // again.
            membership.pull_in(self.s.clock.now());
        }
        let mut lost = Vec::new();
        for (name, claim) in &mut self.claims {
            if renewed.get(claim.key.as_str()) == Some(&claim.term) {
                // Only a successful write moves a deadline later.
                let running = matches!(claim.phase, Phase::Running { .. });
                claim.local.renewed(start, lease, running);
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
            let claim = self.new_claim(&name, term, start);
            self.claims.insert(name.clone(), claim);
            self.begin_stop(&name);
        }
        self.arm_killer();
    }

    /// A claim lost: no guest effect from now on, and its service stops.
    pub(super) fn lose(&mut self, name: &str) {
        if let Some(claim) = self.claims.get(name)
            && matches!(claim.phase, Phase::Running { .. })
        {
            claim.local.pull_in(self.s.clock.now());
            self.begin_stop(name);
        }
    }

    /// Starts the ordered stop of `name`'s service: stop signal, grace period, drop, then the
    /// delete of the claim (if it is still ours). The claim stays until that has ended, so it
    /// is renewed meanwhile and the killer keeps guarding it.
    pub(super) fn begin_stop(&mut self, name: &str) {
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
    pub(super) fn reap(&mut self) {
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
    pub(super) fn handle_problems(&mut self) {
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

    /// Tries to claim `name`; on success starts its service under the claim.
    pub(super) async fn claim(&mut self, name: &str) -> bool {
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
        let mut claim = self.new_claim(name, term, start);
        if !claim.local.usable(self.s.clock.now()) {
            tracing::warn!(service = name, term, "claimed too late to use; releasing");
            self.claims.insert(name.to_owned(), claim);
            self.begin_stop(name);
            return false;
        }
        // Armed before any guest can run under the claim.
        let held = self.claims.values().map(|c| &c.local);
        if let Some(earliest) = earliest(held.chain([&claim.local])) {
            self.s.killer.arm(earliest);
        }
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
            deadline: claim.local.deadline(Arc::clone(&self.s.clock)),
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

    /// A claim record whose write began at `start`, not running anything yet.
    pub(super) fn new_claim(&self, name: &str, term: Term, start: Timestamp) -> Claim {
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
            local: LocalLease::written(start, self.lease()),
            problems,
            phase: Phase::Claimed,
            _problem_watch: AbortOnDropHandle::new(watch),
        }
    }

    pub(super) fn killer_deadline(&self) -> Option<Timestamp> {
        earliest(self.claims.values().map(|c| &c.local))
    }

    /// The killer at the earliest deadline of every claim; disarmed while none is held (no
    /// service can run then).
    pub(super) fn arm_killer(&self) {
        match self.killer_deadline() {
            Some(deadline) => self.s.killer.arm(deadline),
            None => {
                if self.s.killer.deadline().is_some() {
                    self.s.killer.disarm();
                }
            }
        }
    }
}
