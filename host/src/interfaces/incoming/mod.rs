//! Incoming HTTP (SPEC §10, "Incoming HTTP"): the host's one listener on `http-addr` (its
//! front door, [`Door`]), open while a lease of this host's own runs, and the routes of the
//! services it runs. It reaches the runtime only through [`Sandboxes`] (a store per request,
//! the limits, the HTTP services loaded), which the runtime implements.
//!
//! - The listening socket is the machine's hosts' together (`socket`): got once, when the host
//!   starts ([`HttpServer::share`]), from systemd or from a host holding it, or bound. Where
//!   it cannot be shared, each door binds the address itself (again and again while it is
//!   taken: a stalled former leader may still hold it).
//! - The door ([`HttpServer::open`]) belongs to the lease the host answers under as a whole,
//!   not to any one service: a slot's leadership under `together` placement, the host's
//!   membership of the group under `spread` (where each service is a claim of its own, and
//!   claims come and go while the host stays a member). On the shared socket it accepts only
//!   while that lease's deadline is ahead: a host resumed after a SIGSTOP takes nothing more
//!   from the queue (what it took is answered), and a member whose membership is renewed
//!   after a loss takes again.
//! - Each request is judged by the service it asks for ([`routes`]): its route is registered
//!   ([`HttpServer::register`]) with the environment of the lease it runs under (deadline,
//!   stop signal); served while that deadline is ahead, 503 with `Retry-After` past it or for
//!   a service this host does not run, 404 for no route. Never silence: a connection accepted
//!   is answered or closed.
//! - Stopping closes the door first ([`Door::close`]; on a shared socket what is queued waits
//!   for the next holder, an own listener closes), open connections finish the request in
//!   progress within the grace period and are dropped after it; then the routes go
//!   ([`HttpServer::unregister`]) and their calls still running end (bounded by the grace
//!   period too); only then are the services stopped and the lease released (SPEC §5 order).
//! - With `forward` on, a request for a service another host of the group holds is forwarded
//!   to it, one hop (`forward`), instead of the 503 ([`HttpServer::directory`] is where
//!   placement says who holds what).
//! - Incoming HTTP runs on threads of its own (`workers`): no flood of connections or requests
//!   can starve the lease's renewals.
//! - `limits`: [`IncomingLimits`]; `connections`: the cap on open connections and their
//!   header and keep-alive timeouts; `sandboxes`: the seam; `routes`: the routes served now;
//!   `listen`: a door's listener and its connections; `serve`: one request; `pool`: the
//!   instances a WASI 0.2 service reuses; `concurrent`: the instances of a WASI 0.3 service,
//!   each taking several requests at once; `body`: a response under the lease; `spin`: Spin's
//!   request headers; `forward`: a request for a service another host of the group holds,
//!   sent on to it (SPEC §13).
//!
//! Dependencies point one way, in this order (each uses only modules before it): `limits`,
//! `socket`, `connections`, `workers`, `spin`, `body`, `forward`, `sandboxes`, `pool`,
//! `concurrent`, `routes`, `serve`, `listen`.

mod body;
mod concurrent;
mod connections;
mod forward;
mod limits;
mod listen;
mod pool;
mod routes;
mod sandboxes;
mod serve;
mod socket;
mod spin;
mod workers;

pub use limits::{Forwarding, IncomingLimits, InstanceReuse};

pub(crate) use sandboxes::Sandboxes;
pub(crate) use socket::{SharedSocket, other_addresses, share};

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use wasmtime_wasi_http::handler::ProxyPre;

use self::concurrent::Concurrent;
use self::connections::Connections;
use self::forward::Forwarder;
use self::listen::{Listener, listen};
use self::pool::Pool;
use self::routes::{Entry, Handler, Shared};
use self::workers::Workers;
use crate::interfaces::env::ServiceEnv;
use crate::lease::LeaseDeadline;
use crate::services::{Directory, FrontDoor};

/// The host's front door while it is open: its listener's task accepts and serves connections
/// until closed, while its lease's deadline is ahead (on the shared socket).
pub(crate) struct Door {
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

impl Door {
    /// Stops accepting (on the shared socket what is queued is left for the others; an own
    /// listener closes), lets the open connections finish the request in progress within the
    /// grace period, and drops them after it. Returns when every connection has ended.
    pub(crate) async fn close(mut self) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

#[async_trait::async_trait]
impl FrontDoor for Door {
    async fn close(self: Box<Self>) {
        Door::close(*self).await;
    }
}

/// The host's HTTP server: the routes of the HTTP services running now, and the listener;
/// the runtime's side `S`.
pub(crate) struct HttpServer<S: Sandboxes> {
    shared: Arc<Shared<S>>,
    /// Services whose route a new version took over, with calls maybe still running: the
    /// next [`HttpServer::unregister`] waits for them too.
    retired: Mutex<Vec<Arc<Entry<S>>>>,
    /// `http-addr`'s socket, shared with the other hosts of this machine, once it is got;
    /// without it each leadership binds the address itself.
    socket: std::sync::OnceLock<SharedSocket>,
    /// Reads the shared socket's queue into `/metrics` while it is held.
    queue_gauge: Mutex<Option<AbortOnDropHandle<()>>>,
    /// The threads every door and connection runs on; started with the first door.
    workers: std::sync::OnceLock<Workers>,
    /// Who holds the services other hosts run, when this host forwards to them.
    directory: Option<Arc<Directory>>,
}

impl<S: Sandboxes> HttpServer<S> {
    /// Serves the HTTP services that a leadership of this host registers, through
    /// `sandboxes`.
    pub(crate) fn new(sandboxes: S) -> Self {
        let (directory, forwarder) = match sandboxes.limits().forwarding {
            Some(forwarding) => {
                let directory = Arc::new(Directory::default());
                let forwarder = Forwarder::new(Arc::clone(&directory), forwarding);
                (Some(directory), Some(forwarder))
            }
            None => (None, None),
        };
        Self {
            shared: Arc::new(Shared {
                connections: Connections::new(sandboxes.max_connections()),
                sandboxes,
                routes: Mutex::default(),
                registered: tokio::sync::Notify::new(),
                forwarder,
            }),
            retired: Mutex::default(),
            socket: std::sync::OnceLock::new(),
            queue_gauge: Mutex::default(),
            workers: std::sync::OnceLock::new(),
            directory,
        }
    }

    /// Where placement tells the front door who holds the services other hosts run, when it
    /// forwards requests for them.
    pub(crate) fn directory(&self) -> Option<Arc<Directory>> {
        self.directory.clone()
    }

    /// Accepts from `socket`, shared with the other hosts of this machine, from now on (from
    /// the next leadership's first registration), and reports its queue every second. Once:
    /// a second socket is refused (returned).
    ///
    /// # Errors
    /// The socket, if one was given already.
    pub(crate) fn share(&self, socket: SharedSocket) -> Result<(), SharedSocket> {
        self.socket.set(socket)?;
        let shared = Arc::clone(&self.shared);
        let socket = self.socket.get().and_then(|s| s.accepting().ok());
        if let Some(socket) = socket {
            let gauge = tokio::spawn(async move {
                let mut every = tokio::time::interval(Duration::from_secs(1));
                let socket = Arc::new(socket);
                loop {
                    every.tick().await;
                    // It reads `/proc/net/tcp`, one line per socket of the machine: never on a
                    // worker, which must not wait on it.
                    let socket = Arc::clone(&socket);
                    let depth = tokio::task::spawn_blocking(move || {
                        socket::queue_depth(std::os::fd::AsFd::as_fd(&*socket))
                    });
                    let depth = depth.await.ok().flatten();
                    shared.sandboxes.ops().http_listen_queue(depth);
                }
            });
            *self
                .queue_gauge
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(AbortOnDropHandle::new(gauge));
        }
        Ok(())
    }

    /// Opens the front door: accepts on `http-addr` (from the shared socket, or bound here)
    /// and serves every connection, until closed; on the shared socket only while `deadline`
    /// is ahead. `None` without `http-addr`.
    pub(crate) fn open(&self, deadline: LeaseDeadline) -> Option<Door> {
        let sandboxes = &self.shared.sandboxes;
        let addr = sandboxes.limits().addr?;
        let stop = CancellationToken::new();
        let socket = match self.socket.get().map(SharedSocket::accepting) {
            Some(Ok(socket)) => Some(socket),
            Some(Err(e)) => {
                tracing::error!(error = %e, "http-addr's shared socket cannot be used; binding it here");
                None
            }
            None => None,
        };
        let workers = self.workers.get_or_init(Workers::start);
        let task = workers.spawn(listen(
            Listener { addr, socket },
            Arc::clone(&self.shared),
            (stop.clone(), deadline),
            sandboxes.grace_period(),
        ));
        Some(Door {
            stop,
            task: AbortOnDropHandle::new(task),
        })
    }

    /// Serves the HTTP service `env.name` (component `pre`) under `env`'s lease from now on,
    /// on its route, through the door open now or next; how its instances are reused, if it
    /// is served. Without `http-addr`, says once that it is not served.
    pub(crate) fn register(
        &self,
        env: &Arc<ServiceEnv>,
        pre: &ProxyPre<S::Data>,
    ) -> Option<InstanceReuse> {
        let sandboxes = &self.shared.sandboxes;
        let limits = sandboxes.limits();
        if limits.addr.is_none() {
            tracing::warn!(
                service = &*env.name,
                "HTTP service not served: http-addr is off"
            );
            return None;
        }
        let name = env.name.to_string();
        let route = sandboxes.route_of(&name);
        let sharing = self.shared.sharing(&name, &route);
        if let Some(first) = sharing.first().filter(|first| **first < name) {
            // The settings refuse two `route`s alike; a default route (`/NAME/...`) can still
            // be another's `route`: the first service by name answers it.
            tracing::error!(service = name, %route, answered_by = first,
                "HTTP service not served: its route is another service's");
            return None;
        }
        let settings = sandboxes.instance_reuse(&name);
        let metrics = env.ops.http_service(&env.name);
        let (handler, reuse) = match pre {
            ProxyPre::P2(pre) => {
                let reuse = InstanceReuse::p2(settings);
                let most = limits.max_concurrent as usize;
                let pool = Pool::new(env, reuse, most, metrics.idle.clone());
                let pre = pre.clone();
                (Handler::P2 { pre, pool }, reuse)
            }
            ProxyPre::P3(pre) => {
                let reuse = InstanceReuse::p3(settings);
                let instances =
                    Concurrent::new(sandboxes, env, pre.clone(), reuse, metrics.clone());
                (Handler::P3(instances), reuse)
            }
        };
        tracing::info!(
            service = name,
            %route,
            max_instance_reuse_count = reuse.max_requests,
            max_instance_concurrent_reuse_count = reuse.max_concurrent,
            "HTTP service routed"
        );
        let entry = Arc::new(Entry {
            route,
            env: Arc::clone(env),
            handler,
            metrics,
            permits: Arc::new(Semaphore::new(limits.max_concurrent as usize)),
            requests: TaskTracker::new(),
        });
        let replaced = self
            .shared
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, entry);
        self.shared.registered.notify_waiters();
        if let Some(old) = replaced {
            self.retired
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(old);
        }
        Some(reuse)
    }

    /// Stops serving the services `names`: their routes go (a request for one is answered
    /// 503 from now on, as for a service another host runs), and each one's calls still
    /// running end. Close the door first when these are the last services of its lease, so
    /// that the connections finish their request in progress under it.
    pub(crate) async fn unregister(&self, names: &[String]) {
        let entries: Vec<Arc<Entry<S>>> = {
            let mut routes = self
                .shared
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut entries: Vec<Arc<Entry<S>>> =
                names.iter().filter_map(|n| routes.remove(n)).collect();
            entries.append(&mut self.retired.lock().unwrap_or_else(PoisonError::into_inner));
            entries
        };
        let bound = self.shared.sandboxes.grace_period() + Duration::from_secs(1);
        for entry in entries {
            entry.handler.close().await;
            entry.requests.close();
            if tokio::time::timeout(bound, entry.requests.wait())
                .await
                .is_err()
            {
                tracing::error!(service = &*entry.env.name, "request handlers did not end");
            }
        }
    }
}
