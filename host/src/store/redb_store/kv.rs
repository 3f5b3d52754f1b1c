//! The guests' fenced key-value space in the redb file ([`FencedKv`]): each batch of writes is
//! one write transaction, in which each write checks its lease's term, reads the keys it
//! touches and its namespace's usage record, and writes the keys and the new usage, or
//! nothing.
//!
//! A namespace's usage record is made on its first write by this version: from a scan of what
//! the namespace already holds (data written before usage was kept), once.

use std::collections::HashMap;
use std::ops::Bound;

use async_trait::async_trait;
use redb::{ReadableTable, Table};

use super::fault::Fault;
use super::schema::{KV, KV_USAGE, LEASES, live_lease};
use super::{InFlightWrite, Lane, Outcome, RedbStore};
use crate::store::kv::{
    self, FencedWrite, KvAnswer, KvDone, KvOp, KvPage, KvQuota, KvRefusal, KvUsage, KvView,
};
use crate::store::{FencedKv, StoreError};

/// The keys of `space` from `low` on, in order, each with its value's length.
fn keys_from<'t>(
    kv: &'t impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    space: &'t str,
    low: Bound<&'t str>,
) -> Result<impl Iterator<Item = Result<(String, usize), Fault>> + 't, Fault> {
    let low = match low {
        Bound::Included(key) => Bound::Included((space, key)),
        Bound::Excluded(key) => Bound::Excluded((space, key)),
        Bound::Unbounded => Bound::Included((space, "")),
    };
    let range = kv.range::<(&str, &str)>((low, Bound::Unbounded))?;
    Ok(range
        .map(move |entry| {
            let (k, v) = entry?;
            let (s, key) = k.value();
            Ok((s == space).then(|| (key.to_owned(), v.value().len())))
        })
        .map_while(Result::transpose))
}

/// `space`'s usage from a scan of its keys.
fn scanned_usage(
    kv: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    space: &str,
) -> Result<KvUsage, Fault> {
    let mut usage = KvUsage::default();
    for entry in keys_from(kv, space, Bound::Unbounded)? {
        let (key, len) = entry?;
        usage = usage.plus(key.len(), len);
    }
    Ok(usage)
}

/// `space`'s usage: its record, or (none yet) a scan.
fn usage_of(
    usage: Option<&impl ReadableTable<&'static str, (u64, u64)>>,
    kv: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    space: &str,
) -> Result<KvUsage, Fault> {
    if let Some(record) = usage.map(|t| t.get(space)).transpose()?.flatten() {
        let (keys, bytes) = record.value();
        return Ok(KvUsage { keys, bytes });
    }
    scanned_usage(kv, space)
}

/// The usage table, read-only.
type UsageTable = redb::ReadOnlyTable<&'static str, (u64, u64)>;

/// The usage table as `txn` sees it: `None` in a file that no host of this version has
/// written yet.
fn usage_table(txn: &redb::ReadTransaction) -> Result<Option<UsageTable>, Fault> {
    match txn.open_table(KV_USAGE) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(Fault::table(e)),
    }
}

/// Applies `op` in `txn` (the fence has passed), or refuses it.
fn apply(
    kv: &mut Table<'_, (&'static str, &'static str), &'static [u8]>,
    usages: &mut Table<'_, &'static str, (u64, u64)>,
    space: &str,
    op: &KvOp<'_>,
    quota: &KvQuota,
) -> Result<Result<KvDone, KvRefusal>, Fault> {
    let usage = usage_of(Some(&*usages), &*kv, space)?;
    let mut stored: HashMap<&str, Option<Vec<u8>>> = HashMap::new();
    for key in op.keys() {
        let value = kv.get((space, key))?.map(|v| v.value().to_vec());
        stored.insert(key, value);
    }
    let old: HashMap<&str, Option<&[u8]>> =
        stored.iter().map(|(k, v)| (*k, v.as_deref())).collect();
    let plan = match kv::plan(op, &old, usage, quota) {
        Ok(plan) => plan,
        Err(refusal) => return Ok(Err(refusal)),
    };
    for (key, value) in &plan.changes {
        match value {
            Some(value) => kv.insert((space, key.as_str()), value.as_slice())?,
            None => kv.remove((space, key.as_str()))?,
        };
    }
    if plan.usage.keys == 0 {
        usages.remove(space)?;
    } else {
        usages.insert(space, (plan.usage.keys, plan.usage.bytes))?;
    }
    Ok(Ok(plan.done))
}

#[async_trait]
impl FencedKv for RedbStore {
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (space, key) = (space.to_owned(), key.to_owned());
        self.read("kv_get", move |txn, _| {
            let kv = txn.open_table(KV)?;
            Ok(kv
                .get((space.as_str(), key.as_str()))?
                .map(|v| v.value().to_vec()))
        })
        .await
    }

    async fn kv_get_many(
        &self,
        space: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let space = space.to_owned();
        let keys: Vec<String> = keys.iter().map(|&k| k.to_owned()).collect();
        self.read("kv_get_many", move |txn, _| {
            let kv = txn.open_table(KV)?;
            keys.iter()
                .map(|key| {
                    Ok(kv
                        .get((space.as_str(), key.as_str()))?
                        .map(|v| v.value().to_vec()))
                })
                .collect()
        })
        .await
    }

    async fn kv_list(
        &self,
        space: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<KvPage, StoreError> {
        let (space, prefix) = (space.to_owned(), prefix.to_owned());
        let after = after.map(str::to_owned);
        self.read("kv_list", move |txn, _| {
            let kv = txn.open_table(KV)?;
            // From the prefix itself (it may be a key), or after `after` if that sorts later.
            let low = match &after {
                Some(a) if *a >= prefix => Bound::Excluded(a.as_str()),
                _ => Bound::Included(prefix.as_str()),
            };
            let mut page = KvPage::default();
            for entry in keys_from(&kv, &space, low)? {
                let (key, _) = entry?;
                if !key.starts_with(prefix.as_str()) {
                    break;
                }
                if page.keys.len() == limit {
                    page.more = true;
                    break;
                }
                page.keys.push(key);
            }
            Ok(page)
        })
        .await
    }

    async fn kv_usage(&self, space: &str) -> Result<KvUsage, StoreError> {
        let space = space.to_owned();
        self.read("kv_usage", move |txn, _| {
            let kv = txn.open_table(KV)?;
            usage_of(usage_table(txn)?.as_ref(), &kv, &space)
        })
        .await
    }

    /// One read transaction.
    async fn kv_view(&self, space: &str, prefix: &str) -> Result<KvView, StoreError> {
        let (space, prefix) = (space.to_owned(), prefix.to_owned());
        self.read("kv_view", move |txn, _| {
            let kv = txn.open_table(KV)?;
            let mut keys = Vec::new();
            for entry in keys_from(&kv, &space, Bound::Included(prefix.as_str()))? {
                let (key, _) = entry?;
                if !key.starts_with(prefix.as_str()) {
                    break;
                }
                keys.push(key);
            }
            let usage = usage_of(usage_table(txn)?.as_ref(), &kv, &space)?;
            Ok(KvView { keys, usage })
        })
        .await
    }

    /// One write transaction for the whole batch ([`RedbStore::apply_batch_now`]), on the
    /// blocking pool.
    async fn kv_apply_batch(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        let writes = writes.to_vec();
        let in_flight = InFlightWrite::new(&self.inner);
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.apply_batch_now(&writes, in_flight))
            .await
            .unwrap_or_else(|e| {
                let fault = Fault::Aborted(e.to_string());
                Err(fault.into_store_error(&self.inner.path, "kv_apply"))
            })
    }

    fn blocking_batches(&self) -> bool {
        true
    }

    fn kv_apply_batch_blocking(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        self.apply_batch_now(writes, InFlightWrite::new(&self.inner))
    }
}

impl RedbStore {
    /// One write transaction for the whole batch, on this thread: the term of each distinct
    /// lease read once, then each write in order, reading what the writes before it left.
    fn apply_batch_now(
        &self,
        writes: &[FencedWrite],
        in_flight: InFlightWrite,
    ) -> Result<Vec<KvAnswer>, StoreError> {
        self.write_now("kv_apply", Lane::Guest, in_flight, |txn, now| {
            let leases = txn.open_table(LEASES)?;
            let mut terms: HashMap<&str, Option<u64>> = HashMap::new();
            let mut kv = txn.open_table(KV)?;
            let mut usages = txn.open_table(KV_USAGE).map_err(Fault::table)?;
            let mut answers = Vec::with_capacity(writes.len());
            let mut changed = false;
            for write in writes {
                let live = if let Some(term) = terms.get(write.lease_key.as_str()) {
                    *term
                } else {
                    let term =
                        live_lease(&leases, &write.lease_key, now)?.map(|(lease, _)| lease.term);
                    terms.insert(&write.lease_key, term);
                    term
                };
                if live != Some(write.term) {
                    answers.push(Err(KvRefusal::StaleTerm));
                    continue;
                }
                let (space, quota) = (write.space.as_str(), &write.quota);
                let answer = write
                    .op
                    .with(|op| apply(&mut kv, &mut usages, space, op, quota))?;
                changed |= matches!(
                    answer,
                    Ok(KvDone::Written | KvDone::Number(_) | KvDone::Swapped(true))
                );
                answers.push(answer);
            }
            let outcome = if changed {
                Outcome::Commit
            } else {
                Outcome::Abort
            };
            Ok((answers, outcome))
        })
    }
}
