//! `vvm-host serve`: lead while holding a slot, stand by otherwise, shut down on a signal.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::{EXIT_INTERRUPTED, ServeArgs, Settings};
use crate::holder_lock::HolderLockDir;
use crate::runtime::WasmServices;
use crate::services::Services;
use crate::vvm::{Problem, Vvm, VvmConfig, holder_value};

/// SIGINT and SIGTERM as one stream.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

/// Serves until SIGINT/SIGTERM. After a problem (leadership lost, acquisition timeout, a
/// failing service) it shuts the VVM down and campaigns again as a standby.
pub(super) async fn serve(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::resolve(&args.store, Some(args))?;
    // Signals first: a signal during start-up must not kill the process untidily.
    let mut signals = Signals::new().context("installing signal handlers")?;
    let store = settings.open_store(false).await?;
    let services = load_services(&settings).await?;
    let holder_locks = holder_locks(&settings.store);
    tracing::info!(
        store = settings.store,
        services = %settings.services.display(),
        cluster_size = settings.cluster_size,
        lease_ms = settings.lease.as_millis(),
        "serving"
    );
    let mut backoff = LocalBackoff::new(settings.lease);
    loop {
        let config = VvmConfig {
            cluster_size: settings.cluster_size,
            lease: settings.lease,
            acquisition_timeout: settings.acquisition_timeout,
            // One holder value per campaign: a delayed delete of an earlier campaign's
            // record can never remove this one's.
            holder: holder_value(),
        };
        let vvm = Vvm::provide(config, Arc::clone(&store), Arc::clone(&services))
            .with_holder_locks(holder_locks.clone())
            .launch();
        let launched = tokio::time::Instant::now();
        let (stop_for_good, problem) = tokio::select! {
            signal = signals.next() => {
                tracing::info!(signal, "shutting down");
                (true, None)
            }
            problem = vvm.problems().wait() => {
                tracing::warn!(%problem, "shutting down, then standing by");
                (false, Some(problem))
            }
        };
        let mut signalled = stop_for_good;
        let shutdown = vvm.shutdown();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                signal = signals.next() => {
                    if signalled {
                        tracing::warn!(signal, "second signal: exiting at once");
                        return Ok(ExitCode::from(EXIT_INTERRUPTED));
                    }
                    tracing::info!(signal, "will exit after this shutdown");
                    signalled = true;
                }
            }
        }
        if signalled {
            return Ok(ExitCode::SUCCESS);
        }
        // After a problem of this host's own, let a healthy standby take the slot first.
        if let Some(pause) = backoff.after(problem.as_ref(), launched.elapsed()) {
            tracing::info!(
                pause_ms = pause.as_millis(),
                "local problem: backing off before campaigning"
            );
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                signal = signals.next() => {
                    tracing::info!(signal, "shutting down");
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
    }
}

/// How long to stand aside after a problem that is this host's own (a service that fails
/// here, a bug), so that a healthy standby takes the slot instead of this host winning it
/// straight back: `L`, doubling with each such problem in a row up to `16·L`. A leadership
/// that lasted `16·L`, or a problem that is not local (the lease lost, no slot free), starts
/// over without a pause.
struct LocalBackoff {
    lease: Duration,
    in_a_row: u32,
}

impl LocalBackoff {
    const MAX_DOUBLINGS: u32 = 4;

    fn new(lease: Duration) -> Self {
        Self { lease, in_a_row: 0 }
    }

    fn after(&mut self, problem: Option<&Problem>, ran: Duration) -> Option<Duration> {
        let max = self.lease.saturating_mul(1 << Self::MAX_DOUBLINGS);
        let local = matches!(
            problem,
            Some(Problem::Service { .. } | Problem::Internal(_))
        );
        if !local || ran >= max {
            self.in_a_row = 0;
        }
        if !local {
            return None;
        }
        let pause = self
            .lease
            .saturating_mul(1 << self.in_a_row.min(Self::MAX_DOUBLINGS));
        self.in_a_row = self.in_a_row.saturating_add(1);
        Some(pause)
    }
}

/// The crash lock's directory beside a redb store (`<store>.holders`), so that a standby on
/// this machine takes over from a killed leader at once. None for etcd, or when the directory
/// cannot be used (standbys then wait out a dead leader's lease).
fn holder_locks(store: &str) -> Option<Arc<HolderLockDir>> {
    if store.starts_with("etcd://") {
        return None;
    }
    HolderLockDir::open(HolderLockDir::beside(std::path::Path::new(store)))
        .inspect_err(|e| tracing::warn!(error = %e, "no crash lock: after a crash standbys wait out the lease"))
        .ok()
        .map(Arc::new)
}

/// Compiles (or loads from cache) every service before campaigning; bad files are reported
/// by name and reason (by the runtime) and the others still run.
async fn load_services(settings: &Settings) -> anyhow::Result<Arc<dyn Services>> {
    let config = settings.runtime_config()?;
    // Compiling is CPU-bound and blocking: keep it off the async workers.
    let (services, _rejected) = tokio::task::spawn_blocking(move || WasmServices::load(config))
        .await
        .context("loading services")??;
    Ok(Arc::new(services))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_problems_back_off_doubling_and_others_do_not() {
        let l = Duration::from_secs(1);
        let service = Problem::Service {
            name: "x".into(),
            reason: "fails here".into(),
        };
        let mut b = LocalBackoff::new(l);
        let short = Duration::from_millis(100);
        assert_eq!(b.after(Some(&service), short), Some(l));
        assert_eq!(b.after(Some(&service), short), Some(l * 2));
        assert_eq!(b.after(Some(&service), short), Some(l * 4));
        for _ in 0..5 {
            b.after(Some(&service), short);
        }
        assert_eq!(b.after(Some(&service), short), Some(l * 16), "capped");
        assert_eq!(b.after(Some(&Problem::LeadershipLost), short), None);
        assert_eq!(b.after(Some(&service), short), Some(l), "started over");
        b.after(Some(&service), short);
        assert_eq!(
            b.after(Some(&service), l * 16),
            Some(l),
            "a long leadership resets it"
        );
        assert_eq!(b.after(None, short), None);
    }
}
