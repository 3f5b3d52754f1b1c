//! Files, read without waiting on them. Reading a file an operator named (SPEC §8: no file
//! can make the host hang or panic): a regular file only, opened without blocking, and bounded
//! in size; the configuration, the etcd PEM files and the service components are all read
//! through [`read_file`]. And a thread waiting on an inotify watch whose events only matter by
//! coming, stopped at once on drop ([`WatchThread`]), for the crash lock and the store's
//! release bell.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, eventfd, poll};

/// The largest configuration file or PEM file (CA, certificate, key) read: far more than any
/// real one, and a mistaken path (`/dev/zero`, a disk image) is refused rather than read.
pub const MAX_SETTINGS_FILE_BYTES: u64 = 1 << 20;

/// Why a file an operator named could not be read ([`read_file`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// Opening or reading failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A FIFO, a device or a socket: never read, as it might never end or never answer.
    #[error("not a regular file")]
    NotAFile,
    /// Larger than its kind of file is let be.
    #[error("too large: {size} bytes; at most {max}")]
    TooLarge {
        /// The file's size (or what was read of it).
        size: u64,
        /// The bound.
        max: u64,
    },
}

impl FileError {
    /// Whether the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io(e) if e.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The regular file `path`, opened for reading without blocking: a FIFO, a device or a
/// socket in its place is refused ([`FileError::NotAFile`]) rather than waited on.
///
/// # Errors
/// As [`FileError`] says.
pub fn open_regular(path: &Path) -> Result<std::fs::File, FileError> {
    use std::os::unix::fs::OpenOptionsExt as _;

    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits().cast_signed())
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(FileError::NotAFile);
    }
    Ok(file)
}

/// The bytes of the regular file `path`, of at most `max` bytes. Opened without blocking, so
/// a FIFO in its place is refused rather than waited on; a larger file is refused by its
/// size, unread.
///
/// # Errors
/// As [`FileError`] says.
pub fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    use std::io::Read as _;

    let file = open_regular(path)?;
    let meta = file.metadata()?;
    if meta.len() > max {
        return Err(FileError::TooLarge {
            size: meta.len(),
            max,
        });
    }
    let mut bytes = Vec::new();
    // One byte more than the bound tells a file that grew past it while being read.
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if size > max {
        return Err(FileError::TooLarge { size, max });
    }
    Ok(bytes)
}

/// A thread blocked on a descriptor (an inotify instance, a listening socket) and a timeout,
/// if it asks for one, woken at once and joined when dropped.
///
/// A thread rather than tokio's `AsyncFd`, whose safe constructor is deprecated as unsound and
/// whose replacement is `unsafe`; a thread per watch costs nothing that matters here.
pub(crate) struct WatchThread {
    /// Written on drop to wake the thread from `poll`.
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// What woke a [`Waker::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Events came (and were drained).
    Events,
    /// The timeout passed.
    Timeout,
    /// The [`WatchThread`] is being dropped: return.
    Stop,
}

/// The thread's side of a [`WatchThread`]: the descriptor it watches and the stop signal.
pub(crate) struct Waker {
    watched: OwnedFd,
    stop: OwnedFd,
}

impl Waker {
    /// Waits for events of the watched inotify instance (drained before returning), the
    /// stop, or `timeout` (`None`: no timeout; beyond a second: a second). The stop wins over
    /// events that came with it.
    ///
    /// # Errors
    /// When polling or draining fails.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> io::Result<Wake> {
        let wake = self.wait_readable(timeout)?;
        if wake == Wake::Events {
            drain_events(&self.watched)?;
        }
        Ok(wake)
    }

    /// Waits until the watched descriptor is readable ([`Wake::Events`]: what is to be read
    /// is the caller's to read), the stop, or `timeout`, as [`Waker::wait`] does.
    ///
    /// # Errors
    /// When polling fails.
    pub(crate) fn wait_readable(&self, timeout: Option<Duration>) -> io::Result<Wake> {
        let timeout = timeout.map(|t| {
            Timespec::try_from(t).unwrap_or(Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            })
        });
        let mut fds = [
            PollFd::new(&self.watched, PollFlags::IN),
            PollFd::new(&self.stop, PollFlags::IN),
        ];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        if !fds[1].revents().is_empty() {
            return Ok(Wake::Stop);
        }
        if fds[0].revents().is_empty() {
            return Ok(Wake::Timeout);
        }
        Ok(Wake::Events)
    }

    /// The watched descriptor.
    pub(crate) fn watched(&self) -> std::os::fd::BorrowedFd<'_> {
        self.watched.as_fd()
    }
}

impl WatchThread {
    /// Starts thread `name` running `body` with the [`Waker`] of `watched` (a non-blocking
    /// inotify instance with its watches added, or a listening socket). `body` must return
    /// when a wait says [`Wake::Stop`].
    ///
    /// # Errors
    /// When the stop signal or the thread cannot be made.
    pub(crate) fn spawn(
        name: &str,
        watched: OwnedFd,
        body: impl FnOnce(&Waker) + Send + 'static,
    ) -> io::Result<Self> {
        let stop = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let waker = Waker {
            watched,
            stop: stop.try_clone()?,
        };
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || body(&waker))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for WatchThread {
    fn drop(&mut self) {
        if rustix::io::write(&self.stop, &1_u64.to_ne_bytes()).is_ok()
            && let Some(thread) = self.thread.take()
        {
            // The thread only polls and does a little work: it ends at once once it runs. But
            // on a busy machine it may wait several milliseconds for a CPU, and a caller on an
            // async worker (a campaign that has just won) must not wait for that: join on the
            // blocking pool then (the runtime waits for it when it shuts down).
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || thread.join())),
                Err(_) => drop(thread.join()),
            }
        }
    }
}

/// Reads every pending event of the non-blocking descriptor `fd` (an inotify instance): their
/// content does not matter, only that they came.
///
/// # Errors
/// A read error other than "nothing more now" or an interrupt.
fn drain_events(fd: impl AsFd) -> std::io::Result<()> {
    let mut buf = [0_u8; 4096];
    loop {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) | Err(rustix::io::Errno::AGAIN) => return Ok(()),
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
