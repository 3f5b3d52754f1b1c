//! Rust bindings for the `vvm:host/service` world (see `wit/host.wit`: `vvm:host`, WASI 0.2,
//! `wasi:keyvalue`, `wasi:config` and `wasi:http` under `wasi`), plus small helpers shared by
//! the Rust guests ([`http`]: blocking outgoing requests). A guest implements [`Guest`] and
//! calls [`export!`].

/// Generated from `wit/host.wit` (and the WASI packages it uses).
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "service",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
        default_bindings_module: "vvm_guest::bindings",
    });
}

pub mod http;

use std::time::Duration;

pub use bindings::vvm::host::{kv, lease, log};
pub use bindings::{Guest, export, wasi};

/// Writes one log line at info level.
pub fn info(message: &str) {
    log::log(log::Level::Info, message);
}

/// Waits for `period` or until the host says stop; returns true if the service must stop.
pub fn sleep_or_stop(stopping: &wasi::io::poll::Pollable, period: Duration) -> bool {
    let nanos = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
    let timer = wasi::clocks::monotonic_clock::subscribe_duration(nanos);
    let ready = wasi::io::poll::poll(&[stopping, &timer]);
    ready.contains(&0)
}

/// The tick period: the `TICK_MS` environment variable if the operator granted it, else
/// `default`.
pub fn tick(default: Duration) -> Duration {
    std::env::var("TICK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, Duration::from_millis)
}
