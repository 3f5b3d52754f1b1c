//! The listener of one front door (SPEC §10, "Incoming HTTP"): accepts from the shared
//! socket, or from `http-addr` bound here, until stopped (on the shared socket, only while the
//! door's lease deadline is ahead), and serves each connection; then lets the connections
//! finish their request in progress within the grace period.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use wasmtime_wasi_http::io::TokioIo;

use super::connections::{Busy, Closed, Slot, Watched};
use super::routes::Shared;
use super::sandboxes::Sandboxes;
use super::serve::{Aborted, serve};

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
    // A place for the next connection, got before it is accepted: at `max-connections` the
    // host takes no more from the queue than it can hold (never an `EMFILE`).
    let mut slot: Option<Slot> = None;
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
            got = shared.connections.slot(), if accepting && slot.is_none() => slot = Some(got),
            accepted = listener.accept(), if accepting && slot.is_some() => match accepted {
                Ok((stream, _)) => {
                    let place = slot.take().unwrap_or_else(|| unreachable!("accepted with a place"));
                    place.accepted();
                    let ops = shared.sandboxes.ops();
                    ops.http_connection_accepted();
                    ops.http_connections_open(shared.connections.count());
                    let _ = stream.set_nodelay(true);
                    connections.spawn(connection(stream, Arc::clone(&shared), place, closing.clone()));
                }
                Err(e) => {
                    // The descriptors the host keeps for itself ran out, say: the next
                    // accept may work.
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(REBIND_PAUSE).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {
                shared.sandboxes.ops().http_connections_open(shared.connections.count());
            }
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
            while let Some(place) = slot.take().or_else(|| shared.connections.try_slot())
                && let Ok((stream, _)) = listener.accept()
            {
                if let Ok(stream) = stream
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpStream::from_std(stream))
                {
                    place.accepted();
                    let shared = Arc::clone(&shared);
                    connections.spawn(connection(stream, shared, place, closing.clone()));
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
/// is answered. It is closed when it takes longer than the header timeout to send a head, or
/// idles between two requests past the keep-alive timeout, or when the cap needs its place
/// (`place`) while it waits for a head; a head over the limit is answered 431.
async fn connection<S: Sandboxes>(
    stream: tokio::net::TcpStream,
    shared: Arc<Shared<S>>,
    place: Slot,
    closing: CancellationToken,
) {
    let limits = shared.sandboxes.limits();
    let state = Arc::clone(place.conn());
    let client = stream.peer_addr().ok();
    let service = {
        let (shared, state) = (Arc::clone(&shared), Arc::clone(&state));
        hyper::service::service_fn(move |req| {
            let busy = state.request();
            let shared = Arc::clone(&shared);
            async move {
                let response = serve(shared, req, client).await?;
                Ok::<_, Aborted>(response.map(|body| Tracked { body, _busy: busy }))
            }
        })
    };
    let stream = TokioIo::new(Watched::new(stream, Arc::clone(&state)));
    let conn = http1::Builder::new()
        .keep_alive(true)
        // Its own, in `Conn::expired`: hyper's starts again with every head, so it cannot tell
        // a slow head from an idle keep-alive connection.
        .header_read_timeout(None)
        .max_header_size(limits.max_header_bytes)
        .serve_connection(stream, service);
    tokio::pin!(conn);
    let expired = state.expired(limits.header_timeout, limits.keep_alive_timeout);
    tokio::pin!(expired);
    let why = tokio::select! {
        _ = conn.as_mut() => return,
        why = &mut expired => why,
        () = state.evict.cancelled() => Closed::MaxConnections,
        () = closing.cancelled() => {
            if !state.served() {
                // A connection just accepted: its first request is read and answered (within
                // the header timeout), so a client the host took is never turned away
                // unanswered.
                tokio::select! {
                    _ = conn.as_mut() => return,
                    () = state.first_request() => {}
                    why = &mut expired => {
                        shared.sandboxes.ops().http_connection_closed(why.label());
                        return;
                    }
                }
            }
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
            return;
        }
    };
    shared.sandboxes.ops().http_connection_closed(why.label());
}

/// A response body that keeps its connection busy until it is written whole (or dropped).
struct Tracked<B> {
    body: B,
    _busy: Busy,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
