//! The conformance suite on a real redb file, and the bad-input and busy cases of this backend.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::schema::SCHEMA_KEY;
use super::*;
use crate::clock::ManualClock;
use crate::store::Fence;
use crate::store::conformance::{self, Backend, SetOne};
use redb::{Builder, ConcurrencyMode, TableDefinition};

const TTL: Duration = Duration::from_secs(10);

/// A redb file in a fresh directory; every `open` opens that same file again.
struct Redb {
    dir: TempDir,
}

impl Redb {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
}

impl Backend for Redb {
    type Store = RedbStore;
    const PERSISTENT: bool = true;
    async fn open(&mut self, clock: &ManualClock) -> RedbStore {
        RedbStore::open_with_clock(self.dir.path().join("store.redb"), Arc::new(clock.clone()))
            .await
            .unwrap()
    }
}

conformance::suite!(Redb::new());

async fn open_err(path: &Path) -> StoreError {
    match RedbStore::open_with_clock(path, Arc::new(ManualClock::default())).await {
        Ok(_) => panic!("opening {} succeeded", path.display()),
        Err(e) => e,
    }
}

/// Asserts a permanent error whose text names `path` and contains `cause`.
fn assert_permanent(e: &StoreError, path: &Path, cause: &str) {
    let text = e.to_string();
    assert!(!e.is_transient(), "should be permanent: {text}");
    assert!(
        text.contains(&path.display().to_string()),
        "names the path: {text}"
    );
    assert!(text.contains(cause), "names the cause {cause:?}: {text}");
}

#[tokio::test]
async fn store_in_missing_directory_is_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("store.redb");
    assert_permanent(&open_err(&path).await, &path, "No such file or directory");
}

#[test]
fn store_in_read_only_directory_is_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o555)).unwrap();
    let path = dir.path().join("store.redb");
    // Root ignores permission bits through CAP_DAC_OVERRIDE: drop it in a thread of our own
    // (capabilities are per thread, and the runtime's threads started there inherit them).
    let err = std::thread::spawn(move || {
        use rustix::thread::{CapabilitySet, capabilities, set_capabilities};
        let mut caps = capabilities(None).unwrap();
        caps.effective -= CapabilitySet::DAC_OVERRIDE | CapabilitySet::DAC_READ_SEARCH;
        set_capabilities(None, caps).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt.block_on(open_err(&path));
        (path, err)
    })
    .join()
    .unwrap();
    assert_permanent(&err.1, &err.0, "Permission denied");
}

#[tokio::test]
async fn file_that_is_not_a_redb_database_is_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(200)).unwrap();
    assert_permanent(&open_err(&path).await, &path, "Not a redb database");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        "these are my notes, not a database\n"
            .repeat(200)
            .as_bytes(),
        "the foreign file is left as it was"
    );
}

#[tokio::test]
async fn incompatible_schema_version_is_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    // A store as a future vvm-host with schema version 99 would leave it.
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(SCHEMA_KEY, 99)
            .unwrap();
        txn.commit().unwrap();
    }
    let e = open_err(&path).await;
    assert_permanent(&e, &path, "incompatible schema version 99");
}

#[tokio::test]
async fn redb_database_of_another_program_is_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.redb");
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        let users: TableDefinition<u64, &str> = TableDefinition::new("users");
        txn.open_table(users).unwrap().insert(1, "ann").unwrap();
        txn.commit().unwrap();
    }
    assert_permanent(&open_err(&path).await, &path, "not a vvm-host store");
}

#[tokio::test]
async fn changed_table_types_are_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        // Right version, but a `leases` table of another layout.
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(SCHEMA_KEY, SCHEMA_VERSION)
            .unwrap();
        let leases: TableDefinition<&str, u64> = TableDefinition::new("leases");
        txn.open_table(leases).unwrap().insert("1", 7).unwrap();
        txn.commit().unwrap();
    }
    assert_permanent(&open_err(&path).await, &path, "table layout differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_lock_held_by_another_writer_is_a_transient_busy_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = RedbStore::open_inner(&path, clock, Duration::from_millis(100), false)
        .await
        .unwrap();
    // A second handle on the file acts as another process stuck in a write transaction.
    let other = Builder::new()
        .set_concurrency_mode(ConcurrencyMode::MultiWriter)
        .open(&path)
        .unwrap();
    let stuck = other.begin_write().unwrap();
    let e = store.insert_if_absent("1", "a", TTL).await.unwrap_err();
    assert!(e.is_transient(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&path.display().to_string()) && text.contains("write lock"),
        "{text}"
    );
    assert!(
        store.get("1").await.unwrap().is_none(),
        "reads go on meanwhile"
    );
    stuck.abort().unwrap();
    assert!(
        store
            .insert_if_absent("1", "a", TTL)
            .await
            .unwrap()
            .is_some()
    );
}

/// Two handles of one fresh store file on `clock`, as two processes have them; the directory
/// lives as long as the returned guard.
async fn two_handles(clock: Arc<dyn Clock>) -> (TempDir, RedbStore, RedbStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let a = RedbStore::open_with_clock(&path, Arc::clone(&clock))
        .await
        .unwrap();
    let b = RedbStore::open_with_clock(&path, clock).await.unwrap();
    (dir, a, b)
}

/// Another open file description of the store at `path` holding the first byte of its header,
/// as a process stopped in the middle of a commit does, until it lets go.
struct StoppedPeer(redb::backends::FileBackend);

impl StoppedPeer {
    const HEADER: (std::ops::Bound<u64>, std::ops::Bound<u64>) =
        (std::ops::Bound::Included(0), std::ops::Bound::Excluded(1));

    fn holding_the_header(path: &Path) -> Self {
        use redb::StorageBackend;
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let peer = redb::backends::FileBackend::new(file).unwrap();
        peer.lock_range(Self::HEADER.0, Self::HEADER.1).unwrap();
        Self(peer)
    }

    fn let_go(self) {
        use redb::StorageBackend;
        self.0.unlock_range(Self::HEADER.0, Self::HEADER.1).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_share_records_and_a_release_wakes_the_other_handle() {
    let (_dir, a, b) = two_handles(Arc::new(ManualClock::default())).await;
    let term = a.insert_if_absent("1", "a", TTL).await.unwrap().unwrap();
    assert_eq!(b.get("1").await.unwrap().unwrap().term, term);
    assert_eq!(b.insert_if_absent("1", "b", TTL).await.unwrap(), None);

    // `b` has its own Notify: only the file watch can wake it.
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        b.wait_released(Duration::from_mins(1)).await;
        (started.elapsed(), b)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Other writes to the file do not end the wait.
    assert!(a.compare_and_swap("1", "a", "a", TTL).await.unwrap());
    let fence = Fence {
        writer: "svc",
        lease_key: "1",
        term,
    };
    assert!(a.kv_set(&fence, "svc", "k", b"v").await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "woke on a renewal or a kv write");
    assert!(a.compare_and_delete("1", "a").await.unwrap());
    let (waited, b) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the release in another handle woke the waiter")
        .unwrap();
    assert!(waited < Duration::from_secs(10));
    // One ring, one wake: the ring is a single write to the bell, not a truncation and a write
    // (two events, the second a spurious wake-up of the next wait).
    let started = Instant::now();
    b.wait_released(Duration::from_millis(300)).await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "woke twice on one ring"
    );
    assert!(b.insert_if_absent("1", "b", TTL).await.unwrap().unwrap() > term);
}

/// The waiter's baseline is the release count this handle saw last, not a read at the start of
/// the wait: a release by another process that landed after that count was read (here: before
/// the wait began) is never taken as the baseline, so it cannot be missed; the wait ends at
/// the next ring of the release bell, whatever rang it. Reading the count when the wait starts
/// would have taken the release in and waited on through the ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_last_look_ends_the_wait_at_the_next_ring() {
    let (dir, a, b) = two_handles(Arc::new(ManualClock::default())).await;
    a.insert_if_absent("1", "a", TTL).await.unwrap().unwrap();
    assert!(a.compare_and_delete("1", "a").await.unwrap());
    let waiter = tokio::spawn(async move { b.wait_released(Duration::from_mins(1)).await });
    // Whether the release's own ring reaches the waiter before or after its wait begins is
    // up to the scheduler: either ends the wait. A later ring surely does.
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(dir.path().join("store.redb.releases"), "rung by hand").unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the ring after the release ended the wait")
        .unwrap();
}

#[tokio::test]
async fn wait_released_returns_after_max_without_a_release() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open_with_clock(
        dir.path().join("store.redb"),
        Arc::new(ManualClock::default()),
    )
    .await
    .unwrap();
    store
        .insert_if_absent("1", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    store.wait_released(Duration::from_millis(200)).await;
    assert!(started.elapsed() >= Duration::from_millis(200));
}

/// A peer stopped (SIGSTOP) inside a commit keeps the file's header lock. redb's own file
/// backend would wait for it without bound, so every other process, the leader's renewals
/// included, would hang until the leader's killer fired. Each wait is bounded instead: the
/// operation fails as transient, and succeeds again once the peer lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_lock_held_by_a_stopped_peer_is_a_transient_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = impatient_holder(&path).await;
    let peer = StoppedPeer::holding_the_header(&path);

    let renewal = tokio::time::timeout(
        Duration::from_secs(20),
        store.compare_and_swap("1", "a", "a", TTL),
    )
    .await
    .expect("the renewal hangs on the stopped peer's lock");
    let e = renewal.unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("held a lock"), "{e}");

    peer.let_go();
    renews_again(&store).await;
}

/// A peer stopped in the middle of our commit (it took the header lock after our write began)
/// makes the commit fail, and redb discards the handle's allocator state: every later
/// transaction on that handle fails with "reopen the database to repair it". The store
/// reopens it, so operations go on once the peer lets go. (A CI run: a leader whose commit
/// a Ctrl-Z'd `vvm-host status` cut this way lost its lease, and could not campaign again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_by_a_stopped_peer_spends_the_handle_and_the_store_reopens_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = impatient_holder(&path).await;
    let peer = Arc::new(std::sync::Mutex::new(None));
    let (in_txn, file) = (Arc::clone(&peer), path.clone());
    let cut = store
        .write("cut", Lane::Lease, move |_, _| {
            // The peer stops inside the transaction: it holds the header the commit needs.
            *in_txn.lock().unwrap() = Some(StoppedPeer::holding_the_header(&file));
            Ok(((), Outcome::Commit))
        })
        .await;
    let e = cut.expect_err("a commit without the header lock");
    assert!(e.is_transient(), "{e}");
    peer.lock().unwrap().take().unwrap().let_go();
    renews_again(&store).await;
}

/// A store on `path` that waits 100 ms for another process's lock, holding record "1" as "a".
async fn impatient_holder(path: &Path) -> RedbStore {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = RedbStore::open_inner(path, clock, Duration::from_millis(100), false)
        .await
        .unwrap();
    store
        .insert_if_absent("1", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    store
}

/// Renews "1" until it succeeds, as the renewal loop would, a peer's lock being gone: a failed
/// commit may have spent the handle, which the store reopens on its own, so every failure on
/// the way is transient.
async fn renews_again(store: &RedbStore) {
    let mut last = None;
    for _ in 0..50 {
        match store.compare_and_swap("1", "a", "a", TTL).await {
            Ok(renewed) => {
                assert!(renewed, "the record is still ours");
                return;
            }
            Err(e) => {
                assert!(e.is_transient(), "a spent handle is no lasting fault: {e}");
                last = Some(e);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("renewals never went on after the peer let go: {last:?}");
}

/// A ring of the release bell ends a wait at once, even while a peer holds the file's header
/// lock (a process stopped in the middle of a commit): the wait does not read the release
/// counter first, and the bell's watch thread reads the records for [`TtlStore::handed`]
/// with a patience of its own of a few milliseconds. Here the store's patience is a minute and
/// the test waits ten seconds: a waiter that waits out the lock cannot end in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_ends_the_wait_at_once_even_while_a_peer_holds_the_header_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let a = RedbStore::open_with_clock(&path, Arc::clone(&clock))
        .await
        .unwrap();
    let b = RedbStore::open_inner(&path, clock, Duration::from_mins(1), false)
        .await
        .unwrap();
    a.insert_if_absent("1", "a", TTL).await.unwrap().unwrap();
    // `b` comes back: its close writes to the file, which must wait for the peer.
    let waiter = tokio::spawn(async move {
        b.wait_released(Duration::from_mins(5)).await;
        b
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "woke with no release");
    // A peer holds the header lock, as a process stopped inside a commit does, and the
    // bell rings (by hand: the test is about the waiter, not the release).
    let peer = StoppedPeer::holding_the_header(&path);
    a.inner.ring(1);
    let woke = tokio::time::timeout(Duration::from_secs(10), waiter).await;
    peer.let_go();
    woke.expect("the ring ended the wait")
        .unwrap()
        .close()
        .await;
}

/// A standby woken by a handover finds the record handed to it as the bell's watch thread read
/// it from the file right after the ring: its campaign needs no read of its own on the
/// takeover's path. Told once; a record that has expired since is not told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_woken_by_a_handover_is_told_its_record_as_read_at_the_ring() {
    let clock = ManualClock::default();
    let (_dir, a, b) = two_handles(Arc::new(clock.clone())).await;
    let t1 = a
        .insert_if_absent("slot/1", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    b.insert_if_absent("cand/b", "b", TTL)
        .await
        .unwrap()
        .unwrap();
    let waiter = tokio::spawn(async move {
        b.wait_released(Duration::from_mins(5)).await;
        b
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let handed = a
        .hand_over("slot/1", "a", &Candidates::any("cand/"), TTL)
        .await
        .unwrap();
    let HandOver::To { to, term } = handed else {
        panic!("not handed over: {handed:?}");
    };
    assert_eq!(to, "b");
    assert!(term > t1);
    let b = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the ring ended the wait")
        .unwrap();
    let told = b
        .handed("slot/1")
        .expect("told the record read at the ring");
    assert_eq!((told.value.as_str(), told.term), ("b", term));
    assert_eq!(told.time_left, TTL, "the clock has not moved");
    assert!(b.handed("slot/1").is_none(), "told once");
    let read = b.get("slot/1").await.unwrap().unwrap();
    assert_eq!((read.value, read.term), (told.value, told.term));

    // Handed on to c, then the record expires before anyone asks: not told.
    a.insert_if_absent("cand/c", "c", TTL)
        .await
        .unwrap()
        .unwrap();
    let woken = tokio::spawn({
        let a = a.clone();
        async move { a.wait_released(Duration::from_mins(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let candidates = Candidates::any("cand/");
    let handed = b.hand_over("slot/1", "b", &candidates, TTL).await.unwrap();
    assert!(matches!(handed, HandOver::To { .. }), "{handed:?}");
    tokio::time::timeout(Duration::from_secs(10), woken)
        .await
        .expect("the ring ended the wait")
        .unwrap();
    clock.advance(TTL);
    assert!(a.handed("slot/1").is_none(), "expired since the ring");
}

/// `vvm-host status` opens the file read-only: no write lock (a writer holding it, or
/// stopped while holding it, does not delay it), no write, and writes through it fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_handle_takes_no_write_lock_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = RedbStore::open_with_clock(&path, Arc::clone(&clock))
        .await
        .unwrap();
    let term = store
        .insert_if_absent("1", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    // Another process in a write transaction (or stopped inside one) holds the write lock.
    let other = Builder::new()
        .set_concurrency_mode(ConcurrencyMode::MultiWriter)
        .open(&path)
        .unwrap();
    let stuck = other.begin_write().unwrap();
    // A handle that wanted the write lock would fail as busy here.
    let reader = RedbStore::open_inner(&path, clock, Duration::from_millis(100), true)
        .await
        .unwrap();
    let record = reader.get("1").await.unwrap().unwrap();
    assert_eq!((record.value.as_str(), record.term), ("a", term));
    let e = reader.insert_if_absent("2", "b", TTL).await.unwrap_err();
    assert!(
        !e.is_transient() && e.to_string().contains("read-only"),
        "{e}"
    );
    stuck.abort().unwrap();
    let missing = RedbStore::open_read_only(dir.path().join("absent.redb")).await;
    let e = missing.err().unwrap();
    assert!(e.to_string().contains("absent.redb"), "{e}");
}

/// A write whose caller gave up still runs to its end on the blocking pool: `settle` waits
/// for it, so that cleanup's delete cannot come before a late commit and leave the record
/// behind until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Holding the writer queue across awaits is the point: it is the stuck commit.
#[allow(clippy::await_holding_lock)]
async fn settle_waits_for_a_write_whose_caller_gave_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = RedbStore::open_with_clock(&path, clock).await.unwrap();
    // Hold this process's writer queue, so the insert is stuck before its commit.
    let queue = store.inner.writer.lock().unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(20),
        store.insert_if_absent("1", "a", TTL),
    )
    .await;
    assert!(gave_up.is_err(), "the insert could not have finished");
    let settled = tokio::spawn({
        let store = store.clone();
        async move { store.settle(Duration::from_secs(30)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !settled.is_finished(),
        "settled while the insert was still running"
    );
    drop(queue);
    settled.await.unwrap();
    // The late commit has landed: a delete now removes it for good.
    assert_eq!(store.get("1").await.unwrap().unwrap().value, "a");
    assert!(store.compare_and_delete("1", "a").await.unwrap());
    assert!(store.get("1").await.unwrap().is_none());
}

/// The reopen after an I/O error runs on the blocking pool and holds the store while it
/// opens the file: `close` waits for it, so that no task holds the database once `close`
/// has returned (SPEC §5: no file handle outlives shutdown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_a_reopen_under_way() {
    use std::ops::Bound;

    use redb::StorageBackend;
    use redb::backends::FileBackend;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = RedbStore::open_inner(&path, clock, Duration::from_millis(300), false)
        .await
        .unwrap();
    // A peer stopped mid-commit holds the header: the reopen waits for it (its patience).
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let peer = FileBackend::new(file).unwrap();
    peer.lock_range(Bound::Included(0), Bound::Excluded(1))
        .unwrap();
    store.reopen(&Fault::Aborted("test".into()));
    let inner = Arc::downgrade(&store.inner);
    store.close().await;
    assert!(
        inner.upgrade().is_none(),
        "a reopen still holds the store after close"
    );
}

/// A candidacy left to expire (its standby was killed, or the machine rebooted) is removed
/// with its term by the next handover, whose scan it would otherwise lengthen for ever: the
/// scan is inside the handover's write, on the takeover's path. The terms of withdrawn and
/// handed candidacies go too: nothing fences with them, and each campaign has its own key.
#[tokio::test]
async fn a_handover_removes_the_spent_candidacies() {
    let clock = ManualClock::default();
    let mut redb = Redb::new();
    let s = redb.open(&clock).await;
    for dead in ["cand/a", "cand/c"] {
        s.insert_if_absent(dead, dead, TTL).await.unwrap().unwrap();
    }
    s.insert_if_absent("cand/w", "w", TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(s.compare_and_delete("cand/w", "w").await.unwrap());
    clock.advance(TTL);
    s.insert_if_absent("cand/b", "b", TTL)
        .await
        .unwrap()
        .unwrap();
    s.insert_if_absent("other/x", "x", Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    s.insert_if_absent("slot/1", "l", TTL)
        .await
        .unwrap()
        .unwrap();
    clock.advance(Duration::from_secs(2));
    let handed = s
        .hand_over("slot/1", "l", &Candidates::any("cand/"), TTL)
        .await
        .unwrap();
    assert!(
        matches!(&handed, HandOver::To { to, .. } if to == "b"),
        "{handed:?}"
    );
    let rows = s
        .read("rows", |txn, _| {
            fn keys<V: redb::Value + 'static>(
                table: &redb::ReadOnlyTable<&'static str, V>,
            ) -> Result<Vec<String>, Fault> {
                table
                    .iter()?
                    .map(|row| Ok(row?.0.value().to_owned()))
                    .collect()
            }
            Ok((
                keys(&txn.open_table(LEASES)?)?,
                keys(&txn.open_table(TERMS)?)?,
            ))
        })
        .await
        .unwrap();
    // Only the candidates' expired rows go: an expired record elsewhere is not the
    // handover's business, and other keys' terms stay.
    assert_eq!(rows.0, ["other/x", "slot/1"]);
    assert_eq!(rows.1, ["other/x", "slot/1"]);
}

/// Opens the FIFO at its path for reading once, when dropped: a writer waiting to open it
/// goes on.
struct FifoReader(PathBuf);

impl Drop for FifoReader {
    fn drop(&mut self) {
        let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK;
        let _ = rustix::fs::open(&self.0, flags, rustix::fs::Mode::empty());
    }
}

/// A FIFO in the release bell's place (nobody reading it) is not waited on: the release
/// completes, and the next write too; waiters then see releases at their next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_the_bells_place_does_not_hold_a_release_up() {
    let clock = ManualClock::default();
    let mut redb = Redb::new();
    let s = redb.open(&clock).await;
    let bell = bell_path(&redb.dir.path().join("store.redb"));
    std::fs::remove_file(&bell).ok();
    testkit::fifo(&bell);
    // Should the test fail, a reader lets a write stuck on the FIFO go, so it ends.
    let _reader = FifoReader(bell);
    s.insert_if_absent("k", "a", TTL).await.unwrap().unwrap();
    let released = tokio::time::timeout(Duration::from_secs(10), s.compare_and_delete("k", "a"))
        .await
        .expect("the release is not held up by the bell");
    assert!(released.unwrap());
    let again = tokio::time::timeout(Duration::from_secs(10), s.insert_if_absent("k", "b", TTL))
        .await
        .expect("nor the next write");
    assert!(again.unwrap().is_some());
}

/// A store in a fresh directory (the directory, the file) holding `slot/1` for `me`, as a
/// leader's.
async fn leading() -> (TempDir, PathBuf, RedbStore) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = RedbStore::open_with_clock(&path, Arc::new(ManualClock::default()))
        .await
        .unwrap();
    store
        .insert_if_absent("slot/1", "me", TTL)
        .await
        .unwrap()
        .unwrap();
    (dir, path, store)
}

/// Issue 28: a store file overwritten under a running host (a restore, a bad deploy script)
/// is noticed at the host's next write when the header shows it.
#[tokio::test]
async fn an_overwritten_file_fails_the_next_write_for_good() {
    let (_dir, path, store) = leading().await;
    assert!(
        store
            .compare_and_swap("slot/1", "me", "me", TTL)
            .await
            .unwrap()
    );
    let len = usize::try_from(std::fs::metadata(&path).unwrap().len()).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &vec![0x5a; len]))
        .unwrap();
    for _ in 0..3 {
        let e = store
            .compare_and_swap("slot/1", "me", "me", TTL)
            .await
            .expect_err("a write to an overwritten file");
        assert!(!e.is_transient(), "{e}");
    }
}

/// Writes `garbage` over every byte of `path` but its first `keep` bytes, which are put back
/// as they were: what the file looks like when one of the host's own commits rewrote the
/// header while the overwrite went on (redb writes it from memory).
fn overwrite_all_but(path: &Path, keep: usize) {
    let bytes = std::fs::read(path).unwrap();
    let mut garbage = vec![0x5a; bytes.len()];
    garbage[..keep].copy_from_slice(&bytes[..keep]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &garbage))
        .unwrap();
}

/// Waits (10 s at most) until a renewal of `store` fails, and returns its error.
async fn first_failing_renewal(store: &RedbStore) -> StoreError {
    let since = Instant::now();
    loop {
        match store.compare_and_swap("slot/1", "me", "me", TTL).await {
            Err(e) => return e,
            Ok(renewed) => assert!(renewed),
        }
        assert!(since.elapsed() < Duration::from_secs(10), "never noticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 28: an overwrite whose header the host's own commit put back (3 runs in 5 of the e2e
/// test) is noticed anyway: redb alone goes on renewing from its cache, for good; the store
/// reads the file afresh and stops, permanently, naming the cause. A fresh reader cannot
/// read what the host serves from either.
#[tokio::test]
async fn an_overwrite_hidden_by_a_rewritten_header_is_noticed() {
    let (_dir, path, store) = leading().await;
    overwrite_all_but(&path, 4096);
    let e = first_failing_renewal(&store).await;
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("DB corrupted"), "{e}");
    assert!(
        store.get("slot/1").await.is_err(),
        "no read either, from then on"
    );
    let fresh = RedbStore::open_read_only(&path).await.map(|_| ());
    let read = match RedbStore::open_read_only(&path).await {
        Ok(reader) => reader.get("slot/1").await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(
        fresh.is_err() || read.is_err(),
        "a fresh reader reads garbage as records"
    );
}

/// Issue 28: a file renamed over the store's path (another file now) is noticed: the host
/// stops serving from the file it opened, which nobody else reads any more.
#[tokio::test]
async fn a_file_replaced_under_the_store_is_noticed() {
    let (dir, path, store) = leading().await;
    let other = dir.path().join("other.redb");
    drop(
        RedbStore::open_with_clock(&other, Arc::new(ManualClock::default()))
            .await
            .unwrap(),
    );
    std::fs::rename(&other, &path).unwrap();
    let e = first_failing_renewal(&store).await;
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("another file"), "{e}");
}

/// A namespace written before usage was kept (its keys in the `kv` table, no usage record):
/// its usage is counted from its keys, and the first fenced write records it.
#[tokio::test]
async fn usage_of_data_written_before_usage_was_kept_is_counted() {
    use super::schema::{KV, KV_USAGE};
    use crate::store::{FencedKv, KvOp, KvQuota, KvRefusal, KvUsage, KvWrite};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let store = RedbStore::open_with_clock(&path, Arc::new(ManualClock::default()))
        .await
        .unwrap();
    // Another handle on the file, as a host of an earlier version.
    let raw = Builder::new()
        .set_concurrency_mode(ConcurrencyMode::MultiWriter)
        .open(&path)
        .unwrap();
    let txn = raw.begin_write().unwrap();
    {
        let mut kv = txn.open_table(KV).unwrap();
        kv.insert(("svc", "a"), &b"123"[..]).unwrap();
        kv.insert(("svc", "bb"), &b""[..]).unwrap();
        kv.insert(("svc2", "z"), &b"zz"[..]).unwrap();
    }
    txn.commit().unwrap();
    let recorded = |raw: &redb::Database| {
        let txn = raw.begin_read().unwrap();
        let usages = txn.open_table(KV_USAGE).unwrap();
        usages.get("svc").unwrap().map(|u| u.value())
    };
    assert_eq!(recorded(&raw), None);
    assert_eq!(
        store.kv_usage("svc").await.unwrap(),
        KvUsage { keys: 2, bytes: 6 }
    );
    let term = store
        .insert_if_absent("k", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    let fence = Fence {
        writer: "svc",
        lease_key: "k",
        term,
    };
    let quota = KvQuota {
        max_keys: 3,
        max_bytes: u64::MAX,
    };
    let set = |key| {
        let store = &store;
        async move {
            let writes = [KvWrite::Set { key, value: b"1" }];
            store
                .kv_apply(&fence, "svc", &KvOp::Batch(&writes), &quota)
                .await
                .unwrap()
        }
    };
    assert!(set("c").await.is_ok());
    assert_eq!(recorded(&raw), Some((3, 8)));
    assert_eq!(set("d").await, Err(KvRefusal::TooManyKeys { limit: 3 }));
    assert_eq!(
        store.kv_usage("svc2").await.unwrap(),
        KvUsage { keys: 1, bytes: 3 }
    );
}
