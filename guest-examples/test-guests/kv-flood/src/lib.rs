//! Test guest: calls `kv.set` as fast as it can until the host says stop, and logs every
//! 10 000th attempt with how many writes were refused by the host's limits.

use vvm_guest::{Guest, info, kv, lease};

struct Flood;

impl Guest for Flood {
    fn run() -> Result<(), String> {
        let stopping = lease::stopping();
        let (mut attempts, mut refused) = (0u64, 0u64);
        while !stopping.ready() {
            attempts += 1;
            if kv::set("n", attempts.to_string().as_bytes()).is_err() {
                refused += 1;
            }
            if attempts % 10_000 == 0 {
                info(&format!("flood: {attempts} attempts, {refused} refused"));
            }
        }
        Ok(())
    }
}

vvm_guest::export!(Flood);
