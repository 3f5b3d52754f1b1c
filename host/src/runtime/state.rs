//! What the host side of a guest's calls sees (SPEC §6, §7): [`ServiceEnv`], shared by every
//! instance of one service during one leadership (lease, deadline, stop signal, problem
//! reporter, key-value space and its limits), and [`Host`], the state of one store.
//!
//! The imports (`imports`), the fence (`fence`) and the output streams (`output`) all read these;
//! none of them owns them.

use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use wasmtime::StoreLimits;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::config::{KvLimits, ServiceConfig};
use super::outgoing::OutgoingHttp;
use crate::lease::LeaseDeadline;
use crate::ops::Ops;
use crate::problem::ProblemReporter;
use crate::services::LeaseInfo;
use crate::store::Store;

/// What every instance of one service shares during one leadership.
pub(crate) struct ServiceEnv {
    /// The service's name (file stem); tags its log lines, namespaces its key-value space.
    pub name: Arc<str>,
    /// The lease the service runs under.
    pub lease: LeaseInfo,
    /// Past it, no effect may happen.
    pub deadline: LeaseDeadline,
    /// Cancelled when the service must stop.
    pub stopping: CancellationToken,
    /// Where `report-problem` goes.
    pub problems: ProblemReporter,
    /// The store holding the fenced key-value space.
    pub store: Arc<dyn Store>,
    /// Where refused effects and key-value writes are counted.
    pub ops: Ops,
    /// The key-value writes the service may still make now (a token bucket refilled at its
    /// rate, if it has one), shared by its instances.
    pub kv_budget: Mutex<WriteBudget>,
    /// Its outgoing HTTP requests in flight, shared by its instances.
    pub http_in_flight: Arc<Semaphore>,
}

/// A token bucket, for a service with a write rate (`writes-per-second`): that many tokens
/// per second, at most the burst (`write-burst`, a second's worth by default) saved up.
#[derive(Debug)]
pub(crate) struct WriteBudget {
    tokens: f64,
    at: tokio::time::Instant,
}

impl WriteBudget {
    /// A full bucket for `limits`.
    pub(crate) fn full(limits: &KvLimits) -> Self {
        Self {
            tokens: f64::from(Self::burst(limits)),
            at: tokio::time::Instant::now(),
        }
    }

    /// The bucket's size under `limits`.
    fn burst(limits: &KvLimits) -> u32 {
        limits.write_burst.or(limits.writes_per_second).unwrap_or(0)
    }

    /// Takes `n` writes at once (a batch counts each of its writes) if the budget allows
    /// them all now; else takes none. Without a rate, always.
    pub(super) fn take(&mut self, limits: &KvLimits, n: u32) -> bool {
        let Some(rate) = limits.writes_per_second else {
            return true;
        };
        let now = tokio::time::Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * f64::from(rate);
        self.tokens = (self.tokens + refill).min(f64::from(Self::burst(limits)));
        self.at = now;
        if self.tokens >= f64::from(n) {
            self.tokens -= f64::from(n);
            true
        } else {
            false
        }
    }
}

/// What one instance of a service may do with key-value data (SPEC §10): its limits and the
/// shared buckets it was granted, as its grants were when it started.
#[derive(Clone, Debug, Default)]
pub(crate) struct KvAccess {
    /// Its limits: its own table's over the host-wide ones.
    pub limits: KvLimits,
    /// The shared buckets it may open besides its own namespace.
    pub buckets: Arc<[String]>,
}

/// A key-value bucket a guest opened (`wasi:keyvalue` `bucket`): a namespace of the store.
#[derive(Debug)]
pub struct Bucket {
    /// The namespace: the service's name, or `bucket/<name>` for a shared bucket (a `/`
    /// cannot be in a service's file name, so the two never meet).
    pub space: String,
    /// `@0.2.0-draft`'s numbered cursors: cursor `n` continues after `cursors[n - 1]`.
    pub cursors: Vec<String>,
}

/// A `wasi:keyvalue/atomics` `cas` handle: a key and the value it held when read.
#[derive(Debug)]
pub struct Cas {
    /// The namespace of the bucket it was made on.
    pub space: String,
    /// The key.
    pub key: String,
    /// Its value when read (none: absent); a swap succeeds only if it is still this.
    pub current: Option<Vec<u8>>,
}

/// The state of one store: one instance of one service.
pub(crate) struct Host {
    /// What this instance's service shares with its other instances.
    pub(super) env: Arc<ServiceEnv>,
    /// The WASI context: only what the service's grants allow.
    pub(super) wasi: WasiCtx,
    /// The store's resources (streams, pollables, sockets).
    pub(super) table: ResourceTable,
    /// The memory cap.
    pub(super) limits: StoreLimits,
    /// Its key-value limits and buckets.
    pub(super) kv: KvAccess,
    /// What `wasi:config/store` answers.
    pub(super) config: ServiceConfig,
    /// Its outgoing HTTP: where requests may go, and how each is sent and fenced.
    pub(super) http: OutgoingHttp,
    /// `wasmtime-wasi-http`'s own state.
    pub(super) http_ctx: WasiHttpCtx,
}

impl Host {
    /// What this instance's service shares with its other instances.
    pub(crate) fn env(&self) -> &Arc<ServiceEnv> {
        &self.env
    }

    /// The store's resources.
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for Host {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            hooks: &mut self.http,
            table: &mut self.table,
            ctx: &mut self.http_ctx,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::store::{MemStore, TtlStore};

    /// The environment of a service `svc` leading `slot/1` in a fresh store, with a deadline
    /// 60 s ahead on the returned clock (advance it to pass the deadline).
    pub(crate) async fn env() -> (ManualClock, Arc<ServiceEnv>) {
        let store = MemStore::new(Arc::new(ManualClock::default()));
        let lease = Duration::from_secs(20);
        let term = store
            .insert_if_absent("slot/1", "me", lease)
            .await
            .unwrap()
            .unwrap();
        let clock = ManualClock::default();
        let deadline = LeaseDeadline::fixed(
            Arc::new(clock.clone()),
            clock.now().after(Duration::from_mins(1)),
        );
        let env = ServiceEnv {
            name: "svc".into(),
            lease: LeaseInfo {
                slot: 1,
                key: "slot/1".into(),
                holder: "me".into(),
                term,
                lease,
            },
            deadline,
            stopping: CancellationToken::new(),
            problems: ProblemReporter::default(),
            store: Arc::new(store),
            ops: Ops::new(Arc::new(clock.clone())),
            kv_budget: Mutex::new(WriteBudget::full(&KvLimits::default())),
            http_in_flight: Arc::new(Semaphore::new(1)),
        };
        (clock, Arc::new(env))
    }

    /// A store's state for an instance of `env`'s service with key-value `access` and no
    /// configuration.
    pub(crate) fn host(env: &Arc<ServiceEnv>, access: KvAccess) -> Host {
        Host {
            env: Arc::clone(env),
            wasi: wasmtime_wasi::WasiCtxBuilder::new().build(),
            table: ResourceTable::new(),
            limits: StoreLimits::default(),
            kv: access,
            config: ServiceConfig::default(),
            http: OutgoingHttp::new(
                &env.name,
                &env.lease,
                env.deadline.clone(),
                env.ops.clone(),
                Arc::default(),
                Arc::clone(&env.http_in_flight),
            ),
            http_ctx: WasiHttpCtx::new(),
        }
    }
}
