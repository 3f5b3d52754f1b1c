//! Files, read without waiting on them. Reading a file an operator named (SPEC §8: no file
//! can make the host hang or panic): a regular file only, opened without blocking, and bounded
//! in size; the configuration, the etcd PEM files and the service components are all read
//! through [`read_file`]. And draining a non-blocking event descriptor (inotify) whose events
//! only matter by coming ([`drain_events`]), for the crash lock and the store's release bell.

use std::os::fd::AsFd;
use std::path::Path;

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

/// The bytes of the regular file `path`, of at most `max` bytes. Opened without blocking, so
/// a FIFO in its place is refused rather than waited on; a larger file is refused by its
/// size, unread.
///
/// # Errors
/// As [`FileError`] says.
pub fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits().cast_signed())
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(FileError::NotAFile);
    }
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

/// Reads every pending event of the non-blocking descriptor `fd` (an inotify instance): their
/// content does not matter, only that they came.
///
/// # Errors
/// A read error other than "nothing more now" or an interrupt.
pub(crate) fn drain_events(fd: impl AsFd) -> std::io::Result<()> {
    let mut buf = [0_u8; 4096];
    loop {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) | Err(rustix::io::Errno::AGAIN) => return Ok(()),
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}
