//! Tests that run part of themselves in a child process (a fresh process to exit, or to count
//! threads and descriptors in): re-running the test binary, and reading what the child printed.

use std::process::{Command, Output};

use tokio::time::Instant;

/// The environment variable that tells a re-executed test binary to run a child's part.
pub const CHILD_ENV: &str = "VVM_LIFECYCLE_CHILD";

/// True in the child process started by [`run_child`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// Re-runs this test binary with only `test` (exact name), as a child with [`CHILD_ENV`] set.
/// Returns its output and the wall-clock moment its exit was seen.
pub fn run_child(test: &str) -> (Output, std::time::SystemTime) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    (output, std::time::SystemTime::now())
}

/// Milliseconds since the Unix epoch of a wall-clock moment (shared by parent and child).
pub fn unix_ms(t: std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// The wall-clock moment of a tokio instant in the past (real time, not paused).
pub fn wall_of(at: Instant) -> std::time::SystemTime {
    std::time::SystemTime::now() - at.elapsed()
}

/// The word after `name=` in `stdout` (libtest may print it mid-line).
pub fn reported_str(stdout: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(stdout);
    let prefix = format!("{name}=");
    let at = text.find(&prefix)? + prefix.len();
    text[at..].split_whitespace().next().map(str::to_owned)
}

/// The number after `name=` in `stdout`.
pub fn reported(stdout: &[u8], name: &str) -> Option<u128> {
    reported_str(stdout, name)?.parse().ok()
}
