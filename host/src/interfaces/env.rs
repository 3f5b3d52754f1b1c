//! The seam between the runtime and the interfaces (SPEC §6, §7): [`ServiceEnv`], what every
//! instance of one service shares during one leadership (its lease and deadline, its stop
//! signal, its problem reporter, the store, its write budget), and the per-call fence over it
//! ([`ServiceEnv::fence`], failing with [`Fenced`]). The runtime makes one per service and
//! leadership; every interface reads it, none owns it.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::keyvalue::access::WriteBudget;
use super::outgoing::OutgoingShared;
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
    /// Its outgoing HTTP requests in flight and kept-alive connections, shared by its
    /// instances.
    pub outgoing: Arc<OutgoingShared>,
}

/// A guest effect refused because the local lease deadline has passed: another host may
/// lead by now. Raised as a trap, so the guest stops at once.
#[derive(Debug, thiserror::Error)]
#[error("lease deadline passed: {what} refused, another host may lead now")]
pub(crate) struct Fenced {
    what: &'static str,
}

impl Fenced {
    /// Refuses `what` (a log line, a write, ...).
    pub(crate) fn new(what: &'static str) -> Self {
        Self { what }
    }
}

impl ServiceEnv {
    /// Fails with [`Fenced`] (and logs it) once the lease deadline has passed.
    pub(crate) fn fence(&self, what: &'static str) -> Result<(), Fenced> {
        if self.deadline.has_passed() {
            tracing::warn!(
                service = &*self.name,
                what,
                "effect refused: lease deadline passed"
            );
            self.ops.effect_refused(&self.name);
            Err(Fenced::new(what))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::interfaces::keyvalue::access::KvLimits;
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
            outgoing: OutgoingShared::new(&crate::interfaces::HttpPolicy::default()),
        };
        (clock, Arc::new(env))
    }
}
