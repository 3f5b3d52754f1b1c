//! The metrics of the requests served to HTTP services (SPEC §8, §10):
//! `vvm_http_incoming_requests_total{service,class}`, `vvm_http_incoming_in_flight{service}`
//! and `vvm_http_incoming_request_duration_seconds{service}` (until the response head); and
//! of `http-addr`'s socket: `vvm_http_incoming_connections_total` (accepted by this host)
//! and `vvm_http_listen_queue` (waiting in the machine's shared queue).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::outgoing::{DurationFamily, ServiceLabels, duration_histogram};

/// Each class a served request is counted in: its response's status class, or `aborted`
/// (the connection was cut before a response head: the lease deadline passed).
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "aborted"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    service: String,
    class: &'static str,
}

/// The incoming HTTP metrics, registered once.
#[derive(Debug)]
pub(super) struct IncomingMetrics {
    requests: Family<RequestLabels, Counter>,
    in_flight: Family<ServiceLabels, Gauge>,
    duration: DurationFamily,
    connections: Counter,
    queue: Gauge,
}

impl IncomingMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            in_flight: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            connections: Counter::default(),
            queue: Gauge::default(),
        };
        registry.register(
            "vvm_http_incoming_connections",
            "Connections this host accepted on http-addr (only a leader accepts)",
            metrics.connections.clone(),
        );
        registry.register(
            "vvm_http_listen_queue",
            "Connections waiting in http-addr's queue, shared by the hosts of this machine",
            metrics.queue.clone(),
        );
        registry.register(
            "vvm_http_incoming_requests",
            "Requests routed to an HTTP service, by status class (1xx..5xx, or aborted)",
            metrics.requests.clone(),
        );
        registry.register(
            "vvm_http_incoming_in_flight",
            "Requests of an HTTP service whose handler is running",
            metrics.in_flight.clone(),
        );
        registry.register(
            "vvm_http_incoming_request_duration_seconds",
            "Time from a request's admission to its response head",
            metrics.duration.clone(),
        );
        metrics
    }

    /// A request routed to `service` was answered `status` (none: aborted) after `took`.
    pub fn request(&self, service: &str, status: Option<u16>, took: Duration) {
        let class = match status {
            Some(s @ 100..=599) => CLASSES[usize::from(s / 100 - 1)],
            Some(_) | None => "aborted",
        };
        self.requests
            .get_or_create(&RequestLabels {
                service: service.to_owned(),
                class,
            })
            .inc();
        self.duration
            .get_or_create(&ServiceLabels::of(service))
            .observe(took.as_secs_f64());
    }

    /// This host accepted a connection on `http-addr`.
    pub fn connection_accepted(&self) {
        self.connections.inc();
    }

    /// The shared queue holds `depth` connections.
    pub fn queue(&self, depth: u64) {
        self.queue.set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// The in-flight gauge of `service`.
    pub fn in_flight(&self, service: &str) -> Gauge {
        self.in_flight
            .get_or_create(&ServiceLabels::of(service))
            .clone()
    }

    /// Every series of HTTP service `service` exists from its load, at 0.
    pub fn service_loaded(&self, service: &str) {
        for class in CLASSES {
            drop(self.requests.get_or_create(&RequestLabels {
                service: service.to_owned(),
                class,
            }));
        }
        drop(self.in_flight.get_or_create(&ServiceLabels::of(service)));
    }

    /// Every series of `service` goes with it.
    pub fn service_removed(&self, service: &str) {
        for class in CLASSES {
            let _ = self.requests.remove(&RequestLabels {
                service: service.to_owned(),
                class,
            });
        }
        let _ = self.in_flight.remove(&ServiceLabels::of(service));
        let _ = self.duration.remove(&ServiceLabels::of(service));
    }
}
