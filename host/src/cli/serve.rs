//! `vvm-host serve`: [`crate::server::run`] until SIGINT or SIGTERM; a second
//! signal during the shutdown sequence exits at once. SIGHUP re-reads the configuration, and
//! so does a change of the configuration file (`config_watch`).

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

use super::config_watch::ConfigWatch;
use super::{EXIT_INTERRUPTED, ServeArgs};
use crate::clock::SystemClock;
use crate::ops::Ops;
use crate::server;

/// SIGINT, SIGTERM and SIGHUP as one stream.
struct Signals {
    interrupt: Signal,
    terminate: Signal,
    hangup: Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.hangup.recv() => "SIGHUP",
        }
    }
}

/// Serves until SIGINT/SIGTERM, then exits 0 once the shutdown sequence has ended; a second
/// signal before that exits at once with [`EXIT_INTERRUPTED`].
pub(super) async fn serve(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = args.settings()?;
    // Signals first: a signal during start-up must not kill the process untidily.
    let mut signals = Signals::new().context("installing signal handlers")?;
    // Before the runtime reads it, to share descriptors out among granted guests.
    crate::runtime::raise_descriptor_limit();
    // The process's one set of metrics, health and leadership, on `CLOCK_BOOTTIME` like the
    // lease deadlines: served by the endpoint, fed by every layer of the server.
    let ops = Ops::new(Arc::new(SystemClock::local()));
    let _endpoint = crate::ops::Endpoint::start_if(settings.metrics_addr, &ops)?;
    let stop = CancellationToken::new();
    let (reload, reloads) = tokio::sync::mpsc::unbounded_channel();
    // The file the settings were read from, followed: written again, it is re-read as SIGHUP
    // re-reads it.
    let (changed, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let file = args.store.config.clone().or_else(|| {
        let default = std::path::PathBuf::from(crate::config::DEFAULT_CONFIG_FILE);
        default.is_file().then_some(default)
    });
    let _watch = file.and_then(|file| ConfigWatch::start(&file, changed));
    let serving = server::run(settings, ops, reloads, stop.clone().cancelled_owned());
    tokio::pin!(serving);
    loop {
        tokio::select! {
            served = &mut serving => return Ok(served.map(|()| ExitCode::SUCCESS)?),
            Some(()) = changes.recv() => {
                // A burst of writes (a tool saving in steps) is one re-read.
                while changes.try_recv().is_ok() {}
                tracing::info!("the configuration file changed: re-reading it");
                let _ = reload.send(args.settings());
            }
            signal = signals.next() => {
                if signal == "SIGHUP" {
                    tracing::info!(signal, "re-reading the configuration");
                    // Resolved as at start: the same flags, environment, file and checks.
                    let _ = reload.send(args.settings());
                    continue;
                }
                if stop.is_cancelled() {
                    tracing::warn!(signal, "second signal: exiting at once");
                    return Ok(ExitCode::from(EXIT_INTERRUPTED));
                }
                tracing::info!(signal, "shutting down");
                stop.cancel();
            }
        }
    }
}
