//! A redb storage backend whose every lock wait is bounded (SPEC §8: no process can stall
//! another).
//!
//! In multi-writer mode redb takes byte-range locks on the shared file: the header lock on
//! every transaction's begin and commit, the writer lock, per-transaction bytes. Its file
//! backend waits for them with a blocking `F_OFD_SETLKW`. So a process stopped while it holds
//! one (Ctrl-Z on `vvm-host status`, a standby paused mid-insert) stalls every other process
//! sharing the file, the leader's renewals included, until the killer ends the leader. Here a
//! wait tries the lock without blocking, pausing between tries, and gives up after `patience`
//! with a transient error, which the caller retries like any other.

use std::cell::Cell;
use std::io;
use std::ops::Bound;
use std::time::{Duration, Instant};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// The longest pause between two tries: a lock that is free again within a commit is taken
/// at most this late; a try is one `fcntl`.
const MAX_PAUSE: Duration = Duration::from_micros(200);

thread_local! {
    /// A bound below the store's patience for this thread's lock waits ([`capped`]).
    static CAP: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Runs `f` with every lock wait of this thread bounded by `cap` as well: for work that may
/// be skipped rather than wait on a stalled peer for the store's whole patience (the release
/// bell's watch thread reading the records at a ring).
pub(super) fn capped<T>(cap: Duration, f: impl FnOnce() -> T) -> T {
    let before = CAP.replace(Some(cap));
    let result = f();
    CAP.set(before);
    result
}

/// A [`FileBackend`] whose blocking lock calls wait at most `patience`.
#[derive(Debug)]
pub(super) struct BoundedLocks {
    inner: FileBackend,
    patience: Duration,
}

impl BoundedLocks {
    pub(super) fn new(file: std::fs::File, patience: Duration) -> Self {
        #[allow(clippy::unwrap_used)] // infallible without redb's experimental-api-5
        let inner = FileBackend::new(file).unwrap_or_else(|_| unreachable!());
        Self { inner, patience }
    }

    /// Tries `try_once` until it takes the lock or `patience` (or this thread's cap) has
    /// passed.
    fn wait(&self, try_once: impl Fn() -> Result<bool, BackendError>) -> Result<(), BackendError> {
        let patience = CAP
            .get()
            .map_or(self.patience, |cap| cap.min(self.patience));
        let start = Instant::now();
        let mut pause = Duration::from_micros(10);
        loop {
            if try_once()? {
                return Ok(());
            }
            if start.elapsed() >= patience {
                return Err(BackendError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "another process has held a lock on the store file for more than \
                         {patience:?}"
                    ),
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }
}

impl StorageBackend for BoundedLocks {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
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

    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.wait(|| self.inner.try_lock_range(start, end))
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.wait(|| self.inner.try_lock_shared_range(start, end))
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
