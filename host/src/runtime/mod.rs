//! The wasmtime host (SPEC §6, §7): components, sandboxes, fencing at the boundary,
//! supervision, and the triggers that call guests (a service's `run`, a schedule's fire
//! times). The interfaces guests call are `crate::interfaces`', which this links; incoming
//! HTTP is there too, and this implements its seam (`http`).
//!
//! - `config`: [`RuntimeConfig`] (directories, limits, grants, restart policy).
//! - `stacks`: the fiber stacks of the on-demand allocator, mapped once and reused.
//! - `handles`: how many handles an instance may hold, and the guests' share of the
//!   process's file descriptors.
//! - `engine`: the wasmtime [`wasmtime::Engine`], the epoch ticker thread, and the `Runtime`
//!   (engine, ticker, configuration) every supervisor shares.
//! - `state`: `Host`, the state of one store: WASI, the memory cap, the interfaces' share.
//! - `fence`: no guest effect past the lease deadline: the per-call hook, fenced streams.
//! - `imports`: the linker, and a fresh sandboxed store per instance.
//! - `cache`: the on-disk compile cache: fetch or compile, write safely, prune.
//! - `component`: discovery, compilation (through the cache), world classification.
//! - `progress`: compile progress, a bar on a terminal or a log line per service.
//! - `restart`: a failed service's backoff schedule, and its state as `status`, `/metrics` and
//!   the log see it.
//! - `supervisor`: runs, restarts and stops one service; hands the lease over where asked.
//! - `scheduler`: runs a scheduled service once per fire time, recorded first in the store.
//! - `debounce`: when a changed service file is complete and must be looked at (pure).
//! - `live_dir`: the live services directory: a watcher keeping the catalogue of loaded
//!   services in step with the directory's files.
//! - `http`: incoming HTTP's seam (`crate::interfaces::incoming::Sandboxes`): a store per
//!   request, the limits, the catalogue's HTTP services and their routes.
//! - `reconcile`: the running services of one leadership, following the catalogue.
//! - `wasm_services`: [`WasmServices`], the [`crate::services::Services`] the lifecycle starts.
//! - `check`: what `vvm-host check` says of a directory, with what to change.
//!
//! Dependencies point one way, in this order (each uses only modules before it): `config`,
//! `handles`, `stacks`, `engine`, `state`, `fence`, `imports`, `cache`, `component`,
//! `progress`, `restart`, `supervisor`, `scheduler`, `debounce`, `live_dir`, `http`,
//! `reconcile`, `wasm_services`, `check`.

mod cache;
mod check;
mod component;
mod config;
mod debounce;
mod engine;
mod fence;
mod handles;
mod http;
mod imports;
mod live_dir;
mod progress;
mod reconcile;
mod restart;
mod scheduler;
mod stacks;
mod state;
mod supervisor;
mod wasm_services;

pub use check::{CheckReport, Note, check, help};
pub use component::{LoadError, LoadErrorKind, LoadStats, ServiceKind};
pub use config::{DirGrant, Grants, RestartPolicy, RuntimeConfig};
pub use handles::raise_descriptor_limit;
pub use wasm_services::WasmServices;

use std::path::PathBuf;

/// Why the runtime as a whole could not be set up (one bad service file is a [`LoadError`]
/// instead, and the others still load).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The services directory could not be read.
    #[error("services directory {path}: {source}")]
    ServicesDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The compile cache directory could not be created.
    #[error("compile cache directory {path}: {source}")]
    CacheDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// wasmtime rejected the engine configuration or the host's bindings.
    #[error("wasmtime setup: {0:#}")]
    Engine(#[source] wasmtime::Error),
    /// The epoch ticker thread could not be started.
    #[error("epoch ticker thread: {0}")]
    Ticker(#[source] std::io::Error),
    /// The services directory cannot be followed for changes.
    #[error("watching services directory {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// notify's error, or the thread's that could not be started.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `vvm-host check FILE` on a file that is no service: not named `NAME.wasm`, or named
    /// as a temporary file is (see the services directory in SPEC §6).
    #[error("{}: not a service file: a service is a file named NAME.wasm", path.display())]
    NotAService {
        /// The file.
        path: PathBuf,
    },
    /// Told to stop before every service was loaded ([`WasmServices::load_until`]).
    #[error("stopped before every service was loaded")]
    Stopped,
}
