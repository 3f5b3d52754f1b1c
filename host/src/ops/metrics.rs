//! The Prometheus metrics of `/metrics` (SPEC §8, Operations), with `prometheus-client`.
//!
//! Hot paths touch only atomics: the renewal loop's counters are resolved to their label once,
//! at start, and its latency histogram is a set of atomic buckets ([`LatencyHistogram`]), since
//! prometheus-client's own histogram takes a lock that a scrape holds while it encodes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use super::commits::CommitMetrics;
use super::incoming::IncomingMetrics;
use super::outgoing::HttpMetrics;

/// How one renewal attempt ended (`vvm_lease_renewals_total{outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewalOutcome {
    /// The record was rewritten: the lease goes on.
    Ok,
    /// The record changed or expired: the lease is lost.
    Lost,
    /// The store failed or did not answer in time (retried, up to three attempts).
    Error,
}

impl RenewalOutcome {
    /// The outcome of a compare-and-swap answer.
    pub fn of<E>(answer: &Result<bool, E>) -> Self {
        match answer {
            Ok(true) => Self::Ok,
            Ok(false) => Self::Lost,
            Err(_) => Self::Error,
        }
    }
}

/// How a guest's key-value write ended (`vvm_kv_writes_total{service,outcome}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvOutcome {
    /// Written.
    Ok,
    /// Over a size or rate limit.
    Limited,
    /// Rejected: the writer's term is stale.
    Stale,
    /// The store failed.
    Error,
}

impl KvOutcome {
    /// Every outcome, for series that exist at 0 from a service's load.
    const ALL: [Self; 4] = [Self::Ok, Self::Limited, Self::Stale, Self::Error];

    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Limited => "limited",
            Self::Stale => "stale",
            Self::Error => "error",
        }
    }
}

/// Which key-value limit refused a guest's call (`vvm_kv_limit_refusals_total{service,limit}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLimit {
    /// A key longer than `max-key-bytes`.
    KeySize,
    /// A value larger than `max-value-bytes`.
    ValueSize,
    /// A namespace over `max-keys`.
    Keys,
    /// A namespace over `max-bytes`.
    Bytes,
    /// Over `writes-per-second`.
    Rate,
    /// A batch over the store's largest batch.
    Batch,
}

impl KvLimit {
    /// Every limit, for series that exist at 0 from a service's load.
    const ALL: [Self; 6] = [
        Self::KeySize,
        Self::ValueSize,
        Self::Keys,
        Self::Bytes,
        Self::Rate,
        Self::Batch,
    ];

    /// The limit's label, as the settings name it.
    pub fn label(self) -> &'static str {
        match self {
            Self::KeySize => "max-key-bytes",
            Self::ValueSize => "max-value-bytes",
            Self::Keys => "max-keys",
            Self::Bytes => "max-bytes",
            Self::Rate => "writes-per-second",
            Self::Batch => "batch",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SlotLabels {
    pub slot: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KvLabels {
    service: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    service: String,
    limit: &'static str,
}

/// Every metric of the process, registered once.
#[derive(Debug)]
pub(super) struct Metrics {
    pub registry: Registry,
    pub lease_held: Family<SlotLabels, Gauge>,
    pub lease_term: Family<SlotLabels, Gauge>,
    pub lease_time_left: Family<SlotLabels, Gauge<f64, AtomicU64>>,
    renewals: [Counter; 3],
    pub renewal_latency: LatencyHistogram,
    pub takeovers: Counter,
    pub killer_armed: Gauge,
    pub services_running: Gauge,
    service_restarts: Family<ServiceLabels, Counter>,
    service_failures: Family<ServiceLabels, Counter>,
    effects_refused: Family<ServiceLabels, Counter>,
    kv_writes: Family<KvLabels, Counter>,
    kv_limits: Family<LimitLabels, Counter>,
    service_state: Family<StateLabels, Gauge>,
    pub http: HttpMetrics,
    /// Requests served to HTTP services.
    pub incoming: IncomingMetrics,
    /// The group commit of guests' key-value writes.
    pub commits: CommitMetrics,
}

impl Metrics {
    pub fn new() -> Self {
        let renewals = Family::<OutcomeLabels, Counter>::default();
        let mut registry = Registry::default();
        let http = HttpMetrics::new(&mut registry);
        let incoming = IncomingMetrics::new(&mut registry);
        let commits = CommitMetrics::new(&mut registry);
        let mut metrics = Self {
            registry,
            lease_held: Family::default(),
            lease_term: Family::default(),
            lease_time_left: Family::default(),
            renewals: ["ok", "lost", "error"]
                .map(|outcome| renewals.get_or_create(&OutcomeLabels { outcome }).clone()),
            renewal_latency: LatencyHistogram::default(),
            takeovers: Counter::default(),
            killer_armed: Gauge::default(),
            services_running: Gauge::default(),
            service_restarts: Family::default(),
            service_failures: Family::default(),
            effects_refused: Family::default(),
            kv_writes: Family::default(),
            kv_limits: Family::default(),
            service_state: Family::default(),
            http,
            incoming,
            commits,
        };
        metrics.register_lease(renewals);
        metrics.register_services();
        metrics
    }

    /// Registers the lease's metrics (`renewals` is the family the renewal counters are of).
    fn register_lease(&mut self, renewals: Family<OutcomeLabels, Counter>) {
        let r = &mut self.registry;
        r.register(
            "vvm_lease_held",
            "1 while this host holds the slot's lease, else 0",
            self.lease_held.clone(),
        );
        r.register(
            "vvm_lease_term",
            "The term (fencing token) of the slot's lease this host holds or last held",
            self.lease_term.clone(),
        );
        r.register(
            "vvm_lease_time_left_seconds",
            "Time left until the local lease deadline (start of the last write + 0.8 L)",
            self.lease_time_left.clone(),
        );
        r.register(
            "vvm_lease_renewals",
            "Lease renewal attempts, by outcome (ok, lost, error)",
            renewals,
        );
        r.register(
            "vvm_lease_renewal_duration_seconds",
            "How long each renewal attempt took",
            self.renewal_latency.clone(),
        );
        r.register(
            "vvm_takeovers",
            "Slots this host acquired (each starts a leadership)",
            self.takeovers.clone(),
        );
        r.register(
            "vvm_killer_armed",
            "1 while the killer is armed (a lease may be held), else 0",
            self.killer_armed.clone(),
        );
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
            "vvm_kv_writes",
            "Guest key-value writes, by outcome (ok, limited, stale, error)",
            self.kv_writes.clone(),
        );
        r.register(
            "vvm_kv_limit_refusals",
            "Guest key-value calls refused by a limit, by limit",
            self.kv_limits.clone(),
        );
        r.register(
            "vvm_service_state",
            "1 for the state each loaded service is in (running, backing-off, stopped), else 0",
            self.service_state.clone(),
        );
    }

    /// Service `service` was loaded: every per-service series exists from now on, at 0 (so
    /// that `increase()` sees the first event), and its state is `stopped` until it runs.
    pub fn service_loaded(&self, service: &str) {
        self.each_series(
            service,
            |counter| drop(counter.get_or_create(&counter_labels(service))),
            |kv| drop(self.kv_writes.get_or_create(&kv)),
        );
        for limit in KvLimit::ALL {
            drop(self.kv_limits.get_or_create(&limit_labels(service, limit)));
        }
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
        self.each_series(
            service,
            |counter| {
                let _ = counter.remove(&counter_labels(service));
            },
            |kv| {
                let _ = self.kv_writes.remove(&kv);
            },
        );
        for limit in KvLimit::ALL {
            let _ = self.kv_limits.remove(&limit_labels(service, limit));
        }
        self.http.service_removed(service);
        self.incoming.service_removed(service);
        for state in SERVICE_STATES {
            self.service_state.remove(&StateLabels {
                service: service.to_owned(),
                state,
            });
        }
    }

    /// Calls `counter` with each per-service counter family, and `kv` with each label set of
    /// `service`'s key-value writes.
    fn each_series(
        &self,
        service: &str,
        counter: impl Fn(&Family<ServiceLabels, Counter>),
        kv: impl Fn(KvLabels),
    ) {
        for family in [
            &self.service_restarts,
            &self.service_failures,
            &self.effects_refused,
        ] {
            counter(family);
        }
        for outcome in KvOutcome::ALL {
            kv(KvLabels {
                service: service.to_owned(),
                outcome: outcome.label(),
            });
        }
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

    pub fn renewal(&self, outcome: RenewalOutcome, took: Duration) {
        let i = match outcome {
            RenewalOutcome::Ok => 0,
            RenewalOutcome::Lost => 1,
            RenewalOutcome::Error => 2,
        };
        self.renewals[i].inc();
        self.renewal_latency.observe(took);
    }

    pub fn service_failed(&self, service: &str) {
        inc(&self.service_failures, service);
    }

    pub fn service_restarted(&self, service: &str) {
        inc(&self.service_restarts, service);
    }

    pub fn effect_refused(&self, service: &str) {
        inc(&self.effects_refused, service);
    }

    pub fn kv_limited(&self, service: &str, limit: KvLimit) {
        self.kv_limits
            .get_or_create(&limit_labels(service, limit))
            .inc();
    }

    pub fn kv_write(&self, service: &str, outcome: KvOutcome) {
        self.kv_writes
            .get_or_create(&KvLabels {
                service: service.to_owned(),
                outcome: outcome.label(),
            })
            .inc();
    }
}

fn limit_labels(service: &str, limit: KvLimit) -> LimitLabels {
    LimitLabels {
        service: service.to_owned(),
        limit: limit.label(),
    }
}

fn counter_labels(service: &str) -> ServiceLabels {
    ServiceLabels {
        service: service.to_owned(),
    }
}

fn inc(family: &Family<ServiceLabels, Counter>, service: &str) {
    family
        .get_or_create(&ServiceLabels {
            service: service.to_owned(),
        })
        .inc();
}

/// Upper bounds of the renewal latency buckets, seconds: 100 µs to ~6.6 s by 4×, then +Inf.
/// A redb commit takes ~0.5 ms, an etcd round trip ~1.5 ms; one attempt waits at most L/10.
const LATENCY_BOUNDS: [f64; 9] = [
    0.0001, 0.0004, 0.0016, 0.0064, 0.0256, 0.1024, 0.4096, 1.6384, 6.5536,
];

/// A histogram of durations on atomics only: observing never waits for a scrape.
#[derive(Clone, Debug, Default)]
pub(super) struct LatencyHistogram {
    inner: std::sync::Arc<LatencyInner>,
}

#[derive(Debug, Default)]
struct LatencyInner {
    /// Per bucket (the last one is +Inf), not cumulative.
    buckets: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl LatencyHistogram {
    fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = LATENCY_BOUNDS
            .iter()
            .position(|bound| secs <= *bound)
            .unwrap_or(LATENCY_BOUNDS.len());
        self.inner.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.inner.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.inner.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        // prometheus-client writes the last bound, infinity, as `+Inf`.
        let buckets: Vec<(f64, u64)> = LATENCY_BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(inner.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        // Count as the sum of the buckets read: a concurrent observation never makes the
        // exposition inconsistent.
        let count = buckets.iter().map(|(_, n)| n).sum();
        #[allow(clippy::cast_precision_loss)]
        let sum = inner.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &Metrics) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry).unwrap();
        out
    }

    #[test]
    fn renewals_are_counted_by_outcome_and_timed_in_buckets() {
        let m = Metrics::new();
        m.renewal(RenewalOutcome::Ok, Duration::from_micros(300));
        m.renewal(RenewalOutcome::Ok, Duration::from_millis(2));
        m.renewal(RenewalOutcome::Error, Duration::from_mins(1));
        let out = text(&m);
        for line in [
            "vvm_lease_renewals_total{outcome=\"ok\"} 2",
            "vvm_lease_renewals_total{outcome=\"lost\"} 0",
            "vvm_lease_renewals_total{outcome=\"error\"} 1",
            "vvm_lease_renewal_duration_seconds_count 3",
            "vvm_lease_renewal_duration_seconds_bucket{le=\"0.0001\"} 0",
            "vvm_lease_renewal_duration_seconds_bucket{le=\"0.0004\"} 1",
            "vvm_lease_renewal_duration_seconds_bucket{le=\"0.0064\"} 2",
            "vvm_lease_renewal_duration_seconds_bucket{le=\"6.5536\"} 2",
            "vvm_lease_renewal_duration_seconds_bucket{le=\"+Inf\"} 3",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing in:\n{out}");
        }
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
        m.kv_write("svc", KvOutcome::Ok);
        m.kv_write("svc", KvOutcome::Stale);
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
