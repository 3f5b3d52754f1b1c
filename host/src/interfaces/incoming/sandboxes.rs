//! [`Sandboxes`]: the seam through which incoming HTTP reaches the runtime: a fresh store for
//! each request, the limits and the grace period, the operations' handle, and the routes of
//! the HTTP services loaded (served here or not). The runtime implements it; nothing here
//! knows how a store is made or which services are loaded.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Engine, Store};

use super::limits::IncomingLimits;
use crate::config::{InstanceReuseConfig, Route};
use crate::interfaces::env::ServiceEnv;
use crate::interfaces::view::View;
use crate::ops::Ops;

/// What incoming HTTP takes from the runtime; cheap to clone (a WASI 0.3 service's
/// instances make their stores with a clone).
pub(crate) trait Sandboxes: Clone + Send + Sync + 'static {
    /// The data of a request's store.
    type Data: View;

    /// A fresh sandboxed store on `engine` (the service's component's) for one request of
    /// `env`'s service, with the grants current now.
    ///
    /// # Errors
    /// When the sandbox cannot be made (a granted directory gone, say).
    fn store(&self, engine: &Engine, env: &Arc<ServiceEnv>) -> wasmtime::Result<Store<Self::Data>>;

    /// Where HTTP services are served and the limits on their requests.
    fn limits(&self) -> IncomingLimits;

    /// The most connections open at once: `max-connections`, or by default a share of the
    /// open file limit that leaves the host and the guests theirs.
    fn max_connections(&self) -> usize;

    /// How long a stopped service's calls and connections may go on.
    fn grace_period(&self) -> Duration;

    /// The metrics.
    fn ops(&self) -> &Ops;

    /// The instance reuse settings of service `name` under the grants now: its own over the
    /// host's.
    fn instance_reuse(&self, name: &str) -> InstanceReuseConfig;

    /// The route of service `name` under the grants now: its `route`, or `/NAME/...`.
    fn route_of(&self, name: &str) -> Route;

    /// The loaded services that serve HTTP, with their routes, but those `skip` names.
    fn http_routes(&self, skip: &dyn Fn(&str) -> bool) -> Vec<(String, Route)>;
}
