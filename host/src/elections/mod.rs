//! Elections (SPEC §4): acquire, renew and release leases. The local lease deadline they
//! move, and the tempo of `L`, are [`crate::lease`]'s. `renewal` holds the renewal loop,
//! `candidacy` the standing offer to be handed a lease.
//!
//! **[departs]** SPEC §4's `release` is a compare-and-delete, after which the next holder
//! inserts: two durable writes between a leader's stop and its successor's start. Here a
//! host that campaigns stands as a candidate ([`Elections::stand`]: a record of its own under
//! a candidates prefix), and a release hands the record to the freshest candidate in its one
//! write, with a new term ([`crate::store::TtlStore::hand_over`]). The candidate takes it
//! over by reading it ([`Elections::adopt`]): its deadlines count from the record's remaining
//! life as the store reports it, read start + time left − 0.2·L, so the invariant "never later
//! than the record's expiry − 0.2·L" holds as after its own write. With no live candidate the
//! record is deleted as before.
//!
//! Every deadline here is read on the elections' [`Clock`] (`CLOCK_BOOTTIME` in production), so
//! a machine that was suspended resumes with its deadlines passed, as the store's are. Timers
//! that only pace the work (the renewal tick, retries) sleep on tokio's clock.

mod candidacy;
mod renewal;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use candidacy::Candidacy;

use crate::clock::{Clock, Timestamp};
use crate::killer::Killer;
use crate::lease::{LeaseDeadline, LocalLease, earliest, release_patience};
use crate::lease_value::{self, Report, RunningReport};
use crate::ops::Ops;
use crate::store::{Candidates, HandOver, Record, Store, StoreError, Term};

/// Why an acquisition failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionError {
    /// [`Elections::cleanup`] has run: this instance takes no new leases.
    #[error("elections are cleaned up and take no new leases")]
    CleanedUp,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Acquires and keeps leases in a store, arming one [`Killer`] for all of them.
pub struct Elections {
    store: Arc<dyn Store>,
    killer: Arc<Killer>,
    clock: Arc<dyn Clock>,
    /// Where renewals and the next step due are reported.
    ops: Ops,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    cleaned_up: bool,
    /// Where hosts waiting for our leases stand ([`Elections::hand_over_to`]).
    candidates: Option<Candidates>,
    held: HashMap<String, Held>,
    /// Acquisitions dropped while their insert was in flight (key → value, lease): the write
    /// may still land in the store, so cleanup deletes our record there.
    abandoned: HashMap<String, (String, Duration)>,
}

impl State {
    /// The killer's deadline: the earliest `last successful write + 0.8·L` of every lease still
    /// held (lost ones included, until they are released: their services may still run).
    fn killer_deadline(&self) -> Option<Timestamp> {
        earliest(self.held.values().map(|h| &h.local))
    }
}

/// A lease this instance holds, with its renewal loop.
struct Held {
    /// Every value the record may have now: the last one confirmed written first, then any
    /// written since without an answer (a renewal carrying a new list of running services
    /// that timed out, or is still in flight). All of them are ours.
    values: Vec<String>,
    lease: Duration,
    /// The killer's part and the guests' deadline, pulled in to *now* on loss and before
    /// the record is deleted. Moved only here, under the state lock, so a renewal that ends
    /// as the lease is released cannot move it later again.
    local: LocalLease,
    stop: CancellationToken,
    lost: CancellationToken,
    renewal: JoinHandle<()>,
}

/// One lease held: its term, its *lost* signal and its local deadline.
#[derive(Clone, Debug)]
pub struct Leadership {
    key: String,
    term: Term,
    lost: CancellationToken,
    deadline: LeaseDeadline,
    running: RunningReport,
}

impl Leadership {
    /// The store key of the lease.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing term issued at acquisition.
    pub fn term(&self) -> Term {
        self.term
    }

    /// Resolves when the leadership ends: lost, released or cleaned up.
    pub async fn lost(&self) {
        self.lost.cancelled().await;
    }

    /// True once the leadership has ended.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// The local lease deadline, moved by every successful renewal.
    pub fn deadline(&self) -> LeaseDeadline {
        self.deadline.clone()
    }

    /// Where the services under this lease say which of them run: the next renewal writes
    /// it into the record ([`crate::lease_value`]).
    pub fn running_report(&self) -> RunningReport {
        self.running.clone()
    }
}

impl Elections {
    /// Elections over `store`, arming `killer` while leases are held, with deadlines on
    /// `clock`, reporting renewals and the next step due to `ops`.
    pub fn new(
        store: Arc<dyn Store>,
        killer: Arc<Killer>,
        clock: Arc<dyn Clock>,
        ops: Ops,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            killer,
            clock,
            ops,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Updates are single inserts and removals: a poisoned map is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tries once to acquire `key` with `value` for `lease`. `Ok(None)`: someone holds it.
    ///
    /// On success the killer is armed for `start + 0.8·L` (`start` taken before the write)
    /// and a renewal loop keeps the lease until it is lost or released.
    ///
    /// # Errors
    /// [`ElectionError::CleanedUp`] after [`Elections::cleanup`], or the store's error.
    pub async fn acquire(
        self: &Arc<Self>,
        key: &str,
        value: &str,
        lease: Duration,
    ) -> Result<Option<Leadership>, ElectionError> {
        if self.lock().cleaned_up {
            return Err(ElectionError::CleanedUp);
        }
        let start = self.clock.now();
        let inserted = {
            // If the caller drops this future mid-write, or the write fails (it may have
            // been applied all the same), cleanup still deletes our record.
            let guard = InFlight {
                elections: self,
                key,
                value,
                lease,
            };
            let inserted = self.store.insert_if_absent(key, value, lease).await?;
            std::mem::forget(guard);
            inserted
        };
        let Some(term) = inserted else {
            return Ok(None);
        };
        self.lead(key, value, value, term, lease, start).await
    }

    /// Takes over `key`, whose live `record` (read starting at `read_start`) carries our
    /// `holder`: a lease a releasing holder handed to us ([`Elections::hand_over_to`]), or
    /// our own insert that failed and was applied all the same. No write: the record lives
    /// at least until `read_start + record.lives_at_least`, so the lease counts as written L
    /// before that, and the deadlines are the usual 0.8·L after it. `Ok(None)` if that
    /// leaves no time (the record is then deleted).
    ///
    /// # Errors
    /// [`ElectionError::CleanedUp`] after [`Elections::cleanup`].
    pub async fn adopt(
        self: &Arc<Self>,
        key: &str,
        holder: &str,
        record: &Record,
        read_start: Timestamp,
        lease: Duration,
    ) -> Result<Option<Leadership>, ElectionError> {
        if self.lock().cleaned_up {
            return Err(ElectionError::CleanedUp);
        }
        let written = read_start.after(record.lives_at_least).before(lease);
        tracing::debug!(key, term = record.term, "taking over a lease that names us");
        self.lead(key, holder, &record.value, record.term, lease, written)
            .await
    }

    /// Leads `key`, whose record holds `value` (our `holder`, maybe with our services) under
    /// `term`, written at `start` or later: arms the killer, starts the renewal loop.
    async fn lead(
        self: &Arc<Self>,
        key: &str,
        holder: &str,
        value: &str,
        term: Term,
        lease: Duration,
        start: Timestamp,
    ) -> Result<Option<Leadership>, ElectionError> {
        let local = LocalLease::written(start, lease);
        if !local.usable(self.clock.now()) {
            // The write took so long that the lease is already past its local deadline: arming
            // the killer now would end a process that runs no service. Give it straight back.
            tracing::warn!(key, term, "acquired too late to use; releasing");
            self.delete_bounded(key, value, lease).await;
            return Ok(None);
        }
        let deadline = local.deadline(Arc::clone(&self.clock));
        let (running, running_rx) = RunningReport::new();
        let lost = CancellationToken::new();
        let registered = {
            let mut state = self.lock();
            if state.cleaned_up {
                false
            } else {
                // Armed under the lock, so cleanup cannot slip between arming and recording.
                // With several leases the killer keeps the earliest deadline of them all.
                let held = state.held.values().map(|h| &h.local);
                if let Some(earliest) = earliest(held.chain([&local])) {
                    self.killer.arm(earliest);
                }
                let stop = CancellationToken::new();
                let renewal = tokio::spawn(Arc::clone(self).renew(Renewal {
                    key: key.to_owned(),
                    holder: holder.to_owned(),
                    value: value.to_owned(),
                    running: running_rx,
                    lease,
                    last_start: start,
                    stop: stop.clone(),
                    lost: lost.clone(),
                }));
                let held = Held {
                    values: vec![value.to_owned()],
                    lease,
                    local,
                    stop,
                    lost: lost.clone(),
                    renewal,
                };
                state.abandoned.remove(key);
                state.held.insert(key.to_owned(), held);
                true
            }
        };
        if !registered {
            // Cleanup ran during the write: give the lease straight back.
            self.delete_bounded(key, value, lease).await;
            return Err(ElectionError::CleanedUp);
        }
        tracing::info!(key, term, lease_ms = lease.as_millis(), "acquired");
        Ok(Some(Leadership {
            key: key.to_owned(),
            term,
            lost,
            deadline,
            running,
        }))
    }

    /// From now on a release hands the lease to one of `candidates` ([`Elections::stand`])
    /// in the same write, if one is live ([`crate::store::TtlStore::hand_over`]).
    pub fn hand_over_to(&self, candidates: Candidates) {
        self.lock().candidates = Some(candidates);
    }

    /// Reads ahead what releasing our leases will need
    /// ([`crate::store::TtlStore::prepare_hand_over`]): the shutdown sequence runs this while
    /// the services stop, so that the release that follows is one write (on etcd, the
    /// candidates' read leaves the takeover's path).
    pub async fn prepare_release(&self) {
        let candidates = {
            let state = self.lock();
            if state.held.is_empty() {
                return;
            }
            state.candidates.clone()
        };
        if let Some(candidates) = candidates {
            self.store.prepare_hand_over(&candidates).await;
        }
    }

    /// Releases `key`: passes the guests' deadline, deletes our record, fires *lost*, and
    /// waits for the renewal loop to end. Releasing a key this instance does not hold is a no-op.
    pub async fn release(&self, key: &str) {
        let Some(held) = self.lock().held.remove(key) else {
            return;
        };
        held.stop.cancel();
        self.ops.health().idle();
        // Whatever still runs under this lease (nothing, after an orderly shutdown) has no
        // effect from here on: the record is about to go, and another host may take it.
        held.local.pull_in(self.clock.now());
        // A renewal stopped mid-write may still land: every value we may have written is tried.
        let candidates = self.lock().candidates.clone();
        for value in &held.values {
            let released = self
                .release_bounded(key, value, candidates.as_ref(), held.lease)
                .await;
            if released {
                break;
            }
        }
        held.lost.cancel();
        // The loop ends at its next await point; it never panics on its own.
        let _ = held.renewal.await;
    }

    /// Refuses new acquisitions from now on, releases every lease, and returns when every
    /// renewal loop has ended. Leaves the killer armed: disarming is the caller's last step.
    /// Bounded even if the store stalls: each delete waits at most `L/4`.
    pub async fn cleanup(&self) {
        let (keys, abandoned): (Vec<String>, Vec<_>) = {
            let mut state = self.lock();
            state.cleaned_up = true;
            (
                state.held.keys().cloned().collect(),
                state.abandoned.drain().collect(),
            )
        };
        for key in keys {
            self.release(&key).await;
        }
        // An abandoned insert may still be running in the store: its delete must come after.
        if let Some(lease) = abandoned.iter().map(|(_, (_, lease))| *lease).max() {
            self.store.settle(release_patience(lease)).await;
        }
        for (key, (value, lease)) in abandoned {
            self.delete_bounded(&key, &value, lease).await;
        }
    }

    /// Deletes our record under `key` if it has `value`, waiting at most `L/4`: past that it
    /// expires anyway. Returns false only when the record did not have `value`.
    async fn delete_bounded(&self, key: &str, value: &str, lease: Duration) -> bool {
        self.release_bounded(key, value, None, lease).await
    }

    /// Releases our record under `key` if it has `value`: hands it to one of `candidates`
    /// if any is live, else deletes it. Waits at most `L/4`: past that the record expires
    /// anyway. Returns false only when the record did not have `value`.
    async fn release_bounded(
        &self,
        key: &str,
        value: &str,
        candidates: Option<&Candidates>,
        lease: Duration,
    ) -> bool {
        let release = async {
            match candidates {
                Some(candidates) => self.store.hand_over(key, value, candidates, lease).await,
                None => Ok(HandOver::deleted_if(
                    self.store.compare_and_delete(key, value).await?,
                )),
            }
        };
        match tokio::time::timeout(release_patience(lease), release).await {
            Ok(Ok(HandOver::To { to, term })) => {
                let to = lease_value::holder(&to);
                tracing::info!(key, deleted = true, to, term, "released");
                true
            }
            Ok(Ok(released)) => {
                let deleted = released == HandOver::Deleted;
                tracing::info!(key, deleted, "released");
                deleted
            }
            Ok(Err(e)) => {
                tracing::warn!(key, error = %e, "release failed; the record will expire");
                true
            }
            Err(_) => {
                tracing::warn!(key, "release timed out; the record will expire");
                true
            }
        }
    }
}

/// Marks an insert in flight: dropped before it is forgotten (the caller dropped `acquire`
/// mid-write), it records the key so [`Elections::cleanup`] deletes a record that may have
/// landed after all.
struct InFlight<'a> {
    elections: &'a Elections,
    key: &'a str,
    value: &'a str,
    lease: Duration,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        tracing::debug!(key = self.key, "acquisition abandoned mid-write");
        self.elections
            .lock()
            .abandoned
            .insert(self.key.to_owned(), (self.value.to_owned(), self.lease));
    }
}

/// State of one renewal loop.
struct Renewal {
    key: String,
    /// The holder value the record was inserted with.
    holder: String,
    /// The value last confirmed written: the holder, then with the running services.
    value: String,
    /// The services running under this lease (and those refused), written with each renewal.
    running: watch::Receiver<Report>,
    lease: Duration,
    /// Start of the last successful write.
    last_start: Timestamp,
    stop: CancellationToken,
    lost: CancellationToken,
}
