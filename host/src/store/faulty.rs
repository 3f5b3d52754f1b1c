//! A fault-injecting store for tests, the one double of the store contract: a shared
//! [`MemStore`] behind scripted outcomes per operation, stalls, writes that land late, and a
//! record of every call. Built with the `testing` feature (the crate's own tests have it).

// Test support: a poisoned lock is a failed test already.
#![allow(clippy::unwrap_used, clippy::missing_errors_doc)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};

use super::kv::{FencedWrite, KvAnswer, KvPage, KvRefusal, KvUsage, KvView};
use super::{Candidates, FencedKv, HandOver, MemStore, Record, StoreError, Term, TtlStore};
use crate::keys::CANDIDATE_PREFIX;

/// Who hears of the calls a [`FaultyStore`] saw, in the order they ended: a test's journal.
pub trait Listener: Send + Sync {
    /// A call of `op` on `key` by store `who` ended with `result` as the caller saw it
    /// (`Err(())`: an error).
    fn store_call(&self, who: &str, op: Op, key: &str, result: Result<bool, ()>);
    /// Store `who` was asked to read ahead for a handover (`TtlStore::prepare_hand_over`).
    fn prepare_release(&self, who: &str);
}

/// Nobody listens.
impl Listener for () {
    fn store_call(&self, _: &str, _: Op, _: &str, _: Result<bool, ()>) {}
    fn prepare_release(&self, _: &str) {}
}

/// Which store operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `insert_if_absent`.
    Insert,
    /// `compare_and_swap`.
    Cas,
    /// `compare_and_delete`, and `hand_over` (a release).
    Delete,
    /// `get`.
    Get,
    /// `kv_apply_batch` (every fenced key-value write: a single one is a batch of one), on
    /// the namespace of the batch's first write. [`Fault::Answer`] refuses each write as
    /// stale.
    KvWrite,
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
    /// The operation.
    pub op: Op,
    /// Its key.
    pub key: String,
    /// When it began (tokio time).
    pub start: Instant,
    /// When it ended, if it did.
    pub end: Option<Instant>,
    /// `Ok(true/false)` as the caller saw it, `Err(())` for an error.
    pub result: Option<Result<bool, ()>>,
}

/// A fault-injecting store around a shared [`MemStore`]: scripted outcomes per operation, a
/// default outcome, a switch that stalls every call (a crashed or frozen host), and a record
/// of every call with its timestamps.
pub struct FaultyStore {
    /// The store behind the faults.
    pub inner: MemStore,
    name: String,
    listener: Arc<dyn Listener>,
    scripts: Mutex<HashMap<Op, VecDeque<Fault>>>,
    defaults: Mutex<HashMap<Op, Fault>>,
    stall_all: Mutex<bool>,
    /// Releases never end a wait ([`FaultyStore::deafen`]).
    deaf: Mutex<bool>,
    stalled_keys: Mutex<Vec<String>>,
    /// Writes that land late ([`FaultyStore::land_late`]).
    late: Mutex<Vec<(Op, String, Duration)>>,
    calls: Mutex<Vec<Call>>,
}

impl FaultyStore {
    /// A store over `inner`, named `name` to `listener`, passing every call until told
    /// otherwise.
    pub fn new<L: Listener + Clone + 'static>(
        inner: MemStore,
        name: &str,
        listener: &L,
    ) -> Arc<Self> {
        Arc::new(Self {
            inner,
            name: name.to_owned(),
            listener: Arc::new(listener.clone()),
            scripts: Mutex::default(),
            defaults: Mutex::default(),
            stall_all: Mutex::new(false),
            deaf: Mutex::new(false),
            stalled_keys: Mutex::default(),
            late: Mutex::default(),
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

    /// From now on `op` calls (inserts or deletes) on keys under `prefix` land `d` late, and
    /// land even if their caller stopped waiting (as a redb write does, run to its end on the
    /// blocking pool, or a request already on its way to etcd). Scripts do not reach them.
    pub fn land_late(&self, op: Op, prefix: &str, d: Duration) {
        self.late.lock().unwrap().push((op, prefix.to_owned(), d));
    }

    /// How late an `op` call on `key` lands, if [`FaultyStore::land_late`] said so.
    fn lateness(&self, op: Op, key: &str) -> Option<Duration> {
        let late = self.late.lock().unwrap();
        late.iter()
            .find(|(o, prefix, _)| *o == op && key.starts_with(prefix.as_str()))
            .map(|(_, _, d)| *d)
    }

    /// Every call seen, in the order they began.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Every call of `op` seen.
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
        self.listener.store_call(&self.name, op, key, shown);
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
        if let Some(d) = self.lateness(Op::Insert, key) {
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
        if let Some(d) = self.lateness(Op::Delete, key) {
            let (inner, key, expected) = (self.inner.clone(), key.to_owned(), expected.to_owned());
            let landing = tokio::spawn(async move {
                sleep(d).await;
                inner.compare_and_delete(&key, &expected).await
            });
            return landing.await.unwrap_or_else(|_| Err(transient()));
        }
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

    /// Told to the listener as it begins; never answers while the candidates' prefix is stalled.
    async fn prepare_hand_over(&self, candidates: &Candidates) {
        self.listener.prepare_release(&self.name);
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

    async fn kv_view(&self, space: &str, prefix: &str) -> Result<KvView, StoreError> {
        self.inner.kv_view(space, prefix).await
    }

    async fn kv_apply_batch(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        let space = writes.first().map_or("", |w| w.space.as_str());
        let stale = |_| writes.iter().map(|_| Err(KvRefusal::StaleTerm)).collect();
        self.run(
            Op::KvWrite,
            space,
            self.inner.kv_apply_batch(writes),
            stale,
            |_| true,
        )
        .await
    }
}
