//! Test guest: a Spin cron component as spin-trigger-cron's `guest-rust` sample and
//! `cron-rust` template make one (`#[cron_component]` from its SDK, vendored in
//! ../spin-cron-sdk), built with plain `cargo build --target wasm32-wasip2` and run by
//! vvm-host unchanged as a scheduled service (issue 40). It exports the bare top-level
//! function `handle-cron-event` of world `fermyon:spin-cron@2.0.0`'s `spin-cron`.
//! It needs a directory granted as `/data`. Each call:
//! - appends `<metadata.timestamp> spin\n` to `/data/fires` (created if absent) with one
//!   `write_all` on a file opened for append; if that fails, it fails with
//!   `cannot append to /data/fires: <error>`;
//! - prints `[<metadata.timestamp>] cron fired` on stdout;
//! - fails with `/data/fail exists` if the file `/data/fail` exists after the append (for
//!   outcome tests), else returns `Ok(())`.
//!
//! A failure returns `Err(Error::Other(text))` from the handler, and the SDK's macro, as
//! upstream has it, prints that error on stderr and wraps its `Display` once more: the host
//! gets `error::other("Error::Other(\"<text>\")")`, e.g. `Error::Other("/data/fail exists")`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use spin_cron_sdk::{cron_component, Error, Metadata};

#[cron_component]
async fn handle_cron_event(metadata: Metadata) -> Result<(), Error> {
    let line = format!("{} spin\n", metadata.timestamp);
    OpenOptions::new()
        .append(true)
        .create(true)
        .open("/data/fires")
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .map_err(|e| Error::Other(format!("cannot append to /data/fires: {e}")))?;
    println!("[{}] cron fired", metadata.timestamp);
    if Path::new("/data/fail").exists() {
        return Err(Error::Other("/data/fail exists".to_owned()));
    }
    Ok(())
}
