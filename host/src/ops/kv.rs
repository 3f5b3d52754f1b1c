//! The guests' key-value series of `/metrics` (SPEC §8, §10): writes by outcome and
//! refusals by limit, per service (`vvm_kv_writes_total{service,outcome}`,
//! `vvm_kv_limit_refusals_total{service,limit}`); and the group commit's transactions
//! (`vvm_kv_commits_total{outcome}`, `vvm_kv_commit_writes`, `vvm_kv_commit_duration_seconds`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::BatchReport;

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
struct KvLabels {
    service: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    service: String,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

/// The guests' key-value writes and refusals, per service, registered once.
#[derive(Debug)]
pub(super) struct KvMetrics {
    writes: Family<KvLabels, Counter>,
    limits: Family<LimitLabels, Counter>,
}

impl KvMetrics {
    pub fn new(r: &mut Registry) -> Self {
        let metrics = Self {
            writes: Family::default(),
            limits: Family::default(),
        };
        r.register(
            "vvm_kv_writes",
            "Guest key-value writes, by outcome (ok, limited, stale, error)",
            metrics.writes.clone(),
        );
        r.register(
            "vvm_kv_limit_refusals",
            "Guest key-value calls refused by a limit, by limit",
            metrics.limits.clone(),
        );
        metrics
    }

    /// Service `service` was loaded: its series exist from now on, at 0.
    pub fn service_loaded(&self, service: &str) {
        for outcome in KvOutcome::ALL {
            drop(self.writes.get_or_create(&write_labels(service, outcome)));
        }
        for limit in KvLimit::ALL {
            drop(self.limits.get_or_create(&limit_labels(service, limit)));
        }
    }

    /// Service `service` was removed: its series go with it.
    pub fn service_removed(&self, service: &str) {
        for outcome in KvOutcome::ALL {
            let _ = self.writes.remove(&write_labels(service, outcome));
        }
        for limit in KvLimit::ALL {
            let _ = self.limits.remove(&limit_labels(service, limit));
        }
    }

    pub fn limited(&self, service: &str, limit: KvLimit) {
        self.limits
            .get_or_create(&limit_labels(service, limit))
            .inc();
    }

    pub fn write(&self, service: &str, outcome: KvOutcome) {
        self.writes
            .get_or_create(&write_labels(service, outcome))
            .inc();
    }
}

fn write_labels(service: &str, outcome: KvOutcome) -> KvLabels {
    KvLabels {
        service: service.to_owned(),
        outcome: outcome.label(),
    }
}

fn limit_labels(service: &str, limit: KvLimit) -> LimitLabels {
    LimitLabels {
        service: service.to_owned(),
        limit: limit.label(),
    }
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
