//! One journal per test that orders what the doubles did, as typed events.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::store::Op;

/// What a double did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A store call of `op` on `key` ended with `result` as the caller saw it (`Err(())`: an
    /// error).
    Store {
        op: Op,
        key: String,
        result: Result<bool, ()>,
    },
    /// The services were asked to start.
    StartBegin,
    /// The services started.
    Started,
    /// The services failed to start.
    StartFailed,
    /// A slow start ended early because `stopping` fired.
    StartCutShort,
    /// The services were asked to stop; `stopping`: whether their `stopping` had fired by then.
    StopBegin { stopping: bool },
    /// The services ignore the stop (and never finish stopping).
    IgnoresStop,
    /// The services stopped.
    Stopped,
    /// The store was asked to read ahead for a handover (`TtlStore::prepare_hand_over`).
    PrepareRelease,
}

/// One journal entry: who did what, and when (tokio time).
struct Entry {
    at: Instant,
    who: String,
    event: Event,
}

/// Every event of one test, in the order it happened.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<Entry>>>);

impl Journal {
    pub fn push(&self, who: &str, event: Event) {
        self.0.lock().unwrap().push(Entry {
            at: Instant::now(),
            who: who.to_owned(),
            event,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap().is_empty()
    }

    /// Index of the first `event` of `who`.
    pub fn first(&self, who: &str, event: &Event) -> Option<usize> {
        let entries = self.0.lock().unwrap();
        entries
            .iter()
            .position(|e| e.who == who && e.event == *event)
    }

    /// Index of the last `event` of `who`.
    pub fn last(&self, who: &str, event: &Event) -> Option<usize> {
        let entries = self.0.lock().unwrap();
        entries
            .iter()
            .rposition(|e| e.who == who && e.event == *event)
    }

    /// Every entry, one a line, with its time since the first (for failure messages).
    pub fn dump(&self) -> String {
        let entries = self.0.lock().unwrap();
        let t0 = entries.first().map(|e| e.at);
        entries.iter().fold(String::new(), |mut out, e| {
            let since = t0.map(|t0| e.at - t0).unwrap_or_default();
            let _ = writeln!(out, "{since:>10.3?} {} {:?}", e.who, e.event);
            out
        })
    }
}
