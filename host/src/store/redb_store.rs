//! The redb backend (SPEC §3): the store contract in one file that several processes share.
//!
//! Layout: four tables (`schema.rs`). A lease record's expiry is a [`Timestamp`] of the store's
//! [`Clock`] (kernel boot id + `CLOCK_BOOTTIME` in production), read inside the write
//! transaction, so the file is the only timekeeper and wall-clock steps do not move expiry.
//! Every write commits with [`Durability::Immediate`]; the file is opened in
//! [`ConcurrencyMode::MultiWriter`], so hosts on one machine share it, and a process killed
//! with SIGKILL leaves it usable (its file locks die with it; redb's quick-repair state lets
//! the next writer go on).
//!
//! redb calls block, so each operation runs on tokio's blocking pool.

mod bounded_locks;
mod fault;
mod file_watch;
mod kv;
#[cfg(test)]
mod process_tests;
mod reader;
#[cfg(test)]
mod reader_tests;
mod schema;
mod scrub;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, WriteTransaction};
use tokio::sync::Notify;

use self::fault::Fault;
use self::file_watch::FileWatch;
use self::reader::Reader;
use self::schema::{
    BUSY_TIMEOUT, LEASES, Lease, META, RELEASES_KEY, SCHEMA_VERSION, TERMS, begin_write,
    expired_under, lease_row, live_lease, live_leases_under, open_database,
};
use self::scrub::{Scrubber, Verdict};
use super::{Candidates, HandOver, Record, StoreError, Term, TtlStore};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::lease_value;

/// How long a standby's candidacy record lives at least ([`TtlStore::candidacy_ttl`]): it
/// is rewritten at a quarter of that.
const CANDIDACY_TTL: Duration = Duration::from_hours(1);
/// How often [`TtlStore::wait_released`] reads the release counter without a file watch.
const FALLBACK_POLL: Duration = Duration::from_millis(5);
/// How often it reads the counter with a watch on the bell, in case a ring was missed (a
/// releaser that died between its commit and its ring): rarely, since each read takes the
/// file's header lock, and a crashed holder is found by the crash lock or its expiry anyway.
const SAFETY_POLL: Duration = Duration::from_secs(2);

/// The longest the bell's watch thread waits for a lock of another process when it reads the
/// records at a ring: a commit holds the header lock for microseconds at a time.
const RING_READ_PATIENCE: Duration = Duration::from_millis(2);

/// The store contract over one redb file, shared by every process that opens it.
///
/// Cheap to clone; clones share one database handle, which closes with the last of them
/// (see [`RedbStore::close`]). Each operation runs to its end on the blocking pool even if
/// its future is dropped: a write whose caller gave up (a timeout) may still commit.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    clock: Arc<dyn Clock>,
    /// Replaced by a fresh handle when redb reports that this one is unusable (after an I/O
    /// error). Operations in flight keep the old handle alive until they end. Shared with the
    /// bell's watch thread, which reads the records at each ring ([`Rung`]).
    db: Arc<RwLock<Handle>>,
    /// Queues this process's writers, so only the cross-process write lock needs polling.
    writer: Mutex<()>,
    /// Lease writes queued for `writer`: while there are any, guest key-value writes wait, so
    /// a guest writing at full speed cannot delay a renewal by more than one commit.
    lease_writes_waiting: AtomicUsize,
    /// Writes running on the blocking pool, whether or not their caller still waits for them:
    /// redb cannot stop a commit once it has begun ([`TtlStore::settle`] waits for them).
    writes_in_flight: tokio::sync::watch::Sender<usize>,
    busy_timeout: Duration,
    /// Wakes this process's waiters at once when it releases a record itself.
    released: Notify,
    /// The release bell ([`bell_path`]): rung by every release of this handle; `None` for a
    /// read-only handle.
    bell: Option<PathBuf>,
    /// Wakes waiters when another process rings the bell; `None` if inotify is unavailable.
    watch: Option<FileWatch>,
    /// The live records as the bell's watch thread read them at the last ring.
    rung: Rung,
    /// The release counter as this handle last read it (at open, then by every waiter). A
    /// waiter compares against it rather than reading the counter before it waits: see
    /// [`TtlStore::wait_released`].
    releases_seen: AtomicU64,
    /// The reopen under way, if any ([`RedbStore::reopen`]): at most one at a time, and
    /// [`RedbStore::close`] waits for it, since it holds the database too.
    reopening: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set once the file is found changed under this host; every operation then fails with
    /// it (`scrub`).
    verdict: Verdict,
    /// Reads the file afresh every second while this store may write it; stopped on drop.
    _scrubber: Option<Scrubber>,
}

/// The database handle: read-write, or a [`Reader`] for the tools that only look, which
/// never makes a writer wait.
#[derive(Clone)]
enum Handle {
    Write(Arc<Database>),
    Read(Arc<Reader>),
}

impl Handle {
    fn begin_read(&self) -> Result<redb::ReadTransaction, Fault> {
        match self {
            Self::Write(db) => Ok(db.begin_read()?),
            Self::Read(reader) => reader.begin_read(),
        }
    }

    fn open(path: &Path, read_only: bool, patience: Duration) -> Result<Self, Fault> {
        Ok(if read_only {
            Self::Read(Arc::new(Reader::open(path)?))
        } else {
            Self::Write(Arc::new(open_database(path, patience)?))
        })
    }
}

impl RedbStore {
    /// Opens (or creates) the store file at `path`, with expiry on the machine's clock.
    ///
    /// # Errors
    /// Permanent when the directory is missing or not writable, the file is not a redb
    /// database or was written with an incompatible schema version, or the kernel boot id
    /// cannot be read; transient for I/O that may pass.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_patience(path, BUSY_TIMEOUT).await
    }

    /// Opens (or creates) the store file at `path`, deciding expiry by `clock`.
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    pub async fn open_with_clock(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        Self::open_inner(path, clock, BUSY_TIMEOUT, false).await
    }

    /// Like [`RedbStore::open`], waiting at most `patience` for any lock another process
    /// holds (default 2 s). A host with lease `L` passes `L/10`, so that a peer stopped while
    /// it holds a lock costs at worst an orderly loss of the lease, never the killer.
    ///
    /// # Errors
    /// As [`RedbStore::open`].
    pub async fn open_with_patience(
        path: impl AsRef<Path>,
        patience: Duration,
    ) -> Result<Self, StoreError> {
        Self::open_inner(path, system_clock()?, patience, false).await
    }

    /// Opens an existing store file for reading only (`vvm-host status`): it takes no write
    /// lock and writes nothing, so a tool paused at any moment cannot stall the hosts that
    /// serve from the file. Writes through it fail with a permanent error.
    ///
    /// # Errors
    /// Permanent when the file is missing or is not a vvm-host store; transient for I/O that
    /// may pass.
    pub async fn open_read_only(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_inner(path, system_clock()?, BUSY_TIMEOUT, true).await
    }

    async fn open_inner(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
        busy_timeout: Duration,
        read_only: bool,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let opened = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || {
                let db = Handle::open(&path, read_only, busy_timeout)?;
                let releases = read_releases(&db.begin_read()?)?;
                Ok((db, releases))
            })
            .await
        };
        let (db, releases) = opened
            .unwrap_or_else(|e| Err(Fault::Aborted(e.to_string())))
            .map_err(|f| f.into_store_error(&path, "open"))?;
        let db = Arc::new(RwLock::new(db));
        let rung = Rung::default();
        // Only campaigning hosts wait for releases.
        let bell = (!read_only).then(|| bell_path(&path));
        let watch = bell.as_deref().and_then(|bell| {
            let on_ring = rung.reader(Arc::clone(&db), Arc::clone(&clock));
            let watched = open_bell(bell).and_then(|_| FileWatch::start(bell, on_ring));
            watched
                .inspect_err(|e| {
                    tracing::warn!(path = %bell.display(), error = %e,
                        "no inotify watch on the redb store's release bell; waiters poll for releases");
                })
                .ok()
        });
        let verdict = Verdict::default();
        // Only a host that writes serves from the file; a tool reads it once.
        let scrubber = (!read_only)
            .then(|| scrub::identity(&path))
            .and_then(|identity| {
                let started = identity.and_then(|identity| {
                    Scrubber::start(path.clone(), identity, verdict.clone())
                });
                started
                    .inspect_err(|e| {
                        tracing::warn!(path = %path.display(), error = %e,
                            "the redb store file is not read afresh: a change under this host may go unseen");
                    })
                    .ok()
            });
        tracing::info!(path = %path.display(), schema = SCHEMA_VERSION, read_only, "redb store opened");
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                clock,
                db,
                writer: Mutex::new(()),
                lease_writes_waiting: AtomicUsize::new(0),
                writes_in_flight: tokio::sync::watch::Sender::new(0),
                busy_timeout,
                released: Notify::new(),
                bell,
                watch,
                rung,
                releases_seen: AtomicU64::new(releases),
                reopening: Mutex::new(None),
                verdict,
                _scrubber: scrubber,
            }),
        })
    }

    /// Drops this handle on the blocking pool and waits for that. When it is the last clone,
    /// this closes the database (which may write and sync the file) without blocking the
    /// async runtime, and the file is closed cleanly when this returns. A reopen under way
    /// (after an I/O error) is waited for first: it holds the database too.
    pub async fn close(self) {
        let path = self.inner.path.clone();
        let reopening = self
            .inner
            .reopening
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(reopen) = reopening {
            let _ = reopen.await;
        }
        if tokio::task::spawn_blocking(move || drop(self))
            .await
            .is_ok()
        {
            tracing::info!(path = %path.display(), "redb store handle closed");
        }
    }

    /// Runs `f` in a read transaction on the blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&redb::ReadTransaction, Timestamp) -> Result<T, Fault> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = Arc::clone(&self.inner);
        self.blocking(op, move || {
            let txn = inner.db().begin_read()?;
            f(&txn, inner.clock.now())
        })
        .await
    }

    /// Runs `f` in a durable write transaction on the blocking pool. `f` returns its result
    /// and what to do with the transaction ([`Outcome`]).
    async fn write<T: Send + 'static>(
        &self,
        op: &'static str,
        lane: Lane,
        f: impl FnOnce(&WriteTransaction, Timestamp) -> Result<(T, Outcome), Fault> + Send + 'static,
    ) -> Result<T, StoreError> {
        // Counted from here: a write whose caller gives up before it runs still runs.
        let in_flight = InFlightWrite::new(&self.inner);
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.write_now(op, lane, in_flight, f))
            .await
            .unwrap_or_else(|e| {
                Err(Fault::Aborted(e.to_string()).into_store_error(&self.inner.path, op))
            })
    }

    /// [`RedbStore::write`] on this thread, blocking it (a write that is already on the
    /// blocking pool: the group commit's batches).
    fn write_now<T>(
        &self,
        op: &'static str,
        lane: Lane,
        in_flight: InFlightWrite,
        f: impl FnOnce(&WriteTransaction, Timestamp) -> Result<(T, Outcome), Fault>,
    ) -> Result<T, StoreError> {
        let inner = &self.inner;
        let written = (|| {
            let _ended = in_flight;
            if let Some(reason) = inner.verdict.get() {
                return Err(Fault::Invalid(reason));
            }
            let _queue = inner.queue_for_writing(lane);
            let Handle::Write(db) = inner.db() else {
                return Err(Fault::ReadOnly);
            };
            let mut txn = begin_write(&db, inner.busy_timeout)?;
            txn.set_durability(Durability::Immediate)?;
            // Read after the write lock is held, so commits and their clock readings are in
            // the same order in every process.
            let (value, outcome) = f(&txn, inner.clock.now())?;
            match outcome {
                Outcome::Abort => txn.abort()?,
                Outcome::Commit => txn.commit().map_err(|e| Fault::Commit(e.into()))?,
                Outcome::Release(releases) => {
                    txn.commit().map_err(|e| Fault::Commit(e.into()))?;
                    // Right after the commit, on this thread: the waiters of other processes
                    // hear of it even if our caller has stopped waiting for the answer.
                    inner.ring(releases);
                }
            }
            Ok(value)
        })();
        self.settled(op, written)
    }

    /// Runs `f` on the blocking pool; turns its failure into a [`StoreError`] and, if redb
    /// says the handle is spent, opens a fresh one for the next operation.
    async fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce() -> Result<T, Fault> + Send + 'static,
    ) -> Result<T, StoreError> {
        let result = match self.inner.verdict.get() {
            Some(reason) => Err(Fault::Invalid(reason)),
            None => tokio::task::spawn_blocking(f)
                .await
                .unwrap_or_else(|e| Err(Fault::Aborted(e.to_string()))),
        };
        self.settled(op, result)
    }

    /// `op`'s result as its caller sees it: a failure turned into a [`StoreError`], and a
    /// fresh handle opened for the next operation if redb says this one is spent.
    fn settled<T>(&self, op: &'static str, result: Result<T, Fault>) -> Result<T, StoreError> {
        result.map_err(|fault| {
            if fault.needs_reopen() {
                self.reopen(&fault);
            }
            fault.into_store_error(&self.inner.path, op)
        })
    }

    /// Opens a fresh handle in the background after `cause` spent this one; the caller already
    /// has its error and will retry. The task is owned by [`Inner::reopening`]: one at a time
    /// (a second failure while it runs needs no second reopen), and [`RedbStore::close`]
    /// waits for it.
    fn reopen(&self, cause: &Fault) {
        let mut reopening = self
            .inner
            .reopening
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if reopening.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let inner = Arc::clone(&self.inner);
        let cause = cause.to_string();
        let read_only = matches!(inner.db(), Handle::Read(_));
        // Opening blocks: on the blocking pool.
        *reopening = Some(tokio::task::spawn_blocking(move || {
            match Handle::open(&inner.path, read_only, inner.busy_timeout) {
                Ok(db) => {
                    *inner.db.write().unwrap_or_else(PoisonError::into_inner) = db;
                    tracing::warn!(path = %inner.path.display(), %cause, "redb store reopened");
                }
                Err(e) => {
                    tracing::warn!(path = %inner.path.display(), %cause, error = %e, "redb store reopen failed");
                }
            }
        }));
    }

    /// After our own release (the `releases`th of the file): it is no news to our next
    /// waiter, and the in-process `Notify` tells those waiting now.
    fn released(&self, releases: u64) {
        self.inner
            .releases_seen
            .fetch_max(releases, Ordering::SeqCst);
        self.inner.released.notify_waiters();
    }

    /// How many releases the file has recorded; see [`RELEASES_KEY`]. Remembered as the
    /// newest count seen.
    async fn releases(&self) -> Result<u64, StoreError> {
        let count = self
            .read("read the release counter", |txn, _| read_releases(txn))
            .await?;
        self.inner.releases_seen.fetch_max(count, Ordering::SeqCst);
        Ok(count)
    }
}

/// The next term for `key`, recorded in [`TERMS`] by `txn`.
fn issue_term(txn: &WriteTransaction, key: &str) -> Result<Term, Fault> {
    let mut terms = txn.open_table(TERMS)?;
    let term = terms.get(key)?.map_or(0, |t| t.value()).saturating_add(1);
    terms.insert(key, term)?;
    Ok(term)
}

/// Removes the expired records under the candidates' `prefix` (left by standbys that were
/// killed, or by an earlier boot), and the terms of every candidacy no longer standing (those
/// and the withdrawn ones). A candidacy's key is its campaign's own, and nothing fences with
/// its term; left there, they would grow the file, and the expired records every later
/// handover's scan of the candidates, which is inside the handover's write.
fn remove_expired_candidacies(
    txn: &WriteTransaction,
    leases: &mut redb::Table<&'static str, (&'static str, u64, u128, u64)>,
    prefix: &str,
    now: Timestamp,
) -> Result<(), Fault> {
    let expired = expired_under(leases, prefix, now)?;
    for key in &expired {
        leases.remove(key.as_str())?;
    }
    let mut terms = txn.open_table(TERMS)?;
    let mut spent = Vec::new();
    for row in terms.range(prefix..)? {
        let key = row?.0.value().to_owned();
        if !key.starts_with(prefix) {
            break;
        }
        if leases.get(key.as_str())?.is_none() {
            spent.push(key);
        }
    }
    for key in &spent {
        terms.remove(key.as_str())?;
    }
    if !expired.is_empty() || !spent.is_empty() {
        tracing::debug!(
            prefix,
            expired = expired.len(),
            terms = spent.len(),
            "spent candidacies removed"
        );
    }
    Ok(())
}

/// Counts a release in `txn` ([`RELEASES_KEY`]); returns the new count.
fn count_release(txn: &WriteTransaction) -> Result<u64, Fault> {
    let mut meta = txn.open_table(META)?;
    let releases = meta
        .get(RELEASES_KEY)?
        .map_or(0, |v| v.value())
        .wrapping_add(1);
    meta.insert(RELEASES_KEY, releases)?;
    Ok(releases)
}

/// The release bell of the store at `path`: a file beside it (`<store>.releases`) that a
/// process writes the new release count to after each of its releases, for the waiters of
/// [`TtlStore::wait_released`] to watch.
fn bell_path(path: &Path) -> PathBuf {
    let mut bell = path.as_os_str().to_owned();
    bell.push(".releases");
    PathBuf::from(bell)
}

/// The release bell at `bell`, opened for writing in place (created if missing): it is
/// never truncated, so each ring is one write and one inotify event. Opened without waiting
/// and without following a link: a FIFO put in its place would wait for a reader, inside
/// the release's write.
fn open_bell(bell: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let flags = rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOFOLLOW;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(flags.bits().cast_signed())
        .open(bell)
}

/// The live lease records as the bell's watch thread read them right after the last ring,
/// by key: a standby woken by a handover finds the record handed to it here
/// ([`TtlStore::handed`]) instead of reading the file itself, which would take a trip to the
/// blocking pool and back on the takeover's path. Read from the store, not from the bell (a
/// plain file, which a torn read or a stray write could make name the wrong holder).
#[derive(Clone, Default)]
struct Rung(Arc<Mutex<HashMap<String, Lease>>>);

impl Rung {
    /// What the watch thread runs at each ring: reads the live records of the file (a few
    /// rows) and keeps them, before the waiters hear of the ring. Its lock waits last at most
    /// [`RING_READ_PATIENCE`]: a peer stopped while it holds a lock costs the waiters their
    /// snapshot (they read for themselves), not their wake-up.
    fn reader(&self, db: Arc<RwLock<Handle>>, clock: Arc<dyn Clock>) -> impl Fn() + Send + 'static {
        let rung = self.clone();
        move || {
            let read = || -> Result<HashMap<String, Lease>, Fault> {
                let handle = db.read().unwrap_or_else(PoisonError::into_inner).clone();
                let txn = handle.begin_read()?;
                let leases = txn.open_table(LEASES)?;
                Ok(live_leases_under(&leases, "", clock.now())?
                    .into_iter()
                    .map(|(key, lease, _)| (key, lease))
                    .collect())
            };
            let live = bounded_locks::capped(RING_READ_PATIENCE, read).unwrap_or_default();
            *rung.0.lock().unwrap_or_else(PoisonError::into_inner) = live;
        }
    }

    /// The record at `key` as read at the last ring, once, if it has not expired since.
    fn take(&self, key: &str, now: Timestamp) -> Option<Record> {
        let lease = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)?;
        let time_left = lease.expires.left_from(now)?;
        Some(lease.into_record(time_left))
    }
}

/// The release counter in `txn`'s snapshot; see [`RELEASES_KEY`].
fn read_releases(txn: &redb::ReadTransaction) -> Result<u64, Fault> {
    Ok(txn
        .open_table(META)?
        .get(RELEASES_KEY)?
        .map_or(0, |v| v.value()))
}

/// The machine's clock for store expiry (kernel boot id + `CLOCK_BOOTTIME`).
fn system_clock() -> Result<Arc<dyn Clock>, StoreError> {
    let clock = SystemClock::new()
        .map_err(|e| StoreError::permanent("reading the kernel boot id for the store clock", e))?;
    Ok(Arc::new(clock))
}

/// Counts one write in [`Inner::writes_in_flight`] from its making, and out again when the
/// blocking task running it ends (or is dropped unrun).
struct InFlightWrite(Arc<Inner>);

impl InFlightWrite {
    fn new(inner: &Arc<Inner>) -> Self {
        inner.writes_in_flight.send_modify(|n| *n += 1);
        Self(Arc::clone(inner))
    }
}

impl Drop for InFlightWrite {
    fn drop(&mut self) {
        self.0
            .writes_in_flight
            .send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Which writes go first in this process's writer queue.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Lease records (acquire, renew, release): at once.
    Lease,
    /// Guest key-value writes: only while no lease write waits.
    Guest,
}

/// What a write transaction's body asks for.
enum Outcome {
    /// It changed nothing: abort.
    Abort,
    /// Commit.
    Commit,
    /// Commit, then ring the release bell with this release count.
    Release(u64),
}

impl Inner {
    /// Rings the release bell ([`bell_path`]) with the file's new release count: one write
    /// in place, so one inotify event per ring (truncating first would be a second, and a
    /// spurious wake-up of every waiter).
    fn ring(&self, releases: u64) {
        use std::os::unix::fs::FileExt;
        let rung =
            |bell: &Path| open_bell(bell)?.write_all_at(format!("{releases:020}\n").as_bytes(), 0);
        if let Some(bell) = &self.bell
            && let Err(e) = rung(bell)
        {
            tracing::debug!(path = %bell.display(), error = %e,
                "could not ring the release bell; waiters see the release at their next poll");
        }
    }

    /// Takes this process's turn to write: a lease write at once, a guest key-value write
    /// only once no lease write is waiting.
    fn queue_for_writing(&self, lane: Lane) -> std::sync::MutexGuard<'_, ()> {
        let lock = || self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        if lane == Lane::Lease {
            self.lease_writes_waiting.fetch_add(1, Ordering::SeqCst);
            let turn = lock();
            self.lease_writes_waiting.fetch_sub(1, Ordering::SeqCst);
            return turn;
        }
        loop {
            while self.lease_writes_waiting.load(Ordering::SeqCst) > 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
            let turn = lock();
            if self.lease_writes_waiting.load(Ordering::SeqCst) == 0 {
                return turn;
            }
        }
    }

    fn db(&self) -> Handle {
        self.db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl TtlStore for RedbStore {
    async fn insert_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Term>, StoreError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.write("insert_if_absent", Lane::Lease, move |txn, now| {
            let mut leases = txn.open_table(LEASES)?;
            if live_lease(&leases, &key, now)?.is_some() {
                return Ok((None, Outcome::Abort));
            }
            let term = issue_term(txn, &key)?;
            leases.insert(key.as_str(), lease_row(&value, term, now, ttl))?;
            Ok((Some(term), Outcome::Commit))
        })
        .await
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: &str,
        new: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let (key, expected, new) = (key.to_owned(), expected.to_owned(), new.to_owned());
        self.write("compare_and_swap", Lane::Lease, move |txn, now| {
            let mut leases = txn.open_table(LEASES)?;
            match live_lease(&leases, &key, now)? {
                Some((lease, _)) if lease.value == expected => {
                    leases.insert(key.as_str(), lease_row(&new, lease.term, now, ttl))?;
                    Ok((true, Outcome::Commit))
                }
                _ => Ok((false, Outcome::Abort)),
            }
        })
        .await
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, StoreError> {
        let (key, expected) = (key.to_owned(), expected.to_owned());
        let deleted = self
            .write("compare_and_delete", Lane::Lease, move |txn, now| {
                let mut leases = txn.open_table(LEASES)?;
                match live_lease(&leases, &key, now)? {
                    Some((lease, _)) if lease.value == expected => {
                        leases.remove(key.as_str())?;
                        let releases = count_release(txn)?;
                        Ok((Some(releases), Outcome::Release(releases)))
                    }
                    _ => Ok((None, Outcome::Abort)),
                }
            })
            .await?;
        let Some(releases) = deleted else {
            return Ok(false);
        };
        self.released(releases);
        Ok(true)
    }

    /// One write transaction: the check, the choice of candidate and the handover are under
    /// the same lock, so no other writer comes between them.
    async fn hand_over(
        &self,
        key: &str,
        expected: &str,
        candidates: &Candidates,
        ttl: Duration,
    ) -> Result<HandOver, StoreError> {
        let (key, expected, candidates) = (key.to_owned(), expected.to_owned(), candidates.clone());
        let handed = self
            .write("hand_over", Lane::Lease, move |txn, now| {
                let mut leases = txn.open_table(LEASES)?;
                if live_lease(&leases, &key, now)?.is_none_or(|(l, _)| l.value != expected) {
                    return Ok((None, Outcome::Abort));
                }
                remove_expired_candidacies(txn, &mut leases, &candidates.prefix, now)?;
                // The freshest: the most time left, then the first key.
                let mut candidate: Option<(String, String, Duration)> = None;
                for (name, lease, left) in live_leases_under(&leases, &candidates.prefix, now)? {
                    if candidate.as_ref().is_none_or(|(_, _, best)| left > *best)
                        && (candidates.eligible)(&lease.value)
                    {
                        candidate = Some((name, lease.value, left));
                    }
                }
                let outcome = if let Some((name, to, _)) = candidate {
                    // The candidacy is spent, and its term with it
                    // (`remove_expired_candidacies`).
                    leases.remove(name.as_str())?;
                    txn.open_table(TERMS)?.remove(name.as_str())?;
                    let term = issue_term(txn, &key)?;
                    leases.insert(key.as_str(), lease_row(&to, term, now, ttl))?;
                    HandOver::To { to, term }
                } else {
                    leases.remove(key.as_str())?;
                    HandOver::Deleted
                };
                let releases = count_release(txn)?;
                Ok((Some((outcome, releases)), Outcome::Release(releases)))
            })
            .await?;
        let Some((outcome, releases)) = handed else {
            return Ok(HandOver::NotHeld);
        };
        self.released(releases);
        Ok(outcome)
    }

    /// As the bell's watch thread read it right after the ring that ended the last wait
    /// ([`Rung`]).
    fn handed(&self, key: &str) -> Option<Record> {
        self.inner.rung.take(key, self.inner.clock.now())
    }

    /// [`CANDIDACY_TTL`], or 4 leases if longer: a process stopped in the middle of a write
    /// keeps the file's write lock and stalls every other writer (the leader's renewals too)
    /// until it runs again, so a standby writes its candidacy once per campaign, in effect.
    /// Hosts share the machine, so a stopped or dead standby is told by its process state
    /// (see [`Candidates::eligible`]), not by the age of its record.
    fn candidacy_ttl(&self, lease: Duration) -> Duration {
        CANDIDACY_TTL.max(lease.saturating_mul(4))
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        let key = key.to_owned();
        self.read("get", move |txn, now| {
            let leases = txn.open_table(LEASES)?;
            Ok(live_lease(&leases, &key, now)?
                .map(|(lease, time_left)| lease.into_record(time_left)))
        })
        .await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>, StoreError> {
        let prefix = prefix.to_owned();
        self.read("list", move |txn, now| {
            let leases = txn.open_table(LEASES)?;
            let listed = live_leases_under(&leases, &prefix, now)?
                .into_iter()
                .map(|(key, lease, time_left)| (key, lease.into_record(time_left)))
                .collect();
            Ok(listed)
        })
        .await
    }

    /// One write transaction: the records are found and rewritten under the same lock, so
    /// no other writer can come between the look and the renewal.
    async fn renew_all(
        &self,
        prefixes: &[&str],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<(String, Term)>, StoreError> {
        let prefixes: Vec<String> = prefixes.iter().map(|p| (*p).to_owned()).collect();
        let holder = holder.to_owned();
        self.write("renew_all", Lane::Lease, move |txn, now| {
            let mut leases = txn.open_table(LEASES)?;
            let mut ours = Vec::new();
            for prefix in &prefixes {
                for (key, lease, _) in live_leases_under(&leases, prefix, now)? {
                    if lease_value::holder(&lease.value) == holder {
                        leases
                            .insert(key.as_str(), lease_row(&lease.value, lease.term, now, ttl))?;
                        ours.push((key, lease.term));
                    }
                }
            }
            ours.sort();
            ours.dedup();
            let outcome = if ours.is_empty() {
                Outcome::Abort
            } else {
                Outcome::Commit
            };
            Ok((ours, outcome))
        })
        .await
    }

    /// Returns on a release by this process (in-process [`Notify`]), on a release by another
    /// process, or after `max`.
    ///
    /// Across processes: every release (`compare_and_delete`, `hand_over`) bumps a counter
    /// in its transaction, then rings the store's release bell ([`bell_path`]). A thread per
    /// store watches the bell with inotify ([`FileWatch`]); at each ring it reads the live
    /// records ([`Rung`], for [`TtlStore::handed`]) and then ends the wait. Only releases
    /// ring, so the counter is not read first (that was a second read on a takeover's path).
    /// inotify wakes a standby within a millisecond or so of the releasing commit, with no
    /// polling while nothing happens. The bell, not the store file, is watched: a waiter
    /// reading the file at each of the leader's renewals would take the file's header lock
    /// several times a second, and a waiter stopped (SIGSTOP) while it holds it stalls the
    /// leader's next commit; releases are rare. Without inotify (watch limit reached, a
    /// filesystem that does not report writes), or should a ring be missed (a process that
    /// died between its commit and its ring), the counter is also polled, every
    /// [`FALLBACK_POLL`] or [`SAFETY_POLL`].
    async fn settle(&self, max: Duration) {
        let mut in_flight = self.inner.writes_in_flight.subscribe();
        let _ = tokio::time::timeout(max, in_flight.wait_for(|n| *n == 0)).await;
    }

    async fn wait_released(&self, max: Duration) {
        let deadline = crate::clock::tokio_after(tokio::time::Instant::now(), max);
        let notified = self.inner.released.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Subscribe first, then take the count last seen as the baseline: it was read before
        // this poll, so any release after it counts, and the wait begins without a read of the
        // file (which would compete with the release commit it waits for, and delay the
        // caller's own next write). A release between that read and this poll makes the first
        // look return at once: a spurious wake-up, which callers allow for. Reading the counter
        // here instead would miss a release landing between the subscription and the read.
        let mut changes = self.inner.watch.as_ref().map(FileWatch::subscribe);
        let before = self.inner.releases_seen.load(Ordering::SeqCst);
        loop {
            let poll = if changes.is_some() {
                SAFETY_POLL
            } else {
                FALLBACK_POLL
            };
            // A ring (or the bell replaced or removed) ends the wait: only releases ring.
            let rung = async {
                match &mut changes {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut notified => return,
                () = tokio::time::sleep_until(deadline) => return,
                () = tokio::time::sleep(poll) => {}
                rung = rung => {
                    if rung {
                        return;
                    }
                    // The watch thread ended: poll from now on.
                    changes = None;
                }
            }
            match self.releases().await {
                Ok(now) if now == before => {}
                // Released, or the store failed: either way the caller should look.
                _ => return,
            }
        }
    }
}
