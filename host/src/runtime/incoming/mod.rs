//! Incoming HTTP (SPEC §10, "Incoming HTTP"): the host's one listener on `http-addr`, open
//! only while a leadership of this host runs HTTP services (a standby does not accept), and
//! the routes of the services it runs.
//!
//! - A leadership registers each HTTP service it starts ([`HttpServer::register`]) with its
//!   environment (lease, deadline, stop signal); the first registration opens the listener
//!   (binding again until the address is free: a stalled former leader may still hold it).
//! - Stopping unregisters first ([`HttpServer::unregister`]): with the last route the
//!   listener closes (stop accepting), open connections finish the request in progress within
//!   the grace period and are dropped after it, then the service's calls still running end
//!   (they are bounded by the grace period too); only then are the services stopped and the
//!   lease released (SPEC §5 order).
//! - `serve`: one request; `body`: its response under the lease.

mod body;
mod serve;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use super::engine::Runtime;
use super::state::{Host, ServiceEnv};
use crate::config::{Route, pick_route};

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

/// What the connections read: the runtime and the routes now.
struct Shared {
    rt: Arc<Runtime>,
    routes: Mutex<BTreeMap<String, Arc<Entry>>>,
}

impl Shared {
    /// The service that answers `path`, if any.
    fn route(&self, path: &str) -> Option<Arc<Entry>> {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        pick_route(routes.values().map(|e| (&e.route, e)), path).map(Arc::clone)
    }
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
}

impl HttpServer {
    pub(crate) fn new(rt: Arc<Runtime>) -> Self {
        Self {
            shared: Arc::new(Shared {
                rt,
                routes: Mutex::default(),
            }),
            listening: Mutex::default(),
        }
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
        let route = rt
            .grants()
            .get(&name)
            .and_then(|g| g.route.clone())
            .unwrap_or_else(|| Route::default_for(&name));
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
        self.shared
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name, entry);
        if listening.is_none() {
            let stop = CancellationToken::new();
            let task = tokio::spawn(listen(
                addr,
                Arc::clone(&self.shared),
                stop.clone(),
                rt.config.grace_period,
            ));
            *listening = Some(Listening {
                stop,
                task: AbortOnDropHandle::new(task),
            });
        }
    }

    /// Stops serving the services `names`: with the last route the listener closes and its
    /// connections drain (grace period); then each one's calls still running end.
    pub(crate) async fn unregister(&self, names: &[String]) {
        let (entries, closing) = {
            let mut listening = self
                .listening
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let mut routes = self
                .shared
                .routes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let entries: Vec<Arc<Entry>> = names.iter().filter_map(|n| routes.remove(n)).collect();
            let closing = if routes.is_empty() {
                listening.take()
            } else {
                None
            };
            (entries, closing)
        };
        if let Some(Listening { stop, mut task }) = closing {
            stop.cancel();
            let _ = (&mut task).await;
        }
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

/// Binds `addr` (again and again while it is taken), then accepts and serves connections
/// until `stop`; then closes the listener first, and lets the connections finish their
/// request in progress within `grace`.
async fn listen(addr: SocketAddr, shared: Arc<Shared>, stop: CancellationToken, grace: Duration) {
    let Some(listener) = bind(addr, &stop).await else {
        return;
    };
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %local, "http listening");
    let closing = CancellationToken::new();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
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
    }
    drop(listener);
    tracing::info!(addr = %local, "http listener closed");
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

/// A listener on `addr`, binding again every [`REBIND_PAUSE`] while it is taken; `None` once
/// stopped.
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
/// is answered.
async fn connection(
    stream: tokio::net::TcpStream,
    shared: Arc<Shared>,
    closing: CancellationToken,
) {
    let service = hyper::service::service_fn(move |req| serve::serve(Arc::clone(&shared), req));
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        () = closing.cancelled() => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}
