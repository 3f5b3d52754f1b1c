//! The lease's series of `/metrics` (SPEC §8): held, term, time left, renewals by outcome,
//! their latency and how late each began, takeovers, the killer.
//!
//! The renewal loop touches only atomics: its counters are resolved to their label once, at
//! start, and its latency histogram is a set of atomic buckets ([`LatencyHistogram`]), since
//! prometheus-client's own histogram takes a lock that a scrape holds while it encodes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct SlotLabels {
    pub slot: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The lease's metrics, registered once.
#[derive(Debug)]
pub(super) struct LeaseMetrics {
    pub held: Family<SlotLabels, Gauge>,
    pub term: Family<SlotLabels, Gauge>,
    pub time_left: Family<SlotLabels, Gauge<f64, AtomicU64>>,
    /// By [`RenewalOutcome`]: ok, lost, error.
    renewals: [Counter; 3],
    renewal_latency: LatencyHistogram,
    renewal_lateness: LatencyHistogram,
    pub takeovers: Counter,
    pub killer_armed: Gauge,
}

impl LeaseMetrics {
    pub fn new(r: &mut Registry) -> Self {
        let renewals = Family::<OutcomeLabels, Counter>::default();
        let metrics = Self {
            held: Family::default(),
            term: Family::default(),
            time_left: Family::default(),
            renewals: ["ok", "lost", "error"]
                .map(|outcome| renewals.get_or_create(&OutcomeLabels { outcome }).clone()),
            renewal_latency: LatencyHistogram::default(),
            renewal_lateness: LatencyHistogram::default(),
            takeovers: Counter::default(),
            killer_armed: Gauge::default(),
        };
        r.register(
            "vvm_lease_held",
            "1 while this host holds the slot's lease, else 0",
            metrics.held.clone(),
        );
        r.register(
            "vvm_lease_term",
            "The term (fencing token) of the slot's lease this host holds or last held",
            metrics.term.clone(),
        );
        r.register(
            "vvm_lease_time_left_seconds",
            "Time left until the local lease deadline (start of the last write + 0.8 L)",
            metrics.time_left.clone(),
        );
        r.register(
            "vvm_lease_renewals",
            "Lease renewal attempts, by outcome (ok, lost, error)",
            renewals,
        );
        r.register(
            "vvm_lease_renewal_duration_seconds",
            "How long each renewal attempt took",
            metrics.renewal_latency.clone(),
        );
        r.register(
            "vvm_lease_renewal_lateness_seconds",
            "How late each renewal began after it was due (a busy host's: the killer fires \
             when renewals are late by most of the lease)",
            metrics.renewal_lateness.clone(),
        );
        r.register(
            "vvm_takeovers",
            "Slots this host acquired (each starts a leadership)",
            metrics.takeovers.clone(),
        );
        r.register(
            "vvm_killer_armed",
            "1 while the killer is armed (a lease may be held), else 0",
            metrics.killer_armed.clone(),
        );
        metrics
    }

    /// One renewal attempt ended with `outcome` after `took`.
    pub fn renewal(&self, outcome: RenewalOutcome, took: Duration) {
        let i = match outcome {
            RenewalOutcome::Ok => 0,
            RenewalOutcome::Lost => 1,
            RenewalOutcome::Error => 2,
        };
        self.renewals[i].inc();
        self.renewal_latency.observe(took);
    }

    /// A renewal began `late` after it was due.
    pub fn renewal_late(&self, late: Duration) {
        self.renewal_lateness.observe(late);
    }
}

/// Upper bounds of the renewal latency buckets, seconds: 100 µs to ~6.6 s by 4×, then +Inf.
/// A redb commit takes ~0.5 ms, an etcd round trip ~1.5 ms; one attempt waits at most L/10.
const LATENCY_BOUNDS: [f64; 9] = [
    0.0001, 0.0004, 0.0016, 0.0064, 0.0256, 0.1024, 0.4096, 1.6384, 6.5536,
];

/// A histogram of durations on atomics only: observing never waits for a scrape.
#[derive(Clone, Debug, Default)]
struct LatencyHistogram {
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

    #[test]
    fn renewals_are_counted_by_outcome_and_timed_in_buckets() {
        let mut registry = Registry::default();
        let m = LeaseMetrics::new(&mut registry);
        m.renewal(RenewalOutcome::Ok, Duration::from_micros(300));
        m.renewal(RenewalOutcome::Ok, Duration::from_millis(2));
        m.renewal(RenewalOutcome::Error, Duration::from_mins(1));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
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
}
