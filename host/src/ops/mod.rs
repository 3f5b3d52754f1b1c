//! Operations (SPEC §8, "Operations"): metrics, liveness and leadership of this process, and
//! the optional HTTP endpoint (`--metrics-addr`) serving `/healthz`, `/leader` and `/metrics`.
//!
//! - `health`: [`Health`], the step deadlines that tell a wedged host (`/healthz`).
//! - `metrics`: the Prometheus metrics (`/metrics`), with the services' series; `lease`,
//!   `kv`, `outgoing`, `incoming` and `schedule` the series of the lease, of the guests' key-value writes
//!   and their group commit, of HTTP out and in, and of scheduled runs.
//! - `running`: [`RunningGuard`], one running thing counted in a gauge while it lives.
//! - `http`: the endpoint, on a thread of its own ([`Endpoint`]).
//!
//! `vvm-host serve` makes one [`Ops`] and hands a clone to each layer that reports (the VVM,
//! the elections, spread placement, the runtime), as mini-redis hands each connection its
//! `Db`; tests make one each and read what they caused, and nothing else. Every report is an
//! atomic update or a watch-channel write, so reporting never waits on a scrape, and a scrape
//! never holds anything the renewal path needs.

mod health;
mod http;
mod incoming;
mod kv;
mod lease;
mod metrics;
mod outgoing;
mod running;
mod schedule;

pub use health::Health;
pub use http::{Endpoint, EndpointError};
pub use incoming::ServiceHttpMetrics;
pub use kv::{KvLimit, KvOutcome};
pub use lease::RenewalOutcome;
pub use outgoing::HttpOutcome;
pub use running::RunningGuard;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::lease::LeaseDeadline;
use crate::store::Term;
use lease::SlotLabels;
use metrics::Metrics;

/// The lease this host leads under, as `/leader` and the lease gauges show it.
#[derive(Clone, Debug)]
pub struct Leader {
    /// The slot held.
    pub slot: u32,
    /// Its term.
    pub term: Term,
    /// The local lease deadline (moved by every renewal, pulled in on loss).
    pub deadline: LeaseDeadline,
}

impl Leader {
    /// True while the local lease deadline has not passed.
    pub fn is_valid(&self) -> bool {
        !self.deadline.has_passed()
    }
}

/// Metrics, health and leadership of the process. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Ops {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    metrics: Metrics,
    health: Health,
    /// The current (or last) leadership; `None` before the first.
    leader: watch::Sender<Option<Leader>>,
    /// Whether `leader` is current: set on [`Ops::leading`], cleared on [`Ops::stepped_down`].
    leading: watch::Sender<bool>,
}

impl Ops {
    /// A fresh set whose health deadlines run on `clock` (the process: `CLOCK_BOOTTIME`, as
    /// the lease deadlines).
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Inner {
                metrics: Metrics::new(),
                health: Health::new(clock),
                leader: watch::Sender::new(None),
                leading: watch::Sender::new(false),
            }),
        }
    }

    /// Liveness: where the campaign and the renewal loop publish their next step.
    pub fn health(&self) -> &Health {
        &self.inner.health
    }

    /// A slot was acquired and services start under it.
    pub fn leading(&self, slot: u32, term: Term, deadline: LeaseDeadline) {
        self.inner.metrics.lease.takeovers.inc();
        let labels = SlotLabels { slot };
        self.inner
            .metrics
            .lease
            .term
            .get_or_create(&labels)
            .set(i64::try_from(term).unwrap_or(i64::MAX));
        self.inner.leader.send_replace(Some(Leader {
            slot,
            term,
            deadline,
        }));
        self.inner.leading.send_replace(true);
    }

    /// The VVM has shut down: no lease held, no step scheduled.
    pub fn stepped_down(&self) {
        self.inner.leading.send_replace(false);
        self.inner.health.idle();
    }

    /// The leadership `/leader` reports: held and not past its local deadline.
    pub fn leader(&self) -> Option<Leader> {
        if !*self.inner.leading.borrow() {
            return None;
        }
        self.inner.leader.borrow().clone().filter(Leader::is_valid)
    }

    /// One renewal attempt ended with `outcome` after `took`.
    pub fn renewal(&self, outcome: RenewalOutcome, took: Duration) {
        self.inner.metrics.lease.renewal(outcome, took);
    }

    /// A renewal began `late` after it was due.
    pub fn renewal_late(&self, late: Duration) {
        self.inner.metrics.lease.renewal_late(late);
    }

    /// The killer was armed (`true`) or disarmed.
    pub fn killer_armed(&self, armed: bool) {
        self.inner.metrics.lease.killer_armed.set(i64::from(armed));
    }

    /// A service instance runs until the returned guard is dropped.
    #[must_use = "the instance counts as running until the guard is dropped"]
    pub fn service_running(&self) -> RunningGuard {
        RunningGuard::new(&self.inner.metrics.services_running)
    }

    /// Service `service` was loaded (at start or into the live directory): its series exist
    /// from now on, at 0; those of incoming HTTP only if it `serves_http`.
    pub fn service_loaded(&self, service: &str, serves_http: bool) {
        self.inner.metrics.service_loaded(service);
        if serves_http {
            self.inner.metrics.incoming.service_loaded(service);
        } else {
            self.inner.metrics.incoming.service_removed(service);
        }
    }

    /// Whether the latest version of `service` (its file or its registry source) was
    /// `rejected` (`vvm_service_rejected`, SPEC §13): 1 from a rejection until a version
    /// loads or the service is gone.
    pub fn service_rejected(&self, service: &str, rejected: bool) {
        self.inner.metrics.service_rejected(service, rejected);
    }

    /// Service `service` was removed from the services directory: its series go.
    pub fn service_removed(&self, service: &str) {
        self.inner.metrics.service_removed(service);
    }

    /// Service `service` is now in `state` (`vvm_service_state`).
    pub fn service_state(&self, service: &str, state: crate::lease_value::ServiceState) {
        self.inner.metrics.service_state(service, state.name());
    }

    /// The services whose version here differs from another host's (a standby's from the
    /// leader's, a spread member's from another member's) went from `was` to `now`
    /// (`vvm_service_differs_from_leader`, SPEC §13): 1 for each of `now`, 0 for each of `was`
    /// no longer among them.
    pub fn services_differ(&self, was: &[&str], now: &[&str]) {
        for service in was.iter().filter(|s| !now.contains(s)) {
            self.inner.metrics.service_differs(service, false);
        }
        for service in now {
            self.inner.metrics.service_differs(service, true);
        }
    }

    /// A run of `service` failed.
    pub fn service_failed(&self, service: &str) {
        self.inner.metrics.service_failed(service);
    }

    /// `service` is restarted after a failure.
    pub fn service_restarted(&self, service: &str) {
        self.inner.metrics.service_restarted(service);
    }

    /// A guest effect of `service` was refused past the lease deadline.
    pub fn effect_refused(&self, service: &str) {
        self.inner.metrics.effect_refused(service);
    }

    /// A key-value call of `service` was refused by `limit`.
    pub fn kv_limited(&self, service: &str, limit: KvLimit) {
        self.inner.metrics.kv.limited(service, limit);
    }

    /// A fire time of the scheduled service `service` came to `outcome` (ok, error, cut,
    /// skipped, missed).
    pub fn schedule_run(&self, service: &str, outcome: &str) {
        self.inner.metrics.schedule.run(service, outcome);
    }

    /// A run of `service` started `late` after its fire time and ran for `ran`.
    pub fn schedule_times(&self, service: &str, late: Duration, ran: Duration) {
        self.inner.metrics.schedule.times(service, late, ran);
    }

    /// A key-value write of `service` ended with `outcome`.
    pub fn kv_write(&self, service: &str, outcome: KvOutcome) {
        self.inner.metrics.kv.write(service, outcome);
    }

    /// A batch of guests' key-value writes was committed (or failed), as `report` says.
    pub fn kv_commit(&self, report: crate::store::BatchReport) {
        self.inner.metrics.commits.commit(report);
    }

    /// A request was forwarded to the holder at `target`, with `outcome`, the holder's
    /// response head back after `took` (SPEC §13).
    pub fn http_forwarded(&self, target: &str, outcome: &'static str, took: Duration) {
        self.inner.metrics.incoming.forwarded(target, outcome, took);
    }

    /// This host accepted a connection on `http-addr`.
    pub fn http_connection_accepted(&self) {
        self.inner.metrics.incoming.connection_accepted();
    }

    /// The series of HTTP service `service`, resolved once for its requests.
    pub fn http_service(&self, service: &str) -> ServiceHttpMetrics {
        self.inner.metrics.incoming.service(service)
    }

    /// `n` connections are open on `http-addr` now.
    pub fn http_connections_open(&self, n: usize) {
        self.inner.metrics.incoming.connections_open(n);
    }

    /// The host closed a connection on `http-addr` by one of its limits (`header-timeout`,
    /// `keep-alive-timeout`, `max-connections`).
    pub fn http_connection_closed(&self, limit: &'static str) {
        self.inner.metrics.incoming.connection_closed(limit);
    }

    /// The queue of `http-addr`'s shared socket holds `depth` connections (`None`: it could
    /// not be read; the gauge keeps its last figure).
    pub fn http_listen_queue(&self, depth: Option<u64>) {
        if let Some(depth) = depth {
            self.inner.metrics.incoming.queue(depth);
        }
    }

    /// An outgoing HTTP request of `service` ended with `outcome` after `took` (none: it was
    /// never sent).
    pub fn http_request(&self, service: &str, outcome: HttpOutcome, took: Option<Duration>) {
        self.inner.metrics.http.request(service, outcome, took);
    }

    /// An outgoing HTTP request of `service` was sent on a kept-alive connection (`reused`), or
    /// a new one.
    pub fn http_connection(&self, service: &str, reused: bool) {
        self.inner.metrics.http.connection(service, reused);
    }

    /// The Prometheus (`OpenMetrics`) text exposition of every metric, as of now.
    pub fn render(&self) -> String {
        let m = &self.inner.metrics;
        // The lease gauges are read from the leadership at scrape time.
        if let Some(last) = self.inner.leader.borrow().clone() {
            let labels = SlotLabels { slot: last.slot };
            let current = *self.inner.leading.borrow() && last.is_valid();
            m.lease.held.get_or_create(&labels).set(i64::from(current));
            let left = if current {
                last.deadline.time_left().unwrap_or_default()
            } else {
                Duration::ZERO
            };
            m.lease
                .time_left
                .get_or_create(&labels)
                .set(left.as_secs_f64());
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &m.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn the_leader_and_lease_gauges_follow_leadership_and_its_deadline() {
        let clock = ManualClock::default();
        let ops = Ops::new(Arc::new(clock.clone()));
        assert!(ops.leader().is_none());
        let (deadline_tx, deadline) = LeaseDeadline::manual(
            Arc::new(clock.clone()),
            clock.now().after(Duration::from_secs(16)),
        );
        ops.leading(2, 7, deadline);
        let leader = ops.leader().unwrap();
        assert_eq!((leader.slot, leader.term), (2, 7));
        let text = ops.render();
        for line in [
            "vvm_lease_held{slot=\"2\"} 1",
            "vvm_lease_term{slot=\"2\"} 7",
            "vvm_lease_time_left_seconds{slot=\"2\"} 16.0",
            "vvm_takeovers_total 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing in:\n{text}"
            );
        }
        // Lost: the deadline is pulled in to now, before the VVM has shut down.
        deadline_tx.send_replace(clock.now());
        assert!(ops.leader().is_none());
        assert!(ops.render().contains("vvm_lease_held{slot=\"2\"} 0"));
        ops.stepped_down();
        assert!(ops.leader().is_none());
        let text = ops.render();
        assert!(text.contains("vvm_lease_held{slot=\"2\"} 0"), "{text}");
        assert!(
            text.contains("vvm_lease_time_left_seconds{slot=\"2\"} 0.0"),
            "{text}"
        );
    }

    #[test]
    fn running_services_are_counted_while_their_guard_lives() {
        let ops = Ops::new(Arc::new(ManualClock::default()));
        let a = ops.service_running();
        let b = ops.service_running();
        assert!(ops.render().contains("vvm_services_running 2"));
        drop(a);
        drop(b);
        assert!(ops.render().contains("vvm_services_running 0"));
    }
}
