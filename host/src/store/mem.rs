//! In-memory backend: the store contract over a map, on an injected clock, for fast tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::kv::{self, FencedWrite, KvAnswer, KvPage, KvRefusal, KvUsage, KvView};
use super::{Candidates, FencedKv, HandOver, Record, StoreError, Term, TtlStore};
use crate::clock::{Clock, Timestamp};
use crate::lease_value;

/// The store contract held in memory: nothing survives the process. Cheap to clone; clones
/// share one map, like several hosts sharing one store.
#[derive(Clone)]
pub struct MemStore {
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<State>>,
    released: Arc<Notify>,
}

#[derive(Default)]
struct State {
    records: HashMap<String, Entry>,
    /// The last term issued per key; never forgotten, so terms keep increasing.
    terms: HashMap<String, Term>,
    /// Each namespace's keys and values, in byte order.
    kv: HashMap<String, BTreeMap<String, Vec<u8>>>,
}

struct Entry {
    value: String,
    term: Term,
    expires: Timestamp,
}

impl State {
    /// Writes `value` under `key` with the next term, which it returns.
    fn issue(&mut self, key: &str, value: &str, expires: Timestamp) -> Term {
        let term = self.terms.get(key).copied().unwrap_or(0) + 1;
        self.terms.insert(key.to_owned(), term);
        self.records.insert(
            key.to_owned(),
            Entry {
                value: value.to_owned(),
                term,
                expires,
            },
        );
        term
    }

    /// The live entry under `key`; an expired one is removed first.
    fn live(&mut self, key: &str, now: Timestamp) -> Option<&mut Entry> {
        if self
            .records
            .get(key)
            .is_some_and(|e| e.expires.left_from(now).is_none())
        {
            self.records.remove(key);
        }
        self.records.get_mut(key)
    }
}

impl MemStore {
    /// An empty store whose expiry is decided by `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            state: Arc::default(),
            released: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No operation leaves the map half-updated, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl TtlStore for MemStore {
    async fn insert_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Term>, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        if state.live(key, now).is_some() {
            return Ok(None);
        }
        Ok(Some(state.issue(key, value, now.after(ttl))))
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: &str,
        new: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        match state.live(key, now) {
            Some(entry) if entry.value == expected => {
                new.clone_into(&mut entry.value);
                entry.expires = now.after(ttl);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let own = state.live(key, now).is_some_and(|e| e.value == expected);
        if own {
            state.records.remove(key);
            drop(state);
            self.released.notify_waiters();
        }
        Ok(own)
    }

    async fn hand_over(
        &self,
        key: &str,
        expected: &str,
        candidates: &Candidates,
        ttl: Duration,
    ) -> Result<HandOver, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        if state.live(key, now).is_none_or(|e| e.value != expected) {
            return Ok(HandOver::NotHeld);
        }
        // The freshest: the latest expiry, then the first key.
        let freshest = state
            .records
            .iter()
            .filter(|(k, e)| {
                k.starts_with(&candidates.prefix)
                    && e.expires.left_from(now).is_some()
                    && (candidates.eligible)(&e.value)
            })
            .min_by(|(ka, a), (kb, b)| b.expires.cmp(&a.expires).then(ka.cmp(kb)))
            .map(|(k, e)| (k.clone(), e.value.clone()));
        let outcome = if let Some((candidate, to)) = freshest {
            state.records.remove(&candidate);
            let term = state.issue(key, &to, now.after(ttl));
            HandOver::To { to, term }
        } else {
            state.records.remove(key);
            HandOver::Deleted
        };
        drop(state);
        self.released.notify_waiters();
        Ok(outcome)
    }

    fn candidacy_ttl(&self, lease: Duration) -> Duration {
        lease
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        Ok(state.live(key, now).and_then(|e| {
            let time_left = e.expires.left_from(now)?;
            Some(Record {
                value: e.value.clone(),
                term: e.term,
                time_left,
                lives_at_least: time_left,
            })
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>, StoreError> {
        let now = self.clock.now();
        let state = self.lock();
        let mut listed: Vec<(String, Record)> = state
            .records
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .filter_map(|(key, e)| {
                let time_left = e.expires.left_from(now)?;
                let record = Record {
                    value: e.value.clone(),
                    term: e.term,
                    time_left,
                    lives_at_least: time_left,
                };
                Some((key.clone(), record))
            })
            .collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(listed)
    }

    async fn renew_all(
        &self,
        prefixes: &[&str],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<(String, Term)>, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut renewed: Vec<(String, Term)> = state
            .records
            .iter_mut()
            .filter(|(key, e)| {
                prefixes.iter().any(|p| key.starts_with(p))
                    && lease_value::holder(&e.value) == holder
                    && e.expires.left_from(now).is_some()
            })
            .map(|(key, e)| {
                e.expires = now.after(ttl);
                (key.clone(), e.term)
            })
            .collect();
        renewed.sort();
        Ok(renewed)
    }

    async fn wait_released(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.released.notified()).await;
    }
}

#[async_trait]
impl FencedKv for MemStore {
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().kv.get(space).and_then(|s| s.get(key)).cloned())
    }

    async fn kv_get_many(
        &self,
        space: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let state = self.lock();
        let space = state.kv.get(space);
        Ok(keys
            .iter()
            .map(|k| space.and_then(|s| s.get(*k)).cloned())
            .collect())
    }

    async fn kv_list(
        &self,
        space: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<KvPage, StoreError> {
        let state = self.lock();
        let mut keys = state
            .kv
            .get(space)
            .into_iter()
            .flat_map(|s| s.keys())
            .filter(|k| k.starts_with(prefix) && after.is_none_or(|a| k.as_str() > a));
        let page: Vec<String> = keys.by_ref().take(limit).cloned().collect();
        Ok(KvPage {
            keys: page,
            more: keys.next().is_some(),
        })
    }

    async fn kv_usage(&self, space: &str) -> Result<KvUsage, StoreError> {
        let state = self.lock();
        let entries = state.kv.get(space).into_iter().flatten();
        Ok(KvUsage::of(
            entries.map(|(k, v)| (k.as_str(), v.as_slice())),
        ))
    }

    async fn kv_view(&self, space: &str, prefix: &str) -> Result<KvView, StoreError> {
        let state = self.lock();
        let entries = state.kv.get(space).into_iter().flatten();
        let usage = KvUsage::of(entries.map(|(k, v)| (k.as_str(), v.as_slice())));
        let keys = state.kv.get(space).into_iter().flat_map(|s| s.keys());
        Ok(KvView {
            keys: keys.filter(|k| k.starts_with(prefix)).cloned().collect(),
            usage,
        })
    }

    /// Under the state's lock: the writes apply in order, all at once for every reader.
    async fn kv_apply_batch(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut answers = Vec::with_capacity(writes.len());
        for write in writes {
            if state.live(&write.lease_key, now).map(|e| e.term) != Some(write.term) {
                answers.push(Err(KvRefusal::StaleTerm));
                continue;
            }
            let data = state.kv.entry(write.space.clone()).or_default();
            let usage = KvUsage::of(data.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
            let planned = write.op.with(|op| {
                let old: HashMap<&str, Option<&[u8]>> = op
                    .keys()
                    .map(|k| (k, data.get(k).map(Vec::as_slice)))
                    .collect();
                kv::plan(op, &old, usage, &write.quota)
            });
            answers.push(planned.map(|plan| {
                for (key, value) in plan.changes {
                    match value {
                        Some(value) => data.insert(key, value),
                        None => data.remove(&key),
                    };
                }
                plan.done
            }));
        }
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::conformance::{self, Backend};

    struct Mem;

    impl Backend for Mem {
        type Store = MemStore;
        async fn open(&mut self, clock: &ManualClock) -> MemStore {
            MemStore::new(Arc::new(clock.clone()))
        }
        const PERSISTENT: bool = false;
    }

    conformance::suite!(Mem);
}
