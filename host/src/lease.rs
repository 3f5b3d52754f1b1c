//! The local lease (SPEC §4): the deadline past which no guest effect may happen, and the
//! tempo every lease of `L` keeps, for a slot (elections) and a spread claim alike.
//!
//! It sits below everything that reads it (ops, services, the runtime's fence, elections,
//! spread placement) and uses only the clock. The tempo of `L`, in one place:
//!
//! | step | when | why |
//! |---|---|---|
//! | renew | every `L/4` | three attempts fit before `0.8·L` |
//! | one attempt | waits at most `L/10` | a stalled store is one failed attempt |
//! | between attempts | `L/20` ([`retry_pause`]) | also the campaign's pause after an error |
//! | a release | waits at most `L/4` | past it the record expires on its own |
//! | the deadline | `0.8·L` after a write began ([`valid_until`]) | `0.2·L` before expiry |

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::{Clock, Timestamp};

/// Renewal attempts per tick before the lease is given up.
pub(crate) const RENEW_ATTEMPTS: u32 = 3;

/// How often a lease of `L` is renewed: `L/4`.
pub(crate) fn renew_every(lease: Duration) -> Duration {
    lease / 4
}

/// How long one renewal attempt (or any one store call on the lease's path) waits for the
/// store: `L/10`.
pub(crate) fn attempt_patience(lease: Duration) -> Duration {
    lease / 10
}

/// The pause between failed store calls of a lease `lease` long, for renewal and campaign
/// alike: `L/20`, so a renewal tick has room for its attempts.
pub(crate) fn retry_pause(lease: Duration) -> Duration {
    lease / 20
}

/// How long a release waits for the store to delete the record: `L/4`. Past that the record
/// expires on its own, and a stalled store must not hang the shutdown sequence.
pub(crate) fn release_patience(lease: Duration) -> Duration {
    lease / 4
}

/// The local lease deadline for a write that started at `start`: `start + 0.8·L`.
pub fn valid_until(start: Timestamp, lease: Duration) -> Timestamp {
    start.after(lease.mul_f64(0.8))
}

/// One lease held here (a slot, or a spread claim), as the local lease rule sees it: the
/// killer's part, *start of the last successful write + 0.8·L*, which only a write moves and
/// never a loss; and the guests' deadline ([`LeaseDeadline`]), which follows it while the lease
/// is in use and is pulled in to *now* once it is lost or let go. The killer waits for the
/// earliest killer's part of every lease held ([`earliest`]).
#[derive(Debug)]
pub(crate) struct LocalLease {
    written_until: Timestamp,
    deadline: watch::Sender<Timestamp>,
}

impl LocalLease {
    /// A lease whose write began at `start`.
    pub(crate) fn written(start: Timestamp, lease: Duration) -> Self {
        let until = valid_until(start, lease);
        Self {
            written_until: until,
            deadline: watch::Sender::new(until),
        }
    }

    /// False when the write took so long that the deadline had passed by `now`: arming the
    /// killer for it would end a process that runs nothing under it; give it back unused.
    pub(crate) fn usable(&self, now: Timestamp) -> bool {
        self.written_until.left_from(now).is_some()
    }

    /// A renewal that began at `start` was written: the killer's part moves, and the guests'
    /// deadline with it if `guests` (not once the lease is lost or its service is stopping:
    /// their deadline never moves later again).
    pub(crate) fn renewed(&mut self, start: Timestamp, lease: Duration, guests: bool) {
        self.written_until = valid_until(start, lease);
        if guests {
            self.deadline.send_replace(self.written_until);
        }
    }

    /// Lost or let go at `now`: no guest effect from now on. The killer's part stays.
    pub(crate) fn pull_in(&self, now: Timestamp) {
        self.deadline.send_replace(now);
    }

    /// The killer's part.
    pub(crate) fn written_until(&self) -> Timestamp {
        self.written_until
    }

    /// The guests' deadline, read on `clock`.
    pub(crate) fn deadline(&self, clock: Arc<dyn Clock>) -> LeaseDeadline {
        LeaseDeadline::from_sender(clock, &self.deadline)
    }
}

/// The killer's deadline for `leases`: the earliest killer's part, if any is held.
pub(crate) fn earliest<'a>(leases: impl IntoIterator<Item = &'a LocalLease>) -> Option<Timestamp> {
    leases.into_iter().map(LocalLease::written_until).min()
}

/// The longest [`LeaseDeadline::passed`] sleeps before it looks at the clock again.
pub const DEADLINE_NAP: Duration = Duration::from_millis(50);

/// The local lease deadline (*valid-until*): the start of the last successful write plus
/// 0.8·L, or the moment the lease was known lost. Past it no guest output or host call may
/// take effect (SPEC §4, §6). Read on a [`Clock`] that counts suspend. Cheap to clone.
#[derive(Clone)]
pub struct LeaseDeadline {
    until: watch::Receiver<Timestamp>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for LeaseDeadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseDeadline")
            .field("until", &self.get())
            .field("left", &self.time_left())
            .finish()
    }
}

impl LeaseDeadline {
    /// A deadline on `clock` that never moves, for tests and tools.
    pub fn fixed(clock: Arc<dyn Clock>, at: Timestamp) -> Self {
        Self::manual(clock, at).1
    }

    /// A deadline on `clock` moved by the returned sender.
    pub fn manual(clock: Arc<dyn Clock>, at: Timestamp) -> (watch::Sender<Timestamp>, Self) {
        let (tx, until) = watch::channel(at);
        (tx, Self { until, clock })
    }

    /// A deadline on `clock` that follows `tx` (spread placement keeps one per claim).
    pub fn from_sender(clock: Arc<dyn Clock>, tx: &watch::Sender<Timestamp>) -> Self {
        Self {
            until: tx.subscribe(),
            clock,
        }
    }

    /// The moment the lease stops being valid locally.
    pub fn get(&self) -> Timestamp {
        *self.until.borrow()
    }

    /// Time left until the deadline, or `None` once it has been reached (inclusive).
    pub fn time_left(&self) -> Option<Duration> {
        self.get().left_from(self.clock.now())
    }

    /// True once the deadline has been reached (inclusive).
    pub fn has_passed(&self) -> bool {
        self.time_left().is_none()
    }

    /// Resolves once the deadline has passed. Every poll looks at the clock first, so a
    /// `select!` that polls this before the work it fences never lets that work run a step
    /// past the deadline (after a `SIGSTOP`, say), whatever woke it. Between polls it wakes at
    /// most [`DEADLINE_NAP`] after the deadline: the wait is cut into naps of at most that,
    /// so a suspend (which timers do not count) or a clock moved by a test is seen too; a
    /// deadline moved earlier wakes it at once.
    pub fn passed(&self) -> impl Future<Output = ()> + Send + '_ {
        let mut wait = Box::pin(self.naps());
        std::future::poll_fn(move |cx| {
            if self.has_passed() {
                std::task::Poll::Ready(())
            } else {
                wait.as_mut().poll(cx)
            }
        })
    }

    /// Resolves once the deadline is ahead again: at once while it has not passed, else when
    /// a renewal moves it later (spread placement's membership is renewed after a loss; a
    /// slot's or a claim's deadline never moves later once passed, so this waits for ever).
    pub async fn ahead(&self) {
        let mut until = self.until.clone();
        while self.has_passed() {
            if until.changed().await.is_err() {
                // Gone: it can no longer move.
                std::future::pending::<()>().await;
            }
        }
    }

    async fn naps(&self) {
        let mut until = self.until.clone();
        let mut moves = true;
        while let Some(left) = self.time_left() {
            let nap = tokio::time::sleep(left.min(DEADLINE_NAP));
            if !moves {
                nap.await;
                continue;
            }
            tokio::select! {
                () = nap => {}
                // Gone: the deadline can no longer move, naps alone tell.
                changed = until.changed() => moves = changed.is_ok(),
            }
        }
    }
}
