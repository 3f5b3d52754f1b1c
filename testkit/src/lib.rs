//! Test support of vvm-host, shared by its unit tests, integration tests, end-to-end tests and
//! benchmarks: things outside the host that the tests start, drive and read.
//!
//! - [`etcd`]: a throw-away `etcd` process, or a 3-member cluster of them;
//! - [`registry`]: a throw-away OCI registry (`docker-registry`), anonymous or htpasswd;
//! - [`http`]: HTTP/1.1 servers, plain or TLS, that record the requests sent to them;
//! - [`load`]: load from `wrk`, and what it measured;
//! - [`host`]: a running `vvm-host` process and its JSON log lines;
//! - [`guests`]: the guest components of `guest-examples/`, built once per test binary;
//! - [`logs`]: the tracing events of the test process, captured;
//! - [`spread`]: spread placement as the hosts' logs show it;
//! - [`scratch`]: the directories the tests keep their files in, off the disk;
//! - [`slowloris`]: many connections that send a request head a byte at a time, for ever;
//! - [`fifo`]: a FIFO where a file is expected.
//!
//! # Why this crate never depends on vvm-host
//!
//! vvm-host lists this crate as a dev-dependency, so its own unit tests (`#[cfg(test)]` inside
//! the library) can use it too. Were this crate to depend on vvm-host, cargo would accept the
//! cycle but build a second copy of vvm-host for it, and the unit tests would see two sets of
//! vvm-host types that do not mix. So nothing here names a vvm-host type: the `vvm-host`
//! binary is driven as a process (its path is the caller's `env!("CARGO_BIN_EXE_vvm-host")`),
//! logs are read as text. Test doubles of vvm-host's traits live with the tests that use them
//! (`host/tests/lifecycle/common/`).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

pub mod etcd;
pub mod guests;
pub mod host;
pub mod http;
pub mod load;
pub mod logs;
pub mod registry;
pub mod scratch;
pub mod slowloris;
pub mod spread;

/// Makes a FIFO at `path`: what a test puts where the host expects a file, since opening one
/// waits for its other end unless told not to.
pub fn fifo(path: &std::path::Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}
