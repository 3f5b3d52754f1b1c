//! The wasmtime engines the services share ([`Engines`]: one for WASI 0.2 components, one with
//! the concurrency WASI 0.3 needs, SPEC §12), the epoch ticker that lets the host interrupt any
//! guest (SPEC §6: CPU preemption), and the [`Runtime`] that bundles them with the
//! configuration for the supervisors.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime::component::Linker;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::stacks::{CACHED_STACKS, StackPool};
use super::state::Host;
use super::{Grants, RuntimeConfig, RuntimeError};
use crate::ops::Ops;

/// A wasmtime engine and the linker of the components compiled for it.
#[derive(Clone)]
pub(crate) struct Wasm {
    pub engine: Engine,
    pub linker: Linker<Host>,
}

/// The two engines a component may be compiled for (`imports::engines` builds them).
///
/// wasmtime's concurrency support (the component model's async: WASI 0.3's streams, futures
/// and async exports) is a setting of the engine, and with it every call into a component
/// runs through the store's event loop, a WASI 0.2 component's too: that cost the outgoing
/// HTTP benchmark (many host calls per request) 5-10 % of its rate (BENCHMARKS.md, "Outgoing
/// keep-alive"). So a component runs on the `plain` engine, without it, unless it needs it:
/// then on the `concurrent` one, whose linker has WASI 0.3 and Spin's 3.x interfaces besides
/// (`component::Compiler` chooses). A store is made on its component's engine.
#[derive(Clone)]
pub(crate) struct Engines {
    /// No concurrency support: WASI 0.2 and the host's own interfaces.
    pub plain: Wasm,
    /// With concurrency support: also WASI 0.3 and Spin's 3.x interfaces.
    pub concurrent: Wasm,
}

/// What every supervisor shares: the engines, their epoch ticker, the configuration, and where
/// metrics go.
pub(crate) struct Runtime {
    /// The configuration loaded with (its `grants` as at start; see [`Runtime::grants`]).
    pub config: RuntimeConfig,
    /// The engines the components were compiled for.
    pub engines: Engines,
    /// The grants of every service, replaced when the configuration file is re-read.
    grants: RwLock<Arc<HashMap<String, Grants>>>,
    /// Where the services' metrics go.
    pub ops: Ops,
    /// The descriptors the granted services' handles share: the open file limit at start, less
    /// the connections `http-addr` may hold.
    descriptors: u64,
    /// The most connections open on `http-addr` at once (`handles::connection_cap`).
    pub max_connections: u64,
    /// Stops ticking when the last supervisor is gone.
    _ticker: EpochTicker,
}

impl Runtime {
    /// Starts the epoch ticker of `engines` and bundles them with `config` and `ops`.
    ///
    /// # Errors
    /// When the ticker thread cannot be started.
    pub(crate) fn start(
        config: RuntimeConfig,
        engines: Engines,
        ops: Ops,
    ) -> Result<Self, RuntimeError> {
        let ticker = EpochTicker::start(
            vec![
                engines.plain.engine.clone(),
                engines.concurrent.engine.clone(),
            ],
            config.epoch_tick,
        )?;
        let descriptors = super::handles::descriptor_limit();
        let incoming = &config.incoming_http;
        let max_connections = if incoming.addr.is_some() {
            super::handles::connection_cap(incoming.max_connections, descriptors)
        } else {
            0
        };
        Ok(Self {
            grants: RwLock::new(Arc::new(config.grants.clone())),
            descriptors: descriptors.saturating_sub(max_connections),
            max_connections,
            config,
            engines,
            ops,
            _ticker: ticker,
        })
    }

    /// The grants of every service now: an instance gets those current when it starts.
    pub(crate) fn grants(&self) -> Arc<HashMap<String, Grants>> {
        // Replaced whole under the lock: a poisoned lock still holds a complete map.
        Arc::clone(&self.grants.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The most handles an instance of `service` with the grants `all` may hold
    /// ([`super::handles::instance_cap`]).
    pub(crate) fn handle_cap(&self, service: &str, all: &HashMap<String, Grants>) -> usize {
        super::handles::instance_cap(service, self.config.handle_limit, all, self.descriptors)
    }

    /// Replaces the grants; services started from now on get the new ones.
    pub(crate) fn set_grants(&self, grants: HashMap<String, Grants>) {
        *self.grants.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(grants);
    }
}

/// How many freed instance slots the pooling allocator resets together. Each reset is an
/// `madvise`, and each `madvise` of a process whose threads run on several CPUs makes the
/// kernel interrupt the others to flush their TLBs: one by one (wasmtime's default), that was
/// the largest cost of serving a request (`perf` under `wrk`). Sixteen together served 1.25×
/// the requests per second of the counter example and 1.12× of the hello one, interleaved
/// runs of the same load (BENCHMARKS.md, "Group commit"); slots wait for their batch a little
/// longer, a few dozen of the pool's.
const DECOMMIT_BATCH: usize = 16;

/// Builds an engine: async calls, epoch interruption, wasmtime's concurrency support (and with
/// it the component model's async features) if `concurrent`, and either the pooling allocator
/// sized for `config.max_instances` instances of at most `config.memory_cap` (if configured)
/// or the on-demand one with a [`StackPool`].
pub(crate) fn build(config: &RuntimeConfig, concurrent: bool) -> Result<Engine, RuntimeError> {
    let mut wasm = Config::new();
    wasm.wasm_component_model(true)
        .epoch_interruption(true)
        .concurrency_support(concurrent);
    if config.pooling {
        let n = config.max_instances.max(1);
        let mut pool = PoolingAllocationConfig::new();
        // A component built by wit-component has a few core instances (the main module and
        // its shims), each with at most one table; guests in other languages have more.
        pool.total_component_instances(n)
            .total_core_instances(n.saturating_mul(8))
            .total_tables(n.saturating_mul(8))
            .total_memories(n.saturating_mul(2))
            .total_stacks(n)
            .max_core_instances_per_component(64)
            .max_memories_per_component(4)
            .max_tables_per_component(64)
            .max_memory_size(config.memory_cap)
            .table_elements(100_000)
            .max_core_instance_size(8 << 20)
            .max_component_instance_size(8 << 20)
            .decommit_batch_size(DECOMMIT_BATCH);
        wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    } else {
        // The pooling allocator has its own stacks; the on-demand one would map (and unmap)
        // one per instance.
        wasm.with_host_stack(Arc::new(StackPool::new(CACHED_STACKS)));
    }
    Engine::new(&wasm).map_err(RuntimeError::Engine)
}

/// A thread that increments the engines' epochs every `tick`, so every store's epoch deadline
/// is reached within one tick. Dropping it stops and joins the thread at once, however long
/// the tick.
pub(crate) struct EpochTicker {
    /// Dropped to stop the thread: its wait for the next tick ends on the disconnect.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    /// Starts ticking `engines` every `tick`.
    pub(crate) fn start(engines: Vec<Engine>, tick: Duration) -> Result<Self, RuntimeError> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vvm-epoch".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    for engine in &engines {
                        engine.increment_epoch();
                    }
                }
            })
            .map_err(RuntimeError::Ticker)?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread only waits and increments: it cannot panic, and ends on the drop.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticker_thread_ends_when_dropped() {
        let engine = build(
            &RuntimeConfig {
                pooling: false,
                ..RuntimeConfig::new("/nonexistent")
            },
            false,
        )
        .unwrap();
        let ticker = EpochTicker::start(vec![engine], Duration::from_hours(1)).unwrap();
        let thread = ticker.thread.as_ref().unwrap().thread().clone();
        assert_eq!(thread.name(), Some("vvm-epoch"));
        let started = std::time::Instant::now();
        drop(ticker);
        assert!(started.elapsed() < Duration::from_millis(500));
    }
}
