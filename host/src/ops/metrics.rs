//! The Prometheus metrics of `/metrics` (SPEC §8, Operations), with `prometheus-client`: one
//! registry, the series of each concern registered by its own file (`lease`, `kv`, `outgoing`,
//! `incoming`), and here the services' own (running, restarts, failures, effects refused,
//! state). Every report is an atomic update: a scrape never holds what a report needs.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::incoming::IncomingMetrics;
use super::kv::{CommitMetrics, KvMetrics};
use super::lease::LeaseMetrics;
use super::outgoing::HttpMetrics;
use super::schedule::ScheduleMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    service: String,
    state: &'static str,
}

/// The states of `vvm_service_state`, as [`crate::lease_value::ServiceState::name`] gives them.
const SERVICE_STATES: [&str; 3] = ["running", "backing-off", "stopped"];

/// Every metric of the process, registered once.
#[derive(Debug)]
pub(super) struct Metrics {
    pub registry: Registry,
    pub lease: LeaseMetrics,
    pub services_running: Gauge,
    service_restarts: Family<ServiceLabels, Counter>,
    service_failures: Family<ServiceLabels, Counter>,
    effects_refused: Family<ServiceLabels, Counter>,
    service_state: Family<StateLabels, Gauge>,
    service_differs: Family<ServiceLabels, Gauge>,
    service_rejected: Family<ServiceLabels, Gauge>,
    /// Guests' key-value writes and refusals, per service.
    pub kv: KvMetrics,
    /// The group commit of guests' key-value writes.
    pub commits: CommitMetrics,
    /// Outgoing HTTP requests.
    pub http: HttpMetrics,
    /// Requests served to HTTP services.
    pub incoming: IncomingMetrics,
    /// Scheduled services' runs.
    pub schedule: ScheduleMetrics,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let lease = LeaseMetrics::new(&mut registry);
        let kv = KvMetrics::new(&mut registry);
        let commits = CommitMetrics::new(&mut registry);
        let http = HttpMetrics::new(&mut registry);
        let incoming = IncomingMetrics::new(&mut registry);
        let schedule = ScheduleMetrics::new(&mut registry);
        let mut metrics = Self {
            registry,
            lease,
            services_running: Gauge::default(),
            service_restarts: Family::default(),
            service_failures: Family::default(),
            effects_refused: Family::default(),
            service_state: Family::default(),
            service_differs: Family::default(),
            service_rejected: Family::default(),
            kv,
            commits,
            http,
            incoming,
            schedule,
        };
        metrics.register_services();
        metrics
    }

    /// Registers the services' metrics.
    fn register_services(&mut self) {
        let r = &mut self.registry;
        r.register(
            "vvm_services_running",
            "Service instances running now",
            self.services_running.clone(),
        );
        r.register(
            "vvm_service_restarts",
            "Restarts of a failed service",
            self.service_restarts.clone(),
        );
        r.register(
            "vvm_service_failures",
            "Runs of a service that failed (error, trap, exit code, cannot start)",
            self.service_failures.clone(),
        );
        r.register(
            "vvm_guest_effects_refused",
            "Guest effects refused because the local lease deadline had passed",
            self.effects_refused.clone(),
        );
        r.register(
            "vvm_service_state",
            "1 for the state each loaded service is in (running, backing-off, stopped), else 0",
            self.service_state.clone(),
        );
        r.register(
            "vvm_service_differs_from_leader",
            "1 while this standby's version of a service differs from the one the leader runs \
             (or only one of them has it), or under spread placement from some other \
             member's, else 0",
            self.service_differs.clone(),
        );
        r.register(
            "vvm_service_rejected",
            "1 while the latest version of a service (its file, or its registry source) was \
             rejected: unreadable, not a component, or not pulled; an older one may run on",
            self.service_rejected.clone(),
        );
    }

    /// Whether the latest version of `service` was `rejected`.
    pub fn service_rejected(&self, service: &str, rejected: bool) {
        self.service_rejected
            .get_or_create(&counter_labels(service))
            .set(i64::from(rejected));
    }

    /// Service `service` was loaded: every per-service series exists from now on, at 0 (so
    /// that `increase()` sees the first event), and its state is `stopped` until it runs.
    pub fn service_loaded(&self, service: &str) {
        for family in self.counters() {
            drop(family.get_or_create(&counter_labels(service)));
        }
        self.kv.service_loaded(service);
        self.http.service_loaded(service);
        let stopped = StateLabels {
            service: service.to_owned(),
            state: "stopped",
        };
        // A reload of a known service keeps the state it is in.
        if self.service_state.get(&stopped).is_none() {
            self.service_state(service, "stopped");
        }
    }

    /// Service `service` was removed: its series go with it.
    pub fn service_removed(&self, service: &str) {
        for family in self.counters() {
            let _ = family.remove(&counter_labels(service));
        }
        self.kv.service_removed(service);
        self.http.service_removed(service);
        self.incoming.service_removed(service);
        self.service_differs.remove(&counter_labels(service));
        self.service_rejected.remove(&counter_labels(service));
        for state in SERVICE_STATES {
            self.service_state.remove(&StateLabels {
                service: service.to_owned(),
                state,
            });
        }
    }

    /// The per-service counter families.
    fn counters(&self) -> [&Family<ServiceLabels, Counter>; 3] {
        [
            &self.service_restarts,
            &self.service_failures,
            &self.effects_refused,
        ]
    }

    /// Service `service` is now in `state` (one of [`SERVICE_STATES`]).
    pub fn service_state(&self, service: &str, state: &'static str) {
        for s in SERVICE_STATES {
            self.service_state
                .get_or_create(&StateLabels {
                    service: service.to_owned(),
                    state: s,
                })
                .set(i64::from(s == state));
        }
    }

    /// Whether this standby's version of `service` `differs` from the leader's.
    pub fn service_differs(&self, service: &str, differs: bool) {
        self.service_differs
            .get_or_create(&counter_labels(service))
            .set(i64::from(differs));
    }

    pub fn service_failed(&self, service: &str) {
        self.service_failures
            .get_or_create(&counter_labels(service))
            .inc();
    }

    pub fn service_restarted(&self, service: &str) {
        self.service_restarts
            .get_or_create(&counter_labels(service))
            .inc();
    }

    pub fn effect_refused(&self, service: &str) {
        self.effects_refused
            .get_or_create(&counter_labels(service))
            .inc();
    }
}

fn counter_labels(service: &str) -> ServiceLabels {
    ServiceLabels {
        service: service.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::kv::KvOutcome;
    use super::*;

    fn text(m: &Metrics) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry).unwrap();
        out
    }

    /// Issue 28: a series that appears only with its first event hides that event from
    /// `increase()`; every per-service series is there at 0 from the service's load, and goes
    /// with its removal.
    #[test]
    fn per_service_series_exist_at_zero_from_the_load_and_go_with_the_service() {
        let m = Metrics::new();
        m.service_loaded("svc");
        let out = text(&m);
        for line in [
            "vvm_service_failures_total{service=\"svc\"} 0",
            "vvm_service_restarts_total{service=\"svc\"} 0",
            "vvm_guest_effects_refused_total{service=\"svc\"} 0",
            "vvm_kv_writes_total{service=\"svc\",outcome=\"ok\"} 0",
            "vvm_kv_writes_total{service=\"svc\",outcome=\"limited\"} 0",
            "vvm_kv_writes_total{service=\"svc\",outcome=\"stale\"} 0",
            "vvm_kv_writes_total{service=\"svc\",outcome=\"error\"} 0",
            "vvm_service_state{service=\"svc\",state=\"stopped\"} 1",
            "vvm_service_state{service=\"svc\",state=\"running\"} 0",
            "vvm_service_state{service=\"svc\",state=\"backing-off\"} 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
        m.service_state("svc", "backing-off");
        m.service_restarted("svc");
        // A reload (a new version) keeps the counts and the state.
        m.service_loaded("svc");
        let out = text(&m);
        for line in [
            "vvm_service_restarts_total{service=\"svc\"} 1",
            "vvm_service_state{service=\"svc\",state=\"backing-off\"} 1",
            "vvm_service_state{service=\"svc\",state=\"stopped\"} 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
        m.service_removed("svc");
        assert!(!text(&m).contains("svc"), "{}", text(&m));
    }

    #[test]
    fn per_service_counters_carry_the_service_label() {
        let m = Metrics::new();
        m.service_failed("svc");
        m.service_restarted("svc");
        m.effect_refused("svc");
        m.kv.write("svc", KvOutcome::Ok);
        m.kv.write("svc", KvOutcome::Stale);
        let out = text(&m);
        for line in [
            "vvm_service_failures_total{service=\"svc\"} 1",
            "vvm_service_restarts_total{service=\"svc\"} 1",
            "vvm_guest_effects_refused_total{service=\"svc\"} 1",
            "vvm_kv_writes_total{service=\"svc\",outcome=\"ok\"} 1",
            "vvm_kv_writes_total{service=\"svc\",outcome=\"stale\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
    }
}
