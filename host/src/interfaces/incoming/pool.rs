//! Instances that serve many requests (SPEC §12, "Instance reuse"): the idle instances of one
//! HTTP service during one leadership (or spread claim), each waiting for its next request.
//!
//! A fresh instance per request costs a Python or JavaScript service almost all of its time
//! (instantiating an interpreter), so an instance that has answered a request whole may serve
//! the next, up to `max-instance-reuse-count` requests, and waits idle for at most
//! `idle-instance-timeout`. Isolation and the fence stay as they were:
//! - an instance is given back only after a call that returned: one that trapped (a memory cap
//!   hit traps too), hit its request timeout, was fenced or was cut at the stop is dropped
//!   with its store, never reused (`serve`);
//! - the pool is its service's during one leadership: a later term's requests are served by
//!   another pool (another route entry), so an instance made under term N never serves a
//!   request of term N+1; at the lease deadline, and at the stop (a hand-over drains it within
//!   the grace period), every idle instance is dropped and none is taken or kept again;
//! - a request past the deadline is answered 503 before any instance is touched (`serve`);
//!   every host call of a reused instance is fenced per call, as any instance's;
//! - it holds no more idle instances than its service may have requests at once
//!   (`max-concurrent`), so memory stays bounded by what fresh instances would take.
//!
//! Why not `wasmtime_wasi_http::handler::ProxyHandler`, the machinery of `wasmtime serve`: for
//! a WASI 0.2 handler it runs each call under `run_concurrent` on workers spawned on their own
//! and owned by nobody (they outlive a leadership until idle), and a trap after the handler set
//! its response is swallowed there, the instance kept for the next request. Here the call is
//! the plain one every request already made, on a task the route tracks, and an instance is
//! reused only when its call returned.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use wasmtime::Store;
use wasmtime_wasi_http::p2::bindings::Proxy;

use super::limits::InstanceReuse;
use crate::interfaces::env::ServiceEnv;
use crate::ops::ServiceHttpMetrics;

/// One instance of an HTTP service: its store, its exports, and the requests it has served;
/// counted in `/metrics` when dropped.
pub(super) struct Instance<T: 'static> {
    pub store: Store<T>,
    pub proxy: Proxy,
    /// Requests begun on it so far.
    pub served: u32,
    /// Its service's series (for the count).
    pub metrics: ServiceHttpMetrics,
}

impl<T: 'static> Instance<T> {
    /// Drops it for good, counted with the requests it served.
    pub(super) fn retire(self) {
        self.metrics.instance_retired(self.served);
    }
}

/// What a pool keeps: something that has served some requests.
pub(super) trait Served: Send + 'static {
    /// Requests begun on it so far.
    fn served(&self) -> u32;

    /// Dropped for good.
    fn retire(self);
}

impl<T: Send + 'static> Served for Instance<T> {
    fn served(&self) -> u32 {
        self.served
    }

    fn retire(self) {
        Instance::retire(self);
    }
}

/// The idle instances `I` of one HTTP service during one leadership.
pub(super) struct Pool<I> {
    reuse: InstanceReuse,
    /// Its service's most requests at once: the most idle instances kept.
    most: usize,
    env: Arc<ServiceEnv>,
    state: Mutex<State<I>>,
    /// Wakes the reaper: an instance was given back, or the pool closed.
    changed: Arc<Notify>,
    /// How many wait idle, for `/metrics`.
    gauge: Gauge,
    reaper: std::sync::OnceLock<AbortOnDropHandle<()>>,
}

struct State<I> {
    /// Idle instances, the most recently used last, with when each went idle.
    idle: Vec<(I, Instant)>,
    /// No instance is taken or kept any more (the deadline passed, or the service stopped).
    closed: bool,
}

impl<I: Served> Pool<I> {
    /// The pool of `env`'s service, reusing its instances as `reuse` says, keeping at most
    /// `most` idle; how many wait is set on `gauge`.
    pub(super) fn new(
        env: &Arc<ServiceEnv>,
        reuse: InstanceReuse,
        most: usize,
        gauge: Gauge,
    ) -> Arc<Self> {
        Arc::new(Self {
            gauge,
            reuse,
            most,
            env: Arc::clone(env),
            state: Mutex::new(State {
                idle: Vec::new(),
                closed: false,
            }),
            changed: Arc::new(Notify::new()),
            reaper: std::sync::OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<I>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle instance for the next request, the most recently used first; none once
    /// closed or past the lease deadline.
    pub(super) fn take(&self) -> Option<I> {
        let mut state = self.lock();
        if state.closed || self.env.deadline.has_passed() {
            return None;
        }
        let taken = state.idle.pop().map(|(instance, _)| instance);
        self.gauge.set(gauge_value(state.idle.len()));
        taken
    }

    /// Keeps `instance`, whose call returned, for the next request; dropped instead when it
    /// has served its share of requests, the pool is closed or full, or the deadline passed.
    pub(super) fn give_back(self: &Arc<Self>, instance: I) {
        let mut state = self.lock();
        if instance.served() >= self.reuse.max_requests
            || state.closed
            || state.idle.len() >= self.most
            || self.env.deadline.has_passed()
        {
            drop(state);
            instance.retire();
            return;
        }
        let first = state.idle.is_empty();
        state.idle.push((instance, Instant::now()));
        self.gauge.set(gauge_value(state.idle.len()));
        drop(state);
        self.reaper.get_or_init(|| {
            AbortOnDropHandle::new(tokio::spawn(reap(
                Arc::downgrade(self),
                Arc::clone(&self.env),
                Arc::clone(&self.changed),
            )))
        });
        // The reaper sleeps until the oldest idle instance's timeout, which this one's is not
        // before: it needs waking only when it had none to wait for.
        if first {
            self.changed.notify_one();
        }
    }

    /// Drops every idle instance; none is taken or kept from now on.
    pub(super) fn close(&self) {
        let idle = {
            let mut state = self.lock();
            state.closed = true;
            self.gauge.set(0);
            std::mem::take(&mut state.idle)
        };
        // Outside the lock: dropping a store unmaps its memory.
        for (instance, _) in idle {
            instance.retire();
        }
        self.changed.notify_one();
    }

    /// Drops the instances idle since before `now - idle-instance-timeout`; when the next of
    /// the others will be, if any.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let timeout = self.reuse.idle_timeout;
        let expired: Vec<(I, Instant)> = {
            let mut state = self.lock();
            let (expired, kept) = std::mem::take(&mut state.idle)
                .into_iter()
                .partition(|(_, since)| *since + timeout <= now);
            state.idle = kept;
            self.gauge.set(gauge_value(state.idle.len()));
            expired
        };
        for (instance, _) in expired {
            instance.retire();
        }
        let state = self.lock();
        state.idle.iter().map(|(_, since)| *since + timeout).min()
    }

    /// How many instances wait idle now.
    #[cfg(test)]
    fn idle(&self) -> usize {
        self.lock().idle.len()
    }
}

/// `n` as a gauge's value.
fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Drops the idle instances of `pool` as they pass their idle timeout, and every one at the
/// lease deadline or the stop; ends then, or when the pool is gone.
async fn reap<I: Served>(pool: Weak<Pool<I>>, env: Arc<ServiceEnv>, changed: Arc<Notify>) {
    loop {
        let woken = changed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let next = {
            let Some(pool) = pool.upgrade() else { return };
            if env.deadline.has_passed() || env.stopping.is_cancelled() {
                pool.close();
                return;
            }
            if pool.lock().closed {
                return;
            }
            pool.expire(Instant::now())
        };
        let until_next = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = env.deadline.passed() => {}
            () = env.stopping.cancelled() => {}
            () = until_next => {}
            () = woken => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::interfaces::env::tests::env;

    /// An instance double: counts its drops.
    struct Double {
        served: u32,
        dropped: Arc<AtomicUsize>,
    }

    impl Served for Double {
        fn served(&self) -> u32 {
            self.served
        }

        fn retire(self) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn reuse(max_requests: u32) -> InstanceReuse {
        InstanceReuse {
            max_requests,
            max_concurrent: 1,
            idle_timeout: Duration::from_secs(1),
        }
    }

    /// An instance is reused until it has served its share, the most recently used first;
    /// the pool keeps no more than its most; an idle one goes after the idle timeout.
    #[tokio::test(start_paused = true)]
    async fn instances_are_reused_up_to_their_share_and_dropped_when_idle() {
        let (_clock, env) = env().await;
        let dropped = Arc::new(AtomicUsize::new(0));
        let double = |served| Double {
            served,
            dropped: Arc::clone(&dropped),
        };
        let pool = Pool::new(&env, reuse(3), 2, Gauge::default());
        pool.give_back(double(1));
        pool.give_back(double(2));
        pool.give_back(double(1));
        assert_eq!(
            (pool.idle(), dropped.load(Ordering::SeqCst)),
            (2, 1),
            "at most 2 idle"
        );
        assert_eq!(
            pool.take().map(|d| d.served),
            Some(2),
            "the last given back first"
        );
        pool.give_back(double(3));
        assert_eq!(dropped.load(Ordering::SeqCst), 2, "served its 3: dropped");
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert_eq!(pool.idle(), 1);
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(pool.idle(), 0, "idle past its timeout");
        assert_eq!(dropped.load(Ordering::SeqCst), 3);
    }

    /// At the lease deadline every idle instance is dropped, and none is taken or kept
    /// after it; a closed pool (the service stopped) takes and keeps none either.
    #[tokio::test(start_paused = true)]
    async fn the_deadline_or_the_stop_empties_the_pool_for_good() {
        let (clock, env) = env().await;
        let dropped = Arc::new(AtomicUsize::new(0));
        let double = || Double {
            served: 1,
            dropped: Arc::clone(&dropped),
        };
        let pool = Pool::new(&env, reuse(100), 8, Gauge::default());
        pool.give_back(double());
        pool.give_back(double());
        clock.advance(Duration::from_mins(2));
        assert!(pool.take().is_none(), "past the deadline: none taken");
        // The reaper looks at the clock within a nap.
        tokio::time::sleep(crate::lease::DEADLINE_NAP * 2).await;
        assert_eq!((pool.idle(), dropped.load(Ordering::SeqCst)), (0, 2));
        pool.give_back(double());
        assert_eq!(dropped.load(Ordering::SeqCst), 3, "none kept past it");

        let (_clock, env) = crate::interfaces::env::tests::env().await;
        let pool = Pool::new(&env, reuse(100), 8, Gauge::default());
        pool.give_back(double());
        pool.close();
        assert_eq!(dropped.load(Ordering::SeqCst), 4);
        pool.give_back(double());
        assert!(pool.take().is_none());
        assert_eq!(dropped.load(Ordering::SeqCst), 5);
    }
}
