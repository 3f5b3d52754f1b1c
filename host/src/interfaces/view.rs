//! [`Interfaces`], one instance's share of its store's state that the interfaces read and
//! change, and [`View`], how the runtime's store data hands it out. Each package implements
//! its WIT on `Interfaces` (or on a part of it, as `wasi_config` on the configuration).

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime_wasi_http::WasiHttpCtx;

use super::env::ServiceEnv;
use super::keyvalue::access::KvAccess;
use super::outgoing::{HttpPolicy, OutgoingHttp};
use super::wasi_config::ServiceConfig;

/// One instance's share of its store's state that the interfaces read and change: its
/// service's environment, its resource table (buckets, pollables, streams), its key-value
/// access, its configuration and its outgoing HTTP.
pub(crate) struct Interfaces {
    /// What this instance's service shares with its other instances.
    pub env: Arc<ServiceEnv>,
    /// The store's resources.
    pub table: ResourceTable,
    /// Its key-value limits and buckets.
    pub kv: KvAccess,
    /// What `wasi:config/store` answers.
    pub config: ServiceConfig,
    /// Its outgoing HTTP: where requests may go, and how each is sent and fenced.
    pub http: OutgoingHttp,
    /// `wasmtime-wasi-http`'s own state.
    pub http_ctx: WasiHttpCtx,
}

impl Interfaces {
    /// The state of an instance of `env`'s service with key-value `access`, configuration
    /// `config` and outgoing `http` policy, and `table`.
    pub(crate) fn new(
        env: &Arc<ServiceEnv>,
        table: ResourceTable,
        kv: KvAccess,
        config: ServiceConfig,
        http: Arc<HttpPolicy>,
    ) -> Self {
        Self {
            env: Arc::clone(env),
            table,
            kv,
            config,
            http: OutgoingHttp::new(
                &env.name,
                &env.lease,
                env.deadline.clone(),
                env.ops.clone(),
                http,
                Arc::clone(&env.outgoing),
            ),
            http_ctx: WasiHttpCtx::new(),
        }
    }
}

/// A store's data that holds an instance's [`Interfaces`].
pub(crate) trait View: wasmtime_wasi_http::WasiHttpView + Send + 'static {
    /// The instance's interfaces' state.
    fn interfaces(&mut self) -> &mut Interfaces;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The state of an instance of `env`'s service with key-value `access`, no configuration
    /// and no outgoing HTTP.
    pub(crate) fn interfaces(env: &Arc<ServiceEnv>, access: KvAccess) -> Interfaces {
        Interfaces::new(
            env,
            ResourceTable::new(),
            access,
            ServiceConfig::default(),
            Arc::default(),
        )
    }
}
