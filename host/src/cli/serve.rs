//! `vvm-host serve`: lead while holding a slot, stand by otherwise, shut down on a signal.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::{EXIT_INTERRUPTED, ServeArgs, Settings};
use crate::runtime::WasmServices;
use crate::services::Services;
use crate::vvm::{Vvm, VvmConfig, holder_value};

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
    let holder = holder_value();
    tracing::info!(
        holder,
        store = settings.store,
        services = %settings.services.display(),
        cluster_size = settings.cluster_size,
        lease_ms = settings.lease.as_millis(),
        "serving"
    );
    loop {
        let config = VvmConfig {
            cluster_size: settings.cluster_size,
            lease: settings.lease,
            acquisition_timeout: settings.acquisition_timeout,
            holder: holder.clone(),
        };
        let vvm = Vvm::provide(config, Arc::clone(&store), Arc::clone(&services)).launch();
        let stop_for_good = tokio::select! {
            signal = signals.next() => {
                tracing::info!(signal, "shutting down");
                true
            }
            problem = vvm.problems().wait() => {
                tracing::warn!(%problem, "shutting down, then standing by");
                false
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
    }
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
