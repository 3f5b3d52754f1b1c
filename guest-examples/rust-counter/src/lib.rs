//! Example service: every tick (1 s) reads `count` from the fenced key-value store, adds one
//! and writes it back. A write under a stale term fails, and the service returns that error.

use std::time::Duration;

use vvm_guest::{Guest, info, kv, lease, sleep_or_stop, tick};

struct Counter;

fn read_count() -> Result<u64, String> {
    match kv::get("count")? {
        None => Ok(0),
        Some(bytes) => {
            let text = String::from_utf8(bytes).map_err(|e| format!("count: {e}"))?;
            text.parse().map_err(|e| format!("count {text:?}: {e}"))
        }
    }
}

impl Guest for Counter {
    fn run() -> Result<(), String> {
        let stopping = lease::stopping();
        let period = tick(Duration::from_secs(1));
        loop {
            let next = read_count()? + 1;
            if let Err(e) = kv::set("count", next.to_string().as_bytes()) {
                vvm_guest::log::log(vvm_guest::log::Level::Error, &format!("set failed: {e}"));
                return Err(e);
            }
            info(&format!("count {next}"));
            if sleep_or_stop(&stopping, period) {
                return Ok(());
            }
        }
    }
}

vvm_guest::export!(Counter);
