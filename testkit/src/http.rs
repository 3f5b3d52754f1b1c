//! HTTP/1.1 test servers on 127.0.0.1, plain or TLS, for the end-to-end tests of the guests'
//! outgoing requests: a [`Server`] records every request it is sent and answers as its
//! [`Behaviour`] says (at once, late, half, or never), so a test can assert what reached it.
//!
//! [`exchange`] and [`raw_get`] are the other side: a request written by hand to a server
//! under test, and whatever it answered.
//!
//! Synchronous: a thread accepts, one thread serves each connection (keep-alive, bodies by
//! `content-length` or chunked). Dropping the server ends every delay and stall at once.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::{ServerConfig, ServerConnection, StreamOwned};

use crate::host::PATIENCE;

#[cfg(test)]
mod tests;
mod tls;
pub use tls::server_files;
mod wire;

use wire::{Head, Wire};

/// How a [`Server`] answers every request; `Behaviour::default()` answers `200` with `ok` at
/// once. Set the fields for the misbehaviour a test needs.
#[derive(Clone, Debug)]
pub struct Behaviour {
    /// The response status.
    pub status: u16,
    /// The response body, sent with its `content-length`.
    pub body: Vec<u8>,
    /// How long to wait, once a request was read in full, before sending the response head:
    /// for response (first byte) timeouts. Ends early if the server is dropped.
    pub head_delay: Duration,
    /// Send the head (with the full body's `content-length`) and only this many body bytes,
    /// then stall until the client closes or the server is dropped: for between-bytes
    /// timeouts.
    pub stall_body_after: Option<usize>,
    /// Accept connections and never read or write anything on them: for connect and TLS
    /// handshake timeouts.
    pub silent: bool,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            status: 200,
            body: b"ok".to_vec(),
            head_delay: Duration::ZERO,
            stall_body_after: None,
            silent: false,
        }
    }
}

/// One request a [`Server`] read in full, head and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The method, as sent (`GET`).
    pub method: String,
    /// The request target, as sent (`/path?query`).
    pub path: String,
    /// The headers in order, duplicates kept, names lowercased, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body, unchunked.
    pub body: Vec<u8>,
    /// The connection it came on: the server's count of them (0 for the first) when it was
    /// accepted.
    pub connection: usize,
}

impl Request {
    /// The first value of header `name` (any case), if it was sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.header_values(name).into_iter().next()
    }

    /// Every value of header `name` (any case), in order; one per header line.
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

#[derive(Default)]
struct State {
    connections: usize,
    requests: Vec<Request>,
    closed_early: usize,
    body_bytes: usize,
    stopping: bool,
    /// The connections being served, by number: shut down on drop, which ends their reads.
    open: HashMap<usize, TcpStream>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits until `done` holds or `patience` passes; the state as it then is.
    fn wait(&self, patience: Duration, done: impl Fn(&State) -> bool) -> MutexGuard<'_, State> {
        // No deadline (for ever) if it is past what an `Instant` holds.
        let deadline = Instant::now().checked_add(patience);
        let mut state = self.lock();
        while !done(&state) {
            state = match deadline {
                None => self
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                        break;
                    };
                    (self.changed.wait_timeout(state, left))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        state
    }
}

/// An HTTP/1.1 server on a free port of 127.0.0.1 that answers as its [`Behaviour`] says and
/// records what it was sent; stopped on drop.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Starts a plain HTTP server.
    pub fn start(behaviour: Behaviour) -> Server {
        Self::serve(behaviour, None)
    }

    /// Starts an HTTPS server whose certificate (for `localhost` and 127.0.0.1) a fresh CA
    /// signed; returns it with the CA certificate's path, `dir/ca.pem`, for clients to trust.
    pub fn start_tls(behaviour: Behaviour, dir: &Path) -> (Server, PathBuf) {
        let (config, ca) = tls::server_config(dir);
        (Self::serve(behaviour, Some(config)), ca)
    }

    fn serve(behaviour: Behaviour, tls: Option<Arc<ServerConfig>>) -> Server {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a test HTTP server");
        let addr = listener
            .local_addr()
            .expect("the test HTTP server's address");
        let shared = Arc::new(Shared::default());
        let accept = std::thread::Builder::new()
            .name(format!("http-{}", addr.port()))
            .spawn({
                let shared = Arc::clone(&shared);
                move || accept_loop(&listener, &shared, &Arc::new(behaviour), tls.as_ref())
            })
            .expect("spawn the test HTTP server's accept thread");
        Server {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many TCP connections the server accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.lock().connections
    }

    /// Every request read in full (head and body) so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.lock().requests.clone()
    }

    /// How many connections the client closed or reset while a request was under way: partly
    /// read, or read and its response not yet all sent (delayed or stalled).
    pub fn closed_early(&self) -> usize {
        self.shared.lock().closed_early
    }

    /// How many body bytes the server read, over all requests, finished or not.
    pub fn body_bytes_received(&self) -> usize {
        self.shared.lock().body_bytes
    }

    /// Waits until at least `n` requests were read in full; every request so far. Panics after
    /// [`PATIENCE`].
    pub fn wait_for_requests(&self, n: usize) -> Vec<Request> {
        let state = self.shared.wait(PATIENCE, |s| s.requests.len() >= n);
        assert!(
            state.requests.len() >= n,
            "HTTP server {}: waited {PATIENCE:?} for {n} requests, got {}: {:?}",
            self.addr,
            state.requests.len(),
            state
                .requests
                .iter()
                .map(|r| format!("{} {}", r.method, r.path))
                .collect::<Vec<_>>()
        );
        state.requests.clone()
    }

    /// Waits until at least `n` connections were accepted. Panics after [`PATIENCE`].
    pub fn wait_for_connections(&self, n: usize) {
        let state = self.shared.wait(PATIENCE, |s| s.connections >= n);
        assert!(
            state.connections >= n,
            "HTTP server {}: waited {PATIENCE:?} for {n} connections, got {}",
            self.addr,
            state.connections
        );
    }

    /// Waits until the client closed at least `n` connections early (see
    /// [`Self::closed_early`]). Panics after [`PATIENCE`].
    pub fn wait_for_closed_early(&self, n: usize) {
        let state = self.shared.wait(PATIENCE, |s| s.closed_early >= n);
        assert!(
            state.closed_early >= n,
            "HTTP server {}: waited {PATIENCE:?} for {n} connections closed early, got {}",
            self.addr,
            state.closed_early
        );
    }

    /// Waits until no connection is being served: every one closed by its client, or ended by
    /// the server after `connection: close` or malformed input (a [`Behaviour::silent`] one
    /// lasts as long as the server). Panics after [`PATIENCE`].
    pub fn wait_until_idle(&self) {
        let state = self.shared.wait(PATIENCE, |s| s.open.is_empty());
        assert!(
            state.open.is_empty(),
            "HTTP server {}: waited {PATIENCE:?} for its {} open connections to close",
            self.addr,
            state.open.len()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stopping = true;
            for stream in state.open.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        // The accept thread sees `stopping` at its next connection: this one.
        let woken = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).is_ok();
        if let Some(accept) = self.accept.take().filter(|_| woken) {
            let _ = accept.join();
        }
        // Connection threads end at once, their sockets shut down; any that does not is left.
        drop(
            self.shared
                .wait(Duration::from_secs(5), |s| s.open.is_empty()),
        );
    }
}

fn accept_loop(
    listener: &TcpListener,
    shared: &Arc<Shared>,
    behaviour: &Arc<Behaviour>,
    tls: Option<&Arc<ServerConfig>>,
) {
    for (number, stream) in listener.incoming().enumerate() {
        let stream = stream.and_then(|s| Ok((s.try_clone()?, s)));
        let stream = {
            // Checked and registered at once: `Server::drop` shuts down all it finds registered.
            let mut state = shared.lock();
            if state.stopping {
                return;
            }
            let Ok((stream, registered)) = stream else {
                continue;
            };
            state.connections += 1;
            state.open.insert(number, registered);
            stream
        };
        shared.changed.notify_all();
        let connection = Connection {
            number,
            shared: Arc::clone(shared),
            behaviour: Arc::clone(behaviour),
        };
        let tls = tls.cloned();
        // Should the spawn fail, the closure and so the connection are dropped: deregistered.
        let _ = std::thread::Builder::new()
            .name(format!("http-conn-{number}"))
            .spawn(move || connection.run(stream, tls));
    }
}

/// What a connection does after one request.
enum Step {
    Next,
    Close,
    ClosedEarly,
}

/// A stream a connection is served over: a TCP stream, or TLS over one.
trait Transport: Read + Write {
    /// Ends the stream politely (TLS `close_notify`) after the last response.
    fn finish(&mut self) {}
}

impl Transport for TcpStream {}

impl Transport for StreamOwned<ServerConnection, TcpStream> {
    fn finish(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
    }
}

/// One accepted connection, served on its own thread; deregistered from the server on drop.
struct Connection {
    number: usize,
    shared: Arc<Shared>,
    behaviour: Arc<Behaviour>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.update(|s| {
            s.open.remove(&self.number);
        });
    }
}

impl Connection {
    fn run(self, tcp: TcpStream, tls: Option<Arc<ServerConfig>>) {
        if self.behaviour.silent {
            drop(self.shared.wait(Duration::MAX, |s| s.stopping));
            return;
        }
        let _ = tcp.set_nodelay(true);
        let Ok(socket) = tcp.try_clone() else { return };
        match tls {
            None => self.serve(&mut Wire::new(socket, tcp)),
            Some(config) => {
                let Ok(server) = ServerConnection::new(config) else {
                    return;
                };
                self.serve(&mut Wire::new(socket, StreamOwned::new(server, tcp)));
            }
        }
    }

    fn serve<S: Transport>(&self, wire: &mut Wire<S>) {
        loop {
            match self.exchange(wire) {
                Step::Next => {}
                Step::Close => return wire.stream.finish(),
                Step::ClosedEarly => return self.shared.update(|s| s.closed_early += 1),
            }
        }
    }

    /// Reads one request, records it and answers it.
    fn exchange<S: Transport>(&self, wire: &mut Wire<S>) -> Step {
        let head = match wire.read_head() {
            Ok(Some(head)) => head,
            Ok(None) => return Step::Close,
            Err(e) => return self.failed(&e),
        };
        match self.read_and_answer(wire, head) {
            Ok(true) => Step::Close,
            Ok(false) => Step::Next,
            Err(e) => self.failed(&e),
        }
    }

    /// Whether an exchange that failed with `e` was cut short by the client.
    fn failed(&self, e: &io::Error) -> Step {
        if e.kind() == io::ErrorKind::InvalidData || self.shared.lock().stopping {
            Step::Close
        } else {
            Step::ClosedEarly
        }
    }

    /// Reads the body of the request `head` began, records it and answers it; whether the
    /// connection then closes.
    fn read_and_answer<S: Transport>(&self, wire: &mut Wire<S>, head: Head) -> io::Result<bool> {
        let framing = head.framing()?;
        if head.expects_continue() {
            wire.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
            wire.stream.flush()?;
        }
        let body = wire.read_body(&framing, &mut |n| self.shared.update(|s| s.body_bytes += n))?;
        let close = head.wants_close();
        let is_head = head.method == "HEAD";
        let request = Request {
            method: head.method,
            path: head.path,
            headers: head.headers,
            body,
            connection: self.number,
        };
        self.shared.update(|s| s.requests.push(request));
        let b = &*self.behaviour;
        if !b.head_delay.is_zero() {
            wire.wait(Some(b.head_delay))?;
        }
        let mut response = format!("HTTP/1.1 {} {}\r\n", b.status, reason(b.status));
        // No body, nor any length of one, with these statuses (RFC 9110 §8.6); none to `HEAD`.
        let bodiless = matches!(b.status, 100..=199 | 204 | 304);
        if !bodiless {
            let _ = write!(response, "content-length: {}\r\n", b.body.len());
        }
        if close {
            response.push_str("connection: close\r\n");
        }
        response.push_str("\r\n");
        let body = if bodiless || is_head {
            &[][..]
        } else {
            &b.body[..]
        };
        let sent = b.stall_body_after.map_or(body.len(), |n| n.min(body.len()));
        wire.stream.write_all(response.as_bytes())?;
        wire.stream.write_all(&body[..sent])?;
        wire.stream.flush()?;
        if b.stall_body_after.is_some() {
            wire.wait(None)?;
        }
        Ok(close)
    }
}

/// The reason phrase of the common statuses; clients ignore it.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Writes `request` as it is on a new connection to `addr` and reads until the server closes
/// it (a reset after the answer ends it too): everything that came back, as lossy UTF-8.
/// Reads give up after [`PATIENCE`], so a server that never answers fails the caller's
/// assertion on what came back.
///
/// # Panics
/// When `addr` cannot be connected to, or the request cannot be written.
pub fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    stream.write_all(request).expect("write the request");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET path` on a connection of its own ([`exchange`]), `connection: close`.
pub fn raw_get(addr: SocketAddr, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    exchange(addr, request.as_bytes())
}
