//! The crash lock (SPEC §5 campaign, §8 takeover targets): on one machine the kernel tells a
//! standby when a lease holder's process is gone, so it need not wait out the lease.
//!
//! Every VVM takes an exclusive `flock(2)` on a file named by its holder value, in a directory
//! beside the store, *before* it can write a record, and keeps it until its shutdown sequence
//! has ended (every instance dropped, the lease released) or the process is gone. `flock`
//! belongs to the open file description: the kernel releases it only when the last descriptor
//! of it is closed, which for a killed process means that every one of its threads has ended.
//! The descriptor is `O_CLOEXEC`, so no program the host might exec inherits it.
//!
//! A standby that finds a slot held by `H` waits on `H`'s file ([`DeadHolders`]). When it gets
//! the lock, no guest of `H` can act any more, and it may delete `H`'s record by compare-and-
//! delete on its exact value (the fencing rules are untouched: any write of `H` that is still
//! in flight fails its own compare, and guest key-value writes are fenced by term). A leader
//! that is stopped (SIGSTOP) or wedged but alive still holds the lock: its record is waited out
//! as before. No file (a holder on another machine, or one that could not make its file) means
//! nothing is known, and the lease is waited out too.
//!
//! A lock that is not there can never be mistaken for one that was released: the file is
//! created unnamed (`O_TMPFILE`), locked, and only then linked under its name, so a name that
//! exists always names a file its holder locked; nobody but the holder creates that name.
//! Locks only mean this on a local filesystem (over NFS a partitioned client loses its locks
//! while it runs), so any other filesystem turns the crash lock off.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use rustix::fs::{AtFlags, CWD, FlockOperation, FsWord, Mode, OFlags};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::fs::{Wake, Waker, WatchThread};

/// Filesystems whose `flock` is the local kernel's (statfs magic numbers): ext2/3/4, xfs,
/// btrfs, tmpfs, overlayfs, zfs, f2fs, bcachefs.
const LOCAL_FILESYSTEMS: [FsWord; 8] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x794C_7630,
    0x2FC1_2FC1,
    0xF2F5_2010,
    0xCA45_1A4E,
];

/// After a close of a holder's file the lock is released a moment later (the kernel reports
/// the close first): try again after these pauses before waiting for the next event.
const RETRIES_AFTER_CLOSE: [Duration; 6] = [
    Duration::ZERO,
    Duration::from_micros(200),
    Duration::from_millis(1),
    Duration::from_millis(5),
    Duration::from_millis(20),
    Duration::from_millis(100),
];

/// Without an event, try the lock this often anyway, in case an event was lost.
const SAFETY_POLL: Duration = Duration::from_secs(1);

/// Why the crash lock is not available in a directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HolderLockError {
    /// The directory cannot be created or used.
    #[error("holder lock directory {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// The directory is not on a filesystem whose locks the local kernel keeps.
    #[error(
        "holder lock directory {path}: filesystem type {fs_type:#x} is not a known local one; \
         its locks may be released while their holder runs"
    )]
    NotLocal {
        /// The directory.
        path: PathBuf,
        /// The statfs magic number found.
        fs_type: FsWord,
    },
}

/// The directory of holder lock files beside a store.
#[derive(Debug)]
pub struct HolderLockDir {
    path: PathBuf,
}

impl HolderLockDir {
    /// The directory beside a redb store file: `<store>.holders`.
    pub fn beside(store: &Path) -> PathBuf {
        let mut name = store.as_os_str().to_owned();
        name.push(".holders");
        PathBuf::from(name)
    }

    /// Opens (creates) the directory and removes the files of holders that are gone (a killed
    /// standby's, or a killed leader's that no standby removed).
    ///
    /// # Errors
    /// When the directory cannot be created, or is not on a local filesystem.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, HolderLockError> {
        let path = path.into();
        let io_error = |source| HolderLockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&path).map_err(io_error)?;
        let dir = rustix::fs::open(&path, OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| io_error(e.into()))?;
        let fs_type = rustix::fs::fstatfs(&dir)
            .map_err(|e| io_error(e.into()))?
            .f_type;
        if !LOCAL_FILESYSTEMS.contains(&fs_type) {
            return Err(HolderLockError::NotLocal { path, fs_type });
        }
        let dir = Self { path };
        dir.sweep();
        Ok(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes `holder`'s lock: an unnamed file is created, locked, written with the holder
    /// value and only then linked under the holder's name.
    ///
    /// # Errors
    /// The I/O error; no file under the holder's name is left behind then.
    pub fn lock(&self, holder: &str) -> io::Result<HolderLock> {
        let fd = rustix::fs::open(
            &self.path,
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )?;
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive)?;
        rustix::io::write(&fd, holder.as_bytes())?;
        let path = self.file(holder);
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let link = || rustix::fs::linkat(CWD, &proc_path, CWD, &path, AtFlags::SYMLINK_FOLLOW);
        match link() {
            Err(rustix::io::Errno::EXIST) => {
                // Holder values are unique per run: a file under this name cannot be a live
                // holder's. It must not stay, unlocked, under a name standbys trust.
                std::fs::remove_file(&path)?;
                link()?;
            }
            other => other?,
        }
        tracing::debug!(holder, path = %path.display(), "holder lock taken");
        Ok(HolderLock { fd: Some(fd), path })
    }

    /// The lock file of `holder`: the SHA-256 of the value (any string makes a valid name).
    fn file(&self, holder: &str) -> PathBuf {
        let digest = Sha256::digest(holder.as_bytes());
        let mut name = String::with_capacity(70);
        for byte in digest {
            let _ = write!(name, "{byte:02x}");
        }
        name.push_str(".lock");
        self.path.join(name)
    }

    /// Removes every lock file whose lock is free: its holder is gone.
    fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return;
        };
        let mut removed = 0_usize;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "lock") && remove_if_free(&path) {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!(dir = %self.path.display(), removed, "removed the lock files of holders that are gone");
        }
    }
}

/// Opens the holder's file at `path` to read and lock it: a regular file, or `NOENT` for
/// anything else. Opened without waiting and without following a link, so something else
/// under the name (a FIFO, which would wait for a writer for ever; a link, maybe a loop)
/// cannot hold up the sweep or a standby.
fn open_holder_file(path: &Path) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOFOLLOW;
    let fd = rustix::fs::open(path, flags, Mode::empty())?;
    let stat = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(rustix::io::Errno::NOENT);
    }
    Ok(fd)
}

/// Unlinks `path` if its lock can be taken (its holder is gone), holding the lock meanwhile.
fn remove_if_free(path: &Path) -> bool {
    let Ok(fd) = open_holder_file(path) else {
        return false;
    };
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok()
        && std::fs::remove_file(path).is_ok()
}

/// A holder's lock, held until [`HolderLock::release`] or the end of the process.
#[derive(Debug)]
pub struct HolderLock {
    fd: Option<OwnedFd>,
    path: PathBuf,
}

impl HolderLock {
    /// Removes the file and releases the lock. Call only once no guest of this holder can act
    /// any more (the shutdown sequence has ended).
    pub fn release(mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "removing the holder lock file failed");
        }
        drop(self.fd.take());
        tracing::debug!(path = %self.path.display(), "holder lock released");
    }
}

impl Drop for HolderLock {
    /// Dropped without [`HolderLock::release`] (the shutdown sequence did not end, e.g. the
    /// runtime is going away): keep the lock until the process ends, when the kernel drops it.
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            tracing::debug!(path = %self.path.display(), "holder lock kept until the process ends");
            std::mem::forget(fd);
        }
    }
}

/// The holders a campaign waits on: each one's lock file watched by a thread, which reports
/// the holder once its lock is free. With no lock directory it never reports anything.
pub struct DeadHolders {
    dir: Option<std::sync::Arc<HolderLockDir>>,
    watched: HashMap<String, Watch>,
    /// Holders whose lock was found free, until [`DeadHolders::forget`].
    gone: HashSet<String>,
    tx: mpsc::UnboundedSender<(String, String)>,
    rx: mpsc::UnboundedReceiver<(String, String)>,
}

impl DeadHolders {
    /// Waits on holders' locks in `dir`, if any.
    pub fn new(dir: Option<std::sync::Arc<HolderLockDir>>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            dir,
            watched: HashMap::new(),
            gone: HashSet::new(),
            tx,
            rx,
        }
    }

    /// Starts waiting on `holder`, found holding `key`, unless already waiting on it. Does
    /// nothing when it has no lock file here (holder on another machine, or none made).
    pub fn watch(&mut self, key: &str, holder: &str) {
        let Some(dir) = &self.dir else { return };
        if self.watched.contains_key(holder) {
            return;
        }
        match Watch::start(&dir.file(holder), key, holder, self.tx.clone()) {
            Ok(Some(watch)) => {
                tracing::info!(key, holder, "waiting on the holder's lock");
                self.watched.insert(holder.to_owned(), watch);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(key, holder, error = %e, "cannot wait on the holder's lock"),
        }
    }

    /// Returns when a watched holder is found gone (its lock was free): from then on
    /// [`DeadHolders::is_gone`] says so. Pending for ever if nothing is watched.
    pub async fn next(&mut self) {
        // `self.tx` is alive as long as `self`: `None` never comes.
        if let Some((key, holder)) = self.rx.recv().await {
            tracing::debug!(key, holder, "holder gone");
            self.gone.insert(holder);
        }
    }

    /// True once `holder`'s lock was found free: its process is gone, or its VVM has ended
    /// its shutdown sequence. No guest of it can act any more.
    pub fn is_gone(&self, holder: &str) -> bool {
        self.gone.contains(holder)
    }

    /// Stops waiting on `holder` and removes its lock file (call after its record is deleted).
    pub fn forget(&mut self, holder: &str) {
        self.gone.remove(holder);
        self.watched.remove(holder);
        if let Some(dir) = &self.dir {
            // The holder is gone; whoever removes the file first wins, the rest find none.
            let _ = std::fs::remove_file(dir.file(holder));
        }
    }
}

/// A thread waiting for one holder's lock; dropping it stops the thread.
struct Watch {
    _thread: WatchThread,
}

impl Watch {
    /// `None` when there is no file for `holder`, or it names someone else.
    fn start(
        path: &Path,
        key: &str,
        holder: &str,
        gone: mpsc::UnboundedSender<(String, String)>,
    ) -> io::Result<Option<Self>> {
        let fd = match open_holder_file(path) {
            Ok(fd) => fd,
            // No file, or something else under the name: no lock is known.
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut content = vec![0_u8; holder.len() + 1];
        let n = rustix::io::read(&fd, &mut content)?;
        if content.get(..n) != Some(holder.as_bytes()) {
            return Ok(None);
        }
        // The holder's close of its descriptor (its death) is a CLOSE_WRITE: only the holder
        // opens the file for writing. Watch first, then try: a death between is not missed.
        let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        inotify::add_watch(
            &inotify,
            path,
            WatchFlags::CLOSE_WRITE | WatchFlags::DELETE_SELF,
        )?;
        let (key, holder) = (key.to_owned(), holder.to_owned());
        let thread = WatchThread::spawn(
            "holder-lock-wait",
            inotify,
            move |waker| match wait_free(&fd, waker) {
                Ok(true) => {
                    tracing::info!(
                        key,
                        holder,
                        "the holder's lock is free: its process is gone"
                    );
                    let _ = gone.send((key, holder));
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(key, holder, error = %e, "waiting on the holder's lock failed");
                }
            },
        )?;
        Ok(Some(Self { _thread: thread }))
    }
}

/// Until the watch is dropped: try the lock of `file`, after each close of it and every
/// [`SAFETY_POLL`]. `Ok(true)` once it was taken (and released again: the file stays).
fn wait_free(file: &OwnedFd, waker: &Waker) -> io::Result<bool> {
    let mut retries = RETRIES_AFTER_CLOSE.iter();
    let mut pause = Duration::ZERO;
    loop {
        match rustix::fs::flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        match waker.wait(Some(pause))? {
            Wake::Stop => return Ok(false),
            Wake::Events => retries = RETRIES_AFTER_CLOSE.iter(),
            Wake::Timeout => {}
        }
        pause = retries.next().copied().unwrap_or(SAFETY_POLL);
    }
}

#[cfg(test)]
mod tests;
