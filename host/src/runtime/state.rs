//! What the host side of a guest's calls sees (SPEC §6, §7): [`ServiceEnv`], shared by every
//! instance of one service during one leadership (lease, deadline, stop signal, problem
//! reporter, key-value space and its limits), and [`Host`], the state of one store.
//!
//! The imports (`imports`), the fence (`fence`) and the output streams (`output`) all read these;
//! none of them owns them.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;
use wasmtime::StoreLimits;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::config::KvLimits;
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
    /// What `kv.set` may write, and how often.
    pub kv_limits: KvLimits,
    /// The writes `kv.set` may still make now (a token bucket refilled at the limit's rate).
    pub kv_budget: Mutex<WriteBudget>,
}

/// A token bucket: `rate` tokens per second, at most `rate` saved up.
#[derive(Debug)]
pub(crate) struct WriteBudget {
    tokens: f64,
    at: tokio::time::Instant,
}

impl WriteBudget {
    /// A full bucket for `rate` writes per second.
    pub(crate) fn full(rate: u32) -> Self {
        Self {
            tokens: f64::from(rate),
            at: tokio::time::Instant::now(),
        }
    }

    /// Takes one write if the budget allows it now.
    pub(super) fn take(&mut self, rate: u32) -> bool {
        let now = tokio::time::Instant::now();
        let rate = f64::from(rate);
        let refill = now.duration_since(self.at).as_secs_f64() * rate;
        self.tokens = (self.tokens + refill).min(rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
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
            kv_limits: KvLimits::default(),
            kv_budget: Mutex::new(WriteBudget::full(KvLimits::default().writes_per_second)),
        };
        (clock, Arc::new(env))
    }
}
