//! Test guest: logs once, then spins forever without ever looking at the stop signal.

use std::hint::black_box;

use vvm_guest::{Guest, info};

struct Spin;

impl Guest for Spin {
    fn run() -> Result<(), String> {
        info("spinning");
        let mut n: u64 = 0;
        loop {
            n = black_box(n.wrapping_add(1));
        }
    }
}

vvm_guest::export!(Spin);
