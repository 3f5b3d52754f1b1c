//! Test doubles and helpers of the lifecycle suites.

pub mod child;
pub mod journal;
pub mod services;
pub mod store;

/// A set of metrics and health of the test's own, on tokio's (possibly paused) clock.
pub fn ops() -> vvm_host::ops::Ops {
    vvm_host::ops::Ops::new(std::sync::Arc::new(vvm_host::clock::TokioClock::new()))
}
