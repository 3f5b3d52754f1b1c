//! The renewal loop of one lease (SPEC §4): every `L/4` a compare-and-swap of the record onto
//! itself (carrying the services' state, `lease_value`), up to three attempts `L/20` apart,
//! each bounded by `L/10`; a success moves the killer and the guests' deadline to its start +
//! 0.8·L, anything else gives the lease up.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

use super::{Elections, Renewal};
use crate::clock::Timestamp;
use crate::lease::{RENEW_ATTEMPTS, attempt_patience, renew_every, retry_pause};
use crate::lease_value;
use crate::ops::RenewalOutcome;
use crate::store::StoreError;

impl Elections {
    /// The renewal that began at `cas_start` wrote `new` (and took `took`): the deadlines
    /// move to its start + 0.8·L. Only a successful write moves them later; the killer keeps
    /// the earliest deadline of every lease held.
    fn renewed(&self, r: &mut Renewal, cas_start: Timestamp, new: String, took: Duration) {
        {
            let mut state = self.lock();
            if let Some(held) = state.held.get_mut(&r.key) {
                held.local.renewed(cas_start, r.lease, true);
                held.values = vec![new.clone()];
            }
            if let Some(earliest) = state.killer_deadline() {
                self.killer.arm(earliest);
            }
        }
        r.last_start = cas_start;
        r.value = new;
        let took_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        tracing::debug!(key = r.key, took_us, "renewed");
    }

    /// Swaps our record under `key` to `new`: from the value last confirmed, else from one
    /// written since without an answer (see [`Held::values`]). `Ok(false)`: none of them is
    /// there, the lease is lost.
    async fn swap_ours(&self, r: &Renewal, new: &str) -> Result<bool, StoreError> {
        let candidates = self
            .lock()
            .held
            .get(&r.key)
            .map_or_else(|| vec![r.value.clone()], |h| h.values.clone());
        for expected in &candidates {
            if self
                .store
                .compare_and_swap(&r.key, expected, new, r.lease)
                .await?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The renewal loop of one lease (SPEC §4).
    pub(super) async fn renew(self: Arc<Self>, mut r: Renewal) {
        let interval = renew_every(r.lease);
        let retry = retry_pause(r.lease);
        loop {
            let next = r.last_start.after(interval);
            let until_next = next.left_from(self.clock.now()).unwrap_or_default();
            self.ops.health().step_due_in(until_next, r.lease);
            tokio::select! {
                () = r.stop.cancelled() => return,
                () = sleep(until_next) => {}
            }
            let late = self.clock.now().since_boot.saturating_sub(next.since_boot);
            self.ops.renewal_late(late);
            let mut attempt = 1;
            loop {
                let cas_start = self.clock.now();
                self.ops
                    .health()
                    .step_due_in(attempt_patience(r.lease), r.lease);
                // Each attempt waits at most L/10: three of them end (lost, at worst) well
                // before the killer's 0.8·L. A write given up on may still land; only an answer
                // moves the deadline.
                // The services running now ride along with the renewal (`lease_value`).
                let new = {
                    let report = r.running.borrow_and_update();
                    lease_value::encode(&r.holder, &report.services, &report.rejected)
                };
                if new != r.value
                    && let Some(held) = self.lock().held.get_mut(&r.key)
                    && !held.values.contains(&new)
                {
                    // Written from now on, answered or not: a release must try it too.
                    held.values.push(new.clone());
                }
                let cas = tokio::time::timeout(attempt_patience(r.lease), self.swap_ours(&r, &new));
                let outcome = tokio::select! {
                    () = r.stop.cancelled() => return,
                    outcome = cas => outcome.unwrap_or_else(|_| Err(StoreError::transient(
                        format!("renew {}", r.key),
                        "no answer within L/10",
                    ))),
                };
                let took = self
                    .clock
                    .now()
                    .since_boot
                    .saturating_sub(cas_start.since_boot);
                self.ops.renewal(RenewalOutcome::of(&outcome), took);
                match outcome {
                    Ok(true) => {
                        self.renewed(&mut r, cas_start, new, took);
                        break;
                    }
                    Ok(false) => {
                        tracing::warn!(key = r.key, "lost: the record changed or expired");
                        return self.give_up(&r);
                    }
                    Err(e) if attempt < RENEW_ATTEMPTS => {
                        tracing::warn!(key = r.key, attempt, error = %e, "renewal failed, retrying");
                        attempt += 1;
                        self.ops.health().step_due_in(retry, r.lease);
                        tokio::select! {
                            () = r.stop.cancelled() => return,
                            () = sleep(retry) => {}
                        }
                    }
                    Err(e) => {
                        tracing::warn!(key = r.key, attempt, error = %e, "lost: renewal failed");
                        return self.give_up(&r);
                    }
                }
            }
        }
    }

    /// Ends a lease from inside its renewal loop: the guests' deadline becomes *now*, so no
    /// guest effect happens from the moment the loss is known; then fire *lost* and stop
    /// renewing. The killer keeps its deadline (last successful write + 0.8·L): the shutdown
    /// sequence runs meanwhile.
    ///
    /// The record is deliberately left in place: the services of this lease may still be
    /// running (a guest can ignore the stop request), and deleting it now would let another
    /// host take the slot while they do. The owner deletes it with [`Elections::release`] or
    /// [`Elections::cleanup`] once its services are stopped; failing that it expires at
    /// `last write + L`, after the killer's `+ 0.8·L`.
    fn give_up(&self, r: &Renewal) {
        if let Some(held) = self.lock().held.get(&r.key) {
            held.local.pull_in(self.clock.now());
        }
        r.lost.cancel();
        // No renewal step is due any more: the shutdown sequence (grace period) is not a wedge.
        self.ops.health().idle();
    }
}
