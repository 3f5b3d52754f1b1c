//! vvm-host runs WebAssembly service components only while it holds a leadership lease.
//!
//! The crate is laid out one module per concept of the specification:
//!
//! - [`cli`]: the clap types and dispatch of `vvm-host serve`, `status`, `check`, `kv` and
//!   `new`.
//! - [`server`]: the process's loop: lead, stand by, campaign again after a problem, until
//!   stopped.
//! - [`placement`]: which host runs which service: together on a slot, or spread by claims.
//! - [`vvm`]: the lifecycle: provide, launch, leadership monitor, ordered shutdown.
//! - [`runtime`]: the wasmtime host: components, sandboxes, fencing, supervision, and the
//!   triggers that call guests (`run`, schedules).
//! - [`interfaces`]: the interfaces guests call, one host implementation per WIT package
//!   (`vvm:host`, `wasi:keyvalue`, `wasi:config`, outgoing `wasi:http`), and incoming HTTP,
//!   against the seam the runtime gives them (the service's environment, the per-call fence,
//!   a store per request).
//! - [`services`]: what the lifecycle starts once a slot is held (the seam to the runtime).
//! - [`elections`]: acquire, renew and release leases.
//! - [`problem`]: the problem signal: a running VVM's first fatal error, reported once.
//! - [`config`]: every default and bound, and the resolution of the settings.
//! - [`ops`]: metrics, liveness and the operations endpoint (`/healthz`, `/leader`, `/metrics`).
//! - [`killer`]: the watchdog thread that ends the process if renewal stalls.
//! - [`holder`]: who a host is (a holder value per process run), whether it can take over,
//!   and its crash lock, by which a standby learns from the kernel that a holder is gone.
//! - [`store`]: the TTL store contract and its backends (memory, redb, etcd).
//! - [`sources`]: components from an OCI registry: references, pull, push, and the
//!   content-addressed cache of what was pulled.
//! - [`lease`]: the local lease deadline, and the tempo of `L` (renew, attempt, retry, release).
//! - [`lease_value`]: a lease record's value: the holder and the services under the lease.
//! - [`schedule`]: a scheduled service's cron expression, its fire times, and which of them a
//!   leader starts now (pure: the runtime records and runs them).
//! - [`keys`]: the store's key layout: every record vvm-host writes, by prefix.
//! - [`log_output`]: stderr written without ever waiting for its reader; one-line errors.
//! - [`fs`]: reading a file an operator named: regular, unblocking, bounded.
//! - [`clock`]: `CLOCK_BOOTTIME` readings for store expiry and the local lease deadline.
//!
//! Layers, top first: a module uses only modules of the layers below its own, never one of
//! its own layer or above (`tests/structure.rs` checks it, and that no files import each
//! other in a circle). `runtime/mod.rs` orders the runtime's own files the same way.
//! 1. `cli`
//! 2. `server`
//! 3. `placement`
//! 4. `vvm`, `runtime`
//! 5. `interfaces`
//! 6. `services`, `elections`
//! 7. `problem`, `config`
//! 8. `ops`, `killer`, `holder`
//! 9. `store`, `sources`
//! 10. `lease`, `lease_value`, `schedule`, `keys`, `log_output`, `fs`
//! 11. `clock`

pub mod cli;
pub mod clock;
pub mod config;
pub mod elections;
pub mod fs;
pub mod holder;
pub mod interfaces;
pub mod keys;
pub mod killer;
pub mod lease;
pub mod lease_value;
pub mod log_output;
pub mod ops;
pub mod placement;
pub mod problem;
pub mod runtime;
pub mod schedule;
pub mod server;
pub mod services;
pub mod sources;
pub mod store;
pub mod vvm;
