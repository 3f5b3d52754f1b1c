//! Reading the store file without ever making a writer wait (SPEC §3: a read-only command
//! takes no lock that a writer waits for; stopped at any moment, for any time, it delays no
//! renewal and no guest write).
//!
//! In multi-writer mode redb coordinates the processes sharing a file with byte-range locks
//! (`bounded_locks.rs`). A read transaction takes two: the header lock, shared, for the
//! moment it reads the header and registers its snapshot; and its transaction's byte, shared,
//! for as long as it reads. Writers *wait* for the first, since every commit takes the header
//! lock exclusively. They only *look* at the second: a writer about to reuse freed pages asks
//! the kernel which transactions are still being read (`F_OFD_GETLK`) and spares their pages.
//! So a `vvm-host status` stopped (Ctrl-Z, a debugger, a frozen cgroup) in the moment it held
//! the header lock stalled every commit of every host until it ran again, the leader's
//! renewals too, and the leader lost its lease.
//!
//! A [`Reader`] never takes the header lock. Its backend ([`NoWait`]) lets redb's header-lock
//! calls pass without locking, and takes every other lock with a single try: it never waits
//! for one either. What the header lock gave, [`Reader::begin_read`] gets by checking: it
//! reads the header's bytes before and after redb begins the transaction, and keeps the
//! transaction only if they are the same. Then no commit landed while redb read the header
//! and registered the snapshot (every commit rewrites the header, and transaction ids only
//! grow, so equal bytes mean no commit between), so the snapshot was the latest one when its
//! registration was made, and its pages cannot have been freed yet: a page of it is freed by
//! the next commit and reused only by a transaction after that, whose reclamation sees the
//! registration and spares the page. A header that changed, or one read half-written (redb
//! checks each commit slot's checksum), makes it begin again. Inside the transaction every
//! read is redb's own, of pages no writer touches.
//!
//! What a stopped reader still holds is its transaction's byte: no writer waits for it, but
//! while it is held the pages that later commits free are not reused, so the file grows by
//! what is written meanwhile; those pages are reused once the reader runs on and ends.

use std::fs::File;
use std::io;
use std::ops::Bound;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::time::Duration;

use redb::backends::FileBackend;
use redb::{BackendError, Builder, ConcurrencyMode, ReadOnlyDatabase, ReadableDatabase as _};
use redb::{ReadTransaction, StorageBackend};

use super::fault::Fault;
use super::schema::{CACHE_BYTES, check_schema};

/// The bytes of redb's header (the magic number, the god byte, the two commit slots), which
/// redb's header lock covers: `0..DB_HEADER_SIZE` in redb's `page_manager.rs` (64 bytes, then
/// two commit slots of 128). A test pins it against the locks redb asks for.
const HEADER_BYTES: usize = 320;

/// The header's bytes as read, and how many there were (fewer in a file shorter than a
/// header).
type Header = ([u8; HEADER_BYTES], usize);

/// How many times [`Reader::begin_read`] begins a transaction while commits keep landing
/// under it. The window is a header read, a lock and another header read, microseconds; a
/// host commits at most every few hundred microseconds, so a few tries are the most ever
/// needed. Far more, and the store is reported busy rather than retried forever.
const TRIES: u32 = 1000;

/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_millis(1);

/// A read-only handle on the store file that never takes a lock a writer waits for (see the
/// module's docs).
pub(super) struct Reader {
    db: ReadOnlyDatabase,
    /// The file, as a second descriptor of the database's own open file description: the
    /// header is read through it, unlocked.
    file: File,
}

impl Reader {
    /// Opens the existing store file at `path` for reading and checks that it is a vvm-host
    /// store of this schema version.
    ///
    /// # Errors
    /// The file is missing or not a regular file, not a redb database, not a vvm-host store,
    /// or of another schema version; transient faults for what may pass.
    pub(super) fn open(path: &Path) -> Result<Self, Fault> {
        Self::open_with(path, |file| file)
    }

    /// [`Reader::open`] with `wrap` around the backend: tests watch the locks it takes.
    pub(super) fn open_with<B: StorageBackend>(
        path: &Path,
        wrap: impl Fn(NoWait) -> B,
    ) -> Result<Self, Fault> {
        let file = crate::fs::open_regular(path).map_err(|e| match e {
            crate::fs::FileError::Io(io) => redb::DatabaseError::from(io).into(),
            other => Fault::from(redb::DatabaseError::from(io::Error::new(
                io::ErrorKind::InvalidInput,
                other.to_string(),
            ))),
        })?;
        let mut tries = Tries::default();
        loop {
            let header = file.try_clone().map_err(redb::DatabaseError::from)?;
            let before = read_header(&file)?;
            // redb reads the header while it opens, unlocked here: a commit landing meanwhile
            // can show it half-written, which it reports as corruption.
            let opened = Builder::new()
                .set_concurrency_mode(ConcurrencyMode::MultiWriter)
                .set_cache_size(CACHE_BYTES)
                .open_read_only_with_backend(wrap(NoWait::new(header)));
            let after = read_header(&file)?;
            match opened {
                Ok(db) => {
                    let reader = Self { db, file };
                    check_schema(&reader.begin_read()?)?;
                    return Ok(reader);
                }
                Err(e) if before == after => return Err(e.into()),
                Err(_) => tries.again()?,
            }
        }
    }

    /// Begins a read transaction on the latest commit, registered so that no writer reuses
    /// its pages while it lasts, without the header lock (see the module's docs).
    ///
    /// # Errors
    /// redb's error on a header that stayed the same around it; [`Fault::Overtaken`] if
    /// commits landed under every one of [`TRIES`].
    pub(super) fn begin_read(&self) -> Result<ReadTransaction, Fault> {
        let mut tries = Tries::default();
        loop {
            let before = read_header(&self.file)?;
            let txn = self.db.begin_read();
            let after = read_header(&self.file)?;
            if before == after {
                return Ok(txn?);
            }
            drop(txn);
            tries.again()?;
        }
    }
}

/// Counts the tries of a read that commits keep overtaking, pausing a little more each time.
#[derive(Default)]
struct Tries {
    made: u32,
}

impl Tries {
    /// Pauses before the next try; [`Fault::Overtaken`] once [`TRIES`] are spent.
    fn again(&mut self) -> Result<(), Fault> {
        self.made += 1;
        if self.made >= TRIES {
            return Err(Fault::Overtaken(TRIES));
        }
        let pause = Duration::from_micros(10).saturating_mul(self.made);
        std::thread::sleep(pause.min(MAX_PAUSE));
        Ok(())
    }
}

/// The header's bytes as they are now, read without a lock.
fn read_header(file: &File) -> Result<Header, Fault> {
    let mut header = ([0; HEADER_BYTES], 0);
    // A file shorter than a header is no store; redb's open says so. Compared as read.
    while header.1 < HEADER_BYTES {
        let offset = header.1 as u64;
        match file.read_at(&mut header.0[header.1..], offset) {
            Ok(0) => break,
            Ok(n) => header.1 += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(redb::StorageError::from(e).into()),
        }
    }
    Ok(header)
}

/// The file backend of a [`Reader`]: redb's own, except that it never waits for a lock, and
/// never takes the header lock at all (see the module's docs). A lock that redb would wait
/// for is tried once and, if another process holds it, fails as busy.
#[derive(Debug)]
pub(super) struct NoWait(FileBackend);

impl NoWait {
    fn new(file: File) -> Self {
        #[allow(clippy::unwrap_used)] // infallible without redb's experimental-api-5
        Self(FileBackend::new(file).unwrap_or_else(|_| unreachable!()))
    }

    /// Whether `start..end` is redb's header lock.
    pub(super) fn is_header(start: Bound<u64>, end: Bound<u64>) -> bool {
        start == Bound::Included(0) && end == Bound::Excluded(HEADER_BYTES as u64)
    }

    /// A lock another process holds, which a reader does not wait for.
    fn held() -> BackendError {
        BackendError::Io(io::Error::new(
            io::ErrorKind::WouldBlock,
            "another process holds a lock on the store file, and a reader does not wait",
        ))
    }
}

impl StorageBackend for NoWait {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.0.read(offset, out)
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::ReadOnlyFilesystem))
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, _offset: u64, _data: &[u8]) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::ReadOnlyFilesystem))
    }

    fn close(&self) -> io::Result<()> {
        self.0.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.0.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        if Self::is_header(start, end) {
            return Ok(());
        }
        if self.0.try_lock_range(start, end)? {
            Ok(())
        } else {
            Err(Self::held())
        }
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        if Self::is_header(start, end) {
            return Ok(());
        }
        if self.0.try_lock_shared_range(start, end)? {
            Ok(())
        } else {
            Err(Self::held())
        }
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        if Self::is_header(start, end) {
            return Ok(());
        }
        self.0.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use redb::{ReadableTable as _, ReadableTableMetadata as _};

    use super::super::RedbStore;
    use super::super::schema::LEASES;
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::store::kv::{KvOp, KvQuota, KvWrite};
    use crate::store::{Fence, FencedKv as _, TtlStore as _};

    const TTL: Duration = Duration::from_hours(1);
    /// How long the writer waits for a lock of another process: a reader that held one for
    /// longer would fail its commit.
    const WRITER_PATIENCE: Duration = Duration::from_millis(100);

    type Range = (Bound<u64>, Bound<u64>);

    /// Where redb's per-transaction lock bytes begin (`TXN_BASE` in its `db.rs`).
    const TRANSACTION_BYTES: u64 = (1 << 62) + 1024;

    /// A reader's backend that calls `hook` at every moment a process could be stopped while it
    /// holds something: right after each lock redb asked for is (or is said to be) taken, and
    /// before each read of the file.
    struct Watched {
        inner: NoWait,
        hook: Arc<dyn Fn(&'static str, Range) + Send + Sync>,
    }

    impl std::fmt::Debug for Watched {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_tuple("Watched").field(&self.inner).finish()
        }
    }

    impl StorageBackend for Watched {
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }

        fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
            (self.hook)("read", (Bound::Included(offset), Bound::Unbounded));
            self.inner.read(offset, out)
        }

        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }

        fn sync_data(&self) -> io::Result<()> {
            self.inner.sync_data()
        }

        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            self.inner.write(offset, data)
        }

        fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
            let taken = self.inner.try_lock_range(start, end)?;
            if taken {
                (self.hook)("try_lock_range", (start, end));
            }
            Ok(taken)
        }

        fn try_lock_shared_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> Result<bool, BackendError> {
            let taken = self.inner.try_lock_shared_range(start, end)?;
            if taken {
                (self.hook)("try_lock_shared_range", (start, end));
            }
            Ok(taken)
        }

        fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
            self.inner.lock_range(start, end)?;
            (self.hook)("lock_range", (start, end));
            Ok(())
        }

        fn lock_shared_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> Result<(), BackendError> {
            self.inner.lock_shared_range(start, end)?;
            (self.hook)("lock_shared_range", (start, end));
            Ok(())
        }

        fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
            self.inner.unlock_range(start, end)
        }

        fn query_lock_range(
            &self,
            start: Bound<u64>,
            end: Bound<u64>,
        ) -> Result<bool, BackendError> {
            self.inner.query_lock_range(start, end)
        }

        fn close(&self) -> io::Result<()> {
            self.inner.close()
        }
    }

    /// A host's store on `path` that waits at most [`WRITER_PATIENCE`] for a lock of another
    /// process, holding record "1" as "a".
    async fn impatient_writer(path: &Path) -> RedbStore {
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
        let store = RedbStore::open_inner(path, clock, WRITER_PATIENCE, false)
            .await
            .unwrap();
        store
            .insert_if_absent("1", "a", TTL)
            .await
            .unwrap()
            .unwrap();
        store
    }

    /// One renewal and one fenced guest write: both must commit while the reader is wherever
    /// it is.
    async fn commit_both(writer: &RedbStore, term: u64, n: usize) -> Result<(), String> {
        let renewed = writer.compare_and_swap("1", "a", "a", TTL).await;
        if !matches!(renewed, Ok(true)) {
            return Err(format!("renewal: {renewed:?}"));
        }
        let value = n.to_string();
        let writes = [KvWrite::Set {
            key: "n",
            value: value.as_bytes(),
        }];
        let fence = Fence {
            writer: "svc",
            lease_key: "1",
            term,
        };
        let written = writer
            .kv_apply(&fence, "svc", &KvOp::Batch(&writes), &KvQuota::UNLIMITED)
            .await;
        match written {
            Ok(Ok(_)) => Ok(()),
            other => Err(format!("guest write: {other:?}")),
        }
    }

    /// Issue 39: a reader stopped at any moment of its run (at each lock it takes, before each
    /// page it reads, from its open to the end of its transaction) delays no commit: at each
    /// such moment a host renews and a guest writes, each waiting at most 100 ms for a lock
    /// of another process, and each commits; the reader then reads what was committed before
    /// its transaction began. With the header lock taken as redb takes it, the first commit
    /// made inside `begin_read` fails after those 100 ms.
    #[test]
    fn a_reader_paused_anywhere_in_its_read_delays_no_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let writer = rt.block_on(impatient_writer(&path));
        let term = rt.block_on(writer.get("1")).unwrap().unwrap().term;
        let stops = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let seen = Mutex::new(std::collections::HashSet::new());
        let hook = {
            let (stops, failures) = (Arc::clone(&stops), Arc::clone(&failures));
            let rt = Arc::new(rt);
            move |call: &'static str, range: Range| {
                // Once at each kind of moment: a commit there makes the reader begin again (it
                // is not the snapshot it registered), and the next try passes the same kinds
                // of moment again, on the next transaction's byte and the new commit's pages.
                let kind = match range.0 {
                    Bound::Included(at) if call == "read" && at > 0 => Bound::Unbounded,
                    Bound::Included(at) if at >= TRANSACTION_BYTES => Bound::Unbounded,
                    _ => range.0,
                };
                if !seen.lock().unwrap().insert((call, kind)) {
                    return;
                }
                let n = stops.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = rt.block_on(commit_both(&writer, term, n)) {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("{call} {range:?}: {e}"));
                }
            }
        };
        let hook: Arc<dyn Fn(&'static str, Range) + Send + Sync> = Arc::new(hook);
        let reader = Reader::open_with(&path, |inner| Watched {
            inner,
            hook: Arc::clone(&hook),
        })
        .unwrap();
        let txn = reader.begin_read().unwrap();
        let leases = txn.open_table(LEASES).unwrap();
        assert_eq!(leases.len().unwrap(), 1);
        for row in leases.iter().unwrap() {
            row.unwrap();
        }
        drop((leases, txn, reader));
        let failures = failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "commits that waited for the reader:\n{}",
            failures.join("\n")
        );
        assert!(
            stops.load(Ordering::SeqCst) >= 5,
            "the reader was paused at its locks and reads"
        );
    }

    /// What [`HEADER_BYTES`] stands on: the one range at the file's start that redb locks on a
    /// reader's behalf is exactly the header, `0..HEADER_BYTES`. (A redb with a larger
    /// header would fail here before a reader could lock half of it.)
    #[test]
    fn redbs_header_lock_is_the_range_a_reader_passes_by() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _writer = rt.block_on(impatient_writer(&path));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let record = {
            let asked = Arc::clone(&asked);
            move |call: &'static str, range: Range| {
                if call != "read" && range.0 == Bound::Included(0) {
                    asked.lock().unwrap().push(range);
                }
            }
        };
        let hook: Arc<dyn Fn(&'static str, Range) + Send + Sync> = Arc::new(record);
        let reader = Reader::open_with(&path, |inner| Watched {
            inner,
            hook: Arc::clone(&hook),
        })
        .unwrap();
        drop(reader.begin_read().unwrap());
        let asked = asked.lock().unwrap();
        assert!(!asked.is_empty(), "redb locked the header");
        for (start, end) in asked.iter() {
            assert!(NoWait::is_header(*start, *end), "{start:?}..{end:?}");
        }
    }

    /// A read-only store (`vvm-host status`, `kv`) paused inside its read transaction, as by
    /// SIGSTOP, delays no renewal and no guest write of a host on the same file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_only_store_paused_inside_a_read_delays_no_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let writer = impatient_writer(&path).await;
        let term = writer.get("1").await.unwrap().unwrap().term;
        let reader = RedbStore::open_read_only(&path).await.unwrap();
        let (inside, wait_inside) = std::sync::mpsc::channel::<()>();
        let (go_on, paused) = std::sync::mpsc::channel::<()>();
        let read = tokio::spawn({
            let reader = reader.clone();
            async move {
                reader
                    .read("paused read", move |txn, _| {
                        inside.send(()).unwrap();
                        paused.recv().unwrap();
                        Ok(txn.open_table(LEASES)?.len()?)
                    })
                    .await
            }
        });
        tokio::task::spawn_blocking(move || wait_inside.recv().unwrap())
            .await
            .unwrap();
        for n in 0..20 {
            commit_both(&writer, term, n).await.unwrap();
        }
        go_on.send(()).unwrap();
        assert_eq!(read.await.unwrap().unwrap(), 1);
    }

    /// What `status` and `kv` read while a host commits at full speed is one committed state:
    /// every write sets `a` and `b` to its number and adds the key `k/<number>`, so a read
    /// that mixed two commits would see `a` and `b` differ, or keys and usage disagree.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readers_see_one_committed_state_while_a_writer_commits_at_full_speed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let writer = impatient_writer(&path).await;
        let term = writer.get("1").await.unwrap().unwrap().term;
        let fence = Fence {
            writer: "svc",
            lease_key: "1",
            term,
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writing = tokio::spawn({
            let stop = Arc::clone(&stop);
            async move {
                let mut n = 0_u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let (value, key) = (n.to_string(), format!("k/{n:08}"));
                    let writes = [
                        KvWrite::Set {
                            key: "a",
                            value: value.as_bytes(),
                        },
                        KvWrite::Set {
                            key: "b",
                            value: value.as_bytes(),
                        },
                        KvWrite::Set {
                            key: &key,
                            value: b"",
                        },
                    ];
                    let op = KvOp::Batch(&writes);
                    let done = writer
                        .kv_apply(&fence, "svc", &op, &KvQuota::UNLIMITED)
                        .await;
                    assert!(matches!(done, Ok(Ok(_))), "{done:?}");
                    assert!(writer.compare_and_swap("1", "a", "a", TTL).await.unwrap());
                }
                n
            }
        });
        // The writer's clock: a record it wrote is live to the reader.
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
        let reader = RedbStore::open_inner(&path, clock, WRITER_PATIENCE, true)
            .await
            .unwrap();
        let mut last = 0;
        for _ in 0..300 {
            let both = reader.kv_get_many("svc", &["a", "b"]).await.unwrap();
            assert_eq!(both[0], both[1], "a and b from one commit");
            let view = reader.kv_view("svc", "k/").await.unwrap();
            assert_eq!(
                u64::try_from(view.keys.len()).unwrap() + 2,
                view.usage.keys.max(2),
                "the keys listed and the usage from one commit"
            );
            let n = u64::try_from(view.keys.len()).unwrap();
            assert!(n >= last, "commits only add keys");
            last = n;
            let records = reader.list("").await.unwrap();
            assert_eq!(records.len(), 1);
        }
        stop.store(true, Ordering::SeqCst);
        let written = writing.await.unwrap();
        assert!(written > 10, "the writer committed throughout: {written}");
    }

    /// A commit landing between the header redb read and the registration of its snapshot
    /// (where the header lock kept commits out) makes the reader begin again: it reads the
    /// newer commit, never the snapshot whose pages the next writer may already reuse.
    #[test]
    fn a_commit_under_the_registration_makes_the_reader_begin_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let writer = rt.block_on(impatient_writer(&path));
        let term = rt.block_on(writer.get("1")).unwrap().unwrap().term;
        rt.block_on(commit_both(&writer, term, 0)).unwrap();
        let reading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let commits = Arc::new(AtomicUsize::new(0));
        let hook = {
            let (reading, commits) = (Arc::clone(&reading), Arc::clone(&commits));
            move |call: &'static str, range: Range| {
                let registering = matches!(range.0, Bound::Included(at) if at >= TRANSACTION_BYTES);
                if reading.load(Ordering::SeqCst)
                    && call == "try_lock_shared_range"
                    && registering
                    && commits.load(Ordering::SeqCst) == 0
                {
                    // Two commits: the second may reuse the pages the first freed.
                    for n in 1..=2 {
                        rt.block_on(commit_both(&writer, term, n)).unwrap();
                        commits.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        };
        let hook: Arc<dyn Fn(&'static str, Range) + Send + Sync> = Arc::new(hook);
        let reader = Reader::open_with(&path, |inner| Watched {
            inner,
            hook: Arc::clone(&hook),
        })
        .unwrap();
        reading.store(true, Ordering::SeqCst);
        let txn = reader.begin_read().unwrap();
        assert_eq!(
            commits.load(Ordering::SeqCst),
            2,
            "the commits landed under it"
        );
        let kv = txn.open_table(super::super::schema::KV).unwrap();
        let n = kv.get(("svc", "n")).unwrap().map(|v| v.value().to_vec());
        assert_eq!(n.as_deref(), Some(&b"2"[..]), "the newest commit is read");
    }
}
