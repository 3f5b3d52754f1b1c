//! Keep-alive connections of one service's outgoing HTTP, per origin (SPEC §14, "Outgoing
//! pool"). A connection per request cost a TCP (and TLS) handshake each time and filled the
//! machine with `TIME_WAIT` sockets under load; here a connection whose exchange ended whole
//! waits, idle, for the next request to its origin.
//!
//! What pooling does not change (each request is still its own, `super`): the allow-list and
//! the address guard are asked for every request (an origin's key includes how the
//! allow-list named it: a connection the guard let through only for a literal address is
//! never reused for a name); every request carries its own fencing-token header; every
//! request is raced against the deadline, its body frames checked, its response ended there.
//!
//! Bounded and fenced as a connection per request was:
//! - the pool is the service's during one leadership ([`crate::interfaces::ServiceEnv`]): a
//!   later term has its own, and dropping it (with the leadership) closes every connection;
//! - each connection is driven by a task that ends it at the lease deadline, and when it has
//!   been idle for the idle timeout;
//! - at most `pool-max-idle-per-origin` wait per origin (more are closed), the most recently
//!   used taken first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use wasmtime_wasi_http::WasiBody;

use super::body::Sent;
use crate::interfaces::body::DeadlineBody;
use crate::lease::LeaseDeadline;

/// What a pooled connection's requests carry: the guest's body, fenced.
pub(super) type RequestBody = DeadlineBody<WasiBody, Sent>;

/// The sending half of an HTTP/1 connection.
pub(super) type Sender = hyper::client::conn::http1::SendRequest<RequestBody>;

/// Where a connection goes, and how the allow-list let it: a connection is reused only for
/// requests to the same origin that the allow-list names the same way.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Origin {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// The allow-list named the address literally: the address guard did not apply.
    pub literal: bool,
}

/// One connection, in use or idle: its sender, and the task that drives it.
pub(super) struct Conn {
    pub sender: Sender,
    /// `Some(since)` while idle in the pool: its driver ends it after the idle timeout.
    idle: watch::Sender<Option<Instant>>,
    _driver: AbortOnDropHandle<()>,
}

impl Conn {
    /// A connection `sender`, driven by `conn` until it ends, `deadline` passes, or it has
    /// been idle for `idle_timeout`; `service` for its log lines.
    pub(super) fn new(
        sender: Sender,
        conn: impl Future<Output = Result<(), hyper::Error>> + Send + 'static,
        deadline: LeaseDeadline,
        idle_timeout: Duration,
        service: Arc<str>,
    ) -> Self {
        let (idle, mut since) = watch::channel(None);
        let driver = tokio::spawn(async move {
            let idle_too_long = async {
                loop {
                    let until = since.borrow_and_update().map(|t| t + idle_timeout);
                    let changed = since.changed();
                    match until {
                        Some(until) => tokio::select! {
                            () = tokio::time::sleep_until(until) => return,
                            changed = changed => if changed.is_err() { return },
                        },
                        None => {
                            if changed.await.is_err() {
                                return;
                            }
                        }
                    }
                }
            };
            tokio::select! {
                biased;
                () = deadline.passed() => {
                    tracing::debug!(service = &*service, "outgoing HTTP connection dropped at the lease deadline");
                }
                () = idle_too_long => {
                    tracing::debug!(service = &*service, "outgoing HTTP connection closed: idle");
                }
                result = conn => {
                    if let Err(error) = result {
                        tracing::debug!(service = &*service, %error, "outgoing HTTP connection failed");
                    }
                }
            }
        });
        Self {
            sender,
            idle,
            _driver: AbortOnDropHandle::new(driver),
        }
    }

    /// Whether it can take a request now.
    fn usable(&self) -> bool {
        !self.sender.is_closed() && self.sender.is_ready()
    }
}

/// The idle connections of one service, by origin.
pub(crate) struct Pool {
    idle: Mutex<HashMap<Origin, Vec<Conn>>>,
    max_idle: usize,
    idle_timeout: Duration,
}

impl Pool {
    /// A pool keeping at most `max_idle` idle connections per origin, each for at most
    /// `idle_timeout`.
    pub(crate) fn new(max_idle: usize, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            idle: Mutex::default(),
            max_idle,
            idle_timeout,
        })
    }

    /// How long an idle connection waits for its next request.
    pub(super) fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// An idle connection to `origin` that can take a request now, if any (the most recently
    /// used first); those that cannot any more are dropped.
    pub(super) fn take(&self, origin: &Origin) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.get_mut(origin)?;
        while let Some(conn) = conns.pop() {
            if conn.usable() {
                conn.idle.send_replace(None);
                return Some(conn);
            }
        }
        idle.remove(origin);
        None
    }

    /// Keeps `conn` for the next request to `origin`, after an exchange that ended whole;
    /// dropped (closed) if it cannot take another request or the origin has its share.
    fn give_back(&self, origin: Origin, conn: Conn) {
        if self.max_idle == 0 || conn.sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let conns = idle.entry(origin).or_default();
        conns.retain(|c| !c.sender.is_closed());
        if conns.len() < self.max_idle {
            conn.idle.send_replace(Some(Instant::now()));
            conns.push(conn);
        }
    }
}

/// A connection in use by one exchange, given back to its pool when the exchange ended whole
/// ([`Lent::returned`]), else closed when dropped.
pub(super) struct Lent {
    pool: Weak<Pool>,
    origin: Origin,
    conn: Option<Conn>,
}

impl Lent {
    /// `conn` to `origin`, lent from `pool`.
    pub(super) fn new(pool: &Arc<Pool>, origin: Origin, conn: Conn) -> Self {
        Self {
            pool: Arc::downgrade(pool),
            origin,
            conn: Some(conn),
        }
    }

    /// The exchange ended whole (its response body read to the end): the connection goes back
    /// to the pool, if the pool is still there.
    pub(super) fn returned(&mut self) {
        if let (Some(pool), Some(conn)) = (self.pool.upgrade(), self.conn.take()) {
            pool.give_back(self.origin.clone(), conn);
        }
    }
}
