//! The metrics of the group commit of guests' key-value writes (SPEC §10):
//! `vvm_kv_commits_total{outcome}` (applied, failed), `vvm_kv_commit_writes` (writes per
//! commit) and `vvm_kv_commit_duration_seconds` (one transaction, durable).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::BatchReport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The group commit's metrics, registered once.
#[derive(Debug)]
pub(super) struct CommitMetrics {
    commits: Family<OutcomeLabels, Counter>,
    writes: Histogram,
    duration: Histogram,
}

impl CommitMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            commits: Family::default(),
            // 1 to 1024 writes by 2×, then +Inf.
            writes: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            // 100 µs to ~26 s by 4×, then +Inf.
            duration: Histogram::new(exponential_buckets(0.0001, 4.0, 10)),
        };
        for outcome in ["applied", "failed"] {
            drop(metrics.commits.get_or_create(&OutcomeLabels { outcome }));
        }
        registry.register(
            "vvm_kv_commits",
            "Transactions of guests' key-value writes, by outcome (applied, failed)",
            metrics.commits.clone(),
        );
        registry.register(
            "vvm_kv_commit_writes",
            "Guests' key-value writes per transaction (the group commit's batch)",
            metrics.writes.clone(),
        );
        registry.register(
            "vvm_kv_commit_duration_seconds",
            "How long each transaction of guests' key-value writes took, until durable",
            metrics.duration.clone(),
        );
        metrics
    }

    /// One batch of writes was committed, or failed.
    pub fn commit(&self, report: BatchReport) {
        let outcome = if report.applied { "applied" } else { "failed" };
        self.commits.get_or_create(&OutcomeLabels { outcome }).inc();
        self.writes.observe(report.writes as f64);
        self.duration.observe(report.took.as_secs_f64());
    }
}
