//! The killer (SPEC §4): a watchdog thread that ends the process if lease renewal stalls.
//!
//! Armed at acquisition and moved later only by a successful write, it fires at the local
//! lease deadline unless the shutdown sequence disarms it first. It runs on its own OS thread,
//! so it fires even when the async runtime is stalled.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use tokio::time::Instant;

/// The exit code of a process ended by the killer: `EX_TEMPFAIL` from `sysexits.h`, distinct
/// from a normal exit (0) and from an error exit (1). A supervisor may restart the host.
pub const KILLER_EXIT_CODE: i32 = 75;

/// What the killer does when it fires. The default exits the process; tests inject their own.
pub type KillAction = Arc<dyn Fn() + Send + Sync>;

/// The watchdog of one elections instance. Cheap to share behind an `Arc`.
pub struct Killer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    action: KillAction,
}

#[derive(Default)]
struct State {
    /// When to fire; `None` while disarmed.
    deadline: Option<Instant>,
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

impl Default for Killer {
    fn default() -> Self {
        Self::new()
    }
}

impl Killer {
    /// A disarmed killer whose action ends the process with [`KILLER_EXIT_CODE`].
    pub fn new() -> Self {
        Self::with_action(Arc::new(|| std::process::exit(KILLER_EXIT_CODE)))
    }

    /// A disarmed killer that runs `action` when it fires (tests record instead of exiting).
    pub fn with_action(action: KillAction) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::default(),
                wake: Condvar::new(),
                action,
            }),
            thread: Mutex::new(None),
        }
    }

    /// Arms the killer to fire at `deadline`, or moves an armed killer's deadline there.
    ///
    /// Callers uphold SPEC §4: only a successful write may move the deadline later. Starts
    /// the watchdog thread if it is not running. Never blocks on the async runtime.
    pub fn arm(&self, deadline: Instant) {
        let was_armed = {
            let mut state = self.shared.lock();
            let was_armed = state.deadline.replace(deadline).is_some();
            state.stop = false;
            was_armed
        };
        self.shared.wake.notify_all();
        if !was_armed {
            tracing::info!(in_ms = ms_until(deadline), "killer armed");
        }
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        if thread.as_ref().is_none_or(JoinHandle::is_finished) {
            let shared = Arc::clone(&self.shared);
            *thread = Some(
                std::thread::Builder::new()
                    .name("vvm-killer".into())
                    .spawn(move || watch(&shared))
                    // Without the thread there is no guarantee left to give: stop here.
                    .unwrap_or_else(|e| {
                        tracing::error!(error = %e, "cannot start the killer thread");
                        std::process::exit(KILLER_EXIT_CODE)
                    }),
            );
        }
    }

    /// The armed deadline, or `None` while disarmed.
    pub fn deadline(&self) -> Option<Instant> {
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

/// The watchdog thread: sleeps until the deadline, fires unless disarmed or moved.
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
        // Compare on the real clock: the async runtime may be stalled or its time paused.
        let now = std::time::Instant::now();
        let at = deadline.into_std();
        if now >= at {
            state.fired = true;
            drop(state);
            tracing::error!(
                late_ms = now.duration_since(at).as_millis(),
                exit_code = KILLER_EXIT_CODE,
                "killer fired: lease renewal stalled past the local deadline"
            );
            (shared.action)();
            return;
        }
        state = shared
            .wake
            .wait_timeout(state, at - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

fn ms_until(deadline: Instant) -> u128 {
    deadline
        .saturating_duration_since(Instant::now())
        .as_millis()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn counting() -> (Arc<AtomicUsize>, Killer) {
        let fired = Arc::new(AtomicUsize::new(0));
        let action = {
            let fired = Arc::clone(&fired);
            Arc::new(move || {
                fired.fetch_add(1, Ordering::SeqCst);
            })
        };
        (fired, Killer::with_action(action))
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
        let (fired, killer) = counting();
        let armed_at = std::time::Instant::now();
        killer.arm(Instant::now() + Duration::from_millis(30));
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
        assert!(
            armed_at.elapsed() >= Duration::from_millis(30),
            "fired early"
        );
        assert!(killer.has_fired());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(fired.load(Ordering::SeqCst), 1, "fires exactly once");
    }

    #[test]
    fn disarm_before_the_deadline_prevents_firing_and_joins_the_thread() {
        let (fired, killer) = counting();
        killer.arm(Instant::now() + Duration::from_millis(40));
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

    #[test]
    fn moving_the_deadline_later_postpones_firing() {
        let (fired, killer) = counting();
        let start = std::time::Instant::now();
        killer.arm(Instant::now() + Duration::from_millis(20));
        killer.arm(Instant::now() + Duration::from_millis(120));
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
        assert!(start.elapsed() >= Duration::from_millis(120));
    }

    #[test]
    fn fires_while_the_async_runtime_is_blocked() {
        let (fired, killer) = counting();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            killer.arm(Instant::now() + Duration::from_millis(20));
            // Block the only runtime thread: no task can run, the killer still must.
            std::thread::sleep(Duration::from_millis(200));
        });
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn dropped_while_armed_still_fires() {
        let (fired, killer) = counting();
        killer.arm(Instant::now() + Duration::from_millis(20));
        drop(killer);
        assert!(wait_until(|| fired.load(Ordering::SeqCst) == 1));
    }
}
