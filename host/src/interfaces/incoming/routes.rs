//! The routes served now (SPEC §10, "Incoming HTTP"): each HTTP service a leadership serves
//! here ([`Entry`]), and who answers a request's path among them and the other HTTP services
//! loaded ([`Shared::route`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, Semaphore};
use tokio_util::task::TaskTracker;
use wasmtime_wasi_http::p2::bindings::ProxyPre;

use super::concurrent::Concurrent;
use super::connections::Connections;
use super::forward::Forwarder;
use super::pool::{Instance, Pool};
use super::sandboxes::Sandboxes;
use crate::config::{Route, pick_route};
use crate::interfaces::env::ServiceEnv;
use crate::ops::ServiceHttpMetrics;

/// One HTTP service being served, during one leadership, in `S`'s stores.
pub(super) struct Entry<S: Sandboxes> {
    /// Where it is served.
    pub route: Route,
    /// Its environment: lease, deadline, stop signal; every request's store shares it.
    pub env: Arc<ServiceEnv>,
    /// Its component, and its instances.
    pub handler: Handler<S>,
    /// Its series of `/metrics`, resolved.
    pub metrics: ServiceHttpMetrics,
    /// Its requests in flight at once.
    pub permits: Arc<Semaphore>,
    /// Its handlers' calls still running.
    pub requests: TaskTracker,
}

/// How a service's requests reach its component.
pub(super) enum Handler<S: Sandboxes> {
    /// WASI 0.2: a call per request, on an instance of its own (kept for later requests by
    /// the pool, as its reuse allows).
    P2 {
        /// Its component, pre-instantiated once.
        pre: ProxyPre<S::Data>,
        /// Its instances waiting for their next request.
        pool: Arc<Pool<Instance<S::Data>>>,
    },
    /// WASI 0.3: instances that take several requests at once.
    P3(Concurrent<S>),
}

impl<S: Sandboxes> Handler<S> {
    /// Its instances take no request from now on; returns when the idle ones are gone (and,
    /// for WASI 0.3, when the others have ended, within the grace period).
    pub(super) async fn close(&self) {
        match self {
            Self::P2 { pool, .. } => pool.close(),
            Self::P3(instances) => instances.close().await,
        }
    }
}

/// The routes of `S`'s services.
pub(super) type Routes<S> = BTreeMap<String, Arc<Entry<S>>>;

/// What the connections read: the runtime's side (with the HTTP services loaded: a route of
/// one not served here is answered 503, held by another host under spread placement or
/// between two leaderships, not 404), and the routes served now.
pub(super) struct Shared<S: Sandboxes> {
    pub sandboxes: S,
    pub routes: Mutex<Routes<S>>,
    /// Woken when a route is registered (a request waiting for its service's holder may find
    /// it here).
    pub registered: Notify,
    /// How requests for services other hosts hold are forwarded, if they are.
    pub forwarder: Option<Forwarder>,
    /// The connections open, at most `max-connections`.
    pub connections: Arc<Connections>,
}

/// Who answers a request's path.
pub(super) enum Routed<S: Sandboxes> {
    /// A service served here now.
    Here(Arc<Entry<S>>),
    /// An HTTP service loaded but not served here now: its name.
    Elsewhere(String),
    /// No route matches it.
    Nowhere,
}

impl<S: Sandboxes> Shared<S> {
    /// Who answers `path`: of the routes of the services served here and of the other HTTP
    /// services loaded, the most specific match (the first service by name among equals).
    pub(super) fn route(&self, path: &str) -> Routed<S> {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let others = self
            .sandboxes
            .http_routes(&|name| routes.contains_key(name));
        let served = routes.iter().map(|(name, e)| (&e.route, name.as_str()));
        let others = others.iter().map(|(name, route)| (route, name.as_str()));
        match pick_route(served.chain(others), path) {
            None => Routed::Nowhere,
            Some(name) => routes.get(name).map_or_else(
                || Routed::Elsewhere(name.to_owned()),
                |e| Routed::Here(Arc::clone(e)),
            ),
        }
    }

    /// The services other than `name` that have `route`, served here or not.
    pub(super) fn sharing(&self, name: &str, route: &Route) -> Vec<String> {
        let routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
        let mut names: Vec<String> = (self.sandboxes.http_routes(&|other| other == name))
            .into_iter()
            .filter(|(other, theirs)| routes.get(other).map_or(theirs, |e| &e.route) == route)
            .map(|(other, _)| other)
            .collect();
        names.sort();
        names
    }
}
