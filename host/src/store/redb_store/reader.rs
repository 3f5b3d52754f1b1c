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
            match opened.map_err(Fault::from) {
                Ok(db) => {
                    let reader = Self { db, file };
                    check_schema(&reader.begin_read()?)?;
                    return Ok(reader);
                }
                // A lock a writer holds for a moment (its commit): try again, as below.
                Err(fault) if before == after && !fault.is_transient() => return Err(fault),
                Err(_) => tries.again()?,
            }
        }
    }

    /// Begins a read transaction on the latest commit, registered so that no writer reuses
    /// its pages while it lasts, without the header lock (see the module's docs).
    ///
    /// # Errors
    /// redb's permanent error on a header that stayed the same around it; [`Fault::Overtaken`]
    /// if commits landed (or writers held a lock it asked for) under every one of [`TRIES`].
    pub(super) fn begin_read(&self) -> Result<ReadTransaction, Fault> {
        let mut tries = Tries::default();
        loop {
            let before = read_header(&self.file)?;
            let txn = self.db.begin_read().map_err(Fault::from);
            let after = read_header(&self.file)?;
            match txn {
                Ok(txn) if before == after => return Ok(txn),
                // Not tried again: the store is not readable (and a commit under it changes
                // nothing of that).
                Err(fault) if before == after && !fault.is_transient() => return Err(fault),
                // A commit landed under it, or a writer holds a lock it asked for a moment.
                _ => {}
            }
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
    pub(super) fn held() -> BackendError {
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
