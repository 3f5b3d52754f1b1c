//! The crash lock, with real processes holding and losing it.

use std::sync::Arc;

use super::*;

impl HolderLock {
    /// What the kernel does when the holder's process dies: the descriptor is closed, the
    /// file stays.
    fn close_as_if_killed(mut self) {
        drop(self.fd.take());
    }
}

fn dir() -> (tempfile::TempDir, Arc<HolderLockDir>) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = HolderLockDir::open(tmp.path().join("holders")).unwrap();
    (tmp, Arc::new(dir))
}

async fn nothing_within(dead: &mut DeadHolders, wait: Duration) {
    let got = tokio::time::timeout(wait, dead.next()).await;
    assert!(got.is_err(), "reported gone while its holder lives");
}

#[tokio::test]
async fn a_holder_is_reported_gone_once_its_descriptor_is_closed_and_not_before() {
    let (_tmp, dir) = dir();
    let lock = dir.lock("host/1/abc/0").unwrap();
    let mut dead = DeadHolders::new(Some(Arc::clone(&dir)));
    dead.watch("slot/1", "host/1/abc/0");
    // Others opening and closing the file (standbys, the sweep of a starting host) are
    // not the holder's death.
    assert!(!remove_if_free(&dir.file("host/1/abc/0")));
    dir.sweep();
    nothing_within(&mut dead, Duration::from_millis(300)).await;
    lock.close_as_if_killed();
    assert!(!dead.is_gone("host/1/abc/0"));
    tokio::time::timeout(Duration::from_secs(10), dead.next())
        .await
        .expect("reported gone");
    assert!(dead.is_gone("host/1/abc/0"));
    dead.forget("host/1/abc/0");
    assert!(!dead.is_gone("host/1/abc/0"));
    assert!(!dir.file("host/1/abc/0").exists());
}

#[tokio::test]
async fn a_lock_dropped_without_release_is_kept_until_the_process_ends() {
    let (_tmp, dir) = dir();
    drop(dir.lock("h").unwrap());
    let mut dead = DeadHolders::new(Some(Arc::clone(&dir)));
    dead.watch("slot/1", "h");
    nothing_within(&mut dead, Duration::from_millis(300)).await;
    // Released: file removed, lock free; a later standby finds nothing to wait on.
    dir.lock("h2").unwrap().release();
    assert!(!dir.file("h2").exists());
}

#[tokio::test]
async fn no_file_or_a_file_naming_someone_else_is_not_waited_on() {
    let (_tmp, dir) = dir();
    let mut dead = DeadHolders::new(Some(Arc::clone(&dir)));
    dead.watch("slot/1", "remote");
    assert!(dead.watched.is_empty(), "no file: nothing is known");
    std::fs::write(dir.file("x"), "not x").unwrap();
    dead.watch("slot/1", "x");
    assert!(dead.watched.is_empty(), "a file naming another holder");
    nothing_within(&mut dead, Duration::from_millis(50)).await;
}

#[tokio::test]
async fn a_stale_file_under_a_holders_name_is_replaced_and_the_sweep_removes_free_ones() {
    let (_tmp, dir) = dir();
    std::fs::write(dir.file("h"), "h").unwrap();
    std::fs::write(dir.file("gone"), "gone").unwrap();
    let lock = dir.lock("h").unwrap();
    assert!(!remove_if_free(&dir.file("h")), "the new file is locked");
    dir.sweep();
    assert!(dir.file("h").exists(), "a held lock survives the sweep");
    assert!(!dir.file("gone").exists(), "a free one does not");
    lock.release();
}

/// What is not a holder's file (a FIFO, which an open would wait on for a writer for ever;
/// a symbolic link, maybe a loop; a directory), under a lock file's name: the sweep of a
/// starting host and a standby's watch pass it over, at once, and leave it.
#[test]
fn what_is_not_a_lock_file_is_passed_over_without_waiting() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("holders");
    std::fs::create_dir(&path).unwrap();
    let fifo = path.join("fifo.lock");
    testkit::fifo(&fifo);
    std::os::unix::fs::symlink("loop.lock", path.join("loop.lock")).unwrap();
    std::fs::create_dir(path.join("dir.lock")).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dir = HolderLockDir::open(&path).unwrap();
        // A FIFO under the very name a holder's file would have.
        let named = dir.file("h");
        std::fs::rename(path.join("fifo.lock"), &named).unwrap();
        let (gone, _) = mpsc::unbounded_channel();
        let watched = Watch::start(&named, "slot/1", "h", gone).map(|w| w.is_some());
        done.send(watched.unwrap()).unwrap();
    });
    let watched = finished
        .recv_timeout(Duration::from_secs(10))
        .expect("passed over at once, not waited on");
    assert!(!watched, "no lock is known from what is not a lock file");
    for name in ["loop.lock", "dir.lock"] {
        assert!(
            std::fs::symlink_metadata(tmp.path().join("holders").join(name)).is_ok(),
            "{name} left"
        );
    }
}
