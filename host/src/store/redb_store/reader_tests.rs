//! Tests of the [`Reader`]: paused at every lock it takes and every read it makes, it delays
//! no writer's commit; at full speed beside a writer, it sees one committed state. (Beside
//! `reader.rs`, not in it: they drive a [`RedbStore`] writer, which uses the reader.)

use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb::{BackendError, ReadableTable as _, ReadableTableMetadata as _, StorageBackend};

use super::RedbStore;
use super::reader::{NoWait, Reader};
use super::schema::{KV, LEASES};
use crate::clock::{Clock, ManualClock};
use crate::store::kv::{KvOp, KvQuota, KvWrite};
use crate::store::{Fence, FencedKv as _, TtlStore as _};

const TTL: Duration = Duration::from_hours(1);
/// How long the writer waits for a lock of another process: a reader that held one for
/// longer would fail its commit.
const WRITER_PATIENCE: Duration = Duration::from_millis(100);

type Range = (Bound<u64>, Bound<u64>);

/// Where redb's per-transaction lock bytes begin (`TXN_BASE` in its `db.rs`).
const TRANSACTION_BYTES: u64 = (1 << 62) + 1024;

/// A reader's backend that calls `hook` at every moment a process could be stopped while it
/// holds something: right after each lock redb asked for is (or is said to be) taken, and
/// before each read of the file. The first `refusals` locks redb asks for (other than the
/// header lock, which a reader never takes) are held by another process for a moment.
struct Watched {
    inner: NoWait,
    hook: Arc<dyn Fn(&'static str, Range) + Send + Sync>,
    /// Shared by every backend the reader opens (one per try).
    refusals: Arc<AtomicU32>,
}

impl Watched {
    /// `inner`, calling `hook`, with no lock refused.
    fn new(inner: NoWait, hook: &Arc<dyn Fn(&'static str, Range) + Send + Sync>) -> Self {
        Self {
            inner,
            hook: Arc::clone(hook),
            refusals: Arc::default(),
        }
    }

    /// Whether the lock of `start..end` is refused, held by another process.
    fn refused(&self, start: Bound<u64>, end: Bound<u64>) -> bool {
        !NoWait::is_header(start, end)
            && self
                .refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
    }
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Watched").field(&self.inner).finish()
    }
}

impl StorageBackend for Watched {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        (self.hook)("read", (Bound::Included(offset), Bound::Unbounded));
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write(offset, data)
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        let taken = !self.refused(start, end) && self.inner.try_lock_range(start, end)?;
        if taken {
            (self.hook)("try_lock_range", (start, end));
        }
        Ok(taken)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        let taken = !self.refused(start, end) && self.inner.try_lock_shared_range(start, end)?;
        if taken {
            (self.hook)("try_lock_shared_range", (start, end));
        }
        Ok(taken)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        if self.refused(start, end) {
            return Err(NoWait::held());
        }
        self.inner.lock_range(start, end)?;
        (self.hook)("lock_range", (start, end));
        Ok(())
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        if self.refused(start, end) {
            return Err(NoWait::held());
        }
        self.inner.lock_shared_range(start, end)?;
        (self.hook)("lock_shared_range", (start, end));
        Ok(())
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }

    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
}

/// A host's store on `path` that waits at most [`WRITER_PATIENCE`] for a lock of another
/// process, holding record "1" as "a".
async fn impatient_writer(path: &Path) -> RedbStore {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let store = RedbStore::open_inner(path, clock, WRITER_PATIENCE, false)
        .await
        .unwrap();
    store
        .insert_if_absent("1", "a", TTL)
        .await
        .unwrap()
        .unwrap();
    store
}

/// [`impatient_writer`] on a runtime of its own, for a test whose reader runs on threads
/// of its own.
fn writer_on_a_runtime(path: &Path) -> (tokio::runtime::Runtime, RedbStore) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let writer = rt.block_on(impatient_writer(path));
    (rt, writer)
}

/// One renewal and one fenced guest write: both must commit while the reader is wherever
/// it is.
async fn commit_both(writer: &RedbStore, term: u64, n: usize) -> Result<(), String> {
    let renewed = writer.compare_and_swap("1", "a", "a", TTL).await;
    if !matches!(renewed, Ok(true)) {
        return Err(format!("renewal: {renewed:?}"));
    }
    let value = n.to_string();
    let writes = [KvWrite::Set {
        key: "n",
        value: value.as_bytes(),
    }];
    let fence = Fence {
        writer: "svc",
        lease_key: "1",
        term,
    };
    let written = writer
        .kv_apply(&fence, "svc", &KvOp::Batch(&writes), &KvQuota::UNLIMITED)
        .await;
    match written {
        Ok(Ok(_)) => Ok(()),
        other => Err(format!("guest write: {other:?}")),
    }
}

/// Issue 39: a reader stopped at any moment of its run (at each lock it takes, before each
/// page it reads, from its open to the end of its transaction) delays no commit: at each
/// such moment a host renews and a guest writes, each waiting at most 100 ms for a lock
/// of another process, and each commits; the reader then reads what was committed before
/// its transaction began. With the header lock taken as redb takes it, the first commit
/// made inside `begin_read` fails after those 100 ms.
#[test]
fn a_reader_paused_anywhere_in_its_read_delays_no_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (rt, writer) = writer_on_a_runtime(&path);
    let term = rt.block_on(writer.get("1")).unwrap().unwrap().term;
    let stops = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let seen = Mutex::new(std::collections::HashSet::new());
    let hook = {
        let (stops, failures) = (Arc::clone(&stops), Arc::clone(&failures));
        let rt = Arc::new(rt);
        move |call: &'static str, range: Range| {
            // Once at each kind of moment: a commit there makes the reader begin again (it
            // is not the snapshot it registered), and the next try passes the same kinds
            // of moment again, on the next transaction's byte and the new commit's pages.
            let kind = match range.0 {
                Bound::Included(at) if call == "read" && at > 0 => Bound::Unbounded,
                Bound::Included(at) if at >= TRANSACTION_BYTES => Bound::Unbounded,
                _ => range.0,
            };
            if !seen.lock().unwrap().insert((call, kind)) {
                return;
            }
            let n = stops.fetch_add(1, Ordering::SeqCst);
            if let Err(e) = rt.block_on(commit_both(&writer, term, n)) {
                failures
                    .lock()
                    .unwrap()
                    .push(format!("{call} {range:?}: {e}"));
            }
        }
    };
    let hook: Arc<dyn Fn(&'static str, Range) + Send + Sync> = Arc::new(hook);
    let reader = Reader::open_with(&path, |inner| Watched::new(inner, &hook)).unwrap();
    let txn = reader.begin_read().unwrap();
    let leases = txn.open_table(LEASES).unwrap();
    assert_eq!(leases.len().unwrap(), 1);
    for row in leases.iter().unwrap() {
        row.unwrap();
    }
    drop((leases, txn, reader));
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "commits that waited for the reader:\n{}",
        failures.join("\n")
    );
    assert!(
        stops.load(Ordering::SeqCst) >= 5,
        "the reader was paused at its locks and reads"
    );
}

/// What [`HEADER_BYTES`] stands on: the one range at the file's start that redb locks on a
/// reader's behalf is exactly the header, `0..HEADER_BYTES`. (A redb with a larger
/// header would fail here before a reader could lock half of it.)
#[test]
fn redbs_header_lock_is_the_range_a_reader_passes_by() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (_rt, _writer) = writer_on_a_runtime(&path);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let record = {
        let asked = Arc::clone(&asked);
        move |call: &'static str, range: Range| {
            if call != "read" && range.0 == Bound::Included(0) {
                asked.lock().unwrap().push(range);
            }
        }
    };
    let hook: Arc<dyn Fn(&'static str, Range) + Send + Sync> = Arc::new(record);
    let reader = Reader::open_with(&path, |inner| Watched::new(inner, &hook)).unwrap();
    drop(reader.begin_read().unwrap());
    let asked = asked.lock().unwrap();
    assert!(!asked.is_empty(), "redb locked the header");
    for (start, end) in asked.iter() {
        assert!(NoWait::is_header(*start, *end), "{start:?}..{end:?}");
    }
}

/// A read-only store (`vvm-host status`, `kv`) paused inside its read transaction, as by
/// SIGSTOP, delays no renewal and no guest write of a host on the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_paused_inside_a_read_delays_no_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let writer = impatient_writer(&path).await;
    let term = writer.get("1").await.unwrap().unwrap().term;
    let reader = RedbStore::open_read_only(&path).await.unwrap();
    let (inside, wait_inside) = std::sync::mpsc::channel::<()>();
    let (go_on, paused) = std::sync::mpsc::channel::<()>();
    let read = tokio::spawn({
        let reader = reader.clone();
        async move {
            reader
                .read("paused read", move |txn, _| {
                    inside.send(()).unwrap();
                    paused.recv().unwrap();
                    Ok(txn.open_table(LEASES)?.len()?)
                })
                .await
        }
    });
    tokio::task::spawn_blocking(move || wait_inside.recv().unwrap())
        .await
        .unwrap();
    for n in 0..20 {
        commit_both(&writer, term, n).await.unwrap();
    }
    go_on.send(()).unwrap();
    assert_eq!(read.await.unwrap().unwrap(), 1);
}

/// What `status` and `kv` read while a host commits at full speed is one committed state:
/// every write sets `a` and `b` to its number and adds the key `k/<number>`, so a read
/// that mixed two commits would see `a` and `b` differ, or keys and usage disagree. The
/// reader reads on until the writer has committed [`COMMITS`] times, however slow either is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_one_committed_state_while_a_writer_commits_at_full_speed() {
    const COMMITS: u64 = 50;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let writer = impatient_writer(&path).await;
    let term = writer.get("1").await.unwrap().unwrap().term;
    let fence = Fence {
        writer: "svc",
        lease_key: "1",
        term,
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let committed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writing = tokio::spawn({
        let (stop, committed) = (Arc::clone(&stop), Arc::clone(&committed));
        async move {
            let mut n = 0_u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let (value, key) = (n.to_string(), format!("k/{n:08}"));
                let writes = [
                    KvWrite::Set {
                        key: "a",
                        value: value.as_bytes(),
                    },
                    KvWrite::Set {
                        key: "b",
                        value: value.as_bytes(),
                    },
                    KvWrite::Set {
                        key: &key,
                        value: b"",
                    },
                ];
                let op = KvOp::Batch(&writes);
                let done = writer
                    .kv_apply(&fence, "svc", &op, &KvQuota::UNLIMITED)
                    .await;
                assert!(matches!(done, Ok(Ok(_))), "{done:?}");
                assert!(writer.compare_and_swap("1", "a", "a", TTL).await.unwrap());
                committed.store(n, Ordering::SeqCst);
            }
        }
    });
    // The writer's clock: a record it wrote is live to the reader.
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::default());
    let reader = RedbStore::open_inner(&path, clock, WRITER_PATIENCE, true)
        .await
        .unwrap();
    let (mut last, mut rounds) = (0, 0);
    // A writer that failed has finished: its panic is reported below.
    while rounds < 300 || committed.load(Ordering::SeqCst) < COMMITS && !writing.is_finished() {
        rounds += 1;
        let both = reader.kv_get_many("svc", &["a", "b"]).await.unwrap();
        assert_eq!(both[0], both[1], "a and b from one commit");
        let view = reader.kv_view("svc", "k/").await.unwrap();
        assert_eq!(
            u64::try_from(view.keys.len()).unwrap() + 2,
            view.usage.keys.max(2),
            "the keys listed and the usage from one commit"
        );
        let n = u64::try_from(view.keys.len()).unwrap();
        assert!(n >= last, "commits only add keys");
        last = n;
        let records = reader.list("").await.unwrap();
        assert_eq!(records.len(), 1);
    }
    stop.store(true, Ordering::SeqCst);
    writing.await.unwrap();
}

/// A commit landing between the header redb read and the registration of its snapshot
/// (where the header lock kept commits out) makes the reader begin again: it reads the
/// newer commit, never the snapshot whose pages the next writer may already reuse.
#[test]
fn a_commit_under_the_registration_makes_the_reader_begin_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let (rt, writer) = writer_on_a_runtime(&path);
    let term = rt.block_on(writer.get("1")).unwrap().unwrap().term;
    rt.block_on(commit_both(&writer, term, 0)).unwrap();
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let commits = Arc::new(AtomicUsize::new(0));
    let hook = {
        let (reading, commits) = (Arc::clone(&reading), Arc::clone(&commits));
        move |call: &'static str, range: Range| {
            let registering = matches!(range.0, Bound::Included(at) if at >= TRANSACTION_BYTES);
            if reading.load(Ordering::SeqCst)
                && call == "try_lock_shared_range"
                && registering
                && commits.load(Ordering::SeqCst) == 0
            {
                // Two commits: the second may reuse the pages the first freed.
                for n in 1..=2 {
                    rt.block_on(commit_both(&writer, term, n)).unwrap();
                    commits.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    };
    let hook: Arc<dyn Fn(&'static str, Range) + Send + Sync> = Arc::new(hook);
    let reader = Reader::open_with(&path, |inner| Watched::new(inner, &hook)).unwrap();
    reading.store(true, Ordering::SeqCst);
    let txn = reader.begin_read().unwrap();
    assert_eq!(
        commits.load(Ordering::SeqCst),
        2,
        "the commits landed under it"
    );
    let kv = txn.open_table(KV).unwrap();
    let n = kv.get(("svc", "n")).unwrap().map(|v| v.value().to_vec());
    assert_eq!(n.as_deref(), Some(&b"2"[..]), "the newest commit is read");
}

/// A lock another process holds for a moment (a writer in its commit, slowed by the disk)
/// makes a reader try again, as a commit landing under it does, rather than fail: `status`
/// under a leader writing at full speed on a loaded machine failed so (a CI run's
/// `stopped_readers_never_cost_the_leader_its_lease`, wave 4).
#[test]
fn a_lock_held_for_a_moment_makes_a_reader_try_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vvm.redb");
    let (_rt, _writer) = writer_on_a_runtime(&path);
    let refusals = Arc::new(AtomicU32::new(3));
    let hook: Arc<dyn Fn(&'static str, Range) + Send + Sync> = Arc::new(|_, _| {});
    let reader = Reader::open_with(&path, |inner| Watched {
        refusals: Arc::clone(&refusals),
        ..Watched::new(inner, &hook)
    })
    .unwrap();
    assert_eq!(
        refusals.load(Ordering::SeqCst),
        0,
        "the locks were asked for"
    );
    refusals.store(3, Ordering::SeqCst);
    let txn = reader.begin_read().unwrap();
    assert_eq!(txn.open_table(LEASES).unwrap().len().unwrap(), 1);
}
