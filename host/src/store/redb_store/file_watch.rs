//! Tells waiters when any process writes the store's release bell (inotify), so a standby sees
//! a release within a millisecond or so instead of at its next poll.

use std::io;
use std::path::Path;

use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use tokio::sync::watch;

use crate::fs::{Wake, Waker, WatchThread};

/// A thread blocked on an inotify watch of one file, counting the bursts of writes it sees.
/// Dropping the watch stops the thread.
pub(super) struct FileWatch {
    changes: watch::Receiver<u64>,
    _thread: WatchThread,
}

impl FileWatch {
    /// Starts watching `path` for writes (and for being replaced or removed). `on_write`
    /// runs on the watch thread after each burst of writes, before the waiters hear of it.
    pub(super) fn start(path: &Path, on_write: impl Fn() + Send + 'static) -> io::Result<Self> {
        let inotify = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        // MODIFY: redb writes pages and headers with pwrite. The others: the file was
        // replaced or removed; waiters then look at the store rather than wait on.
        inotify::add_watch(
            &inotify,
            path,
            WatchFlags::MODIFY
                | WatchFlags::ATTRIB
                | WatchFlags::DELETE_SELF
                | WatchFlags::MOVE_SELF,
        )?;
        let (tx, changes) = watch::channel(0_u64);
        let name = path.display().to_string();
        let thread = WatchThread::spawn("redb-store-watch", inotify, move |waker| {
            if let Err(e) = run(waker, &tx, &on_write) {
                // Dropping `tx` tells the waiters, who fall back to polling.
                tracing::warn!(path = %name, error = %e, "redb store file watch ended");
            }
        })?;
        Ok(Self {
            changes,
            _thread: thread,
        })
    }

    /// A receiver that sees every later write; `changed()` fails once the watch has ended.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        let mut rx = self.changes.clone();
        rx.mark_unchanged();
        rx
    }
}

/// Until the watch is dropped: after each burst of events, run `on_write` and bump the
/// counter.
fn run(waker: &Waker, tx: &watch::Sender<u64>, on_write: &dyn Fn()) -> io::Result<()> {
    loop {
        match waker.wait(None)? {
            Wake::Stop => return Ok(()),
            Wake::Events => {
                on_write();
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
            Wake::Timeout => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_write_by_anyone_is_reported_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0").unwrap();
        let watch = FileWatch::start(&path, || {}).unwrap();
        let mut rx = watch.subscribe();
        let quiet = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
        assert!(quiet.is_err(), "no write, no change");
        // Another handle of the file, as another process would have.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(b"1").unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("the write was reported")
            .unwrap();
        drop(watch);
        assert!(rx.changed().await.is_err(), "dropping the watch ends it");
    }
}
