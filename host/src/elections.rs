//! Elections (SPEC §4): acquire, renew and release leases; the local lease deadline.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::killer::Killer;
use crate::store::{Store, StoreError, Term};

/// Renew every `L / RENEW_DIVISOR`.
const RENEW_DIVISOR: u32 = 4;
/// Between failed renewal attempts wait `L / RETRY_DIVISOR`.
const RETRY_DIVISOR: u32 = 20;
/// Renewal attempts per tick before the lease is given up.
const CAS_ATTEMPTS: u32 = 3;
/// A release waits at most `L / RELEASE_DIVISOR` for the store to delete the record: past that
/// the record expires on its own, and a stalled store must not hang the shutdown sequence.
const RELEASE_DIVISOR: u32 = 4;

/// The local lease deadline for a write that started at `start`: `start + 0.8·L`.
pub fn valid_until(start: Instant, lease: Duration) -> Instant {
    start + lease.mul_f64(0.8)
}

/// The local lease deadline (*valid-until*): the start of the last successful write plus
/// 0.8·L. Past it no guest output or host call may take effect (SPEC §4, §6). Cheap to clone.
#[derive(Clone, Debug)]
pub struct LeaseDeadline(watch::Receiver<Instant>);

impl LeaseDeadline {
    /// A deadline that never moves, for tests and tools.
    pub fn fixed(at: Instant) -> Self {
        Self(watch::channel(at).1)
    }

    /// A deadline moved by the returned sender.
    pub fn manual(at: Instant) -> (watch::Sender<Instant>, Self) {
        let (tx, rx) = watch::channel(at);
        (tx, Self(rx))
    }

    /// The instant the lease stops being valid locally.
    pub fn get(&self) -> Instant {
        *self.0.borrow()
    }

    /// True once the deadline has been reached (inclusive).
    pub fn has_passed(&self) -> bool {
        Instant::now() >= self.get()
    }
}

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
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    cleaned_up: bool,
    held: HashMap<String, Held>,
    /// Acquisitions dropped while their insert was in flight (key → value, lease): the write
    /// may still land in the store, so cleanup deletes our record there.
    abandoned: HashMap<String, (String, Duration)>,
}

impl State {
    /// The earliest local deadline of every lease still held (lost ones included, until they
    /// are released: their services may still run), or `also` if earlier.
    fn earliest_deadline(&self, also: Instant) -> Instant {
        self.held
            .values()
            .map(|h| h.deadline.get())
            .fold(also, Instant::min)
    }
}

/// A lease this instance holds, with its renewal loop.
struct Held {
    value: String,
    lease: Duration,
    deadline: LeaseDeadline,
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
}

impl Elections {
    /// Elections over `store`, arming `killer` while leases are held.
    pub fn new(store: Arc<dyn Store>, killer: Arc<Killer>) -> Arc<Self> {
        Arc::new(Self {
            store,
            killer,
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
        let start = Instant::now();
        let inserted = {
            // If the caller drops this future mid-write, cleanup still deletes our record.
            let guard = InFlight {
                elections: self,
                key,
                value,
                lease,
            };
            let inserted = self.store.insert_if_absent(key, value, lease).await;
            std::mem::forget(guard);
            inserted?
        };
        let Some(term) = inserted else {
            return Ok(None);
        };
        let until = valid_until(start, lease);
        if Instant::now() >= until {
            // The write took so long that the lease is already past its local deadline: arming
            // the killer now would end a process that runs no service. Give it straight back.
            tracing::warn!(key, term, "acquired too late to use; releasing");
            self.delete_bounded(key, value, lease).await;
            return Ok(None);
        }
        let (deadline_tx, deadline) = LeaseDeadline::manual(until);
        let lost = CancellationToken::new();
        let registered = {
            let mut state = self.lock();
            if state.cleaned_up {
                false
            } else {
                // Armed under the lock, so cleanup cannot slip between arming and recording.
                // With several leases the killer keeps the earliest deadline of them all.
                self.killer.arm(state.earliest_deadline(until));
                let stop = CancellationToken::new();
                let renewal = tokio::spawn(Arc::clone(self).renew(Renewal {
                    key: key.to_owned(),
                    value: value.to_owned(),
                    lease,
                    last_start: start,
                    deadline: deadline_tx,
                    stop: stop.clone(),
                    lost: lost.clone(),
                }));
                let held = Held {
                    value: value.to_owned(),
                    lease,
                    deadline: deadline.clone(),
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
        }))
    }

    /// Releases `key`: deletes our record, fires *lost*, and waits for the renewal loop to
    /// end. Releasing a key this instance does not hold is a no-op.
    pub async fn release(&self, key: &str) {
        let Some(held) = self.lock().held.remove(key) else {
            return;
        };
        held.stop.cancel();
        self.delete_bounded(key, &held.value, held.lease).await;
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
        for (key, (value, lease)) in abandoned {
            self.delete_bounded(&key, &value, lease).await;
        }
    }

    /// Deletes our record under `key`, waiting at most `L/4`: past that it expires anyway.
    async fn delete_bounded(&self, key: &str, value: &str, lease: Duration) {
        let delete = self.store.compare_and_delete(key, value);
        match tokio::time::timeout(lease / RELEASE_DIVISOR, delete).await {
            Ok(Ok(deleted)) => tracing::info!(key, deleted, "released"),
            Ok(Err(e)) => tracing::warn!(key, error = %e, "release failed; the record will expire"),
            Err(_) => tracing::warn!(key, "release timed out; the record will expire"),
        }
    }

    /// The renewal loop of one lease (SPEC §4).
    async fn renew(self: Arc<Self>, mut r: Renewal) {
        let interval = r.lease / RENEW_DIVISOR;
        let retry = r.lease / RETRY_DIVISOR;
        loop {
            tokio::select! {
                () = r.stop.cancelled() => return,
                () = sleep_until(r.last_start + interval) => {}
            }
            let mut attempt = 1;
            loop {
                let cas_start = Instant::now();
                let outcome = tokio::select! {
                    () = r.stop.cancelled() => return,
                    outcome = self.store.compare_and_swap(&r.key, &r.value, &r.value, r.lease) => outcome,
                };
                match outcome {
                    Ok(true) => {
                        let until = valid_until(cas_start, r.lease);
                        // Only a successful write moves the deadlines later; the killer keeps
                        // the earliest deadline of every lease held.
                        r.deadline.send_replace(until);
                        {
                            let state = self.lock();
                            self.killer.arm(state.earliest_deadline(until));
                        }
                        r.last_start = cas_start;
                        tracing::debug!(key = r.key, "renewed");
                        break;
                    }
                    Ok(false) => {
                        tracing::warn!(key = r.key, "lost: the record changed or expired");
                        return Self::give_up(&r);
                    }
                    Err(e) if attempt < CAS_ATTEMPTS => {
                        tracing::warn!(key = r.key, attempt, error = %e, "renewal failed, retrying");
                        attempt += 1;
                        tokio::select! {
                            () = r.stop.cancelled() => return,
                            () = sleep(retry) => {}
                        }
                    }
                    Err(e) => {
                        tracing::warn!(key = r.key, attempt, error = %e, "lost: renewal failed");
                        return Self::give_up(&r);
                    }
                }
            }
        }
    }

    /// Ends a lease from inside its renewal loop: fire *lost* at once and stop renewing.
    ///
    /// The record is deliberately left in place: the services of this lease may still be
    /// running (a guest can ignore the stop request), and deleting it now would let another
    /// host take the slot while they do. The owner deletes it with [`Elections::release`] or
    /// [`Elections::cleanup`] once its services are stopped; failing that it expires at
    /// `last write + L`, after the killer's `+ 0.8·L`.
    fn give_up(r: &Renewal) {
        r.lost.cancel();
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
    value: String,
    lease: Duration,
    /// Start of the last successful write.
    last_start: Instant,
    deadline: watch::Sender<Instant>,
    stop: CancellationToken,
    lost: CancellationToken,
}
