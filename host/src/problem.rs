//! The problem signal (SPEC §5): the first fatal error of a running VVM, reported once by
//! whoever meets it (the leadership monitor, a supervisor, a guest) and returned by shutdown.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::StoreError;

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
    Store(#[from] SharedStoreError),
    /// A bug: the launcher panicked. The lease was released and the services dropped.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A [`StoreError`] as a [`Problem`] holds it: shared by every clone of the problem, and
/// equal only to itself (store errors carry their backend's error, which cannot be compared).
#[derive(Clone, Debug, thiserror::Error)]
#[error(transparent)]
pub struct SharedStoreError(Arc<StoreError>);

impl SharedStoreError {
    /// The store's error.
    pub fn get(&self) -> &StoreError {
        &self.0
    }
}

impl From<StoreError> for SharedStoreError {
    fn from(e: StoreError) -> Self {
        Self(Arc::new(e))
    }
}

impl From<StoreError> for Problem {
    fn from(e: StoreError) -> Self {
        Self::Store(e.into())
    }
}

impl PartialEq for SharedStoreError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedStoreError {}

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
        match self.inner.problem.set(problem) {
            Ok(()) => {
                if let Some(problem) = self.inner.problem.get() {
                    tracing::warn!(%problem, "problem");
                }
                self.inner.fired.cancel();
                true
            }
            Err(problem) => {
                tracing::info!(%problem, "later problem ignored");
                false
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A store problem holds the store's error: the message is as before, and the backend's
    /// error is still there as the source.
    #[test]
    fn a_store_problem_keeps_the_store_error_as_its_source() {
        let io = std::io::Error::other("disk on fire");
        let problem = Problem::from(StoreError::permanent("redb store x: open", io));
        assert_eq!(
            problem.to_string(),
            "store: redb store x: open: disk on fire"
        );
        let mut chain = Vec::new();
        let mut next = std::error::Error::source(&problem);
        while let Some(e) = next {
            chain.push(e.to_string());
            next = e.source();
        }
        assert_eq!(
            chain.last().map(String::as_str),
            Some("disk on fire"),
            "{chain:?}"
        );
        let Problem::Store(shared) = &problem else {
            unreachable!()
        };
        assert!(!shared.get().is_transient());
        assert_eq!(problem.clone(), problem, "clones are equal");
    }
}
