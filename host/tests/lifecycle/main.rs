//! The lifecycle suites: elections (SPEC §4) and the VVM (SPEC §5) through the public API, on
//! paused tokio time, with the doubles of `common/`. One test binary, so every double and
//! helper is used where it is compiled.

// Test code throughout (helpers too, which clippy's allow-unwrap-in-tests does not cover):
// a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;
mod elections;
mod vvm;
