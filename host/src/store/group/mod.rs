//! Group commit (SPEC §10): the fenced key-value writes of one host wait in one queue, and the
//! store applies what is queued in one transaction, each write with its own answer.
//!
//! Why: a durable commit costs the disk's sync (redb) or a raft round (etcd), whatever it
//! holds. One commit per write made that rate the ceiling of every stateful service, shared
//! by all of them. Writes that wait together now share one commit.
//!
//! How: [`GroupCommit`] sits in front of a store. The first write to find no commit under way
//! starts a committer task; the committer takes a batch from the queue, applies it with
//! [`FencedKv::kv_apply_batch`] (one transaction, durable when it returns), answers each write
//! of it, and goes on while writes are queued; then it ends. The writes that arrive while a
//! batch commits wait for the next one, so a lone writer waits for nobody, and many share
//! each commit. A batch takes the writers in turn, one write of each per round, until the
//! store's [`FencedKv::batch_capacity`]: a service writing as fast as it can gets its turn
//! and no more, and cannot starve another. A writer's own writes keep their order.
//!
//! A write is answered only once the transaction that holds it is durable; an error is every
//! write's of the batch. A caller that gives up (its future dropped, say the guest's instance
//! was stopped) leaves its write queued: it is applied as if the caller had waited, and the
//! answer is dropped, as a single write whose caller gave up may still land. Writes are fenced
//! by their term in their transaction, so a write applied after its lease was lost is refused.
//!
//! Everything else goes to the store directly: reads, and the lease's own writes, which never
//! wait in this queue (the redb backend also lets a waiting lease write go before the next
//! batch's transaction begins, so a renewal waits at most for the batch under way).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};

use super::kv::{FencedWrite, KvAnswer, KvOp, KvPage, KvQuota, KvUsage, KvView};
use super::{
    BatchCapacity, Candidates, Fence, FencedKv, HandOver, Record, Store, StoreError, Term, TtlStore,
};

/// What one batch was, for the host's metrics ([`GroupCommit::observed`]).
#[derive(Clone, Copy, Debug)]
pub struct BatchReport {
    /// The writes it held.
    pub writes: usize,
    /// How long its transaction took, from the start of its application to its answer.
    pub took: Duration,
    /// Whether the store applied it (`false`: an error, which every write of it got).
    pub applied: bool,
}

/// A store whose fenced key-value writes are group-committed (see the module's docs); every
/// other operation goes to the store it wraps as it is.
#[derive(Clone)]
pub struct GroupCommit {
    shared: Arc<Shared>,
}

struct Shared {
    store: Arc<dyn Store>,
    queue: Mutex<Queue>,
    /// The writes queued or being applied: [`TtlStore::settle`] waits for none.
    pending: watch::Sender<usize>,
    observer: Option<Arc<dyn Fn(BatchReport) + Send + Sync>>,
}

/// The writes waiting for a batch, by writer, and whose turn is next.
#[derive(Default)]
struct Queue {
    waiting: HashMap<String, VecDeque<Pending>>,
    /// The writers with writes waiting, in the order of their next turn.
    turns: VecDeque<String>,
    /// Whether a committer task runs: it ends when the queue is empty.
    committing: bool,
    /// That task, unless [`GroupCommit::close`] waits for it.
    committer: Option<tokio::task::JoinHandle<()>>,
}

/// A write waiting for its batch, and where its answer goes.
struct Pending {
    write: FencedWrite,
    answer: oneshot::Sender<Result<KvAnswer, StoreError>>,
}

impl GroupCommit {
    /// Group-commits the fenced writes made through it to `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_observer(store, None)
    }

    /// Like [`GroupCommit::new`], telling `observer` of every batch applied (on the committer
    /// task: it must not block).
    pub fn observed(
        store: Arc<dyn Store>,
        observer: impl Fn(BatchReport) + Send + Sync + 'static,
    ) -> Self {
        Self::with_observer(store, Some(Arc::new(observer)))
    }

    fn with_observer(
        store: Arc<dyn Store>,
        observer: Option<Arc<dyn Fn(BatchReport) + Send + Sync>>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                store,
                queue: Mutex::new(Queue::default()),
                pending: watch::Sender::new(0),
                observer,
            }),
        }
    }

    /// Waits for the committer under way, if any, to end, and then drops this handle: once
    /// every other handle is gone, nothing of the group holds the store any more.
    pub async fn close(self) {
        let committer = self.shared.lock().committer.take();
        if let Some(committer) = committer {
            let _ = committer.await;
        }
    }

    /// Queues `write` and waits for the answer of the transaction that applies it.
    async fn submit(&self, write: FencedWrite) -> Result<KvAnswer, StoreError> {
        let (answer, answered) = oneshot::channel();
        let context = format!("kv_apply in {:?}", write.space);
        self.shared.pending.send_modify(|n| *n += 1);
        {
            let mut queue = self.shared.lock();
            let writer = write.writer.clone();
            let mine = queue.waiting.entry(writer.clone()).or_default();
            let first = mine.is_empty();
            mine.push_back(Pending { write, answer });
            if first {
                queue.turns.push_back(writer);
            }
            if !queue.committing {
                start_committer(&mut queue, &self.shared);
            }
        }
        answered.await.unwrap_or_else(|_| {
            Err(StoreError::transient(
                context,
                "the write queue's committer ended before answering",
            ))
        })
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Queue {
    /// The next batch: a write of each writer in turn until `capacity` (at least one write).
    fn take(&mut self, capacity: BatchCapacity) -> Vec<Pending> {
        let mut batch = Vec::new();
        let (mut ops, mut bytes) = (0, 0);
        while let Some(writer) = self.turns.pop_front() {
            let Some(mine) = self.waiting.get_mut(&writer) else {
                continue;
            };
            let Some(next) = mine.front() else {
                self.waiting.remove(&writer);
                continue;
            };
            let (o, b) = (next.write.ops(), next.write.op.bytes());
            if !batch.is_empty() && (ops + o > capacity.ops || bytes + b > capacity.bytes) {
                // Its turn comes first in the next batch.
                self.turns.push_front(writer);
                break;
            }
            ops += o;
            bytes += b;
            batch.extend(mine.pop_front());
            if mine.is_empty() {
                self.waiting.remove(&writer);
            } else {
                self.turns.push_back(writer);
            }
        }
        batch
    }
}

/// Starts the committer (the queue's lock held): on the blocking pool for a store whose
/// batches block a thread ([`FencedKv::blocking_batches`]: redb), so that they follow each
/// other there without a hop to an async task and back; else an async task.
fn start_committer(queue: &mut Queue, shared: &Arc<Shared>) {
    queue.committing = true;
    let shared = Arc::clone(shared);
    queue.committer = Some(if shared.store.blocking_batches() {
        tokio::task::spawn_blocking(move || commit_blocking(&shared))
    } else {
        tokio::spawn(commit(shared))
    });
}

/// The committer of a store whose batches block: applies batches while writes are queued,
/// then ends.
fn commit_blocking(shared: &Arc<Shared>) {
    let mut ended = Ended(Some(Arc::clone(shared)));
    let capacity = shared.store.batch_capacity();
    while let Some(writes) = shared.next_batch(capacity, &mut ended) {
        let (writes, answers): (Vec<FencedWrite>, Vec<_>) =
            writes.into_iter().map(|p| (p.write, p.answer)).unzip();
        let started = tokio::time::Instant::now();
        let applied = shared.store.kv_apply_batch_blocking(&writes);
        shared.answer(&writes, answers, applied, started);
    }
}

/// The committer: applies batches while writes are queued, then ends.
async fn commit(shared: Arc<Shared>) {
    // Should the task end any other way (a panic in a backend), the next write starts
    // another committer; the writes of the batch under way are answered with an error.
    let mut ended = Ended(Some(Arc::clone(&shared)));
    let capacity = shared.store.batch_capacity();
    while let Some(writes) = shared.next_batch(capacity, &mut ended) {
        let (writes, answers): (Vec<FencedWrite>, Vec<_>) =
            writes.into_iter().map(|p| (p.write, p.answer)).unzip();
        let started = tokio::time::Instant::now();
        let applied = shared.store.kv_apply_batch(&writes).await;
        shared.answer(&writes, answers, applied, started);
    }
}

impl Shared {
    /// The next batch, or `None` when the queue is empty: then the committer ends (`ended`
    /// cleared: it ended as it should).
    fn next_batch(&self, capacity: BatchCapacity, ended: &mut Ended) -> Option<Vec<Pending>> {
        let mut queue = self.lock();
        let batch = queue.take(capacity);
        if batch.is_empty() {
            queue.committing = false;
            queue.committer = None;
            ended.0 = None;
            return None;
        }
        Some(batch)
    }

    /// Answers each write of a batch applied (or not) since `started`, and reports it.
    fn answer(
        &self,
        writes: &[FencedWrite],
        answers: Vec<oneshot::Sender<Result<KvAnswer, StoreError>>>,
        applied: Result<Vec<KvAnswer>, StoreError>,
        started: tokio::time::Instant,
    ) {
        let report = BatchReport {
            writes: writes.len(),
            took: started.elapsed(),
            applied: applied.is_ok(),
        };
        match applied {
            Ok(results) if results.len() == writes.len() => {
                for (answer, result) in answers.into_iter().zip(results) {
                    let _ = answer.send(Ok(result));
                }
            }
            Ok(results) => {
                let e = StoreError::permanent(
                    "kv_apply_batch",
                    format!("{} answers for {} writes", results.len(), writes.len()),
                );
                answer_all(answers, &e);
            }
            Err(e) => answer_all(answers, &e),
        }
        self.pending
            .send_modify(|n| *n = n.saturating_sub(writes.len()));
        if let Some(observer) = &self.observer {
            observer(report);
        }
    }
}

/// Answers every write of a failed batch with `e`.
fn answer_all(answers: Vec<oneshot::Sender<Result<KvAnswer, StoreError>>>, e: &StoreError) {
    for answer in answers {
        let _ = answer.send(Err(e.for_each_write()));
    }
}

/// Clears the committer of a task that ended without emptying the queue (a panic, or its
/// runtime shutting down), and starts another for the writes still queued if it can. Cleared
/// (`None`) by a committer that ends as it should, under the queue's lock.
struct Ended(Option<Arc<Shared>>);

impl Drop for Ended {
    fn drop(&mut self) {
        let Some(shared) = self.0.take() else {
            return;
        };
        let mut queue = shared.lock();
        queue.committing = false;
        queue.committer = None;
        if !queue.turns.is_empty() && tokio::runtime::Handle::try_current().is_ok() {
            start_committer(&mut queue, &shared);
        }
    }
}

#[async_trait]
impl TtlStore for GroupCommit {
    async fn insert_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Term>, StoreError> {
        self.shared.store.insert_if_absent(key, value, ttl).await
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: &str,
        new: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.shared
            .store
            .compare_and_swap(key, expected, new, ttl)
            .await
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, StoreError> {
        self.shared.store.compare_and_delete(key, expected).await
    }

    async fn hand_over(
        &self,
        key: &str,
        expected: &str,
        candidates: &Candidates,
        ttl: Duration,
    ) -> Result<HandOver, StoreError> {
        self.shared
            .store
            .hand_over(key, expected, candidates, ttl)
            .await
    }

    async fn prepare_hand_over(&self, candidates: &Candidates) {
        self.shared.store.prepare_hand_over(candidates).await;
    }

    fn handed(&self, key: &str) -> Option<Record> {
        self.shared.store.handed(key)
    }

    fn candidacy_ttl(&self, lease: Duration) -> Duration {
        self.shared.store.candidacy_ttl(lease)
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.shared.store.get(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, Record)>, StoreError> {
        self.shared.store.list(prefix).await
    }

    async fn renew_all(
        &self,
        prefixes: &[&str],
        holder: &str,
        ttl: Duration,
    ) -> Result<Vec<(String, Term)>, StoreError> {
        self.shared.store.renew_all(prefixes, holder, ttl).await
    }

    async fn wait_released(&self, max: Duration) {
        self.shared.store.wait_released(max).await;
    }

    /// The queued writes first (each is applied, or answered with an error, within the
    /// store's own bounds), then the store's own.
    async fn settle(&self, max: Duration) {
        let deadline = tokio::time::Instant::now() + max;
        let mut pending = self.shared.pending.subscribe();
        let _ = tokio::time::timeout_at(deadline, pending.wait_for(|n| *n == 0)).await;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        self.shared.store.settle(left).await;
    }
}

#[async_trait]
impl FencedKv for GroupCommit {
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.shared.store.kv_get(space, key).await
    }

    async fn kv_get_many(
        &self,
        space: &str,
        keys: &[&str],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.shared.store.kv_get_many(space, keys).await
    }

    async fn kv_list(
        &self,
        space: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<KvPage, StoreError> {
        self.shared.store.kv_list(space, prefix, after, limit).await
    }

    async fn kv_usage(&self, space: &str) -> Result<KvUsage, StoreError> {
        self.shared.store.kv_usage(space).await
    }

    async fn kv_view(&self, space: &str, prefix: &str) -> Result<KvView, StoreError> {
        self.shared.store.kv_view(space, prefix).await
    }

    /// Queued, and applied with the writes queued beside it.
    async fn kv_apply(
        &self,
        fence: &Fence<'_>,
        space: &str,
        op: &KvOp<'_>,
        quota: &KvQuota,
    ) -> Result<KvAnswer, StoreError> {
        self.submit(FencedWrite::new(fence, space, op, quota)).await
    }

    /// Straight to the store: the caller made its batch.
    async fn kv_apply_batch(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        self.shared.store.kv_apply_batch(writes).await
    }

    fn blocking_batches(&self) -> bool {
        self.shared.store.blocking_batches()
    }

    fn kv_apply_batch_blocking(&self, writes: &[FencedWrite]) -> Result<Vec<KvAnswer>, StoreError> {
        self.shared.store.kv_apply_batch_blocking(writes)
    }

    fn batch_capacity(&self) -> BatchCapacity {
        self.shared.store.batch_capacity()
    }
}

#[cfg(test)]
mod tests;
