//! The linker and the making of a store (SPEC §6, §7, §10): WASI 0.2 and `wasi:http`'s types
//! (wasmtime's), the packages of `interfaces`, and the fence's shadows of WASI; a fresh
//! sandboxed store per instance. Every call into the host is fenced by the local lease
//! deadline (`fence`). The state the calls read is in `state`.

use std::sync::Arc;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Engine, Store, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};

use super::config::Grants;
use super::engine::{self, Engines, Runtime, Wasm};
use super::state::Host;
use super::{RuntimeConfig, RuntimeError, fence};
use crate::interfaces::keyvalue::access::KvAccess;
use crate::interfaces::output::{LogOutput, Stdio};
use crate::interfaces::{self, Fenced, Interfaces, ServiceEnv};

/// The engines of `config` and their linkers ([`Engines`]).
///
/// The plain engine's linker: WASI 0.2, `vvm:host`, `wasi:keyvalue` (`@0.2.0-draft2` and
/// `@0.2.0-draft`), `wasi:config/store` (`@0.2.0-draft` and `@0.2.0-rc.1`), Spin's 2.0.0
/// interfaces and `wasi:http` (`types` and `outgoing-handler`, denied by default). The
/// concurrent engine's: all that, and WASI 0.3 (SPEC §12): `wasi:cli`, `wasi:clocks`,
/// `wasi:random` and `wasi:http` (`types` and `client`, through the same hooks as 0.2's
/// outgoing handler), also under the names of the release candidate whose types are 0.3.0's
/// ([`RC`]), and Spin's 3.x interfaces. WASI 0.3's files and sockets are not linked: their
/// writes happen outside any host call the fence sees (`interfaces::stubs`).
pub(crate) fn engines(config: &RuntimeConfig) -> Result<Engines, RuntimeError> {
    let wasm = |concurrent| -> Result<Wasm, RuntimeError> {
        let engine = engine::build(config, concurrent)?;
        let mut linker = Linker::new(&engine);
        add_imports(&mut linker, concurrent).map_err(RuntimeError::Engine)?;
        Ok(Wasm { engine, linker })
    };
    Ok(Engines {
        plain: wasm(false)?,
        concurrent: wasm(true)?,
    })
}

fn add_imports(linker: &mut Linker<Host>, concurrent: bool) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    if concurrent {
        wasmtime_wasi::p3::cli::add_to_linker(linker)?;
        wasmtime_wasi::p3::clocks::add_to_linker(linker)?;
        wasmtime_wasi::p3::random::add_to_linker(linker)?;
        wasmtime_wasi_http::p3::add_to_linker(linker)?;
        add_release_candidate(linker)?;
        interfaces::add_concurrent_to_linker(linker)?;
    }
    interfaces::add_to_linker(linker)?;
    fence::shadow(linker)
}

/// The release candidate of WASI 0.3 that Spin's Python SDK imports beside 0.3.0. A
/// prerelease version never matches another, so its names are defined here, by the 0.3.0
/// implementation: its types are 0.3.0's (compared with the SDK's WIT; its `wasi:cli/exit`
/// lacks `exit-with-code`, which a component of it never calls). Its files and sockets are
/// stubs, as 0.3.0's are.
pub(crate) const RC: &str = "0.3.0-rc-2026-03-15";

fn add_release_candidate(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView as _};
    use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView as _};
    use wasmtime_wasi::p3::bindings as wasi;
    use wasmtime_wasi::random::{WasiRandom, WasiRandomView as _};
    use wasmtime_wasi_http::WasiHttpView as _;
    use wasmtime_wasi_http::p3::bindings::http;
    macro_rules! rc {
        ($($interface:literal: $module:path, $data:ty, $get:expr;)*) => {$({
            let mut instance = linker.instance(&format!(concat!($interface, "@{}"), RC))?;
            {
                use $module as m;
                m::add_to_linker_instance::<Host, $data>(&mut instance, $get)?;
            }
        })*};
    }
    rc! {
        "wasi:http/types": http::types, wasmtime_wasi_http::WasiHttp, Host::http;
        "wasi:http/client": http::client, wasmtime_wasi_http::WasiHttp, Host::http;
        "wasi:cli/environment": wasi::cli::environment, WasiCli, Host::cli;
        "wasi:cli/exit": wasi::cli::exit, WasiCli, Host::cli;
        "wasi:cli/stdin": wasi::cli::stdin, WasiCli, Host::cli;
        "wasi:cli/stdout": wasi::cli::stdout, WasiCli, Host::cli;
        "wasi:cli/stderr": wasi::cli::stderr, WasiCli, Host::cli;
        "wasi:cli/terminal-input": wasi::cli::terminal_input, WasiCli, Host::cli;
        "wasi:cli/terminal-output": wasi::cli::terminal_output, WasiCli, Host::cli;
        "wasi:cli/terminal-stdin": wasi::cli::terminal_stdin, WasiCli, Host::cli;
        "wasi:cli/terminal-stdout": wasi::cli::terminal_stdout, WasiCli, Host::cli;
        "wasi:cli/terminal-stderr": wasi::cli::terminal_stderr, WasiCli, Host::cli;
        "wasi:clocks/types": wasi::clocks::types, WasiClocks, Host::clocks;
        "wasi:clocks/monotonic-clock": wasi::clocks::monotonic_clock, WasiClocks, Host::clocks;
        "wasi:clocks/system-clock": wasi::clocks::system_clock, WasiClocks, Host::clocks;
        "wasi:random/random": wasi::random::random, WasiRandom, Host::random;
        "wasi:random/insecure": wasi::random::insecure, WasiRandom, Host::random;
        "wasi:random/insecure-seed": wasi::random::insecure_seed, WasiRandom, Host::random;
    }
    Ok(())
}

/// A fresh store on `engine` (its component's) for one instance of the service `env` on
/// `rt`: its own WASI context (with
/// only what its grants allow as they are now, and the environment variables `more` beside
/// its granted ones), memory cap, at most its handle cap of handles, the per-call fence, and an
/// epoch deadline that yields every tick and traps once the lease deadline has passed. With
/// the store, the handle cap, for the reason of a failure at it.
pub(crate) fn new_store(
    rt: &Runtime,
    engine: &Engine,
    env: &Arc<ServiceEnv>,
    more: &[(&str, String)],
) -> wasmtime::Result<(Store<Host>, usize)> {
    // The grants as they are now: a re-read configuration applies from the next instance.
    let all = rt.grants();
    let grants = all.get(&*env.name);
    let handle_cap = rt.handle_cap(&env.name, &all);
    let config = &rt.config;
    let mut table = ResourceTable::new();
    table.set_max_capacity(handle_cap);
    let host = Host {
        wasi: wasi_ctx(env, grants, more)?,
        limits: StoreLimitsBuilder::new()
            .memory_size(config.memory_cap)
            .trap_on_grow_failure(true)
            .build(),
        interfaces: Interfaces::new(
            env,
            table,
            KvAccess {
                limits: Grants::kv_limits(grants, config.kv),
                buckets: grants
                    .map(|g| Arc::clone(&g.kv_buckets))
                    .unwrap_or_default(),
            },
            grants.map(|g| g.config.clone()).unwrap_or_default(),
            grants.map(|g| Arc::clone(&g.http)).unwrap_or_default(),
        ),
    };
    let mut store = Store::new(engine, host);
    store.limiter(|h| &mut h.limits);
    fence::install(&mut store);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|cx| {
        if cx.data().env().deadline.has_passed() {
            return Err(Fenced::new("running").into());
        }
        Ok(UpdateDeadline::Yield(1))
    });
    Ok((store, handle_cap))
}

fn wasi_ctx(
    env: &Arc<ServiceEnv>,
    grants: Option<&Grants>,
    more: &[(&str, String)],
) -> wasmtime::Result<WasiCtx> {
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(LogOutput::new(Arc::clone(env), Stdio::Stdout))
        .stderr(LogOutput::new(Arc::clone(env), Stdio::Stderr))
        .arg(&*env.name)
        // File operations run on the calling thread, right after the fence's check: a
        // blocking task could write after the deadline, the drop and the release (`fence`).
        .allow_blocking_current_thread(true);
    if let Some(grants) = grants {
        for (name, value) in &grants.env {
            // The host's own (a schedule's fire time) are the ones seen, once.
            if !more.iter().any(|(own, _)| own == name) {
                wasi.env(name, value);
            }
        }
        for dir in &grants.dirs {
            let perms = if dir.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            // Checked with the settings, but it may have gone since.
            wasi.preopened_dir(&dir.host, &dir.guest, perms)
                .map_err(|e| {
                    wasmtime::format_err!("granted directory {}: {e}", dir.host.display())
                })?;
        }
        if grants.network {
            let deadline = env.deadline.clone();
            wasi.allow_tcp(true)
                .allow_udp(true)
                .allow_ip_name_lookup(true)
                // Fencing for granted network access: no new connection past the deadline.
                .socket_addr_check(move |_, _| {
                    let open = !deadline.has_passed();
                    Box::pin(async move { open })
                });
        }
    }
    wasi.envs(more);
    Ok(wasi.build())
}
