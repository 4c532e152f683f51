//! Accept loops: one per listener, HTTP/1.1 and HTTP/2 on the same port, with a
//! graceful drain.
//!
//! On stop a loop stops accepting (the listening socket is closed, so new connects are
//! refused), asks every open connection to finish (HTTP/1.1: complete the request in
//! progress, then close instead of keeping alive; HTTP/2: GOAWAY, finish the open
//! streams), and waits for them up to the drain deadline.

use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `listener` until `stop` is cancelled, then drains for at most `drain` (read
/// when the drain begins: a lifecycle `drain D` step sets it).
/// `header_read_timeout` bounds how long an HTTP/1 client may take to send a request
/// head (a slowloris guard that also closes idle keep-alive connections); `None`
/// saves a timer per request. `handle` is called once per connection with the peer
/// address and returns the per-request handler of that connection.
pub(crate) async fn accept_loop<H, F, B>(
    name: &'static str,
    listener: TcpListener,
    stop: CancellationToken,
    drain: crate::lifecycle::DrainDeadline,
    header_read_timeout: Option<Duration>,
    handle: impl Fn(SocketAddr) -> H,
) where
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
    let graceful = GracefulShutdown::new();

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
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(listener = name, %error, "cannot set TCP_NODELAY");
        }
        let handler = handle(peer);
        let service = service_fn(move |req| {
            let response = handler(req);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(listener = name, %peer, error = %error, "connection ended with an error");
            }
        });
    }

    // Closing the socket now makes new connects fail fast instead of queueing in the
    // backlog while we drain.
    drop(listener);
    let open = graceful.count();
    let drain = drain.get();
    tracing::info!(listener = name, open_connections = open, "draining");
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            listener = name,
            ?drain,
            "drain deadline passed; closing the remaining connections"
        );
    }
}
