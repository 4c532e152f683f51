//! Accept loops, one per listener, with a graceful drain; and hyper's side of a
//! connection (HTTP/1.1 and HTTP/2 on the same port).
//!
//! A listener holds at most its cap of open connections: a connection accepted over
//! the cap is closed at once (as Envoy's `max_connections` does), so a flood of
//! idle connections cannot take the memory and file descriptors the service's real
//! clients need. One client address holds at most its own cap
//! (`--max-connections-per-client`, inbound listener), so one client cannot take
//! the whole listener's cap. All are counted in `/metrics`.
//!
//! On hyper's side an HTTP/2 connection pings its client
//! ([`H2_KEEPALIVE`]; one that does not answer is closed) and is closed with
//! GOAWAY after `--header-read-timeout` without an open stream, the bound an idle
//! HTTP/1 keep-alive connection meets.
//!
//! On stop a loop stops accepting (the listening socket is closed, so new connects are
//! refused), and every open connection finishes what it is doing: HTTP/1.1 completes
//! the request in progress and closes instead of keeping alive, HTTP/2 sends GOAWAY and
//! finishes the open streams. The loop waits for them up to the drain deadline.

use std::collections::HashMap;
use std::convert::Infallible;
use std::error::Error as StdError;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper::rt::{Read, Write};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often hyper's side pings an HTTP/2 client, and how long it waits for the
/// answer before it closes the connection (a dead peer or a stalled one).
pub(crate) const H2_KEEPALIVE: Duration = Duration::from_secs(20);

/// Where an accepted connection is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// On the accepting thread (the admin listener).
    Here,
    /// On the worker threads in turn, when there are some
    /// ([`super::workers`]); else here.
    Workers,
}

/// Serves `listener` until `stop` is cancelled, then drains for at most `drain` (read
/// when the drain begins: a lifecycle `drain D` step sets it). `serve` is called once
/// per connection, on the thread `placement` gives it, and must finish the
/// connection soon after `stop` is cancelled.
pub(crate) async fn accept_loop<S, F>(
    name: &'static str,
    listener: TcpListener,
    stop: CancellationToken,
    drain: crate::lifecycle::DrainDeadline,
    open: Arc<Connections>,
    placement: Placement,
    serve: S,
) where
    S: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    let admit = |stream, peer| admit(name, stream, peer, &open, placement, &serve);
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
        admit(stream, peer);
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
                        Ok(stream) => admit(stream, peer),
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
    placement: Placement,
    serve: &Arc<S>,
) where
    S: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let Some(guard) = open.enter(peer.ip()) else {
        // Dropping the stream closes it, as over the listener's cap.
        if open.over_client_cap.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                listener = name,
                max = open.per_client,
                client = %peer.ip(),
                "a client reached its connection cap; closing its new connections (raise --max-connections-per-client)"
            );
        }
        drop(stream);
        return;
    };
    if open.count() > open.max {
        // Dropping the stream closes it: the client sees a reset or EOF at once
        // instead of waiting in the backlog.
        if open.over_cap.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                listener = name,
                max = open.max,
                "connection cap reached; closing new connections (raise --max-connections)"
            );
        }
        drop((stream, guard));
        return;
    }
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(listener = name, %error, "cannot set TCP_NODELAY");
    }
    let worker = match placement {
        Placement::Workers => super::workers::next(),
        Placement::Here => None,
    };
    let Some(worker) = worker else {
        let conn = serve(stream, peer);
        tokio::spawn(async move {
            conn.await;
            drop(guard);
        });
        return;
    };
    // Registered again with the worker's own reactor, so that the worker
    // alone polls it.
    let stream = match stream.into_std() {
        Ok(stream) => stream,
        Err(error) => {
            tracing::debug!(listener = name, %error, "cannot hand a connection to a worker");
            return;
        }
    };
    let serve = serve.clone();
    worker.spawn(async move {
        match TcpStream::from_std(stream) {
            Ok(stream) => serve(stream, peer).await,
            Err(error) => {
                tracing::debug!(listener = name, %error, "a worker cannot serve a connection");
            }
        }
        drop(guard);
    });
}

/// The open connections of a listener, its cap, and what it refused.
/// The `protocol` label of upgraded connections: an HTTP/1.1 `Upgrade`, an
/// HTTP/2 extended CONNECT.
pub(crate) const UPGRADE_FORMS: [&str; 2] = ["http1", "h2"];

#[derive(Debug)]
pub(crate) struct Connections {
    count: AtomicUsize,
    idle: Notify,
    /// At most this many open at once.
    max: usize,
    /// Connections closed at accept because `max` were open.
    over_cap: AtomicU64,
    /// At most this many open at once from one client address.
    per_client: usize,
    /// Open connections per client address (only addresses with one open).
    clients: Mutex<HashMap<IpAddr, usize>>,
    /// Connections closed at accept because their address had `per_client` open.
    over_client_cap: AtomicU64,
    /// Requests refused as malformed or ambiguous (400, 431, 501).
    pub(crate) refused: AtomicU64,
    /// Admitted calls whose client left before the response ended (their
    /// upstream's answer read to its end, permits held: `abandoned`).
    pub(crate) client_gone: AtomicU64,
    /// Of those, the ones still running at the hold bound, then cut.
    pub(crate) client_gone_cut: AtomicU64,
    /// Connections closed for abandoning admitted calls over their budget.
    pub(crate) closed_abandoning: AtomicU64,
    /// Connections upgraded (WebSocket tunnels), since start, by the client's
    /// form ([`UPGRADE_FORMS`]).
    pub(crate) upgraded: [AtomicU64; 2],
    /// Upgraded connections open now, by form.
    pub(crate) upgraded_open: [AtomicU64; 2],
}

/// One open connection; dropping it closes the counts.
struct Entered(Arc<Connections>, IpAddr);

impl Connections {
    /// A listener's counts: at most `max` connections, `per_client` from one
    /// address.
    pub(crate) fn new(max: usize, per_client: usize) -> Self {
        Self {
            count: AtomicUsize::new(0),
            idle: Notify::new(),
            max: max.max(1),
            over_cap: AtomicU64::new(0),
            per_client: per_client.max(1),
            clients: Mutex::new(HashMap::new()),
            over_client_cap: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            client_gone: AtomicU64::new(0),
            client_gone_cut: AtomicU64::new(0),
            closed_abandoning: AtomicU64::new(0),
            upgraded: [AtomicU64::new(0), AtomicU64::new(0)],
            upgraded_open: [AtomicU64::new(0), AtomicU64::new(0)],
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

    /// Connections closed for abandoning calls over their budget, since start.
    pub(crate) fn closed_abandoning(&self) -> u64 {
        self.closed_abandoning.load(Ordering::Relaxed)
    }

    /// Connections upgraded (WebSocket) in `form`, since start.
    pub(crate) fn upgraded(&self, form: usize) -> u64 {
        self.upgraded[form].load(Ordering::Relaxed)
    }

    /// Upgraded connections in `form` open now.
    pub(crate) fn upgraded_open(&self, form: usize) -> u64 {
        self.upgraded_open[form].load(Ordering::Relaxed)
    }

    /// Connections closed at accept over a client's cap, since start.
    pub(crate) fn over_client_cap(&self) -> u64 {
        self.over_client_cap.load(Ordering::Relaxed)
    }

    /// Counts a new connection from `client`; `None` when that address already has
    /// its cap open.
    fn enter(self: &Arc<Self>, client: IpAddr) -> Option<Entered> {
        if self.per_client < usize::MAX {
            // A poisoned lock only means another thread panicked mid-update of a
            // count: the map is still a map.
            let mut clients = self
                .clients
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let open = clients.entry(client).or_insert(0);
            if *open >= self.per_client {
                return None;
            }
            *open += 1;
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        Some(Entered(self.clone(), client))
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
        if self.0.per_client < usize::MAX {
            let mut clients = self
                .0
                .clients
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(open) = clients.get_mut(&self.1) {
                *open = open.saturating_sub(1);
                if *open == 0 {
                    clients.remove(&self.1);
                }
            }
        }
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Serves one connection with hyper, HTTP/1.1 or HTTP/2 (by the client's preface),
/// until it ends; on `stop` the connection finishes gracefully. `header_read_timeout`
/// bounds how long an HTTP/1 client may take to send a request head (a slowloris guard
/// that also closes idle keep-alive connections), and how long a connection may go
/// without a request in progress before it is closed gracefully (HTTP/2: GOAWAY,
/// streams still open finish).
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
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEPALIVE)
        .keep_alive_timeout(H2_KEEPALIVE)
        // RFC 8441: WebSockets over HTTP/2 (`upgrade`).
        .enable_connect_protocol();
    let activity = Arc::new(Activity::new());
    let seen = activity.clone();
    let service = service_fn(move |req| {
        let busy = Busy::enter(&seen);
        // Boxed: hyper moves the future it spawns a task with (into the task,
        // and with each of the task's stages), so a pointer is copied instead
        // of the whole call's state (issue 37's fixed-rate profile).
        let response = Box::pin(handler(req));
        async move {
            // In progress until its response body is done or dropped.
            let response = response.await.map(|body| {
                body.map_frame(move |frame| {
                    let _busy = &busy;
                    frame
                })
            });
            Ok::<_, Infallible>(response)
        }
    });
    // Upgrades: a WebSocket the upstream accepted becomes a tunnel (`upgrade`).
    let conn = builder.serve_connection_with_upgrades(io, service);
    let mut conn = std::pin::pin!(conn);
    let idle = async {
        match header_read_timeout {
            Some(timeout) => activity.idle_for(timeout).await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = idle => {
            // GOAWAY; an HTTP/2 client that does not answer its PING within the
            // bound again is dropped: nothing is in progress.
            tracing::debug!(listener = name, %peer, "closing an idle connection");
            conn.as_mut().graceful_shutdown();
            let bound = header_read_timeout.unwrap_or(H2_KEEPALIVE);
            tokio::time::timeout(bound, conn).await.unwrap_or(Ok(()))
        }
    };
    if let Err(error) = result {
        tracing::debug!(listener = name, %peer, error = %error, "connection ended with an error");
    }
}

/// The requests in progress on one connection of hyper's side, and when the
/// last one ended, for its idle bound. The bound reads them when its timer
/// fires; a request does not signal it: a signal at each start and end woke
/// the connection and armed a new timer twice a request (issue 37's
/// fixed-rate profile).
struct Activity {
    active: AtomicUsize,
    /// Milliseconds from `base` to the last end of a request.
    last_end: AtomicU64,
    base: Instant,
}

/// One request in progress; dropping it (answered, or reset by the client) ends it.
struct Busy(Arc<Activity>);

impl Busy {
    fn enter(activity: &Arc<Activity>) -> Self {
        activity.active.fetch_add(1, Ordering::Relaxed);
        Busy(activity.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        let ms = u64::try_from(activity.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.last_end.store(ms, Ordering::Relaxed);
        activity.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Activity {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    /// Completes once `timeout` passed with no request in progress and none
    /// ending (a request that starts is in progress until it ends).
    async fn idle_for(&self, timeout: Duration) {
        let mut deadline = self.base + timeout;
        loop {
            tokio::time::sleep_until(deadline).await;
            let last_end = Duration::from_millis(self.last_end.load(Ordering::Relaxed));
            let quiet_until = self.base + last_end + timeout;
            let now = Instant::now();
            if quiet_until > now {
                deadline = quiet_until;
            } else if self.active.load(Ordering::Relaxed) == 0 {
                return;
            } else {
                deadline = now + timeout;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// When `idle_for(timeout)` completes, from the activity's start.
    async fn idle_after(activity: &Arc<Activity>, timeout: Duration) -> Duration {
        activity.idle_for(timeout).await;
        activity.base.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_requests_is_idle_after_the_timeout() {
        let activity = Arc::new(Activity::new());
        assert_eq!(idle_after(&activity, ms(300)).await, ms(300));
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeout_runs_from_the_last_end_of_a_request() {
        let activity = Arc::new(Activity::new());
        let ender = activity.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ms(200)).await;
            drop(Busy::enter(&ender));
            tokio::time::sleep(ms(250)).await;
            drop(Busy::enter(&ender));
        });
        assert_eq!(idle_after(&activity, ms(300)).await, ms(750));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_is_never_idle() {
        let activity = Arc::new(Activity::new());
        let holder = activity.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ms(100)).await;
            let busy = Busy::enter(&holder);
            tokio::time::sleep(ms(2_000)).await;
            drop(busy);
        });
        // In progress from 100 ms to 2,100 ms; idle 300 ms after its end.
        assert_eq!(idle_after(&activity, ms(300)).await, ms(2_400));
    }
}
