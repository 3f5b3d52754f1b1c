//! An HTTP body under the lease (SPEC §6, §10): every path a body's bytes take past the guest
//! boundary (a response the host serves, a request body it sends, a response body the guest
//! reads) ends in an error, never cleanly, once the lease deadline has passed, or once
//! whatever else ends that kind of body has come ([`BodyEnds`]: a request timeout, a handler
//! cut short, a silent peer).
//!
//! The deadline is checked before each frame is asked for, after each frame and after the end
//! (a frame or the end that waited past the deadline is not passed on), and it wakes a body
//! that waits for its next frame, so a stalled body ends at the deadline too.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, SizeHint};

use crate::lease::LeaseDeadline;

/// What else ends a body of one kind, beside the lease deadline.
pub(crate) trait BodyEnds: Unpin {
    /// The error the body ends in.
    type Error;

    /// The error once the lease deadline has passed.
    fn fenced(&self) -> Self::Error;

    /// Why the body must end now for another reason, if it must; checked with the deadline.
    fn ended(&self) -> Option<Self::Error> {
        None
    }

    /// A frame went through.
    fn framed(&mut self) {}

    /// The body ended whole, in time.
    fn finished(&mut self) {}

    /// Polled while the body waits for its next frame: registers the wake-ups of the other
    /// ends, and is ready with the error once one of them has come.
    fn poll_ended(&mut self, _cx: &mut Context<'_>) -> Poll<Self::Error> {
        Poll::Pending
    }
}

/// `inner` under the lease deadline and `ends`.
pub(crate) struct DeadlineBody<B, X> {
    inner: B,
    deadline: LeaseDeadline,
    /// Wakes a body that waits for its next frame at the deadline; made at the first wait (a
    /// body whose frames are all ready at once never needs it).
    passed: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    ends: X,
}

impl<B, X: BodyEnds> DeadlineBody<B, X> {
    pub(crate) fn new(inner: B, deadline: LeaseDeadline, ends: X) -> Self {
        Self {
            inner,
            deadline,
            passed: None,
            ends,
        }
    }

    /// Why the body must end now, if it must.
    fn check(&self) -> Option<X::Error> {
        if self.deadline.has_passed() {
            Some(self.ends.fenced())
        } else {
            self.ends.ended()
        }
    }
}

impl<B, X> Body for DeadlineBody<B, X>
where
    B: Body<Data = Bytes, Error = X::Error> + Unpin,
    X: BodyEnds,
{
    type Data = Bytes;
    type Error = X::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, X::Error>>> {
        let this = &mut *self;
        if let Some(e) = this.check() {
            return Poll::Ready(Some(Err(e)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            // The end, or a frame, may have come with a cut: checked again.
            Poll::Ready(None) => {
                if let Some(e) = this.check() {
                    return Poll::Ready(Some(Err(e)));
                }
                this.ends.finished();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(e) = this.check() {
                    return Poll::Ready(Some(Err(e)));
                }
                this.ends.framed();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Pending => {
                let passed = this.passed.get_or_insert_with(|| {
                    let watched = this.deadline.clone();
                    Box::pin(async move { watched.passed().await })
                });
                if passed.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(this.ends.fenced())));
                }
                this.ends.poll_ended(cx).map(|e| Some(Err(e)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Past the deadline the end is not taken as given: the next poll says why not.
        self.inner.is_end_stream() && self.check().is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
