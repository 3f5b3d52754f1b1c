//! The threads incoming HTTP runs on (SPEC §14, "Nothing a client does costs the lease"): a
//! tokio runtime of its own, apart from the host's main runtime, where the lease's renewals,
//! the store's clients, the supervisors and the schedules run.
//!
//! On one runtime, a flood of connections (or of requests) puts thousands of ready tasks in
//! front of the renewal each time its timer fires: measured under a slowloris of 18 500
//! connections at L = 2 s, one renewal in six began 100–410 ms late, and on a busier machine
//! the killer ended the leader (issue 52). A busy guest never did that: it yields at every
//! epoch tick. Apart, the lease's worker threads sleep until a timer or an answer wakes them,
//! and the kernel runs a thread that slept ahead of those that did not; the HTTP workers also
//! run at a lower priority (nice +5, per thread), so that under a full machine the lease's
//! work comes first. Every task of incoming HTTP (a door's accept loop, its connections,
//! their requests and the guest calls inside them) runs here: each is spawned from another.

use std::future::Future;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio::task::JoinHandle;

/// How much lower than the host's the HTTP workers' priority is (a nice value, added).
const NICER_BY: i32 = 5;

/// Incoming HTTP's runtime; shut down (without waiting for its tasks) when dropped.
pub(crate) struct Workers {
    runtime: Option<Runtime>,
    handle: Handle,
}

impl Workers {
    /// A runtime of as many worker threads as the machine has CPUs, named `vvm-http`, each
    /// at a lower priority than the host's. Where none can be started (no thread to be had),
    /// the current runtime serves HTTP, with a line saying so.
    pub(crate) fn start() -> Self {
        let built = Builder::new_multi_thread()
            .thread_name("vvm-http")
            .enable_all()
            .on_thread_start(lower_priority)
            .build();
        match built {
            Ok(runtime) => Self {
                handle: runtime.handle().clone(),
                runtime: Some(runtime),
            },
            Err(e) => {
                tracing::error!(error = %e, "no runtime of its own for incoming HTTP: it shares the host's");
                Self {
                    runtime: None,
                    handle: Handle::current(),
                }
            }
        }
    }

    /// Runs `task` on these workers.
    pub(crate) fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(task)
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Not `drop`: that waits for the workers, which an async context must not do.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Lowers the calling thread's priority by [`NICER_BY`] (Linux: `setpriority` on a thread id
/// sets that thread's alone). Best effort: a thread that cannot is left as it is.
fn lower_priority() {
    let me = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
    let _ = rustix::process::setpriority_process(Some(me), now.saturating_add(NICER_BY));
}
