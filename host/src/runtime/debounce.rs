//! When a changed service file is complete and must be looked at (SPEC §6, "half-written
//! files are never loaded"): a pure [`Debouncer`] over the events of each file and the time,
//! which the live directory's watcher thread (`live_dir`) feeds and asks.
//!
//! A file is due once it is complete: its writer closed it (`CLOSE_WRITE`), it was renamed
//! into place or removed, or, for changes no close follows (a `touch`, lost events), nobody
//! has it open and its size and mtime stayed the same for [`QUIET`]. Every change first waits
//! [`SETTLE`] without events, so a burst (a tool that writes in several opens, 50 files at
//! once) is looked at once.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use notify::EventKind;
use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};

use crate::clock::Timestamp;

/// How long a change waits without further events before the file is looked at.
pub(crate) const SETTLE: Duration = Duration::from_millis(100);
/// How long a change that no close or rename completes waits, with nobody holding the file
/// open and its size and mtime unchanged, before the file is looked at.
pub(crate) const QUIET: Duration = Duration::from_secs(1);
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
    pub(crate) fn of(kind: EventKind) -> Option<Self> {
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

/// How long from `earlier` to `now` (zero if `now` is earlier).
pub(crate) fn since(earlier: Timestamp, now: Timestamp) -> Duration {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

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
