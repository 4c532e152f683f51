//! One request on the `h2` crate's client directly: the request's body sent
//! on its stream, and the response's body read from it. hyper's HTTP/2 client
//! did both behind a channel to its connection's task, a task spawned per
//! request to wait for the response and two oneshots (issue 37's profile: the
//! dispatch about 2,400 instructions a call and a task poll more); here the
//! request's own future sends and waits, and a body is piped by a task only
//! when it is not all there at once.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::{HeaderMap, HeaderValue, Method, header};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// At most this much of a request's body is sent inline (it was all there
/// when the request was sent); a larger or slower one is piped by a task
/// that waits for the stream's window.
const INLINE: usize = 64 * 1024;

/// Sets `content-length` from the body's exact size when the request has
/// none, as hyper's client does (not for an empty body of a method without
/// payload semantics).
pub(super) fn content_length(method: &Method, headers: &mut HeaderMap, size: &SizeHint) {
    let Some(len) = size.exact() else { return };
    let payload = !matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::CONNECT
    );
    if (len != 0 || payload) && !headers.contains_key(header::CONTENT_LENGTH) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
}

/// What sending one frame of a request's body did.
enum Step {
    /// Sent this many bytes of data; more is to come.
    Sent(usize),
    /// The body is all sent (its end or its trailers), or it failed, or the
    /// stream did: nothing more to send.
    Done,
}

/// Takes one frame of `body` and sends it on `stream`, with the end of the
/// stream when it is the last; a body error resets the stream.
fn poll_send_frame<B>(
    body: &mut B,
    stream: &mut SendStream<Bytes>,
    cx: &mut Context<'_>,
) -> Poll<Step>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let frame = if body.is_end_stream() {
        None
    } else {
        ready!(Pin::new(&mut *body).poll_frame(cx))
    };
    Poll::Ready(match frame {
        None => {
            let _ = stream.send_data(Bytes::new(), true);
            Step::Done
        }
        Some(Err(error)) => {
            let error: BoxError = error.into();
            tracing::debug!(%error, "a request body failed; resetting its upstream stream");
            stream.send_reset(h2::Reason::INTERNAL_ERROR);
            Step::Done
        }
        Some(Ok(frame)) => match frame.into_data() {
            Ok(data) => {
                let len = data.len();
                let end = body.is_end_stream();
                if stream.send_data(data, end).is_err() || end {
                    Step::Done
                } else {
                    Step::Sent(len)
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    stream.reserve_capacity(0);
                    let _ = stream.send_trailers(trailers);
                }
                Step::Done
            }
        },
    })
}

/// Sends what `body` has ready now on `stream`, up to about [`INLINE`] bytes,
/// and the body's end when it comes within them (then `true`: the body is
/// all sent, or failed and the stream was reset). `false`: the rest is for
/// [`pipe`].
pub(super) fn send_ready<B>(
    body: &mut B,
    stream: &mut SendStream<Bytes>,
    cx: &mut Context<'_>,
) -> bool
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut sent = 0;
    while sent <= INLINE {
        match poll_send_frame(body, stream, cx) {
            Poll::Pending => return false,
            Poll::Ready(Step::Done) => return true,
            Poll::Ready(Step::Sent(len)) => sent += len,
        }
    }
    false
}

/// Pipes the rest of `body` on `stream` as hyper's client did: a chunk once
/// the stream has some window (`h2` holds what exceeds it), then the body's
/// end or trailers. Ends early when the upstream resets the stream, or when
/// `cancel` fires (the request's future was dropped before its response
/// came: the stream is reset).
pub(super) async fn pipe<B>(
    mut body: B,
    mut stream: SendStream<Bytes>,
    mut cancel: oneshot::Receiver<()>,
) where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut watch_cancel = true;
    std::future::poll_fn(|cx| {
        if watch_cancel && let Poll::Ready(fired) = Pin::new(&mut cancel).poll(cx) {
            if fired.is_ok() {
                stream.send_reset(h2::Reason::CANCEL);
                return Poll::Ready(());
            }
            // The response came: the body goes on by itself.
            watch_cancel = false;
        }
        loop {
            if !ready!(poll_window(&mut stream, cx)) {
                return Poll::Ready(());
            }
            if let Step::Done = ready!(poll_send_frame(&mut body, &mut stream, cx)) {
                return Poll::Ready(());
            }
        }
    })
    .await;
}

/// Waits for some window on `stream` before more of the body is taken, so
/// the client's body is read no faster than the upstream takes it; `false`
/// when the stream was reset or failed.
fn poll_window(stream: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> Poll<bool> {
    stream.reserve_capacity(1);
    if stream.capacity() == 0 {
        loop {
            match ready!(stream.poll_capacity(cx)) {
                Some(Ok(0)) => {}
                Some(Ok(_)) => return Poll::Ready(true),
                Some(Err(_)) | None => return Poll::Ready(false),
            }
        }
    }
    if let Poll::Ready(reset) = stream.poll_reset(cx) {
        tracing::debug!(
            ?reset,
            "the upstream reset a stream whose request body was being sent"
        );
        return Poll::Ready(false);
    }
    Poll::Ready(true)
}

/// The body of a response on the HTTP/2 client: the stream's data, its
/// window given back as each chunk is taken, then its trailers. `h2` checks
/// the data against a `content-length`.
pub(crate) struct H2Body {
    recv: RecvStream,
    /// What is left of a `content-length`.
    remaining: Option<u64>,
    data_done: bool,
}

impl H2Body {
    pub(super) fn new(recv: RecvStream, headers: &HeaderMap) -> Self {
        let remaining = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        Self {
            recv,
            remaining,
            data_done: false,
        }
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    if let Some(remaining) = &mut this.remaining {
                        *remaining = remaining.saturating_sub(data.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                None => this.data_done = true,
            }
        }
        match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(error) => Poll::Ready(Some(Err(error))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(remaining) => SizeHint::with_exact(remaining),
            None if self.recv.is_end_stream() => SizeHint::with_exact(0),
            None => SizeHint::default(),
        }
    }
}
