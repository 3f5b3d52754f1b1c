//! The store file's layout: redb tables as `const TableDefinition`s, the schema check on
//! open, and the encoding of lease records.

use std::path::Path;
use std::time::{Duration, Instant};

use redb::{
    Builder, ConcurrencyMode, Database, Durability, ReadTransaction, ReadableTable,
    TableDefinition, TableHandle, WriteTransaction,
};

use super::bounded_locks::BoundedLocks;
use super::fault::Fault;
use crate::clock::Timestamp;
use crate::store::{Record, Term};

/// Lease records: key -> (holder value, term, expiry boot id, expiry nanoseconds since boot).
pub(super) const LEASES: TableDefinition<&str, (&str, u64, u128, u64)> =
    TableDefinition::new("leases");
/// The last term issued per key. Never deleted, so terms keep increasing for the file's life.
pub(super) const TERMS: TableDefinition<&str, u64> = TableDefinition::new("terms");
/// The guests' fenced key-value space: (namespace, key) -> bytes.
pub(super) const KV: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("kv");
/// Each guest namespace's usage, kept with its keys: namespace -> (keys, bytes of keys and
/// values). Absent for an empty namespace, and for one not written since before it was kept.
pub(super) const KV_USAGE: TableDefinition<&str, (u64, u64)> = TableDefinition::new("kv_usage");
/// Store-wide numbers: [`SCHEMA_KEY`] and [`RELEASES_KEY`].
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The layout version this build reads and writes, recorded under [`SCHEMA_KEY`].
pub(super) const SCHEMA_VERSION: u64 = 1;
pub(super) const SCHEMA_KEY: &str = "schema_version";
/// Counts successful `compare_and_delete`s, so waiters in other processes can tell a release
/// from any other write to the file.
pub(super) const RELEASES_KEY: &str = "releases";

/// How long a write waits for another process's write transaction before failing as busy.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest pause between two tries for the write lock. Short, since the lock is free
/// again within a commit (about a millisecond) and a peer that writes in a loop would
/// otherwise win it every time; a try is one `fcntl`.
const MAX_BUSY_PAUSE: Duration = Duration::from_micros(100);
/// Pages redb may cache. The store holds a few records per slot plus guest data.
pub(super) const CACHE_BYTES: usize = 16 << 20;

/// A lease record as stored.
pub(super) struct Lease {
    pub(super) value: String,
    pub(super) term: Term,
    pub(super) expires: Timestamp,
}

impl Lease {
    /// The record as the store contract reports it, with `time_left` of life: exact here, so
    /// it is also the life it surely has.
    pub(super) fn into_record(self, time_left: Duration) -> Record {
        Record {
            value: self.value,
            term: self.term,
            time_left,
            lives_at_least: time_left,
        }
    }
}

/// Opens the file in multi-writer mode and checks (or, on a new file, writes) the schema.
/// Every wait for a lock of another process lasts at most `patience`.
pub(super) fn open_database(path: &Path, patience: Duration) -> Result<Database, Fault> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(redb::DatabaseError::from)?;
    let repair_path = path.display().to_string();
    let db = Builder::new()
        .set_concurrency_mode(ConcurrencyMode::MultiWriter)
        .set_cache_size(CACHE_BYTES)
        .set_repair_callback(move |session| {
            tracing::warn!(path = %repair_path, progress = session.progress(),
                "repairing redb store after an unclean shutdown");
        })
        .create_with_backend(BoundedLocks::new(file, patience))?;
    let mut txn = begin_write(&db, patience)?;
    txn.set_durability(Durability::Immediate)?;
    {
        let mut meta = txn.open_table(META).map_err(Fault::table)?;
        let version = meta.get(SCHEMA_KEY)?.map(|v| v.value());
        match version {
            Some(SCHEMA_VERSION) => {}
            Some(found) => {
                return Err(Fault::SchemaVersion {
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            None => {
                let ours = [
                    LEASES.name(),
                    TERMS.name(),
                    KV.name(),
                    KV_USAGE.name(),
                    META.name(),
                ];
                if let Some(foreign) = txn.list_tables()?.find(|t| !ours.contains(&t.name())) {
                    return Err(Fault::Foreign(foreign.name().to_owned()));
                }
                meta.insert(SCHEMA_KEY, SCHEMA_VERSION)?;
            }
        }
    }
    // Creates the tables of a new file, and checks their types in an existing one.
    txn.open_table(LEASES).map_err(Fault::table)?;
    txn.open_table(TERMS).map_err(Fault::table)?;
    txn.open_table(KV).map_err(Fault::table)?;
    txn.open_table(KV_USAGE).map_err(Fault::table)?;
    txn.commit()?;
    Ok(db)
}

/// Checks, in a read transaction of the file, that it is a vvm-host store of this schema
/// version: an error naming the cause if it holds no vvm-host tables or another version.
pub(super) fn check_schema(txn: &ReadTransaction) -> Result<(), Fault> {
    let version = txn
        .open_table(META)
        .map_err(Fault::table)?
        .get(SCHEMA_KEY)?
        .map(|v| v.value());
    match version {
        Some(SCHEMA_VERSION) => Ok(()),
        Some(found) => Err(Fault::SchemaVersion {
            found,
            supported: SCHEMA_VERSION,
        }),
        None => Err(Fault::Foreign("(no schema version)".to_owned())),
    }
}

/// Begins a write transaction, waiting at most `busy_timeout` for another process's.
///
/// `begin_write` would wait on the file lock without bound; a peer stopped (SIGSTOP, a hung
/// disk) inside its transaction must turn into a transient error instead.
pub(super) fn begin_write(
    db: &Database,
    busy_timeout: Duration,
) -> Result<WriteTransaction, Fault> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(10);
    loop {
        match db.try_begin_write() {
            Ok(txn) => return Ok(txn),
            Err(redb::TransactionError::WouldBlock) if start.elapsed() < busy_timeout => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_BUSY_PAUSE);
            }
            Err(redb::TransactionError::WouldBlock) => return Err(Fault::Busy(busy_timeout)),
            Err(e) => return Err(e.into()),
        }
    }
}

pub(super) fn read_lease(
    table: &impl ReadableTable<&'static str, (&'static str, u64, u128, u64)>,
    key: &str,
) -> Result<Option<Lease>, Fault> {
    Ok(table.get(key)?.map(|row| lease_of(row.value())))
}

/// A lease record from its stored form.
fn lease_of((value, term, boot, nanos): (&str, u64, u128, u64)) -> Lease {
    Lease {
        value: value.to_owned(),
        term,
        expires: Timestamp {
            boot,
            since_boot: Duration::from_nanos(nanos),
        },
    }
}

/// Every record whose key starts with `prefix`, by key, live or not.
fn leases_under(
    table: &impl ReadableTable<&'static str, (&'static str, u64, u128, u64)>,
    prefix: &str,
) -> Result<Vec<(String, Lease)>, Fault> {
    let mut leases = Vec::new();
    for row in table.range(prefix..)? {
        let (key, row) = row?;
        let key = key.value();
        if !key.starts_with(prefix) {
            break;
        }
        leases.push((key.to_owned(), lease_of(row.value())));
    }
    Ok(leases)
}

/// Every record live at `now` whose key starts with `prefix`, by key, with its time left.
pub(super) fn live_leases_under(
    table: &impl ReadableTable<&'static str, (&'static str, u64, u128, u64)>,
    prefix: &str,
    now: Timestamp,
) -> Result<Vec<(String, Lease, Duration)>, Fault> {
    Ok(leases_under(table, prefix)?
        .into_iter()
        .filter_map(|(key, lease)| {
            let left = lease.expires.left_from(now)?;
            Some((key, lease, left))
        })
        .collect())
}

/// The keys of the records expired at `now` whose key starts with `prefix`.
pub(super) fn expired_under(
    table: &impl ReadableTable<&'static str, (&'static str, u64, u128, u64)>,
    prefix: &str,
    now: Timestamp,
) -> Result<Vec<String>, Fault> {
    Ok(leases_under(table, prefix)?
        .into_iter()
        .filter(|(_, lease)| lease.expires.left_from(now).is_none())
        .map(|(key, _)| key)
        .collect())
}

/// The record under `key` if it is live at `now` (expiry inclusive, other boots expired).
pub(super) fn live_lease(
    table: &impl ReadableTable<&'static str, (&'static str, u64, u128, u64)>,
    key: &str,
    now: Timestamp,
) -> Result<Option<(Lease, Duration)>, Fault> {
    Ok(read_lease(table, key)?
        .and_then(|lease| lease.expires.left_from(now).map(|left| (lease, left))))
}

/// The stored form of `value` under `term`, expiring `ttl` after `now`.
pub(super) fn lease_row(
    value: &str,
    term: Term,
    now: Timestamp,
    ttl: Duration,
) -> (&str, u64, u128, u64) {
    let expires = now.after(ttl);
    let nanos = u64::try_from(expires.since_boot.as_nanos()).unwrap_or(u64::MAX);
    (value, term, expires.boot, nanos)
}
