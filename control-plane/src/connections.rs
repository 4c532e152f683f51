//! What one client may hold of govd: a cap on open connections, and a
//! deadline for a new connection's first bytes (a TLS ClientHello or the
//! HTTP/2 preface), so that idle sockets cannot fill the cap.
//!
//! Connections beyond the cap are not accepted until one closes: they wait
//! in the kernel's backlog rather than cost govd memory.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// HTTP/2 keepalive: pings this often notice a dead agent or client.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ... and give up on a peer that does not answer within this.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How many connections govd holds and how long it waits for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at once (agents, govc, TUIs together).
    pub max_connections: usize,
    /// HTTP/2 streams at once on one connection.
    pub max_streams_per_connection: u32,
    /// A new connection must send its first bytes within this.
    pub handshake_timeout: Duration,
    /// HTTP/2 pings this often notice a dead peer...
    pub http2_keepalive_interval: Duration,
    /// ... that does not answer within this.
    pub http2_keepalive_timeout: Duration,
    /// TCP keepalive probes after this long idle.
    pub tcp_keepalive: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_streams_per_connection: 128,
            handshake_timeout: Duration::from_secs(10),
            http2_keepalive_interval: KEEPALIVE_INTERVAL,
            http2_keepalive_timeout: KEEPALIVE_TIMEOUT,
            tcp_keepalive: Duration::from_secs(60),
        }
    }
}

/// An accepted connection holding one of the cap's permits until it closes.
pub struct Capped {
    stream: TcpStream,
    /// Until the first bytes arrive.
    deadline: Option<Pin<Box<Sleep>>>,
    _permit: OwnedSemaphorePermit,
}

/// `incoming` with at most `limits.max_connections` open at once, each
/// dropped if it sends nothing within `limits.handshake_timeout`.
pub fn capped(
    incoming: impl Stream<Item = io::Result<TcpStream>> + Send + Unpin + 'static,
    limits: ConnectionLimits,
) -> impl Stream<Item = io::Result<Capped>> + Send + 'static {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Said once per episode of a full cap, not once per connection.
    let warned = Arc::new(AtomicBool::new(false));
    futures::stream::unfold(incoming, move |mut incoming| {
        let (slots, warned) = (slots.clone(), warned.clone());
        async move {
            let permit = match slots.clone().try_acquire_owned() {
                Ok(permit) => {
                    warned.store(false, Ordering::Relaxed);
                    permit
                }
                Err(_) => {
                    if !warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            max = limits.max_connections,
                            "connection cap reached: further connections wait until one closes (--max-connections)"
                        );
                    }
                    slots.acquire_owned().await.ok()?
                }
            };
            let item = incoming.next().await?;
            let item = item.map(|stream| Capped {
                stream,
                deadline: Some(Box::pin(tokio::time::sleep(limits.handshake_timeout))),
                _permit: permit,
            });
            Some((item, incoming))
        }
    })
}

// === impl Capped ===

impl Connected for Capped {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Capped {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let spoke = matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before;
        if spoke {
            self.deadline = None;
        } else if polled.is_pending()
            // Polling the deadline also registers its wake-up.
            && self
                .deadline
                .as_mut()
                .is_some_and(|d| d.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no handshake within the handshake timeout",
            )));
        }
        polled
    }
}

impl AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn pair(
        limits: ConnectionLimits,
    ) -> (
        std::net::SocketAddr,
        impl Stream<Item = io::Result<Capped>> + Send,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        (addr, capped(incoming, limits))
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_says_nothing_is_dropped_at_the_deadline() {
        let limits = ConnectionLimits {
            handshake_timeout: Duration::from_secs(3),
            ..ConnectionLimits::default()
        };
        let (addr, incoming) = pair(limits).await;
        let mut incoming = std::pin::pin!(incoming);
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        let mut buf = [0u8; 8];
        let error = accepted.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);

        // One that speaks in time keeps going after the deadline.
        let mut talker = TcpStream::connect(addr).await.unwrap();
        let mut accepted = incoming.next().await.unwrap().unwrap();
        talker.write_all(b"hi").await.unwrap();
        assert_eq!(accepted.read(&mut buf).await.unwrap(), 2);
        tokio::time::sleep(Duration::from_secs(10)).await;
        talker.write_all(b"there").await.unwrap();
        assert_eq!(accepted.read(&mut buf).await.unwrap(), 5);
    }

    #[tokio::test]
    async fn beyond_the_cap_a_connection_waits_for_one_to_close() {
        let limits = ConnectionLimits {
            max_connections: 1,
            ..ConnectionLimits::default()
        };
        let (addr, incoming) = pair(limits).await;
        let mut incoming = std::pin::pin!(incoming);
        let _first = TcpStream::connect(addr).await.unwrap();
        let held = incoming.next().await.unwrap().unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        // Not accepted while the first is open (bounded wait).
        let waiting = tokio::time::timeout(Duration::from_millis(200), incoming.next()).await;
        assert!(
            waiting.is_err(),
            "a second connection was accepted beyond the cap"
        );
        drop(held);
        let next = tokio::time::timeout(Duration::from_secs(5), incoming.next())
            .await
            .expect("accepted once the first closed");
        assert!(next.unwrap().is_ok());
    }
}
