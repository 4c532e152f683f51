//! A connection of the proxy, plain or over TLS, as one type for both proxy
//! paths.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A connection, plain or over TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stream::Plain(_) => "Plain",
            Stream::Tls(_) => "Tls",
        })
    }
}

impl Stream {
    /// The TCP connection under it.
    pub(crate) fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    /// The protocol TLS negotiated (ALPN), if any.
    pub(crate) fn alpn(&self) -> Option<&[u8]> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }

    /// Whether an idle connection can carry a request: nothing to read and
    /// not closed. A plain one costs no system call unless the socket became
    /// readable; a TLS one reads what arrived (a close alert, nothing else
    /// on an idle connection).
    pub(crate) fn idle_and_open(&mut self) -> bool {
        match self {
            Stream::Plain(s) => {
                let mut byte = [0_u8; 1];
                matches!(s.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Stream::Tls(s) => {
                let mut byte = [0_u8; 1];
                let mut buf = ReadBuf::new(&mut byte);
                let mut cx = Context::from_waker(std::task::Waker::noop());
                matches!(
                    Pin::new(&mut **s).poll_read(&mut cx, &mut buf),
                    Poll::Pending
                )
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}
