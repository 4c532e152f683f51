//! Accept loops, one per listener, with a graceful drain; and hyper's side of a
//! connection (HTTP/1.1 and HTTP/2 on the same port).
//!
//! A listener holds at most its cap of open connections: a connection accepted over
//! the cap is closed at once (as Envoy's `max_connections` does), so a flood of
//! idle connections cannot take the memory and file descriptors the service's real
//! clients need. Both are counted in `/metrics`.
//!
//! On stop a loop stops accepting (the listening socket is closed, so new connects are
//! refused), and every open connection finishes what it is doing: HTTP/1.1 completes
//! the request in progress and closes instead of keeping alive, HTTP/2 sends GOAWAY and
//! finishes the open streams. The loop waits for them up to the drain deadline.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::rt::{Read, Write};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Serves `listener` until `stop` is cancelled, then drains for at most `drain` (read
/// when the drain begins: a lifecycle `drain D` step sets it). `serve` is called once
/// per connection and must finish the connection soon after `stop` is cancelled.
pub(crate) async fn accept_loop<S, F>(
    name: &'static str,
    listener: TcpListener,
    stop: CancellationToken,
    drain: crate::lifecycle::DrainDeadline,
    open: Arc<Connections>,
    serve: S,
) where
    S: Fn(TcpStream, SocketAddr) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(error) => {
                // Out of file descriptors and the like: back off a little instead of
                // spinning, and keep serving the connections we have.
                tracing::warn!(listener = name, %error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        admit(name, stream, peer, &open, &serve);
    }

    // The connects already in the listen backlog completed their handshake, and
    // their clients may have sent a request: accept them all (without waiting) and
    // serve them like the others (`h1.rs` reads a first request that comes with
    // the stop), then close the socket, so that new connects are refused at once
    // instead of queueing while we drain. What is left is a connect completing
    // between the last accept and the close: a few microseconds, reset.
    match listener.into_std() {
        Ok(listener) => loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    let stream = stream
                        .set_nonblocking(true)
                        .and_then(|()| TcpStream::from_std(stream));
                    match stream {
                        Ok(stream) => admit(name, stream, peer, &open, &serve),
                        Err(error) => {
                            tracing::debug!(listener = name, %error, "cannot serve a connection of the backlog");
                        }
                    }
                }
                Err(error) => {
                    if error.kind() != std::io::ErrorKind::WouldBlock {
                        tracing::debug!(listener = name, %error, "accepting the backlog failed");
                    }
                    break;
                }
            }
        },
        Err(error) => tracing::debug!(listener = name, %error, "cannot accept the backlog"),
    }
    let drain = drain.get();
    tracing::info!(listener = name, open_connections = open.count(), "draining");
    if tokio::time::timeout(drain, open.idle()).await.is_err() {
        tracing::warn!(
            listener = name,
            ?drain,
            "drain deadline passed; closing the remaining connections"
        );
    }
}

/// Serves an accepted connection, or closes it at once when the listener has its
/// cap of open connections.
fn admit<S, F>(
    name: &'static str,
    stream: TcpStream,
    peer: SocketAddr,
    open: &Arc<Connections>,
    serve: &S,
) where
    S: Fn(TcpStream, SocketAddr) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    if open.count() >= open.max {
        // Dropping the stream closes it: the client sees a reset or EOF at once
        // instead of waiting in the backlog.
        if open.over_cap.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                listener = name,
                max = open.max,
                "connection cap reached; closing new connections (raise --max-connections)"
            );
        }
        drop(stream);
        return;
    }
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(listener = name, %error, "cannot set TCP_NODELAY");
    }
    let guard = open.enter();
    let conn = serve(stream, peer);
    tokio::spawn(async move {
        conn.await;
        drop(guard);
    });
}

/// The open connections of a listener, its cap, and what it refused.
#[derive(Debug)]
pub(crate) struct Connections {
    count: AtomicUsize,
    idle: Notify,
    /// At most this many open at once.
    max: usize,
    /// Connections closed at accept because `max` were open.
    over_cap: AtomicU64,
    /// Requests refused as malformed or ambiguous (400, 431, 501).
    pub(crate) refused: AtomicU64,
    /// Admitted calls whose client left before the response ended (their
    /// upstream's answer read to its end, permits held: `abandoned`).
    pub(crate) client_gone: AtomicU64,
    /// Of those, the ones still running at the hold bound, then cut.
    pub(crate) client_gone_cut: AtomicU64,
}

/// One open connection; dropping it closes the count.
struct Entered(Arc<Connections>);

impl Connections {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            count: AtomicUsize::new(0),
            idle: Notify::new(),
            max: max.max(1),
            over_cap: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            client_gone: AtomicU64::new(0),
            client_gone_cut: AtomicU64::new(0),
        }
    }

    /// Connections open now.
    pub(crate) fn open(&self) -> u64 {
        self.count() as u64
    }

    /// Connections closed at accept over the cap, since start.
    pub(crate) fn over_cap(&self) -> u64 {
        self.over_cap.load(Ordering::Relaxed)
    }

    /// Requests refused, since start.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Admitted calls whose client left before the end, since start.
    pub(crate) fn client_gone(&self) -> u64 {
        self.client_gone.load(Ordering::Relaxed)
    }

    /// Of those, the ones cut at the hold bound, since start.
    pub(crate) fn client_gone_cut(&self) -> u64 {
        self.client_gone_cut.load(Ordering::Relaxed)
    }

    fn enter(self: &Arc<Self>) -> Entered {
        self.count.fetch_add(1, Ordering::Relaxed);
        Entered(self.clone())
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Completes when no connection is open.
    async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Serves one connection with hyper, HTTP/1.1 or HTTP/2 (by the client's preface),
/// until it ends; on `stop` the connection finishes gracefully. `header_read_timeout`
/// bounds how long an HTTP/1 client may take to send a request head (a slowloris guard
/// that also closes idle keep-alive connections).
pub(crate) async fn serve_hyper<I, H, F, B>(
    name: &'static str,
    io: I,
    peer: SocketAddr,
    stop: CancellationToken,
    header_read_timeout: Option<Duration>,
    handler: H,
) where
    I: Read + Write + Unpin + Send + 'static,
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .http2()
        .timer(TokioTimer::new());
    let service = service_fn(move |req| {
        let response = handler(req);
        async move { Ok::<_, Infallible>(response.await) }
    });
    let conn = builder.serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(error) = result {
        tracing::debug!(listener = name, %peer, error = %error, "connection ended with an error");
    }
}
