//! Tests of the group commit (`store::group`): each batch takes the writers in turn up to
//! the capacity, shares one commit with each write its own answer, acknowledges nothing of a
//! failed commit, and lands a write whose caller gave up.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::clock::ManualClock;
use crate::store::faulty::{Fault, FaultyStore, Op};
use crate::store::kv::{KvDone, OwnedOp};
use crate::store::{KvQuota, KvRefusal, MemStore};

const TTL: Duration = Duration::from_mins(1);

/// A store behind faults, with the lease `k` held, and its term.
async fn leased() -> (Arc<FaultyStore>, Term) {
    let mem = MemStore::new(Arc::new(ManualClock::default()));
    let term = mem.insert_if_absent("k", "a", TTL).await.unwrap().unwrap();
    (FaultyStore::new(mem, "store", &()), term)
}

fn increment(writer: &str, key: &str, term: Term) -> FencedWrite {
    FencedWrite {
        writer: writer.to_owned(),
        lease_key: "k".to_owned(),
        term,
        space: "svc".to_owned(),
        op: OwnedOp::Increment(key.to_owned(), 1),
        quota: KvQuota::UNLIMITED,
    }
}

/// A write waiting with `writer`'s turn, answered nowhere.
fn pending(write: FencedWrite) -> Pending {
    Pending {
        write,
        answer: oneshot::channel().0,
    }
}

/// Each batch takes a write of each writer in turn, keeps each writer's order, stops at
/// the capacity, and the writer whose write did not fit goes first in the next batch.
#[test]
fn a_batch_takes_the_writers_in_turn_up_to_the_capacity() {
    let mut queue = Queue::default();
    let mut add = |writer: &str, key: &str| {
        let mine = queue.waiting.entry(writer.to_owned()).or_default();
        if mine.is_empty() {
            queue.turns.push_back(writer.to_owned());
        }
        mine.push_back(pending(increment(writer, key, 1)));
    };
    for i in 0..50 {
        add("flood", &format!("f{i}"));
    }
    add("quiet", "q0");
    add("other", "o0");
    add("other", "o1");
    // Each write costs 4 operations: 5 fit in 20.
    let capacity = BatchCapacity {
        ops: 20,
        bytes: 1 << 20,
    };
    let keys = |batch: Vec<Pending>| -> Vec<String> {
        batch
            .iter()
            .map(|p| p.write.op.keys()[0].to_owned())
            .collect()
    };
    assert_eq!(keys(queue.take(capacity)), ["f0", "q0", "o0", "f1", "o1"]);
    assert_eq!(keys(queue.take(capacity)), ["f2", "f3", "f4", "f5", "f6"]);
    let big = BatchCapacity {
        ops: 1000,
        bytes: 1 << 20,
    };
    assert_eq!(queue.take(big).len(), 43);
    assert!(queue.take(big).is_empty() && queue.turns.is_empty());
    // A write larger than the capacity still goes, alone.
    queue
        .waiting
        .insert("w".into(), [pending(increment("w", "x", 1))].into());
    queue.turns.push_back("w".into());
    let tiny = BatchCapacity { ops: 1, bytes: 1 };
    assert_eq!(queue.take(tiny).len(), 1);
}

/// Writes that arrive while a batch commits share the next transaction, and each gets its
/// own answer: one increment of a shared key per writer, counted once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_that_wait_together_share_one_commit_each_with_its_own_answer() {
    let (store, term) = leased().await;
    // Each transaction takes 20 ms: the writes arriving meanwhile wait for the next.
    store.set_default(Op::KvWrite, Fault::DelayBefore(Duration::from_millis(20)));
    let biggest = Arc::new(AtomicUsize::new(0));
    let group = GroupCommit::observed(Arc::clone(&store) as Arc<dyn Store>, {
        let biggest = Arc::clone(&biggest);
        move |report| {
            biggest.fetch_max(report.writes, Ordering::SeqCst);
        }
    });
    let mut writers = Vec::new();
    for w in 0..40 {
        let group = group.clone();
        writers.push(tokio::spawn(async move {
            group.submit(increment(&format!("w{w}"), "n", term)).await
        }));
    }
    let mut counts = Vec::new();
    for writer in writers {
        match writer.await.unwrap().unwrap() {
            Ok(KvDone::Number(n)) => counts.push(n),
            other => panic!("{other:?}"),
        }
    }
    counts.sort_unstable();
    assert_eq!(counts, (1..=40).collect::<Vec<_>>());
    let batches = store.calls_of(Op::KvWrite).len();
    assert!(batches < 40, "{batches} transactions for 40 writes");
    assert!(biggest.load(Ordering::SeqCst) > 1);
}

/// A transaction that fails acknowledges none of its writes: each is answered with the
/// store's error, and the next batch goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_acknowledges_none_of_its_writes() {
    let (store, term) = leased().await;
    // The first transaction takes a while and fails; the writes queued meanwhile form the
    // second, which fails after it was applied (a write of unknown outcome): neither
    // batch's writes are acknowledged.
    store.script(
        Op::KvWrite,
        [
            Fault::DelayThenTransient(Duration::from_millis(500)),
            Fault::ApplyThenTransient,
        ],
    );
    let group = GroupCommit::new(Arc::clone(&store) as Arc<dyn Store>);
    let first = tokio::spawn({
        let group = group.clone();
        async move { group.submit(increment("a", "first", term)).await }
    });
    while store.calls_of(Op::KvWrite).is_empty() {
        tokio::task::yield_now().await;
    }
    let mut second = Vec::new();
    for w in 0..5 {
        let group = group.clone();
        second.push(tokio::spawn(async move {
            group
                .submit(increment(&format!("b{w}"), "second", term))
                .await
        }));
    }
    while group.shared.lock().waiting.len() < 5 {
        tokio::task::yield_now().await;
    }
    let e = first.await.unwrap().unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert_eq!(store.inner.kv_get("svc", "first").await.unwrap(), None);
    for write in second {
        assert!(
            write.await.unwrap().is_err(),
            "acknowledged a failed commit"
        );
    }
    assert_eq!(store.calls_of(Op::KvWrite).len(), 2, "one transaction each");
    // The queue goes on: the next write is applied and answered.
    let next = group.submit(increment("c", "after", term)).await.unwrap();
    assert_eq!(next, Ok(KvDone::Number(1)));
}

/// A caller that gives up (its future dropped) leaves its write queued: it is applied,
/// and its neighbours are answered as ever. A stale term in the batch fails that write
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_caller_gave_up_still_lands_and_its_neighbours_are_answered() {
    let (store, term) = leased().await;
    store.script(
        Op::KvWrite,
        [Fault::DelayBefore(Duration::from_millis(500))],
    );
    let group = GroupCommit::new(Arc::clone(&store) as Arc<dyn Store>);
    let busy = tokio::spawn({
        let group = group.clone();
        async move { group.submit(increment("a", "first", term)).await }
    });
    while store.calls_of(Op::KvWrite).is_empty() {
        tokio::task::yield_now().await;
    }
    let abandoned = tokio::spawn({
        let group = group.clone();
        async move { group.submit(increment("b", "abandoned", term)).await }
    });
    let stale = tokio::spawn({
        let group = group.clone();
        async move { group.submit(increment("c", "stale", term + 1)).await }
    });
    let kept = tokio::spawn({
        let group = group.clone();
        async move { group.submit(increment("d", "kept", term)).await }
    });
    // All three are queued behind the batch under way (or, on a machine slow beyond
    // half a second, already in the next); then the first caller gives up.
    while group.shared.lock().waiting.len() < 3 && store.calls_of(Op::KvWrite).len() < 2 {
        tokio::task::yield_now().await;
    }
    abandoned.abort();
    assert_eq!(busy.await.unwrap().unwrap(), Ok(KvDone::Number(1)));
    assert_eq!(stale.await.unwrap().unwrap(), Err(KvRefusal::StaleTerm));
    assert_eq!(kept.await.unwrap().unwrap(), Ok(KvDone::Number(1)));
    group.settle(Duration::from_secs(10)).await;
    assert_eq!(
        store.inner.kv_get("svc", "abandoned").await.unwrap(),
        Some(b"1".to_vec())
    );
}
