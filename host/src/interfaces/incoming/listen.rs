//! The listener of one front door (SPEC §10, "Incoming HTTP"): accepts from the shared
//! socket, or from `http-addr` bound here, until stopped (on the shared socket, only while the
//! door's lease deadline is ahead), and serves each connection; then lets the connections
//! finish their request in progress within the grace period.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use wasmtime_wasi_http::io::TokioIo;

use super::routes::Shared;
use super::sandboxes::Sandboxes;
use super::serve::serve;

/// How long a failed bind waits before the next try.
const REBIND_PAUSE: Duration = Duration::from_millis(50);

/// Where a leadership accepts: the shared socket, or `addr` bound here.
pub(super) struct Listener {
    pub addr: SocketAddr,
    /// A descriptor of the machine's shared socket, if it is shared.
    pub socket: Option<std::net::TcpListener>,
}

/// Accepts and serves connections until `stop`; then lets the connections finish their request
/// in progress within `grace`. On a shared socket it takes nothing from the queue while
/// `deadline` has passed (the queue is the next holder's), and takes again if the deadline
/// moves ahead (a membership renewed), and at the stop what is queued is left for the others;
/// an own listener (bound here, again and again while the address is taken) accepts until the
/// stop (past the deadline its requests are answered 503), is closed first, and the
/// connections the kernel completed before the close are taken and answered.
pub(super) async fn listen<S: Sandboxes>(
    listener: Listener,
    shared: Arc<Shared<S>>,
    (stop, deadline): (CancellationToken, crate::lease::LeaseDeadline),
    grace: Duration,
) {
    let Listener { addr, socket } = listener;
    let shared_socket = socket.is_some();
    let listener = match socket {
        Some(socket) => match TcpListener::from_std(socket) {
            Ok(listener) => listener,
            Err(e) => {
                tracing::error!(%addr, error = %e, "http-addr's shared socket cannot be used");
                return;
            }
        },
        None => match bind(addr, &stop).await {
            Some(listener) => listener,
            None => return,
        },
    };
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %local, shared = shared_socket, "http listening");
    let closing = CancellationToken::new();
    let mut connections = JoinSet::new();
    // Whether accepting now: always on an own listener; on the shared socket, while the
    // deadline is ahead.
    let mut accepting = true;
    let passed = deadline.passed();
    tokio::pin!(passed);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            // Before the accept: a host resumed after its deadline takes nothing more from the
            // shared queue, which is its successor's. (A socket of its own it keeps until the
            // stop: nobody else can take from it, and what it accepts past the deadline is
            // answered 503.)
            () = &mut passed, if shared_socket && accepting => {
                tracing::warn!(addr = %local, "http accepting stopped: the lease deadline passed");
                accepting = false;
            }
            () = deadline.ahead(), if !accepting => {
                tracing::info!(addr = %local, "http accepting again: the lease was renewed");
                accepting = true;
                passed.set(deadline.passed());
            }
            accepted = listener.accept(), if accepting => match accepted {
                Ok((stream, _)) => {
                    shared.sandboxes.ops().http_connection_accepted();
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(stream, Arc::clone(&shared), closing.clone()));
                }
                Err(e) => {
                    // Out of descriptors, say: the next accept may work.
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(REBIND_PAUSE).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    if shared_socket {
        // The queue is the next holder's: this host only stops taking from it.
        drop(listener);
        if accepting {
            tracing::info!(addr = %local, "http accepting stopped");
        }
    } else {
        // Connections the kernel completed before the close are taken and answered, not
        // reset.
        if let Ok(listener) = listener.into_std() {
            while let Ok((stream, _)) = listener.accept() {
                if let Ok(stream) = stream
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpStream::from_std(stream))
                {
                    connections.spawn(connection(stream, Arc::clone(&shared), closing.clone()));
                }
            }
        }
        tracing::info!(addr = %local, "http listener closed");
    }
    closing.cancel();
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    });
    if drained.await.is_err() {
        tracing::warn!(
            ?grace,
            "http connections still open after the grace period: dropped"
        );
    }
    connections.shutdown().await;
}

/// A listener on `addr`, bound again every [`REBIND_PAUSE`] while taken; `None` once stopped.
async fn bind(addr: SocketAddr, stop: &CancellationToken) -> Option<TcpListener> {
    let mut said = false;
    loop {
        let bound = (|| {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            // A former leader's connections in TIME_WAIT must not keep the address.
            socket.set_reuseaddr(true)?;
            socket.bind(addr)?;
            socket.listen(1024)
        })();
        match bound {
            Ok(listener) => return Some(listener),
            Err(e) if !said => {
                tracing::warn!(%addr, error = %e, "http-addr taken; binding again until it is free");
                said = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(REBIND_PAUSE) => {}
        }
    }
}

/// Serves one connection until it ends, or, once `closing`, until its request in progress
/// is answered. A connection that waits longer than the idle timeout for a request's head
/// (idle between requests, or a head sent slowly) is closed; a head over the limit is
/// answered 431.
async fn connection<S: Sandboxes>(
    stream: tokio::net::TcpStream,
    shared: Arc<Shared<S>>,
    closing: CancellationToken,
) {
    let limits = shared.sandboxes.limits();
    let asked = Arc::new(Notify::new());
    let first = Arc::clone(&asked);
    let client = stream.peer_addr().ok();
    let service = hyper::service::service_fn(move |req| {
        first.notify_one();
        serve(Arc::clone(&shared), req, client)
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_header_size(limits.max_header_bytes)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut asked_once = false;
    tokio::select! {
        _ = conn.as_mut() => return,
        () = asked.notified() => asked_once = true,
        () = closing.cancelled() => {}
    }
    if !closing.is_cancelled() {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = closing.cancelled() => {}
        }
    }
    if !asked_once {
        // A connection just accepted: its first request is read and answered (bounded by
        // the idle timeout), so a client the host took is never turned away unanswered.
        tokio::select! {
            _ = conn.as_mut() => return,
            () = asked.notified() => {}
        }
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}
