//! What a service may do with key-value data (SPEC §10) and the handles a guest holds: its
//! limits ([`KvLimits`]), its write rate ([`WriteBudget`]), its grants ([`KvAccess`]), and the
//! `bucket` and `cas` resources of `wasi:keyvalue` ([`Bucket`], [`Cas`]).

use std::sync::Arc;

use crate::config::KvLimitsConfig;

/// Limits on a service's key-value data (SPEC §10), so that no guest can fill the store or
/// starve the lease renewals that share it. A call past a limit fails with an error naming
/// it that the guest sees; nothing is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLimits {
    /// The longest key, in bytes. Default 1 KiB.
    pub max_key_bytes: usize,
    /// The largest value, in bytes. Default 1 MiB.
    pub max_value_bytes: usize,
    /// The most keys in one namespace (the service's own, or a shared bucket it writes).
    /// Default 10 000.
    pub max_keys: u64,
    /// The most bytes (keys and values) in one namespace. Default 64 MiB.
    pub max_bytes: u64,
    /// Writes per second per service, on average, if the operator sets a rate: a token
    /// bucket. None by default: the store's group commit takes from the services in turn,
    /// so one cannot starve another (or the lease's renewals, which go first), and a fixed
    /// rate would bind long before the store does.
    pub writes_per_second: Option<u32>,
    /// How many writes may come at once under that rate (the bucket's size). Default: a
    /// second's worth.
    pub write_burst: Option<u32>,
}

impl Default for KvLimits {
    fn default() -> Self {
        Self {
            max_key_bytes: 1024,
            max_value_bytes: 1 << 20,
            max_keys: 10_000,
            max_bytes: 64 << 20,
            writes_per_second: None,
            write_burst: None,
        }
    }
}

impl KvLimits {
    /// These limits with those `table` sets (`[kv]`, `[service.NAME.kv]`) in their place.
    #[must_use]
    pub fn with(self, table: KvLimitsConfig) -> Self {
        let size = |v: Option<u64>, or: usize| v.map_or(or, |v| usize::try_from(v).unwrap_or(or));
        Self {
            max_key_bytes: size(table.max_key_bytes, self.max_key_bytes),
            max_value_bytes: size(table.max_value_bytes, self.max_value_bytes),
            max_keys: table.max_keys.unwrap_or(self.max_keys),
            max_bytes: table.max_bytes.unwrap_or(self.max_bytes),
            writes_per_second: table.writes_per_second.or(self.writes_per_second),
            write_burst: table.write_burst.or(self.write_burst),
        }
    }
}

/// A token bucket, for a service with a write rate (`writes-per-second`): that many tokens
/// per second, at most the burst (`write-burst`, a second's worth by default) saved up.
#[derive(Debug)]
pub(crate) struct WriteBudget {
    tokens: f64,
    at: tokio::time::Instant,
}

impl WriteBudget {
    /// A full bucket for `limits`.
    pub(crate) fn full(limits: &KvLimits) -> Self {
        Self {
            tokens: f64::from(Self::burst(limits)),
            at: tokio::time::Instant::now(),
        }
    }

    /// The bucket's size under `limits`.
    fn burst(limits: &KvLimits) -> u32 {
        limits.write_burst.or(limits.writes_per_second).unwrap_or(0)
    }

    /// Takes `n` writes at once (a batch counts each of its writes) if the budget allows
    /// them all now; else takes none. Without a rate, always.
    pub(crate) fn take(&mut self, limits: &KvLimits, n: u32) -> bool {
        let Some(rate) = limits.writes_per_second else {
            return true;
        };
        let now = tokio::time::Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * f64::from(rate);
        self.tokens = (self.tokens + refill).min(f64::from(Self::burst(limits)));
        self.at = now;
        if self.tokens >= f64::from(n) {
            self.tokens -= f64::from(n);
            true
        } else {
            false
        }
    }
}

/// What one instance of a service may do with key-value data (SPEC §10): its limits and the
/// shared buckets it was granted, as its grants were when it started.
#[derive(Clone, Debug, Default)]
pub(crate) struct KvAccess {
    /// Its limits: its own table's over the host-wide ones.
    pub limits: KvLimits,
    /// The shared buckets it may open besides its own namespace.
    pub buckets: Arc<[String]>,
}

/// A key-value bucket a guest opened (`wasi:keyvalue` `bucket`): a namespace of the store.
#[derive(Debug)]
pub struct Bucket {
    /// The namespace: the service's name, or `bucket/<name>` for a shared bucket (a `/`
    /// cannot be in a service's file name, so the two never meet).
    pub space: String,
    /// `@0.2.0-draft`'s numbered cursors: cursor `n` continues after `cursors[n - 1]`.
    pub cursors: Vec<String>,
}

/// A `wasi:keyvalue/atomics` `cas` handle: a key and the value it held when read.
#[derive(Debug)]
pub struct Cas {
    /// The namespace of the bucket it was made on.
    pub space: String,
    /// The key.
    pub key: String,
    /// Its value when read (none: absent); a swap succeeds only if it is still this.
    pub current: Option<Vec<u8>>,
}
