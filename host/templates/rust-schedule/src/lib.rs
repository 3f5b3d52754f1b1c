//! {{name}}: a scheduled vvm-host service (world `schedule` of `wit/schedule.wit`), a
//! `wasi:cli` command. With `schedule = "<cron>"` under `[service.{{name}}]` in the host's
//! `vvm.toml`, the host runs it once per fire time, on the leader, in a fresh instance, with
//! the fire time in `VVM_FIRE_TIME` (Unix seconds). Each run adds one to `runs` in its
//! key-value store (`wasi:keyvalue`, a write fenced by the lease term), prints
//! `report for fire time <t> (term <T>): run <n>` and returns: the run's outcome is `ok`. A
//! run that fails prints why on stderr and ends with an error: the run's outcome is `error`.
//!
//! It is a library that exports `wasi:cli/run` through wit-bindgen, the world's export, where
//! a binary's `main` would: one `generate!` gives it both the run and the imports.

wit_bindgen::generate!({
    world: "schedule",
    path: "wit",
    generate_all,
});

use exports::wasi::cli::run::Guest;
use vvm::host::lease;
use wasi::keyvalue::{atomics, store};

struct Schedule;

impl Guest for Schedule {
    fn run() -> Result<(), ()> {
        match report() {
            Ok(line) => {
                println!("{line}");
                Ok(())
            }
            Err(e) => {
                eprintln!("{{name}}: {e}");
                Err(())
            }
        }
    }
}

/// One run's work: what it prints.
fn report() -> Result<String, String> {
    let fire = fire_time()?;
    let term = lease::current().term;
    // "" is the service's own bucket. The write fails once another host leads
    // (`stale term ...`), and then so does the run.
    let bucket = store::open("").map_err(error_text)?;
    let runs = atomics::increment(&bucket, "runs", 1).map_err(error_text)?;
    Ok(format!("report for fire time {fire} (term {term}): run {runs}"))
}

/// The fire time this run is for: `VVM_FIRE_TIME`, Unix seconds.
fn fire_time() -> Result<i64, String> {
    let text = std::env::var("VVM_FIRE_TIME").map_err(|_| {
        "VVM_FIRE_TIME is not set: give [service.{{name}}] a schedule in vvm.toml".to_owned()
    })?;
    text.trim()
        .parse()
        .map_err(|e| format!("VVM_FIRE_TIME={text:?} is not Unix seconds: {e}"))
}

/// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
/// `over a limit: ...`, or access denied.
fn error_text(e: store::Error) -> String {
    match e {
        store::Error::Other(text) => text,
        other => format!("{other:?}"),
    }
}

export!(Schedule);
