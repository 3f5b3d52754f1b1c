//! The interfaces guests call (SPEC §7, §10): one host implementation per WIT package, each
//! against a narrow seam from the runtime: the service's environment and its per-call fence
//! (`env`), and one instance's share of the store's state (`Interfaces`, which the
//! runtime's store data holds and hands out through `View`); and incoming HTTP, the trigger
//! that calls a guest's handler per request, against the runtime's `incoming::Sandboxes`.
//! Nothing here makes a store or links a component: that is the runtime's, which links these
//! (`add_to_linker`) and gives incoming HTTP a fresh store per request.
//!
//! - `env`: `ServiceEnv`, what a service's instances share during one leadership, and the
//!   fence: `ServiceEnv::fence`, failing with `Fenced`.
//! - `body`: an HTTP body under the lease, incoming and outgoing alike.
//! - `output`: guest stdout and stderr, the lines it logs and the problems it reports, as
//!   host log lines (`wasi:cli` streams; used by `vvm`).
//! - `bindings`: the host side of the WIT packages, generated from `wit/`.
//! - `vvm`: `vvm:host/lease` and `vvm:host/log`.
//! - `keyvalue`: guest key-value (`wasi:keyvalue` draft2 and draft, `vvm:host/kv`): buckets,
//!   the fence, the limits.
//! - `wasi_config`: `wasi:config/store` (three versions) over a service's configuration.
//! - `spin`: Spin's `fermyon:spin/key-value` and `variables` (2.0.0); `spin3`: their 3.0.0
//!   versions (WASI 0.3, async); `stubs`: what a component imports that vvm-host does not
//!   offer (Spin's outbound interfaces, WASI 0.3's files and sockets), linked to trap.
//! - `outgoing`: outgoing `wasi:http`: the allow-list, the address guard, our connector, the
//!   fence around each exchange, the fencing-token headers, the limits.
//! - `view`: `Interfaces` and `View`.
//! - `incoming`: incoming `wasi:http`: the socket of `http-addr`, shared by the hosts of a
//!   machine (accepted from only while leading), routes, a store per request (made by the
//!   runtime, through the seam `incoming::Sandboxes`), responses under the lease.
//!
//! Each package links itself here (`add_to_linker`); incoming HTTP is a trigger, not an
//! import, and links nothing. Dependencies point one way, in this order (each uses only
//! modules before it): `keyvalue`'s `access`, `env`, `body`, `output`, `bindings`,
//! `wasi_config`, `outgoing`, `view`, `vvm`, `keyvalue`, `spin`, `spin3`, `stubs`, `incoming`.

pub(crate) mod bindings;
pub(crate) mod body;
pub(crate) mod env;
pub(crate) mod incoming;
pub(crate) mod keyvalue;
pub(crate) mod outgoing;
pub(crate) mod output;
pub(crate) mod spin;
pub(crate) mod spin3;
pub(crate) mod stubs;
pub(crate) mod wasi_config;

mod view;
mod vvm;

pub use incoming::{Forwarding, IncomingLimits, InstanceReuse};
pub use keyvalue::access::KvLimits;
pub use outgoing::{HttpPolicy, LEASE_HEADER, OutgoingLimits, TOKEN_HEADER};
pub use wasi_config::ServiceConfig;

pub(crate) use env::{Fenced, ServiceEnv};
pub(crate) use view::{Interfaces, View};

use wasmtime::component::{HasSelf, Linker};
use wasmtime_wasi_config::WasiConfig;

use bindings::config_2024::wasi::config::store as config_2024;
use bindings::service::vvm::host::{kv, lease, log};
use bindings::service::wasi::config::store as config;
use bindings::service::wasi::keyvalue::{atomics, batch, store};
use bindings::spin::fermyon::spin::{key_value as spin_kv, variables as spin_variables};
use bindings::spin_cron::fermyon::spin_cron::cron_types as spin_cron_types;

/// Adds the packages implemented here to `linker`, but for the async ones
/// ([`add_concurrent_to_linker`]): `vvm:host`, both `wasi:keyvalue` versions, the three
/// `wasi:config/store` versions, Spin's key-value and variables 2.0.0, and our
/// `wasi:http/outgoing-handler` `handle` (after wasmtime-wasi-http's own `types`, which it
/// shadows). One linker serves every component, and a component's pre-instantiation takes
/// only what it imports: a package costs nothing to a component that does not import it.
///
/// # Errors
/// When the linker already has one of them.
pub(crate) fn add_to_linker<T: View>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    lease::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    log::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    kv::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    store::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    atomics::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    batch::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    keyvalue::add_draft_to_linker(linker)?;
    config::add_to_linker::<_, HasSelf<ServiceConfig>>(linker, |t| &mut t.interfaces().config)?;
    config_2024::add_to_linker::<_, HasSelf<ServiceConfig>>(linker, |t| {
        &mut t.interfaces().config
    })?;
    wasmtime_wasi_config::add_to_linker(linker, |t| {
        WasiConfig::from(t.interfaces().config.variables())
    })?;
    spin_kv::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    spin_variables::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    // Types only: what a Spin cron component's handler takes and answers.
    spin_cron_types::add_to_linker::<_, HasSelf<Interfaces>>(linker, T::interfaces)?;
    outgoing::link_handle(linker, |t| &mut t.interfaces().http)
}

/// Adds the packages implemented here whose functions are async (they need an engine with
/// wasmtime's concurrency support): Spin's key-value and variables 3.0.0.
///
/// # Errors
/// When the linker already has one of them.
pub(crate) fn add_concurrent_to_linker<T: View>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    spin3::add_to_linker(linker)
}
