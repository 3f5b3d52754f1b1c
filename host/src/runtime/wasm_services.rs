//! [`WasmServices`]: the Wasm components of a services directory as the lifecycle's
//! [`Services`] (SPEC §5 step 3, §6), and `check` for `vvm-host check DIR`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::component::{self, Compiler, LoadError, LoadStats, Loaded, ServiceKind};
use super::engine::{self, Runtime};
use super::env::{ServiceEnv, WriteBudget};
use super::host;
use super::progress::Progress;
use super::supervisor::supervise;
use super::{RuntimeConfig, RuntimeError};
use crate::services::{RunningServices, ServiceContext, ServiceError, Services};

/// The services of one directory, compiled and pre-instantiated, ready to start under a
/// lease. Cheap to start many times (once per leadership).
pub struct WasmServices {
    rt: Arc<Runtime>,
    services: Vec<Arc<Loaded>>,
    stats: LoadStats,
}

impl WasmServices {
    /// Compiles (or loads from the cache) every `*.wasm` file of `config.services_dir`.
    /// Files that cannot be services are returned as errors naming the file; the others
    /// load. Blocks while compiling: call it before campaigning.
    ///
    /// # Errors
    /// When the directory cannot be read, the cache directory cannot be created, or
    /// wasmtime cannot be set up.
    pub fn load(config: RuntimeConfig) -> Result<(Self, Vec<LoadError>), RuntimeError> {
        let engine = engine::build(&config)?;
        let linker = host::linker(&engine)?;
        let files = component::discover(&config.services_dir)?;
        std::fs::create_dir_all(&config.cache_dir).map_err(|source| RuntimeError::CacheDir {
            path: config.cache_dir.clone(),
            source,
        })?;
        let mut compiler = Compiler {
            engine: &engine,
            cache_dir: &config.cache_dir,
            stats: LoadStats::default(),
        };
        let mut services = Vec::new();
        let mut errors = Vec::new();
        let progress = Progress::new(files.len());
        for path in files {
            let step = progress.start(&path.file_stem().unwrap_or_default().to_string_lossy());
            let compiled_before = compiler.stats.compiled;
            match compiler.load(&path, &linker) {
                Ok(loaded) => {
                    let compiled = compiler.stats.compiled > compiled_before;
                    let duration_ms = step.elapsed_ms();
                    progress.suspend(|| tracing::info!(service = %loaded.name, world = %loaded.kind(), compiled, duration_ms, "service loaded"));
                    services.push(Arc::new(loaded));
                }
                Err(e) => {
                    let duration_ms = step.elapsed_ms();
                    progress
                        .suspend(|| tracing::error!(error = %e, duration_ms, "service rejected"));
                    errors.push(e);
                }
            }
            progress.done();
        }
        drop(progress);
        let stats = compiler.stats;
        tracing::info!(
            services = services.len(),
            rejected = errors.len(),
            compiled = stats.compiled,
            cache_hits = stats.cache_hits,
            "services loaded"
        );
        let rt = Arc::new(Runtime::start(config, engine)?);
        Ok((
            Self {
                rt,
                services,
                stats,
            },
            errors,
        ))
    }

    /// The loaded services: name and world, sorted by name.
    pub fn services(&self) -> Vec<(String, ServiceKind)> {
        self.services
            .iter()
            .map(|s| (s.name.clone(), s.kind()))
            .collect()
    }

    /// How many components were compiled and how many came from the cache.
    pub fn stats(&self) -> LoadStats {
        self.stats
    }
}

#[async_trait]
impl Services for WasmServices {
    async fn start(&self, ctx: ServiceContext) -> Result<Box<dyn RunningServices>, ServiceError> {
        let stop = ctx.stopping.child_token();
        let mut tasks = JoinSet::new();
        let mut started = Vec::with_capacity(self.services.len());
        for svc in &self.services {
            let env = Arc::new(ServiceEnv {
                name: svc.name.as_str().into(),
                lease: ctx.lease.clone(),
                deadline: ctx.deadline.clone(),
                stopping: stop.clone(),
                problems: ctx.problems.clone(),
                store: Arc::clone(&ctx.store),
                kv_limits: self.rt.config.kv,
                kv_budget: Mutex::new(WriteBudget::full(self.rt.config.kv.writes_per_second)),
            });
            let (tx, rx) = oneshot::channel();
            tasks.spawn(supervise(Arc::clone(&self.rt), Arc::clone(svc), env, tx));
            started.push(rx);
        }
        let all_started = async {
            for rx in started {
                // An error only means that service could not start: its supervisor logs why.
                let _ = rx.await;
            }
        };
        tokio::select! {
            () = all_started => {}
            () = stop.cancelled() => {}
        }
        tracing::info!(
            services = self.services.len(),
            term = ctx.lease.term,
            "services started"
        );
        Ok(Box::new(Running {
            stop,
            tasks,
            grace: self.rt.config.grace_period,
        }))
    }
}

/// The supervisors of one leadership.
struct Running {
    stop: CancellationToken,
    tasks: JoinSet<()>,
    grace: Duration,
}

#[async_trait]
impl RunningServices for Running {
    async fn stop(mut self: Box<Self>) {
        tracing::info!(services = self.tasks.len(), "stopping services");
        self.stop.cancel();
        // Each supervisor drops its instance once the grace period is over; this bound only
        // guards against a supervisor that does not end.
        let joined =
            tokio::time::timeout(self.grace.saturating_add(Duration::from_secs(1)), async {
                while self.tasks.join_next().await.is_some() {}
            })
            .await;
        if joined.is_err() {
            tracing::error!("services did not stop after their grace period; aborting them");
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
        tracing::info!("services stopped");
    }
}

/// What `vvm-host check DIR` reports: the services that load and the files that do not.
#[derive(Debug)]
pub struct CheckReport {
    /// Services that would run: name and world.
    pub services: Vec<(String, ServiceKind)>,
    /// Files that would be rejected, with the reason.
    pub errors: Vec<LoadError>,
}

impl CheckReport {
    /// True if every file would load.
    pub fn is_ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Validates every component of `config.services_dir`: it parses and compiles, targets a
/// supported world, and imports only what the host provides. Fills the compile cache.
///
/// # Errors
/// As [`WasmServices::load`].
pub fn check(config: RuntimeConfig) -> Result<CheckReport, RuntimeError> {
    let (services, errors) = WasmServices::load(config)?;
    Ok(CheckReport {
        services: services.services(),
        errors,
    })
}
