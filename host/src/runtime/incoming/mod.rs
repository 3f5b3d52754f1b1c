//! Incoming HTTP (SPEC §10, "Incoming HTTP"): the host's one listener on `http-addr`,
//! accepting only while a leadership of this host runs HTTP services (a standby does not
//! accept), and the routes of the services it runs.
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
//! - `serve`: one request; `body`: its response under the lease.

mod body;
mod serve;
mod socket;
mod spin;

pub(crate) use socket::{SharedSocket, other_addresses, share};

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use super::Grants;
use super::engine::Runtime;
use super::live_dir::Catalogue;
use super::state::Host;
use crate::config::{Route, pick_route};
use crate::interfaces::ServiceEnv;

/// How long a failed bind waits before the next try.
const REBIND_PAUSE: Duration = Duration::from_millis(50);

/// One HTTP service being served, during one leadership.
pub(crate) struct Entry {
    /// Where it is served.
    route: Route,
    /// Its environment: lease, deadline, stop signal; every request's store shares it.
    env: Arc<ServiceEnv>,
    /// Its component, pre-instantiated once.
    pre: ProxyPre<Host>,
    /// Its requests in flight at once.
    permits: Arc<Semaphore>,
    /// Its handlers' calls still running.
    requests: TaskTracker,
}

/// What the connections read: the runtime, the catalogue, and the routes served now.
struct Shared {
    rt: Arc<Runtime>,
    /// Every loaded service: a route of an HTTP service not served here is answered 503 (held
    /// by another host under spread placement, or between two leaderships), not 404.
    catalogue: watch::Receiver<Catalogue>,
    routes: Mutex<BTreeMap<String, Arc<Entry>>>,
}

/// Who answers a request's path.
enum Routed {
    /// A service served here now.
    Here(Arc<Entry>),
    /// An HTTP service loaded but not served here now.
    Elsewhere,
    /// No route matches it.
    Nowhere,
}

impl Shared {
    /// Who answers `path`: of the routes of the services served here and of the other HTTP
    /// services loaded, the most specific match (the first service by name among equals).
    fn route(&self, path: &str) -> Routed {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let catalogue = self.catalogue.borrow();
        let grants = self.rt.grants();
        let served = routes
            .iter()
            .map(|(name, e)| (Cow::Borrowed(&e.route), name.as_str()));
        let others = catalogue
            .values()
            .filter(|s| s.serves_http() && !routes.contains_key(&s.name))
            .map(|s| (Cow::Owned(route_of(&grants, &s.name)), s.name.as_str()));
        match pick_route(served.chain(others), path) {
            None => Routed::Nowhere,
            Some(name) => routes
                .get(name)
                .map_or(Routed::Elsewhere, |e| Routed::Here(Arc::clone(e))),
        }
    }

    /// The services other than `name` that have `route`, served here or not.
    fn sharing(&self, name: &str, route: &Route) -> Vec<String> {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let grants = self.rt.grants();
        let mut names: Vec<String> = self
            .catalogue
            .borrow()
            .values()
            .filter(|s| s.serves_http() && s.name != name)
            .filter(|s| {
                routes
                    .get(&s.name)
                    .map_or_else(|| route_of(&grants, &s.name), |e| e.route.clone())
                    == *route
            })
            .map(|s| s.name.clone())
            .collect();
        names.sort();
        names
    }
}

/// The route of service `name` under `grants`: its `route`, or `/NAME/...`.
fn route_of(grants: &HashMap<String, Grants>, name: &str) -> Route {
    grants
        .get(name)
        .and_then(|g| g.route.clone())
        .unwrap_or_else(|| Route::default_for(name))
}

/// The listener while it is open: its task accepts and serves connections until `stop`.
struct Listening {
    stop: CancellationToken,
    task: AbortOnDropHandle<()>,
}

/// The host's HTTP server: the routes of the HTTP services running now, and the listener.
pub(crate) struct HttpServer {
    shared: Arc<Shared>,
    listening: Mutex<Option<Listening>>,
    /// Services whose route a new version took over, with calls maybe still running: the
    /// next [`HttpServer::unregister`] waits for them too.
    retired: Mutex<Vec<Arc<Entry>>>,
    /// `http-addr`'s socket, shared with the other hosts of this machine, once it is got;
    /// without it each leadership binds the address itself.
    socket: std::sync::OnceLock<SharedSocket>,
    /// Reads the shared socket's queue into `/metrics` while it is held.
    queue_gauge: Mutex<Option<AbortOnDropHandle<()>>>,
}

impl HttpServer {
    /// Serves the HTTP services of `catalogue` that a leadership of this host registers.
    pub(crate) fn new(rt: Arc<Runtime>, catalogue: watch::Receiver<Catalogue>) -> Self {
        Self {
            shared: Arc::new(Shared {
                rt,
                catalogue,
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
                    shared.rt.ops.http_listen_queue(depth);
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
    pub(crate) fn register(&self, env: &Arc<ServiceEnv>, pre: &ProxyPre<Host>) {
        let rt = &self.shared.rt;
        let Some(addr) = rt.config.incoming_http.addr else {
            tracing::warn!(
                service = &*env.name,
                "HTTP service not served: http-addr is off"
            );
            return;
        };
        let name = env.name.to_string();
        let route = route_of(&rt.grants(), &name);
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
            permits: Arc::new(Semaphore::new(
                rt.config.incoming_http.max_concurrent as usize,
            )),
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
                rt.config.grace_period,
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
        let entries: Vec<Arc<Entry>> = {
            let mut routes = self
                .shared
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut entries: Vec<Arc<Entry>> =
                names.iter().filter_map(|n| routes.remove(n)).collect();
            entries.append(&mut self.retired.lock().unwrap_or_else(PoisonError::into_inner));
            entries
        };
        let bound = self.shared.rt.config.grace_period + Duration::from_secs(1);
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

/// Where a leadership accepts: the shared socket, or `addr` bound here.
struct Listener {
    addr: SocketAddr,
    /// A descriptor of the machine's shared socket, if it is shared.
    socket: Option<std::net::TcpListener>,
}

/// Accepts and serves connections until `stop`, or, for new connections, until `deadline`
/// passes; then lets the connections finish their request in progress within `grace`. On a
/// shared socket, what is queued is left for the next leader; an own listener (bound here,
/// again and again while the address is taken) is closed first, and the connections the
/// kernel completed before the close are taken and answered.
async fn listen(
    listener: Listener,
    shared: Arc<Shared>,
    (stop, deadline): (CancellationToken, crate::lease::LeaseDeadline),
    grace: Duration,
) {
    let Listener { addr, socket } = listener;
    let shared_socket = socket.is_some();
    let listener = match socket {
        Some(socket) => match TcpListener::from_std(socket) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(%addr, error = %e, "http-addr's shared socket cannot be used");
                return;
            }
        },
        None => match bind(addr, &stop).await {
            Some(listener) => listener,
            None => return,
        },
    };
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %local, shared = shared_socket, "http listening");
    let closing = CancellationToken::new();
    let mut connections = JoinSet::new();
    let passed = deadline.passed();
    tokio::pin!(passed);
    // Whether the loop ended at the stop (else at the deadline, said when it came).
    let stopped = loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break true,
            // Before the accept: a leader resumed after its deadline takes nothing more from
            // the shared queue, which is its successor's. (A socket of its own it keeps until
            // the stop: nobody else can take from it, and what it accepts past the deadline is
            // answered 503.)
            () = &mut passed, if shared_socket => {
                tracing::warn!(addr = %local, "http accepting stopped: the lease deadline passed");
                break false;
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.rt.ops.http_connection_accepted();
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(stream, Arc::clone(&shared), closing.clone()));
                }
                Err(e) => {
                    // Out of descriptors, say: the next accept may work.
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(REBIND_PAUSE).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    };
    if shared_socket {
        // The queue is the next leader's: this host only stops taking from it.
        drop(listener);
        if stopped {
            tracing::info!(addr = %local, "http accepting stopped");
        }
    } else {
        // Connections the kernel completed before the close are taken and answered, not
        // reset.
        if let Ok(listener) = listener.into_std() {
            while let Ok((stream, _)) = listener.accept() {
                if let Ok(stream) = stream
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpStream::from_std(stream))
                {
                    connections.spawn(connection(stream, Arc::clone(&shared), closing.clone()));
                }
            }
        }
        tracing::info!(addr = %local, "http listener closed");
    }
    closing.cancel();
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    });
    if drained.await.is_err() {
        tracing::warn!(
            ?grace,
            "http connections still open after the grace period: dropped"
        );
    }
    connections.shutdown().await;
}

/// A listener on `addr`, bound again every [`REBIND_PAUSE`] while taken; `None` once stopped.
async fn bind(addr: SocketAddr, stop: &CancellationToken) -> Option<TcpListener> {
    let mut said = false;
    loop {
        let bound = (|| {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            // A former leader's connections in TIME_WAIT must not keep the address.
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        })();
        match bound {
            Ok(listener) => return Some(listener),
            Err(e) if !said => {
                tracing::warn!(%addr, error = %e, "http-addr taken; binding again until it is free");
                said = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(REBIND_PAUSE) => {}
        }
    }
}

/// Serves one connection until it ends, or, once `closing`, until its request in progress
/// is answered. A connection that waits longer than the idle timeout for a request's head
/// (idle between requests, or a head sent slowly) is closed; a head over the limit is
/// answered 431.
async fn connection(
    stream: tokio::net::TcpStream,
    shared: Arc<Shared>,
    closing: CancellationToken,
) {
    let limits = shared.rt.config.incoming_http;
    let asked = Arc::new(Notify::new());
    let first = Arc::clone(&asked);
    let client = stream.peer_addr().ok();
    let service = hyper::service::service_fn(move |req| {
        first.notify_one();
        serve::serve(Arc::clone(&shared), req, client)
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_header_size(limits.max_header_bytes)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut asked_once = false;
    tokio::select! {
        _ = conn.as_mut() => return,
        () = asked.notified() => asked_once = true,
        () = closing.cancelled() => {}
    }
    if !closing.is_cancelled() {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = closing.cancelled() => {}
        }
    }
    if !asked_once {
        // A connection just accepted: its first request is read and answered (bounded by
        // the idle timeout), so a client the host took is never turned away unanswered.
        tokio::select! {
            _ = conn.as_mut() => return,
            () = asked.notified() => {}
        }
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}
