//! The imports and the making of a store (SPEC §6, §7, §10): the linker, a fresh sandboxed
//! store per instance, and the `vvm:host` `lease` and `log` host functions (key-value is
//! `keyvalue`'s, configuration `wasi_config`'s). Every call
//! into the host is fenced by the local lease deadline (`fence`); the imports with an effect
//! also say which effect they refused. The state they read is in `state`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use wasmtime::component::{HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Engine, Store, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder};
use wasmtime_wasi_http::WasiHttpCtx;

use super::RuntimeError;
use super::config::{Grants, RuntimeConfig};
use super::fence::{self, Fenced};
use super::outgoing::{OutgoingHttp, link_handle};
use super::output::{LogOutput, Stdio, guest_lines, guest_text};
use super::state::{Host, KvAccess, ServiceEnv};
use crate::problem::Problem;

use super::bindings::service::vvm::host::{kv, lease, log};
use super::bindings::service::wasi::keyvalue::{atomics, batch, store as keyvalue};

/// The linker every service is instantiated with: WASI 0.2, `vvm:host`, `wasi:keyvalue`
/// (`@0.2.0-draft2` and `@0.2.0-draft`), `wasi:config/store` (`@0.2.0-draft` and
/// `@0.2.0-rc.1`) and `wasi:http` (`types` and `outgoing-handler`, denied by default).
pub(crate) fn linker(engine: &Engine) -> Result<Linker<Host>, RuntimeError> {
    let mut linker = Linker::new(engine);
    add_imports(&mut linker).map_err(RuntimeError::Engine)?;
    Ok(linker)
}

fn add_imports(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    lease::add_to_linker::<_, HasSelf<_>>(linker, |h| h)?;
    log::add_to_linker::<_, HasSelf<_>>(linker, |h| h)?;
    kv::add_to_linker::<_, HasSelf<_>>(linker, |h| h)?;
    keyvalue::add_to_linker::<_, HasSelf<_>>(linker, |h| h)?;
    atomics::add_to_linker::<_, HasSelf<_>>(linker, |h| h)?;
    batch::add_to_linker::<_, HasSelf<_>>(linker, |h| h)?;
    super::keyvalue::add_draft_to_linker(linker)?;
    super::wasi_config::add_to_linker(linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)?;
    link_handle(linker, |h| &mut h.http)?;
    fence::shadow(linker)
}

/// A fresh store for one instance of the service `env`: its own WASI context (with only what
/// `grants` allow), memory cap, at most `handle_cap` handles, the per-call fence, and an epoch
/// deadline that yields every tick and traps once the lease deadline has passed.
pub(crate) fn new_store(
    engine: &Engine,
    env: &Arc<ServiceEnv>,
    config: &RuntimeConfig,
    grants: Option<&Grants>,
    handle_cap: usize,
) -> wasmtime::Result<Store<Host>> {
    let mut table = ResourceTable::new();
    table.set_max_capacity(handle_cap);
    let host = Host {
        env: Arc::clone(env),
        wasi: wasi_ctx(env, grants)?,
        table,
        limits: StoreLimitsBuilder::new()
            .memory_size(config.memory_cap)
            .trap_on_grow_failure(true)
            .build(),
        kv: KvAccess {
            limits: Grants::kv_limits(grants, config.kv),
            buckets: grants
                .map(|g| Arc::clone(&g.kv_buckets))
                .unwrap_or_default(),
        },
        config: grants.map(|g| g.config.clone()).unwrap_or_default(),
        http: OutgoingHttp::new(
            &env.name,
            &env.lease,
            env.deadline.clone(),
            env.ops.clone(),
            grants.map(|g| Arc::clone(&g.http)).unwrap_or_default(),
            Arc::clone(&env.http_in_flight),
        ),
        http_ctx: WasiHttpCtx::new(),
    };
    let mut store = Store::new(engine, host);
    store.limiter(|h| &mut h.limits);
    fence::install(&mut store);
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|cx| {
        if cx.data().env.deadline.has_passed() {
            return Err(Fenced::new("running").into());
        }
        Ok(UpdateDeadline::Yield(1))
    });
    Ok(store)
}

fn wasi_ctx(env: &Arc<ServiceEnv>, grants: Option<&Grants>) -> wasmtime::Result<WasiCtx> {
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(LogOutput::new(Arc::clone(env), Stdio::Stdout))
        .stderr(LogOutput::new(Arc::clone(env), Stdio::Stderr))
        .arg(&*env.name)
        // File operations run on the calling thread, right after the fence's check: a
        // blocking task could write after the deadline, the drop and the release (`fence`).
        .allow_blocking_current_thread(true);
    if let Some(grants) = grants {
        wasi.envs(&grants.env);
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
    Ok(wasi.build())
}

/// The pollable behind `lease.stopping`: ready once the service must stop.
struct StopSignal(CancellationToken);

#[wasmtime_wasi::async_trait]
impl Pollable for StopSignal {
    async fn ready(&mut self) {
        self.0.cancelled().await;
    }
}

impl lease::Host for Host {
    async fn current(&mut self) -> wasmtime::Result<lease::Info> {
        let l = &self.env.lease;
        Ok(lease::Info {
            slot: l.slot,
            holder: l.holder.clone(),
            term: l.term,
            lease_ms: u64::try_from(l.lease.as_millis()).unwrap_or(u64::MAX),
        })
    }

    async fn stopping(&mut self) -> wasmtime::Result<Resource<DynPollable>> {
        let signal = self.table.push(StopSignal(self.env.stopping.clone()))?;
        subscribe(&mut self.table, signal)
    }

    async fn report_problem(&mut self, message: String) -> wasmtime::Result<()> {
        self.env.fence("problem report")?;
        let message = guest_text(&message);
        tracing::warn!(service = &*self.env.name, %message, "guest reported a problem");
        self.env.problems.report(Problem::Service {
            name: self.env.name.to_string(),
            reason: message,
        });
        Ok(())
    }
}

impl log::Host for Host {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        self.env.fence("log line")?;
        let service = &*self.env.name;
        for line in guest_lines(&message) {
            match level {
                log::Level::Trace => tracing::trace!(service, "{line}"),
                log::Level::Debug => tracing::debug!(service, "{line}"),
                log::Level::Info => tracing::info!(service, "{line}"),
                log::Level::Warn => tracing::warn!(service, "{line}"),
                log::Level::Error => tracing::error!(service, "{line}"),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::runtime::state::tests::env;

    fn host(env: &Arc<ServiceEnv>) -> Host {
        crate::runtime::state::tests::host(env, KvAccess::default())
    }

    /// A guest cannot forge or hide host log lines with what it logs or reports, nor flood the
    /// log with one call: each line of a message is its own event, tagged with the service,
    /// control characters are escaped, and a problem's reason is bounded.
    #[test]
    fn what_a_guest_logs_or_reports_stays_its_own_bounded_lines() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (_clock, env) = rt.block_on(env());
        let mut h = host(&env);
        let forged = "real\n2026-11-24T00:00:00Z  INFO vvm_host::elections: acquired\rcover";
        let lines = testkit::logs::capture(|| {
            rt.block_on(log::Host::log(&mut h, log::Level::Info, forged.into()))
                .unwrap();
        });
        let messages: Vec<&str> = lines.iter().map(|l| l.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "real",
                "2026-11-24T00:00:00Z  INFO vvm_host::elections: acquired\\rcover"
            ]
        );
        assert!(
            lines.iter().all(|l| l.service.as_deref() == Some("svc")),
            "tagged"
        );
        rt.block_on(lease::Host::report_problem(&mut h, "p".repeat(1 << 20)))
            .unwrap();
        let Some(Problem::Service { reason, .. }) = env.problems.get() else {
            panic!("no problem reported")
        };
        assert!(reason.len() < 20 * 1024, "{} bytes", reason.len());
        assert!(
            reason.ends_with("more bytes)"),
            "{}",
            &reason[reason.len() - 30..]
        );
    }

    #[tokio::test]
    async fn effects_before_the_deadline_take_effect() {
        let (_clock, env) = env().await;
        let mut h = host(&env);
        lease::Host::report_problem(&mut h, "bad".into())
            .await
            .unwrap();
        assert_eq!(
            env.problems.get(),
            Some(Problem::Service {
                name: "svc".into(),
                reason: "bad".into()
            })
        );
        kv::Host::set(&mut h, "k".into(), b"v".to_vec())
            .await
            .unwrap()
            .unwrap();
        let got = kv::Host::get(&mut h, "k".into()).await.unwrap().unwrap();
        assert_eq!(got, Some(b"v".to_vec()));
        log::Host::log(&mut h, log::Level::Info, "hi".into())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn effects_after_the_deadline_trap_and_do_nothing() {
        let (clock, env) = env().await;
        let mut h = host(&env);
        clock.advance(Duration::from_mins(1));
        let e = lease::Host::report_problem(&mut h, "bad".into())
            .await
            .unwrap_err();
        assert!(e.is::<Fenced>(), "{e}");
        assert_eq!(env.problems.get(), None);
        let e = kv::Host::set(&mut h, "k".into(), b"v".to_vec())
            .await
            .unwrap_err();
        assert!(e.is::<Fenced>(), "{e}");
        assert_eq!(env.store.kv_get("svc", "k").await.unwrap(), None);
        let e = log::Host::log(&mut h, log::Level::Info, "hi".into())
            .await
            .unwrap_err();
        assert!(e.is::<Fenced>(), "{e}");
        // Reading and asking about the lease have no effect: still allowed.
        assert_eq!(kv::Host::get(&mut h, "k".into()).await.unwrap(), Ok(None));
        assert_eq!(
            lease::Host::current(&mut h).await.unwrap().term,
            env.lease.term
        );
    }
}
