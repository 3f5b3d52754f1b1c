//! Example service: logs the term of the lease it runs under every tick (1 s) until the host
//! tells it to stop.

use std::time::Duration;

use vvm_guest::{Guest, info, lease, sleep_or_stop, tick};

struct Ticker;

impl Guest for Ticker {
    fn run() -> Result<(), String> {
        let lease = lease::current();
        let stopping = lease::stopping();
        let period = tick(Duration::from_secs(1));
        info(&format!(
            "ticker started: slot {} holder {} term {}",
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
