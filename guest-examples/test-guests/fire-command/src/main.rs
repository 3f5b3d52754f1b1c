//! Test guest: a plain WASI command (`fn main`, so it exports `wasi:cli/run`) for a scheduled
//! service (issue 40). vvm-host runs it once per fire time, the fire time in `VVM_FIRE_TIME`
//! (Unix seconds, decimal). It needs a directory granted as `/data`. Each run:
//!
//! 1. reads `VVM_FIRE_TIME` (and `VVM_SLEEP_MS`, if set); if `VVM_FIRE_TIME` is missing or not
//!    a decimal integer, or `VVM_SLEEP_MS` is set but not a decimal integer, it writes a line
//!    on stderr and exits with code 2, appending nothing;
//! 2. appends `<fire time> <term>\n` to `/data/fires` (created if absent) with one `write_all`
//!    on a file opened for append, so lines of overlapping runs never interleave; `<term>` is
//!    `VVM_TERM` if set and not empty, else `-`. If that fails: a line on stderr, exit 1;
//! 3. prints `fired <fire time>` on stdout;
//! 4. sleeps `VVM_SLEEP_MS` milliseconds, if set (for overlap tests);
//! 5. exits 1, with `fire-command: /data/fail exists` on stderr, if the file `/data/fail`
//!    existed just after the append (for outcome tests); else returns from `main` (exit 0).
//!
//! WASI 0.2's `wasi:cli/exit` reports only success or failure, so the host sees codes 1 and
//! 2 alike, as an error.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::process::exit;
use std::time::Duration;

fn main() {
    let fire = match std::env::var("VVM_FIRE_TIME") {
        Ok(v) => match v.trim().parse::<i64>() {
            Ok(t) => t,
            Err(e) => usage(&format!("VVM_FIRE_TIME={v:?} is not Unix seconds: {e}")),
        },
        Err(_) => usage("VVM_FIRE_TIME is not set (run me as a scheduled service)"),
    };
    let sleep = match std::env::var("VVM_SLEEP_MS") {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(ms) => Some(Duration::from_millis(ms)),
            Err(e) => usage(&format!("VVM_SLEEP_MS={v:?} is not milliseconds: {e}")),
        },
        Err(_) => None,
    };
    let term = std::env::var("VVM_TERM")
        .ok()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "-".to_owned());

    let line = format!("{fire} {term}\n");
    let appended = OpenOptions::new()
        .append(true)
        .create(true)
        .open("/data/fires")
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = appended {
        eprintln!("fire-command: cannot append to /data/fires: {e}");
        exit(1);
    }
    let fail = Path::new("/data/fail").exists();

    println!("fired {fire}");
    if let Some(d) = sleep {
        std::thread::sleep(d);
    }
    if fail {
        eprintln!("fire-command: /data/fail exists");
        exit(1);
    }
}

fn usage(message: &str) -> ! {
    eprintln!("fire-command: {message}");
    exit(2);
}
