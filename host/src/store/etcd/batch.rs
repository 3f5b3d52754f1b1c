//! A batch of fenced key-value writes on etcd ([`FencedKv::kv_apply_batch`]) in one
//! conditional transaction, and what this handle knows of the keys it wrote, so that the
//! transaction is most often the only request.
//!
//! One transaction for the batch: its compares are, for each lease a write is made under,
//! the record's create revision and its term key's mod revision (the fence: a new term is a
//! new create revision, or a handover's put of the term key), and for each namespace written
//! and each key touched, its mod revision (0: absent), as this handle knows them. Its success
//! branch puts each key's final value (or deletes it) and each namespace's new usage; its
//! failure branch reads all of those keys. The plan is made before it is sent: the writes in
//! order, each fenced by the term its lease has, each seeing the keys as the writes before it
//! left them ([`kv::plan`]), each answered on its own. If the compares hold, every answer
//! holds, refusals included: nothing of what they were decided from changed.
//!
//! What this handle knows ([`Known`]): each key's mod revision and value as of the last read
//! or the last write of its own that succeeded (a successful transaction's puts all carry its
//! header's revision). A key it knows is not read before the write: a service that keeps
//! writing its own keys (a counter) writes in one round trip where two were needed (a read,
//! then the conditional write). A key it does not know is read first, all of them in one
//! transaction. When a compare fails (another host wrote, a lease moved, what was known is
//! old), the failure branch's reads are what the next plan is made from, for at most
//! [`CONTENDED_PATIENCE`]. What is known is bounded ([`KNOWN_KEYS`], [`KNOWN_BYTES`]): past
//! it, it is forgotten, and the next batch reads first.
//!
//! A batch whose answer was lost and whose request the client sent again finds its compares
//! failed against its own revisions: each usage key it wrote carries the batch's mark
//! ([`write_mark`]), so it is known for its own rather than planned and applied again (an
//! increment counted twice).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::EtcdStore;
use super::kv::{KvFault, parse_usage, write_mark};
use crate::store::StoreError;
use crate::store::kv::{self, FencedWrite, KvAnswer, KvRefusal, KvUsage, MAX_BATCH};

/// How long a batch is planned and tried again against keys that other writers keep
/// changing, before it fails with a transient error.
const CONTENDED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest random pause between two tries, in microseconds.
const MAX_PAUSE_MICROS: u64 = 10_000;

/// The most keys (values and usage keys) a handle keeps what it knows of.
const KNOWN_KEYS: usize = 10_000;
/// The most bytes of values it keeps; a value larger than a 64th of it is not kept.
const KNOWN_BYTES: usize = 16 << 20;

/// A key of the key-value space (a value or a usage key) as this handle last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Known {
    /// Its mod revision; 0: absent.
    revision: i64,
    /// Its value; `None`: absent.
    value: Option<Vec<u8>>,
}

/// A lease record as fencing reads it: its create revision (0: absent) and its term key's
/// mod revision (0: absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Lease {
    created: i64,
    handed: i64,
}

impl Lease {
    /// The term it carries, if it is there: as `term_of` reads it, the later of its create
    /// revision and a handover's.
    fn term(self) -> Option<u64> {
        let term = self.handed.max(self.created);
        (self.created > 0)
            .then(|| u64::try_from(term).ok())
            .flatten()
    }
}

/// What a handle knows of keys and leases, bounded.
#[derive(Default)]
pub(super) struct KnownKeys {
    keys: HashMap<String, Known>,
    leases: HashMap<String, Lease>,
    bytes: usize,
}

impl KnownKeys {
    fn remember(&mut self, key: &str, known: &Known) {
        let size = known.value.as_ref().map_or(0, Vec::len);
        if size > KNOWN_BYTES / 64 {
            self.forget(key);
            return;
        }
        if self.keys.len() >= KNOWN_KEYS || self.bytes + size > KNOWN_BYTES {
            *self = Self::default();
        }
        self.bytes += size;
        if let Some(old) = self.keys.insert(key.to_owned(), known.clone()) {
            self.bytes -= old.value.map_or(0, |v| v.len());
        }
    }

    fn forget(&mut self, key: &str) {
        if let Some(old) = self.keys.remove(key) {
            self.bytes -= old.value.map_or(0, |v| v.len());
        }
    }
}

/// The keys a batch needs, and what is known of them for its next plan.
struct View {
    /// The lease records by lease key.
    leases: BTreeMap<String, Lease>,
    /// The values and usage keys by etcd key.
    keys: BTreeMap<String, Known>,
}

/// A batch's plan: each write's answer, and what the transaction writes.
struct Plan {
    answers: Vec<KvAnswer>,
    /// Each changed key's final value, by etcd key.
    changes: BTreeMap<String, Option<Vec<u8>>>,
    /// Each changed namespace's usage key and new usage.
    usages: BTreeMap<String, KvUsage>,
}

impl EtcdStore {
    /// One transaction for the batch, as the module's docs say.
    pub(super) async fn apply_batch(
        &self,
        writes: &[FencedWrite],
    ) -> Result<Vec<KvAnswer>, StoreError> {
        const OP: &str = "kv_apply";
        let first = writes.first().map_or("", |w| w.space.as_str());
        for write in writes {
            let keys = write.op.keys().len();
            if keys > MAX_BATCH {
                let fault = KvFault::TooManyKeys(keys);
                return Err(StoreError::permanent(
                    self.kv_context(OP, &write.space),
                    fault,
                ));
            }
        }
        // One batch of this handle at a time: its batches would only fail each other's
        // compares (every write of a namespace writes its usage key). Behind a group commit
        // there is one at a time anyway.
        let _turn = self.batching.lock().await;
        let (mut view, unknown, known) = self.known_view(writes);
        // Whether every key of the view was read at one revision, just now.
        let mut fresh = known == 0;
        if !unknown.is_empty() {
            let response = self
                .txn(OP, first, Txn::new().and_then(gets(&unknown)))
                .await?;
            self.take_reads(&mut view, &unknown, &response.op_responses())?;
        }
        let mark = write_mark();
        let give_up = tokio::time::Instant::now() + CONTENDED_PATIENCE;
        let mut tries = 0;
        loop {
            tries += 1;
            if tries > 2 {
                // Writers of other handles keep winning (one that just wrote knows its keys,
                // and writes again in one round trip): a random pause that grows, so that
                // they stop meeting. The first retry goes at once: what this handle knew was
                // most likely only old.
                let most = (500 * u64::from(tries)).min(MAX_PAUSE_MICROS);
                let pause = write_mark() % most;
                tokio::time::sleep(std::time::Duration::from_micros(pause)).await;
            }
            let plan = self.plan(writes, &view).await?;
            if plan.changes.is_empty() && fresh {
                // Answered from one read, at one revision, as a single refusal always was.
                return Ok(plan.answers);
            }
            let (txn, compared) = self.batch_txn(&view, &plan, mark);
            let response = self.txn(OP, first, txn).await?;
            if response.succeeded() {
                self.wrote(&view, &plan, &response, mark);
                return Ok(plan.answers);
            }
            self.take_reads(&mut view, &compared, &response.op_responses())?;
            fresh = true;
            if landed(&view, &plan, mark) {
                // This very batch landed; its answer was lost and the request sent again.
                return Ok(plan.answers);
            }
            if tokio::time::Instant::now() >= give_up {
                break;
            }
        }
        let fault = KvFault::Contended(tries);
        Err(StoreError::transient(self.kv_context(OP, first), fault))
    }

    /// What this handle knows of the keys `writes` need, the etcd keys it does not know (a
    /// lease record and its term key are read together), and how many it knows.
    fn known_view(&self, writes: &[FencedWrite]) -> (View, Vec<String>, usize) {
        let known = self.known();
        let mut view = View {
            leases: BTreeMap::new(),
            keys: BTreeMap::new(),
        };
        let mut unknown = BTreeSet::new();
        let mut hits = 0;
        for write in writes {
            if let Some(lease) = known.leases.get(&write.lease_key) {
                hits += 1;
                view.leases.insert(write.lease_key.clone(), *lease);
            } else {
                unknown.insert(self.record_key(&write.lease_key));
                unknown.insert(self.term_key(&write.lease_key));
                view.leases.entry(write.lease_key.clone()).or_default();
            }
            let usage = self.usage_key(&write.space);
            let keys = write.op.keys();
            let kv_keys = keys.iter().map(|key| self.kv_key(&write.space, key));
            for key in std::iter::once(usage).chain(kv_keys) {
                if let Some(k) = known.keys.get(&key) {
                    hits += 1;
                    view.keys.insert(key, k.clone());
                } else {
                    unknown.insert(key.clone());
                    view.keys.entry(key).or_default();
                }
            }
        }
        (view, unknown.into_iter().collect(), hits)
    }

    /// Fills `view` with what reads of `keys` (in that order) found, and remembers it.
    fn take_reads(
        &self,
        view: &mut View,
        keys: &[String],
        answers: &[TxnOpResponse],
    ) -> Result<(), StoreError> {
        if answers.len() != keys.len() {
            let context = self.kv_context("kv_apply", "");
            return Err(StoreError::permanent(context, KvFault::ShortAnswer));
        }
        let mut found: HashMap<&str, Option<&KeyValue>> = HashMap::new();
        for (key, answer) in keys.iter().zip(answers) {
            let TxnOpResponse::Get(get) = answer else {
                let context = self.kv_context("kv_apply", "");
                return Err(StoreError::permanent(context, KvFault::ShortAnswer));
            };
            found.insert(key, get.kvs().first());
        }
        let mut known = self.known();
        for (name, lease) in &mut view.leases {
            let record = self.record_key(name);
            let Some(read) = found.get(record.as_str()) else {
                continue;
            };
            let handed = found.get(self.term_key(name).as_str()).copied().flatten();
            *lease = Lease {
                created: read.map_or(0, KeyValue::create_revision),
                handed: handed.map_or(0, KeyValue::mod_revision),
            };
            known.leases.insert(name.clone(), *lease);
        }
        for (key, k) in &mut view.keys {
            let Some(read) = found.get(key.as_str()) else {
                continue;
            };
            *k = Known {
                revision: read.map_or(0, KeyValue::mod_revision),
                value: read.map(|kv| kv.value().to_vec()),
            };
            known.remember(key, k);
        }
        Ok(())
    }

    /// The writes in order over `view`: each answer, and what the batch changes.
    async fn plan(&self, writes: &[FencedWrite], view: &View) -> Result<Plan, StoreError> {
        let mut values: HashMap<String, Option<Vec<u8>>> = view
            .keys
            .iter()
            .map(|(key, known)| (key.clone(), known.value.clone()))
            .collect();
        let mut usages: HashMap<String, KvUsage> = HashMap::new();
        let mut plan = Plan {
            answers: Vec::with_capacity(writes.len()),
            changes: BTreeMap::new(),
            usages: BTreeMap::new(),
        };
        for write in writes {
            let lease = view
                .leases
                .get(&write.lease_key)
                .copied()
                .unwrap_or_default();
            if lease.term() != Some(write.term) {
                plan.answers.push(Err(KvRefusal::StaleTerm));
                continue;
            }
            let usage_key = self.usage_key(&write.space);
            let usage = if let Some(usage) = usages.get(&usage_key) {
                *usage
            } else {
                let usage = self
                    .usage_from(&write.space, values.get(&usage_key))
                    .await?;
                usages.insert(usage_key.clone(), usage);
                usage
            };
            let planned = write.op.with(|op| {
                let old: HashMap<&str, Option<&[u8]>> = op
                    .keys()
                    .map(|key| {
                        let value = values.get(&self.kv_key(&write.space, key));
                        (key, value.and_then(Option::as_deref))
                    })
                    .collect();
                kv::plan(op, &old, usage, &write.quota)
            });
            match planned {
                Ok(done) => {
                    if !done.changes.is_empty() {
                        plan.usages.insert(usage_key.clone(), done.usage);
                    }
                    for (key, value) in done.changes {
                        let key = self.kv_key(&write.space, &key);
                        values.insert(key.clone(), value.clone());
                        plan.changes.insert(key, value);
                    }
                    usages.insert(usage_key, done.usage);
                    plan.answers.push(Ok(done.done));
                }
                Err(refusal) => plan.answers.push(Err(refusal)),
            }
        }
        // Each changed namespace's usage after the last write to it.
        for (key, usage) in &mut plan.usages {
            if let Some(last) = usages.get(key) {
                *usage = *last;
            }
        }
        Ok(plan)
    }

    /// `space`'s usage from its usage key's value (`Some(None)`: absent), or, with none
    /// readable (a namespace written before usage was kept), from a scan.
    async fn usage_from(
        &self,
        space: &str,
        stored: Option<&Option<Vec<u8>>>,
    ) -> Result<KvUsage, StoreError> {
        let stored = stored.and_then(Option::as_deref);
        if let Some((usage, _)) = stored.and_then(parse_usage) {
            return Ok(usage);
        }
        if stored.is_some() {
            tracing::warn!(space, "unreadable etcd usage key; counting the namespace");
        }
        self.scan_usage(space, 0).await
    }

    /// The batch's transaction, and the keys its failure branch reads, in order.
    fn batch_txn(&self, view: &View, plan: &Plan, mark: u64) -> (Txn, Vec<String>) {
        let mut compares = Vec::new();
        let mut compared = Vec::new();
        for (name, lease) in &view.leases {
            let (record, term) = (self.record_key(name), self.term_key(name));
            compares.push(Compare::create_revision(
                record.clone(),
                CompareOp::Equal,
                lease.created,
            ));
            compares.push(Compare::mod_revision(
                term.clone(),
                CompareOp::Equal,
                lease.handed,
            ));
            compared.extend([record, term]);
        }
        for (key, known) in &view.keys {
            compares.push(Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                known.revision,
            ));
            compared.push(key.clone());
        }
        let mut ops: Vec<TxnOp> = plan
            .changes
            .iter()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(key.clone(), value.clone(), None),
                None => TxnOp::delete(key.clone(), None),
            })
            .collect();
        for (key, usage) in &plan.usages {
            let figures = format!("{} {} {mark:016x}", usage.keys, usage.bytes);
            ops.push(TxnOp::put(key.clone(), figures, None));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then(ops)
            .or_else(gets(&compared));
        (txn, compared)
    }

    /// Remembers what a successful batch wrote: its keys and usage keys at its revision.
    fn wrote(&self, view: &View, plan: &Plan, response: &TxnResponse, mark: u64) {
        self.saw(response.header());
        let revision = response
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        let mut known = self.known();
        for (name, lease) in &view.leases {
            known.leases.insert(name.clone(), *lease);
        }
        for (key, value) in &plan.changes {
            let k = Known {
                revision: if value.is_some() { revision } else { 0 },
                value: value.clone(),
            };
            known.remember(key, &k);
        }
        for (key, usage) in &plan.usages {
            let figures = format!("{} {} {mark:016x}", usage.keys, usage.bytes);
            let k = Known {
                revision,
                value: Some(figures.into_bytes()),
            };
            known.remember(key, &k);
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, KnownKeys> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether `view`, read after the batch `plan` (sent with `mark`) failed its compares, shows
/// that very batch landed: a usage key it wrote carries its mark.
fn landed(view: &View, plan: &Plan, mark: u64) -> bool {
    plan.usages.keys().any(|usage| {
        let value = view.keys.get(usage).and_then(|k| k.value.as_deref());
        value.and_then(parse_usage).and_then(|(_, m)| m) == Some(mark)
    })
}

/// A get of each of `keys`.
fn gets(keys: &[String]) -> Vec<TxnOp> {
    keys.iter()
        .map(|key| TxnOp::get(key.clone(), None))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::etcd::tests::Etcd;
    use crate::store::kv::{KvQuota, OwnedOp};
    use crate::store::{FencedKv as _, TtlStore as _};

    /// A batch whose answer was lost and whose request was sent again: the second send fails
    /// its compares against the first's own revisions, and the usage key it reads back
    /// carries this batch's mark, so it is answered as done instead of applied again.
    #[tokio::test]
    async fn a_batch_sent_again_after_it_landed_is_known_for_its_own() {
        let Some(etcd) = Etcd::start() else { return };
        let s = etcd.store().await;
        let term = s
            .insert_if_absent("k", "a", Duration::from_mins(1))
            .await
            .unwrap()
            .unwrap();
        let writes = [FencedWrite {
            writer: "svc".to_owned(),
            lease_key: "k".to_owned(),
            term,
            space: "svc".to_owned(),
            op: OwnedOp::Increment("n".to_owned(), 1),
            quota: KvQuota::UNLIMITED,
        }];
        let (mut view, unknown, _) = s.known_view(&writes);
        let read = s.txn("t", "svc", Txn::new().and_then(gets(&unknown)));
        let read = read.await.unwrap();
        s.take_reads(&mut view, &unknown, &read.op_responses())
            .unwrap();
        let plan = s.plan(&writes, &view).await.unwrap();
        let mark = write_mark();
        assert_ne!(mark, write_mark(), "each batch has its own mark");
        let (txn, _) = s.batch_txn(&view, &plan, mark);
        assert!(s.txn("t", "svc", txn).await.unwrap().succeeded());
        let (txn, compared) = s.batch_txn(&view, &plan, mark);
        let again = s.txn("t", "svc", txn).await.unwrap();
        assert!(!again.succeeded());
        s.take_reads(&mut view, &compared, &again.op_responses())
            .unwrap();
        assert!(landed(&view, &plan, mark));
        assert_eq!(s.kv_get("svc", "n").await.unwrap(), Some(b"1".to_vec()));
    }

    /// What a handle knows stands in for a read until another host writes: then the batch's
    /// compares fail, and it is planned again from what the failure branch read. Two handles
    /// take turns incrementing one key; each answer counts every increment before it.
    #[tokio::test]
    async fn what_a_handle_knows_goes_stale_and_the_batch_is_planned_again() {
        let Some(etcd) = Etcd::start() else { return };
        let (a, b) = (etcd.store().await, etcd.store().await);
        let term = a
            .insert_if_absent("k", "a", Duration::from_mins(1))
            .await
            .unwrap()
            .unwrap();
        let fence = crate::store::Fence {
            writer: "svc",
            lease_key: "k",
            term,
        };
        let op = crate::store::KvOp::Increment { key: "n", delta: 1 };
        for n in 1..=6_i64 {
            let s = if n % 2 == 0 { &a } else { &b };
            let done = s.kv_apply(&fence, "svc", &op, &KvQuota::UNLIMITED).await;
            assert_eq!(done.unwrap(), Ok(crate::store::KvDone::Number(n)));
        }
    }
}
