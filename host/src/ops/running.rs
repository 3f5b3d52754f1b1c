//! [`RunningGuard`]: one running thing (a service instance, a request in flight) counted in
//! a gauge for as long as the guard lives (SPEC §8). Its own file so that `ops` and each
//! concern's series (`incoming`) share it without importing each other.

use prometheus_client::metrics::gauge::Gauge;

/// Counts one running service instance (or request in flight) until dropped.
#[derive(Debug)]
pub struct RunningGuard {
    gauge: Gauge,
}

impl RunningGuard {
    /// Counts one more in `gauge` until the guard is dropped.
    pub(super) fn new(gauge: &Gauge) -> RunningGuard {
        gauge.inc();
        RunningGuard {
            gauge: gauge.clone(),
        }
    }
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}
