//! The metrics of guests' outgoing HTTP requests (SPEC §8, §10):
//! `vvm_http_outgoing_requests_total{service,outcome}`,
//! `vvm_http_outgoing_request_duration_seconds{service}` (until the response head) and
//! `vvm_http_outgoing_connections_total{service,reused}` (a kept-alive connection or a new one
//! for each request sent).

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionLabels {
    service: String,
    reused: &'static str,
}

impl ConnectionLabels {
    fn of(service: &str, reused: bool) -> Self {
        Self {
            service: service.to_owned(),
            reused: if reused { "true" } else { "false" },
        }
    }
}

/// The outgoing HTTP metrics, registered once.
#[derive(Debug)]
pub(super) struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: DurationFamily,
    connections: Family<ConnectionLabels, Counter>,
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
            connections: Family::default(),
        };
        registry.register(
            "vvm_http_outgoing_connections",
            "The connections guests' outgoing HTTP requests were sent on: reused (kept alive) \
             or new",
            metrics.connections.clone(),
        );
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

    /// A request of `service` was sent on a connection `reused`, or a new one.
    pub fn connection(&self, service: &str, reused: bool) {
        self.connections
            .get_or_create(&ConnectionLabels::of(service, reused))
            .inc();
    }

    /// Every series of `service` exists from its load, at 0.
    pub fn service_loaded(&self, service: &str) {
        for outcome in HttpOutcome::ALL {
            drop(self.requests.get_or_create(&labels(service, outcome)));
        }
        for reused in [false, true] {
            drop(
                self.connections
                    .get_or_create(&ConnectionLabels::of(service, reused)),
            );
        }
    }

    /// `service`'s series go with it.
    pub fn service_removed(&self, service: &str) {
        for outcome in HttpOutcome::ALL {
            let _ = self.requests.remove(&labels(service, outcome));
        }
        let _ = self.duration.remove(&ServiceLabels::of(service));
        for reused in [false, true] {
            let _ = self
                .connections
                .remove(&ConnectionLabels::of(service, reused));
        }
    }
}

fn labels(service: &str, outcome: HttpOutcome) -> RequestLabels {
    RequestLabels {
        service: service.to_owned(),
        outcome: outcome.label(),
    }
}
