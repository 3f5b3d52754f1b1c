//! The TTL store contract (SPEC §3): lease records with a term and a store-side expiry.
//!
//! Every backend ([`MemStore`], [`RedbStore`], [`EtcdStore`]) implements [`TtlStore`] and
//! [`FencedKv`]; one conformance suite (`conformance.rs`) runs against each of them. Tests
//! put `faulty::FaultyStore` (feature `testing`) in front of a [`MemStore`] to inject faults.

#[cfg(test)]
pub(crate) mod conformance;
mod etcd;
#[cfg(any(test, feature = "testing"))]
pub mod faulty;
mod group;
pub mod kv;
mod mem;
mod open;
mod redb_store;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use etcd::{EtcdOptions, EtcdStore, EtcdTls, EtcdUrlError};
pub use group::{BatchReport, GroupCommit};
pub use kv::{
    BatchCapacity, FencedWrite, KvAnswer, KvDone, KvOp, KvPage, KvQuota, KvRefusal, KvUsage,
    KvView, KvWrite, MAX_BATCH, OwnedOp,
};
pub use mem::MemStore;
pub use open::{OpenedStore, StoreSettings, open};
pub use redb_store::RedbStore;

/// Fencing token: strictly increases every time a key is acquired, for the life of the store.
pub type Term = u64;

/// A boxed error from a backend library, kept as the cause of a [`StoreError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A live record as [`TtlStore::get`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The holder value written by the last successful insert or swap.
    pub value: String,
    /// The term issued when the record was inserted (a swap keeps it).
    pub term: Term,
    /// How long until the store treats the record as absent, by the store's own clock.
    pub time_left: Duration,
    /// How long the record surely stays live from the read: `time_left` where the store
    /// keeps exact time; less on etcd, which reports whole seconds. A host that takes a
    /// record over by reading it ([`TtlStore::hand_over`]) counts its lease from this.
    pub lives_at_least: Duration,
}

/// The hosts a record may be handed to ([`TtlStore::hand_over`]).
#[derive(Clone)]
pub struct Candidates {
    /// The prefix of their candidacy records: each record's value is a host's holder value.
    pub prefix: String,
    /// Whether the host of a candidacy value can take a lease over now (its process is not
    /// stopped, say); the others are passed over.
    pub eligible: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl Candidates {
    /// Every live candidacy record under `prefix`.
    pub fn any(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            eligible: Arc::new(|_| true),
        }
    }
}

impl HandOver {
    /// What a compare-and-delete that did (`true`) or did not delete amounts to.
    pub fn deleted_if(deleted: bool) -> Self {
        if deleted {
            Self::Deleted
        } else {
            Self::NotHeld
        }
    }
}

impl std::fmt::Debug for Candidates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidates")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// What [`TtlStore::hand_over`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandOver {
    /// No live record with the expected value: nothing changed.
    NotHeld,
    /// No live candidate: the record was deleted, as by [`TtlStore::compare_and_delete`].
    Deleted,
    /// The record now holds the candidate's value `to`, with the new `term`.
    To {
        /// The candidate's value, now the record's.
        to: String,
        /// The term issued for the handover.
        term: Term,
    },
}

/// Why a store operation failed, and whether trying again can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Worth retrying: I/O hiccup, timeout, busy lock, unreachable or quorum-less cluster.
    #[error("{context}: {source}")]
    Transient {
        /// What was being done, naming the store (path or endpoints).
        context: String,
        /// The backend's own error.
        source: BoxError,
    },
    /// Retrying will not help: corrupt or foreign file, incompatible schema, bad credentials.
    #[error("{context}: {source}")]
    Permanent {
        /// What was being done, naming the store (path or endpoints).
        context: String,
        /// The backend's own error.
        source: BoxError,
    },
}

impl StoreError {
    /// A failure that may go away if the operation is tried again.
    pub fn transient(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Transient {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A failure that will not go away by retrying.
    pub fn permanent(context: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Permanent {
            context: context.into(),
            source: source.into(),
        }
    }

    /// True if retrying the operation makes sense.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    /// The same failure again, for each write of a batch that failed with it: its kind, its
    /// context and its cause's text.
    #[must_use]
    pub fn for_each_write(&self) -> Self {
        match self {
            Self::Transient { context, source } => Self::transient(context, source.to_string()),
            Self::Permanent { context, source } => Self::permanent(context, source.to_string()),
        }
    }
}

/// The lease operations every backend provides (SPEC §3).
///
/// "Live" means present and not expired; an expired record behaves exactly as an absent one
/// for every operation. Expiry is decided by the store's own clock, never the caller's.
#[async_trait]
pub trait TtlStore: Send + Sync {
    /// Writes `value` under `key` for `ttl` if no live record exists there.
    ///
    /// Returns the new term, strictly greater than any term this store ever issued for `key`
    /// (also after deletes, expiry and reopening), or `None` if a live record exists, even
    /// one with the same value.
    async fn insert_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Term>, StoreError>;

    /// If the live value under `key` equals `expected`, replaces it with `new` and resets the
    /// expiry to now + `ttl`. Returns whether it did.
    async fn compare_and_swap(
        &self,
        key: &str,
        expected: &str,
        new: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;

    /// Deletes the live record under `key` if its value equals `expected`. Returns whether it
    /// did.
    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, StoreError>;

    /// Releases the live record under `key` if its value equals `expected`, passing it in
    /// the same write to a waiting host: of the live records under `candidates.prefix` whose
    /// value is eligible, the one written last (ties: the first by key) gives the record its
    /// value and a new term, as an insert would issue, expiring now + `ttl` (etcd: on the
    /// candidate's own lease); that candidate's record is deleted. With no such candidate the
    /// record is deleted, as by [`TtlStore::compare_and_delete`]. Either way
    /// [`TtlStore::wait_released`] waiters wake.
    ///
    /// One write instead of a delete and the next holder's insert: the candidate takes the
    /// lease over by reading it (SPEC §5, takeover targets).
    async fn hand_over(
        &self,
        key: &str,
        expected: &str,
        candidates: &Candidates,
        ttl: Duration,
    ) -> Result<HandOver, StoreError>;

    /// A [`TtlStore::hand_over`] to one of `candidates` is coming (the caller is stopping its
    /// services first): a backend whose handover reads the candidates before its write may
    /// read them now, so that the handover itself is one write. The read serves a handover
    /// that follows within about a second; the write still checks the chosen candidacy, and
    /// a view gone stale costs a second try with a fresh read. Does nothing by default.
    async fn prepare_hand_over(&self, candidates: &Candidates) {
        let _ = candidates;
    }

    /// The record at `key` as the release that ended this handle's last
    /// [`TtlStore::wait_released`] left it, if the backend already has it, with its time left
    /// counted as of this call; told once. etcd: from the watch event that woke the waiter,
    /// only for a record on a lease of this handle's own (a candidacy of its own, handed to
    /// it), whose life is known without asking; redb: from a read of the file that the
    /// bell's watch thread made right after the ring. `None` otherwise, and by default: the
    /// caller reads the record with [`TtlStore::get`]. Either way it saves the takeover's
    /// path a read.
    fn handed(&self, key: &str) -> Option<Record> {
        let _ = key;
        None
    }

    /// How long a waiting host's candidacy record lives for a lease `lease` long; the host
    /// rewrites it at a quarter of that. Short where a standby's writes cost nothing but the
    /// write, so the record's age tells a host that stopped renewing it; long on a backend
    /// whose writers can stall each other (redb), so standbys write rarely.
    fn candidacy_ttl(&self, lease: Duration) -> Duration;

    /// The live record under `key`, if any.
    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError>;

    /// Every live record whose key starts with `prefix`, sorted by key: the members and
    /// claims of spread placement ([`crate::placement`]), for the fair share and for status.
    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>, StoreError>;

    /// Renews in one write every live record whose key starts with one of `prefixes` and
    /// whose value's holder part ([`crate::lease_value::holder`]: the value up to its first
    /// newline) equals `holder`: each one's expiry becomes now + `ttl`, its value (whatever
    /// follows the holder too) and its term stay as they were. A value whose holder merely
    /// starts with `holder` is another holder's. Returns the renewed keys with their terms,
    /// sorted by key.
    ///
    /// Each record is renewed only as it was matched: one rewritten (another value, another
    /// term) or deleted by another writer between the match and the write is neither renewed
    /// nor returned, and a renewal never writes a value over another writer's.
    ///
    /// The caller names no keys: the store's records decide what it holds (seed 003, "the
    /// instance should never store a record of its claims in its own state"). A key the
    /// caller believed it held and that is not returned is lost to it.
    async fn renew_all(
        &self,
        prefixes: &[&str],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<(String, Term)>, StoreError>;

    /// Returns when a record of this store may have been released or deleted (by this process
    /// or another), or after `max` at the latest. Spurious wake-ups are allowed: callers look
    /// again with [`TtlStore::get`]. Lets a campaigner wait without polling blindly.
    ///
    /// Interest is registered at the future's first poll: a release after that poll wakes it,
    /// so a caller can poll once, look at the records, then wait without missing a release.
    async fn wait_released(&self, max: Duration);

    /// Returns once every write this handle started has ended, or after `max` at the latest.
    /// A write whose caller gave up (its future dropped, a timeout) may still be running and
    /// land later; cleanup waits here so that its delete comes after such a write. A backend
    /// whose writes cannot outlive their callers returns at once (the default).
    async fn settle(&self, max: Duration) {
        let _ = max;
    }
}

/// A key-value store for guests whose writes are fenced by the writer's lease (SPEC §7, §10).
/// Keys live in namespaces (`space`: a service's name, or `bucket/NAME`); see [`kv`].
///
/// Reads are not fenced: a standby may read (`vvm-host kv`), and a read cannot act on the
/// world. Each read sees one committed state of the store.
#[async_trait]
pub trait FencedKv: Send + Sync {
    /// The value under `key` in the namespace `space`, if any.
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// The values under `keys` in `space`, in the order asked, read at one revision. At most
    /// [`MAX_BATCH`] keys: the caller checks.
    async fn kv_get_many(
        &self,
        space: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError>;

    /// Up to `limit` keys of `space` that start with `prefix` and sort after `after` (byte
    /// order), in byte order, and whether more follow: the page after a page is the one
    /// `after` its last key. A key written between two pages is listed if it sorts after the
    /// first page's last key.
    async fn kv_list(
        &self,
        space: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<KvPage, StoreError>;

    /// What `space` holds: its keys and their bytes, as the quota counts them.
    async fn kv_usage(&self, space: &str) -> Result<KvUsage, StoreError>;

    /// Every key of `space` that starts with `prefix`, in byte order, with what the namespace
    /// holds, read from one committed state of the store (`vvm-host kv list`): the keys
    /// listed and the figures never come from two states.
    async fn kv_view(&self, space: &str, prefix: &str) -> Result<KvView, StoreError>;

    /// Applies `op` to `space` as [`kv::plan`] decides, in one transaction with a check that
    /// the live record under `fence.lease_key` still carries `fence.term` and with the
    /// namespace's usage under `quota`: all of it lands or none. A stale term refuses the
    /// write ([`KvRefusal::StaleTerm`]) before anything else is decided, so a stale writer
    /// never learns a value through a swap and never wins one. Concurrent writers to one
    /// namespace (services sharing a bucket) are serialised by the store: none is lost and
    /// the usage stays exact.
    ///
    /// A batch of one ([`FencedKv::kv_apply_batch`]); a [`GroupCommit`] in front of the store
    /// applies it in one transaction with the writes of others.
    async fn kv_apply(
        &self,
        fence: &Fence<'_>,
        space: &str,
        op: &KvOp<'_>,
        quota: &KvQuota,
    ) -> Result<KvAnswer, StoreError> {
        let write = FencedWrite::new(fence, space, op, quota);
        let answers = self.kv_apply_batch(std::slice::from_ref(&write)).await?;
        answers.into_iter().next().ok_or_else(|| {
            StoreError::permanent(format!("kv_apply in {space:?}"), "the store gave no answer")
        })
    }

    /// Applies `writes` in order in one transaction, which is durable before this returns:
    /// each as [`FencedKv::kv_apply`] would alone, seeing the writes before it, with its own
    /// answer, in the order given. A refusal (a stale term, a quota, a swap that lost, a
    /// value that is not a number) writes nothing of that write and leaves the others be;
    /// the term of each distinct lease is checked once, in the same transaction. An error
    /// is the whole batch's: none of it was acknowledged, and none of it may have landed
    /// (a store that cannot tell, such as one whose answer was lost, says so by a transient
    /// error, as a single write does).
    ///
    /// At most [`FencedKv::batch_capacity`] (the caller checks), each write of at most
    /// [`MAX_BATCH`] keys.
    async fn kv_apply_batch(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError>;

    /// Whether this store applies a batch on the calling thread, blocking it
    /// ([`FencedKv::kv_apply_batch_blocking`]): a transaction that runs on a thread anyway
    /// (redb). A [`GroupCommit`] then commits its batches one after another on one thread of
    /// the blocking pool, without a hop to an async task and back between two of them.
    fn blocking_batches(&self) -> bool {
        false
    }

    /// Applies `writes` as [`FencedKv::kv_apply_batch`] does, on the calling thread, which
    /// it blocks until the transaction is durable. Only where
    /// [`FencedKv::blocking_batches`].
    ///
    /// # Errors
    /// As [`FencedKv::kv_apply_batch`]; a permanent error where batches do not block (the
    /// default).
    fn kv_apply_batch_blocking(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        let _ = writes;
        Err(StoreError::permanent(
            "kv_apply_batch_blocking",
            "this store applies batches asynchronously",
        ))
    }

    /// What one transaction of this store takes ([`FencedKv::kv_apply_batch`]).
    fn batch_capacity(&self) -> BatchCapacity {
        BatchCapacity {
            ops: 1024,
            bytes: 4 << 20,
        }
    }
}

/// The lease a fenced write is made under, and who makes it.
#[derive(Clone, Copy, Debug)]
pub struct Fence<'a> {
    /// Who writes (a service): a [`GroupCommit`] takes from each writer in turn.
    pub writer: &'a str,
    /// The lease record's key (the slot).
    pub lease_key: &'a str,
    /// The term the writer acquired that lease with.
    pub term: Term,
}

/// Everything a host needs from a store: leases and the guests' fenced key-value space.
pub trait Store: TtlStore + FencedKv {}

impl<T: TtlStore + FencedKv + ?Sized> Store for T {}
