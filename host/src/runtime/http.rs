//! The runtime's side of incoming HTTP (`crate::interfaces::incoming`): [`RequestSandboxes`]
//! implements its seam, [`Sandboxes`], with the runtime's store per request, limits, grace
//! period and grants, and the live catalogue's HTTP services.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use wasmtime::{Engine, Store};

use super::Grants;
use super::engine::Runtime;
use super::imports::new_store;
use super::live_dir::Catalogue;
use super::state::Host;
use crate::config::{InstanceReuseConfig, Route};
use crate::interfaces::incoming::{self, Sandboxes};
use crate::interfaces::{IncomingLimits, ServiceEnv};
use crate::ops::Ops;

/// The host's HTTP server, over the runtime's stores.
pub(crate) type HttpServer = incoming::HttpServer<RequestSandboxes>;

/// What incoming HTTP takes from the runtime: its stores, configuration and grants, and the
/// catalogue of loaded services (a route of an HTTP service not served here is answered 503,
/// held by another host under spread placement or between two leaderships, not 404).
#[derive(Clone)]
pub(crate) struct RequestSandboxes {
    rt: Arc<Runtime>,
    catalogue: watch::Receiver<Catalogue>,
}

impl RequestSandboxes {
    /// The sandboxes of `rt` for the HTTP services of `catalogue`.
    pub(crate) fn new(rt: Arc<Runtime>, catalogue: watch::Receiver<Catalogue>) -> Self {
        Self { rt, catalogue }
    }
}

impl Sandboxes for RequestSandboxes {
    type Data = Host;

    fn store(&self, engine: &Engine, env: &Arc<ServiceEnv>) -> wasmtime::Result<Store<Host>> {
        new_store(&self.rt, engine, env, &[]).map(|(store, _)| store)
    }

    fn limits(&self) -> IncomingLimits {
        self.rt.config.incoming_http
    }

    fn max_connections(&self) -> usize {
        usize::try_from(self.rt.max_connections).unwrap_or(usize::MAX)
    }

    fn grace_period(&self) -> Duration {
        self.rt.config.grace_period
    }

    fn ops(&self) -> &Ops {
        &self.rt.ops
    }

    fn instance_reuse(&self, name: &str) -> InstanceReuseConfig {
        let own = self.rt.grants().get(name).map(|g| g.instance_reuse);
        own.unwrap_or_default()
            .over(self.rt.config.incoming_http.instance_reuse)
    }

    fn route_of(&self, name: &str) -> Route {
        route_of(&self.rt.grants(), name)
    }

    fn http_routes(&self, skip: &dyn Fn(&str) -> bool) -> Vec<(String, Route)> {
        let grants = self.rt.grants();
        self.catalogue
            .borrow()
            .values()
            .filter(|s| s.serves_http() && !skip(&s.name))
            .map(|s| (s.name.clone(), route_of(&grants, &s.name)))
            .collect()
    }
}

/// The route of service `name` under `grants`: its `route`, or `/NAME/...`.
fn route_of(grants: &HashMap<String, Grants>, name: &str) -> Route {
    grants
        .get(name)
        .and_then(|g| g.route.clone())
        .unwrap_or_else(|| Route::default_for(name))
}
