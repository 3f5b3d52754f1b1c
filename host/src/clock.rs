//! Time for leases (SPEC §3, §4): `CLOCK_BOOTTIME` readings, for store expiry and for the local
//! lease deadline and the killer.
//!
//! `CLOCK_BOOTTIME` keeps counting while the machine is suspended; `CLOCK_MONOTONIC` (tokio's
//! and std's `Instant`) does not. A deadline kept on the monotonic clock would still lie in the
//! future after a resume from a suspend longer than the lease, while the store (redb on
//! `CLOCK_BOOTTIME`, etcd on its own clock) has long let the record expire and another host
//! leads. So every lease deadline in this crate is a [`Timestamp`] read from a [`Clock`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A reading of a store clock: which boot of the machine, and how long since that boot began.
///
/// Two readings from different boots are not comparable: a record written before a reboot
/// reads as expired after it.
/// Ordered by boot, then time since boot: only readings of one boot compare meaningfully.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Identifies one boot of the machine (the kernel's random boot id).
    pub boot: u128,
    /// Time since that boot, counting suspend (`CLOCK_BOOTTIME`), never stepped.
    pub since_boot: Duration,
}

impl Timestamp {
    /// This reading moved `d` later.
    #[must_use]
    pub fn after(self, d: Duration) -> Self {
        Self {
            boot: self.boot,
            since_boot: self.since_boot.saturating_add(d),
        }
    }

    /// This reading moved `d` earlier (no earlier than the boot).
    #[must_use]
    pub fn before(self, d: Duration) -> Self {
        Self {
            boot: self.boot,
            since_boot: self.since_boot.saturating_sub(d),
        }
    }

    /// Time left from `now` until `self`, or `None` if `self` has been reached (expiry is
    /// inclusive: a record is expired when now >= expiry) or belongs to another boot.
    pub fn left_from(self, now: Timestamp) -> Option<Duration> {
        if self.boot != now.boot {
            return None;
        }
        self.since_boot
            .checked_sub(now.since_boot)
            .filter(|left| !left.is_zero())
    }
}

/// The wall clock in whole seconds since the Unix epoch (0 if it reads earlier), for records
/// people read (a service's `since`, a hand-over's time), never for deadlines.
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The wall clock in milliseconds since the Unix epoch (0 if it reads earlier), for records
/// people read, never for deadlines.
pub fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `now + d` on tokio's clock without overflow: a `d` beyond the clock's range (a setting
/// of years, `Duration::MAX`) gives a moment a century away, which nothing waits for.
pub fn tokio_after(now: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_hours(100 * 365 * 24))
}

/// A source of [`Timestamp`]s. Shared by the stores, elections and killer of one process, and
/// read from any thread (the killer's included).
pub trait Clock: Send + Sync + 'static {
    /// The current reading.
    fn now(&self) -> Timestamp;
}

/// The machine's clock: the kernel boot id plus `CLOCK_BOOTTIME`, so expiry does not move when
/// the wall clock is stepped and records from before a reboot read as expired.
#[derive(Clone, Debug)]
pub struct SystemClock {
    boot: u128,
}

impl SystemClock {
    /// Reads the kernel's boot id once.
    ///
    /// # Errors
    /// When `/proc/sys/kernel/random/boot_id` cannot be read or parsed.
    pub fn new() -> std::io::Result<Self> {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
        let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
        let boot = u128::from_str_radix(&hex, 16).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("kernel boot id {text:?}: {e}"),
            )
        })?;
        Ok(Self { boot })
    }

    /// The machine's clock for deadlines that never leave this process (the local lease
    /// deadline, the killer): one boot id stands for this boot, so reading the kernel's is not
    /// needed and nothing can fail.
    pub fn local() -> Self {
        Self { boot: 0 }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Timestamp {
            boot: self.boot,
            // Boot time is never negative.
            since_boot: Duration::new(
                u64::try_from(ts.tv_sec).unwrap_or(0),
                u32::try_from(ts.tv_nsec).unwrap_or(0),
            ),
        }
    }
}

/// A clock that moves only when told to, for deterministic tests.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<Timestamp>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self {
            now: Arc::new(Mutex::new(Timestamp {
                boot: 1,
                since_boot: Duration::from_secs(1000),
            })),
        }
    }
}

impl ManualClock {
    /// Moves the clock `d` later.
    pub fn advance(&self, d: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = now.after(d);
    }

    /// Simulates a reboot: a new boot id, time since boot starting again.
    pub fn reboot(&self) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = Timestamp {
            boot: now.boot + 1,
            since_boot: Duration::from_secs(1),
        };
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Follows tokio's clock, so `tokio::time::pause` and `advance` drive store expiry, the
/// elections' timers and the killer together in tests. [`TokioClock::suspend`] moves it on
/// without moving tokio's clock, as a machine's boot time moves while it sleeps.
#[derive(Clone, Debug)]
pub struct TokioClock {
    base: tokio::time::Instant,
    /// The runtime whose (possibly paused) clock this follows, entered to read it from other
    /// threads such as the killer's; `None` when made outside a runtime.
    runtime: Option<tokio::runtime::Handle>,
    /// Time spent "suspended": counted here, not by tokio.
    suspended: Arc<Mutex<Duration>>,
}

impl TokioClock {
    /// A clock whose zero is now. Must be created inside a tokio runtime if time is paused.
    pub fn new() -> Self {
        Self {
            base: tokio::time::Instant::now(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            suspended: Arc::default(),
        }
    }

    /// The reading this clock gives at tokio instant `t` (with the suspends so far).
    pub fn at(&self, t: tokio::time::Instant) -> Timestamp {
        let suspended = *self
            .suspended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Timestamp {
            boot: 1,
            since_boot: Duration::from_secs(1000)
                + t.saturating_duration_since(self.base)
                + suspended,
        }
    }

    /// Simulates a suspend of the machine for `d`: boot time jumps, monotonic time does not.
    pub fn suspend(&self, d: Duration) {
        let mut suspended = self
            .suspended
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *suspended = suspended.saturating_add(d);
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        // Outside the runtime's context tokio would read the real clock, not the paused one.
        let _entered = self.runtime.as_ref().map(tokio::runtime::Handle::enter);
        self.at(tokio::time::Instant::now())
    }
}
