//! The guests' fenced key-value space on etcd ([`FencedKv`]): its keys, each namespace's usage
//! key, and the read-then-write of [`FencedKv::kv_apply`].
//!
//! Keys under the store's prefix `P` (`%` and `/` in a space name percent-escaped):
//! - `P kv/<space>/<key>`: a value, on no lease.
//! - `P kvusage/<space>`: the namespace's usage, `"<keys> <bytes> <mark>"` (the mark of the
//!   write that made it, [`write_mark`]), written in the transaction of every fenced write
//!   that changes the namespace. Once made it is never deleted (an
//!   emptied namespace keeps `"0 0"`), so its mod revision only grows: a writer that finds it
//!   unchanged knows that no write of this version touched the namespace meanwhile. (Deleted
//!   at zero, it could come back absent, and a writer holding a scan from before would count
//!   keys deleted since.) A namespace written before usage was kept has none: its usage is
//!   then read from a scan of its keys, and written with the first fenced write.
//!
//! [`FencedKv::kv_apply`] is two requests, each one transaction:
//! 1. A read of the lease record, its handover term key, the usage key and every key the
//!    write touches, at one revision. The fence is decided from it: the record carries the
//!    writer's term as [`term_of`] reads it (its create revision, or its term key's mod
//!    revision after a handover). Then [`kv::plan`]. A refusal, a swap that lost, or a write
//!    that changes nothing is answered from that read and writes nothing.
//! 2. A write of the changes and the new usage, if the record's create revision, the term
//!    key's, the usage key's and every touched key's mod revision are still what the read saw:
//!    the fence still holds (a new term is a new create revision, or a handover's put of the
//!    term key) and no write came in between. Otherwise the same transaction reads as step 1
//!    did, and the write is planned again from that, at most [`ATTEMPTS`] times in all.
//!
//! Why one level and no nested transaction (the fence's two branches, as a lease write checks
//! them): etcd checks a transaction level by level. The largest of a level's compares, its
//! success ops and its failure ops must be at most `--max-txn-ops` (128 by default), and a
//! nested transaction gets only what its parent level left (`checkTxnRequest` in etcd's
//! `etcdserver/api/v3rpc/key.go`: `checkRequestOp(u, maxTxnOps-opc)`; tried on etcd 3.4.23:
//! 101 compares with a nested transaction of 27 puts pass, of 28 are refused). A write of
//! [`MAX_BATCH`] keys needs 100 compares and 101 ops: nested, about 200 along one path; here,
//! at most 103 compares and 103 ops. A put in both branches would also send each value twice,
//! and a 1 MiB value would not fit etcd's `--max-request-bytes` (1.5 MiB by default).

use std::collections::HashMap;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use super::{EtcdStore, ForeignRecord, term_of};
use crate::store::kv::{
    self, KvDone, KvOp, KvPage, KvQuota, KvRefusal, KvUsage, KvView, MAX_BATCH,
};
use crate::store::{Fence, FencedKv, StoreError};

/// The most compares, or ops, that etcd takes at one level of a transaction by default
/// (`--max-txn-ops`).
const ETCD_MAX_TXN_OPS: usize = 128;

/// The reads and compares of a write beside its keys': the lease record, its term key and
/// the usage key.
const FIXED_OPS: usize = 3;

const _: () = assert!(MAX_BATCH + FIXED_OPS <= ETCD_MAX_TXN_OPS);

/// The largest response the client decodes (tonic's default: 4 MiB). etcd sends responses of
/// any size; a value came in one request, so it is at most `--max-request-bytes` (1.5 MiB by
/// default), and a read of [`MAX_BATCH`] values and the fence's keys fits with room.
pub(super) const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// How many times a write is planned and tried against a namespace that other writers keep
/// changing, before it fails with a transient error.
const ATTEMPTS: usize = 20;

/// Keys per page of a scan of a namespace (its usage, before usage was kept).
const SCAN_PAGE: i64 = 100;

/// A write that could not be applied.
#[derive(Debug, thiserror::Error)]
enum KvFault {
    /// Other writers changed the namespace under every try.
    #[error("the namespace changed under each of {0} tries")]
    Contended(usize),
    /// More distinct keys than one transaction takes.
    #[error("a write of {0} keys: at most {MAX_BATCH}")]
    TooManyKeys(usize),
    /// etcd answered a read with fewer results than it was asked for.
    #[error("etcd answered a read with fewer results than asked")]
    ShortAnswer,
}

/// What step 1 read, at one revision.
struct Snapshot {
    /// The lease record's create revision and its term key's mod revision (0: none), if the
    /// record carries the fence's term; `None`: the term is stale.
    fence: Option<(i64, i64)>,
    /// The usage key's mod revision (0: absent).
    usage_revision: i64,
    /// The usage it holds; `None` if absent or unreadable (then scanned).
    usage: Option<KvUsage>,
    /// The mark of the write that left the usage key so ([`write_mark`]).
    usage_mark: Option<u64>,
    /// Each touched key, once, with its mod revision (0: absent) and value.
    keys: Vec<(String, i64, Option<Vec<u8>>)>,
}

/// `space` with `%` and `/` escaped, so that no namespace's keys lie under another's.
fn escape(space: &str) -> String {
    space.replace('%', "%25").replace('/', "%2F")
}

/// The first key after every key that starts with `prefix` (etcd's range end of a prefix).
fn range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (never a UTF-8 key): every key from the prefix on.
    vec![0]
}

/// A usage value, `"<keys> <bytes>[ <mark in hex>]"`: the usage, and the mark of the write
/// that made it, if any.
fn parse_usage(value: &[u8]) -> Option<(KvUsage, Option<u64>)> {
    let mut fields = std::str::from_utf8(value).ok()?.split(' ');
    let usage = KvUsage {
        keys: fields.next()?.parse().ok()?,
        bytes: fields.next()?.parse().ok()?,
    };
    let mark = fields.next().and_then(|m| u64::from_str_radix(m, 16).ok());
    Some((usage, mark))
}

/// A mark for one `kv_apply`'s writes, written with the usage: random, so that a write whose
/// answer was lost and whose request the client sent again (its compares then fail against
/// the write's own revisions) is known for the caller's own, rather than planned and applied
/// a second time (an increment counted twice).
fn write_mark() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Each `RandomState` has fresh keys (seeded from the OS, then stepped per state).
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0);
    hasher.finish()
}

impl EtcdStore {
    /// The prefix of every key of `space`.
    fn kv_base(&self, space: &str) -> String {
        format!("{}kv/{}/", self.prefix, escape(space))
    }

    pub(super) fn kv_key(&self, space: &str, key: &str) -> String {
        format!("{}{key}", self.kv_base(space))
    }

    fn usage_key(&self, space: &str) -> String {
        format!("{}kvusage/{}", self.prefix, escape(space))
    }

    fn kv_context(&self, op: &str, space: &str) -> String {
        format!("etcd {}: {op} in {space:?}", self.endpoints)
    }

    /// The reads of step 1: the lease record, its term key, the usage key, then `keys`.
    fn read_ops(&self, lease_key: &str, space: &str, keys: &[&str]) -> Vec<TxnOp> {
        [
            self.record_key(lease_key),
            self.term_key(lease_key),
            self.usage_key(space),
        ]
        .into_iter()
        .chain(keys.iter().map(|key| self.kv_key(space, key)))
        .map(|key| TxnOp::get(key, None))
        .collect()
    }

    /// What the reads of [`Self::read_ops`] found, for a writer of `term`.
    fn snapshot(
        &self,
        space: &str,
        term: i64,
        keys: &[&str],
        answers: Vec<TxnOpResponse>,
    ) -> Result<Snapshot, StoreError> {
        let mut got = answers.into_iter().map(|answer| match answer {
            TxnOpResponse::Get(mut get) => Some(get.take_kvs().into_iter().next()),
            _ => None,
        });
        let mut next = || {
            got.next().flatten().ok_or_else(|| {
                StoreError::permanent(self.kv_context("kv_apply", space), KvFault::ShortAnswer)
            })
        };
        let (record, handed, usage) = (next()?, next()?, next()?);
        let fence = record
            .filter(|record| term_of(record, handed.as_ref()) == term)
            .map(|record| {
                let handed = handed.as_ref().map_or(0, KeyValue::mod_revision);
                (record.create_revision(), handed)
            });
        let usage_revision = usage.as_ref().map_or(0, KeyValue::mod_revision);
        let usage = usage.and_then(|kv| {
            let parsed = parse_usage(kv.value());
            if parsed.is_none() {
                tracing::warn!(space, "unreadable etcd usage key; counting the namespace");
            }
            parsed
        });
        let (usage, usage_mark) = (usage.map(|(u, _)| u), usage.and_then(|(_, m)| m));
        let mut read = Vec::with_capacity(keys.len());
        for key in keys {
            let kv = next()?;
            let revision = kv.as_ref().map_or(0, KeyValue::mod_revision);
            read.push((
                (*key).to_owned(),
                revision,
                kv.map(|kv| kv.into_key_value().1),
            ));
        }
        Ok(Snapshot {
            fence,
            usage_revision,
            usage,
            usage_mark,
            keys: read,
        })
    }

    /// `space`'s usage from a scan of its keys: pages read at `revision` (0: at the first
    /// page's).
    async fn scan_usage(&self, space: &str, revision: i64) -> Result<KvUsage, StoreError> {
        let base = self.kv_base(space);
        let end = range_end(base.as_bytes());
        let mut usage = KvUsage::default();
        let (mut from, mut revision) = (base.clone().into_bytes(), revision);
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(SCAN_PAGE);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut page = self
                .call("kv_usage", space, || {
                    let (mut kv, from, options) = (self.kv(), from.clone(), options.clone());
                    async move { kv.get(from, Some(options)).await }
                })
                .await?;
            self.saw(page.header());
            if revision == 0 {
                revision = page
                    .header()
                    .map_or(0, etcd_client::ResponseHeader::revision);
            }
            let more = page.more();
            let kvs = page.take_kvs();
            for kv in &kvs {
                // The key less the namespace's prefix, as the guest named it.
                let key_bytes = kv.key().len().saturating_sub(base.len());
                usage = usage.plus(key_bytes, kv.value().len());
            }
            match kvs.last() {
                Some(last) if more => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok(usage),
            }
        }
    }

    /// Step 2: `changes` and `usage` written if the fence (`created`, `handed`: what `read`
    /// found of it) and every key read are unchanged since `read`.
    fn write_txn(
        &self,
        (fence, created, handed): (&Fence<'_>, i64, i64),
        space: &str,
        read: &Snapshot,
        changes: Vec<(String, Option<Vec<u8>>)>,
        (usage, mark): (KvUsage, u64),
    ) -> Txn {
        let mut compares = vec![
            Compare::create_revision(self.record_key(fence.lease_key), CompareOp::Equal, created),
            Compare::mod_revision(self.term_key(fence.lease_key), CompareOp::Equal, handed),
            Compare::mod_revision(self.usage_key(space), CompareOp::Equal, read.usage_revision),
        ];
        compares.extend(read.keys.iter().map(|(key, revision, _)| {
            Compare::mod_revision(self.kv_key(space, key), CompareOp::Equal, *revision)
        }));
        let mut writes: Vec<TxnOp> = changes
            .into_iter()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(self.kv_key(space, &key), value, None),
                None => TxnOp::delete(self.kv_key(space, &key), None),
            })
            .collect();
        let figures = format!("{} {} {mark:016x}", usage.keys, usage.bytes);
        writes.push(TxnOp::put(self.usage_key(space), figures, None));
        Txn::new().when(compares).and_then(writes)
    }
}

#[async_trait]
impl FencedKv for EtcdStore {
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let mut response = self
            .call("kv_get", key, || self.get_request(self.kv_key(space, key)))
            .await?;
        self.saw(response.header());
        Ok(response
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| kv.into_key_value().1))
    }

    /// One transaction of gets, so one revision.
    async fn kv_get_many(
        &self,
        space: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|key| TxnOp::get(self.kv_key(space, key), None))
            .collect();
        let response = self
            .txn("kv_get_many", space, Txn::new().and_then(gets))
            .await?;
        let values: Vec<Option<Vec<u8>>> = response
            .op_responses()
            .into_iter()
            .map(|answer| match answer {
                TxnOpResponse::Get(mut get) => get
                    .take_kvs()
                    .into_iter()
                    .next()
                    .map(|kv| kv.into_key_value().1),
                _ => None,
            })
            .collect();
        if values.len() != keys.len() {
            let context = self.kv_context("kv_get_many", space);
            return Err(StoreError::permanent(context, KvFault::ShortAnswer));
        }
        Ok(values)
    }

    /// One range read of keys only, from the prefix (or just after `after`) to the prefix's
    /// end, one key more than `limit` to tell whether more follow.
    async fn kv_list(
        &self,
        space: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<KvPage, StoreError> {
        let base = self.kv_base(space);
        let under = format!("{base}{prefix}");
        let end = range_end(under.as_bytes());
        let from = match after {
            Some(after) if after >= prefix => format!("{base}{after}\0"),
            _ => under,
        };
        if from.as_bytes() >= end.as_slice() {
            return Ok(KvPage::default());
        }
        let options = GetOptions::new()
            .with_range(end)
            .with_keys_only()
            .with_limit(i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX));
        let mut response = self
            .call("kv_list", space, || {
                let (mut kv, from, options) = (self.kv(), from.clone(), options.clone());
                async move { kv.get(from, Some(options)).await }
            })
            .await?;
        self.saw(response.header());
        let mut page = KvPage::default();
        for kv in response.take_kvs() {
            if page.keys.len() == limit {
                page.more = true;
                break;
            }
            let key = kv
                .key_str()
                .ok()
                .and_then(|k| k.strip_prefix(base.as_str()))
                .ok_or_else(|| {
                    StoreError::permanent(
                        self.kv_context("kv_list", space),
                        ForeignRecord("a key that is not UTF-8"),
                    )
                })?;
            page.keys.push(key.to_owned());
        }
        Ok(page)
    }

    async fn kv_usage(&self, space: &str) -> Result<KvUsage, StoreError> {
        let mut response = self
            .call("kv_usage", space, || {
                self.get_request(self.usage_key(space))
            })
            .await?;
        self.saw(response.header());
        match response
            .take_kvs()
            .first()
            .map(|kv| parse_usage(kv.value()).map(|(usage, _)| usage))
        {
            Some(Some(usage)) => Ok(usage),
            _ => self.scan_usage(space, 0).await,
        }
    }

    /// The usage key and the first page of keys in one transaction, so at one revision; the
    /// pages after it (and a scan for a namespace without usage) at that same revision.
    async fn kv_view(&self, space: &str, prefix: &str) -> Result<KvView, StoreError> {
        const OP: &str = "kv_view";
        let base = self.kv_base(space);
        let under = format!("{base}{prefix}");
        let end = range_end(under.as_bytes());
        let first = Txn::new().and_then([
            TxnOp::get(self.usage_key(space), None),
            TxnOp::get(
                under.clone(),
                Some(
                    GetOptions::new()
                        .with_range(end.clone())
                        .with_keys_only()
                        .with_limit(SCAN_PAGE),
                ),
            ),
        ]);
        let response = self.txn(OP, space, first).await?;
        let revision = response
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let mut answers = response.op_responses().into_iter();
        let (Some(TxnOpResponse::Get(mut usage)), Some(TxnOpResponse::Get(mut keys))) =
            (answers.next(), answers.next())
        else {
            return Err(StoreError::permanent(
                self.kv_context(OP, space),
                KvFault::ShortAnswer,
            ));
        };
        let mut view = KvView::default();
        loop {
            let more = keys.more();
            let kvs = keys.take_kvs();
            for kv in &kvs {
                let key = kv
                    .key_str()
                    .ok()
                    .and_then(|k| k.strip_prefix(base.as_str()))
                    .ok_or_else(|| {
                        StoreError::permanent(
                            self.kv_context(OP, space),
                            ForeignRecord("a key that is not UTF-8"),
                        )
                    })?;
                view.keys.push(key.to_owned());
            }
            let Some(last) = kvs.last().filter(|_| more) else {
                break;
            };
            let mut from = last.key().to_vec();
            from.push(0);
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_keys_only()
                .with_limit(SCAN_PAGE)
                .with_revision(revision);
            keys = self
                .call(OP, space, || {
                    let (mut kv, from, options) = (self.kv(), from.clone(), options.clone());
                    async move { kv.get(from, Some(options)).await }
                })
                .await?;
        }
        let usage = usage
            .take_kvs()
            .first()
            .and_then(|kv| parse_usage(kv.value()).map(|(usage, _)| usage));
        view.usage = match usage {
            Some(usage) => usage,
            None => self.scan_usage(space, revision).await?,
        };
        Ok(view)
    }

    async fn kv_apply(
        &self,
        fence: &Fence<'_>,
        space: &str,
        op: &KvOp<'_>,
        quota: &KvQuota,
    ) -> Result<Result<KvDone, KvRefusal>, StoreError> {
        const OP: &str = "kv_apply";
        let mut keys: Vec<&str> = Vec::new();
        for key in op.keys() {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        if keys.len() > MAX_BATCH {
            let fault = KvFault::TooManyKeys(keys.len());
            return Err(StoreError::permanent(self.kv_context(OP, space), fault));
        }
        let Ok(term) = i64::try_from(fence.term) else {
            return Ok(Err(KvRefusal::StaleTerm));
        };
        let reads = self.read_ops(fence.lease_key, space, &keys);
        let response = self
            .txn(OP, space, Txn::new().and_then(reads.clone()))
            .await?;
        let mut read = self.snapshot(space, term, &keys, response.op_responses())?;
        let mark = write_mark();
        for _ in 0..ATTEMPTS {
            let Some((created, handed)) = read.fence else {
                return Ok(Err(KvRefusal::StaleTerm));
            };
            let usage = match read.usage {
                Some(usage) => usage,
                None => self.scan_usage(space, 0).await?,
            };
            let old: HashMap<&str, Option<&[u8]>> = read
                .keys
                .iter()
                .map(|(key, _, value)| (key.as_str(), value.as_deref()))
                .collect();
            let plan = match kv::plan(op, &old, usage, quota) {
                Ok(plan) => plan,
                Err(refusal) => return Ok(Err(refusal)),
            };
            if plan.changes.is_empty() {
                return Ok(Ok(plan.done));
            }
            let fenced = (fence, created, handed);
            let write = self.write_txn(fenced, space, &read, plan.changes, (plan.usage, mark));
            let response = self.txn(OP, space, write.or_else(reads.clone())).await?;
            if response.succeeded() {
                return Ok(Ok(plan.done));
            }
            read = self.snapshot(space, term, &keys, response.op_responses())?;
            if read.usage_mark == Some(mark) {
                // This very write landed; its answer was lost and the request sent again.
                return Ok(Ok(plan.done));
            }
        }
        let fault = KvFault::Contended(ATTEMPTS);
        Err(StoreError::transient(self.kv_context(OP, space), fault))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::TtlStore;
    use crate::store::etcd::tests::Etcd;

    /// A fenced write whose answer was lost and whose request was sent again: the second send
    /// fails its compares against the first's own revisions, and the usage key it reads back
    /// carries this write's mark, so `kv_apply` answers it as done instead of applying the
    /// plan again.
    #[tokio::test]
    async fn a_write_sent_again_after_it_landed_is_known_for_its_own() {
        let Some(etcd) = Etcd::start() else { return };
        let s = etcd.store().await;
        let term = s
            .insert_if_absent("k", "a", Duration::from_mins(1))
            .await
            .unwrap()
            .unwrap();
        let fence = Fence {
            lease_key: "k",
            term,
        };
        let term = i64::try_from(term).unwrap();
        let keys = ["n"];
        let reads = s.read_ops("k", "svc", &keys);
        let response = s.txn("t", "svc", Txn::new().and_then(reads.clone()));
        let response = response.await.unwrap();
        let read = s
            .snapshot("svc", term, &keys, response.op_responses())
            .unwrap();
        let (created, handed) = read.fence.unwrap();
        let op = KvOp::Increment { key: "n", delta: 1 };
        let old = HashMap::from([("n", None)]);
        let plan = kv::plan(&op, &old, KvUsage::default(), &KvQuota::UNLIMITED).unwrap();
        let mark = write_mark();
        assert_ne!(mark, write_mark(), "each write has its own mark");
        let write = || {
            let changes = plan.changes.clone();
            s.write_txn(
                (&fence, created, handed),
                "svc",
                &read,
                changes,
                (plan.usage, mark),
            )
            .or_else(reads.clone())
        };
        assert!(s.txn("t", "svc", write()).await.unwrap().succeeded());
        let again = s.txn("t", "svc", write()).await.unwrap();
        assert!(!again.succeeded());
        let after = s
            .snapshot("svc", term, &keys, again.op_responses())
            .unwrap();
        assert_eq!(after.usage_mark, Some(mark));
        assert_eq!(s.kv_get("svc", "n").await.unwrap(), Some(b"1".to_vec()));
    }
}
