//! Elections (SPEC §4): acquire, renew and release leases; the local lease deadline.

use tokio::sync::watch;
use tokio::time::Instant;

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
