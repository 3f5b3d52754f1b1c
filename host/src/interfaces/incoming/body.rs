//! A served response's body, under the lease (SPEC §10, "Incoming HTTP"): a
//! [`DeadlineBody`] that also ends once the request timeout has passed, or once the guest's
//! call was cut short (trapped, fenced, timed out, dropped on stop). It ends in an error,
//! never cleanly: hyper then aborts the connection, so a truncated body never looks complete
//! to the client (wasmtime-wasi-http's own body ends cleanly when the guest's store is
//! dropped).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use wasmtime_wasi_http::Error;
use wasmtime_wasi_http::p2::body::HyperOutgoingBody;

use crate::interfaces::body::{BodyEnds, DeadlineBody};
use crate::lease::LeaseDeadline;

/// A guest's response body, cut at the lease deadline, the request timeout, or when the
/// guest's call ended badly (`broken`).
pub(super) type LeasedBody = DeadlineBody<HyperOutgoingBody, Served>;

/// `inner` as a [`LeasedBody`].
pub(super) fn leased(
    inner: HyperOutgoingBody,
    deadline: LeaseDeadline,
    timeout_at: tokio::time::Instant,
    broken: CancellationToken,
) -> LeasedBody {
    let ends = Served {
        timeout: Box::pin(tokio::time::sleep_until(timeout_at)),
        broken_wait: Box::pin(broken.clone().cancelled_owned()),
        broken,
    };
    DeadlineBody::new(inner, deadline, ends)
}

/// The error a response body ends in when it cannot be completed.
fn cut(why: &'static str) -> Error {
    Error::InternalError(Some(format!("response aborted: {why}")))
}

/// What ends a served response beside the deadline.
pub(super) struct Served {
    timeout: Pin<Box<tokio::time::Sleep>>,
    broken: CancellationToken,
    broken_wait: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl BodyEnds for Served {
    type Error = Error;

    fn fenced(&self) -> Error {
        cut("lease deadline passed")
    }

    fn ended(&self) -> Option<Error> {
        if self.broken.is_cancelled() {
            Some(cut("the handler did not complete"))
        } else if self.timeout.is_elapsed() {
            Some(cut("request timeout"))
        } else {
            None
        }
    }

    fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        let woke = self.timeout.as_mut().poll(cx).is_ready()
            | self.broken_wait.as_mut().poll(cx).is_ready();
        match woke.then(|| self.ended()).flatten() {
            Some(e) => Poll::Ready(e),
            None => Poll::Pending,
        }
    }
}
