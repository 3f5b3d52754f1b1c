//! Where log lines go: stderr, written so that no writer ever waits for its reader (SPEC §4:
//! the killer's firing cannot block; a leader's renewals must not wait on a log pipe either).
//!
//! Writing to fd 2 itself can block: on a full pipe or socket nobody reads (a stalled journald
//! or log shipper, a `| tee` to a hung disk), or on a terminal under flow control. Every thread
//! logs, the lease's renewals among them, so a reader that stalls would stall the renewals and
//! the killer would end the leader. Setting `O_NONBLOCK` on fd 2 would change the description
//! it shares with other processes. So [`Stderr`] gets a description of its own at start-up: a
//! socket (journald's stdout stream) a duplicate written with `send(MSG_DONTWAIT)`; a pipe or
//! terminal opened again through `/proc/self/fd/2`, non-blocking; a regular file a duplicate
//! (it never waits for a reader). Anything else gets nothing.
//!
//! (`/proc` is required anyway: the store's clock reads the kernel's boot id there.)
//!
//! A line that finds no room is dropped, whole: the reader loses lines, the host keeps its
//! lease. A line longer than the pipe's atomic write (`PIPE_BUF`, 4 KiB) may be cut by a
//! reader that falls behind mid-line; the next line then starts on a line of its own.
//!
//! Text from outside (a guest's, a path an operator typed) goes into a line [`escaped`], so
//! that a line stays one line and shows what it says.

use std::borrow::Cow;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

/// `e` and its causes as `error: cause: cause`, each said once, escaped into one line. The
/// error types here end their own message with their cause (a log field shows only the
/// message), so a cause that the line already ends with is not repeated.
pub(crate) fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut cause = Some(e);
    while let Some(e) = cause {
        let text = e.to_string();
        if !line.ends_with(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = e.source();
    }
    // One line, whatever a path in it holds.
    escaped(&line).into_owned()
}

/// `line` with every control character but tab escaped (`\r`, `\n`, `\u{1b}`...): in the
/// host's log a carriage return, a newline or an escape sequence from a guest (or in a path)
/// could forge a host line, or hide one on a terminal.
pub(crate) fn escaped(line: &str) -> Cow<'_, str> {
    let control = |c: char| c.is_control() && c != '\t';
    if !line.chars().any(control) {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// How long the rest of a line that was partly written may wait for room before it is cut.
const REST_OF_LINE: Duration = Duration::from_millis(20);

/// Stderr, written without blocking (see the module documentation).
#[derive(Debug)]
pub struct Stderr {
    fd: Option<OwnedFd>,
    socket: bool,
    /// Whether a line was cut, so the next one starts with a newline. Held while a line is
    /// written, so lines from several threads never interleave (a line longer than
    /// `PIPE_BUF` can be written in pieces). The killer has a `Stderr` of its own, so it never
    /// waits for this.
    cut: Mutex<bool>,
}

impl Stderr {
    /// A description of this process's stderr of its own, prepared now, while nothing is
    /// wrong; `None` inside if stderr is closed or of a kind that cannot be written safely.
    pub fn open() -> Self {
        use rustix::fs::{FileType, Mode, OFlags};
        let stderr = io::stderr();
        let fd = stderr.as_fd();
        let kind = rustix::fs::fstat(fd).map(|st| FileType::from_raw_mode(st.st_mode));
        let (fd, socket) = match kind {
            Ok(FileType::Socket) => (rustix::io::fcntl_dupfd_cloexec(fd, 3).ok(), true),
            Ok(FileType::Fifo | FileType::CharacterDevice) => (
                rustix::fs::open(
                    "/proc/self/fd/2",
                    OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
                    Mode::empty(),
                )
                .ok(),
                false,
            ),
            Ok(FileType::RegularFile) => (rustix::io::fcntl_dupfd_cloexec(fd, 3).ok(), false),
            _ => (None, false),
        };
        Self {
            fd,
            socket,
            cut: Mutex::new(false),
        }
    }

    /// One attempt to write `bytes`, never waiting: how many were written (0 when there is no
    /// room).
    fn try_write(&self, fd: &OwnedFd, bytes: &[u8]) -> io::Result<usize> {
        let written = if self.socket {
            let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
            rustix::net::send(fd, bytes, flags)
        } else {
            rustix::io::write(fd, bytes)
        };
        match written {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the line `line` (with its newline) whole, or drops it; never waits, except for
    /// at most [`REST_OF_LINE`] for the rest of a line it began. A reader that went away is
    /// not an error: the line is dropped like any other.
    pub fn write_line(&self, line: &[u8]) {
        let Some(fd) = &self.fd else { return };
        let mut cut = self.cut.lock().unwrap_or_else(PoisonError::into_inner);
        if *cut {
            match self.try_write(fd, b"\n") {
                Ok(1) => *cut = false,
                // Still no room, or no reader: this line goes the way of the last.
                _ => return,
            }
        }
        let mut rest = line;
        let mut until = None;
        while !rest.is_empty() {
            match self.try_write(fd, rest) {
                // No room for any of it: dropped whole.
                Ok(0) if rest.len() == line.len() => return,
                Ok(0) => {
                    let until = *until.get_or_insert_with(|| Instant::now() + REST_OF_LINE);
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        *cut = true;
                        return;
                    }
                    let timeout = Timespec::try_from(left).ok();
                    let mut fds = [PollFd::new(fd, PollFlags::OUT)];
                    let _ = poll(&mut fds, timeout.as_ref());
                }
                Ok(n) => rest = &rest[n.min(rest.len())..],
                Err(_) => {
                    *cut = rest.len() < line.len();
                    return;
                }
            }
        }
    }
}

/// The `io::Write` of one log event for `tracing_subscriber` ([`Stderr::write_line`] per
/// event: the subscriber formats each event into one buffer and writes it with `write_all`).
impl io::Write for &Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_line(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::io::Read as _;

    use super::*;

    /// A cause that the message already ends with is said once; one that adds to it is kept.
    #[test]
    fn one_line_says_each_cause_once() {
        /// An error that ends its message with its cause, as the crate's errors do.
        #[derive(Debug, thiserror::Error)]
        #[error("config file vvm.toml: {0}")]
        struct Read(#[source] std::io::Error);

        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        assert_eq!(one_line(&Read(io())), "config file vvm.toml: gone");
        let added = anyhow::Error::new(io()).context("reading the lease\nforged");
        assert_eq!(one_line(added.as_ref()), "reading the lease\\nforged: gone");
    }

    fn on_pipe(size: usize) -> (Stderr, std::io::PipeReader) {
        let (reader, writer) = std::io::pipe().unwrap();
        rustix::pipe::fcntl_setpipe_size(&writer, size).unwrap();
        rustix::fs::fcntl_setfl(&writer, rustix::fs::OFlags::NONBLOCK).unwrap();
        let stderr = Stderr {
            fd: Some(writer.into()),
            socket: false,
            cut: Mutex::new(false),
        };
        (stderr, reader)
    }

    /// On a full pipe nobody reads, lines are dropped whole and the writer never waits; once
    /// the reader catches up, the next line is written.
    #[test]
    fn a_full_pipe_drops_whole_lines_without_waiting() {
        let (stderr, mut reader) = on_pipe(4096);
        let line = [b"x".repeat(99), b"\n".to_vec()].concat();
        let started = Instant::now();
        for _ in 0..1000 {
            stderr.write_line(&line);
        }
        assert!(started.elapsed() < REST_OF_LINE * 10, "it waited");
        let mut buf = vec![0; 8192];
        let n = reader.read(&mut buf).unwrap();
        assert_eq!(n % 100, 0, "whole lines only");
        assert!(n <= 4096, "{n}");
        stderr.write_line(b"after\n");
        let n = reader.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"after\n");
    }

    /// A line longer than the room left is cut once its rest has waited long enough, and
    /// the next line starts on a line of its own.
    #[test]
    fn a_cut_line_is_ended_before_the_next() {
        // Two pages: the first line fills one, the second line gets the other and no more.
        let (stderr, mut reader) = on_pipe(8192);
        stderr.write_line(&[b"a".repeat(4095), b"\n".to_vec()].concat());
        stderr.write_line(&[b"b".repeat(8000), b"\n".to_vec()].concat());
        let mut buf = vec![0; 16384];
        let n = reader.read(&mut buf).unwrap();
        assert!(buf[..n].ends_with(b"b"), "cut mid-line");
        stderr.write_line(b"next\n");
        let n = reader.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"\nnext\n");
    }
}
