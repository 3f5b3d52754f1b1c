//! {{name}}: a vvm-host service (world `service` of `wit/host.wit`). The host calls `run` each
//! time it becomes leader. It greets with `greeting` from its configuration (`wasi:config`),
//! then adds one to `count` in its key-value store (`wasi:keyvalue`) every second and logs it,
//! until the lease's stop signal comes.

wit_bindgen::generate!({
    world: "service",
    path: "wit",
    generate_all,
});

use vvm::host::lease;
use vvm::host::log::{Level, log};
use wasi::clocks::monotonic_clock;
use wasi::config::store as config;
use wasi::io::poll::{Pollable, poll};
use wasi::keyvalue::{atomics, store};

/// How often it counts: one second.
const PERIOD_NS: u64 = 1_000_000_000;

struct Service;

impl Guest for Service {
    fn run() -> Result<(), String> {
        let lease = lease::current();
        let stopping = lease::stopping();
        let greeting = config::get("greeting")
            .ok()
            .flatten()
            .unwrap_or_else(|| "hello".to_owned());
        log(Level::Info, &format!("started, term {}: {greeting}", lease.term));
        // "" is the service's own bucket. Every write is fenced by the lease term: once
        // another host leads, it fails, and returning the error ends this run.
        let bucket = store::open("").map_err(error_text)?;
        loop {
            let count = atomics::increment(&bucket, "count", 1).map_err(error_text)?;
            log(Level::Info, &format!("count {count}"));
            if sleep_or_stop(&stopping) {
                log(Level::Info, "stopping");
                return Ok(());
            }
        }
    }
}

/// Waits one period, or until the host says stop; true if the service must stop.
fn sleep_or_stop(stopping: &Pollable) -> bool {
    let timer = monotonic_clock::subscribe_duration(PERIOD_NS);
    poll(&[stopping, &timer]).contains(&0)
}

/// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
/// `over a limit: ...`, or access denied.
fn error_text(e: store::Error) -> String {
    match e {
        store::Error::Other(text) => text,
        other => format!("{other:?}"),
    }
}

export!(Service);
