//! The bodies of an outgoing exchange, fenced (SPEC §6, §10). The guest's writes to a request
//! body go through a channel to the task that sends them, which may run after the deadline:
//! [`FencedBody`] checks it for every frame it hands to the connection. A response body
//! ([`ResponseBody`]) stops at the deadline too, and when nothing arrives for the
//! between-bytes timeout.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use wasmtime_wasi_http::{Error, WasiBody};

use crate::lease::LeaseDeadline;

/// The error an exchange ends with once the lease deadline has passed.
pub(super) fn fenced() -> Error {
    Error::InternalError(Some(
        "lease deadline passed: outgoing HTTP request dropped, another host may lead now".into(),
    ))
}

/// A request body whose every frame is checked against the deadline just before it goes to
/// the connection: a frame the guest wrote in time but that would be sent late is dropped,
/// and the request with it.
pub(super) struct FencedBody {
    pub inner: WasiBody,
    pub deadline: LeaseDeadline,
}

impl Body for FencedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.deadline.has_passed() {
            return Poll::Ready(Some(Err(fenced())));
        }
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx));
        // The frame may have waited in the channel past the deadline.
        if frame.is_some() && self.deadline.has_passed() {
            return Poll::Ready(Some(Err(fenced())));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body as the guest reads it: ends in an error once the deadline has passed, or
/// when nothing arrives for `between_bytes`.
pub(super) struct ResponseBody {
    incoming: Incoming,
    deadline: LeaseDeadline,
    between_bytes: Duration,
    quiet: Pin<Box<tokio::time::Sleep>>,
}

impl ResponseBody {
    pub(super) fn new(
        incoming: Incoming,
        deadline: LeaseDeadline,
        between_bytes: Duration,
    ) -> Self {
        Self {
            incoming,
            deadline,
            between_bytes,
            quiet: Box::pin(tokio::time::sleep(between_bytes)),
        }
    }

    /// As the guest's side of `wasi:http` takes it.
    pub(super) fn boxed(self) -> WasiBody {
        self.boxed_unsync()
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.deadline.has_passed() {
            return Poll::Ready(Some(Err(fenced())));
        }
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + self.between_bytes;
                self.quiet.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::Hyper(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                std::task::ready!(self.quiet.as_mut().poll(cx));
                Poll::Ready(Some(Err(Error::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
