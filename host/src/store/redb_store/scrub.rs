//! Noticing a store file changed under a running host (issue 28): overwritten in place (a
//! restore from a backup, a bad deploy script) or replaced (a rename over its path, a second
//! machine mounting another file there).
//!
//! redb cannot be relied on to notice by itself. A writer checks the file's header at the
//! start of each write, but it writes the header back from memory at each commit and reads
//! the tables from its page cache: an overwrite that lands while one of this host's commits
//! is under way has its header put back by that commit, and the host then goes on, for good,
//! serving from pages that are no longer on disk (the e2e test overwriting every byte saw
//! that in 3 runs of 5). Other processes reading the file meanwhile would read what the host
//! does not see.
//!
//! So a [`Scrubber`] thread reads the file every [`PERIOD`] the way another process would:
//! through a fresh read-only handle (an empty cache), every record of the lease, term and
//! meta tables, whose pages redb checks against their checksums, and it compares the path's
//! device and inode with the file the store opened. The first failure marks the store
//! invalid ([`Verdict`]): from then on every operation fails permanently with that reason
//! (`DB corrupted: ...`, whichever way redb put it: a garbage header is an I/O error "Not a
//! redb database" to it), so the host stops serving from it within [`PERIOD`] plus one
//! renewal. An overwrite that a commit of the host's own then wrote over entirely leaves a
//! valid file that every reader reads alike: that one is not a fault.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::fault::Fault;
use super::reader::Reader;
use super::schema::{LEASES, META, TERMS};

/// How often the file is read afresh.
pub(super) const PERIOD: Duration = Duration::from_secs(1);

/// Why the store's file can no longer be served from, once it cannot; shared by the store and
/// its scrubber.
#[derive(Clone, Debug, Default)]
pub(super) struct Verdict(Arc<Mutex<Option<String>>>);

impl Verdict {
    /// The reason the file is invalid, if it is.
    pub(super) fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, reason: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(reason);
    }
}

/// The thread that reads the file every [`PERIOD`]; dropping it stops and joins the thread at
/// once (it waits on a channel the drop closes).
pub(super) struct Scrubber {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Scrubber {
    /// Starts reading `path` (which the store opened as the file `identity`, `(dev, ino)`),
    /// setting `verdict` at the first failure.
    pub(super) fn start(
        path: PathBuf,
        identity: (u64, u64),
        verdict: Verdict,
    ) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vvm-redb-scrub".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(PERIOD) {
                    if let Err(reason) = check(&path, identity) {
                        tracing::error!(path = %path.display(), %reason,
                            "redb store file changed under this host; no longer served from");
                        verdict.set(reason);
                        return;
                    }
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Scrubber {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The `(dev, ino)` of the file at `path`.
pub(super) fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// Reads `path` as a fresh reader would, with a [`Reader`], which makes no writer wait; `Err`
/// names why it is not the valid file the store opened. A read that commits kept overtaking
/// is not a failure: it is tried again at the next period.
pub(super) fn check(path: &Path, opened: (u64, u64)) -> Result<(), String> {
    match identity(path) {
        Ok(now) if now == opened => {}
        Ok(_) => return Err("DB corrupted: the path now names another file".to_owned()),
        Err(e) => return Err(format!("DB corrupted: the file is gone: {e}")),
    }
    let read = || -> Result<(), Fault> {
        let txn = Reader::open(path)?.begin_read()?;
        walk(&txn.open_table(LEASES)?)?;
        walk(&txn.open_table(TERMS)?)?;
        walk(&txn.open_table(META)?)
    };
    // redb reads some pages without checking them first, and a page of garbage can make it
    // panic: that too says the file is not the one written.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.is_transient() => {
            tracing::debug!(path = %path.display(), error = %e, "redb store file not read afresh this time");
            Ok(())
        }
        Ok(Err(e)) => Err(format!("DB corrupted: a fresh read fails: {e}")),
        Err(_) => Err("DB corrupted: its pages cannot be read".to_owned()),
    }
}

/// Reads every record of `table`, so that redb checks every page of it.
fn walk<K: redb::Key + 'static, V: redb::Value + 'static>(
    table: &impl redb::ReadableTable<K, V>,
) -> Result<(), Fault> {
    for entry in table.iter()? {
        entry?;
    }
    Ok(())
}
