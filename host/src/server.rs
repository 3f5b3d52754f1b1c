//! The server (SPEC §5, §8): the process's loop that launches one VVM after another. Lead
//! while holding a slot, stand by otherwise; after a problem, shut the VVM down and campaign
//! again as a standby; on the stop signal, shut down and close the store.
//!
//! [`run`] takes its stop signal as a parameter (as mini-redis's `server::run`), so `vvm-host
//! serve` passes SIGINT/SIGTERM and tests pass a future of their own, and the configurations
//! re-read on SIGHUP as a channel.
//!
//! The services directory is followed while serving (SPEC §6): on leaders and standbys alike,
//! so a standby that takes over runs the services as they are now, compiled already.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::config::{ConfigError, Placement, Settings};
use crate::holder::crash_lock::HolderLockDir;
use crate::holder::holder_value;
use crate::log_output::one_line;
use crate::ops::Ops;
use crate::placement::{MixedPlacement, Spread, SpreadConfig};
use crate::problem::Problem;
use crate::runtime::{RuntimeConfig, RuntimeError, WasmServices};
use crate::services::Services;
use crate::store::{self, StoreError};
use crate::vvm::{Vvm, VvmConfig};

/// Why serving could not begin (after it has begun, every failure is a problem that the loop
/// meets by campaigning again). Each message names the thing and the reason.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The settings cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The crash lock directory the operator named cannot be used.
    #[error("setting lock-dir")]
    LockDir(#[source] crate::holder::crash_lock::HolderLockError),
    /// The store is in use by hosts with the other placement.
    #[error(transparent)]
    MixedPlacement(#[from] MixedPlacement),
    /// The runtime could not be set up (the services directory, the cache, wasmtime).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A blocking step (loading the services, stopping their watch) panicked.
    #[error("{what}")]
    Task {
        /// The step.
        what: &'static str,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// A configuration re-read while serving (on SIGHUP), or why it could not be.
pub type Reload = Result<Settings, ConfigError>;

/// Serves with `settings` until `shutdown` resolves: opens the store, loads the services,
/// then launches a VVM; after each problem (leadership lost, acquisition timeout, a service
/// handed over) shuts it down and launches a new one, as a standby. When `shutdown` resolves,
/// the running VVM's shutdown sequence ends the serving, and closing the store is the last
/// step. Each configuration from `reloads` is applied: the services' grants change for their
/// next start; a configuration that does not validate keeps the old settings, and the log
/// says why. Settings that need a restart (the store, the lease...) are named in the log and
/// keep their old values. Every layer reports its metrics, health and leadership to `ops`
/// (a clone each, as mini-redis hands each connection its `Db`).
///
/// # Errors
/// When the store cannot be opened or the services cannot be loaded (before serving).
pub async fn run(
    settings: Settings,
    ops: Ops,
    mut reloads: mpsc::UnboundedReceiver<Reload>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    tokio::pin!(shutdown);
    let mut store = store::open(&settings.store_settings(), false).await?;
    store.observe_batches({
        let ops = ops.clone();
        move |report| ops.kv_commit(report)
    });
    let holder_locks = holder_locks(&settings)?;
    crate::placement::refuse_mixed(&*store.shared(), settings.placement).await?;
    let Some(wasm) = load_services(&settings, &ops, shutdown.as_mut()).await? else {
        close(store, &settings.store).await;
        return Ok(());
    };
    wasm.share_http(holder_locks.as_ref().map(|d| d.path().to_owned()))
        .await;
    let services: Arc<dyn Services> = Arc::clone(&wasm) as Arc<dyn Services>;
    let reloading = AbortOnDropHandle::new(tokio::spawn({
        let wasm = Arc::clone(&wasm);
        let current = settings.clone();
        async move {
            while let Some(reload) = reloads.recv().await {
                apply_reload(&current, &wasm, reload);
            }
        }
    }));
    tracing::info!(
        store = settings.store,
        services = %settings.services.display(),
        cluster_size = settings.cluster_size,
        lease_ms = settings.lease.as_millis(),
        "serving"
    );
    if settings.placement == Placement::Spread {
        serve_spread(&settings, &ops, store.shared(), Arc::clone(&wasm), shutdown).await;
    } else {
        serve_together(&settings, &ops, &store, &services, holder_locks, shutdown).await;
    }
    // Every VVM has shut down: no task holds the store any more. Dropping the services stops
    // following the directory (after a compile in progress): off the async workers.
    drop(reloading);
    drop(services);
    tokio::task::spawn_blocking(move || drop(wasm))
        .await
        .map_err(|source| ServeError::Task {
            what: "stopping the services directory watch",
            source,
        })?;
    close(store, &settings.store).await;
    Ok(())
}

/// Closes the store `name` once nothing uses it any more, and says so.
async fn close(store: store::OpenedStore, name: &str) {
    store.close().await;
    tracing::info!(store = name, "store closed");
}

/// Serves under together placement until `shutdown` resolves: one VVM after another, each
/// campaigning for a slot and running every service while it holds one; after a problem of
/// this host's own it stands aside first ([`LocalBackoff`]).
async fn serve_together(
    settings: &Settings,
    ops: &Ops,
    store: &store::OpenedStore,
    services: &Arc<dyn Services>,
    holder_locks: Option<Arc<HolderLockDir>>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) {
    let mut backoff = LocalBackoff::new(settings.lease);
    let mut stopping = false;
    while !stopping {
        let config = VvmConfig {
            cluster_size: settings.cluster_size,
            lease: settings.lease,
            acquisition_timeout: settings.acquisition_timeout,
            // One holder value per campaign: a delayed delete of an earlier campaign's
            // record can never remove this one's.
            holder: holder_value(),
            require_same_services: settings.require_same_services,
        };
        let vvm = Vvm::provide(config, store.shared(), Arc::clone(services), ops.clone())
            .with_holder_locks(holder_locks.clone())
            .launch();
        let launched = tokio::time::Instant::now();
        let problem = tokio::select! {
            () = &mut shutdown => {
                stopping = true;
                None
            }
            problem = vvm.problems().wait() => {
                tracing::warn!(%problem, "shutting down, then standing by");
                Some(problem)
            }
        };
        let vvm_shutdown = vvm.shutdown();
        tokio::pin!(vvm_shutdown);
        loop {
            tokio::select! {
                _ = &mut vvm_shutdown => break,
                () = &mut shutdown, if !stopping => {
                    tracing::info!("will exit after this shutdown");
                    stopping = true;
                }
            }
        }
        if stopping {
            break;
        }
        // After a problem of this host's own, let a healthy standby take the slot first.
        if let Some(pause) = backoff.after(problem.as_ref(), launched.elapsed()) {
            tracing::info!(
                pause_ms = pause.as_millis(),
                "local problem: backing off before campaigning"
            );
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = &mut shutdown => stopping = true,
            }
        }
    }
}

/// Serves under spread placement ([`crate::placement::spread`]) until `shutdown` resolves,
/// then leaves the group in order. Store failures are retried inside; nothing ends it early.
async fn serve_spread(
    settings: &Settings,
    ops: &Ops,
    store: Arc<dyn crate::store::Store>,
    services: Arc<WasmServices>,
    shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
) {
    let advertise = settings
        .advertise_addr
        .filter(|_| settings.http_addr.is_some());
    if let Some(http_addr) = settings.http_addr {
        if let Some(addr) = advertise {
            tracing::info!(advertise_addr = %addr, forward = settings.forward,
                "the other members forward requests for this host's services to it");
        } else {
            tracing::warn!(%http_addr, forward = settings.forward,
                "no advertise-addr, and http-addr is no address to reach this host at: the \
                 other members cannot forward requests for its services to it");
        }
    }
    let config = SpreadConfig {
        lease: settings.lease,
        holder: holder_value(),
        advertise,
    };
    let stop = CancellationToken::new();
    let run = Spread::new(config, store, services, ops.clone()).run(stop.clone());
    tokio::pin!(run);
    tokio::select! {
        () = &mut run => return,
        () = shutdown => {}
    }
    stop.cancel();
    run.await;
}

/// How long to stand aside after a problem that campaigning again at once would meet again:
/// one of this host's own (a service that fails here, a bug), so that a healthy standby takes
/// the slot instead of this host winning it straight back, or a store error that retrying
/// cannot fix (a corrupt file, refused credentials), which would otherwise be met thousands
/// of times a second. `L`, doubling with each such problem in a row up to `16·L`. A
/// leadership that lasted `16·L`, or any other problem (the lease lost, no slot free), starts
/// over without a pause.
struct LocalBackoff {
    lease: Duration,
    in_a_row: u32,
}

impl LocalBackoff {
    const MAX_DOUBLINGS: u32 = 4;

    fn new(lease: Duration) -> Self {
        Self { lease, in_a_row: 0 }
    }

    fn after(&mut self, problem: Option<&Problem>, ran: Duration) -> Option<Duration> {
        let max = self.lease.saturating_mul(1 << Self::MAX_DOUBLINGS);
        let local = matches!(
            problem,
            Some(Problem::Service { .. } | Problem::Internal(_) | Problem::Store(_))
        );
        if !local || ran >= max {
            self.in_a_row = 0;
        }
        if !local {
            return None;
        }
        let pause = self
            .lease
            .saturating_mul(1 << self.in_a_row.min(Self::MAX_DOUBLINGS));
        self.in_a_row = self.in_a_row.saturating_add(1);
        Some(pause)
    }
}

/// The crash lock's directory (`lock-dir`), so that a standby on this machine takes over from
/// a killed leader at once. None when there is none, or when the default one (beside a redb
/// store) cannot be used: standbys then wait out a dead leader's lease.
///
/// # Errors
/// When a directory the operator named cannot be used: what was asked for is refused by name,
/// as any setting that cannot work.
fn holder_locks(settings: &Settings) -> Result<Option<Arc<HolderLockDir>>, ServeError> {
    let Some(dir) = settings.lock_dir.as_deref() else {
        return Ok(None);
    };
    match HolderLockDir::open(dir) {
        Ok(locks) => Ok(Some(Arc::new(locks))),
        Err(e) if settings.lock_dir != crate::config::default_lock_dir(&settings.store) => {
            Err(ServeError::LockDir(e))
        }
        Err(e) => {
            tracing::warn!(error = %e, "no crash lock: after a crash standbys wait out the lease");
            Ok(None)
        }
    }
}

/// Compiles (or loads from cache) every service before campaigning, then follows the
/// directory; bad files are reported by name and reason (by the runtime) and the others
/// still run. `None` if `shutdown` resolved first: the load then stops after the file it is
/// compiling (seconds for a large guest, not the whole directory), and `shutdown` is not
/// polled again.
async fn load_services(
    settings: &Settings,
    ops: &Ops,
    shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<Arc<WasmServices>>, ServeError> {
    let config = RuntimeConfig::from_settings(settings)?;
    let stop = CancellationToken::new();
    // Compiling is CPU-bound and blocking: keep it off the async workers.
    let mut loading = tokio::task::spawn_blocking({
        let stop = stop.clone();
        let ops = ops.clone();
        move || WasmServices::load_until(config, ops, &stop)
    });
    let loaded = tokio::select! {
        loaded = &mut loading => loaded,
        () = shutdown => {
            tracing::info!("stopping once the service being loaded is done");
            stop.cancel();
            let _ = loading.await;
            return Ok(None);
        }
    };
    let (services, _rejected) = loaded.map_err(|source| ServeError::Task {
        what: "loading services",
        source,
    })??;
    services.follow_dir()?;
    Ok(Some(Arc::new(services)))
}

/// Applies a re-read configuration: the grants now, the rest at the next restart.
fn apply_reload(current: &Settings, services: &WasmServices, reload: Reload) {
    let config = reload.and_then(|new| Ok((RuntimeConfig::from_settings(&new)?, new)));
    let (config, new) = match config {
        Ok(ok) => ok,
        Err(e) => {
            tracing::error!(error = %one_line(&e), "configuration not reloaded; keeping the old settings");
            return;
        }
    };
    let grants = config.grants.len();
    services.set_grants(config.grants);
    services.set_sources(config.sources, config.registry);
    let restart_needed = needs_restart(current, &new);
    if restart_needed.is_empty() {
        tracing::info!(grants, "configuration reloaded");
    } else {
        tracing::warn!(
            grants,
            restart_needed = restart_needed.join(", "),
            "configuration reloaded; changed settings other than grants apply after a restart"
        );
    }
}

/// The settings that differ between `a` and `b` and cannot change while serving.
fn needs_restart(a: &Settings, b: &Settings) -> Vec<&'static str> {
    let differs = [
        ("store", a.store != b.store),
        ("etcd", a.etcd != b.etcd),
        ("cluster-size", a.cluster_size != b.cluster_size),
        ("services", a.services != b.services),
        ("lease", a.lease != b.lease),
        (
            "acquisition-timeout",
            a.acquisition_timeout != b.acquisition_timeout,
        ),
        ("grace-period", a.grace_period != b.grace_period),
        ("memory-limit-mib", a.memory_limit != b.memory_limit),
        ("handle-limit", a.handle_limit != b.handle_limit),
        ("cache-dir", a.cache_dir != b.cache_dir),
        ("metrics-addr", a.metrics_addr != b.metrics_addr),
        ("http-addr", a.http_addr != b.http_addr),
        ("advertise-addr", a.advertise_addr != b.advertise_addr),
        ("forward", a.forward != b.forward),
        ("incoming-http", a.incoming_http != b.incoming_http),
        ("lock-dir", a.lock_dir != b.lock_dir),
        ("placement", a.placement != b.placement),
        (
            "restart-backoff-max",
            a.restart_backoff_max != b.restart_backoff_max,
        ),
        ("kv", a.kv != b.kv),
        (
            "require-same-services",
            a.require_same_services != b.require_same_services,
        ),
    ];
    differs
        .into_iter()
        .filter_map(|(name, differs)| differs.then_some(name))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::clock::SystemClock;
    use crate::config::FileConfig;
    use crate::keys::slot_key;
    use crate::store::{Record, RedbStore, TtlStore};

    /// Waits (up to a minute) until slot 1's record satisfies `ok`, and returns it.
    async fn slot_until(store: &RedbStore, ok: impl Fn(Option<&Record>) -> bool) -> Option<Record> {
        for _ in 0..3000 {
            let record = store.get(&slot_key(1)).await.unwrap();
            if ok(record.as_ref()) {
                return record;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("slot 1 never reached the expected state");
    }

    fn test_ops() -> Ops {
        Ops::new(Arc::new(SystemClock::local()))
    }

    fn settings(dir: &Path) -> Settings {
        let services = dir.join("services");
        std::fs::create_dir(&services).unwrap();
        let config = dir.join("vvm.toml");
        std::fs::write(&config, "").unwrap();
        let flags = FileConfig {
            services: Some(services),
            store: Some(dir.join("vvm.redb").display().to_string()),
            lease: Some(Duration::from_secs(5)),
            ..FileConfig::default()
        };
        Settings::resolve(flags, Some(&config)).unwrap()
    }

    /// SPEC §8, the re-campaign loop in-process: after losing its lease the host shuts its
    /// VVM down and campaigns again (a new holder value, a higher term); its stop signal ends
    /// the serving with the lease released and the store closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_lost_lease_it_campaigns_again_until_its_stop_signal() {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path());
        let peer = RedbStore::open(&settings.store).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(run(
            settings,
            test_ops(),
            mpsc::unbounded_channel().1,
            async {
                let _ = stopped.await;
            },
        ));

        let first = slot_until(&peer, |r| r.is_some()).await.unwrap();
        // Someone else deletes the record: the host's next renewal finds the lease lost.
        assert!(
            peer.compare_and_delete(&slot_key(1), &first.value)
                .await
                .unwrap()
        );
        let second = slot_until(&peer, |r| r.is_some_and(|r| r.value != first.value))
            .await
            .unwrap();
        assert!(second.term > first.term, "{second:?} after {first:?}");

        stop.send(()).unwrap();
        serving.await.unwrap().unwrap();
        assert_eq!(peer.get(&slot_key(1)).await.unwrap(), None, "released");
    }

    #[test]
    fn local_problems_back_off_doubling_and_others_do_not() {
        let l = Duration::from_secs(1);
        let service = Problem::Service {
            name: "x".into(),
            reason: "fails here".into(),
        };
        let mut b = LocalBackoff::new(l);
        let short = Duration::from_millis(100);
        assert_eq!(b.after(Some(&service), short), Some(l));
        assert_eq!(b.after(Some(&service), short), Some(l * 2));
        assert_eq!(b.after(Some(&service), short), Some(l * 4));
        for _ in 0..5 {
            b.after(Some(&service), short);
        }
        assert_eq!(b.after(Some(&service), short), Some(l * 16), "capped");
        assert_eq!(b.after(Some(&Problem::LeadershipLost), short), None);
        assert_eq!(b.after(Some(&service), short), Some(l), "started over");
        b.after(Some(&service), short);
        assert_eq!(
            b.after(Some(&service), l * 16),
            Some(l),
            "a long leadership resets it"
        );
        assert_eq!(b.after(None, short), None);
        let corrupt = Problem::from(crate::store::StoreError::permanent(
            "redb store x",
            "corrupt",
        ));
        assert_eq!(b.after(Some(&corrupt), short), Some(l));
        assert_eq!(b.after(Some(&corrupt), short), Some(l * 2));
    }
}
