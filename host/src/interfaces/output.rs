//! Guest stdout/stderr as host log lines tagged with the service name, one line at a time;
//! dropped (and the write trapped) once the lease deadline has passed (SPEC §6). Every text a
//! guest puts into the host's log (its output, the lines it logs, the problems it reports,
//! the error its run returns) goes through here: line by line, bounded, control characters
//! escaped, so a guest can neither forge nor hide the host's own lines.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi_io::bytes::Bytes;

use super::env::{Fenced, ServiceEnv};
use crate::log_output::escaped;

/// A line longer than this is logged in pieces, so a guest cannot grow the buffer forever.
const MAX_LINE: usize = 16 * 1024;

/// Which standard stream a [`LogOutput`] stands for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stdio {
    Stdout,
    Stderr,
}

/// A guest's stdout or stderr. Every stream the guest opens on it shares one line buffer.
#[derive(Clone)]
pub(crate) struct LogOutput(Arc<Mutex<LineBuffer>>);

impl LogOutput {
    /// The `which` stream of the service described by `env`.
    pub(crate) fn new(env: Arc<ServiceEnv>, which: Stdio) -> Self {
        Self(Arc::new(Mutex::new(LineBuffer {
            env,
            which,
            pending: Vec::new(),
        })))
    }

    fn write(&self, bytes: &[u8]) -> Result<(), Fenced> {
        // A panic while logging leaves at most a partial line behind: still usable.
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .write(bytes)
    }
}

struct LineBuffer {
    env: Arc<ServiceEnv>,
    which: Stdio,
    pending: Vec<u8>,
}

impl LineBuffer {
    fn write(&mut self, bytes: &[u8]) -> Result<(), Fenced> {
        if self.env.deadline.has_passed() {
            self.pending.clear();
            return Err(Fenced::new("output"));
        }
        self.pending.extend_from_slice(bytes);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            self.emit(&line[..end]);
        }
        while self.pending.len() >= MAX_LINE {
            let piece: Vec<u8> = self.pending.drain(..MAX_LINE).collect();
            self.emit(&piece);
        }
        Ok(())
    }

    fn emit(&self, line: &[u8]) {
        let line = String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(line));
        let line = escaped(&line);
        let service = &*self.env.name;
        match self.which {
            Stdio::Stdout => tracing::info!(service, stream = "stdout", "{line}"),
            Stdio::Stderr => tracing::warn!(service, stream = "stderr", "{line}"),
        }
    }
}

/// Guest `text` that is one value of a host log line (a problem it reports, the error its run
/// returned): escaped, and cut after [`MAX_LINE`] bytes with a note of how many more it had.
pub(crate) fn guest_text(text: &str) -> String {
    let cut = text.floor_char_boundary(MAX_LINE);
    let mut out = escaped(&text[..cut]).into_owned();
    if cut < text.len() {
        let _ = write!(out, "… ({} more bytes)", text.len() - cut);
    }
    out
}

/// The log lines of a message a guest logs: one per line of it (`\n` or `\r\n`), a line
/// longer than [`MAX_LINE`] bytes in pieces, each escaped; as its output is logged.
pub(crate) fn guest_lines(text: &str) -> Vec<Cow<'_, str>> {
    let mut lines = Vec::new();
    for line in text.split('\n') {
        let mut rest = line.strip_suffix('\r').unwrap_or(line);
        loop {
            let (piece, after) = rest.split_at(rest.floor_char_boundary(MAX_LINE));
            lines.push(escaped(piece));
            rest = after;
            if rest.is_empty() {
                break;
            }
        }
    }
    if text.ends_with('\n') {
        // The newline ends the last line; it does not begin an empty one.
        lines.pop();
    }
    lines
}

impl Drop for LineBuffer {
    fn drop(&mut self) {
        // The last line may lack its newline; log it unless the lease has passed.
        if !self.pending.is_empty() && !self.env.deadline.has_passed() {
            let line = std::mem::take(&mut self.pending);
            self.emit(&line);
        }
    }
}

impl IsTerminal for LogOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LogOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for LogOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        LogOutput::write(self, &bytes).map_err(|e| StreamError::Trap(e.into()))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(MAX_LINE)
    }
}

impl AsyncWrite for LogOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(
            LogOutput::write(&self, buf)
                .map(|()| buf.len())
                .map_err(io::Error::other),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::interfaces::env::tests::env;

    /// The message of every event `f` logs.
    fn capture(f: impl FnOnce()) -> Vec<String> {
        testkit::logs::capture(f)
            .into_iter()
            .map(|line| line.message)
            .collect()
    }

    #[tokio::test]
    async fn output_is_logged_line_by_line() {
        let (_clock, env) = env().await;
        let lines = capture(|| {
            let out = LogOutput::new(env, Stdio::Stdout);
            let mut stream = out.p2_stream();
            stream.write(Bytes::from_static(b"one\ntw")).unwrap();
            stream.write(Bytes::from_static(b"o\r\nthr")).unwrap();
            drop(stream);
            out.write(b"ee").unwrap();
        });
        // The unterminated last line is logged when the stream goes away.
        assert_eq!(lines, ["one", "two", "three"]);
    }

    #[tokio::test]
    async fn a_long_line_is_logged_in_pieces() {
        let (_clock, env) = env().await;
        let lines = capture(|| {
            LogOutput::new(env, Stdio::Stderr)
                .write(&vec![b'x'; MAX_LINE + 10])
                .unwrap();
        });
        let lengths: Vec<usize> = lines.iter().map(String::len).collect();
        assert_eq!(lengths, [MAX_LINE, 10]);
    }

    /// A guest's carriage returns, escape sequences and newlines cannot forge or hide host log
    /// lines: each line of a logged message is its own event, and control characters are
    /// escaped, in output too.
    #[tokio::test]
    async fn guest_text_is_split_bounded_and_escaped() {
        assert_eq!(
            guest_lines("one\r\ntwo\n2026-01-01 INFO vvm_host: forged\rhidden\u{1b}[2J\n"),
            [
                "one",
                "two",
                "2026-01-01 INFO vvm_host: forged\\rhidden\\u{1b}[2J"
            ]
        );
        assert_eq!(guest_lines(""), [""]);
        assert_eq!(guest_lines("tab\tkept"), ["tab\tkept"]);
        let long = "é".repeat(MAX_LINE);
        let pieces = guest_lines(&long);
        assert!(
            pieces.iter().all(|p| p.len() <= MAX_LINE),
            "cut at char boundaries"
        );
        assert_eq!(pieces.concat(), long);

        let reason = guest_text(&format!("bad\n{}", "x".repeat(3 * MAX_LINE)));
        assert!(reason.starts_with("bad\\nxxx"), "{}", &reason[..20]);
        assert!(
            reason.ends_with(&format!("… ({} more bytes)", 2 * MAX_LINE + 4)),
            "{}",
            &reason[reason.len() - 40..]
        );

        let (_clock, env) = env().await;
        let lines = capture(|| {
            LogOutput::new(env, Stdio::Stdout)
                .write(b"progress 10%\rprogress 99%\x1b[1A\n")
                .unwrap();
        });
        assert_eq!(lines, ["progress 10%\\rprogress 99%\\u{1b}[1A"]);
    }

    #[tokio::test]
    async fn output_after_the_deadline_is_dropped() {
        let (clock, env) = env().await;
        let lines = capture(|| {
            let out = LogOutput::new(env, Stdio::Stdout);
            out.write(b"before\npartial").unwrap();
            clock.advance(Duration::from_mins(1));
            let mut stream = out.p2_stream();
            let e = stream.write(Bytes::from_static(b" after\n")).unwrap_err();
            assert!(matches!(e, StreamError::Trap(_)));
        });
        assert_eq!(lines, ["before"]);
    }
}
