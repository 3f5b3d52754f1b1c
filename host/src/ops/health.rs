//! Liveness for `/healthz` (SPEC §8, Operations): is the host wedged?
//!
//! The campaign and the renewal loop publish, before each step, the moment by which the step
//! must be over (every store call they make is bounded, so a live loop always meets it). A host
//! is *wedged* once that moment is more than `L/4` past, as client-go's `HealthzAdaptor` reports
//! a leader whose renewals stalled: the async runtime is blocked, or a loop is stuck in a bug.
//! Nothing scheduled (serving no VVM, backing off) is healthy. A standby that will not
//! campaign (`require-same-services` and other bits than the leader's, SPEC §13) is unhealthy
//! for as long as it refuses, with the reason: it cannot take over.
//!
//! Publishing is a clock read and a watch-channel write; `/healthz` only reads the channel, so
//! the endpoint can never hold up a renewal.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{Clock, Timestamp};

/// Published step deadlines, read on an injected [`Clock`]. Cheap to clone.
#[derive(Clone)]
pub struct Health {
    clock: Arc<dyn Clock>,
    /// When the host counts as wedged if no newer step has been published: due + L/4.
    wedged_after: Arc<watch::Sender<Option<Timestamp>>>,
    /// Why this host will not campaign, while it will not.
    refusing: Arc<watch::Sender<Option<String>>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("wedged_after", &*self.wedged_after.borrow())
            .field("refusing", &*self.refusing.borrow())
            .finish_non_exhaustive()
    }
}

impl Health {
    /// Nothing scheduled yet, on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            wedged_after: Arc::new(watch::Sender::new(None)),
            refusing: Arc::new(watch::Sender::new(None)),
        }
    }

    /// The next step of a loop running with lease `lease` is due within `within` from now.
    pub fn step_due_in(&self, within: Duration, lease: Duration) {
        let at = self
            .clock
            .now()
            .after(within)
            .after(crate::lease::renew_every(lease));
        self.wedged_after.send_replace(Some(at));
    }

    /// No step is scheduled (no VVM running): healthy until the next [`Health::step_due_in`].
    pub fn idle(&self) {
        self.wedged_after.send_replace(None);
    }

    /// The host will not campaign, for `reason` (`Some`), or will again (`None`).
    pub fn refusing(&self, reason: Option<String>) {
        self.refusing.send_replace(reason);
    }

    /// Why the host will not campaign, while it will not.
    pub fn refusal(&self) -> Option<String> {
        self.refusing.borrow().clone()
    }

    /// How long past `due + L/4` the awaited step is, or `None` while healthy.
    pub fn overdue(&self) -> Option<Duration> {
        let wedged_after = (*self.wedged_after.borrow())?;
        // One process, one clock: readings of the same boot.
        let by = self
            .clock
            .now()
            .since_boot
            .checked_sub(wedged_after.since_boot)?;
        (!by.is_zero()).then_some(by)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn a_step_overdue_by_more_than_a_quarter_lease_is_wedged() {
        let clock = ManualClock::default();
        let health = Health::new(Arc::new(clock.clone()));
        let lease = Duration::from_secs(20);
        assert_eq!(health.overdue(), None, "nothing scheduled is healthy");

        // A renewal due in L/4 = 5 s: healthy until 5 s + L/4 = 10 s have passed.
        health.step_due_in(Duration::from_secs(5), lease);
        clock.advance(Duration::from_secs(10));
        assert_eq!(health.overdue(), None, "exactly L/4 late is not yet wedged");
        clock.advance(Duration::from_millis(1));
        assert_eq!(health.overdue(), Some(Duration::from_millis(1)));

        // The loop comes back and publishes its next step: healthy again.
        health.step_due_in(Duration::from_secs(5), lease);
        assert_eq!(health.overdue(), None);
        clock.advance(Duration::from_mins(1));
        assert_eq!(health.overdue(), Some(Duration::from_secs(50)));

        // Stepping down clears it.
        health.idle();
        assert_eq!(health.overdue(), None);
    }
}
