//! Example service: every tick (1 s) adds one to `count` in the term-fenced key-value store
//! with `wasi:keyvalue` `increment`, atomically in the store. A write under a stale term
//! fails, and the service returns that error. It greets with `greeting` from its
//! configuration (`wasi:config`, `[service.rust-counter.config]` in vvm.toml).

use std::time::Duration;

use vvm_guest::wasi::config::store as config;
use vvm_guest::wasi::keyvalue::{atomics, store};
use vvm_guest::{Guest, info, lease, sleep_or_stop, tick};

struct Counter;

/// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
/// `over a limit: ...`, or access denied.
fn error_text(e: store::Error) -> String {
    match e {
        store::Error::Other(text) => text,
        other => format!("{other:?}"),
    }
}

impl Guest for Counter {
    fn run() -> Result<(), String> {
        let lease = lease::current();
        let stopping = lease::stopping();
        let period = tick(Duration::from_secs(1));
        let greeting = config::get("greeting")
            .ok()
            .flatten()
            .unwrap_or_else(|| "hello".to_owned());
        info(&format!("counter started: term {}; {greeting}", lease.term));
        // The keys only: a value may be a secret the operator gave it.
        let keys: Vec<String> = config::get_all()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        info(&format!("config keys: [{}]", keys.join(", ")));
        // "" is the service's own namespace.
        let bucket = store::open("").map_err(error_text)?;
        loop {
            let count = atomics::increment(&bucket, "count", 1).map_err(|e| {
                let e = error_text(e);
                vvm_guest::log::log(
                    vvm_guest::log::Level::Error,
                    &format!("increment failed: {e}"),
                );
                e
            })?;
            info(&format!("count {count}"));
            if sleep_or_stop(&stopping, period) {
                return Ok(());
            }
        }
    }
}

vvm_guest::export!(Counter);
