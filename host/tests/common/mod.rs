//! Test doubles shared by the lifecycle suites: a fault-injecting store over [`MemStore`], a
//! recording [`Services`], one journal that orders what both did, and child-process helpers.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::{HashMap, VecDeque};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::{Instant, sleep};
use vvm_host::clock::TokioClock;
use vvm_host::services::{RunningServices, ServiceContext, ServiceError, Services};
use vvm_host::store::{Fence, FencedKv, MemStore, Record, StoreError, Term, TtlStore};

/// Every event of one test, in the order it happened, with its (tokio) time.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<(Instant, String)>>>);

impl Journal {
    pub fn push(&self, what: impl Into<String>) {
        self.0.lock().unwrap().push((Instant::now(), what.into()));
    }

    pub fn events(&self) -> Vec<(Instant, String)> {
        self.0.lock().unwrap().clone()
    }

    /// Index of the first event containing `needle`.
    pub fn first(&self, needle: &str) -> Option<usize> {
        self.events().iter().position(|(_, e)| e.contains(needle))
    }

    /// Index of the last event containing `needle`.
    pub fn last(&self, needle: &str) -> Option<usize> {
        self.events().iter().rposition(|(_, e)| e.contains(needle))
    }

    /// Time of the first event containing `needle`.
    pub fn time_of(&self, needle: &str) -> Option<Instant> {
        self.events()
            .into_iter()
            .find(|(_, e)| e.contains(needle))
            .map(|(t, _)| t)
    }

    pub fn dump(&self) -> String {
        let events = self.events();
        let t0 = events.first().map(|(t, _)| *t);
        events
            .iter()
            .map(|(t, e)| format!("{:>10.3?} {e}\n", t0.map(|t0| *t - t0).unwrap_or_default()))
            .collect()
    }
}

/// A store made of a [`MemStore`] on a [`TokioClock`], so paused tokio time moves store expiry
/// and the elections' timers together.
pub fn mem_store() -> MemStore {
    MemStore::new(Arc::new(TokioClock::new()))
}

/// Which store operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Insert,
    Cas,
    Delete,
    Get,
}

/// What the double does with one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Pass the call to the inner store.
    Pass,
    /// Answer `Ok(answer)` without touching the inner store (for insert: `false` = held).
    Answer(bool),
    /// A transient error.
    Transient,
    /// A permanent error.
    Permanent,
    /// Never answer.
    Stall,
    /// Wait, then pass (the write lands late).
    DelayBefore(Duration),
    /// Pass at once, then wait before answering (the write lands, the answer is late).
    DelayAfter(Duration),
    /// Wait, then fail transiently.
    DelayThenTransient(Duration),
    /// Pass (the write lands), then fail transiently: a write of unknown outcome.
    ApplyThenTransient,
}

/// One call the double saw: when it began, when it ended (if it did), and what it returned.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: Op,
    pub key: String,
    pub start: Instant,
    pub end: Option<Instant>,
    /// `Ok(true/false)` as the caller saw it, `Err(())` for an error.
    pub result: Option<Result<bool, ()>>,
}

/// A fault-injecting store around a shared [`MemStore`]: scripted outcomes per operation, a
/// default outcome, a switch that stalls every call (a crashed or frozen host), and a record
/// of every call with its timestamps.
pub struct FaultyStore {
    pub inner: MemStore,
    name: String,
    journal: Journal,
    scripts: Mutex<HashMap<Op, VecDeque<Fault>>>,
    defaults: Mutex<HashMap<Op, Fault>>,
    stall_all: Mutex<bool>,
    stalled_keys: Mutex<Vec<String>>,
    calls: Mutex<Vec<Call>>,
}

impl FaultyStore {
    pub fn new(inner: MemStore, name: &str, journal: &Journal) -> Arc<Self> {
        Arc::new(Self {
            inner,
            name: name.to_owned(),
            journal: journal.clone(),
            scripts: Mutex::default(),
            defaults: Mutex::default(),
            stall_all: Mutex::new(false),
            stalled_keys: Mutex::default(),
            calls: Mutex::default(),
        })
    }

    /// The next calls of `op` get these outcomes, in order; then the default.
    pub fn script(&self, op: Op, faults: impl IntoIterator<Item = Fault>) {
        self.scripts
            .lock()
            .unwrap()
            .entry(op)
            .or_default()
            .extend(faults);
    }

    /// Calls of `op` with no scripted outcome get `fault`.
    pub fn set_default(&self, op: Op, fault: Fault) {
        self.defaults.lock().unwrap().insert(op, fault);
    }

    /// From now on every call, of every operation, never answers.
    pub fn stall_everything(&self) {
        *self.stall_all.lock().unwrap() = true;
    }

    /// From now on every call on `key` never answers.
    pub fn stall_key(&self, key: &str) {
        self.stalled_keys.lock().unwrap().push(key.to_owned());
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.op == op).collect()
    }

    fn next_fault(&self, op: Op, key: &str) -> Fault {
        if *self.stall_all.lock().unwrap()
            || self.stalled_keys.lock().unwrap().iter().any(|k| k == key)
        {
            return Fault::Stall;
        }
        let scripted = self
            .scripts
            .lock()
            .unwrap()
            .get_mut(&op)
            .and_then(VecDeque::pop_front);
        scripted.unwrap_or_else(|| {
            self.defaults
                .lock()
                .unwrap()
                .get(&op)
                .copied()
                .unwrap_or(Fault::Pass)
        })
    }

    /// Runs one call through its fault; `pass` performs it on the inner store.
    async fn run<T, F>(
        &self,
        op: Op,
        key: &str,
        pass: F,
        answer: impl Fn(bool) -> T,
        seen: impl Fn(&T) -> bool,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let index = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Call {
                op,
                key: key.to_owned(),
                start: Instant::now(),
                end: None,
                result: None,
            });
            calls.len() - 1
        };
        let fault = self.next_fault(op, key);
        let result = match fault {
            Fault::Pass => pass.await,
            Fault::Answer(a) => Ok(answer(a)),
            Fault::Transient => Err(transient()),
            Fault::Permanent => Err(StoreError::permanent("double", "scripted permanent error")),
            Fault::Stall => std::future::pending().await,
            Fault::DelayBefore(d) => {
                sleep(d).await;
                pass.await
            }
            Fault::DelayAfter(d) => {
                let r = pass.await;
                sleep(d).await;
                r
            }
            Fault::DelayThenTransient(d) => {
                sleep(d).await;
                Err(transient())
            }
            Fault::ApplyThenTransient => {
                let _ = pass.await;
                Err(transient())
            }
        };
        let shown = result.as_ref().map(&seen).map_err(|_| ());
        {
            let mut calls = self.calls.lock().unwrap();
            calls[index].end = Some(Instant::now());
            calls[index].result = Some(shown);
        }
        self.journal
            .push(format!("{} {op:?} {key} -> {shown:?}", self.name));
        result
    }
}

fn transient() -> StoreError {
    StoreError::transient("double", "scripted transient error")
}

#[async_trait]
impl TtlStore for FaultyStore {
    async fn insert_if_absent(
        &self,
        key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Term>, StoreError> {
        self.run(
            Op::Insert,
            key,
            self.inner.insert_if_absent(key, value, ttl),
            |_| None,
            Option::is_some,
        )
        .await
    }

    async fn compare_and_swap(
        &self,
        key: &str,
        expected: &str,
        new: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.run(
            Op::Cas,
            key,
            self.inner.compare_and_swap(key, expected, new, ttl),
            |a| a,
            |b| *b,
        )
        .await
    }

    async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, StoreError> {
        self.run(
            Op::Delete,
            key,
            self.inner.compare_and_delete(key, expected),
            |a| a,
            |b| *b,
        )
        .await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.run(Op::Get, key, self.inner.get(key), |_| None, Option::is_some)
            .await
    }

    async fn wait_released(&self, max: Duration) {
        if *self.stall_all.lock().unwrap() {
            return std::future::pending().await;
        }
        self.inner.wait_released(max).await;
    }
}

#[async_trait]
impl FencedKv for FaultyStore {
    async fn kv_get(&self, space: &str, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.kv_get(space, key).await
    }

    async fn kv_set(
        &self,
        fence: &Fence<'_>,
        space: &str,
        key: &str,
        value: &[u8],
    ) -> Result<bool, StoreError> {
        self.inner.kv_set(fence, space, key, value).await
    }
}

/// How the services double behaves.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Starting takes this long (cut short when `stopping` fires).
    pub slow_start: Duration,
    /// Stopping takes this long.
    pub slow_stop: Duration,
    /// `stop` never returns: a guest that ignores the request and is never dropped.
    pub ignore_stop: bool,
    /// Starting fails with this reason.
    pub fail_start: Option<String>,
    /// Starting panics (a bug in the services' code) once they have started.
    pub panic_start: bool,
}

/// A [`Services`] that records start and stop in the journal and counts running sets.
pub struct RecordingServices {
    name: String,
    behaviour: Behaviour,
    journal: Journal,
    running: Arc<AtomicUsize>,
    /// The contexts of every start, to look at the lease and `stopping`.
    pub contexts: Mutex<Vec<ServiceContext>>,
}

impl RecordingServices {
    pub fn new(name: &str, behaviour: Behaviour, journal: &Journal) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            behaviour,
            journal: journal.clone(),
            running: Arc::default(),
            contexts: Mutex::default(),
        })
    }

    /// How many started sets have not finished stopping.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    pub fn last_context(&self) -> Option<ServiceContext> {
        self.contexts.lock().unwrap().last().cloned()
    }
}

#[async_trait]
impl Services for RecordingServices {
    async fn start(&self, ctx: ServiceContext) -> Result<Box<dyn RunningServices>, ServiceError> {
        self.journal.push(format!(
            "{} start begin slot={} term={}",
            self.name, ctx.lease.slot, ctx.lease.term
        ));
        self.contexts.lock().unwrap().push(ctx.clone());
        if let Some(reason) = &self.behaviour.fail_start {
            self.journal.push(format!("{} start failed", self.name));
            return Err(ServiceError::Start {
                name: "double".into(),
                reason: reason.clone(),
            });
        }
        tokio::select! {
            () = sleep(self.behaviour.slow_start) => {
                self.journal.push(format!("{} started", self.name));
            }
            () = ctx.stopping.cancelled() => {
                self.journal.push(format!("{} start cut short", self.name));
            }
        }
        self.running.fetch_add(1, Ordering::SeqCst);
        assert!(!self.behaviour.panic_start, "{} start panics", self.name);
        Ok(Box::new(Running {
            name: self.name.clone(),
            behaviour: self.behaviour.clone(),
            journal: self.journal.clone(),
            running: Arc::clone(&self.running),
            stopping_was_signalled: ctx.stopping,
        }))
    }
}

struct Running {
    name: String,
    behaviour: Behaviour,
    journal: Journal,
    running: Arc<AtomicUsize>,
    stopping_was_signalled: tokio_util::sync::CancellationToken,
}

#[async_trait]
impl RunningServices for Running {
    async fn stop(self: Box<Self>) {
        self.journal.push(format!(
            "{} stop begin stopping={}",
            self.name,
            self.stopping_was_signalled.is_cancelled()
        ));
        if self.behaviour.ignore_stop {
            self.journal.push(format!("{} ignores stop", self.name));
            std::future::pending::<()>().await;
        }
        sleep(self.behaviour.slow_stop).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        self.journal.push(format!("{} stopped", self.name));
    }
}

/// The environment variable that tells a re-executed test binary to run a child's part.
pub const CHILD_ENV: &str = "VVM_LIFECYCLE_CHILD";

/// True in the child process started by [`run_child`].
pub fn is_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

/// Re-runs this test binary with only `test` (exact name), as a child with [`CHILD_ENV`] set.
/// Returns its output and the wall-clock moment its exit was seen.
pub fn run_child(test: &str) -> (Output, std::time::SystemTime) {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    (output, std::time::SystemTime::now())
}

/// Milliseconds since the Unix epoch of a wall-clock moment (shared by parent and child).
pub fn unix_ms(t: std::time::SystemTime) -> u128 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
}

/// The wall-clock moment of a tokio instant in the past (real time, not paused).
pub fn wall_of(at: Instant) -> std::time::SystemTime {
    std::time::SystemTime::now() - at.elapsed()
}

/// The word after `name=` in `stdout` (libtest may print it mid-line).
pub fn reported_str(stdout: &[u8], name: &str) -> Option<String> {
    let text = String::from_utf8_lossy(stdout);
    let prefix = format!("{name}=");
    let at = text.find(&prefix)? + prefix.len();
    text[at..].split_whitespace().next().map(str::to_owned)
}

/// The number after `name=` in `stdout`.
pub fn reported(stdout: &[u8], name: &str) -> Option<u128> {
    reported_str(stdout, name)?.parse().ok()
}
