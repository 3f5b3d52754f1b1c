//! The killer (SPEC §4): a watchdog thread that ends the process if lease renewal stalls.
//!
//! Armed at acquisition and moved later only by a successful write, it fires at the local
//! lease deadline unless the shutdown sequence disarms it first. It runs on its own OS thread,
//! so it fires even when the async runtime is stalled.
//!
//! Two things make it trustworthy at the moment it matters:
//! - **Its clock is `CLOCK_BOOTTIME`** ([`Clock`]). A condvar wait counts monotonic time, which
//!   stops while the machine is suspended, so the thread never waits longer than [`RECHECK`]
//!   before reading the clock again: after a resume it fires within that bound.
//! - **Firing cannot block.** Logging through `tracing` can wait on the stderr lock or on a full
//!   log pipe (a stalled journald or log shipper), and `std::process::exit` flushes stdout
//!   under its lock and runs exit handlers. The default action instead writes one line through
//!   a descriptor prepared at start-up that never blocks ([`crate::log_output`]), then ends
//!   the process with `_exit`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{Clock, Timestamp};
use crate::log_output::Stderr;

/// The exit code of a process ended by the killer: `EX_TEMPFAIL` from `sysexits.h`, distinct
/// from a normal exit (0) and from an error exit (1). A supervisor may restart the host.
pub const KILLER_EXIT_CODE: i32 = 75;

/// The longest the watchdog waits before reading its clock again. Condvar waits run on the
/// monotonic clock; this bounds how late the killer fires after the machine resumes.
pub const RECHECK: Duration = Duration::from_millis(10);

/// What the killer does when it fires, given how late it is. The default ends the process;
/// tests inject their own.
pub type KillAction = Arc<dyn Fn(Duration) + Send + Sync>;

/// The watchdog of one elections instance. Cheap to share behind an `Arc`.
pub struct Killer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Told `true` at each arming and `false` at the disarming (the `vvm_killer_armed`
    /// gauge): the caller's, so that the watchdog depends on nothing above it.
    report: Option<Arc<dyn Fn(bool) + Send + Sync>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    clock: Arc<dyn Clock>,
    action: KillAction,
}

#[derive(Default)]
struct State {
    /// When to fire; `None` while disarmed.
    deadline: Option<Timestamp>,
    /// Set by `disarm` so the thread ends.
    stop: bool,
    fired: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single assignment, so a poisoned lock still holds a valid state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Killer {
    /// A disarmed killer on `clock` whose action ends the process with [`KILLER_EXIT_CODE`].
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        // Prepared now, while nothing is wrong: a description of stderr's own that never
        // blocks (`log_output`).
        let last_words = Stderr::open();
        Self::with_action(
            clock,
            Arc::new(move |late| {
                last_words.write_line(
                    format!(
                    "vvm-host: killer fired {} ms after the local lease deadline: lease renewal \
                     stalled; exiting with {KILLER_EXIT_CODE}\n",
                        late.as_millis()
                    )
                    .as_bytes(),
                );
                exit_now(KILLER_EXIT_CODE)
            }),
        )
    }

    /// A disarmed killer on `clock` that runs `action` when it fires (tests record instead of
    /// exiting).
    pub fn with_action(clock: Arc<dyn Clock>, action: KillAction) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                wake: Condvar::new(),
                clock,
                action,
            }),
            thread: Mutex::new(None),
            report: None,
        }
    }

    /// This killer, telling `report` whether it is armed at each arming and disarming.
    #[must_use]
    pub fn reporting(mut self, report: impl Fn(bool) + Send + Sync + 'static) -> Self {
        self.report = Some(Arc::new(report));
        self
    }

    /// A disarmed killer on `clock` that only counts how often it fired: for tests that watch
    /// it fire (or not) and carry on.
    pub fn counting(clock: Arc<dyn Clock>) -> (Arc<AtomicUsize>, Arc<Self>) {
        let fired = Arc::new(AtomicUsize::new(0));
        let action = {
            let fired = Arc::clone(&fired);
            Arc::new(move |_| {
                fired.fetch_add(1, Ordering::SeqCst);
            })
        };
        (fired, Arc::new(Self::with_action(clock, action)))
    }

    /// Arms the killer to fire at `deadline`, or moves an armed killer's deadline there.
    ///
    /// Callers uphold SPEC §4: only a successful write may move the deadline later. Starts
    /// the watchdog thread if it is not running. Never blocks on the async runtime.
    pub fn arm(&self, deadline: Timestamp) {
        let was_armed = {
            let mut state = self.shared.lock();
            let was_armed = state.deadline.replace(deadline).is_some();
            state.stop = false;
            was_armed
        };
        self.shared.wake.notify_all();
        if let Some(report) = &self.report {
            report(true);
        }
        self.start_thread();
        // Logged last: a stalled log pipe may block this call, but not the armed killer.
        if !was_armed {
            let in_ms = deadline
                .left_from(self.shared.clock.now())
                .unwrap_or_default()
                .as_millis();
            tracing::info!(in_ms, "killer armed");
        }
    }

    /// Starts the watchdog thread ahead of arming, disarmed: a host does this as it begins to
    /// campaign, so that taking a lease over (a few milliseconds in all) does not also spawn
    /// a thread. [`Killer::disarm`] ends it as it would an armed one.
    pub fn prepare(&self) {
        self.shared.lock().stop = false;
        self.start_thread();
    }

    /// Starts the watchdog thread unless it runs. If no thread can be started, there is no
    /// guarantee left to give: the action runs at once.
    fn start_thread(&self) {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.as_ref().is_none_or(JoinHandle::is_finished) {
            let shared = Arc::clone(&self.shared);
            match std::thread::Builder::new()
                .name("vvm-killer".into())
                .spawn(move || watch(&shared))
            {
                Ok(handle) => *thread = Some(handle),
                Err(_) => (self.shared.action)(Duration::ZERO),
            }
        }
    }

    /// The armed deadline, or `None` while disarmed.
    pub fn deadline(&self) -> Option<Timestamp> {
        self.shared.lock().deadline
    }

    /// True once the killer has fired.
    pub fn has_fired(&self) -> bool {
        self.shared.lock().fired
    }

    /// Disarms the killer and joins its thread. Only the last step of the shutdown sequence
    /// may call this: once every instance is dropped and the lease released (SPEC §4, §5).
    pub fn disarm(&self) {
        let was_armed = {
            let mut state = self.shared.lock();
            state.stop = true;
            state.deadline.take().is_some()
        };
        self.shared.wake.notify_all();
        if let Some(report) = &self.report {
            report(false);
        }
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            // The thread only waits on the condvar, so it ends promptly.
            let _ = thread.join();
        }
        if was_armed {
            tracing::info!("killer disarmed");
        }
    }
}

impl Drop for Killer {
    /// A killer dropped while armed keeps its thread: the guarantee outlives its owner.
    fn drop(&mut self) {
        let armed = self.shared.lock().deadline.is_some();
        if !armed {
            self.disarm();
        }
    }
}

/// The watchdog thread: waits until the deadline on the killer's clock, fires unless disarmed
/// or moved. Nothing after the deadline is seen may block: no logging, no lock but its own.
fn watch(shared: &Shared) {
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        let Some(deadline) = state.deadline else {
            state = shared
                .wake
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        let now = shared.clock.now();
        let Some(left) = deadline.left_from(now) else {
            state.fired = true;
            drop(state);
            let late = now.since_boot.saturating_sub(deadline.since_boot);
            (shared.action)(late);
            return;
        };
        state = shared
            .wake
            .wait_timeout(state, left.min(RECHECK))
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Ends the process at once: no exit handlers, no flushing, no lock (`_exit(2)`).
#[allow(unsafe_code)]
fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` has no preconditions: it takes an integer, touches no memory of ours,
    // and ends every thread of the process; nothing runs after it to observe any state.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SystemClock};

    fn real() -> (Arc<dyn Clock>, Arc<AtomicUsize>, Arc<Killer>) {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::local());
        let (fired, killer) = Killer::counting(Arc::clone(&clock));
        (clock, fired, killer)
    }

    fn wait_until(cond: impl Fn() -> bool) -> bool {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < end {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn fires_once_at_the_deadline_and_not_before() {
        let (clock, fired, killer) = real();
        let deadline = clock.now().after(Duration::from_millis(30));
        killer.arm(deadline);
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
        assert!(deadline.left_from(clock.now()).is_none(), "fired early");
        assert!(killer.has_fired());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(fired.load(Ordering::SeqCst), 1, "fires exactly once");
    }

    /// A suspended machine: boot time jumps past the deadline while monotonic time (which the
    /// condvar waits on) stands still. The killer must fire anyway, within [`RECHECK`].
    #[test]
    fn fires_when_boot_time_jumps_past_the_deadline_while_monotonic_time_does_not() {
        let clock = ManualClock::default();
        let (fired, killer) = Killer::counting(Arc::new(clock.clone()));
        killer.arm(clock.now().after(Duration::from_hours(1)));
        std::thread::sleep(RECHECK * 3);
        assert_eq!(fired.load(Ordering::SeqCst), 0, "an hour is left");
        clock.advance(Duration::from_hours(2));
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
    }

    #[test]
    fn disarm_before_the_deadline_prevents_firing_and_joins_the_thread() {
        let (clock, fired, killer) = real();
        killer.arm(clock.now().after(Duration::from_millis(40)));
        killer.disarm();
        assert!(killer.deadline().is_none());
        assert!(
            killer
                .thread
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_none()
        );
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(fired.load(Ordering::SeqCst), 0);
    }

    /// Arming a prepared killer starts no thread: the takeover's path only sets the deadline.
    #[test]
    fn a_prepared_killer_waits_disarmed_and_arming_it_starts_no_thread() {
        let (clock, fired, killer) = real();
        let thread_id = || {
            killer
                .thread
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .map(|t| t.thread().id())
        };
        killer.prepare();
        let prepared = thread_id().expect("prepare starts the thread");
        std::thread::sleep(RECHECK * 3);
        assert_eq!(
            fired.load(Ordering::SeqCst),
            0,
            "a disarmed killer never fires"
        );
        killer.arm(clock.now().after(Duration::from_millis(30)));
        assert_eq!(thread_id(), Some(prepared), "arming started another thread");
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
        // Prepared again after a disarm (a host campaigning again), disarmed unarmed: joined.
        killer.disarm();
        killer.prepare();
        assert!(thread_id().is_some());
        killer.disarm();
        assert_eq!(thread_id(), None, "disarm joins a prepared thread");
    }

    #[test]
    fn moving_the_deadline_later_postpones_firing() {
        let (clock, fired, killer) = real();
        killer.arm(clock.now().after(Duration::from_millis(20)));
        let later = clock.now().after(Duration::from_millis(120));
        killer.arm(later);
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
        assert!(later.left_from(clock.now()).is_none(), "fired early");
    }

    #[test]
    fn fires_while_the_async_runtime_is_blocked() {
        let (clock, fired, killer) = real();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            killer.arm(clock.now().after(Duration::from_millis(20)));
            // Block the only runtime thread: no task can run, the killer still must.
            std::thread::sleep(Duration::from_millis(200));
        });
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn dropped_while_armed_still_fires() {
        let (clock, fired, killer) = real();
        killer.arm(clock.now().after(Duration::from_millis(20)));
        drop(killer);
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
    }
}
