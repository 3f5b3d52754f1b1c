//! Incoming HTTP (SPEC §10, "Incoming HTTP"): the host's one listener on `http-addr`,
//! accepting only while a leadership of this host runs HTTP services (a standby does not
//! accept), and the routes of the services it runs. It reaches the runtime only through
//! [`Sandboxes`] (a store per request, the limits, the HTTP services loaded), which the
//! runtime implements.
//!
//! - The listening socket is the machine's hosts' together (`socket`): got once, when the host
//!   starts ([`HttpServer::share`]), from systemd or from a host holding it, or bound. Where
//!   it cannot be shared, each leadership binds the address itself (again and again while it
//!   is taken: a stalled former leader may still hold it).
//! - A leadership registers each HTTP service it starts ([`HttpServer::register`]) with its
//!   environment (lease, deadline, stop signal); the first registration starts accepting. On
//!   the shared socket accepting stops at once when the lease deadline passes (a leader
//!   resumed after a SIGSTOP takes nothing more from the queue; what it took is answered 503).
//! - Stopping unregisters first ([`HttpServer::unregister`]): with the last route accepting
//!   stops (on a shared socket what is queued waits for the next leader; an own listener
//!   closes), open connections finish the request in progress within the grace period and are
//!   dropped after it, then the service's calls still running end (bounded by the grace period
//!   too); only then are the services stopped and the lease released (SPEC §5 order).
//! - `limits`: [`IncomingLimits`]; `sandboxes`: the seam; `routes`: the routes served now;
//!   `listen`: a leadership's listener and its connections; `serve`: one request; `body`: its
//!   response under the lease; `spin`: Spin's request headers.
//!
//! Dependencies point one way, in this order (each uses only modules before it): `limits`,
//! `socket`, `spin`, `body`, `sandboxes`, `routes`, `serve`, `listen`.

mod body;
mod limits;
mod listen;
mod routes;
mod sandboxes;
mod serve;
mod socket;
mod spin;

pub use limits::IncomingLimits;

pub(crate) use sandboxes::Sandboxes;
pub(crate) use socket::{SharedSocket, other_addresses, share};

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use self::listen::{Listener, listen};
use self::routes::{Entry, Shared};
use crate::interfaces::env::ServiceEnv;

/// The listener while it is open: its task accepts and serves connections until `stop`.
struct Listening {
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

/// The host's HTTP server: the routes of the HTTP services running now, and the listener;
/// the runtime's side `S`.
pub(crate) struct HttpServer<S: Sandboxes> {
    shared: Arc<Shared<S>>,
    listening: Mutex<Option<Listening>>,
    /// Services whose route a new version took over, with calls maybe still running: the
    /// next [`HttpServer::unregister`] waits for them too.
    retired: Mutex<Vec<Arc<Entry<S::Data>>>>,
    /// `http-addr`'s socket, shared with the other hosts of this machine, once it is got;
    /// without it each leadership binds the address itself.
    socket: std::sync::OnceLock<SharedSocket>,
    /// Reads the shared socket's queue into `/metrics` while it is held.
    queue_gauge: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl<S: Sandboxes> HttpServer<S> {
    /// Serves the HTTP services that a leadership of this host registers, through
    /// `sandboxes`.
    pub(crate) fn new(sandboxes: S) -> Self {
        Self {
            shared: Arc::new(Shared {
                sandboxes,
                routes: Mutex::default(),
            }),
            listening: Mutex::default(),
            retired: Mutex::default(),
            socket: std::sync::OnceLock::new(),
            queue_gauge: Mutex::default(),
        }
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
                loop {
                    every.tick().await;
                    let depth = socket::queue_depth(std::os::fd::AsFd::as_fd(&socket));
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

    /// Serves the HTTP service `env.name` (component `pre`) under `env`'s lease from now on,
    /// on its route; opens the listener if it is the first. Without `http-addr`, says once
    /// that it is not served.
    pub(crate) fn register(&self, env: &Arc<ServiceEnv>, pre: &ProxyPre<S::Data>) {
        let sandboxes = &self.shared.sandboxes;
        let limits = sandboxes.limits();
        let Some(addr) = limits.addr else {
            tracing::warn!(
                service = &*env.name,
                "HTTP service not served: http-addr is off"
            );
            return;
        };
        let name = env.name.to_string();
        let route = sandboxes.route_of(&name);
        let sharing = self.shared.sharing(&name, &route);
        if let Some(first) = sharing.first().filter(|first| **first < name) {
            // The settings refuse two `route`s alike; a default route (`/NAME/...`) can still
            // be another's `route`: the first service by name answers it.
            tracing::error!(service = name, %route, answered_by = first,
                "HTTP service not served: its route is another service's");
            return;
        }
        tracing::info!(service = name, %route, "HTTP service routed");
        let entry = Arc::new(Entry {
            route,
            env: Arc::clone(env),
            pre: pre.clone(),
            permits: Arc::new(Semaphore::new(limits.max_concurrent as usize)),
            requests: TaskTracker::new(),
        });
        // Both locks in this order everywhere: a route is never there without a listener.
        let mut listening = self
            .listening
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let replaced = self
            .shared
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, entry);
        if let Some(old) = replaced {
            self.retired
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(old);
        }
        if listening.is_none() {
            let stop = CancellationToken::new();
            let socket = match self.socket.get().map(SharedSocket::accepting) {
                Some(Ok(socket)) => Some(socket),
                Some(Err(e)) => {
                    tracing::error!(error = %e, "http-addr's shared socket cannot be used; binding it here");
                    None
                }
                None => None,
            };
            let task = tokio::spawn(listen(
                Listener { addr, socket },
                Arc::clone(&self.shared),
                (stop.clone(), env.deadline.clone()),
                sandboxes.grace_period(),
            ));
            *listening = Some(Listening {
                stop,
                task: AbortOnDropHandle::new(task),
            });
        }
    }

    /// Stops serving the services `names`. When they are the last, the listener closes first,
    /// with their routes still there: the connections finish their request in progress within
    /// the grace period, under the lease (a client it accepted gets its answer, never a 503 of
    /// the host's). Then the routes go, and each one's calls still running end.
    pub(crate) async fn unregister(&self, names: &[String]) {
        let closing = {
            let mut listening = self
                .listening
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let routes = self
                .shared
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if routes.keys().all(|n| names.contains(n)) {
                listening.take()
            } else {
                None
            }
        };
        if let Some(Listening { stop, mut task }) = closing {
            stop.cancel();
            let _ = (&mut task).await;
        }
        let entries: Vec<Arc<Entry<S::Data>>> = {
            let mut routes = self
                .shared
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut entries: Vec<Arc<Entry<S::Data>>> =
                names.iter().filter_map(|n| routes.remove(n)).collect();
            entries.append(&mut self.retired.lock().unwrap_or_else(PoisonError::into_inner));
            entries
        };
        let bound = self.shared.sandboxes.grace_period() + Duration::from_secs(1);
        for entry in entries {
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
