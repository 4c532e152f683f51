//! Body wrappers of the proxy: streaming bodies counted as they pass, never buffered.
//!
//! The byte limits need request + response sizes, and the in-flight gauges need to
//! know when a response has really finished (its last byte went out, or the client
//! went away). Both are done by wrapping the body: each data frame is reported to a
//! [`Tally`] as it streams, and the tally learns the end of the stream when the body
//! ends or is dropped.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use pin_project_lite::pin_project;

/// Receives the sizes of the data frames of one body as they stream.
pub(crate) trait Tally {
    /// Called for every data frame with its length in bytes.
    fn add(&mut self, bytes: u64);
}

/// A tally that counts nothing, for bodies whose size does not matter.
impl Tally for () {
    fn add(&mut self, _bytes: u64) {}
}

pin_project! {
    /// A body that reports every data frame to a [`Tally`] and keeps it alive until the
    /// body is dropped (so a guard inside the tally is released at the end of the stream).
    pub(crate) struct Counted<B, T> {
        #[pin]
        inner: B,
        tally: T,
    }
}

impl<B, T> Counted<B, T> {
    pub(crate) fn new(inner: B, tally: T) -> Self {
        Self { inner, tally }
    }
}

impl<B, T> Body for Counted<B, T>
where
    B: Body<Data = Bytes>,
    T: Tally,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.tally.add(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// The body of every response the proxy sends: either the upstream's response
    /// streaming through, or a short body the agent made itself (an error or a
    /// rejection). An enum rather than a boxed trait object keeps the hot path free of
    /// an allocation per response.
    #[project = ProxyBodyProj]
    pub enum ProxyBody<B> {
        /// Streams from the upstream.
        Upstream { #[pin] body: B },
        /// Made by the agent.
        Local { #[pin] body: Full<Bytes> },
    }
}

impl<B> ProxyBody<B> {
    /// A body made by the agent.
    pub fn local(bytes: impl Into<Bytes>) -> Self {
        Self::Local {
            body: Full::new(bytes.into()),
        }
    }

    /// A body streaming from the upstream.
    pub fn upstream(body: B) -> Self {
        Self::Upstream { body }
    }
}

impl<B> Body for ProxyBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project() {
            ProxyBodyProj::Upstream { body } => body.poll_frame(cx),
            ProxyBodyProj::Local { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Upstream { body } => body.is_end_stream(),
            Self::Local { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Upstream { body } => body.size_hint(),
            Self::Local { body } => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    struct Sum<'a>(&'a mut u64);

    impl Tally for Sum<'_> {
        fn add(&mut self, bytes: u64) {
            *self.0 += bytes;
        }
    }

    #[tokio::test]
    async fn counted_reports_every_data_frame() {
        let frames = ["hello", ", ", "world"]
            .map(|s| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from(s))));
        let mut total = 0;
        let body = Counted::new(
            StreamBody::new(futures::stream::iter(frames)),
            Sum(&mut total),
        );
        let collected = body.collect().await.map(|c| c.to_bytes());
        assert_eq!(collected.ok(), Some(Bytes::from("hello, world")));
        assert_eq!(total, 12);
    }
}
