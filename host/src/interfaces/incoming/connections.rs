//! The connections on `http-addr` (SPEC §14, "Incoming limits"): at most a cap of them open
//! at once, each closed when it takes longer than the header timeout to send a request head or
//! idles between two requests past the keep-alive timeout.
//!
//! A connection that never finishes its head costs the client nothing but holds a descriptor
//! of the host's: a flood of them (slowloris) used to take every descriptor, so that accepts
//! failed with `EMFILE` and well-behaved clients were refused. So the host holds at most
//! `max-connections` (well under its descriptor limit), and at the cap it closes the
//! connection that has waited longest for a request head to take the next one, as nginx drains
//! its reusable connections: a slow head is always the oldest, a well-behaved client's head
//! comes at once. Only while every connection is busy with a request does accepting pause
//! (the kernel's queue holds the rest, as it does for any busy server): never a failed accept.
//!
//! [`Connections::slot`] is the accept loop's side; each connection's task watches its own
//! timeouts ([`Conn::expired`]), with [`Watched`] telling it when a head's first byte comes
//! and [`Busy`] when a request is in progress.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why the host closed a connection it had accepted (the label of
/// `vvm_http_connections_closed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// No whole request head within `header-timeout`.
    HeaderTimeout,
    /// Idle between two requests past `keep-alive-timeout`.
    KeepAliveTimeout,
    /// Closed at `max-connections` to take a new connection: it had waited longest for a head.
    MaxConnections,
}

impl Closed {
    /// The metric's label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header-timeout",
            Self::KeepAliveTimeout => "keep-alive-timeout",
            Self::MaxConnections => "max-connections",
        }
    }
}

/// The connections open now, and the cap on them.
pub(crate) struct Connections {
    cap: usize,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next: AtomicU64,
    /// A place was freed.
    freed: Notify,
    /// The time every [`Conn`]'s moments are counted from.
    epoch: Instant,
}

impl Connections {
    /// At most `cap` connections open at once (at least one).
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            open: Mutex::default(),
            next: AtomicU64::new(0),
            freed: Notify::new(),
            epoch: Instant::now(),
        })
    }

    /// How many are open now.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for the next connection to accept: at once below the cap; at the cap, by
    /// closing the connection that has waited longest for a request head (its task counts
    /// it), if any waits; else once a connection ends.
    pub(crate) async fn slot(self: &Arc<Self>) -> Slot {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut open = self.lock();
                if open.len() >= self.cap {
                    let oldest = open
                        .iter()
                        .filter(|(_, c)| c.waiting())
                        .min_by_key(|(_, c)| c.waiting_since.load(Ordering::Relaxed))
                        .map(|(id, _)| *id);
                    if let Some(conn) = oldest.and_then(|id| open.remove(&id)) {
                        conn.evict.cancel();
                    }
                }
                if open.len() < self.cap {
                    return self.insert(&mut open);
                }
            }
            freed.await;
        }
    }

    /// A place at once, if one is free (below the cap); none is made by closing another.
    pub(crate) fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.lock();
        (open.len() < self.cap).then(|| self.insert(&mut open))
    }

    /// A new connection's place, in `open`.
    fn insert(self: &Arc<Self>, open: &mut HashMap<u64, Arc<Conn>>) -> Slot {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            evict: CancellationToken::new(),
            // Reserved, not yet accepted: neither waiting nor closable ([`Slot::accepted`]).
            busy: AtomicUsize::new(1),
            waiting_since: AtomicU64::new(self.now()),
            head_since: AtomicU64::new(0),
            served: AtomicBool::new(false),
            changed: Notify::new(),
            epoch: self.epoch,
        });
        open.insert(id, Arc::clone(&conn));
        Slot {
            connections: Arc::clone(self),
            id,
            conn,
        }
    }

    fn now(&self) -> u64 {
        millis_since(self.epoch)
    }
}

/// Milliseconds from `epoch` to now.
fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A connection's place among the open ones: freed when dropped (its task has ended).
pub(crate) struct Slot {
    connections: Arc<Connections>,
    id: u64,
    conn: Arc<Conn>,
}

impl Slot {
    /// The connection's state.
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// Its connection was accepted now: it waits for its first head from now on. (A place is
    /// got before the accept, and may wait long for it: until then the cap never closes it
    /// and no timeout runs.)
    pub(crate) fn accepted(&self) {
        let conn = &self.conn;
        conn.waiting_since
            .store(millis_since(conn.epoch), Ordering::Release);
        conn.busy.fetch_sub(1, Ordering::AcqRel);
        conn.changed.notify_waiters();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
        self.connections.freed.notify_one();
    }
}

/// One connection's state, as its timeouts and the cap see it.
pub(crate) struct Conn {
    /// Cancelled when the cap closes it.
    pub(crate) evict: CancellationToken,
    /// Requests in progress: a head read, the response not yet written whole.
    busy: AtomicUsize,
    /// Since when it has waited for a request head: its accept, or the end of its last
    /// response (milliseconds from `epoch`).
    waiting_since: AtomicU64,
    /// When the first byte of the head it is reading came, 0 if none yet.
    head_since: AtomicU64,
    /// Whether a request of it has begun (else its first head is awaited).
    served: AtomicBool,
    /// Its state changed: whoever waits on it looks again (every waiter enables its
    /// notification before it looks).
    changed: Notify,
    epoch: Instant,
}

impl Conn {
    /// Waiting for a request head (not busy with one).
    fn waiting(&self) -> bool {
        self.busy.load(Ordering::Acquire) == 0
    }

    /// Whether a request of it has begun.
    pub(crate) fn served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }

    /// Resolves once a request of it has begun (its first head was read whole).
    pub(crate) async fn first_request(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.served.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }

    /// A request's head was read: busy until the returned guard is dropped (with its
    /// response).
    pub(crate) fn request(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(0, Ordering::Release);
        self.served.store(true, Ordering::Release);
        self.changed.notify_waiters();
        Busy(Arc::clone(self))
    }

    /// Bytes came in: the first of a head, if it was waiting for one.
    fn bytes_came(&self) {
        if self.waiting() && self.head_since.load(Ordering::Acquire) == 0 {
            self.head_since
                .store(millis_since(self.epoch).max(1), Ordering::Release);
            self.changed.notify_waiters();
        }
    }

    /// Resolves when one of its timeouts passes, with which: `header` for a head (from the
    /// accept for the first one, from its first byte for a later one), `keep_alive` for the
    /// wait between two requests. Never while a request is in progress.
    pub(crate) async fn expired(&self, header: Duration, keep_alive: Duration) -> Closed {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        // One timer, moved as the state changes (a request begins and ends many times on a
        // kept-alive connection).
        let timer = tokio::time::sleep_until(self.epoch);
        tokio::pin!(timer);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let due = if self.waiting() {
                let head = self.head_since.load(Ordering::Acquire);
                Some(if head != 0 {
                    (head.saturating_add(ms(header)), Closed::HeaderTimeout)
                } else if self.served.load(Ordering::Acquire) {
                    let since = self.waiting_since.load(Ordering::Acquire);
                    (
                        since.saturating_add(ms(keep_alive)),
                        Closed::KeepAliveTimeout,
                    )
                } else {
                    let since = self.waiting_since.load(Ordering::Acquire);
                    (since.saturating_add(ms(header)), Closed::HeaderTimeout)
                })
            } else {
                None
            };
            match due {
                None => changed.await,
                Some((at, why)) => {
                    timer.as_mut().reset(self.epoch + Duration::from_millis(at));
                    tokio::select! {
                        () = &mut timer => return why,
                        () = &mut changed => {}
                    }
                }
            }
        }
    }
}

/// A request in progress on a connection; its end (the response written whole, or dropped)
/// makes the connection wait for a head again.
pub(crate) struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        let conn = &self.0;
        conn.waiting_since
            .store(millis_since(conn.epoch), Ordering::Release);
        conn.busy.fetch_sub(1, Ordering::AcqRel);
        conn.changed.notify_waiters();
    }
}

/// A connection's stream that tells its [`Conn`] when bytes come in.
pub(crate) struct Watched<S> {
    stream: S,
    conn: Arc<Conn>,
}

impl<S> Watched<S> {
    /// `stream`, watched for `conn`.
    pub(crate) fn new(stream: S, conn: Arc<Conn>) -> Self {
        Self { stream, conn }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.bytes_came();
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the cap, the connection that has waited longest for a head makes room; one busy
    /// with a request, or a place not yet accepted into, is never taken; with every connection
    /// busy, a new one waits for a place.
    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_waiting_connection_makes_room() {
        let connections = Connections::new(2);
        let first = connections.slot().await;
        first.accepted();
        tokio::time::advance(Duration::from_millis(10)).await;
        let second = connections.slot().await;
        second.accepted();
        // Both wait for a head: the older goes.
        let third = connections.slot().await;
        third.accepted();
        assert!(first.conn().evict.is_cancelled());
        assert!(!second.conn().evict.is_cancelled());
        assert_eq!(connections.count(), 2);
        drop(first);
        assert_eq!(connections.count(), 2, "its place was taken already");
        // Both busy: the next waits until one ends.
        let busy = (second.conn().request(), third.conn().request());
        let waiting = tokio::spawn({
            let connections = Arc::clone(&connections);
            async move { connections.slot().await }
        });
        tokio::time::advance(Duration::from_mins(1)).await;
        assert!(!waiting.is_finished());
        drop(busy.0);
        drop(second);
        let fourth = waiting.await.unwrap();
        assert!(!third.conn().evict.is_cancelled(), "busy: never closed");
        // A place got and not yet accepted into is never the one closed.
        drop(busy.1);
        let fifth = tokio::spawn({
            let connections = Arc::clone(&connections);
            async move { connections.slot().await }
        });
        tokio::task::yield_now().await;
        assert!(
            third.conn().evict.is_cancelled(),
            "the only one waiting for a head"
        );
        assert!(!fourth.conn().evict.is_cancelled());
        drop(third);
        drop(fifth.await.unwrap());
    }

    /// A first head must come whole within the header timeout of the accept; between two
    /// requests the keep-alive timeout applies until a head begins, then the header timeout
    /// from its first byte; never while a request is in progress.
    #[tokio::test(start_paused = true)]
    async fn each_wait_has_its_own_timeout() {
        let (header, keep_alive) = (Duration::from_secs(10), Duration::from_secs(30));
        let connections = Connections::new(8);
        let slot = connections.slot().await;
        // Got long before its connection came: the timeout counts from the accept.
        tokio::time::advance(Duration::from_mins(1)).await;
        slot.accepted();
        let conn = Arc::clone(slot.conn());
        let start = Instant::now();
        assert_eq!(
            conn.expired(header, keep_alive).await,
            Closed::HeaderTimeout
        );
        assert_eq!(start.elapsed(), header);
        // A request in progress: no timeout of these, however long.
        let busy = conn.request();
        let expired = conn.expired(header, keep_alive);
        tokio::pin!(expired);
        assert!(
            tokio::time::timeout(Duration::from_hours(1), &mut expired)
                .await
                .is_err()
        );
        // Idle after it: the keep-alive timeout.
        drop(busy);
        let idle = Instant::now();
        assert_eq!(expired.await, Closed::KeepAliveTimeout);
        assert_eq!(idle.elapsed(), keep_alive);
        // A head begun after a while: the header timeout from its first byte.
        let request = conn.request();
        drop(request);
        tokio::time::advance(Duration::from_secs(20)).await;
        conn.bytes_came();
        let began = Instant::now();
        assert_eq!(
            conn.expired(header, keep_alive).await,
            Closed::HeaderTimeout
        );
        assert_eq!(began.elapsed(), header);
    }
}
