//! The bodies of an outgoing exchange, fenced (SPEC §6, §10), each a [`DeadlineBody`]. The
//! guest's writes to a request body go through a channel to the task that sends them, which
//! may run after the deadline: the request body ([`Sent`]) is checked for every frame it
//! hands to the connection, so a frame the guest wrote in time but that would be sent late is
//! dropped, and the request with it. A response body as the guest reads it ([`Quiet`]) ends
//! at the deadline too, and when nothing arrives for the between-bytes timeout.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt as _;
use http_body_util::combinators::MapErr;
use hyper::body::Incoming;
use wasmtime_wasi_http::{Error, WasiBody};

use crate::interfaces::body::{BodyEnds, DeadlineBody};
use crate::lease::LeaseDeadline;

/// The error an exchange ends with once the lease deadline has passed.
pub(super) fn fenced() -> Error {
    Error::InternalError(Some(
        "lease deadline passed: outgoing HTTP request dropped, another host may lead now".into(),
    ))
}

/// A request body: only the deadline ends it.
pub(super) struct Sent;

impl BodyEnds for Sent {
    type Error = Error;

    fn fenced(&self) -> Error {
        fenced()
    }
}

/// The guest's request body `inner`, every frame checked against `deadline` just before it
/// goes to the connection.
pub(super) fn request(inner: WasiBody, deadline: LeaseDeadline) -> DeadlineBody<WasiBody, Sent> {
    DeadlineBody::new(inner, deadline, Sent)
}

/// What a response body holds while it lasts, and does when it ended whole: its exchange's
/// connection and place among the requests in flight.
pub(super) trait Held: Send + Unpin + 'static {
    /// The body was read to its end, in time.
    fn finished(&mut self);
}

/// A response body: ends when nothing arrives for `between_bytes`; holds what its exchange
/// holds ([`Held`]) until then.
pub(super) struct Quiet<H> {
    between_bytes: Duration,
    silence: Pin<Box<tokio::time::Sleep>>,
    held: H,
}

impl<H: Held> BodyEnds for Quiet<H> {
    type Error = Error;

    fn fenced(&self) -> Error {
        fenced()
    }

    fn framed(&mut self) {
        let next = tokio::time::Instant::now() + self.between_bytes;
        self.silence.as_mut().reset(next);
    }

    fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        self.silence
            .as_mut()
            .poll(cx)
            .map(|()| Error::ConnectionReadTimeout)
    }

    fn finished(&mut self) {
        self.held.finished();
    }
}

/// The response body `incoming` as the guest's side of `wasi:http` takes it: ends in an error
/// once `deadline` has passed, or when nothing arrives for `between_bytes`; holds `held` while
/// it lasts, and tells it when it was read to its end.
pub(super) fn response(
    incoming: Incoming,
    deadline: LeaseDeadline,
    between_bytes: Duration,
    held: impl Held,
) -> WasiBody {
    let incoming: MapErr<Incoming, fn(hyper::Error) -> Error> = incoming.map_err(Error::Hyper);
    let ends = Quiet {
        between_bytes,
        silence: Box::pin(tokio::time::sleep(between_bytes)),
        held,
    };
    DeadlineBody::new(incoming, deadline, ends).boxed_unsync()
}
