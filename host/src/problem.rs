//! The problem signal (SPEC §5): the first fatal error of a running VVM, reported once by
//! whoever meets it (the leadership monitor, a supervisor, a guest) and returned by shutdown.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The first fatal error of a running VVM: reported once, returned by shutdown.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// No slot in 1..=N could be acquired within the acquisition timeout.
    #[error("acquisition timeout: no slot in 1..={slots} free within {timeout:?}")]
    AcquisitionTimeout {
        /// The cluster size N.
        slots: u32,
        /// The acquisition timeout that passed.
        timeout: Duration,
    },
    /// The lease was lost (renewal failed or someone else holds the slot).
    #[error("leadership lost")]
    LeadershipLost,
    /// A service failed to start, or failed too often.
    #[error("service {name}: {reason}")]
    Service {
        /// The service's name.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// The store failed in a way retrying cannot fix.
    #[error("store: {0}")]
    Store(String),
    /// A bug: the launcher panicked. The lease was released and the services dropped.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Reports problems to a VVM: the first report wins and fires the problem signal; later ones
/// are logged and ignored. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ProblemReporter {
    inner: Arc<ProblemState>,
}

#[derive(Debug, Default)]
struct ProblemState {
    problem: OnceLock<Problem>,
    fired: CancellationToken,
}

impl ProblemReporter {
    /// Records `problem` if it is the first; returns whether it was.
    pub fn report(&self, problem: Problem) -> bool {
        let first = self.inner.problem.set(problem.clone()).is_ok();
        if first {
            tracing::warn!(%problem, "problem");
            self.inner.fired.cancel();
        } else {
            tracing::info!(%problem, "later problem ignored");
        }
        first
    }

    /// The first problem reported, if any.
    pub fn get(&self) -> Option<Problem> {
        self.inner.problem.get().cloned()
    }

    /// Waits until a problem is reported and returns it.
    pub async fn wait(&self) -> Problem {
        self.inner.fired.cancelled().await;
        // `fired` is cancelled only after `problem` is set.
        self.get().unwrap_or(Problem::LeadershipLost)
    }
}
