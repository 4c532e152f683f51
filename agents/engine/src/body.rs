//! The one body type of a governed call, [`GovBody`]: the request body
//! counted for the call's byte limits as it streams, the response body
//! counted the same way and holding the call's [`Admission`] (its permits,
//! its in-flight count) until it ends, or a short body the agent made
//! itself (a rejection). Used by [`crate::GovernLayer`] and by the sidecar's
//! hyper path; never buffered, and an enum rather than a boxed trait object,
//! so a response costs no allocation.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

use crate::admission::{Admission, ByteMeter};
use crate::rejection::Rejection;

pin_project! {
    /// A body of a governed call. `H`: something else the response holds
    /// until it ends (the sidecar's balancer pick).
    #[project = GovBodyProj]
    pub enum GovBody<B, H = ()> {
        /// A request body, counted by its call's byte meter (`None`: no byte
        /// limit matched).
        Request {
            #[pin]
            body: B,
            meter: Option<ByteMeter>,
        },
        /// A response body; the call ends (permits released) when it ends,
        /// fails, or is dropped (the client left).
        Response {
            #[pin]
            body: B,
            call: Option<(Admission, H)>,
        },
        /// Made here (a rejection, or an answer of the agent's own).
        Local {
            body: Full<Bytes>,
        },
    }
}

/// A request body counted for its call's byte limits.
pub type MeteredBody<B> = GovBody<B>;

impl<B, H> GovBody<B, H> {
    /// The request body of `admission`'s call.
    pub fn request(body: B, admission: &Admission) -> Self {
        Self::metered(body, admission.byte_meter())
    }

    /// A request body counted by `meter` (`None`: not counted).
    pub fn metered(body: B, meter: Option<ByteMeter>) -> Self {
        GovBody::Request { body, meter }
    }

    /// The response body of `admission`'s call, which it holds (with `hold`)
    /// until the body ends. Record the outcome before: [`Admission::record`].
    pub fn response(body: B, admission: Admission, hold: H) -> Self {
        GovBody::Response {
            body,
            call: Some((admission, hold)),
        }
    }

    /// A short body made here.
    pub fn local(bytes: impl Into<Bytes>) -> Self {
        GovBody::Local {
            body: Full::new(bytes.into()),
        }
    }

    /// The response to a rejection, from its one mapping to HTTP.
    pub fn rejected(rejection: &Rejection) -> http::Response<Self> {
        rejection.to_response().map(|body| GovBody::Local { body })
    }

    /// The inner body (`None` for a local one).
    pub fn into_inner(self) -> Option<B> {
        match self {
            GovBody::Request { body, .. } | GovBody::Response { body, .. } => Some(body),
            GovBody::Local { .. } => None,
        }
    }
}

impl<B, H> Body for GovBody<B, H>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project() {
            GovBodyProj::Request { body, meter } => {
                let polled = body.poll_frame(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(meter)) = (&polled, meter.as_ref())
                    && let Some(data) = frame.data_ref()
                {
                    meter.add(data.len() as u64);
                }
                polled
            }
            GovBodyProj::Response { body, call } => {
                let polled = body.poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let (Some((admission, _)), Some(data)) =
                            (call.as_ref(), frame.data_ref())
                        {
                            admission.add_bytes(data.len() as u64);
                        }
                    }
                    // The call is over: release its permits now, not when the
                    // body is dropped.
                    Poll::Ready(Some(Err(_)) | None) => drop(call.take()),
                    Poll::Pending => {}
                }
                polled
            }
            GovBodyProj::Local { body } => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            GovBody::Request { body, .. } | GovBody::Response { body, .. } => body.is_end_stream(),
            GovBody::Local { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            GovBody::Request { body, .. } | GovBody::Response { body, .. } => body.size_hint(),
            GovBody::Local { body } => body.size_hint(),
        }
    }
}
