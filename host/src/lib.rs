//! vvm-host runs WebAssembly service components only while it holds a leadership lease.
//!
//! The crate is laid out one module per concept of the specification:
//!
//! - [`clock`]: `CLOCK_BOOTTIME` readings for store expiry and the local lease deadline.
//! - [`store`]: the TTL store contract and its backends (memory, redb, etcd).
//! - [`killer`]: the watchdog thread that ends the process if renewal stalls.
//! - [`elections`]: acquire, renew and release leases; the local lease deadline.
//! - [`services`]: what the lifecycle starts once a slot is held (the seam to the runtime).
//! - [`holder_lock`]: the crash lock: a standby learns from the kernel that a holder is gone.
//! - [`vvm`]: the lifecycle: provide, launch, leadership monitor, problem, ordered shutdown.
//! - [`runtime`]: the wasmtime host: components, sandboxes, fencing, supervision.
//! - [`config`] and [`cli`]: `vvm-host serve`, `status` and `check`.

pub mod cli;
pub mod clock;
pub mod config;
pub mod elections;
pub mod holder_lock;
pub mod killer;
pub mod runtime;
pub mod services;
pub mod store;
pub mod vvm;
