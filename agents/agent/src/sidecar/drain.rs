//! A request body that is read to its end (bounded) when the proxy drops it
//! unread: hyper's side of the proxy (HTTP/2, and what the HTTP/1 path hands
//! over).
//!
//! An upstream may answer before it has read the request body (an early
//! error, a rejection, an upload it does not want), and so may the agent (a
//! rule's rejection). Dropping the unread body of an HTTP/2 stream whose
//! response has ended resets the stream with NO_ERROR (RFC 9113 section 8.1
//! allows it), and common clients do not survive that: httpx (httpcore) fails
//! such an upload with `LocalProtocolError`, and so it does when the response
//! ends while it still sends. nginx reads the whole body before it answers; the
//! agent reads (discards) the rest of an unread body and ends the response
//! ([`AfterRequest`]) only once the request has ended, within
//! [`DRAIN_MAX_BYTES`], [`DRAIN_IDLE`] and [`DRAIN_MAX_TIME`] per request,
//! after which the response ends and the stream is reset as before.
//! HTTP/2 bounds how many such streams a connection has open at once (its
//! concurrent streams).

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;

/// The most bytes of an unread request body the agent reads and discards.
pub(crate) const DRAIN_MAX_BYTES: usize = 8 << 20;
/// The longest the agent waits for the next part of an unread request body
/// (a client that stalls is cut sooner).
pub(crate) const DRAIN_IDLE: Duration = Duration::from_secs(10);
/// The longest the agent reads an unread request body in all.
pub(crate) const DRAIN_MAX_TIME: Duration = Duration::from_secs(60);

/// A client's request body; dropped before its end, the rest is read in a task
/// of its own and discarded (bounded), so that its stream is not reset.
pub(crate) struct Draining {
    body: Option<Incoming>,
    /// The body ended or failed: nothing is left to read.
    over: bool,
    /// Dropped when the request has ended (read, drained, or given up on).
    ended: Option<oneshot::Sender<()>>,
}

impl Draining {
    /// `body`, and what tells its response when the request has ended. Only
    /// an HTTP/2 body (`http2`) is drained; another is dropped unread as
    /// before (an HTTP/1 connection then closes).
    pub(crate) fn new(body: Incoming, http2: bool) -> (Self, RequestEnd) {
        let (ended, end) = oneshot::channel();
        let body = Self {
            body: Some(body),
            over: !http2,
            ended: http2.then_some(ended),
        };
        (body, RequestEnd(end))
    }
}

/// Completes when a request's body has ended ([`Draining`]).
pub(crate) struct RequestEnd(oneshot::Receiver<()>);

impl RequestEnd {
    /// Whether the request has ended already.
    fn ended(&mut self) -> bool {
        matches!(
            self.0.try_recv(),
            Err(oneshot::error::TryRecvError::Closed) | Ok(())
        )
    }
}

impl Body for Draining {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let Some(body) = self.body.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.over = true;
            self.ended = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        let Some(body) = self.body.take() else {
            return;
        };
        if self.over || body.is_end_stream() {
            return;
        }
        let ended = self.ended.take();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                drain(body).await;
                drop(ended);
            });
        }
    }
}

/// Reads `body` to its end, discarding it: at most [`DRAIN_MAX_BYTES`] within
/// [`DRAIN_MAX_TIME`], each part within [`DRAIN_IDLE`], then drops it (which
/// resets an HTTP/2 stream).
async fn drain(mut body: Incoming) {
    let mut left = DRAIN_MAX_BYTES;
    let read = async {
        loop {
            let frame = match tokio::time::timeout(DRAIN_IDLE, body.frame()).await {
                Ok(Some(Ok(frame))) => frame,
                Ok(None | Some(Err(_))) => return true,
                Err(_) => return false,
            };
            if let Some(data) = frame.data_ref() {
                let Some(rest) = left.checked_sub(data.len()) else {
                    return false;
                };
                left = rest;
            }
        }
    };
    let ended = tokio::time::timeout(DRAIN_MAX_TIME, read).await;
    if !matches!(ended, Ok(true)) {
        tracing::debug!(
            "an unread request body did not end within the bounds; resetting its stream"
        );
    }
}

/// A response body that ends only once its request has ended (read by the
/// upstream, or drained here): the response to an upload the upstream answered
/// early ends after the upload, as through nginx.
pub(crate) struct AfterRequest<B> {
    body: B,
    /// `None` once the request has ended (or when it had at the head).
    request: Option<RequestEnd>,
}

impl<B> AfterRequest<B> {
    pub(crate) fn new(body: B, mut request: RequestEnd) -> Self {
        let request = (!request.ended()).then_some(request);
        Self { body, request }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for AfterRequest<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match std::task::ready!(Pin::new(&mut this.body).poll_frame(cx)) {
            None => {
                if let Some(request) = &mut this.request {
                    // Either way (ended or given up on), the response may end.
                    let _ = std::task::ready!(Pin::new(&mut request.0).poll(cx));
                    this.request = None;
                }
                Poll::Ready(None)
            }
            frame => Poll::Ready(frame),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.request.is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
