//! The operations endpoint (SPEC §8, Operations): `GET /healthz`, `/leader`, `/metrics`.
//!
//! It runs on a thread of its own with a single-threaded runtime: a slow or hostile client
//! cannot take a worker from the lease's renewal loop, and `/healthz` still answers (503) when
//! the main runtime is wedged, which is when it matters. The conventions are Patroni's
//! (`/leader` is 200 only on a leader, 503 elsewhere) and etcd's (`/health`, `/metrics`).

use std::net::SocketAddr;
use std::thread::JoinHandle;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::oneshot;

use super::Ops;

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
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
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

    /// [`Endpoint::start`] on `addr` with the process's [`Ops::global`], if an address is set.
    ///
    /// # Errors
    /// As [`Endpoint::start`].
    pub fn start_if(addr: Option<SocketAddr>) -> Result<Option<Self>, EndpointError> {
        addr.map(|addr| Self::start(addr, Ops::global().clone()))
            .transpose()
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

fn router(ops: Ops) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/leader", get(leader))
        .route("/metrics", get(metrics))
        .with_state(ops)
}

/// 200 while the host works; 503 once a renewal or campaign step is overdue by more than L/4.
async fn healthz(State(ops): State<Ops>) -> Response {
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
