//! Example service: every tick (1 s) logs the term of the lease it runs under and adds one to
//! `count` in the term-fenced key-value store (`wasi:keyvalue`), until the host tells it to
//! stop. It greets with `greeting` from its configuration (`wasi:config`,
//! `[service.rust-ticker.config]` in vvm.toml).

use std::time::Duration;

use vvm_guest::wasi::config::store as config;
use vvm_guest::wasi::keyvalue::{atomics, store};
use vvm_guest::{Guest, info, lease, sleep_or_stop, tick};

struct Ticker;

/// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
/// `over a limit: ...`, or access denied.
fn error_text(e: store::Error) -> String {
    match e {
        store::Error::Other(text) => text,
        other => format!("{other:?}"),
    }
}

impl Guest for Ticker {
    fn run() -> Result<(), String> {
        let lease = lease::current();
        let stopping = lease::stopping();
        let period = tick(Duration::from_secs(1));
        let greeting = config::get("greeting")
            .ok()
            .flatten()
            .unwrap_or_else(|| "hello".to_owned());
        info(&format!(
            "ticker started: slot {} holder {} term {}; {greeting}",
            lease.slot, lease.holder, lease.term
        ));
        // The keys only: a value may be a secret the operator gave it.
        let keys: Vec<String> = config::get_all()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        info(&format!("config keys: [{}]", keys.join(", ")));
        // "" is the service's own namespace.
        let bucket = store::open("").map_err(error_text)?;
        let mut n: u64 = 0;
        loop {
            n += 1;
            let count = atomics::increment(&bucket, "count", 1).map_err(error_text)?;
            info(&format!("tick {n}: term {} count {count}", lease.term));
            if sleep_or_stop(&stopping, period) {
                info("ticker stopping");
                return Ok(());
            }
        }
    }
}

vvm_guest::export!(Ticker);
