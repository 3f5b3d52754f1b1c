//! The running services of one leadership follow the live catalogue (SPEC §6, "The services
//! directory is live"): a service added to the catalogue is started, a replaced one is stopped
//! (stop signal, grace period, drop) and its new version started under the same lease, a
//! removed one is stopped. Each supervisor says how its service is (running, backing off,
//! stopped) in the leadership's report, which the lease's renewals write for `vvm-host
//! status` ([`crate::lease_value`]); a service that is stopped here leaves the report.
//!
//! Every rule of the lifecycle still holds: services start only under the held lease (the
//! supervisors wait while its deadline has passed), nothing starts once the stop is signalled
//! (each start is checked against it, with no await in between), and stopping waits for a
//! reconciliation in progress, so none outlives the shutdown sequence.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::Grants;
use super::component::Loaded;
use super::engine::Runtime;
use super::http::HttpServer;
use super::live_dir::Catalogue;
use super::restart::Tracker;
use super::scheduler;
use super::supervisor::{FirstStart, supervise};
use crate::interfaces::ServiceEnv;
use crate::interfaces::incoming::Door;
use crate::interfaces::keyvalue::access::WriteBudget;
use crate::interfaces::outgoing::{HttpPolicy, OutgoingShared};
use crate::lease_value::ReuseStatus;
use crate::services::{RunningServices, ServiceContext};

/// How long the guests of a start wait for every service's first instance before they begin
/// anyway: 100 services are instantiated in about 2 ms, so only a guest whose start function
/// runs on (for ever, maybe) makes them wait this long.
const START_PATIENCE: Duration = Duration::from_secs(1);

/// Starts every service of the catalogue under `ctx.lease` (with `only`, just that one: spread
/// placement runs each service under its own claim), returns once each has started (or the
/// stop came, or [`START_PATIENCE`] passed), and from then on follows the catalogue until
/// stopped. A leadership of every service holds the host's front door (`http-addr`) for its
/// whole life, HTTP services or not; under spread placement the membership holds it.
pub(crate) async fn start(
    rt: Arc<Runtime>,
    http: Arc<HttpServer>,
    mut catalogue: watch::Receiver<Catalogue>,
    ctx: ServiceContext,
    only: Option<String>,
) -> Box<dyn RunningServices> {
    let stop = ctx.stopping.child_token();
    let grace = rt.config.grace_period;
    let term = ctx.lease.term;
    let mut reconciler = Reconciler {
        rt,
        door: None,
        http,
        ctx,
        stop: stop.clone(),
        running: BTreeMap::new(),
        only,
        begin: CancellationToken::new(),
        pending: Arc::default(),
    };
    let initial = reconciler.wanted(&catalogue.borrow_and_update());
    reconciler.pending.store(initial.len(), Ordering::SeqCst);
    let started: Vec<_> = initial
        .values()
        .map_while(|svc| (!stop.is_cancelled()).then(|| reconciler.start(svc)))
        .collect();
    if reconciler.only.is_none() {
        // Once every HTTP service of the leadership is routed: a request accepted earlier
        // would be answered 503 for a service about to be served.
        reconciler.door = reconciler.http.open(reconciler.ctx.deadline.clone());
    }
    let all_started = async {
        for rx in started {
            // An error only means that service could not start: its supervisor logs why.
            let _ = rx.await;
        }
    };
    tokio::select! {
        () = all_started => {}
        () = stop.cancelled() => {}
        () = tokio::time::sleep(START_PATIENCE) => {
            // A start function that never returns, say: the others do not wait for it.
            let waiting = reconciler.pending.load(Ordering::SeqCst);
            tracing::warn!(waiting, "services still being instantiated; the others begin");
        }
    }
    // Every first instance exists (or the stop came, or the patience ran out): the guests
    // begin.
    reconciler.begin.cancel();
    tracing::info!(services = initial.len(), term, "services started");
    let follower = AbortOnDropHandle::new(tokio::spawn(reconciler.follow(catalogue)));
    Box::new(Running {
        stop,
        follower,
        grace,
    })
}

/// One service's supervisor.
struct Supervised {
    loaded: Arc<Loaded>,
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

/// The services of one leadership, by name.
struct Reconciler {
    rt: Arc<Runtime>,
    /// The front door this leadership holds open, if it holds it (not a spread claim's).
    door: Option<Door>,
    /// Where its HTTP services are served.
    http: Arc<HttpServer>,
    ctx: ServiceContext,
    /// Cancelled when every service must stop.
    stop: CancellationToken,
    running: BTreeMap<String, Supervised>,
    /// The one service this leadership runs, if not all of them.
    only: Option<String>,
    /// Cancelled once the services the leadership started with all have their first
    /// instance: their guests wait for it ([`FirstStart::begin`]); those started later find
    /// it cancelled.
    begin: CancellationToken,
    /// How many of those have no first instance yet ([`FirstStart::pending`]).
    pending: Arc<AtomicUsize>,
}

impl Reconciler {
    /// The services of `catalogue` this leadership runs.
    fn wanted(&self, catalogue: &Catalogue) -> Catalogue {
        match &self.only {
            None => catalogue.clone(),
            Some(name) => catalogue
                .get_key_value(name)
                .map(|(k, v)| (k.clone(), Arc::clone(v)))
                .into_iter()
                .collect(),
        }
    }

    /// Starts `svc`'s supervisor; the receiver hears when its first instance is up.
    fn start(&mut self, svc: &Arc<Loaded>) -> oneshot::Receiver<()> {
        let stop = self.stop.child_token();
        let ctx = &self.ctx;
        let grants = self.rt.grants();
        let grants = grants.get(&svc.name);
        let env = Arc::new(ServiceEnv {
            name: svc.name.as_str().into(),
            lease: ctx.lease.clone(),
            deadline: ctx.deadline.clone(),
            stopping: stop.clone(),
            problems: ctx.problems.clone(),
            store: Arc::clone(&ctx.store),
            ops: self.rt.ops.clone(),
            kv_budget: Mutex::new(WriteBudget::full(&Grants::kv_limits(
                grants,
                self.rt.config.kv,
            ))),
            outgoing: OutgoingShared::new(grants.map_or(&HttpPolicy::default(), |g| &g.http)),
        });
        let reuse = svc
            .handler
            .as_ref()
            .and_then(|handler| self.http.register(&env, handler));
        let (created, rx) = oneshot::channel();
        let first = FirstStart {
            created,
            begin: self.begin.clone(),
            pending: Arc::clone(&self.pending),
        };
        let mut tracker = Tracker::new(
            ctx.running.clone(),
            self.rt.ops.clone(),
            &svc.name,
            &svc.version,
        );
        if let Some(reuse) = reuse {
            tracker.reused(ReuseStatus {
                max_requests: reuse.max_requests,
                max_concurrent: reuse.max_concurrent,
                idle_ms: u64::try_from(reuse.idle_timeout.as_millis()).unwrap_or(u64::MAX),
            });
        }
        let schedule = grants.and_then(|g| g.schedule.clone());
        let task = match schedule {
            Some(settings) => tokio::spawn(scheduler::run(
                Arc::clone(&self.rt),
                Arc::clone(svc),
                env,
                first,
                tracker,
                settings,
            )),
            None => tokio::spawn(supervise(
                Arc::clone(&self.rt),
                Arc::clone(svc),
                env,
                first,
                tracker,
            )),
        };
        self.running.insert(
            svc.name.clone(),
            Supervised {
                loaded: Arc::clone(svc),
                stop,
                task: AbortOnDropHandle::new(task),
            },
        );
        rx
    }

    /// Stops serving the HTTP services among `names` but those in `handing_over`, tells the
    /// services `names` to stop, waits out their grace period, then drops every instance still
    /// there.
    async fn stop(&mut self, names: &[String], handing_over: &[String]) {
        let unrouted: Vec<String> = names
            .iter()
            .filter(|n| !handing_over.contains(n))
            .cloned()
            .collect();
        self.http.unregister(&unrouted).await;
        let mut stopping: Vec<Supervised> = names
            .iter()
            .filter_map(|n| self.running.remove(n))
            .collect();
        if stopping.is_empty() {
            return;
        }
        for s in &stopping {
            s.stop.cancel();
        }
        // Each supervisor drops its instance once the grace period is over; this bound only
        // guards against a supervisor that does not end.
        let bound = self
            .rt
            .config
            .grace_period
            .saturating_add(Duration::from_secs(1));
        let joined = tokio::time::timeout(bound, async {
            for s in &mut stopping {
                let _ = (&mut s.task).await;
            }
        })
        .await;
        if joined.is_err() {
            tracing::error!("services did not stop after their grace period; aborting them");
            for s in &mut stopping {
                s.task.abort();
                let _ = (&mut s.task).await;
            }
        }
        for name in names {
            self.ctx.running.remove(name);
        }
    }

    /// Follows the catalogue until the stop, then closes the door (if this leadership holds
    /// it: the connections finish their request in progress, under the lease) and stops every
    /// service.
    async fn follow(mut self, mut catalogue: watch::Receiver<Catalogue>) {
        loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => break,
                changed = catalogue.changed() => {
                    if changed.is_err() {
                        // The catalogue is fixed from now on.
                        self.stop.cancelled().await;
                        break;
                    }
                }
            }
            let now = self.wanted(&catalogue.borrow_and_update());
            self.apply(&now).await;
        }
        if let Some(door) = self.door.take() {
            door.close().await;
        }
        let all: Vec<String> = self.running.keys().cloned().collect();
        self.stop(&all, &[]).await;
    }

    /// Stops what was replaced or removed, then starts what is new.
    async fn apply(&mut self, catalogue: &Catalogue) {
        let outdated: Vec<String> = self
            .running
            .iter()
            .filter(|(name, s)| {
                catalogue
                    .get(*name)
                    .is_none_or(|svc| svc.version != s.loaded.version)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in &outdated {
            tracing::debug!(service = name, "stopping: replaced or removed");
        }
        // An HTTP service replaced by one keeps its route meanwhile: the old version answers
        // until the new one takes the route over at its start, so no request meets a 503.
        let handing_over: Vec<String> = outdated
            .iter()
            .filter(|n| {
                self.running.get(*n).is_some_and(|s| s.loaded.serves_http())
                    && catalogue.get(*n).is_some_and(|svc| svc.serves_http())
            })
            .cloned()
            .collect();
        self.stop(&outdated, &handing_over).await;
        for (name, svc) in catalogue {
            // Checked right before each start, with no await in between: nothing starts once
            // the stop is signalled.
            if self.stop.is_cancelled() {
                break;
            }
            if !self.running.contains_key(name) {
                tracing::debug!(service = name, version = svc.version, "starting");
                drop(self.start(svc));
            }
        }
        // Those that did not start (the stop came) give their route up now.
        let orphaned: Vec<String> = handing_over
            .into_iter()
            .filter(|n| !self.running.contains_key(n))
            .collect();
        self.http.unregister(&orphaned).await;
    }
}

/// The services of one leadership: the follower and, through it, every supervisor.
struct Running {
    stop: CancellationToken,
    follower: AbortOnDropHandle<()>,
    grace: Duration,
}

#[async_trait]
impl RunningServices for Running {
    async fn stop(mut self: Box<Self>) {
        tracing::info!("stopping services");
        self.stop.cancel();
        // A reconciliation in progress may be waiting out a replaced service's grace period
        // before the follower stops the rest: two grace periods at most, then it is aborted.
        let bound = self
            .grace
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(3));
        if tokio::time::timeout(bound, &mut self.follower)
            .await
            .is_err()
        {
            tracing::error!("services did not stop after their grace period; aborting them");
            self.follower.abort();
            let _ = (&mut self.follower).await;
        }
        tracing::info!("services stopped");
    }
}
