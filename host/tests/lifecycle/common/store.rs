//! The store the lifecycle tests run on: the library's fault-injecting double
//! ([`FaultyStore`]) over a [`MemStore`] on tokio's clock, telling its calls to the journal.

use std::sync::Arc;

use vvm_host::clock::TokioClock;
use vvm_host::store::MemStore;
pub use vvm_host::store::faulty::{Call, Fault, FaultyStore, Op};

use super::journal::{Event, Journal};

/// A store made of a [`MemStore`] on a [`TokioClock`], so paused tokio time moves store expiry
/// and the elections' timers together.
pub fn mem_store() -> MemStore {
    MemStore::new(Arc::new(TokioClock::new()))
}

impl vvm_host::store::faulty::Listener for Journal {
    fn store_call(&self, who: &str, op: Op, key: &str, result: Result<bool, ()>) {
        let key = key.to_owned();
        self.push(who, Event::Store { op, key, result });
    }

    fn prepare_release(&self, who: &str) {
        self.push(who, Event::PrepareRelease);
    }
}
