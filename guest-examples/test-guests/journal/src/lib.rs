//! Test guest: every `TICK_MS` (default 2 ms) appends a line `TERM SEQ` to `/data/journal`,
//! and every 25th line also logs `journal TERM SEQ` to stdout and writes `seq` to the fenced
//! key-value store, until the host says stop. Three effects, each of which a host whose lease
//! may have passed on must not have: the terms in the file and in the log never go down.

use std::io::Write;
use std::time::Duration;

use vvm_guest::{Guest, kv, lease, sleep_or_stop, tick};

struct Journal;

impl Guest for Journal {
    fn run() -> Result<(), String> {
        let term = lease::current().term;
        let stopping = lease::stopping();
        let period = tick(Duration::from_millis(2));
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open("/data/journal")
            .map_err(|e| format!("open /data/journal: {e}"))?;
        let mut seq: u64 = 0;
        loop {
            seq += 1;
            // One write per line: lines of two hosts never interleave within a line.
            file.write_all(format!("{term} {seq}\n").as_bytes())
                .map_err(|e| format!("append: {e}"))?;
            if seq.is_multiple_of(25) {
                println!("journal {term} {seq}");
                kv::set("seq", seq.to_string().as_bytes())?;
            }
            if sleep_or_stop(&stopping, period) {
                return Ok(());
            }
        }
    }
}

vvm_guest::export!(Journal);
