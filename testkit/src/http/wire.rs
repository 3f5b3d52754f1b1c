//! HTTP/1.1 on the wire, server side: request heads and bodies read off a stream.
//!
//! Malformed input is an [`io::ErrorKind::InvalidData`] error, never a panic: the server then
//! closes the connection.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The longest request head read: request line, headers and the empty line ending them.
const MAX_HEAD: usize = 64 * 1024;
/// The longest chunk-size or trailer line of a chunked body.
const MAX_LINE: usize = 4 * 1024;
/// The most trailer lines after the last chunk.
const MAX_TRAILERS: usize = 100;

/// A request line and headers as read.
pub(super) struct Head {
    pub(super) method: String,
    pub(super) path: String,
    /// `HTTP/1.0`: the connection closes after the response unless asked to stay.
    pub(super) http_1_0: bool,
    /// Names lowercased, in order, duplicates kept.
    pub(super) headers: Vec<(String, String)>,
}

/// How a request's body is delimited (RFC 9112 §6.3).
pub(super) enum Framing {
    Length(u64),
    Chunked,
}

impl Head {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.headers
            .iter()
            .filter(move |(n, _)| n == name)
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|v| !v.is_empty())
    }

    /// How the body is delimited: by `transfer-encoding: chunked` before `content-length`.
    pub(super) fn framing(&self) -> io::Result<Framing> {
        if let Some(last) = self.values("transfer-encoding").last() {
            return if last.eq_ignore_ascii_case("chunked") {
                Ok(Framing::Chunked)
            } else {
                Err(invalid("transfer-encoding not ending in chunked"))
            };
        }
        let mut length = None;
        for value in self.values("content-length") {
            let n: u64 = value.parse().map_err(|_| invalid("content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(invalid("differing content-lengths"));
            }
            length = Some(n);
        }
        Ok(Framing::Length(length.unwrap_or(0)))
    }

    /// Whether the client asked to close the connection after this exchange.
    pub(super) fn wants_close(&self) -> bool {
        let has = |token: &str| {
            self.values("connection")
                .any(|v| v.eq_ignore_ascii_case(token))
        };
        has("close") || (self.http_1_0 && !has("keep-alive"))
    }

    /// Whether the client waits for `100 Continue` before sending the body.
    pub(super) fn expects_continue(&self) -> bool {
        self.values("expect")
            .any(|v| v.eq_ignore_ascii_case("100-continue"))
    }
}

/// One connection's stream with what was read from it but not yet consumed.
pub(super) struct Wire<S> {
    /// The TCP socket under `stream` (the same socket), for read timeouts.
    tcp: TcpStream,
    pub(super) stream: S,
    buf: Vec<u8>,
}

impl<S: Read + Write> Wire<S> {
    pub(super) fn new(tcp: TcpStream, stream: S) -> Self {
        Self {
            tcp,
            stream,
            buf: Vec::new(),
        }
    }

    /// Reads more into the buffer; 0 at end of stream.
    fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0; 16 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next request head; `None` if the client closed the connection cleanly before it.
    pub(super) fn read_head(&mut self) -> io::Result<Option<Head>> {
        loop {
            // Empty lines before a request line are to be ignored (RFC 9112 §2.2).
            while self.buf.starts_with(b"\r\n") {
                self.buf.drain(..2);
            }
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                if end + 4 > MAX_HEAD {
                    return Err(invalid("request head over 64 KiB"));
                }
                let head: Vec<u8> = self.buf.drain(..end + 4).collect();
                return parse_head(&String::from_utf8_lossy(&head[..end])).map(Some);
            }
            if self.buf.len() > MAX_HEAD {
                return Err(invalid("request head over 64 KiB"));
            }
            match self.fill() {
                Ok(n) if n > 0 => {}
                // Between requests, a close is clean however it comes: at the end of the stream,
                // with a reset, or (TLS) without `close_notify`, as pooled connections are dropped.
                Ok(_) | Err(_) if self.buf.is_empty() => return Ok(None),
                Ok(_) => return Err(eof()),
                Err(e) => return Err(e),
            }
        }
    }

    /// The body as `framing` delimits it; `count` is told of every body byte as it arrives.
    pub(super) fn read_body(
        &mut self,
        framing: &Framing,
        count: &mut dyn FnMut(usize),
    ) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        match *framing {
            Framing::Length(n) => self.take(n, &mut body, count)?,
            Framing::Chunked => loop {
                let line = self.read_line()?;
                let size = line.split(';').next().unwrap_or_default().trim();
                let size = u64::from_str_radix(size, 16).map_err(|_| invalid("chunk size"))?;
                if size == 0 {
                    for _ in 0..MAX_TRAILERS {
                        if self.read_line()?.is_empty() {
                            return Ok(body);
                        }
                    }
                    return Err(invalid("too many trailers"));
                }
                self.take(size, &mut body, count)?;
                if !self.read_line()?.is_empty() {
                    return Err(invalid("chunk data longer than its size"));
                }
            },
        }
        Ok(body)
    }

    /// Moves `n` bytes from the stream to `body`.
    fn take(&mut self, n: u64, body: &mut Vec<u8>, count: &mut dyn FnMut(usize)) -> io::Result<()> {
        let mut left = n;
        while left > 0 {
            if self.buf.is_empty() && self.fill()? == 0 {
                return Err(eof());
            }
            let k = usize::try_from(left)
                .unwrap_or(usize::MAX)
                .min(self.buf.len());
            body.extend(self.buf.drain(..k));
            count(k);
            left -= k as u64;
        }
        Ok(())
    }

    /// One CRLF-ended line, without its CRLF.
    fn read_line(&mut self) -> io::Result<String> {
        loop {
            if let Some(end) = find(&self.buf, b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            if self.buf.len() > MAX_LINE {
                return Err(invalid("line too long"));
            }
            if self.fill()? == 0 {
                return Err(eof());
            }
        }
    }

    /// Waits `limit` (`None`: for ever) while reading whatever the client sends, which is kept
    /// for the next request. An error if the client closes or resets the connection meanwhile,
    /// or if the socket is shut down under it (how a dropped server ends the wait).
    pub(super) fn wait(&mut self, limit: Option<Duration>) -> io::Result<()> {
        let deadline = limit.map(|d| Instant::now() + d);
        let result = loop {
            let timeout = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => break Ok(()),
                },
            };
            if let Err(e) = self.tcp.set_read_timeout(timeout) {
                break Err(e);
            }
            match self.fill() {
                Ok(0) => break Err(eof()),
                Ok(_) if self.buf.len() > MAX_HEAD => break Err(invalid("flooded while waiting")),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => break Err(e),
            }
        };
        self.tcp.set_read_timeout(None)?;
        result
    }
}

fn parse_head(text: &str) -> io::Result<Head> {
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid("request line"));
    };
    if method.is_empty() || path.is_empty() || !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err(invalid("request line"));
    }
    let mut headers = Vec::new();
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(invalid("header line without a colon"));
        };
        if name.is_empty() || name.contains(|c: char| c.is_whitespace()) {
            return Err(invalid("header name"));
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Head {
        method: method.to_owned(),
        path: path.to_owned(),
        http_1_0: version == "HTTP/1.0",
        headers,
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

fn eof() -> io::Error {
    io::ErrorKind::UnexpectedEof.into()
}
