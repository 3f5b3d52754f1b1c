//! A recording [`Services`] double: it logs start and stop to the journal and counts the
//! service sets running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::sleep;
use vvm_host::services::{RunningServices, ServiceContext, ServiceError, Services};

use super::journal::{Event, Journal};

/// How the services double behaves.
#[derive(Clone, Debug, Default)]
pub struct Behaviour {
    /// Starting takes this long (cut short when `stopping` fires).
    pub slow_start: Duration,
    /// Stopping takes this long.
    pub slow_stop: Duration,
    /// `stop` never returns: a guest that ignores the request and is never dropped.
    pub ignore_stop: bool,
    /// Starting fails with this reason.
    pub fail_start: Option<String>,
    /// Starting panics (a bug in the services' code) once they have started.
    pub panic_start: bool,
}

/// A [`Services`] that records start and stop in the journal and counts running sets.
pub struct RecordingServices {
    name: String,
    behaviour: Behaviour,
    journal: Journal,
    live: Arc<AtomicUsize>,
    /// The contexts of every start, to look at the lease and `stopping`.
    contexts: Mutex<Vec<ServiceContext>>,
}

impl RecordingServices {
    pub fn new(name: &str, behaviour: Behaviour, journal: &Journal) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            behaviour,
            journal: journal.clone(),
            live: Arc::default(),
            contexts: Mutex::default(),
        })
    }

    /// How many started sets have not finished stopping.
    pub fn running(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    pub fn last_context(&self) -> Option<ServiceContext> {
        self.contexts.lock().unwrap().last().cloned()
    }
}

#[async_trait]
impl Services for RecordingServices {
    async fn start(&self, ctx: ServiceContext) -> Result<Box<dyn RunningServices>, ServiceError> {
        self.journal.push(&self.name, Event::StartBegin);
        self.contexts.lock().unwrap().push(ctx.clone());
        if let Some(reason) = &self.behaviour.fail_start {
            self.journal.push(&self.name, Event::StartFailed);
            return Err(ServiceError::Start {
                name: "double".into(),
                reason: reason.clone(),
            });
        }
        tokio::select! {
            () = sleep(self.behaviour.slow_start) => {
                self.journal.push(&self.name, Event::Started);
            }
            () = ctx.stopping.cancelled() => {
                self.journal.push(&self.name, Event::StartCutShort);
            }
        }
        self.live.fetch_add(1, Ordering::SeqCst);
        assert!(!self.behaviour.panic_start, "{} start panics", self.name);
        Ok(Box::new(Running {
            name: self.name.clone(),
            behaviour: self.behaviour.clone(),
            journal: self.journal.clone(),
            live: Arc::clone(&self.live),
            stopping_was_signalled: ctx.stopping,
        }))
    }
}

struct Running {
    name: String,
    behaviour: Behaviour,
    journal: Journal,
    live: Arc<AtomicUsize>,
    stopping_was_signalled: tokio_util::sync::CancellationToken,
}

#[async_trait]
impl RunningServices for Running {
    async fn stop(self: Box<Self>) {
        let stopping = self.stopping_was_signalled.is_cancelled();
        self.journal.push(&self.name, Event::StopBegin { stopping });
        if self.behaviour.ignore_stop {
            self.journal.push(&self.name, Event::IgnoresStop);
            std::future::pending::<()>().await;
        }
        sleep(self.behaviour.slow_stop).await;
        self.live.fetch_sub(1, Ordering::SeqCst);
        self.journal.push(&self.name, Event::Stopped);
    }
}
