//! How a failure of the redb backend becomes a [`StoreError`]: transient or permanent, naming
//! the store file and the cause.

use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

use crate::store::StoreError;

/// Everything that can go wrong inside one redb store operation.
#[derive(Debug, thiserror::Error)]
pub(super) enum Fault {
    /// An error reported by redb itself.
    #[error(transparent)]
    Redb(#[from] redb::Error),
    /// Another process kept the file's write lock for longer than we wait.
    #[error("another process has held the write lock for more than {0:?}")]
    Busy(Duration),
    /// A reader began its transaction this many times, and each time a commit landed under
    /// it (`reader.rs`).
    #[error("commits landed under each of {0} tries to begin a read")]
    Overtaken(u32),
    /// The file was written by a vvm-host with another store layout.
    #[error(
        "incompatible schema version {found}: this vvm-host reads version {supported}; \
         use the vvm-host that wrote the file or move it aside"
    )]
    SchemaVersion {
        /// The version recorded in the file.
        found: u64,
        /// The version this build reads and writes.
        supported: u64,
    },
    /// A table of the file has other key or value types than this build's.
    #[error("table layout differs from this vvm-host's: {0}")]
    Layout(redb::TableError),
    /// A redb database of some other program.
    #[error("not a vvm-host store: it holds table {0:?} and no vvm-host schema version")]
    Foreign(String),
    /// A write through a handle opened for reading only.
    #[error("the store was opened read-only")]
    ReadOnly,
    /// The file changed under this host: overwritten or replaced (`scrub`).
    #[error("{0}")]
    Invalid(String),
    /// A commit failed (a peer stopped while it held the header lock, an I/O error). Nothing
    /// of it was written, but redb has discarded this handle's allocator state: the handle
    /// must be opened anew.
    #[error("commit failed: {0}")]
    Commit(#[source] redb::Error),
    /// The blocking task running the operation panicked or was cancelled.
    #[error("the store operation did not complete: {0}")]
    Aborted(String),
}

/// Lifts each of redb's narrow error types into [`Fault::Redb`].
macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Fault {
            fn from(e: $t) -> Self {
                Self::Redb(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

impl Fault {
    /// True if retrying can help: I/O hiccups, a busy lock, a transaction that failed midway.
    /// A failure to open a table: a [`Fault::Layout`] if the table has other types.
    pub(super) fn table(e: redb::TableError) -> Self {
        match e {
            redb::TableError::TableTypeMismatch { .. }
            | redb::TableError::TypeDefinitionChanged { .. }
            | redb::TableError::TableIsMultimap(_)
            | redb::TableError::TableIsNotMultimap(_) => Self::Layout(e),
            other => other.into(),
        }
    }

    pub(super) fn is_transient(&self) -> bool {
        match self {
            Self::Busy(_) | Self::Overtaken(_) => true,
            Self::SchemaVersion { .. }
            | Self::Layout(_)
            | Self::Foreign(_)
            | Self::ReadOnly
            | Self::Invalid(_)
            | Self::Aborted(_) => false,
            Self::Redb(e) | Self::Commit(e) => redb_is_transient(e) || spent(e),
        }
    }

    /// True if this handle of the database cannot be used any more and must be opened anew
    /// (redb asks for this after an I/O error: "close and re-open the database").
    pub(super) fn needs_reopen(&self) -> bool {
        match self {
            Self::Commit(_) => true,
            Self::Redb(e) => {
                spent(e)
                    || matches!(
                        e,
                        redb::Error::PreviousIo
                            | redb::Error::DatabaseClosed
                            | redb::Error::LockPoisoned(_)
                    )
            }
            _ => false,
        }
    }

    /// The [`StoreError`] reported to callers: `op` on the store at `path`, and the cause.
    pub(super) fn into_store_error(self, path: &Path, op: &str) -> StoreError {
        let context = format!("redb store {}: {op}", path.display());
        if self.is_transient() {
            StoreError::transient(context, self)
        } else {
            StoreError::permanent(context, self)
        }
    }
}

/// Whether `e` is redb's answer on a handle whose allocator state a failed commit discarded
/// (it has no variant of its own): the file is sound, and reopening the handle repairs it.
fn spent(e: &redb::Error) -> bool {
    matches!(e, redb::Error::Corrupted(why) if why.contains("reopen the database"))
}

fn redb_is_transient(e: &redb::Error) -> bool {
    use redb::Error as E;
    match e {
        E::Io(io) => io_is_transient(io.kind()),
        // Another program holds the whole file (an ExclusiveWriter open): it may close it.
        E::DatabaseAlreadyOpen
        // Cleared by reopening the database, which the store does on its own.
        | E::PreviousIo
        | E::DatabaseClosed
        | E::LockPoisoned(_)
        // The transaction failed part way and was discarded; a new one may succeed.
        | E::TransactionPoisoned
        | E::TransactionInProgress
        | E::WouldBlock
        | E::Backend(_) => true,
        // A process of another redb generation shares the file; the file is damaged or of
        // another format; its tables have other types: none of these goes away by retrying.
        E::LockProtocolMismatch
        | E::RepairAborted
        | E::UpgradeRequired(_)
        | E::Corrupted(_)
        | E::ValueTooLarge(_)
        | E::Unsupported
        | E::TableTypeMismatch { .. }
        | E::TypeDefinitionChanged { .. }
        | E::TableIsMultimap(_)
        | E::TableIsNotMultimap(_)
        | E::TableDoesNotExist(_)
        | E::TableExists(_) => false,
        // Errors that the store's own code cannot cause (savepoints, compaction, cursors), or
        // that a newer redb adds: report them plainly rather than retry forever. (The arms
        // above name the permanent errors we know of; this one is for the rest.)
        #[allow(clippy::match_same_arms)]
        _ => false,
    }
}

/// Errors of the file and its directory (missing, forbidden, not a database, read-only
/// filesystem) are permanent; the rest (interrupted, timed out, disk full, ...) may pass.
fn io_is_transient(kind: ErrorKind) -> bool {
    !matches!(
        kind,
        ErrorKind::NotFound
            | ErrorKind::PermissionDenied
            | ErrorKind::InvalidData
            | ErrorKind::InvalidInput
            | ErrorKind::ReadOnlyFilesystem
            | ErrorKind::IsADirectory
            | ErrorKind::NotADirectory
            | ErrorKind::Unsupported
            | ErrorKind::FileTooLarge
            | ErrorKind::InvalidFilename
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: ErrorKind) -> Fault {
        Fault::Redb(redb::Error::Io(kind.into()))
    }

    #[test]
    fn io_errors_of_the_file_are_permanent_others_transient() {
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::PermissionDenied,
            ErrorKind::InvalidData,
        ] {
            assert!(!io(kind).is_transient(), "{kind:?}");
        }
        for kind in [
            ErrorKind::Interrupted,
            ErrorKind::TimedOut,
            ErrorKind::StorageFull,
        ] {
            assert!(io(kind).is_transient(), "{kind:?}");
        }
    }

    #[test]
    fn busy_and_previous_io_are_transient_corruption_is_not() {
        assert!(Fault::Busy(Duration::from_secs(1)).is_transient());
        let previous = Fault::Redb(redb::Error::PreviousIo);
        assert!(previous.is_transient() && previous.needs_reopen());
        assert!(!Fault::Redb(redb::Error::Corrupted("x".into())).is_transient());
        // The words redb 4 uses for a handle spent by a failed commit.
        let spent = Fault::Redb(redb::Error::Corrupted(
            "Allocator state was discarded by a failed integrity check or commit; reopen the \
             database to repair it"
                .into(),
        ));
        assert!(spent.is_transient() && spent.needs_reopen());
        assert!(!Fault::Redb(redb::Error::LockProtocolMismatch).is_transient());
    }

    #[test]
    fn store_error_names_path_operation_and_cause() {
        let e = Fault::SchemaVersion {
            found: 9,
            supported: 1,
        }
        .into_store_error(Path::new("/srv/x.redb"), "open");
        assert!(!e.is_transient());
        let text = e.to_string();
        assert!(
            text.contains("/srv/x.redb") && text.contains("open"),
            "{text}"
        );
        assert!(text.contains("schema version 9"), "{text}");
    }
}
