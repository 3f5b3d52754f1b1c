//! [`WasmServices`]: the Wasm components of a services directory as the lifecycle's
//! [`Services`] (SPEC §5 step 3, §6).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cache;
use super::component::{self, Compiler, LoadError, LoadStats, Loaded, ServiceFile, ServiceKind};
use super::engine::Runtime;
use super::http::{HttpServer, RequestSandboxes};
use super::imports;
use super::live_dir::{Catalogue, LiveDir, Refusals, Rejections, Sources};
use super::progress::Progress;
use super::reconcile;
use super::{Grants, RuntimeConfig, RuntimeError};
use crate::interfaces::incoming;
use crate::lease::LeaseDeadline;
use crate::lease_value::Inventory;
use crate::ops::Ops;
use crate::services::{
    Directory, FrontDoor, RunningServices, SeparateServices, ServiceContext, ServiceError, Services,
};
use crate::sources::{BlobCache, Puller, RegistryOptions, SourceRef};

/// The services of one directory, compiled and pre-instantiated, ready to start under a
/// lease. Cheap to start many times (once per leadership). With [`WasmServices::follow_dir`]
/// the set follows the directory's files while serving.
pub struct WasmServices {
    rt: Arc<Runtime>,
    /// Serves the HTTP services of each leadership on `http-addr`.
    http: Arc<HttpServer>,
    /// The loaded services by name; each leadership's running services follow it.
    catalogue: Arc<watch::Sender<Catalogue>>,
    stats: LoadStats,
    /// Follows the directory once started; dropped (and its thread joined) with `self`.
    live: Mutex<Option<LiveDir>>,
    /// The versions refused, by service name, with why.
    rejected: Rejections,
    /// The registry sources of the settings (SPEC §13); the live directory follows them.
    sources: watch::Sender<Sources>,
}

impl WasmServices {
    /// Compiles (or loads from the cache) every `*.wasm` file of `config.services_dir`.
    /// Files that cannot be services are returned as errors naming the file; the others
    /// load. The services' metrics go to `ops`. Blocks while compiling: call it before
    /// campaigning.
    ///
    /// # Errors
    /// When the directory cannot be read, the cache directory cannot be created, or
    /// wasmtime cannot be set up.
    pub fn load(config: RuntimeConfig, ops: Ops) -> Result<(Self, Vec<LoadError>), RuntimeError> {
        Self::load_until(config, ops, &CancellationToken::new())
    }

    /// Like [`WasmServices::load`], giving up between two files once `stop` is cancelled (a
    /// signal while a directory of large guests compiles for minutes): one compile at most
    /// runs on after it.
    ///
    /// # Errors
    /// As [`WasmServices::load`], and [`RuntimeError::Stopped`] once stopped.
    pub fn load_until(
        config: RuntimeConfig,
        ops: Ops,
        stop: &CancellationToken,
    ) -> Result<(Self, Vec<LoadError>), RuntimeError> {
        let files = component::discover(&config.services_dir)?;
        Self::load_files(config, ops, stop, files)
    }

    /// Like [`WasmServices::load_until`], for `files` rather than every service file of the
    /// services directory (`vvm-host check FILE`).
    ///
    /// # Errors
    /// As [`WasmServices::load_until`].
    pub fn load_files(
        config: RuntimeConfig,
        ops: Ops,
        stop: &CancellationToken,
        files: Vec<PathBuf>,
    ) -> Result<(Self, Vec<LoadError>), RuntimeError> {
        let engines = imports::engines(&config)?;
        std::fs::create_dir_all(&config.cache_dir).map_err(|source| RuntimeError::CacheDir {
            path: config.cache_dir.clone(),
            source,
        })?;
        let mut compiler = Compiler {
            engines: &engines,
            cache_dir: &config.cache_dir,
            stats: LoadStats::default(),
        };
        let mut services = Catalogue::new();
        let rejected = Rejections::new();
        let mut errors = Vec::new();
        let files = without_sourced(files, &config.sources);
        let progress = Progress::new(files.len() + config.sources.len());
        let cancelled = stop.clone();
        let puller = Puller::new(
            config.registry.clone(),
            BlobCache::beside(&config.cache_dir),
        )
        .until(Arc::new(move || cancelled.is_cancelled()));
        let jobs = files.into_iter().map(Job::File).chain(
            config
                .sources
                .iter()
                .map(|(n, r)| Job::Source(n.clone(), r.clone())),
        );
        for job in jobs {
            if stop.is_cancelled() {
                return Err(RuntimeError::Stopped);
            }
            let name = job.name();
            let step = progress.start(&name);
            let compiled_before = compiler.stats.compiled;
            let file = match &job {
                Job::File(path) => ServiceFile::read(path),
                Job::Source(name, source) => ServiceFile::pull(name, source, &puller),
            };
            let mut version = String::new();
            let loaded = file.and_then(|file| {
                version = file.version();
                compiler.load(&file)
            });
            match loaded {
                Ok(loaded) => {
                    let compiled = compiler.stats.compiled > compiled_before;
                    let duration_ms = step.elapsed_ms();
                    progress.suspend(|| tracing::info!(service = %loaded.name, world = %loaded.kind(), source = loaded.source.as_ref().map(tracing::field::display), compiled, duration_ms, "service loaded"));
                    ops.service_loaded(&loaded.name, loaded.serves_http());
                    ops.service_rejected(&loaded.name, false);
                    services.insert(loaded.name.clone(), Arc::new(loaded));
                }
                // A pull given up for the stop: no rejection to report.
                Err(_) if stop.is_cancelled() => return Err(RuntimeError::Stopped),
                Err(e) => {
                    let duration_ms = step.elapsed_ms();
                    progress
                        .suspend(|| tracing::error!(service = name, error = %e, duration_ms, "service rejected"));
                    ops.service_rejected(&name, true);
                    rejected.refuse(&name, version, e.to_string());
                    errors.push(e);
                }
            }
            progress.done();
        }
        drop(progress);
        cache::prune_cache(&config.cache_dir);
        let stats = compiler.stats;
        tracing::info!(
            services = services.len(),
            rejected = errors.len(),
            compiled = stats.compiled,
            cache_hits = stats.cache_hits,
            "services loaded"
        );
        let sources = watch::channel(Sources {
            by_name: config.sources.clone(),
            registry: config.registry.clone(),
        })
        .0;
        let rt = Arc::new(Runtime::start(config, engines, ops)?);
        let catalogue = watch::channel(services).0;
        Ok((
            Self {
                http: Arc::new(HttpServer::new(RequestSandboxes::new(
                    Arc::clone(&rt),
                    catalogue.subscribe(),
                ))),
                rt,
                catalogue: Arc::new(catalogue),
                stats,
                live: Mutex::new(None),
                rejected,
                sources,
            },
            errors,
        ))
    }

    /// Its HTTP services are served from `http-addr`'s socket shared with the other hosts of
    /// this machine, from the next leadership on, if it can be shared (see `incoming`); `dir`
    /// is the crash locks' directory, where the hosts hand it over. Once.
    pub(crate) async fn share_http(&self, dir: Option<PathBuf>) {
        let Some(addr) = self.rt.config.incoming_http.addr else {
            return;
        };
        let got = tokio::task::spawn_blocking(move || incoming::share(addr, dir.as_deref())).await;
        match got {
            Ok(Some(socket)) => {
                if self.http.share(socket).is_err() {
                    tracing::warn!(
                        "http-addr's socket was shared already; a second one is dropped"
                    );
                }
            }
            Ok(None) => {}
            Err(e) => tracing::error!(%addr, error = %e, "sharing http-addr failed"),
        }
    }

    /// From now on, follows the services directory (SPEC §6): a `.wasm` file added, replaced
    /// or removed is compiled, swapped or stopped without a restart. Calling it again does
    /// nothing.
    ///
    /// # Errors
    /// When the directory cannot be watched.
    pub fn follow_dir(&self) -> Result<(), RuntimeError> {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.is_none() {
            *live = Some(LiveDir::start(
                Arc::clone(&self.rt),
                Arc::clone(&self.catalogue),
                self.rejected.clone(),
                self.sources.subscribe(),
            )?);
        }
        Ok(())
    }

    /// What this host has loaded and refused ([`Services::inventory`]): follows the catalogue
    /// and the refusals in a task of its own, which ends once the receiver is dropped.
    fn follow_inventory(&self) -> watch::Receiver<Inventory> {
        fn now(catalogue: &mut watch::Receiver<Catalogue>, refusals: &mut Refusals) -> Inventory {
            Inventory {
                versions: (catalogue.borrow_and_update().values())
                    .map(|s| (s.name.clone(), s.version.clone()))
                    .collect(),
                rejected: (refusals.borrow_and_update().iter())
                    .map(|(name, r)| (name.clone(), r.reason.clone()))
                    .collect(),
            }
        }
        let (mut catalogue, mut refusals) = (self.catalogue.subscribe(), self.rejected.subscribe());
        let (tx, rx) = watch::channel(now(&mut catalogue, &mut refusals));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    changed = catalogue.changed() => if changed.is_err() { return },
                    changed = refusals.changed() => if changed.is_err() { return },
                }
                let loaded = now(&mut catalogue, &mut refusals);
                tx.send_if_modified(|was| {
                    let changed = *was != loaded;
                    *was = loaded;
                    changed
                });
            }
        });
        rx
    }

    /// Replaces every service's grants (a re-read configuration file): each service gets
    /// the new ones from its next start.
    pub fn set_grants(&self, grants: HashMap<String, Grants>) {
        self.rt.set_grants(grants);
    }

    /// Replaces the registry sources and how registries are reached (a re-read
    /// configuration, SPEC §13): the live directory pulls what was added or changed, resolves
    /// tags again and removes what is gone, off the async runtime. Nothing before
    /// [`WasmServices::follow_dir`].
    pub fn set_sources(&self, sources: BTreeMap<String, SourceRef>, registry: RegistryOptions) {
        self.sources.send_replace(Sources {
            by_name: sources,
            registry,
        });
        if let Some(live) = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            live.wake();
        }
    }

    /// The loaded services: name and world, sorted by name.
    pub fn services(&self) -> Vec<(String, ServiceKind)> {
        self.catalogue
            .borrow()
            .values()
            .map(|s| (s.name.clone(), s.kind()))
            .collect()
    }

    /// The loaded services, sorted by name.
    pub(crate) fn loaded(&self) -> Vec<Arc<Loaded>> {
        self.catalogue.borrow().values().cloned().collect()
    }

    /// How many components were compiled and how many came from the cache.
    pub fn stats(&self) -> LoadStats {
        self.stats
    }
}

/// `files` but those of services that come from a registry source (SPEC §13): the source
/// takes the place of a file of the same name, which is said.
fn without_sourced(files: Vec<PathBuf>, sources: &BTreeMap<String, SourceRef>) -> Vec<PathBuf> {
    files
        .into_iter()
        .filter(|path| {
            let name = component::service_name(path).unwrap_or_default();
            let Some(source) = sources.get(&name) else {
                return true;
            };
            tracing::warn!(service = name, file = %path.display(), %source, "the service comes from its source: its file is ignored");
            false
        })
        .collect()
}

/// One service to load: a file of the services directory, or a registry source.
enum Job {
    File(PathBuf),
    Source(String, SourceRef),
}

impl Job {
    fn name(&self) -> String {
        match self {
            Self::File(path) => path
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            Self::Source(name, _) => name.clone(),
        }
    }
}

#[async_trait]
impl Services for WasmServices {
    async fn start(&self, ctx: ServiceContext) -> Result<Box<dyn RunningServices>, ServiceError> {
        let (rt, http) = (Arc::clone(&self.rt), Arc::clone(&self.http));
        Ok(reconcile::start(rt, http, self.catalogue.subscribe(), ctx, None).await)
    }

    fn inventory(&self) -> watch::Receiver<Inventory> {
        self.follow_inventory()
    }
}

#[async_trait]
impl SeparateServices for WasmServices {
    fn names(&self) -> Vec<String> {
        self.catalogue.borrow().keys().cloned().collect()
    }

    fn inventory(&self) -> watch::Receiver<Inventory> {
        self.follow_inventory()
    }

    fn open_door(&self, membership: LeaseDeadline) -> Option<Box<dyn FrontDoor>> {
        let door = self.http.open(membership)?;
        Some(Box::new(door))
    }

    fn directory(&self) -> Option<Arc<Directory>> {
        self.http.directory()
    }

    async fn start_one(
        &self,
        name: &str,
        ctx: ServiceContext,
    ) -> Result<Box<dyn RunningServices>, ServiceError> {
        let catalogue = self.catalogue.subscribe();
        let only = Some(name.to_owned());
        let (rt, http) = (Arc::clone(&self.rt), Arc::clone(&self.http));
        Ok(reconcile::start(rt, http, catalogue, ctx, only).await)
    }
}
