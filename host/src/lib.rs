//! vvm-host runs WebAssembly service components only while it holds a leadership lease.
//!
//! The crate is laid out one module per concept of the specification:
//!
//! - [`clock`]: `CLOCK_BOOTTIME` readings for store expiry and the local lease deadline.
//! - [`store`]: the TTL store contract and its backends (memory, redb, etcd).
//! - [`keys`]: the store's key layout: every record vvm-host writes, by prefix.
//! - [`killer`]: the watchdog thread that ends the process if renewal stalls.
//! - [`log_output`]: stderr written without ever waiting for its reader.
//! - [`elections`]: acquire, renew and release leases; the local lease deadline.
//! - [`lease_value`]: a lease record's value: the holder and the services running under it.
//! - [`problem`]: the problem signal: a running VVM's first fatal error, reported once.
//! - [`services`]: what the lifecycle starts once a slot is held (the seam to the runtime).
//! - [`holder_lock`]: the crash lock: a standby learns from the kernel that a holder is gone.
//! - [`vvm`]: the lifecycle: provide, launch, leadership monitor, ordered shutdown.
//! - [`placement`]: which host runs which service: together on a slot, or spread by claims.
//! - [`runtime`]: the wasmtime host: components, sandboxes, fencing, supervision.
//! - [`serve`]: the serve loop: lead, stand by, campaign again after a problem, until stopped.
//! - [`ops`]: metrics, liveness and the operations endpoint (`/healthz`, `/leader`, `/metrics`).
//! - [`config`]: every default and bound, and the resolution of the settings.
//! - [`cli`]: the clap types and dispatch of `vvm-host serve`, `status` and `check`.

pub mod cli;
pub mod clock;
pub mod config;
pub mod elections;
pub mod holder_lock;
pub mod keys;
pub mod killer;
pub mod lease_value;
pub mod log_output;
pub mod ops;
pub mod placement;
pub mod problem;
pub mod runtime;
pub mod serve;
pub mod services;
pub mod store;
pub mod vvm;
