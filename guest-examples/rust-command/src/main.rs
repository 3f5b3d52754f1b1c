//! A plain WASI command: vvm-host runs its `main` as a service (SPEC §6). It cannot hear the
//! stop signal, so the host drops it at once on stop.

use std::time::Duration;

fn main() {
    let tick = std::env::var("TICK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(1), Duration::from_millis);
    println!("rust-command started");
    eprintln!("rust-command: a line on stderr");
    for i in 1.. {
        println!("rust-command line {i}");
        std::thread::sleep(tick);
    }
}
