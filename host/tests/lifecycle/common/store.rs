//! A fault-injecting store over a shared [`MemStore`]: scripted outcomes per operation, stalls,
//! and a record of every call.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};
use vvm_host::clock::TokioClock;
use vvm_host::keys::CANDIDATE_PREFIX;
use vvm_host::store::{
    Candidates, Fence, FencedKv, HandOver, KvDone, KvOp, KvPage, KvQuota, KvRefusal, KvUsage,
    MemStore, Record, StoreError, Term, TtlStore,
};

use super::journal::{Event, Journal};

/// A store made of a [`MemStore`] on a [`TokioClock`], so paused tokio time moves store expiry
/// and the elections' timers together.
pub fn mem_store() -> MemStore {
    MemStore::new(Arc::new(TokioClock::new()))
}

/// Which store operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Insert,
    Cas,
    Delete,
    Get,
}

/// What the double does with one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Pass the call to the inner store.
    Pass,
    /// Answer `Ok(answer)` without touching the inner store (for insert: `false` = held).
    Answer(bool),
    /// A transient error.
    Transient,
    /// Never answer.
    Stall,
    /// Wait, then pass (the write lands late).
    DelayBefore(Duration),
    /// Pass at once, then wait before answering (the write lands, the answer is late).
    DelayAfter(Duration),
    /// Wait, then fail transiently.
    DelayThenTransient(Duration),
    /// Pass (the write lands), then fail transiently: a write of unknown outcome.
    ApplyThenTransient,
}

/// One call the double saw: when it began, when it ended (if it did), and what it returned.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: Op,
    pub key: String,
    pub start: Instant,
    pub end: Option<Instant>,
    /// `Ok(true/false)` as the caller saw it, `Err(())` for an error.
    pub result: Option<Result<bool, ()>>,
}

/// A fault-injecting store around a shared [`MemStore`]: scripted outcomes per operation, a
/// default outcome, a switch that stalls every call (a crashed or frozen host), and a record
/// of every call with its timestamps.
pub struct FaultyStore {
    pub inner: MemStore,
    name: String,
    journal: Journal,
    scripts: Mutex<HashMap<Op, VecDeque<Fault>>>,
    defaults: Mutex<HashMap<Op, Fault>>,
    stall_all: Mutex<bool>,
    /// Releases never end a wait ([`FaultyStore::deafen`]).
    deaf: Mutex<bool>,
    stalled_keys: Mutex<Vec<String>>,
    /// How late candidacy inserts land, if at all ([`FaultyStore::delay_candidacies`]).
    candidacy_delay: Mutex<Option<Duration>>,
    calls: Mutex<Vec<Call>>,
}

impl FaultyStore {
    pub fn new(inner: MemStore, name: &str, journal: &Journal) -> Arc<Self> {
        Arc::new(Self {
            inner,
            name: name.to_owned(),
            journal: journal.clone(),
            scripts: Mutex::default(),
            defaults: Mutex::default(),
            stall_all: Mutex::new(false),
            deaf: Mutex::new(false),
            stalled_keys: Mutex::default(),
            candidacy_delay: Mutex::default(),
            calls: Mutex::default(),
        })
    }

    /// The next calls of `op` get these outcomes, in order; then the default.
    pub fn script(&self, op: Op, faults: impl IntoIterator<Item = Fault>) {
        self.scripts
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .extend(faults);
    }

    /// Calls of `op` with no scripted outcome get `fault`.
    pub fn set_default(&self, op: Op, fault: Fault) {
        self.defaults.lock().unwrap().insert(op, fault);
    }

    /// From now on every call, of every operation, never answers.
    pub fn stall_everything(&self) {
        *self.stall_all.lock().unwrap() = true;
    }

    /// From now on no release ends a wait (a waiter that misses the news, or hears of it late).
    pub fn deafen(&self) {
        *self.deaf.lock().unwrap() = true;
    }

    /// From now on every call on `key` never answers.
    pub fn stall_key(&self, key: &str) {
        self.stalled_keys.lock().unwrap().push(key.to_owned());
    }

    /// From now on candidacy inserts land `d` late, and land even if their caller stopped
    /// waiting (as a redb write does, run to its end on the blocking pool).
    pub fn delay_candidacies(&self, d: Duration) {
        *self.candidacy_delay.lock().unwrap() = Some(d);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.op == op).collect()
    }

    fn is_stalled(&self, key: &str) -> bool {
        *self.stall_all.lock().unwrap()
            || self.stalled_keys.lock().unwrap().iter().any(|k| k == key)
    }

    fn next_fault(&self, op: Op, key: &str) -> Fault {
        if self.is_stalled(key) {
            return Fault::Stall;
        }
        let scripted = self
            .scripts
            .lock()
            .unwrap()
            .get_mut(&op)
            .and_then(VecDeque::pop_front);
        scripted.unwrap_or_else(|| {
            self.defaults
                .lock()
                .unwrap()
                .get(&op)
                .copied()
                .unwrap_or(Fault::Pass)
        })
    }

    /// Runs one call through its fault; `pass` performs it on the inner store.
    async fn run<T, F>(
        &self,
        op: Op,
        key: &str,
        pass: F,
        answer: impl Fn(bool) -> T,
        seen: impl Fn(&T) -> bool,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        if key.starts_with(CANDIDATE_PREFIX) {
            // A standby's candidacy: only the stalls of a frozen host reach it; scripts,
            // defaults and the record of calls are about the slots.
            if self.is_stalled(key) {
                return std::future::pending().await;
            }
            return pass.await;
        }
        let index = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Call {
                op,
                key: key.to_owned(),
                start: Instant::now(),
                end: None,
                result: None,
            });
            calls.len() - 1
        };
        let fault = self.next_fault(op, key);
        let result = match fault {
            Fault::Pass => pass.await,
            Fault::Answer(a) => Ok(answer(a)),
            Fault::Transient => Err(transient()),
            Fault::Stall => std::future::pending().await,
            Fault::DelayBefore(d) => {
                sleep(d).await;
                pass.await
            }
            Fault::DelayAfter(d) => {
                let r = pass.await;
                sleep(d).await;
                r
            }
            Fault::DelayThenTransient(d) => {
                sleep(d).await;
                Err(transient())
            }
            Fault::ApplyThenTransient => {
                let _ = pass.await;
                Err(transient())
            }
        };
        let shown = result.as_ref().map(&seen).map_err(|_| ());
        {
            let mut calls = self.calls.lock().unwrap();
            calls[index].end = Some(Instant::now());
            calls[index].result = Some(shown);
        }
        let event = Event::Store {
            op,
            key: key.to_owned(),
            result: shown,
        };
        self.journal.push(&self.name, event);
        result
    }
}

fn transient() -> StoreError {
    StoreError::transient("double", "scripted transient error")
}

#[async_trait]
impl TtlStore for FaultyStore {
    async fn insert_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Term>, StoreError> {
        let delay = *self.candidacy_delay.lock().unwrap();
        if let Some(d) = delay.filter(|_| key.starts_with(CANDIDATE_PREFIX)) {
            let (inner, key, value) = (self.inner.clone(), key.to_owned(), value.to_owned());
            let landing = tokio::spawn(async move {
                sleep(d).await;
                inner.insert_if_absent(&key, &value, ttl).await
            });
            return landing.await.unwrap_or_else(|_| Err(transient()));
        }
        self.run(
            Op::Insert,
            key,
            self.inner.insert_if_absent(key, value, ttl),
            |_| None,
            Option::is_some,
        )
        .await
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: &str,
        new: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.run(
            Op::Cas,
            key,
            self.inner.compare_and_swap(key, expected, new, ttl),
            |a| a,
            |b| *b,
        )
        .await
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, StoreError> {
        self.run(
            Op::Delete,
            key,
            self.inner.compare_and_delete(key, expected),
            |a| a,
            |b| *b,
        )
        .await
    }

    /// A release: scripted as [`Op::Delete`], which it replaces when candidates wait.
    async fn hand_over(
        &self,
        key: &str,
        expected: &str,
        candidates: &Candidates,
        ttl: Duration,
    ) -> Result<HandOver, StoreError> {
        self.run(
            Op::Delete,
            key,
            self.inner.hand_over(key, expected, candidates, ttl),
            HandOver::deleted_if,
            |h| *h != HandOver::NotHeld,
        )
        .await
    }

    /// Journaled as it begins; never answers while the candidates' prefix is stalled.
    async fn prepare_hand_over(&self, candidates: &Candidates) {
        self.journal.push(&self.name, Event::PrepareRelease);
        if self.is_stalled(&candidates.prefix) {
            return std::future::pending().await;
        }
        self.inner.prepare_hand_over(candidates).await;
    }

    fn candidacy_ttl(&self, lease: Duration) -> Duration {
        self.inner.candidacy_ttl(lease)
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.run(Op::Get, key, self.inner.get(key), |_| None, Option::is_some)
            .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>, StoreError> {
        self.inner.list(prefix).await
    }

    async fn renew_all(
        &self,
        prefixes: &[&str],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<(String, Term)>, StoreError> {
        self.inner.renew_all(prefixes, holder, ttl).await
    }

    async fn wait_released(&self, max: Duration) {
        if *self.stall_all.lock().unwrap() || *self.deaf.lock().unwrap() {
            return std::future::pending().await;
        }
        self.inner.wait_released(max).await;
    }
}

#[async_trait]
impl FencedKv for FaultyStore {
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.kv_get(space, key).await
    }

    async fn kv_get_many(
        &self,
        space: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.inner.kv_get_many(space, keys).await
    }

    async fn kv_list(
        &self,
        space: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<KvPage, StoreError> {
        self.inner.kv_list(space, prefix, after, limit).await
    }

    async fn kv_usage(&self, space: &str) -> Result<KvUsage, StoreError> {
        self.inner.kv_usage(space).await
    }

    async fn kv_apply(
        &self,
        fence: &Fence<'_>,
        space: &str,
        op: &KvOp<'_>,
        quota: &KvQuota,
    ) -> Result<Result<KvDone, KvRefusal>, StoreError> {
        self.inner.kv_apply(fence, space, op, quota).await
    }
}
