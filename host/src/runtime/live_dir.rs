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

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::watch;
use wasmtime::component::Linker;

use super::RuntimeError;
use super::component::{
    Compiler, LoadError, LoadErrorKind, LoadStats, Loaded, discover, prune_cache,
    read_service_file, service_name, version_of,
};
use super::engine::Runtime;
use super::env::Host;
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::ops::Ops;

/// The loaded services by name: what a leader runs now.
pub(crate) type Catalogue = BTreeMap<String, Arc<Loaded>>;

/// How long a change waits without further events before the file is looked at.
const SETTLE: Duration = Duration::from_millis(100);
/// How long a change that no close or rename completes waits, with nobody holding the file
/// open and its size and mtime unchanged, before the file is looked at.
const QUIET: Duration = Duration::from_secs(1);
/// How often the follower checks that the services path still names the directory it watches.
const RECHECK: Duration = Duration::from_secs(1);
/// Loading a component at least this large logs that it started, and then how long it took.
const LARGE: u64 = 1 << 20;

/// What an event says about one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Opened (for reading or writing: inotify does not say).
    Opened,
    /// A reader closed it.
    ClosedRead,
    /// A writer closed it: its content is complete.
    ClosedWrite,
    /// Created or written: complete once its writer closes it.
    Written,
    /// Its attributes changed (a `touch`, `cp -p` setting times): no new content by itself.
    Attributes,
    /// Renamed into place: complete.
    RenamedTo,
    /// Removed or renamed away.
    Gone,
}

impl Change {
    /// The change `kind` reports, if it is one that matters.
    fn of(kind: EventKind) -> Option<Self> {
        Some(match kind {
            EventKind::Access(AccessKind::Open(_)) => Self::Opened,
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => Self::ClosedWrite,
            EventKind::Access(AccessKind::Close(_)) => Self::ClosedRead,
            EventKind::Modify(ModifyKind::Metadata(_)) => Self::Attributes,
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => Self::RenamedTo,
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) | EventKind::Remove(_) => {
                Self::Gone
            }
            // `Both` repeats the `From` and `To` events before it; reads are no change.
            EventKind::Modify(ModifyKind::Name(RenameMode::Both))
            | EventKind::Access(_)
            | EventKind::Any
            | EventKind::Other => return None,
            // Created, written, or a change notify cannot tell more about.
            EventKind::Create(_) | EventKind::Modify(_) => Self::Written,
        })
    }
}

/// Size and modification time of a file; `None` for a missing file.
pub(crate) type FileStamp = Option<(u64, Option<SystemTime>)>;

fn stamp(path: &Path) -> FileStamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()))
}

/// Decides, from the events of each service file and the time, when a file is complete and
/// must be looked at. Pure: time comes in as [`Timestamp`]s, file stamps from a function.
#[derive(Debug, Default)]
pub(crate) struct Debouncer {
    files: BTreeMap<String, FileState>,
}

#[derive(Debug, Default)]
struct FileState {
    /// Opens minus closes seen (a file opened before the watch began counts from 0).
    open: u32,
    changed: Option<Changed>,
}

#[derive(Debug)]
struct Changed {
    /// The last event (or look, for the quiet period).
    at: Timestamp,
    /// A close after writing, a rename into place or a removal: no need for a quiet period.
    complete: bool,
    /// What the last look at an incomplete change saw.
    looked: Option<FileStamp>,
}

fn since(earlier: Timestamp, now: Timestamp) -> Duration {
    now.since_boot.saturating_sub(earlier.since_boot)
}

impl Debouncer {
    /// Records `change` of service `name` at `now`.
    pub(crate) fn note(&mut self, name: &str, change: Change, now: Timestamp) {
        let file = self.files.entry(name.to_owned()).or_default();
        let changed = |complete: bool| {
            Some(Changed {
                at: now,
                complete,
                looked: None,
            })
        };
        match change {
            Change::Opened => file.open = file.open.saturating_add(1),
            Change::ClosedRead => file.open = file.open.saturating_sub(1),
            Change::ClosedWrite => {
                file.open = file.open.saturating_sub(1);
                file.changed = changed(true);
            }
            Change::Written => file.changed = changed(false),
            Change::Attributes => match &mut file.changed {
                Some(c) => c.at = now,
                None => file.changed = changed(false),
            },
            Change::RenamedTo | Change::Gone => {
                // Another inode now, or none: the opens counted were of the old one.
                file.open = 0;
                file.changed = changed(true);
            }
        }
    }

    /// Looks at every file (a rescan: at start, or after the event queue overflowed).
    pub(crate) fn note_all<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a str>,
        now: Timestamp,
    ) {
        for name in names {
            let file = self.files.entry(name.to_owned()).or_default();
            file.open = 0;
            file.changed = Some(Changed {
                at: now,
                complete: true,
                looked: None,
            });
        }
    }

    /// The files to look at now, by service name. `stamp` gives a file's size and mtime.
    pub(crate) fn due(&mut self, now: Timestamp, stamp: impl Fn(&str) -> FileStamp) -> Vec<String> {
        let mut due = Vec::new();
        for (name, file) in &mut self.files {
            let Some(changed) = &mut file.changed else {
                continue;
            };
            let waited = since(changed.at, now);
            if waited < SETTLE {
                continue;
            }
            if !changed.complete {
                // Someone still has it open (a slow copy): its close will tell.
                if file.open > 0 || waited < QUIET {
                    continue;
                }
                let seen = stamp(name);
                if changed.looked != Some(seen) {
                    // First look, or it changed since: unchanged for another quiet period.
                    changed.looked = Some(seen);
                    changed.at = now;
                    continue;
                }
            }
            file.changed = None;
            due.push(name.clone());
        }
        self.files.retain(|_, f| f.open > 0 || f.changed.is_some());
        due
    }

    /// How long until [`Debouncer::due`] may return a file without a new event; `None`: not
    /// until an event.
    pub(crate) fn next_due(&self, now: Timestamp) -> Option<Duration> {
        self.files
            .values()
            .filter_map(|f| {
                let c = f.changed.as_ref()?;
                let wait = if c.complete {
                    SETTLE
                } else if f.open > 0 {
                    return None;
                } else {
                    QUIET.max(SETTLE)
                };
                Some(wait.saturating_sub(since(c.at, now)))
            })
            .min()
    }
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
    /// `rejected` holds the versions of files already rejected (by the first load), by name:
    /// looking at them again says nothing new.
    pub(crate) fn start(
        rt: Arc<Runtime>,
        linker: Linker<Host>,
        catalogue: Arc<watch::Sender<Catalogue>>,
        rejected: BTreeMap<String, String>,
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
        let mut follower = Follower {
            watched: identity(&dir),
            unwatchable: None,
            links: BTreeMap::new(),
            watcher,
            dir: dir.clone(),
            rt,
            linker,
            catalogue,
            rejected,
            stop: Arc::clone(&stop),
            clock: SystemClock::local(),
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
    linker: Linker<Host>,
    catalogue: Arc<watch::Sender<Catalogue>>,
    /// The version of each file last rejected, by service name.
    rejected: BTreeMap<String, String>,
    stop: Arc<AtomicBool>,
    clock: SystemClock,
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
            let dir = self.dir.clone();
            let due = debouncer.due(self.clock.now(), |name| {
                stamp(&dir.join(format!("{name}.wasm")))
            });
            for name in due {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                self.settle(&name);
            }
        }
    }

    fn note(&self, debouncer: &mut Debouncer, event: &notify::Event) {
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
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut seen = BTreeMap::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = service_name(&path) else {
                continue;
            };
            if !entry.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            let target = std::fs::metadata(&path)
                .ok()
                .map(|meta| (meta.dev(), meta.ino(), meta.len(), meta.modified().ok()));
            if self
                .links
                .get(&name)
                .is_some_and(|before| *before != target)
            {
                debouncer.note(&name, Change::Written, self.clock.now());
            }
            seen.insert(name, target);
        }
        self.links = seen;
    }

    /// Every service file on disk, and every service in the catalogue, is looked at.
    fn rescan(&self, debouncer: &mut Debouncer) {
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

    /// Brings service `name` in the catalogue in line with its file.
    fn settle(&mut self, name: &str) {
        let path = self.dir.join(format!("{name}.wasm"));
        let current = self.catalogue.borrow().get(name).cloned();
        let read = path.is_file().then(|| read_service_file(&path));
        let bytes = match read {
            Some(Ok(bytes)) => bytes,
            // Unreadable, or refused by its size: a bad replacement, not a removal.
            Some(Err(kind)) if !matches!(&kind, LoadErrorKind::Read(e) if e.is_not_found()) => {
                let version = format!("unread {:?}", stamp(&path));
                self.reject(name, version, &LoadError { path, kind }, current.as_deref());
                return;
            }
            _ => {
                self.rejected.remove(name);
                if let Some(old) = current {
                    // Logged first: the leader's services follow the catalogue at once.
                    tracing::info!(service = name, version = old.version, "service removed");
                    self.catalogue.send_modify(|c| {
                        c.remove(name);
                    });
                    Ops::global().service_removed(name);
                }
                return;
            }
        };
        let version = version_of(&bytes);
        if current.as_ref().is_some_and(|old| old.version == version)
            || self.rejected.get(name) == Some(&version)
        {
            tracing::debug!(service = name, version, "service file unchanged");
            return;
        }
        let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        drop(bytes);
        if size >= LARGE {
            tracing::info!(service = name, file = %path.display(), bytes = size, "loading a large component");
        }
        let started = std::time::Instant::now();
        let mut compiler = Compiler {
            engine: &self.rt.engine,
            cache_dir: &self.rt.config.cache_dir,
            stats: LoadStats::default(),
        };
        let loaded = compiler.load(&path, &self.linker);
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let compiled = compiler.stats.compiled > 0;
        if compiled {
            // A new version: the cache gained an entry, and may hold ones long unused.
            prune_cache(&self.rt.config.cache_dir);
        }
        match loaded {
            Ok(loaded) => {
                self.rejected.remove(name);
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
                Ops::global().service_loaded(name);
                self.catalogue.send_modify(|c| {
                    c.insert(name.to_owned(), Arc::new(loaded));
                });
            }
            Err(e) => self.reject(name, version, &e, current.as_deref()),
        }
    }

    /// Logs that `name`'s file (`version`) was rejected for `error`; the old version, if any
    /// (`current`), runs on. The same version is not looked at again.
    fn reject(&mut self, name: &str, version: String, error: &LoadError, current: Option<&Loaded>) {
        self.rejected.insert(name.to_owned(), version);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const STAMP: FileStamp = Some((100, None));

    fn at(clock: &ManualClock, ms: u64) -> Timestamp {
        clock.now().after(Duration::from_millis(ms))
    }

    /// A copy in progress (open, written for longer than the quiet period) is never due; its
    /// close makes it due after the settle time.
    #[test]
    fn a_file_held_open_is_due_only_after_its_writer_closes_it() {
        let clock = ManualClock::default();
        let mut d = Debouncer::default();
        d.note("svc", Change::Written, at(&clock, 0));
        d.note("svc", Change::Opened, at(&clock, 0));
        for ms in (100..10_000).step_by(100) {
            d.note("svc", Change::Written, at(&clock, ms));
            assert!(d.due(at(&clock, ms + 50), |_| STAMP).is_empty(), "{ms}");
        }
        // A long pause of the writer, file still open: not due, and no timer.
        assert!(d.due(at(&clock, 60_000), |_| STAMP).is_empty());
        assert_eq!(d.next_due(at(&clock, 60_000)), None);
        d.note("svc", Change::ClosedWrite, at(&clock, 60_000));
        assert!(d.due(at(&clock, 60_050), |_| STAMP).is_empty(), "settling");
        assert_eq!(
            d.next_due(at(&clock, 60_050)),
            Some(Duration::from_millis(50))
        );
        assert_eq!(d.due(at(&clock, 60_100), |_| STAMP), ["svc"]);
        assert!(d.due(at(&clock, 70_000), |_| STAMP).is_empty(), "once");
    }

    /// A rename into place and a removal are complete at once (after the settle time); a
    /// burst of events on many files makes each due once.
    #[test]
    fn renames_and_removals_need_no_close_and_bursts_coalesce() {
        let clock = ManualClock::default();
        let mut d = Debouncer::default();
        for i in 0..50 {
            let name = format!("s{i}");
            d.note(&name, Change::Opened, at(&clock, 0));
            d.note(&name, Change::Written, at(&clock, 1));
            d.note(&name, Change::ClosedWrite, at(&clock, 2));
        }
        d.note("moved", Change::RenamedTo, at(&clock, 3));
        d.note("gone", Change::Gone, at(&clock, 3));
        assert!(d.due(at(&clock, 50), |_| STAMP).is_empty());
        let due = d.due(at(&clock, 103), |_| STAMP);
        assert_eq!(due.len(), 52, "{due:?}");
        assert!(due.contains(&"moved".to_owned()) && due.contains(&"gone".to_owned()));
        assert!(d.due(at(&clock, 10_000), |_| STAMP).is_empty());
    }

    /// A change no close follows (a hard link, events of a writer that started before the
    /// watch) is due once nobody holds the file open and its size and mtime stayed the same
    /// for a quiet period; a change of either starts the quiet period again.
    #[test]
    fn without_a_close_a_file_is_due_after_a_quiet_period_with_the_same_stamp() {
        let clock = ManualClock::default();
        let mut d = Debouncer::default();
        d.note("svc", Change::Written, at(&clock, 0));
        assert!(d.due(at(&clock, 999), |_| Some((1, None))).is_empty());
        assert!(
            d.due(at(&clock, 1000), |_| Some((1, None))).is_empty(),
            "first look"
        );
        assert!(d.due(at(&clock, 1999), |_| Some((1, None))).is_empty());
        assert!(
            d.due(at(&clock, 2000), |_| Some((2, None))).is_empty(),
            "it grew: look again later"
        );
        assert_eq!(d.due(at(&clock, 3000), |_| Some((2, None))), ["svc"]);
    }

    /// Setting times after a close (`cp -p`) keeps the change complete; a `touch` alone is
    /// looked at after a quiet period. Reading the file (as the host itself does) is no change.
    #[test]
    fn attributes_and_reads_are_not_new_content() {
        let clock = ManualClock::default();
        let mut d = Debouncer::default();
        d.note("svc", Change::ClosedWrite, at(&clock, 0));
        d.note("svc", Change::Attributes, at(&clock, 10));
        assert_eq!(d.due(at(&clock, 110), |_| STAMP), ["svc"]);
        d.note("svc", Change::Opened, at(&clock, 200));
        d.note("svc", Change::ClosedRead, at(&clock, 201));
        assert!(d.due(at(&clock, 60_000), |_| STAMP).is_empty());
        assert_eq!(d.next_due(at(&clock, 60_000)), None);
        d.note("touched", Change::Attributes, at(&clock, 0));
        assert!(d.due(at(&clock, 1000), |_| STAMP).is_empty());
        assert_eq!(d.due(at(&clock, 2000), |_| STAMP), ["touched"]);
    }

    #[test]
    fn events_map_to_changes() {
        use notify::event::{CreateKind, DataChange, MetadataKind, RemoveKind};
        let cases = [
            (
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                Some(Change::ClosedWrite),
            ),
            (
                EventKind::Access(AccessKind::Close(AccessMode::Read)),
                Some(Change::ClosedRead),
            ),
            (
                EventKind::Access(AccessKind::Open(AccessMode::Any)),
                Some(Change::Opened),
            ),
            (EventKind::Create(CreateKind::File), Some(Change::Written)),
            (
                EventKind::Modify(ModifyKind::Data(DataChange::Any)),
                Some(Change::Written),
            ),
            (
                EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)),
                Some(Change::Attributes),
            ),
            (
                EventKind::Modify(ModifyKind::Name(RenameMode::To)),
                Some(Change::RenamedTo),
            ),
            (
                EventKind::Modify(ModifyKind::Name(RenameMode::From)),
                Some(Change::Gone),
            ),
            (EventKind::Modify(ModifyKind::Name(RenameMode::Both)), None),
            (EventKind::Remove(RemoveKind::File), Some(Change::Gone)),
            (EventKind::Other, None),
        ];
        for (kind, change) in cases {
            assert_eq!(Change::of(kind), change, "{kind:?}");
        }
    }
}
