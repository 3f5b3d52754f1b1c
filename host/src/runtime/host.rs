//! Per-store host state and the `vvm:host` imports (SPEC §6, §7). Every call into the host is
//! fenced by the local lease deadline (`fence`); the imports with an effect also say which
//! effect they refused.

use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;
use wasmtime::component::{HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder, UpdateDeadline};
use wasmtime_wasi::p2::{DynPollable, Pollable, subscribe};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::RuntimeError;
use super::config::{Grants, KvLimits, RuntimeConfig};
use super::fence::{self, Fenced};
use super::output::{LogOutput, Stdio};
use crate::elections::LeaseDeadline;
use crate::services::LeaseInfo;
use crate::store::{Fence, Store as LeaseStore};
use crate::vvm::{Problem, ProblemReporter};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "vvm:host/service",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "wasi": wasmtime_wasi::p2::bindings },
    });
}

use crate::ops::KvOutcome;
pub(crate) use bindings::ServicePre;
use bindings::vvm::host::{kv, lease, log};

/// What every instance of one service shares during one leadership.
pub(crate) struct ServiceEnv {
    /// The service's name (file stem); tags its log lines, namespaces its key-value space.
    pub name: Arc<str>,
    /// The lease the service runs under.
    pub lease: LeaseInfo,
    /// Past it, no effect may happen.
    pub deadline: LeaseDeadline,
    /// Cancelled when the service must stop.
    pub stopping: CancellationToken,
    /// Where `report-problem` goes.
    pub problems: ProblemReporter,
    /// The store holding the fenced key-value space.
    pub store: Arc<dyn LeaseStore>,
    /// What `kv.set` may write, and how often.
    pub kv_limits: KvLimits,
    /// The writes `kv.set` may still make now (a token bucket refilled at the limit's rate).
    pub kv_budget: Mutex<WriteBudget>,
}

/// A token bucket: `rate` tokens per second, at most `rate` saved up.
#[derive(Debug)]
pub(crate) struct WriteBudget {
    tokens: f64,
    at: tokio::time::Instant,
}

impl WriteBudget {
    /// A full bucket for `rate` writes per second.
    pub(crate) fn full(rate: u32) -> Self {
        Self {
            tokens: f64::from(rate),
            at: tokio::time::Instant::now(),
        }
    }

    /// Takes one write if the budget allows it now.
    fn take(&mut self, rate: u32) -> bool {
        let now = tokio::time::Instant::now();
        let rate = f64::from(rate);
        let refill = now.duration_since(self.at).as_secs_f64() * rate;
        self.tokens = (self.tokens + refill).min(rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The state of one store: one instance of one service.
pub(crate) struct Host {
    env: Arc<ServiceEnv>,
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
}

impl Host {
    /// What this instance's service shares with its other instances.
    pub(crate) fn env(&self) -> &Arc<ServiceEnv> {
        &self.env
    }

    /// The store's resources.
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The linker every service is instantiated with: WASI 0.2 and `vvm:host`.
pub(crate) fn linker(engine: &Engine) -> Result<Linker<Host>, RuntimeError> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(RuntimeError::Engine)?;
    lease::add_to_linker::<_, HasSelf<_>>(&mut linker, |h| h).map_err(RuntimeError::Engine)?;
    log::add_to_linker::<_, HasSelf<_>>(&mut linker, |h| h).map_err(RuntimeError::Engine)?;
    kv::add_to_linker::<_, HasSelf<_>>(&mut linker, |h| h).map_err(RuntimeError::Engine)?;
    fence::shadow(&mut linker).map_err(RuntimeError::Engine)?;
    Ok(linker)
}

/// A fresh store for one instance of the service `env`: its own WASI context (with only what
/// `grants` allow), memory cap, the per-call fence, and an epoch deadline that yields every
/// tick and traps once the lease deadline has passed.
pub(crate) fn new_store(
    engine: &Engine,
    env: &Arc<ServiceEnv>,
    config: &RuntimeConfig,
) -> wasmtime::Result<Store<Host>> {
    let grants = config.grants.get(&*env.name);
    let host = Host {
        env: Arc::clone(env),
        wasi: wasi_ctx(env, grants)?,
        table: ResourceTable::new(),
        limits: StoreLimitsBuilder::new()
            .memory_size(config.memory_cap)
            .trap_on_grow_failure(true)
            .build(),
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
            wasi.preopened_dir(&dir.host, &dir.guest, perms)?;
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
        match level {
            log::Level::Trace => tracing::trace!(service, "{message}"),
            log::Level::Debug => tracing::debug!(service, "{message}"),
            log::Level::Info => tracing::info!(service, "{message}"),
            log::Level::Warn => tracing::warn!(service, "{message}"),
            log::Level::Error => tracing::error!(service, "{message}"),
        }
        Ok(())
    }
}

impl kv::Host for Host {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, String>> {
        Ok(self
            .env
            .store
            .kv_get(&self.env.name, &key)
            .await
            .map_err(|e| e.to_string()))
    }

    async fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), String>> {
        self.env.fence("key-value write")?;
        let env = &self.env;
        let limits = env.kv_limits;
        let count = |outcome| crate::ops::Ops::global().kv_write(&env.name, outcome);
        if key.len() > limits.max_key_bytes {
            count(KvOutcome::Limited);
            return Ok(Err(format!(
                "key of {} bytes is over the limit of {} bytes",
                key.len(),
                limits.max_key_bytes
            )));
        }
        if value.len() > limits.max_value_bytes {
            count(KvOutcome::Limited);
            return Ok(Err(format!(
                "value of {} bytes is over the limit of {} bytes",
                value.len(),
                limits.max_value_bytes
            )));
        }
        let allowed = env
            .kv_budget
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(limits.writes_per_second);
        if !allowed {
            count(KvOutcome::Limited);
            return Ok(Err(format!(
                "over the limit of {} key-value writes per second; try again later",
                limits.writes_per_second
            )));
        }
        let fence = Fence {
            lease_key: &env.lease.key,
            term: env.lease.term,
        };
        Ok(
            match env.store.kv_set(&fence, &env.name, &key, &value).await {
                Ok(true) => {
                    count(KvOutcome::Ok);
                    Ok(())
                }
                Ok(false) => Err({
                    count(KvOutcome::Stale);
                    format!(
                        "stale term {}: the lease {} has passed to another holder",
                        env.lease.term, env.lease.key
                    )
                }),
                Err(e) => {
                    count(KvOutcome::Error);
                    Err(e.to_string())
                }
            },
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::store::{MemStore, TtlStore};

    /// The environment of a service `svc` leading `slot/1` in a fresh store, with a deadline
    /// 60 s ahead on the returned clock (advance it to pass the deadline).
    pub(crate) async fn env() -> (ManualClock, Arc<ServiceEnv>) {
        let store = MemStore::new(Arc::new(ManualClock::default()));
        let lease = Duration::from_secs(20);
        let term = store
            .insert_if_absent("slot/1", "me", lease)
            .await
            .unwrap()
            .unwrap();
        let clock = ManualClock::default();
        let deadline = LeaseDeadline::fixed(
            Arc::new(clock.clone()),
            clock.now().after(Duration::from_secs(60)),
        );
        let env = ServiceEnv {
            name: "svc".into(),
            lease: LeaseInfo {
                slot: 1,
                key: "slot/1".into(),
                holder: "me".into(),
                term,
                lease,
            },
            deadline,
            stopping: CancellationToken::new(),
            problems: ProblemReporter::default(),
            store: Arc::new(store),
            kv_limits: KvLimits::default(),
            kv_budget: Mutex::new(WriteBudget::full(KvLimits::default().writes_per_second)),
        };
        (clock, Arc::new(env))
    }

    fn host(env: &Arc<ServiceEnv>) -> Host {
        Host {
            env: Arc::clone(env),
            wasi: WasiCtxBuilder::new().build(),
            table: ResourceTable::new(),
            limits: StoreLimits::default(),
        }
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
        clock.advance(Duration::from_secs(60));
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

    /// Over a limit, `kv.set` fails with an error the guest sees (not a trap), and writes
    /// nothing; the rate limit refills with time.
    #[tokio::test(start_paused = true)]
    async fn kv_writes_over_a_limit_fail_for_the_guest_and_write_nothing() {
        let (_clock, env) = env().await;
        let mut h = host(&env);
        let limits = KvLimits::default();
        let long_key = "k".repeat(limits.max_key_bytes + 1);
        let e = kv::Host::set(&mut h, long_key, b"v".to_vec())
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.contains("key of 1025 bytes"), "{e}");
        let big = vec![0u8; limits.max_value_bytes + 1];
        let e = kv::Host::set(&mut h, "k".into(), big)
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.contains("value of 65537 bytes"), "{e}");
        assert_eq!(env.store.kv_get("svc", "k").await.unwrap(), None);

        for i in 0..limits.writes_per_second {
            let value = i.to_string().into_bytes();
            kv::Host::set(&mut h, "k".into(), value)
                .await
                .unwrap()
                .unwrap();
        }
        let e = kv::Host::set(&mut h, "k".into(), b"over".to_vec())
            .await
            .unwrap()
            .unwrap_err();
        assert!(e.contains("writes per second"), "{e}");
        assert_eq!(
            env.store.kv_get("svc", "k").await.unwrap().as_deref(),
            Some(&b"99"[..]),
            "the write over the rate was not made"
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        kv::Host::set(&mut h, "k".into(), b"later".to_vec())
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn kv_namespaces_are_per_service() {
        let (_clock, env) = env().await;
        kv::Host::set(&mut host(&env), "k".into(), b"v".to_vec())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            env.store.kv_get("svc", "k").await.unwrap(),
            Some(b"v".to_vec())
        );
        assert_eq!(env.store.kv_get("other", "k").await.unwrap(), None);
    }
}
