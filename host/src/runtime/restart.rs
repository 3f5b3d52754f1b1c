//! A failed service's restarts (SPEC §6): the backoff schedule ([`Backoff`]), and the
//! service's state as `status`, `/metrics` and the log see it ([`Tracker`]).
//!
//! The schedule is a pure function of how long each run lasted, so its unit tests give the
//! run lengths and need no clock. The rule: the first restart waits `initial_backoff`
//! (100 ms), each failure in a row doubles the wait up to the cap (`restart-backoff-max`,
//! per service or host-wide, 5 min by default), and a run that lasted `reset_after` (1 min)
//! was clean: the failure that ends it waits `initial_backoff` again. A service that fails
//! at once is thus tried ~12 times in its first 7 minutes, then every 5 minutes; one that
//! fails after an hour of work is back within 100 ms.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::config::RestartPolicy;
use crate::lease_value::{RunningReport, ServiceState, ServiceStatus};
use crate::ops::Ops;

/// The waits between a failing service's restarts.
#[derive(Debug)]
pub(crate) struct Backoff {
    initial: Duration,
    reset_after: Duration,
    /// The wait the next failure in a row gets (before the cap).
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(policy: &RestartPolicy) -> Self {
        Self {
            initial: policy.initial_backoff,
            reset_after: policy.reset_after,
            next: policy.initial_backoff,
        }
    }

    /// A run that lasted `ran` failed: the wait before the next start, at most `max`.
    pub(crate) fn failed(&mut self, ran: Duration, max: Duration) -> Duration {
        if ran >= self.reset_after {
            self.next = self.initial;
        }
        let wait = self.next.min(max);
        self.next = wait.saturating_mul(2).min(max);
        wait
    }
}

/// One service's state under one leadership: published to the lease record (for `status`),
/// to `vvm_service_state`, and as one log line per transition. A reason that comes again is
/// not said again, only counted, so a guest failing with a 5 MB message at every restart
/// costs one long line, not one per restart.
pub(crate) struct Tracker {
    status: ServiceStatus,
    report: RunningReport,
    ops: Ops,
    /// The hash of the last reason said in full, and how often it came again since.
    said: Option<(u64, u32)>,
}

impl Tracker {
    /// A service `name` (version `version`) starting now under the leadership of `report`,
    /// its state also reported to `ops`.
    pub(crate) fn new(report: RunningReport, ops: Ops, name: &str, version: &str) -> Self {
        let since = crate::clock::unix_seconds();
        let tracker = Self {
            status: ServiceStatus::running(name, version, since),
            report,
            ops,
            said: None,
        };
        tracker.publish();
        tracker
    }

    /// How often the service was restarted after a failure.
    pub(crate) fn restarts(&self) -> u32 {
        self.status.restarts
    }

    /// An instance is being started again after a failure.
    pub(crate) fn restarting(&mut self) {
        self.status.restarts = self.status.restarts.saturating_add(1);
        self.ops.service_restarted(&self.status.name);
        self.set(ServiceState::Running);
    }

    /// The run failed for `reason`; the next start is in `wait`. Logs the transition.
    pub(crate) fn backing_off(&mut self, reason: &str, wait: Duration) {
        let until = SystemTime::now() + wait;
        let until_ms = until
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let repeated = self.repeated(reason);
        let service = self.status.name.as_str();
        let restarts = self.status.restarts;
        let until_text = humantime::format_rfc3339_millis(until);
        match repeated {
            0 => tracing::warn!(service, restarts, ?wait, until = %until_text, %reason,
                "service failed; backing off"),
            repeated => tracing::warn!(service, restarts, ?wait, until = %until_text,
                repeated, "service failed again, as before; backing off"),
        }
        self.status.reason = Some(crate::lease_value::cut(reason));
        self.set(ServiceState::BackingOff { until_ms });
    }

    /// A scheduled service's schedule, last run and next fire time are now `schedule`.
    pub(crate) fn scheduled(&mut self, schedule: crate::lease_value::ScheduleStatus) {
        if self.status.schedule.as_ref() != Some(&schedule) {
            self.status.schedule = Some(schedule);
            self.publish();
        }
    }

    /// An HTTP service whose instances are reused as `reuse` says.
    pub(crate) fn reused(&mut self, reuse: crate::lease_value::ReuseStatus) {
        if self.status.reuse != Some(reuse) {
            self.status.reuse = Some(reuse);
            self.publish();
        }
    }

    /// The service will not run again under this leadership (it returned, was handed over,
    /// or is stopped); `reason` says why, if it is news.
    pub(crate) fn stopped(&mut self, reason: Option<&str>) {
        if let Some(reason) = reason {
            self.status.reason = Some(crate::lease_value::cut(reason));
        }
        self.set(ServiceState::Stopped);
    }

    /// How often `reason` came in a row before this time (0: it is news, and is now said).
    fn repeated(&mut self, reason: &str) -> u32 {
        let mut hasher = DefaultHasher::new();
        reason.hash(&mut hasher);
        let hash = hasher.finish();
        match &mut self.said {
            Some((said, repeats)) if *said == hash => {
                *repeats = repeats.saturating_add(1);
                *repeats
            }
            _ => {
                self.said = Some((hash, 0));
                0
            }
        }
    }

    fn set(&mut self, state: ServiceState) {
        self.status.state = state;
        self.publish();
    }

    fn publish(&self) {
        self.ops.service_state(&self.status.name, self.status.state);
        self.report.update(self.status.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn test_ops() -> Ops {
        Ops::new(std::sync::Arc::new(crate::clock::ManualClock::default()))
    }

    fn policy() -> RestartPolicy {
        RestartPolicy {
            initial_backoff: 100 * MS,
            max_backoff: Duration::from_mins(5),
            reset_after: Duration::from_mins(1),
        }
    }

    /// Issue 28: the waits double from 100 ms to the cap and stay there while the service
    /// keeps failing at once.
    #[test]
    fn the_wait_doubles_from_the_first_to_the_cap() {
        let mut b = Backoff::new(&policy());
        let max = Duration::from_mins(5);
        let waits: Vec<Duration> = (0..14).map(|_| b.failed(10 * MS, max)).collect();
        let expected: Vec<Duration> = [
            100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 51_200, 102_400, 204_800,
            300_000, 300_000,
        ]
        .iter()
        .map(|&ms| ms * MS)
        .collect();
        assert_eq!(waits, expected);
    }

    /// A run that lasted `reset_after` was clean: the failure that ends it waits the first
    /// wait again; one just short of it does not reset anything.
    #[test]
    fn a_clean_run_resets_the_wait() {
        let mut b = Backoff::new(&policy());
        let max = Duration::from_mins(5);
        for _ in 0..5 {
            b.failed(MS, max);
        }
        let just_short = Duration::from_millis(59_999);
        assert_eq!(b.failed(just_short, max), 3200 * MS);
        assert_eq!(b.failed(Duration::from_mins(1), max), 100 * MS, "reset");
        assert_eq!(b.failed(MS, max), 200 * MS, "doubling again from there");
    }

    /// The cap is the service's own (it may change with a re-read configuration): a lower
    /// one applies at once, a higher one lets the wait grow on from where it stands.
    #[test]
    fn the_cap_is_given_at_each_failure() {
        let mut b = Backoff::new(&policy());
        assert_eq!(b.failed(MS, 150 * MS), 100 * MS);
        assert_eq!(b.failed(MS, 150 * MS), 150 * MS);
        assert_eq!(b.failed(MS, 150 * MS), 150 * MS);
        let raised = Duration::from_secs(1);
        assert_eq!(b.failed(MS, raised), 150 * MS);
        assert_eq!(b.failed(MS, raised), 300 * MS);
        assert_eq!(b.failed(MS, raised), 600 * MS);
        assert_eq!(b.failed(MS, raised), 1000 * MS);
    }

    /// A reason is said once; the same one again is counted, and a new one said again.
    #[test]
    fn a_repeated_reason_is_counted_not_said() {
        let mut t = Tracker::new(RunningReport::detached(), test_ops(), "svc", "v");
        let long = "trap ".repeat(1 << 20);
        assert_eq!(t.repeated(&long), 0);
        assert_eq!(t.repeated(&long), 1);
        assert_eq!(t.repeated(&long), 2);
        assert_eq!(t.repeated("another"), 0);
        assert_eq!(t.repeated(&long), 0, "news again after another reason");
    }
}
