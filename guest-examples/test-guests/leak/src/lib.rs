//! Test guest: takes host handles and never gives one back, as a guest that forgets to close
//! what it opens. With `/data` granted it opens that directory again and again (each open a
//! host file descriptor); without, it makes timers (host memory only). When an open fails it
//! keeps what it holds and waits to be told to stop: a host without a bound is left with the
//! descriptors it did not take.

use std::time::Duration;

use vvm_guest::wasi::clocks::monotonic_clock;
use vvm_guest::wasi::filesystem::preopens;
use vvm_guest::wasi::filesystem::types::{DescriptorFlags, OpenFlags, PathFlags};
use vvm_guest::{Guest, info, lease, sleep_or_stop};

struct Leak;

impl Guest for Leak {
    fn run() -> Result<(), String> {
        let stopping = lease::stopping();
        let data = preopens::get_directories()
            .into_iter()
            .find(|(_, path)| path == "/data")
            .map(|(dir, _)| dir);
        info(if data.is_some() {
            "leaking files"
        } else {
            "leaking timers"
        });
        let mut taken: u64 = 0;
        loop {
            match &data {
                Some(dir) => {
                    let opened = dir.open_at(
                        PathFlags::empty(),
                        ".",
                        OpenFlags::DIRECTORY,
                        DescriptorFlags::READ,
                    );
                    match opened {
                        Ok(file) => std::mem::forget(file),
                        Err(e) => {
                            info(&format!("holding {taken} handles: open failed: {e:?}"));
                            break;
                        }
                    }
                }
                None => std::mem::forget(monotonic_clock::subscribe_duration(1_000_000_000)),
            }
            taken += 1;
        }
        while !sleep_or_stop(&stopping, Duration::from_secs(1)) {}
        Ok(())
    }
}

vvm_guest::export!(Leak);
