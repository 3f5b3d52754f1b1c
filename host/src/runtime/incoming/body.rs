//! A served response's body, under the lease (SPEC §10, "Incoming HTTP"): it ends in an
//! error, never cleanly, once the lease deadline or the request timeout has passed, or once
//! the guest's call was cut short (trapped, fenced, timed out, dropped on stop). hyper then
//! aborts the connection, so a truncated body never looks complete to the client:
//! wasmtime-wasi-http's own body ends cleanly when the guest's store is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, SizeHint};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use wasmtime_wasi_http::Error;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::lease::LeaseDeadline;

/// The error a response body ends in when it cannot be completed.
fn cut(why: &'static str) -> Error {
    Error::InternalError(Some(format!("response aborted: {why}")))
}

/// A guest's response body, cut at the lease deadline, the request timeout, or when the
/// guest's call ended badly (`broken`).
pub(super) struct LeasedBody {
    inner: HyperOutgoingBody,
    deadline: LeaseDeadline,
    passed: Pin<Box<dyn Future<Output = ()> + Send>>,
    timeout: Pin<Box<tokio::time::Sleep>>,
    broken: CancellationToken,
    broken_wait: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl LeasedBody {
    pub(super) fn new(
        inner: HyperOutgoingBody,
        deadline: LeaseDeadline,
        timeout_at: tokio::time::Instant,
        broken: CancellationToken,
    ) -> Self {
        let watched = deadline.clone();
        Self {
            inner,
            deadline,
            passed: Box::pin(async move { watched.passed().await }),
            timeout: Box::pin(tokio::time::sleep_until(timeout_at)),
            broken_wait: Box::pin(broken.clone().cancelled_owned()),
            broken,
        }
    }

    /// Why the body must end now, if it must.
    fn check(&self) -> Option<Error> {
        if self.deadline.has_passed() {
            Some(cut("lease deadline passed"))
        } else if self.broken.is_cancelled() {
            Some(cut("the handler did not complete"))
        } else if self.timeout.is_elapsed() {
            Some(cut("request timeout"))
        } else {
            None
        }
    }
}

impl Body for LeasedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if let Some(e) = self.check() {
            return Poll::Ready(Some(Err(e)));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            // The end, or a frame, may have come with a cut: checked again.
            Poll::Ready(None) => Poll::Ready(self.check().map(Err)),
            Poll::Ready(Some(Ok(frame))) => match self.check() {
                Some(e) => Poll::Ready(Some(Err(e))),
                None => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Pending => {
                let woke = self.passed.as_mut().poll(cx).is_ready()
                    | self.timeout.as_mut().poll(cx).is_ready()
                    | self.broken_wait.as_mut().poll(cx).is_ready();
                if woke && let Some(e) = self.check() {
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Pending
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
