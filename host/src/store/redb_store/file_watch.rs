//! Tells waiters when any process writes the store's release bell (inotify), so a standby sees
//! a release within a millisecond or so instead of at its next poll.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::thread::JoinHandle;

use rustix::event::{EventfdFlags, PollFd, PollFlags, eventfd, poll};
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use tokio::sync::watch;

/// A thread blocked on an inotify watch of one file, counting the bursts of writes it sees.
///
/// A thread rather than tokio's `AsyncFd`, whose safe constructor is deprecated as unsound
/// and whose replacement is `unsafe`; one thread per open store costs nothing that matters.
/// Dropping the watch stops and joins the thread.
pub(super) struct FileWatch {
    changes: watch::Receiver<u64>,
    /// Written on drop to wake the thread from `poll`.
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
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
        let stop = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let stop_rx = stop.try_clone()?;
        let (tx, changes) = watch::channel(0_u64);
        let name = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("redb-store-watch".into())
            .spawn(move || {
                if let Err(e) = run(&inotify, &stop_rx, &tx, &on_write) {
                    // Dropping `tx` tells the waiters, who fall back to polling.
                    tracing::warn!(path = %name, error = %e, "redb store file watch ended");
                }
            })?;
        Ok(Self {
            changes,
            stop,
            thread: Some(thread),
        })
    }

    /// A receiver that sees every later write; `changed()` fails once the watch has ended.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        let mut rx = self.changes.clone();
        rx.mark_unchanged();
        rx
    }
}

impl Drop for FileWatch {
    fn drop(&mut self) {
        if rustix::io::write(&self.stop, &1_u64.to_ne_bytes()).is_ok()
            && let Some(thread) = self.thread.take()
        {
            // The thread only polls and drains: it ends at once.
            let _ = thread.join();
        }
    }
}

/// Until `stop` is signalled: wait for inotify events, drain them, run `on_write`, bump the
/// counter.
fn run(
    inotify: &OwnedFd,
    stop: &OwnedFd,
    tx: &watch::Sender<u64>,
    on_write: &dyn Fn(),
) -> io::Result<()> {
    loop {
        let mut fds = [
            PollFd::new(inotify, PollFlags::IN),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if !fds[1].revents().is_empty() {
            return Ok(());
        }
        if !fds[0].revents().is_empty() {
            crate::fs::drain_events(inotify)?;
            on_write();
            tx.send_modify(|n| *n = n.wrapping_add(1));
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
