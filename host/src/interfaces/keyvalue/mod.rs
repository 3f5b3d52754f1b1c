//! Guest key-value (SPEC §7, §10): the one implementation behind `wasi:keyvalue@0.2.0-draft2`
//! (`draft2`), `@0.2.0-draft` (`draft`) and `vvm:host/kv` (`vvm`), over the same data.
//!
//! Each call goes through [`Kv`] (borrowed from [`Interfaces`] for the call), which owns what the
//! three interfaces share:
//! - **Buckets.** `open("")` and `open("default")` are the service's own namespace (its
//!   name, as `vvm:host/kv` has always used); a named bucket is the namespace
//!   `bucket/<name>`, shared by the services granted it (`kv-buckets`); any other name is
//!   `access-denied`.
//! - **The fence.** Every write first checks the local lease deadline (past it the call traps,
//!   as every effect does), then is made by the store conditional on this host's term in the
//!   same transaction (`store::FencedKv`): a stale term writes nothing.
//! - **Limits**, each refused with an error naming it and counted in `/metrics`
//!   (`vvm_kv_limit_refusals_total`): key and value size and the batch size here, before the
//!   store is asked; the number of keys and bytes of the namespace by the store, in the
//!   write's transaction; the write rate by the service's budget (a batch counts each write).
//!
//! A guest tells the failures apart by the error's first words: `stale term` (another host
//! leads now: stop writing), `store unavailable` (try again), `over a limit` (the limit is
//! named), `access denied` (a bucket not granted; `wasi:keyvalue` has a variant for it).

/// What both `wasi:keyvalue` versions' bindings share, written once: the error conversion,
/// `open`, the bucket's reads and writes (with their signatures, identical in both), and the
/// batch interface. Expanded in each version's module, where `store` and `batch` name that
/// version's generated interfaces and `Answer<T>` its result type.
macro_rules! wasi_keyvalue_common {
    () => {
        impl From<KvError> for store::Error {
            fn from(e: KvError) -> Self {
                match e {
                    KvError::AccessDenied(_) => Self::AccessDenied,
                    e => Self::Other(e.to_string()),
                }
            }
        }

        type Answer<T> = wasmtime::Result<Result<T, store::Error>>;

        /// The namespace behind `bucket`'s handle.
        fn space(host: &Interfaces, handle: &Resource<Bucket>) -> wasmtime::Result<String> {
            Ok(host.table.get(handle)?.space.clone())
        }

        impl store::Host for Interfaces {
            async fn open(&mut self, identifier: String) -> Answer<Resource<Bucket>> {
                match self.kv().open(&identifier) {
                    Ok(bucket) => Ok(Ok(self.table.push(bucket)?)),
                    Err(e) => Ok(Err(e.into())),
                }
            }
        }

        impl batch::Host for Interfaces {
            async fn get_many(
                &mut self,
                b: Resource<Bucket>,
                keys: Vec<String>,
            ) -> Answer<Vec<Option<(String, Vec<u8>)>>> {
                let space = space(self, &b)?;
                Ok(self
                    .kv()
                    .get_many(&space, &keys)
                    .await
                    .map(|values| {
                        keys.into_iter()
                            .zip(values)
                            .map(|(k, v)| v.map(|v| (k, v)))
                            .collect()
                    })
                    .map_err(Into::into))
            }

            async fn set_many(
                &mut self,
                b: Resource<Bucket>,
                key_values: Vec<(String, Vec<u8>)>,
            ) -> Answer<()> {
                let space = space(self, &b)?;
                let writes: Vec<KvWrite<'_>> = key_values
                    .iter()
                    .map(|(key, value)| KvWrite::Set { key, value })
                    .collect();
                Ok(self.kv().write(&space, &writes).await?.map_err(Into::into))
            }

            async fn delete_many(&mut self, b: Resource<Bucket>, keys: Vec<String>) -> Answer<()> {
                let space = space(self, &b)?;
                let writes: Vec<KvWrite<'_>> =
                    keys.iter().map(|key| KvWrite::Delete { key }).collect();
                Ok(self.kv().write(&space, &writes).await?.map_err(Into::into))
            }
        }
    };
}

/// The bucket methods both versions share, inside each one's `impl store::HostBucket` (and
/// Spin's store's, the same five with the same signatures: `spin`). Expects `Answer<T>` and
/// `space(host, handle)` where it is expanded.
macro_rules! wasi_keyvalue_bucket {
    () => {
        async fn get(&mut self, b: Resource<Bucket>, key: String) -> Answer<Option<Vec<u8>>> {
            let space = space(self, &b)?;
            Ok(self.kv().get(&space, &key).await.map_err(Into::into))
        }

        async fn set(&mut self, b: Resource<Bucket>, key: String, value: Vec<u8>) -> Answer<()> {
            let space = space(self, &b)?;
            let writes = [KvWrite::Set {
                key: &key,
                value: &value,
            }];
            Ok(self.kv().write(&space, &writes).await?.map_err(Into::into))
        }

        async fn delete(&mut self, b: Resource<Bucket>, key: String) -> Answer<()> {
            let space = space(self, &b)?;
            let writes = [KvWrite::Delete { key: &key }];
            Ok(self.kv().write(&space, &writes).await?.map_err(Into::into))
        }

        async fn exists(&mut self, b: Resource<Bucket>, key: String) -> Answer<bool> {
            let space = space(self, &b)?;
            Ok(self
                .kv()
                .get(&space, &key)
                .await
                .map(|v| v.is_some())
                .map_err(Into::into))
        }

        async fn drop(&mut self, b: Resource<Bucket>) -> wasmtime::Result<()> {
            self.table.delete(b)?;
            Ok(())
        }
    };
}
pub(crate) use wasi_keyvalue_bucket;

pub(crate) mod access;
mod draft;
mod draft2;
mod vvm;

use std::sync::PoisonError;

use self::access::{Bucket, KvAccess};
use crate::interfaces::env::ServiceEnv;
use crate::interfaces::view::Interfaces;
use crate::keys::bucket_space;
use crate::ops::{KvLimit, KvOutcome};
use crate::store::{Fence, KvDone, KvOp, KvQuota, KvRefusal, KvWrite, MAX_BATCH, StoreError};

pub(crate) use draft::add_to_linker as add_draft_to_linker;

/// The keys one `list-keys` call returns at most.
const PAGE: usize = 1000;

/// Why a key-value call failed, as the guest is told (see the module's docs).
#[derive(Debug, thiserror::Error)]
pub(crate) enum KvError {
    /// A bucket the service was not granted.
    #[error("access denied: bucket {0:?} is not granted to this service (kv-buckets)")]
    AccessDenied(String),
    /// The write's term is stale.
    #[error("stale term {term}: the lease {key} has passed to another holder")]
    Stale {
        /// The term the write was made under.
        term: u64,
        /// The lease.
        key: String,
    },
    /// Over a limit.
    #[error("over a limit: {what}; {} is {max}", limit.label())]
    Limit {
        /// Which.
        limit: KvLimit,
        /// What was asked.
        what: String,
        /// The limit's value.
        max: u64,
    },
    /// An increment of a value that is not a decimal integer.
    #[error("not a number: the value under {0:?} is not a decimal integer")]
    NotANumber(String),
    /// An increment past the integer range.
    #[error("overflow: incrementing {0:?} would leave the 64-bit integer range")]
    Overflow(String),
    /// A cursor this bucket handle did not hand out.
    #[error("unknown cursor {0}: pass one that list-keys returned on this bucket")]
    Cursor(u64),
    /// The store failed or could not be reached.
    #[error("store unavailable: {0}")]
    Store(#[from] StoreError),
}

/// The key-value calls of one instance: its service's environment and its access. Borrowed
/// from [`Interfaces`] by [`Interfaces::kv`] for one call, so that a call's future holds only what is
/// shared between threads.
pub(crate) struct Kv<'a> {
    env: &'a ServiceEnv,
    access: &'a KvAccess,
}

impl Interfaces {
    /// This instance's key-value calls.
    pub(crate) fn kv(&self) -> Kv<'_> {
        Kv {
            env: &self.env,
            access: &self.kv,
        }
    }
}

impl<'a> Kv<'a> {
    /// The key-value calls of an instance of `env`'s service with `access` (one whose state
    /// is out of reach: a call of WASI 0.3, awaited outside the store).
    pub(crate) fn of(env: &'a ServiceEnv, access: &'a KvAccess) -> Self {
        Self { env, access }
    }
}

impl Kv<'_> {
    /// Opens bucket `name` (see the module's docs).
    pub(crate) fn open(&self, name: &str) -> Result<Bucket, KvError> {
        let space = if name.is_empty() || name == "default" {
            self.env.name.to_string()
        } else if self.access.buckets.iter().any(|b| b == name) {
            bucket_space(name)
        } else {
            return Err(KvError::AccessDenied(name.to_owned()));
        };
        Ok(Bucket {
            space,
            cursors: Vec::new(),
        })
    }

    /// The value under `key` in `space`, if any.
    pub(crate) async fn get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        self.check_keys([key])?;
        Ok(self.env.store.kv_get(space, key).await?)
    }

    /// The values under `keys` in `space`, read together.
    pub(crate) async fn get_many(
        &self,
        space: &str,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.check_batch(keys.len())?;
        self.check_keys(keys.iter().map(String::as_str))?;
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        Ok(self.env.store.kv_get_many(space, &keys).await?)
    }

    /// Up to [`PAGE`] keys of `space` after `after`, in byte order, and the last of them if
    /// more may follow (the next call's `after`).
    pub(crate) async fn list(
        &self,
        space: &str,
        after: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), KvError> {
        let page = self.env.store.kv_list(space, "", after, PAGE).await?;
        let next = if page.more {
            page.keys.last().cloned()
        } else {
            None
        };
        Ok((page.keys, next))
    }

    /// Sets and deletes `writes` in `space` at once, all or none. Traps past the deadline.
    pub(crate) async fn write(
        &self,
        space: &str,
        writes: &[KvWrite<'_>],
    ) -> wasmtime::Result<Result<(), KvError>> {
        Ok(self.fenced(space, &KvOp::Batch(writes)).await?.map(|_| ()))
    }

    /// Adds `delta` to the number under `key` (absent: 0) and returns the sum. Traps past the
    /// deadline.
    pub(crate) async fn increment(
        &self,
        space: &str,
        key: &str,
        delta: i64,
    ) -> wasmtime::Result<Result<i64, KvError>> {
        let op = KvOp::Increment { key, delta };
        Ok(self.fenced(space, &op).await?.map(|done| match done {
            KvDone::Number(n) => n,
            KvDone::Written | KvDone::Swapped(_) => 0,
        }))
    }

    /// Writes `new` under `key` if it still holds `expected` (none: absent); `false` if it
    /// does not. Traps past the deadline.
    pub(crate) async fn swap(
        &self,
        space: &str,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
    ) -> wasmtime::Result<Result<bool, KvError>> {
        let op = KvOp::Swap { key, expected, new };
        Ok(self
            .fenced(space, &op)
            .await?
            .map(|done| done == KvDone::Swapped(true)))
    }

    /// The fence, the limits, the store's fenced write, and its count in `/metrics`.
    async fn fenced(
        &self,
        space: &str,
        op: &KvOp<'_>,
    ) -> wasmtime::Result<Result<KvDone, KvError>> {
        self.env.fence("key-value write")?;
        let env = &self.env;
        let count = |outcome| env.ops.kv_write(&env.name, outcome);
        if let Err(e) = self.check_write(op) {
            count(KvOutcome::Limited);
            return Ok(Err(e));
        }
        let fence = Fence {
            writer: &env.name,
            lease_key: &env.lease.key,
            term: env.lease.term,
        };
        let quota = KvQuota {
            max_keys: self.access.limits.max_keys,
            max_bytes: self.access.limits.max_bytes,
        };
        Ok(match env.store.kv_apply(&fence, space, op, &quota).await {
            Ok(Ok(done)) => {
                count(KvOutcome::Ok);
                Ok(done)
            }
            Ok(Err(refusal)) => Err(self.refused(refusal, op.keys().next().unwrap_or(""))),
            Err(e) => {
                count(KvOutcome::Error);
                Err(KvError::Store(e))
            }
        })
    }

    /// A store's refusal as the guest is told, counted.
    fn refused(&self, refusal: KvRefusal, key: &str) -> KvError {
        let env = &self.env;
        let count = |outcome| env.ops.kv_write(&env.name, outcome);
        match refusal {
            KvRefusal::StaleTerm => {
                count(KvOutcome::Stale);
                KvError::Stale {
                    term: env.lease.term,
                    key: env.lease.key.clone(),
                }
            }
            KvRefusal::TooManyKeys { limit } => {
                count(KvOutcome::Limited);
                let what = "the namespace would hold more keys".to_owned();
                self.over(KvLimit::Keys, what, limit)
            }
            KvRefusal::TooManyBytes { limit } => {
                count(KvOutcome::Limited);
                let what = "the namespace would hold more bytes".to_owned();
                self.over(KvLimit::Bytes, what, limit)
            }
            KvRefusal::NotANumber => KvError::NotANumber(key.to_owned()),
            KvRefusal::Overflow => KvError::Overflow(key.to_owned()),
        }
    }

    /// The limits a write is checked against before the store is asked: batch, key and value
    /// sizes, then the rate (last, so a write refused for its size costs no budget).
    fn check_write(&self, op: &KvOp<'_>) -> Result<(), KvError> {
        let values: Vec<usize> = match *op {
            KvOp::Batch(writes) => {
                self.check_batch(writes.len())?;
                writes
                    .iter()
                    .map(|w| match w {
                        KvWrite::Set { value, .. } => value.len(),
                        KvWrite::Delete { .. } => 0,
                    })
                    .collect()
            }
            KvOp::Increment { .. } => Vec::new(),
            KvOp::Swap { new, .. } => vec![new.len()],
        };
        self.check_keys(op.keys())?;
        let max = self.access.limits.max_value_bytes;
        if let Some(&size) = values.iter().find(|&&size| size > max) {
            return Err(self.over(KvLimit::ValueSize, format!("a value of {size} bytes"), max));
        }
        let limits = &self.access.limits;
        let n = u32::try_from(op.keys().count()).unwrap_or(u32::MAX).max(1);
        let allowed = self
            .env
            .kv_budget
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(limits, n);
        if !allowed {
            let what = format!("{n} writes now; try again later");
            return Err(self.over(KvLimit::Rate, what, limits.writes_per_second.unwrap_or(0)));
        }
        Ok(())
    }

    /// Every key no longer than the limit.
    fn check_keys<'k>(&self, keys: impl IntoIterator<Item = &'k str>) -> Result<(), KvError> {
        let max = self.access.limits.max_key_bytes;
        match keys.into_iter().find(|k| k.len() > max) {
            Some(key) => {
                let what = format!("a key of {} bytes", key.len());
                Err(self.over(KvLimit::KeySize, what, max))
            }
            None => Ok(()),
        }
    }

    /// A batch no larger than the store takes in one transaction.
    fn check_batch(&self, n: usize) -> Result<(), KvError> {
        if n > MAX_BATCH {
            let what = format!("a batch of {n} keys; write it in parts");
            return Err(self.over(KvLimit::Batch, what, MAX_BATCH));
        }
        Ok(())
    }

    /// A refusal by `limit` (at `max`), counted.
    fn over(&self, limit: KvLimit, what: String, max: impl TryInto<u64>) -> KvError {
        self.env.ops.kv_limited(&self.env.name, limit);
        KvError::Limit {
            limit,
            what,
            max: max.try_into().unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
mod tests;
