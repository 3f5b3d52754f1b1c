//! The metrics of the requests served to HTTP services (SPEC §8, §10):
//! `vvm_http_incoming_requests_total{service,class}`, `vvm_http_incoming_in_flight{service}`
//! and `vvm_http_incoming_request_duration_seconds{service}` (until the response head); and
//! of `http-addr`'s socket: `vvm_http_incoming_connections_total` (accepted by this host),
//! `vvm_http_connections_open`, `vvm_http_connections_closed_total{reason}` (closed by a
//! limit: `header-timeout`, `keep-alive-timeout`, `max-connections`) and
//! `vvm_http_listen_queue` (waiting in the machine's shared queue); and of the instances that
//! serve them: `vvm_http_instances_created_total{service}`,
//! `vvm_http_instance_reuses_total{service}` (requests served by an instance kept from an
//! earlier one), `vvm_http_instances_idle{service}` and `vvm_http_instance_requests{service}`
//! (how many each served in its life); and of forwarding:
//! `vvm_http_forwarded_requests_total{target,outcome}` and
//! `vvm_http_forward_duration_seconds{target}`.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::outgoing::{DurationFamily, ServiceLabels, duration_histogram};
use super::running::RunningGuard;

/// Each class a served request is counted in: its response's status class, or `aborted`
/// (the connection was cut before a response head: the lease deadline passed).
const CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "aborted"];

/// Each limit by which the host closes a connection.
const LIMITS: [&str; 3] = ["header-timeout", "keep-alive-timeout", "max-connections"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardLabels {
    target: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    target: String,
}

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
    created: Family<ServiceLabels, Counter>,
    reused: Family<ServiceLabels, Counter>,
    served: Family<ServiceLabels, Histogram, fn() -> Histogram>,
    idle: Family<ServiceLabels, Gauge>,
    open: Gauge,
    closed: Family<ClosedLabels, Counter>,
    queue: Gauge,
    forwarded: Family<ForwardLabels, Counter>,
    forward_duration: Family<TargetLabels, Histogram, fn() -> Histogram>,
}

impl IncomingMetrics {
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self {
            requests: Family::default(),
            in_flight: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            connections: Counter::default(),
            created: Family::default(),
            reused: Family::default(),
            served: Family::new_with_constructor(requests_histogram),
            idle: Family::default(),
            open: Gauge::default(),
            closed: Family::default(),
            queue: Gauge::default(),
            forwarded: Family::default(),
            forward_duration: Family::new_with_constructor(duration_histogram),
        };
        for reason in LIMITS {
            drop(metrics.closed.get_or_create(&ClosedLabels { reason }));
        }
        registry.register(
            "vvm_http_instances_created",
            "Instances of an HTTP service made to serve requests",
            metrics.created.clone(),
        );
        registry.register(
            "vvm_http_instance_reuses",
            "Requests of an HTTP service served by an instance kept from an earlier request",
            metrics.reused.clone(),
        );
        registry.register(
            "vvm_http_instances_idle",
            "Instances of an HTTP service waiting for their next request",
            metrics.idle.clone(),
        );
        registry.register(
            "vvm_http_instance_requests",
            "How many requests each instance of an HTTP service served in its life",
            metrics.served.clone(),
        );
        registry.register(
            "vvm_http_connections_open",
            "Connections open on http-addr now (at most max-connections)",
            metrics.open.clone(),
        );
        registry.register(
            "vvm_http_connections_closed",
            "Connections the host closed by a limit: header-timeout, keep-alive-timeout, or \
             max-connections (at the cap, the one waiting longest for a head makes room)",
            metrics.closed.clone(),
        );
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
            "vvm_http_forwarded_requests",
            "Requests forwarded to the host holding their service, by its address and outcome \
             (answered; unserved: it does not hold the service now; unreachable; failed; timeout)",
            metrics.forwarded.clone(),
        );
        registry.register(
            "vvm_http_forward_duration_seconds",
            "Time from sending a forwarded request to the holder's response head",
            metrics.forward_duration.clone(),
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

    /// A request was forwarded to `target`, with `outcome`, its head back after `took`.
    pub fn forwarded(&self, target: &str, outcome: &'static str, took: Duration) {
        let target = target.to_owned();
        self.forward_duration
            .get_or_create(&TargetLabels {
                target: target.clone(),
            })
            .observe(took.as_secs_f64());
        self.forwarded
            .get_or_create(&ForwardLabels { target, outcome })
            .inc();
    }

    /// This host accepted a connection on `http-addr`.
    pub fn connection_accepted(&self) {
        self.connections.inc();
    }

    /// The series of HTTP service `service`, resolved once (a request touches them without
    /// a lookup).
    pub fn service(&self, service: &str) -> ServiceHttpMetrics {
        let labels = ServiceLabels::of(service);
        ServiceHttpMetrics {
            requests: CLASSES.map(|class| {
                self.requests
                    .get_or_create(&RequestLabels {
                        service: service.to_owned(),
                        class,
                    })
                    .clone()
            }),
            duration: self.duration.get_or_create(&labels).clone(),
            in_flight: self.in_flight.get_or_create(&labels).clone(),
            created: self.created.get_or_create(&labels).clone(),
            reused: self.reused.get_or_create(&labels).clone(),
            served: self.served.get_or_create(&labels).clone(),
            idle: self.idle.get_or_create(&labels).clone(),
        }
    }

    /// `n` connections are open.
    pub fn connections_open(&self, n: usize) {
        self.open.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// A connection was closed by `limit`.
    pub fn connection_closed(&self, limit: &'static str) {
        self.closed
            .get_or_create(&ClosedLabels { reason: limit })
            .inc();
    }

    /// The shared queue holds `depth` connections.
    pub fn queue(&self, depth: u64) {
        self.queue.set(i64::try_from(depth).unwrap_or(i64::MAX));
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
        drop(self.created.get_or_create(&ServiceLabels::of(service)));
        drop(self.reused.get_or_create(&ServiceLabels::of(service)));
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
        let _ = self.created.remove(&ServiceLabels::of(service));
        let _ = self.reused.remove(&ServiceLabels::of(service));
        let _ = self.served.remove(&ServiceLabels::of(service));
        let _ = self.idle.remove(&ServiceLabels::of(service));
    }
}

/// 1 to 2^20 requests by 4×, then +Inf.
fn requests_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 4.0, 11))
}

/// The series of one HTTP service, resolved: what a request counts in.
#[derive(Clone, Debug)]
pub struct ServiceHttpMetrics {
    /// By [`CLASSES`].
    requests: [Counter; 6],
    duration: Histogram,
    in_flight: Gauge,
    created: Counter,
    reused: Counter,
    served: Histogram,
    /// Its instances waiting for their next request (the pool sets it).
    pub idle: Gauge,
}

impl ServiceHttpMetrics {
    /// A request was answered `status` (none: aborted) after `took`.
    pub fn request(&self, status: Option<u16>, took: Duration) {
        let class = match status {
            Some(s @ 100..=599) => usize::from(s / 100 - 1),
            Some(_) | None => CLASSES.len() - 1,
        };
        self.requests[class].inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// A request's handler runs until the guard is dropped.
    pub fn in_flight(&self) -> RunningGuard {
        RunningGuard::new(&self.in_flight)
    }

    /// A request was served by an instance `reused`, or a new one.
    pub fn instance(&self, reused: bool) {
        if reused { &self.reused } else { &self.created }.inc();
    }

    /// An instance that served `requests` was dropped.
    pub fn instance_retired(&self, requests: u32) {
        self.served.observe(f64::from(requests));
    }
}
