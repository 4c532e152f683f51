//! Both directions of one client stream at once, within one task: an
//! exchange relays the request body from the client while the response goes
//! back to it. Any `AsyncRead + AsyncWrite` stream splits this way without
//! an allocation (unlike `tokio::io::split`): the two halves share the
//! stream through a `Mutex` that is never contended (a task polls one half
//! at a time), so each poll costs one uncontended `try_lock`.

use std::io;
use std::pin::Pin;
use std::sync::{Mutex, TryLockError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// One half of a stream split by [`split`]: reads when the stream reads,
/// writes when it writes.
pub(crate) struct Half<'a, 's, S>(&'a Mutex<&'s mut S>);

/// The read and the write half of `stream` (two views of it).
pub(crate) fn split<'a, 's, S>(stream: &'a Mutex<&'s mut S>) -> (Half<'a, 's, S>, Half<'a, 's, S>) {
    (Half(stream), Half(stream))
}

impl<S> Half<'_, '_, S> {
    /// Runs `f` on the stream. A poll of one half never polls the other, so
    /// the stream is free; if it were not, the call fails instead of panicking.
    fn with<T>(&self, f: impl FnOnce(Pin<&mut S>) -> Poll<io::Result<T>>) -> Poll<io::Result<T>>
    where
        S: Unpin,
    {
        match self.0.try_lock() {
            Ok(mut stream) => f(Pin::new(&mut **stream)),
            // A panic in a poll poisons it; the stream itself is still whole.
            Err(TryLockError::Poisoned(e)) => f(Pin::new(&mut **e.into_inner())),
            Err(TryLockError::WouldBlock) => Poll::Ready(Err(io::Error::other(
                "both halves of a stream polled at once",
            ))),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Half<'_, '_, S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.with(|s| s.poll_read(cx, buf))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Half<'_, '_, S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.with(|s| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.with(|s| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.0.try_lock().is_ok_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|s| s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|s| s.poll_shutdown(cx))
    }
}
