//! The scheduled services' series of `/metrics` (SPEC §11): runs by outcome
//! (`vvm_schedule_runs_total{service,outcome}`: ok, error, cut, skipped, missed), how late a
//! run started after its fire time (`vvm_schedule_start_lateness_seconds{service}`), and how
//! long it ran (`vvm_schedule_run_duration_seconds{service}`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    service: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabels {
    service: String,
}

/// A family of histograms from 1 ms up, by service.
type Times = Family<ServiceLabels, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    // 1 ms to about 9 hours.
    Histogram::new(exponential_buckets(0.001, 4.0, 13))
}

/// The scheduled services' runs, registered once.
#[derive(Debug)]
pub(super) struct ScheduleMetrics {
    runs: Family<RunLabels, Counter>,
    lateness: Times,
    duration: Times,
}

impl ScheduleMetrics {
    pub fn new(r: &mut Registry) -> Self {
        let metrics = Self {
            runs: Family::default(),
            lateness: Family::new_with_constructor(histogram),
            duration: Family::new_with_constructor(histogram),
        };
        r.register(
            "vvm_schedule_runs",
            "Fire times of scheduled services, by outcome (ok, error, cut, skipped, missed)",
            metrics.runs.clone(),
        );
        r.register(
            "vvm_schedule_start_lateness_seconds",
            "How late a scheduled run started after its fire time",
            metrics.lateness.clone(),
        );
        r.register(
            "vvm_schedule_run_duration_seconds",
            "How long a scheduled run ran",
            metrics.duration.clone(),
        );
        metrics
    }

    /// A fire time of `service` came to `outcome`.
    pub fn run(&self, service: &str, outcome: &str) {
        self.runs
            .get_or_create(&RunLabels {
                service: service.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// A run of `service` started `late` after its fire time and ran for `ran`.
    pub fn times(&self, service: &str, late: Duration, ran: Duration) {
        let labels = ServiceLabels {
            service: service.to_owned(),
        };
        self.lateness
            .get_or_create(&labels)
            .observe(late.as_secs_f64());
        self.duration
            .get_or_create(&labels)
            .observe(ran.as_secs_f64());
    }
}
