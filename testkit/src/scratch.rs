//! Where the end-to-end tests keep their files: the hosts' stores, services and caches, and
//! the etcd members' data.
//!
//! # Why not the default temp dir
//!
//! The tests run side by side on one disk, and some of them write a lot and sync it: a soak's
//! commits, three etcd members' logs, a build. While they do, an `fsync` of anything else on
//! that disk can wait for most of a second: 0.7 s was measured on a 2-core machine of CI's
//! kind, a 4 KiB write and `fsync` every 20 ms in `/tmp` beside the suite, and a renewal of a
//! test host with a 1 s lease failed in the same second. A store commit ends with an `fsync`,
//! and the host gives its lease up when three renewals in a row go unanswered for L/10 each
//! (SPEC §4), as it must. So a test of something else (a stopped peer, a crash-looping
//! neighbour, a replaced service) would lose its lease now and then, measuring the disk
//! instead of the host.
//!
//! So they are made on a tmpfs (`/dev/shm`), where an `fsync` waits for no disk and the
//! kernel's file locks, `inotify` and renames behave as on any local file system. The store's
//! own tests keep the default temp dir: they are about what redb does on a disk, not about
//! time. `VVM_TEST_SCRATCH=DIR` chooses another place; without a tmpfs with room, the default
//! temp dir is used and a line on stderr says so.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The tmpfs that Linux mounts for POSIX shared memory.
const SHM: &str = "/dev/shm";
/// The least free space that makes a tmpfs the place: the suite's files take about 400 MiB at
/// their most, measured with `du` during a run.
const ROOM: u64 = 2 << 30;
/// `TMPFS_MAGIC` of `statfs(2)`.
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// A fresh directory for one test's files, removed with everything in it when dropped.
pub fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("vvm-test-")
        .tempdir_in(root())
        .expect("a scratch dir for the test")
}

/// Where [`scratch_dir`] makes its directories; chosen once per test process.
fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        if let Some(dir) = std::env::var_os("VVM_TEST_SCRATCH") {
            return PathBuf::from(dir);
        }
        if is_tmpfs_with_room(Path::new(SHM)) {
            return PathBuf::from(SHM);
        }
        let fallback = std::env::temp_dir();
        // Straight to stderr, past the harness's capture: the reason for a flaky run is here.
        let _ = writeln!(
            std::io::stderr(),
            "testkit: {SHM} is not a tmpfs with {} GiB free; test files go to {}, where a busy \
             disk can cost a short test lease",
            ROOM >> 30,
            fallback.display()
        );
        fallback
    })
}

/// Whether `dir` is on a tmpfs with at least [`ROOM`] free.
fn is_tmpfs_with_room(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|fs| {
        // The field types differ between targets (signed on some).
        #[allow(clippy::useless_conversion, clippy::unnecessary_fallible_conversions)]
        let (kind, free) = (
            u64::try_from(fs.f_type).unwrap_or(0),
            u64::try_from(fs.f_bavail)
                .unwrap_or(0)
                .saturating_mul(u64::try_from(fs.f_bsize).unwrap_or(0)),
        );
        kind == TMPFS_MAGIC && free >= ROOM
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine with a roomy `/dev/shm`, as the CI machines have, the tests' files are on
    /// it; a directory on a disk is never taken for one.
    #[test]
    fn scratch_dirs_are_on_a_tmpfs_when_the_machine_has_one_with_room() {
        assert!(!is_tmpfs_with_room(Path::new(env!("CARGO_MANIFEST_DIR"))));
        if std::env::var_os("VVM_TEST_SCRATCH").is_some() || !is_tmpfs_with_room(Path::new(SHM)) {
            return;
        }
        let dir = scratch_dir();
        assert!(dir.path().starts_with(SHM), "{}", dir.path().display());
        assert!(is_tmpfs_with_room(dir.path()));
    }
}
