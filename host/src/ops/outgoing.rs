//! The metrics of guests' outgoing HTTP requests (SPEC §8, §10):
//! `vvm_http_outgoing_requests_total{service,outcome}` and
//! `vvm_http_outgoing_request_duration_seconds{service}` (until the response head).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How a guest's outgoing HTTP request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpOutcome {
    /// The response head arrived.
    Ok,
    /// Not in the service's allow-list, or to a guarded address: never sent.
    Denied,
    /// Dropped because the lease deadline passed.
    Fenced,
    /// Refused, reset, a TLS or protocol error.
    Error,
    /// The connect or first-byte timeout passed.
    Timeout,
}

impl HttpOutcome {
    const ALL: [Self; 5] = [
        Self::Ok,
        Self::Denied,
        Self::Fenced,
        Self::Error,
        Self::Timeout,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Denied => "denied",
            Self::Fenced => "fenced",
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    service: String,
    outcome: &'static str,
}

/// A series per service.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ServiceLabels {
    pub service: String,
}

impl ServiceLabels {
    pub fn of(service: &str) -> Self {
        Self {
            service: service.to_owned(),
        }
    }
}

/// A duration histogram per service.
pub(super) type DurationFamily = Family<ServiceLabels, Histogram, fn() -> Histogram>;

/// The outgoing HTTP metrics, registered once.
#[derive(Debug)]
pub(super) struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: DurationFamily,
}

/// 1 ms to ~65 s by 4×, then +Inf.
pub(super) fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 9))
}

impl HttpMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
        };
        registry.register(
            "vvm_http_outgoing_requests",
            "Guests' outgoing HTTP requests, by outcome (ok, denied, fenced, error, timeout)",
            metrics.requests.clone(),
        );
        registry.register(
            "vvm_http_outgoing_request_duration_seconds",
            "Time from a guest's outgoing HTTP request to its response head, or its failure",
            metrics.duration.clone(),
        );
        metrics
    }

    /// A request of `service` ended with `outcome` after `took` (none: never sent).
    pub fn request(&self, service: &str, outcome: HttpOutcome, took: Option<Duration>) {
        self.requests.get_or_create(&labels(service, outcome)).inc();
        if let Some(took) = took {
            self.duration
                .get_or_create(&ServiceLabels::of(service))
                .observe(took.as_secs_f64());
        }
    }

    /// Every series of `service` exists from its load, at 0.
    pub fn service_loaded(&self, service: &str) {
        for outcome in HttpOutcome::ALL {
            drop(self.requests.get_or_create(&labels(service, outcome)));
        }
    }

    /// `service`'s series go with it.
    pub fn service_removed(&self, service: &str) {
        for outcome in HttpOutcome::ALL {
            let _ = self.requests.remove(&labels(service, outcome));
        }
        let _ = self.duration.remove(&ServiceLabels::of(service));
    }
}

fn labels(service: &str, outcome: HttpOutcome) -> RequestLabels {
    RequestLabels {
        service: service.to_owned(),
        outcome: outcome.label(),
    }
}
