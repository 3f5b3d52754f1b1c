//! The live services directory (SPEC §6, "The services directory is live"): while a host
//! serves, a `.wasm` added, replaced or removed is compiled, swapped or dropped from the
//! [`Catalogue`], on leaders and standbys alike; the running services of a leadership follow
//! the catalogue (`reconcile`).
//!
//! Events come from `notify` (inotify on Linux). A file is looked at only once it is complete:
//! its writer closed it (`CLOSE_WRITE`), it was renamed into place, or, for changes no close
//! follows (a `touch`, lost events), nobody has it open and its size and mtime stayed the same
//! for a quiet period. Every change first waits a short settle time without events, so a burst
//! (a tool that writes in several opens, 50 files at once) is looked at once. Temporary names
//! are never services ([`super::component::service_name`]). A changed file is compiled (or
//! loaded from the cache) off the async runtime, one at a time, and replaces the old version
//! only if it loads: a bad replacement leaves the old one in the catalogue, and the error names
//! the file and the reason.
//!
//! The directory is followed by its path: inotify watches the directory the path named when
//! the watch began, so every [`RECHECK`] the follower compares what the path names now (device
//! and inode, through a symlink) with what it watches. A release flipped in by renaming a
//! symlink over the path, or a directory removed and made again, is watched afresh and every
//! file looked at. A service file that is itself a symlink is followed the same way: a change
//! of what it leads to, which no event here reports, is seen at the next recheck.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::watch;

use super::RuntimeError;
use super::cache::prune_cache;
use super::component::{
    Compiler, LoadError, LoadErrorKind, LoadStats, Loaded, ServiceFile, discover, service_name,
};
use super::debounce::{Change, Debouncer, FileStamp, since};
use super::engine::Runtime;
use crate::clock::{Clock, SystemClock};
use crate::sources::{BlobCache, Puller, RegistryOptions, SourceRef};

/// The loaded services by name: what a leader runs now.
pub(crate) type Catalogue = BTreeMap<String, Arc<Loaded>>;

/// The registry sources of the settings, by service name, and how registries are reached
/// (SPEC §13): what a reload may change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sources {
    /// The sources, by service name.
    pub by_name: BTreeMap<String, SourceRef>,
    /// `insecure-registries`, `registry-ca-file`, `pull-timeout`.
    pub registry: RegistryOptions,
}

/// The services whose latest version (a file, or what a registry source gave) was refused,
/// by name: what was refused, so that the same is not looked at again, and why. The first load
/// and the follower keep it; the host publishes it with what it has loaded (SPEC §13,
/// [`crate::lease_value::Loaded::rejected`]). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Rejections(Arc<watch::Sender<BTreeMap<String, Refusal>>>);

/// A receiver of [`Rejections`].
pub(crate) type Refusals = watch::Receiver<BTreeMap<String, Refusal>>;

/// One refused version of a service, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The version refused (the SHA-256 of a file's bytes), or what stands for it when there
    /// were no bytes to hash (a source's reference, an unreadable file's stamp).
    version: String,
    /// The load error, naming the file or the source and the reason.
    pub reason: String,
}

impl Rejections {
    pub(crate) fn new() -> Self {
        Self(Arc::new(watch::channel(BTreeMap::new()).0))
    }

    /// `name`'s `version` was refused for `reason`.
    pub(crate) fn refuse(&self, name: &str, version: String, reason: String) {
        let refusal = Refusal { version, reason };
        self.0.send_if_modified(|now| {
            now.insert(name.to_owned(), refusal.clone()).as_ref() != Some(&refusal)
        });
    }

    /// `name`'s latest version is no longer refused: it loaded, or it is gone.
    pub(crate) fn clear(&self, name: &str) {
        self.0.send_if_modified(|now| now.remove(name).is_some());
    }

    /// Whether `version` of `name` is the one last refused.
    fn refused(&self, name: &str, version: &str) -> bool {
        self.0
            .borrow()
            .get(name)
            .is_some_and(|r| r.version == version)
    }

    /// Whether `name`'s latest version was refused.
    fn contains(&self, name: &str) -> bool {
        self.0.borrow().contains_key(name)
    }

    /// A receiver of the refusals, now and at every change.
    pub(crate) fn subscribe(&self) -> Refusals {
        self.0.subscribe()
    }
}

/// How often the follower checks that the services path still names the directory it watches.
const RECHECK: Duration = Duration::from_secs(1);
/// Loading a component at least this large logs that it started, and then how long it took.
const LARGE: u64 = 1 << 20;

fn stamp(path: &Path) -> FileStamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()))
}

/// Follows a services directory until dropped: a `notify` watcher feeding one thread that
/// debounces events and loads changed files into the catalogue. Dropping it stops the watcher
/// and joins the thread (after the load in progress, if any).
pub(crate) struct LiveDir {
    stop: Arc<AtomicBool>,
    wake: mpsc::Sender<Option<notify::Result<notify::Event>>>,
    thread: Option<JoinHandle<()>>,
}

impl LiveDir {
    /// Starts following `rt.config.services_dir` into `catalogue`, first looking at every file
    /// once (changes between the first load and the watch are not lost).
    ///
    /// # Errors
    /// When the directory cannot be watched or the thread cannot be started.
    /// `rejected` holds the versions already refused (by the first load), by name: looking
    /// at them again says nothing new.
    pub(crate) fn start(
        rt: Arc<Runtime>,
        catalogue: Arc<watch::Sender<Catalogue>>,
        rejected: Rejections,
        mut sources: watch::Receiver<Sources>,
    ) -> Result<Self, RuntimeError> {
        let dir = rt.config.services_dir.clone();
        let watch_err = |source: notify::Error| RuntimeError::Watch {
            path: dir.clone(),
            source: Box::new(source),
        };
        let (tx, rx) = mpsc::channel();
        let events = tx.clone();
        let mut watcher = notify::recommended_watcher(move |event| {
            // The receiver is gone only when the thread has ended.
            let _ = events.send(Some(event));
        })
        .map_err(watch_err)?;
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(watch_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        // The first load pulled these already.
        let applied = sources.borrow_and_update().clone();
        let mut follower = Follower {
            watched: identity(&dir),
            unwatchable: None,
            // Taken before the thread starts: a link changed from here on is seen at a
            // recheck, one changed before by the first look at every file.
            links: link_targets(&dir),
            watcher,
            dir: dir.clone(),
            rt,
            catalogue,
            rejected,
            stop: Arc::clone(&stop),
            clock: SystemClock::local(),
            applied,
            sources,
        };
        let thread = std::thread::Builder::new()
            .name("vvm-live-dir".into())
            .spawn(move || follower.run(&rx))
            .map_err(|source| RuntimeError::Watch {
                path: dir.clone(),
                source: Box::new(source),
            })?;
        tracing::info!(dir = %dir.display(), "following the services directory");
        Ok(Self {
            stop,
            wake: tx,
            thread: Some(thread),
        })
    }
}

impl LiveDir {
    /// Wakes the follower to look at the registry sources now (a reload changed them).
    pub(crate) fn wake(&self) {
        let _ = self
            .wake
            .send(Some(Ok(notify::Event::new(notify::EventKind::Other))));
    }
}

impl Drop for LiveDir {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.send(None);
        if let Some(thread) = self.thread.take() {
            // The thread checks `stop` between files and ends at once when woken.
            let _ = thread.join();
        }
    }
}

/// What a symlinked service file leads to: device, inode, size and mtime; `None` if nothing.
type LinkTarget = Option<(u64, u64, u64, Option<SystemTime>)>;

/// What each service file in `dir` that is a symlink leads to now, by service name.
fn link_targets(dir: &Path) -> BTreeMap<String, LinkTarget> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_symlink()))
        .filter_map(|entry| {
            let path = entry.path();
            let name = service_name(&path)?;
            let target = std::fs::metadata(&path)
                .ok()
                .map(|meta| (meta.dev(), meta.ino(), meta.len(), meta.modified().ok()));
            Some((name, target))
        })
        .collect()
}

/// The directory a path names now (device, inode), through symlinks; `None` if none.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_dir)
        .map(|meta| (meta.dev(), meta.ino()))
}

/// The thread's side of a [`LiveDir`].
struct Follower {
    /// Watches `dir`; dropped with the thread, which ends the watch.
    watcher: RecommendedWatcher,
    /// The directory the watch began on ([`identity`]).
    watched: Option<(u64, u64)>,
    /// The directory the path names that could not be watched, if any: said once.
    unwatchable: Option<(u64, u64)>,
    /// What each service file that is a symlink led to at the last recheck.
    links: BTreeMap<String, LinkTarget>,
    dir: PathBuf,
    rt: Arc<Runtime>,
    catalogue: Arc<watch::Sender<Catalogue>>,
    /// The versions last refused, by service name.
    rejected: Rejections,
    stop: Arc<AtomicBool>,
    clock: SystemClock,
    /// The registry sources as the settings have them now (SPEC §13).
    sources: watch::Receiver<Sources>,
    /// The registry sources last looked at.
    applied: Sources,
}

impl Follower {
    fn run(&mut self, events: &mpsc::Receiver<Option<notify::Result<notify::Event>>>) {
        let mut debouncer = Debouncer::default();
        self.rescan(&mut debouncer);
        let mut recheck = self.clock.now();
        loop {
            let now = self.clock.now();
            if since(recheck, now) >= RECHECK {
                recheck = now;
                self.recheck(&mut debouncer);
            }
            let wait = RECHECK.saturating_sub(since(recheck, now));
            let next = events.recv_timeout(debouncer.next_due(now).map_or(wait, |d| d.min(wait)));
            match next {
                Ok(Some(Ok(event))) => self.note(&mut debouncer, &event),
                Ok(Some(Err(e))) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "watching the services directory: looking at every file");
                    self.rescan(&mut debouncer);
                }
                Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if self.sources.has_changed().unwrap_or(false) {
                self.follow_sources(&mut debouncer);
            }
            let dir = self.dir.clone();
            let due = debouncer.due(self.clock.now(), |name| {
                stamp(&dir.join(format!("{name}.wasm")))
            });
            for name in due {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                self.refresh(&name);
            }
        }
    }

    fn note(&mut self, debouncer: &mut Debouncer, event: &notify::Event) {
        if event.need_rescan() {
            tracing::warn!(dir = %self.dir.display(), "services directory events were lost: looking at every file");
            self.rescan(debouncer);
            return;
        }
        let Some(change) = Change::of(event.kind) else {
            return;
        };
        let now = self.clock.now();
        for path in &event.paths {
            if let Some(name) = service_name(path) {
                debouncer.note(&name, change, now);
            }
        }
    }

    /// If the services path names another directory than the one watched (or none, or one
    /// again), watches what it names now and looks at every file; else looks for service
    /// files linked from elsewhere whose target changed ([`Follower::recheck_links`]).
    fn recheck(&mut self, debouncer: &mut Debouncer) {
        let now = identity(&self.dir);
        if now == self.watched {
            self.recheck_links(debouncer);
            return;
        }
        // The old watch may be gone with its directory already.
        let _ = self.watcher.unwatch(&self.dir);
        let dir = self.dir.display();
        if now.is_none() {
            self.watched = None;
            tracing::warn!(dir = %dir, "the services directory is gone: its services stop");
        } else if let Err(e) = self.watcher.watch(&self.dir, RecursiveMode::NonRecursive) {
            // Tried again at each recheck; said, and its files looked at, once.
            if self.unwatchable == now {
                return;
            }
            self.unwatchable = now;
            tracing::warn!(dir = %dir, error = %e, "cannot watch the services directory");
        } else {
            self.watched = now;
            tracing::info!(dir = %dir, "the services path names a new directory: following it");
        }
        self.rescan(debouncer);
    }

    /// Service files that are symlinks (`app.wasm -> /opt/app/current/app.wasm`): a change
    /// to their target outside the directory (a rename over it, a flip of a link on its way)
    /// makes no event here, so each recheck compares what the link leads to now (device,
    /// inode, size, mtime) with the last recheck, and a change is noted as a write: the file
    /// is looked at once it has been quiet for a while, as a change no close completes.
    fn recheck_links(&mut self, debouncer: &mut Debouncer) {
        let now = link_targets(&self.dir);
        for (name, target) in &now {
            if self.links.get(name).is_some_and(|before| before != target) {
                debouncer.note(name, Change::Written, self.clock.now());
            }
        }
        self.links = now;
    }

    /// Every service file on disk, and every service in the catalogue, is looked at; what
    /// the links among them lead to is taken afresh, so a later change of one is seen.
    fn rescan(&mut self, debouncer: &mut Debouncer) {
        self.links = link_targets(&self.dir);
        let mut names: Vec<String> = self.catalogue.borrow().keys().cloned().collect();
        match discover(&self.dir) {
            Ok(files) => names.extend(files.iter().filter_map(|p| service_name(p))),
            // A directory that is gone is told by `recheck`, once.
            Err(e) if identity(&self.dir).is_some() => {
                tracing::warn!(error = %e, "cannot list the services directory");
            }
            Err(_) => {}
        }
        debouncer.note_all(names.iter().map(String::as_str), self.clock.now());
    }

    /// Brings the registry services in line with the settings' sources (SPEC §13), after
    /// a reload: each added or changed source is pulled and loaded, and each source named by
    /// a tag alone is resolved again (a new push under the tag is taken); a service whose
    /// source is gone is removed, and its file, if any, looked at.
    fn follow_sources(&mut self, debouncer: &mut Debouncer) {
        let Sources {
            by_name: now,
            registry,
        } = self.sources.borrow_and_update().clone();
        let before = std::mem::replace(&mut self.applied.by_name, now.clone());
        self.applied.registry = registry.clone();
        let stop = Arc::clone(&self.stop);
        let puller = Puller::new(registry, BlobCache::beside(&self.rt.config.cache_dir))
            .until(Arc::new(move || stop.load(Ordering::Acquire)));
        for (name, source) in &now {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let current = self.catalogue.borrow().get(name).cloned();
            if source.is_pinned()
                && current.as_ref().and_then(|c| c.source.as_ref()) == Some(source)
            {
                continue;
            }
            let file = match ServiceFile::pull(name, source, &puller) {
                Ok(file) => file,
                // Given up for the stop: nothing to report.
                Err(_) if self.stop.load(Ordering::Acquire) => return,
                Err(e) => {
                    self.reject(name, source.to_string(), &e, current.as_deref());
                    continue;
                }
            };
            let unchanged = current
                .as_ref()
                .is_some_and(|old| old.version == file.version() && old.source == file.source);
            if unchanged {
                tracing::debug!(service = name, source = %source, "service source unchanged");
                self.rejected.clear(name);
                self.rt.ops.service_rejected(name, false);
                continue;
            }
            self.load(name, &file, current);
        }
        for name in before.keys().filter(|n| !now.contains_key(*n)) {
            let loaded = self
                .catalogue
                .borrow()
                .get(name)
                .map(|s| s.source.is_some());
            match loaded {
                Some(true) => {
                    tracing::info!(service = name, "service source removed");
                    self.catalogue.send_modify(|c| {
                        c.remove(name);
                    });
                    self.rt.ops.service_removed(name);
                }
                // Its file's version runs: only the source's refusal is gone.
                Some(false) => self.rt.ops.service_rejected(name, false),
                // Never loaded (its pulls were refused): its series go.
                None => self.rt.ops.service_removed(name),
            }
            self.rejected.clear(name);
            // Its file, if there is one, is the service now.
            debouncer.note_all(std::iter::once(name.as_str()), self.clock.now());
        }
    }

    /// Brings service `name` in the catalogue in line with its file.
    fn refresh(&mut self, name: &str) {
        if let Some(source) = self.sources.borrow().by_name.get(name) {
            tracing::debug!(service = name, %source, "the service comes from its source: its file is ignored");
            return;
        }
        let path = self.dir.join(format!("{name}.wasm"));
        let current = self.catalogue.borrow().get(name).cloned();
        let read = path.is_file().then(|| ServiceFile::read(&path));
        let file = match read {
            Some(Ok(file)) => file,
            // Unreadable, or refused by its size: a bad replacement, not a removal.
            Some(Err(e)) if !matches!(&e.kind, LoadErrorKind::Read(e) if e.is_not_found()) => {
                let version = format!("unread {:?}", stamp(&path));
                self.reject(name, version, &e, current.as_deref());
                return;
            }
            _ => {
                if let Some(old) = current {
                    // Logged first: the leader's services follow the catalogue at once.
                    tracing::info!(service = name, version = old.version, "service removed");
                    self.catalogue.send_modify(|c| {
                        c.remove(name);
                    });
                    self.rt.ops.service_removed(name);
                } else if self.rejected.contains(name) {
                    // A file that never loaded is gone: its `vvm_service_rejected` goes too.
                    self.rt.ops.service_removed(name);
                }
                self.rejected.clear(name);
                return;
            }
        };
        let version = file.version();
        if current.as_ref().is_some_and(|old| old.version == version)
            || self.rejected.refused(name, &version)
        {
            tracing::debug!(service = name, version, "service file unchanged");
            return;
        }
        self.load(name, &file, current);
    }

    /// Loads service `name` from `file` into the catalogue, in place of `current`; a file
    /// that does not load leaves `current` there.
    fn load(&mut self, name: &str, file: &ServiceFile, current: Option<Arc<Loaded>>) {
        let size = u64::try_from(file.bytes.len()).unwrap_or(u64::MAX);
        if size >= LARGE {
            tracing::info!(service = name, file = %file.path.display(), bytes = size, "loading a large component");
        }
        let started = std::time::Instant::now();
        let mut compiler = Compiler {
            engines: &self.rt.engines,
            cache_dir: &self.rt.config.cache_dir,
            stats: LoadStats::default(),
        };
        let loaded = compiler.load(file);
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let compiled = compiler.stats.compiled > 0;
        if compiled {
            // A new version: the cache gained an entry, and may hold ones long unused.
            prune_cache(&self.rt.config.cache_dir);
        }
        match loaded {
            Ok(loaded) => {
                self.rejected.clear(name);
                let version = loaded.version.clone();
                // Logged first: the leader's services follow the catalogue at once.
                match current {
                    Some(old) => tracing::info!(
                        service = name,
                        version,
                        previous = old.version,
                        compiled,
                        duration_ms,
                        "service replaced"
                    ),
                    None => {
                        tracing::info!(
                            service = name,
                            version,
                            compiled,
                            duration_ms,
                            "service added"
                        );
                    }
                }
                self.rt.ops.service_loaded(name, loaded.serves_http());
                self.rt.ops.service_rejected(name, false);
                self.catalogue.send_modify(|c| {
                    c.insert(name.to_owned(), Arc::new(loaded));
                });
            }
            Err(e) => self.reject(name, file.version(), &e, current.as_deref()),
        }
    }

    /// Logs that `name`'s file (`version`) was rejected for `error`; the old version, if any
    /// (`current`), runs on. The same version is not looked at again.
    fn reject(&mut self, name: &str, version: String, error: &LoadError, current: Option<&Loaded>) {
        self.rejected.refuse(name, version, error.to_string());
        self.rt.ops.service_rejected(name, true);
        // The error names the file and the reason.
        tracing::error!(
            service = name,
            file = %error.path.display(),
            error = %error,
            running = current.map(|old| old.version.as_str()),
            "service rejected"
        );
    }
}
