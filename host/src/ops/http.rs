//! The operations endpoint (SPEC §8, Operations): `GET /healthz`, `/leader`, `/metrics`.
//!
//! It runs on a thread of its own with a single-threaded runtime: a slow or hostile client
//! cannot take a worker from the lease's renewal loop, and `/healthz` still answers (503) when
//! the main runtime is wedged, which is when it matters. The conventions are Patroni's
//! (`/leader` is 200 only on a leader, 503 elsewhere) and etcd's (`/health`, `/metrics`).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Sleep;

use super::Ops;

/// What one client can hold of the endpoint, and so of the host.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// Connections open at once. Each is one of the host's file descriptors: a client opening
    /// them without end would leave none for the store, the locks and the guests. Past it,
    /// new connections wait in the kernel's backlog.
    connections: usize,
    /// How long a connection stays open, idle or not: any scrape takes far less, and a
    /// scraper's next one reconnects. Idle or stalled clients cannot hold the slots for ever.
    lifetime: Duration,
}

const LIMITS: Limits = Limits {
    connections: 64,
    lifetime: Duration::from_secs(30),
};

/// The operations endpoint could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// The address could not be bound (in use, not local, no permission).
    #[error("metrics-addr {addr}: cannot listen: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The endpoint's thread or runtime could not be started.
    #[error("metrics-addr {addr}: cannot start the endpoint: {source}")]
    Start {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The running endpoint. Dropping it stops the server and joins its thread.
#[derive(Debug)]
pub struct Endpoint {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Listens on `addr` and serves `ops` from a thread of its own. Binding happens here, so a
    /// bad address is an error at start-up, naming it.
    ///
    /// # Errors
    /// When the address cannot be bound or the thread not started.
    pub fn start(addr: SocketAddr, ops: Ops) -> Result<Self, EndpointError> {
        Self::start_with(addr, ops, LIMITS)
    }

    fn start_with(addr: SocketAddr, ops: Ops, limits: Limits) -> Result<Self, EndpointError> {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|source| EndpointError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .and_then(|local| listener.set_nonblocking(true).map(|()| local))
            .map_err(|source| EndpointError::Bind { addr, source })?;
        let start = |source| EndpointError::Start { addr, source };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(start)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vvm-ops".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(listener) => Bounded {
                            listener,
                            slots: Arc::new(Semaphore::new(limits.connections)),
                            lifetime: limits.lifetime,
                        },
                        Err(e) => {
                            tracing::error!(addr = %local, error = %e, "operations endpoint failed");
                            return;
                        }
                    };
                    let server = axum::serve(listener, router(ops));
                    // Stopping drops the runtime with every connection still open (a scraper's
                    // keep-alive must not hold the process up).
                    tokio::select! {
                        r = server => if let Err(e) = r {
                            tracing::error!(addr = %local, error = %e, "operations endpoint failed");
                        },
                        _ = stopped => {}
                    }
                });
            })
            .map_err(start)?;
        tracing::info!(addr = %local, "operations endpoint listening");
        Ok(Self {
            addr: local,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// [`Endpoint::start`] on `addr` serving `ops`, if an address is set.
    ///
    /// # Errors
    /// As [`Endpoint::start`].
    pub fn start_if(addr: Option<SocketAddr>, ops: &Ops) -> Result<Option<Self>, EndpointError> {
        addr.map(|addr| Self::start(addr, ops.clone())).transpose()
    }

    /// The address listened on (the bound port when 0 was asked for).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The listener, holding at most [`Limits::connections`] open connections, each for at most
/// [`Limits::lifetime`].
struct Bounded {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    lifetime: Duration,
}

impl axum::serve::Listener for Bounded {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        // The semaphore is never closed.
        let Ok(slot) = Arc::clone(&self.slots).acquire_owned().await else {
            return std::future::pending().await;
        };
        let (stream, addr) = axum::serve::Listener::accept(&mut self.listener).await;
        let connection = Connection {
            stream,
            ends: Box::pin(tokio::time::sleep(self.lifetime)),
            _slot: slot,
        };
        (connection, addr)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// An accepted connection: it fails its reads and writes once its lifetime is over (the
/// server then closes it), and gives its slot back when dropped.
struct Connection {
    stream: TcpStream,
    ends: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Connection {
    /// `Ready` with an error once the lifetime is over; else registers for its end.
    fn over(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        self.ends
            .as_mut()
            .poll(cx)
            .map(|()| std::io::Error::new(std::io::ErrorKind::TimedOut, "connection lifetime over"))
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Poll::Ready(e) = this.over(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(e) = this.over(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

fn router(ops: Ops) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/leader", get(leader))
        .route("/metrics", get(metrics))
        .with_state(ops)
}

/// 200 while the host works; 503 once a renewal or campaign step is overdue by more than L/4,
/// or while it will not campaign (`require-same-services`).
async fn healthz(State(ops): State<Ops>) -> Response {
    if let Some(reason) = ops.health().refusal() {
        let body = format!("not campaigning: {reason}\n");
        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
    }
    match ops.health().overdue() {
        None => (StatusCode::OK, "ok\n").into_response(),
        Some(by) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "wedged: a renewal or campaign step is overdue by more than L/4 (by {} ms)\n",
                by.as_millis()
            ),
        )
            .into_response(),
    }
}

/// 200 with slot and term on a leader; 503 on a standby.
async fn leader(State(ops): State<Ops>) -> Response {
    let (status, body) = match ops.leader() {
        Some(leader) => (
            StatusCode::OK,
            serde_json::json!({
                "leader": true,
                "slot": leader.slot,
                "term": leader.term,
                "time_left_ms": leader
                    .deadline
                    .time_left()
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            }),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({ "leader": false }),
        ),
    };
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{body}\n"),
    )
        .into_response()
}

/// The Prometheus exposition (`OpenMetrics` text, which Prometheus scrapes natively).
async fn metrics(State(ops): State<Ops>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        ops.render(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::clock::ManualClock;

    /// One HTTP/1.0 GET: the status code and the body.
    fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let status = text[9..12].parse().unwrap();
        let body = text.split_once("\r\n\r\n").unwrap().1.to_owned();
        (status, body)
    }

    /// The wedge, end to end through HTTP on the injected clock: a step published and not
    /// followed by another within L/4 of its due time turns `/healthz` to 503. (An e2e test
    /// cannot wedge a real host: every store call of the loops is bounded by a timeout, so a
    /// stalled store makes it lose its lease, not wedge; only a blocked runtime or a bug can,
    /// and SIGSTOP would stop the endpoint too.)
    #[test]
    fn healthz_is_503_once_a_step_is_overdue_by_more_than_a_quarter_lease() {
        let clock = ManualClock::default();
        let ops = Ops::new(Arc::new(clock.clone()));
        let endpoint = Endpoint::start("127.0.0.1:0".parse().unwrap(), ops.clone()).unwrap();
        let addr = endpoint.addr();
        assert_eq!(get(addr, "/healthz").0, 200);
        ops.health()
            .step_due_in(Duration::from_secs(5), Duration::from_secs(20));
        clock.advance(Duration::from_secs(10));
        assert_eq!(get(addr, "/healthz").0, 200);
        clock.advance(Duration::from_secs(1));
        let (status, body) = get(addr, "/healthz");
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("overdue"), "{body}");
        assert_eq!(get(addr, "/leader").0, 503, "a standby");
        let (status, body) = get(addr, "/metrics");
        assert_eq!(status, 200);
        assert!(body.contains("vvm_takeovers_total 0"), "{body}");
        assert_eq!(get(addr, "/nope").0, 404);
        drop(endpoint);
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "stopped on drop"
        );
    }

    /// Connections to `port` on this machine that the server has accepted: in
    /// `/proc/net/tcp`, established, with the port on the local side and an inode (one still
    /// in the listener's backlog has none). Other tests' sockets do not count. Counted by
    /// inode: the file is read in pieces while other tests' sockets come and go, which can
    /// show one row twice (9 of 8 once, in CI).
    fn accepted(port: u16) -> usize {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        table
            .lines()
            .skip(1)
            .filter_map(|row| {
                let cols: Vec<&str> = row.split_whitespace().collect();
                let local_port = cols[1].rsplit(':').next().unwrap();
                (u16::from_str_radix(local_port, 16).unwrap() == port
                    && cols[3] == "01"
                    && cols[9] != "0")
                    .then(|| cols[9].to_owned())
            })
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// A client holding connections open, without end, cannot take more than
    /// [`Limits::connections`] of the host's file descriptors (it would leave none for its
    /// store, its locks and its guests); a connection is closed at the end of its lifetime, so
    /// idle ones cannot hold the endpoint for ever either.
    #[test]
    fn connections_are_bounded_in_number_and_lifetime() {
        // Counted while no connection can end: one that ends while `/proc/net/tcp` is read
        // (not atomically) can be seen beside the one accepted in its slot (9 at once, on a
        // loaded machine, when the lifetime was 3 s and the count took longer).
        let limits = Limits {
            connections: 8,
            lifetime: Duration::from_hours(1),
        };
        let ops = Ops::new(Arc::new(ManualClock::default()));
        let endpoint = Endpoint::start_with("127.0.0.1:0".parse().unwrap(), ops, limits).unwrap();
        let addr = endpoint.addr();
        let clients: Vec<_> = (0..100)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        // Once the server has accepted what it will.
        let mut held = 0;
        let mut steady_since = std::time::Instant::now();
        while steady_since.elapsed() < Duration::from_millis(300) && held <= 8 {
            std::thread::sleep(Duration::from_millis(10));
            let now = accepted(addr.port());
            if now != held {
                held = now;
                steady_since = std::time::Instant::now();
            }
        }
        assert!(held <= 8, "{held} connections accepted at once");
        assert!(held > 0, "none accepted");
        drop(clients);
        assert_eq!(get(addr, "/healthz").0, 200);

        // An idle connection reaches its lifetime and is closed: the slots cannot be held
        // for ever, and a request gets through.
        let limits = Limits {
            connections: 8,
            lifetime: Duration::from_millis(200),
        };
        let ops = Ops::new(Arc::new(ManualClock::default()));
        let endpoint = Endpoint::start_with("127.0.0.1:0".parse().unwrap(), ops, limits).unwrap();
        let addr = endpoint.addr();
        let clients: Vec<_> = (0..100)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let mut first = &clients[0];
        first
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut rest = Vec::new();
        assert_eq!(
            first.read_to_end(&mut rest).unwrap(),
            0,
            "closed by the server"
        );
        drop(clients);
        assert_eq!(get(addr, "/healthz").0, 200);
    }

    #[test]
    fn a_taken_address_is_a_clear_error_naming_it() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let ops = Ops::new(Arc::new(ManualClock::default()));
        let err = Endpoint::start(addr, ops).unwrap_err().to_string();
        assert!(
            err.contains("metrics-addr") && err.contains(&addr.to_string()),
            "{err}"
        );
    }
}
