//! WASI 0.3 HTTP services (SPEC §12): instances that serve several requests at once
//! (`max-instance-concurrent-reuse-count`, 16 by default) and many in their life
//! (`max-instance-reuse-count`, 128), as `wasmtime serve` serves them.
//!
//! Many calls at once in one instance need the store's event loop (`run_concurrent`) running
//! for as long as the instance lives: wasmtime-wasi-http's `handler::ProxyHandler`, the
//! machinery of `wasmtime serve`, keeps one task per instance that does that, and hands each
//! request to an instance with room for it. Here it is fitted to the fence:
//! - the instances are one leadership's (a route entry's [`Concurrent`]): a later term's
//!   requests go to another entry, so an instance made under term N never serves a request
//!   of term N+1;
//! - an instance takes no request once the lease deadline has passed or its service is
//!   stopping ([`WorkerState::should_accept_request`]), and it ends at the deadline whatever
//!   it is doing (its expiry, polled outside the event loop, at least every
//!   [`DEADLINE_NAP`]): its calls in flight are cut and their responses aborted, never
//!   completed; a stop lets them finish within the grace period;
//! - every host call of every request is fenced per call, as any instance's (the call hook,
//!   and the epoch callback that traps past the deadline);
//! - a trap, a memory cap hit or a request past its timeout ends the instance, and the other
//!   requests in it are cut: an instance that failed is never reused;
//! - each worker holds a token of [`Concurrent`]'s tracker, so the stop waits for every
//!   instance to be gone.

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{TaskTracker, task_tracker::TaskTrackerToken};
use wasmtime::component::GuestTaskId;
use wasmtime::{Store, StoreContextMut};
use wasmtime_wasi_http::WasiHttpCtxView;
use wasmtime_wasi_http::handler::{
    self, HandlerState, ProxyHandler, ShouldAccept, WorkerExpiration, WorkerState, WorkerStatus,
};
use wasmtime_wasi_http::p3::bindings::ServicePre;

use super::limits::InstanceReuse;
use super::sandboxes::Sandboxes;
use crate::interfaces::env::ServiceEnv;
use crate::interfaces::view::View;
use crate::lease::{DEADLINE_NAP, LeaseDeadline};
use crate::ops::ServiceHttpMetrics;

/// The instances of one WASI 0.3 HTTP service during one leadership.
pub(super) struct Concurrent<S: Sandboxes> {
    handler: ProxyHandler<Instances<S>>,
    /// Cancelled when the service stops: no instance takes a request from then on.
    closed: CancellationToken,
    /// A token per instance alive.
    alive: TaskTracker,
}

/// How a service's instances are made and when each takes a request or ends.
struct Instances<S: Sandboxes> {
    sandboxes: S,
    env: Arc<ServiceEnv>,
    pre: ServicePre<S::Data>,
    reuse: InstanceReuse,
    request_timeout: Duration,
    grace: Duration,
    closed: CancellationToken,
    alive: TaskTracker,
    metrics: ServiceHttpMetrics,
}

impl<S: Sandboxes + Clone> Concurrent<S> {
    /// The instances of `env`'s service, component `pre`, made in `sandboxes`' stores.
    pub(super) fn new(
        sandboxes: &S,
        env: &Arc<ServiceEnv>,
        pre: ServicePre<S::Data>,
        reuse: InstanceReuse,
        metrics: ServiceHttpMetrics,
    ) -> Self {
        let closed = CancellationToken::new();
        let alive = TaskTracker::new();
        let limits = sandboxes.limits();
        let state = Instances {
            sandboxes: sandboxes.clone(),
            env: Arc::clone(env),
            pre,
            reuse,
            request_timeout: limits.request_timeout,
            grace: sandboxes.grace_period(),
            closed: closed.clone(),
            alive: alive.clone(),
            metrics,
        };
        Self {
            handler: ProxyHandler::new(state),
            closed,
            alive,
        }
    }

    /// Serves `request` on an instance with room for it (a new one if none has), its
    /// response cut (`broken` cancelled) if its instance fails before the response ends.
    ///
    /// # Errors
    /// When no instance could be made, or the call failed before its response.
    pub(super) async fn handle(
        &self,
        broken: CancellationToken,
        request: handler::Request,
    ) -> wasmtime::Result<handler::Response> {
        self.handler.handle(broken, request).await
    }

    /// No instance takes a request from now on: each ends once its requests have (within the
    /// grace period), idle ones at once. Returns when every instance is gone, or after the
    /// grace period and a second.
    pub(super) async fn close(&self) {
        self.closed.cancel();
        self.alive.close();
        let bound = self.handler.state().grace + Duration::from_secs(1);
        if tokio::time::timeout(bound, self.alive.wait())
            .await
            .is_err()
        {
            tracing::error!(
                service = &*self.handler.state().env.name,
                "instances did not end after the grace period"
            );
        }
    }
}

impl<S: Sandboxes + Clone> HandlerState for Instances<S> {
    type StoreData = S::Data;
    type WorkerExpiration = Expiry;
    type WorkerState = Worker<S::Data>;

    async fn instantiate(
        &self,
    ) -> wasmtime::Result<handler::Instance<S::Data, Expiry, Worker<S::Data>>> {
        let mut store = self.sandboxes.store(self.pre.engine(), &self.env)?;
        let proxy = self.pre.instantiate_async(&mut store).await?;
        self.metrics.instance(false);
        let deadline = self.env.deadline.clone();
        Ok(handler::Instance {
            store,
            proxy: handler::Proxy::P3(proxy),
            view: view::<S::Data>,
            expiration: Expiry {
                deadline: deadline.clone(),
                closed: self.closed.clone(),
                closed_at: None,
                idle: self.reuse.idle_timeout,
                request_timeout: self.request_timeout,
                grace: self.grace,
                timer: Box::pin(tokio::time::sleep(DEADLINE_NAP)),
            },
            state: Worker {
                reuse: self.reuse,
                request_timeout: self.request_timeout,
                closed: self.closed.clone(),
                deadline,
                requests: Mutex::default(),
                served: AtomicU32::new(0),
                metrics: self.metrics.clone(),
                _alive: self.alive.token(),
                _data: std::marker::PhantomData,
            },
        })
    }
}

/// The HTTP view of a store's data.
fn view<T: View>(data: &mut T) -> WasiHttpCtxView<'_> {
    data.http()
}

/// One instance's account (`T` its store's data): what it takes, and what it cut when it
/// failed.
struct Worker<T> {
    reuse: InstanceReuse,
    request_timeout: Duration,
    closed: CancellationToken,
    deadline: LeaseDeadline,
    /// The `broken` tokens of the requests it took: cancelled if it fails.
    requests: Mutex<Vec<CancellationToken>>,
    /// Requests it took.
    served: AtomicU32,
    metrics: ServiceHttpMetrics,
    _alive: TaskTrackerToken,
    _data: std::marker::PhantomData<fn() -> T>,
}

impl<T: Send + 'static> WorkerState for Worker<T> {
    type StoreData = T;
    type RequestData = CancellationToken;

    fn should_accept_request(&self, concurrent: usize, total: usize) -> ShouldAccept {
        let most = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        if self.closed.is_cancelled()
            || self.deadline.has_passed()
            || total >= most(self.reuse.max_requests)
        {
            ShouldAccept::Never
        } else if concurrent >= most(self.reuse.max_concurrent) {
            ShouldAccept::No
        } else {
            ShouldAccept::Yes
        }
    }

    fn on_request_start(
        &self,
        _store: StoreContextMut<'_, T>,
        broken: CancellationToken,
        _task: GuestTaskId,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + Sync>> {
        if self.served.fetch_add(1, Ordering::Relaxed) > 0 {
            self.metrics.instance(true);
        }
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        requests.retain(|r| !r.is_cancelled());
        requests.push(broken);
        Box::pin(tokio::time::sleep(self.request_timeout))
    }

    fn drop(&self, store: Store<T>, result: wasmtime::Result<()>) {
        if let Err(e) = &result {
            // Its requests in flight are cut: their responses end in an error, never whole.
            for request in self
                .requests
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
            {
                request.cancel();
            }
            tracing::warn!(error = %format!("{e:#}"), "instance ended: its requests in flight were cut");
        }
        drop(store);
        self.metrics
            .instance_retired(self.served.load(Ordering::Relaxed));
    }
}

/// When an instance ends: at the lease deadline; idle past `idle-instance-timeout`; its latest
/// request past the request timeout (a second line of defence: a call that blocks the event
/// loop is cut here); and once its service is stopping, at once if idle, else after the grace
/// period.
struct Expiry {
    deadline: LeaseDeadline,
    closed: CancellationToken,
    /// When the stop was first seen.
    closed_at: Option<Instant>,
    idle: Duration,
    request_timeout: Duration,
    grace: Duration,
    /// Wakes the check, at most [`DEADLINE_NAP`] apart (the deadline may move earlier).
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl WorkerExpiration for Expiry {
    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        status: WorkerStatus,
        start: std::time::Instant,
    ) -> Poll<()> {
        if self.deadline.has_passed() {
            return Poll::Ready(());
        }
        let now = Instant::now();
        let start = Instant::from_std(start);
        let mut due = match status {
            WorkerStatus::Idle => start + self.idle,
            WorkerStatus::Requests | WorkerStatus::PostReturn => start + self.request_timeout,
        };
        if self.closed.is_cancelled() {
            let closed_at = *self.closed_at.get_or_insert(now);
            due = match status {
                WorkerStatus::Idle => now,
                _ => due.min(closed_at + self.grace),
            };
        }
        if now >= due {
            return Poll::Ready(());
        }
        let wake = due.min(now + DEADLINE_NAP);
        self.timer.as_mut().reset(wake);
        // Pending: the timer wakes this task when it fires.
        let _ = self.timer.as_mut().poll(cx);
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;
    use crate::interfaces::env::tests::env;
    use crate::ops::Ops;

    const REUSE: InstanceReuse = InstanceReuse {
        max_requests: 4,
        max_concurrent: 2,
        idle_timeout: Duration::from_secs(1),
    };
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
    const GRACE: Duration = Duration::from_secs(5);

    fn worker(env: &ServiceEnv, closed: &CancellationToken) -> Worker<()> {
        Worker {
            reuse: REUSE,
            request_timeout: REQUEST_TIMEOUT,
            closed: closed.clone(),
            deadline: env.deadline.clone(),
            requests: Mutex::default(),
            served: AtomicU32::new(0),
            metrics: Ops::new(Arc::new(ManualClock::default())).http_service("svc"),
            _alive: TaskTracker::new().token(),
            _data: std::marker::PhantomData,
        }
    }

    fn expiry(env: &ServiceEnv, closed: &CancellationToken) -> Expiry {
        Expiry {
            deadline: env.deadline.clone(),
            closed: closed.clone(),
            closed_at: None,
            idle: REUSE.idle_timeout,
            request_timeout: REQUEST_TIMEOUT,
            grace: GRACE,
            timer: Box::pin(tokio::time::sleep(DEADLINE_NAP)),
        }
    }

    /// Whether `worker` takes a request with `concurrent` in flight and `total` taken.
    fn takes(worker: &Worker<()>, concurrent: usize, total: usize) -> &'static str {
        match worker.should_accept_request(concurrent, total) {
            ShouldAccept::Yes => "yes",
            ShouldAccept::No => "no",
            ShouldAccept::Never => "never",
        }
    }

    /// An instance takes requests up to its share at once and in its life; none once the
    /// lease deadline has passed or its service is stopping.
    #[tokio::test]
    async fn an_instance_takes_its_share_and_nothing_past_the_deadline_or_the_stop() {
        let (clock, env) = env().await;
        let closed = CancellationToken::new();
        let w = worker(&env, &closed);
        assert_eq!(takes(&w, 0, 0), "yes");
        assert_eq!(takes(&w, 1, 1), "yes");
        assert_eq!(takes(&w, 2, 2), "no", "two at once is its most");
        assert_eq!(takes(&w, 1, 4), "never", "four in its life is its most");
        closed.cancel();
        assert_eq!(takes(&w, 0, 1), "never", "its service is stopping");
        let w = worker(&env, &CancellationToken::new());
        clock.advance(Duration::from_mins(2));
        assert_eq!(takes(&w, 0, 1), "never", "past the lease deadline");
    }

    /// Whether `expiry` ends its instance now, in `status` since `start`.
    fn ends(expiry: &mut Pin<Box<Expiry>>, status: WorkerStatus, start: Instant) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        expiry
            .as_mut()
            .poll(&mut cx, status, start.into_std())
            .is_ready()
    }

    /// An instance ends when idle past its idle timeout, when its latest request is past the
    /// request timeout, at the lease deadline whatever it does, and once its service stops:
    /// at once if idle, else after the grace period.
    #[tokio::test(start_paused = true)]
    async fn an_instance_ends_idle_late_at_the_deadline_or_after_the_stop() {
        let (clock, env) = env().await;
        let closed = CancellationToken::new();
        let mut e = Box::pin(expiry(&env, &closed));
        let start = Instant::now();
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!ends(&mut e, WorkerStatus::Idle, start));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            ends(&mut e, WorkerStatus::Idle, start),
            "idle for its timeout"
        );
        assert!(!ends(&mut e, WorkerStatus::Requests, start));
        tokio::time::advance(REQUEST_TIMEOUT).await;
        assert!(
            ends(&mut e, WorkerStatus::Requests, start),
            "a request late"
        );
        assert!(ends(&mut e, WorkerStatus::PostReturn, start));

        let start = Instant::now();
        closed.cancel();
        assert!(ends(&mut e, WorkerStatus::Idle, start), "idle at the stop");
        assert!(!ends(&mut e, WorkerStatus::Requests, start));
        tokio::time::advance(GRACE).await;
        assert!(
            ends(&mut e, WorkerStatus::Requests, start),
            "the grace period"
        );

        let mut e = Box::pin(expiry(&env, &CancellationToken::new()));
        let start = Instant::now();
        assert!(!ends(&mut e, WorkerStatus::Requests, start));
        clock.advance(Duration::from_mins(2));
        assert!(ends(&mut e, WorkerStatus::Requests, start), "the deadline");
    }
}
