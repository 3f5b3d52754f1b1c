//! Example service: logs the term of the lease it runs under every tick (1 s) until the host
//! tells it to stop. It greets with `greeting` from its configuration (`wasi:config`,
//! `[service.rust-ticker.config]` in vvm.toml).

use std::time::Duration;

use vvm_guest::wasi::config::store as config;
use vvm_guest::{Guest, info, lease, sleep_or_stop, tick};

struct Ticker;

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
        let mut n: u64 = 0;
        loop {
            n += 1;
            info(&format!("tick {n}: term {}", lease.term));
            if sleep_or_stop(&stopping, period) {
                info("ticker stopping");
                return Ok(());
            }
        }
    }
}

vvm_guest::export!(Ticker);
