//! The configuration file followed while serving (SPEC §8, §13): a `vvm.toml` written again
//! (closed after a write, or renamed into place, as editors and configuration tools do) is
//! re-read as SIGHUP re-reads it, so a repinned `source` or a changed grant applies without a
//! signal.
//!
//! The file's directory is watched (an editor's rename replaces the file, which a watch on the
//! file itself would lose), and only events naming the file count.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Follows one configuration file until dropped (dropping it ends the watch).
pub(super) struct ConfigWatch {
    _watcher: RecommendedWatcher,
}

impl ConfigWatch {
    /// Follows `file`, sending on `changed` each time it is written again. `None` (said in
    /// the log) when its directory cannot be watched: SIGHUP still re-reads it.
    pub(super) fn start(file: &Path, changed: mpsc::UnboundedSender<()>) -> Option<Self> {
        let name: OsString = file.file_name()?.to_owned();
        let dir: PathBuf = match file.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        let watched = move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if rewritten(event.kind) && event.paths.iter().any(|p| p.file_name() == Some(&name)) {
                // The receiver is gone only once serving has ended.
                let _ = changed.send(());
            }
        };
        let started = notify::recommended_watcher(watched)
            .and_then(|mut w| w.watch(&dir, RecursiveMode::NonRecursive).map(|()| w));
        match started {
            Ok(watcher) => {
                tracing::info!(file = %file.display(), "following the configuration file");
                Some(Self { _watcher: watcher })
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "cannot follow the configuration file; SIGHUP re-reads it");
                None
            }
        }
    }
}

/// Whether an event of `kind` leaves the file complete and new: closed after a write, or
/// renamed into place.
fn rewritten(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(RenameMode::To))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_written_again_or_renamed_into_place_is_a_change_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("vvm.toml");
        std::fs::write(&file, "lease = \"10s\"\n").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _watch = ConfigWatch::start(&file, tx).unwrap();
        // Another file of the directory: no change.
        std::fs::write(dir.path().join("other.toml"), "x").unwrap();
        // Written again: one change.
        std::fs::write(&file, "lease = \"20s\"\n").unwrap();
        rx.recv().await.unwrap();
        // Renamed into place, as editors save: a change.
        let tmp = dir.path().join(".vvm.toml.swp");
        std::fs::write(&tmp, "lease = \"30s\"\n").unwrap();
        std::fs::rename(&tmp, &file).unwrap();
        rx.recv().await.unwrap();
        assert!(rx.try_recv().is_err(), "only the file's own events count");
    }
}
