//! The guests' fenced key-value operations (SPEC §7, §10): their types, and what a write does
//! to a namespace ([`plan`]), decided once here so that every backend applies the same
//! outcome, refusal and usage figures in its own transaction.
//!
//! A namespace is a service's own space (its name) or a shared bucket (`bucket/NAME`). Its
//! usage is its number of keys and the bytes of its keys and values; a backend keeps it
//! beside the data, updated in each write's transaction, so a quota is exact and costs no
//! scan.

use std::collections::HashMap;
use std::hash::BuildHasher;

/// The most keys one write or read of many keys may touch: etcd takes at most 128
/// operations in a transaction, and a fenced batch needs a few for the fence and the usage.
pub const MAX_BATCH: usize = 100;

/// One write of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvWrite<'a> {
    /// Puts `value` under `key`.
    Set {
        /// The key.
        key: &'a str,
        /// The value.
        value: &'a [u8],
    },
    /// Removes `key`, if present.
    Delete {
        /// The key.
        key: &'a str,
    },
}

impl<'a> KvWrite<'a> {
    /// The key written.
    #[must_use]
    pub fn key(&self) -> &'a str {
        match self {
            Self::Set { key, .. } | Self::Delete { key } => key,
        }
    }
}

/// A fenced write ([`super::FencedKv::kv_apply`]).
#[derive(Clone, Copy, Debug)]
pub enum KvOp<'a> {
    /// Sets and deletes, all or none, in order (a key written twice keeps the last).
    Batch(&'a [KvWrite<'a>]),
    /// Adds `delta` to the decimal integer under `key` (absent counts as 0) and stores the
    /// sum as decimal text.
    Increment {
        /// The key.
        key: &'a str,
        /// What to add.
        delta: i64,
    },
    /// Puts `new` under `key` if the stored bytes equal `expected` exactly (`None`: the key
    /// is absent); else writes nothing.
    Swap {
        /// The key.
        key: &'a str,
        /// What the key must hold.
        expected: Option<&'a [u8]>,
        /// What it then holds.
        new: &'a [u8],
    },
}

impl<'a> KvOp<'a> {
    /// Every key the write touches, in order (a batch may name one twice).
    pub fn keys(&self) -> impl Iterator<Item = &'a str> + '_ {
        let (batch, one): (&[KvWrite<'a>], Option<&'a str>) = match *self {
            Self::Batch(writes) => (writes, None),
            Self::Increment { key, .. } | Self::Swap { key, .. } => (&[], Some(key)),
        };
        batch.iter().map(KvWrite::key).chain(one)
    }
}

/// An owned [`KvOp`]: what a [`FencedWrite`] holds while it waits for its batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedOp {
    /// [`KvOp::Batch`]: each key with its new value (`None`: deleted).
    Batch(Vec<(String, Option<Vec<u8>>)>),
    /// [`KvOp::Increment`]: the key and what to add.
    Increment(String, i64),
    /// [`KvOp::Swap`]: the key, what it must hold, and what it then holds.
    Swap(String, Option<Vec<u8>>, Vec<u8>),
}

impl From<&KvOp<'_>> for OwnedOp {
    fn from(op: &KvOp<'_>) -> Self {
        match *op {
            KvOp::Batch(writes) => Self::Batch(
                writes
                    .iter()
                    .map(|w| match *w {
                        KvWrite::Set { key, value } => (key.to_owned(), Some(value.to_vec())),
                        KvWrite::Delete { key } => (key.to_owned(), None),
                    })
                    .collect(),
            ),
            KvOp::Increment { key, delta } => Self::Increment(key.to_owned(), delta),
            KvOp::Swap { key, expected, new } => {
                Self::Swap(key.to_owned(), expected.map(<[u8]>::to_vec), new.to_vec())
            }
        }
    }
}

impl OwnedOp {
    /// Calls `f` with the borrowed form.
    pub fn with<T>(&self, f: impl FnOnce(&KvOp<'_>) -> T) -> T {
        match self {
            Self::Batch(writes) => {
                let writes: Vec<KvWrite<'_>> = writes
                    .iter()
                    .map(|(key, value)| match value {
                        Some(value) => KvWrite::Set { key, value },
                        None => KvWrite::Delete { key },
                    })
                    .collect();
                f(&KvOp::Batch(&writes))
            }
            Self::Increment(key, delta) => f(&KvOp::Increment { key, delta: *delta }),
            Self::Swap(key, expected, new) => f(&KvOp::Swap {
                key,
                expected: expected.as_deref(),
                new,
            }),
        }
    }

    /// Every key the write touches, once each, in the order first named.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            Self::Batch(writes) => {
                let mut keys: Vec<&str> = Vec::with_capacity(writes.len());
                for (key, _) in writes {
                    if !keys.contains(&key.as_str()) {
                        keys.push(key);
                    }
                }
                keys
            }
            Self::Increment(key, _) | Self::Swap(key, ..) => vec![key],
        }
    }

    /// The bytes of its keys and values: what it adds to a transaction's request.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Batch(writes) => writes
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum(),
            Self::Increment(key, _) => key.len() + 20,
            Self::Swap(key, expected, new) => {
                key.len() + expected.as_ref().map_or(0, Vec::len) + new.len()
            }
        }
    }
}

/// One fenced write, owned, as a batch ([`super::FencedKv::kv_apply_batch`]) holds it: who
/// writes, under which lease, to which namespace, what, within which quota.
#[derive(Clone, Debug)]
pub struct FencedWrite {
    /// Who writes (a service): a group commit takes from each writer in turn.
    pub writer: String,
    /// The lease record's key.
    pub lease_key: String,
    /// The term the writer holds that lease with.
    pub term: super::Term,
    /// The namespace written.
    pub space: String,
    /// The write.
    pub op: OwnedOp,
    /// The namespace's quota.
    pub quota: KvQuota,
}

impl FencedWrite {
    /// `op` to `space` under `fence` and `quota`.
    pub fn new(fence: &super::Fence<'_>, space: &str, op: &KvOp<'_>, quota: &KvQuota) -> Self {
        Self {
            writer: fence.writer.to_owned(),
            lease_key: fence.lease_key.to_owned(),
            term: fence.term,
            space: space.to_owned(),
            op: OwnedOp::from(op),
            quota: *quota,
        }
    }

    /// What it costs a transaction: an operation per key it touches, and three more (its
    /// lease's record and term, its namespace's usage), which writes of one batch may share.
    pub fn ops(&self) -> usize {
        self.op.keys().len() + 3
    }
}

/// The answer to one fenced write: what it did, or why the store refused it.
pub type KvAnswer = Result<KvDone, KvRefusal>;

/// How much one transaction of a backend takes: a batch holds writes until the next would
/// pass either figure (a write larger than both alone still goes, alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchCapacity {
    /// The most operations ([`FencedWrite::ops`]).
    pub ops: usize,
    /// The most bytes of keys and values.
    pub bytes: usize,
}

/// What a fenced write that landed (or, for a swap, was decided) answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDone {
    /// A batch was written.
    Written,
    /// An increment's sum.
    Number(i64),
    /// Whether a swap wrote.
    Swapped(bool),
}

/// Why a fenced write wrote nothing, though the store answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KvRefusal {
    /// The fence's term is not the live one of its lease: expired, released or passed on.
    #[error("the lease's term is stale")]
    StaleTerm,
    /// The namespace would hold more than `limit` keys.
    #[error("the namespace would hold more than {limit} keys")]
    TooManyKeys {
        /// The quota.
        limit: u64,
    },
    /// The namespace would hold more than `limit` bytes of keys and values.
    #[error("the namespace would hold more than {limit} bytes")]
    TooManyBytes {
        /// The quota.
        limit: u64,
    },
    /// An increment of a value that is not a decimal integer.
    #[error("the value is not a decimal integer")]
    NotANumber,
    /// An increment whose sum leaves the 64-bit signed range.
    #[error("the sum leaves the 64-bit integer range")]
    Overflow,
}

/// A namespace's quota: a write that would leave it over either figure, and grows that
/// figure, is refused. A write that shrinks or keeps it (a delete, a shorter value) always
/// passes, so a namespace over a lowered quota can be cleaned up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvQuota {
    /// The most keys.
    pub max_keys: u64,
    /// The most bytes of keys and values.
    pub max_bytes: u64,
}

impl KvQuota {
    /// No quota.
    pub const UNLIMITED: Self = Self {
        max_keys: u64::MAX,
        max_bytes: u64::MAX,
    };
}

/// What a namespace holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvUsage {
    /// Its keys.
    pub keys: u64,
    /// The bytes of its keys and values.
    pub bytes: u64,
}

impl KvUsage {
    /// The usage of `entries`' keys and values.
    pub fn of<'e>(entries: impl IntoIterator<Item = (&'e str, &'e [u8])>) -> Self {
        entries
            .into_iter()
            .fold(Self::default(), |u, (k, v)| u.with(k, Some(v.len())))
    }

    /// This usage with one more key, of `key_bytes`, holding `value_bytes`: how a scan of a
    /// namespace counts what it finds.
    #[must_use]
    pub fn plus(self, key_bytes: usize, value_bytes: usize) -> Self {
        let size = u64::try_from(key_bytes + value_bytes).unwrap_or(u64::MAX);
        Self {
            keys: self.keys + 1,
            bytes: self.bytes.saturating_add(size),
        }
    }

    /// This usage with `key` holding a value of `len` bytes (`None`: absent) added.
    fn with(self, key: &str, len: Option<usize>) -> Self {
        len.map_or(self, |len| self.plus(key.len(), len))
    }

    /// This usage with `key`'s value of `len` bytes taken out.
    fn without(self, key: &str, len: Option<usize>) -> Self {
        match len {
            Some(len) => Self {
                keys: self.keys.saturating_sub(1),
                bytes: self.bytes.saturating_sub(size(key, len)),
            },
            None => self,
        }
    }
}

fn size(key: &str, len: usize) -> u64 {
    u64::try_from(key.len() + len).unwrap_or(u64::MAX)
}

/// A page of a namespace's keys ([`super::FencedKv::kv_list`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvPage {
    /// The keys, in byte order.
    pub keys: Vec<String>,
    /// Whether keys follow the last of them.
    pub more: bool,
}

/// A namespace's keys and usage from one committed state ([`super::FencedKv::kv_view`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvView {
    /// The keys asked for, in byte order.
    pub keys: Vec<String>,
    /// What the whole namespace holds.
    pub usage: KvUsage,
}

/// What a fenced write does: each touched key's new value (`None`: deleted), the usage after
/// it, and the answer. Made by [`plan`] once the fence has passed.
#[derive(Debug, PartialEq, Eq)]
pub struct KvPlan {
    /// Each key the write changes, once, with its final value.
    pub changes: Vec<(String, Option<Vec<u8>>)>,
    /// The namespace's usage after the write.
    pub usage: KvUsage,
    /// The answer.
    pub done: KvDone,
}

/// What `op` does to a namespace whose touched keys hold `old` (a key absent from the map is
/// absent from the store) and which uses `usage`, under `quota`.
///
/// # Errors
/// The refusal, other than a stale term (the backend's fence decides that first).
pub fn plan<S: BuildHasher>(
    op: &KvOp<'_>,
    old: &HashMap<&str, Option<&[u8]>, S>,
    usage: KvUsage,
    quota: &KvQuota,
) -> Result<KvPlan, KvRefusal> {
    let before = |key: &str| old.get(key).copied().flatten();
    let mut finals: Vec<(&str, Option<Vec<u8>>)> = Vec::new();
    let done = match *op {
        KvOp::Batch(writes) => {
            for write in writes {
                let value = match write {
                    KvWrite::Set { value, .. } => Some(value.to_vec()),
                    KvWrite::Delete { .. } => None,
                };
                match finals.iter_mut().find(|(k, _)| *k == write.key()) {
                    Some(slot) => slot.1 = value,
                    None => finals.push((write.key(), value)),
                }
            }
            KvDone::Written
        }
        KvOp::Increment { key, delta } => {
            let current = match before(key) {
                None => 0,
                Some(bytes) => std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok())
                    .ok_or(KvRefusal::NotANumber)?,
            };
            let sum = current.checked_add(delta).ok_or(KvRefusal::Overflow)?;
            finals.push((key, Some(sum.to_string().into_bytes())));
            KvDone::Number(sum)
        }
        KvOp::Swap { key, expected, new } => {
            if before(key) != expected {
                return Ok(KvPlan {
                    changes: Vec::new(),
                    usage,
                    done: KvDone::Swapped(false),
                });
            }
            finals.push((key, Some(new.to_vec())));
            KvDone::Swapped(true)
        }
    };
    let after = finals.iter().fold(usage, |u, (key, value)| {
        u.without(key, before(key).map(<[u8]>::len))
            .with(key, value.as_ref().map(Vec::len))
    });
    if after.keys > quota.max_keys && after.keys > usage.keys {
        return Err(KvRefusal::TooManyKeys {
            limit: quota.max_keys,
        });
    }
    if after.bytes > quota.max_bytes && after.bytes > usage.bytes {
        return Err(KvRefusal::TooManyBytes {
            limit: quota.max_bytes,
        });
    }
    Ok(KvPlan {
        changes: finals
            .into_iter()
            .filter(|(key, value)| before(key) != value.as_deref())
            .map(|(key, value)| (key.to_owned(), value))
            .collect(),
        usage: after,
        done,
    })
}

#[cfg(test)]
mod tests;
