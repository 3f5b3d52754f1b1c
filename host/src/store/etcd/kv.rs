//! The guests' fenced key-value space on etcd ([`FencedKv`]): its keys, each namespace's usage
//! key, and the reads.
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
//! A fenced write is applied in a batch, in one conditional transaction: see `batch.rs`.

use async_trait::async_trait;
use etcd_client::{GetOptions, Txn, TxnOp, TxnOpResponse};

use super::{EtcdStore, ForeignRecord};
use crate::store::kv::{FencedWrite, KvAnswer, KvPage, KvUsage, KvView, MAX_BATCH};
use crate::store::{BatchCapacity, FencedKv, StoreError};

/// The largest response the client decodes (tonic's default: 4 MiB). etcd sends responses of
/// any size; a value came in one request, so it is at most `--max-request-bytes` (1.5 MiB by
/// default), and a read of [`MAX_BATCH`] values and the fence's keys fits with room.
pub(super) const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// The most compares, or ops, that etcd takes at one level of a transaction by default
/// (`--max-txn-ops`).
const ETCD_MAX_TXN_OPS: usize = 128;

/// What one transaction of a batch holds at most: its compares, success ops and failure
/// reads are each at most the batch's [`FencedWrite::ops`] (a key of each write, and the
/// lease's two keys and the usage key), so within etcd's default `--max-txn-ops`; and its
/// values well within `--max-request-bytes` (1.5 MiB by default), a value being at most
/// 1 MiB.
pub(super) const CAPACITY: BatchCapacity = BatchCapacity {
    ops: ETCD_MAX_TXN_OPS,
    bytes: 1 << 20,
};

const _: () = assert!(MAX_BATCH + 3 <= CAPACITY.ops);

/// Keys per page of a scan of a namespace (its usage, before usage was kept).
const SCAN_PAGE: i64 = 100;

/// A write that could not be applied.
#[derive(Debug, thiserror::Error)]
pub(super) enum KvFault {
    /// Other writers changed the namespace under every try.
    #[error("the namespace changed under each of {0} tries")]
    Contended(u32),
    /// More distinct keys than one transaction takes.
    #[error("a write of {0} keys: at most {MAX_BATCH}")]
    TooManyKeys(usize),
    /// etcd answered a read with fewer results than it was asked for.
    #[error("etcd answered a read with fewer results than asked")]
    ShortAnswer,
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
pub(super) fn parse_usage(value: &[u8]) -> Option<(KvUsage, Option<u64>)> {
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
pub(super) fn write_mark() -> u64 {
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

    pub(super) fn usage_key(&self, space: &str) -> String {
        format!("{}kvusage/{}", self.prefix, escape(space))
    }

    pub(super) fn kv_context(&self, op: &str, space: &str) -> String {
        format!("etcd {}: {op} in {space:?}", self.endpoints)
    }

    /// `space`'s usage from a scan of its keys: pages read at `revision` (0: at the first
    /// page's).
    pub(super) async fn scan_usage(
        &self,
        space: &str,
        revision: i64,
    ) -> Result<KvUsage, StoreError> {
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

    async fn kv_apply_batch(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        self.apply_batch(writes).await
    }

    fn batch_capacity(&self) -> BatchCapacity {
        CAPACITY
    }
}
