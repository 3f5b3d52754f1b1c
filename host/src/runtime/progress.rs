//! Compile progress (SPEC §6: every component is compiled before campaigning, ~18 s for the
//! Python and JS examples in a release build): a bar while stderr is a terminal, else a log
//! line as each service starts loading (its end is the `service loaded` line, with the time).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Progress over the services of one load.
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Progress over `total` services: a bar if stderr is a terminal.
    pub fn new(total: usize) -> Self {
        Self::shown(total, std::io::stderr().is_terminal())
    }

    fn shown(total: usize, terminal: bool) -> Self {
        let bar = (terminal && total > 0).then(|| {
            let style = ProgressStyle::with_template(
                "{spinner} compiling services {pos}/{len} [{elapsed}] {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            let bar = ProgressBar::new(u64::try_from(total).unwrap_or(u64::MAX)).with_style(style);
            // Cranelift runs for seconds without a word: keep the spinner turning.
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Self { bar }
    }

    /// `service` starts loading (compiling, or from the cache); returns when, for
    /// [`Step::elapsed_ms`].
    pub fn start(&self, service: &str) -> Step {
        if let Some(bar) = &self.bar {
            bar.set_message(service.to_owned());
        } else {
            tracing::info!(service, "loading service");
        }
        Step {
            started: Instant::now(),
        }
    }

    /// Runs `log` (which writes log lines) with the bar out of the way.
    pub fn suspend<R>(&self, log: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(log),
            None => log(),
        }
    }

    /// One service has loaded (or been rejected).
    pub fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// One service's load, under way.
pub(crate) struct Step {
    started: Instant,
}

impl Step {
    /// Milliseconds since the load started.
    pub fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_only_on_a_terminal_and_only_with_work() {
        assert!(Progress::shown(2, true).bar.is_some());
        assert!(Progress::shown(2, false).bar.is_none());
        assert!(Progress::shown(0, true).bar.is_none());
    }
}
