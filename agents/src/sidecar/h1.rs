//! The proxy's HTTP/1.1 path: the common case, without hyper.
//!
//! hyper builds a `HeaderMap` for every request and response, runs the upstream
//! connection as a second task behind a pool and a channel, and arms a timer per
//! request; on the 2-vCPU bench box that puts a proxy at about 1.3x nginx's CPU per
//! request before any policy is enforced (BENCHMARKS.md). This path does what nginx
//! does instead:
//!
//! - a request head is parsed in place (`httparse`) and the engine reads its headers
//!   there ([`Headers::Raw`]);
//! - the head forwarded upstream is written straight into a reused buffer, without
//!   the hop-by-hop headers and with `x-forwarded-for` appended;
//! - each client connection keeps its own keep-alive connections to the upstreams
//!   it used, driven by the same task: no pool, no channel, no second task;
//! - bodies are relayed as they arrive (the request body upstream while the
//!   response comes back), never buffered whole, and counted for byte limits;
//! - the idle/header-read timeout and the route timeouts re-arm one timer per
//!   connection only when the deadline has moved far enough (see [`Deadline`]).
//!
//! Anything else goes to hyper, with the bytes already read: HTTP/2 (by its
//! preface), HTTP/1.0, `Upgrade`, `Expect`, `CONNECT`, absolute-form targets, a
//! transfer coding other than `chunked`, conflicting lengths, heads over 64 headers
//! or 64 KiB, and anything `httparse` refuses (hyper then answers 400 or 431). The
//! hand-over happens only between requests, before anything of the request was
//! sent upstream, so a connection is served by one path at a time.

use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use http::uri::Authority;
use http::{Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::headers::HOP_BY_HOP;
use super::proxy::{Failure, Shared, Side};
use crate::engine::Target;
use crate::{Admission, Direction, Headers, Outcome, RequestInfo};

/// Most headers of a head on this path (more: hyper takes the connection).
const MAX_HEADERS: usize = 64;
/// Largest head on this path.
const MAX_HEAD: usize = 64 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 8 * 1024;
/// Longest chunk extension and trailer section accepted in a chunked body.
const MAX_CHUNK_META: usize = 16 * 1024;
/// Bodies of locally answered requests up to this size are read and dropped so the
/// connection can stay open; longer ones close it.
const MAX_DISCARD: u64 = 64 * 1024;
/// Keep-alive upstream connections one client connection keeps.
const MAX_UPSTREAMS: usize = 4;
/// How long connecting to an upstream may take (as the pooled client's connector).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Idle upstream connections a listener keeps once their client connection ended,
/// and for how long (as the pooled client's idle timeout).
const MAX_IDLE: usize = 256;
const IDLE_FOR: Duration = Duration::from_secs(90);

/// What a connection of a proxy listener needs.
#[derive(Clone)]
pub(crate) struct Listener {
    pub(crate) shared: Arc<Shared>,
    pub(crate) side: Side,
    pub(crate) stop: CancellationToken,
    /// `stop`, as a flag read on every request (`is_cancelled` takes a lock).
    stopping: Arc<AtomicBool>,
    pub(crate) header_read_timeout: Option<Duration>,
}

impl Listener {
    /// The context of a listener's connections. Call it inside the runtime: a task
    /// raises the stop flag when `stop` is cancelled.
    pub(crate) fn new(
        shared: Arc<Shared>,
        side: Side,
        stop: CancellationToken,
        header_read_timeout: Option<Duration>,
    ) -> Self {
        let stopping = Arc::new(AtomicBool::new(stop.is_cancelled()));
        let (flag, token) = (stopping.clone(), stop.clone());
        tokio::spawn(async move {
            token.cancelled().await;
            flag.store(true, Ordering::Relaxed);
        });
        Self {
            shared,
            side,
            stop,
            stopping,
            header_read_timeout,
        }
    }

    /// Whether the listener is stopping (connections close after their request).
    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
}

/// Serves one client connection: HTTP/1.1 here, the rest through `fallback`, which
/// gets the connection and the bytes read but not yet handled.
pub(crate) async fn serve<F, Fut>(
    mut client: TcpStream,
    peer: SocketAddr,
    cx: Listener,
    fallback: F,
) where
    F: FnOnce(Prefixed<TcpStream>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut conn = Conn {
        cx: &cx,
        peer: peer.ip().to_string(),
        buf: BytesMut::with_capacity(READ_CHUNK),
        out: Vec::with_capacity(1024),
        back: Vec::with_capacity(1024),
        upstreams: Vec::new(),
        idle: Deadline::new(),
        route: Deadline::new(),
        stopped: Box::pin(cx.stop.clone().cancelled_owned()),
    };
    let end = conn.run(&mut client).await;
    // The upstream connections outlive this client connection in the idle pool.
    for upstream in conn.upstreams.drain(..) {
        cx.shared.idle.put(upstream);
    }
    if let End::Fallback = end {
        let buf = std::mem::take(&mut conn.buf);
        drop(conn);
        fallback(Prefixed::new(buf, client)).await;
    }
}

/// Idle keep-alive upstream connections whose client connection has ended, shared by
/// a listener's connections (a client that closes after every request still reuses
/// upstream connections). A client connection takes from here only for its first
/// request to an upstream; after that it keeps its own.
#[derive(Debug, Default)]
pub(crate) struct IdlePool {
    conns: Mutex<Vec<(Upstream, Instant)>>,
}

impl IdlePool {
    /// A live idle connection to `authority`, most recent first.
    fn take(&self, authority: &Authority) -> Option<Upstream> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        conns.retain(|(_, since)| now.saturating_duration_since(*since) < IDLE_FOR);
        while let Some(i) = conns
            .iter()
            .rposition(|(u, _)| u.authority.as_str() == authority.as_str())
        {
            let (upstream, _) = conns.swap_remove(i);
            if upstream.alive() {
                return Some(upstream);
            }
        }
        None
    }

    fn put(&self, upstream: Upstream) {
        if !upstream.alive() {
            return;
        }
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= MAX_IDLE {
            conns.remove(0);
        }
        conns.push((upstream, Instant::now()));
    }
}

/// How the HTTP/1 path ends with a connection.
enum End {
    Close,
    /// hyper takes over (the unread bytes stay in the buffer).
    Fallback,
}

/// An answer the agent makes itself.
enum Local<'r> {
    Rejection(&'r crate::Rejection),
    Failure(Failure),
}

/// How a message body is delimited (RFC 9112 section 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Responses only: the body ends when the upstream closes.
    UntilClose,
}

/// One keep-alive connection to an upstream.
#[derive(Debug)]
struct Upstream {
    authority: Authority,
    stream: TcpStream,
    buf: BytesMut,
}

impl Upstream {
    /// Whether the connection can carry a request: nothing unread, and the upstream
    /// has not closed it. Costs no system call unless the socket became readable
    /// (tokio keeps its readiness), which an idle HTTP/1 connection only does when
    /// the upstream closes it.
    fn alive(&self) -> bool {
        let mut byte = [0_u8; 1];
        self.buf.is_empty()
            && matches!(self.stream.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

struct Conn<'c> {
    cx: &'c Listener,
    /// The client address, for `x-forwarded-for`.
    peer: String,
    /// Bytes read from the client and not yet handled.
    buf: BytesMut,
    /// The head being written (to the upstream, or a local answer to the client).
    out: Vec<u8>,
    /// The response head being written to the client.
    back: Vec<u8>,
    upstreams: Vec<Upstream>,
    idle: Deadline,
    route: Deadline,
    /// The listener's stop, waited on between requests. One future for the whole
    /// connection: a new one per request would join and leave the token's waiter
    /// list (a lock each) every time.
    stopped: Pin<Box<WaitForCancellationFutureOwned>>,
}

/// A request head, parsed and checked.
struct Head {
    len: usize,
    method: Method,
    framing: Framing,
    /// The client asked to close after this request.
    close: bool,
}

/// Why an exchange with the upstream ended.
enum Exchange {
    /// The response went to the client; whether the client connection may stay open.
    Done { keep_client: bool },
    /// Nothing reached the client; answer with this.
    Failed(Failure, Option<Outcome>),
    /// The upstream closed the connection before a byte of a response.
    Stale,
    /// The route timeout passed before the response head.
    TimedOut { keep_client: bool },
    /// The client went away, or the response broke after its head was sent.
    Broken,
}

impl Conn<'_> {
    async fn run(&mut self, client: &mut TcpStream) -> End {
        loop {
            if !self.read_head(client).await {
                return End::Close;
            }
            match self.request(client).await {
                Some(true) => {}
                Some(false) => return End::Close,
                None => return End::Fallback,
            }
            if self.cx.stopping() {
                return End::Close;
            }
        }
    }

    /// Reads until the buffer holds a whole head. `false`: the connection is done
    /// (closed, idle past the header-read timeout, or the listener is stopping while
    /// it waits). A head too large for this path also returns `true`: parsing it
    /// fails and hyper takes the connection.
    async fn read_head(&mut self, client: &mut TcpStream) -> bool {
        let mut scanned = 0;
        // From the first read on: a slow head does not move it.
        let mut deadline = None;
        loop {
            if head_end(&self.buf, scanned).is_some() {
                return true;
            }
            if self.buf.len() >= MAX_HEAD {
                return true;
            }
            scanned = self.buf.len().saturating_sub(3);
            // Waiting for a next request (nothing of it read yet) ends on stop.
            let idle = self.buf.is_empty();
            self.buf.reserve(READ_CHUNK);
            let read = client.read_buf(&mut self.buf);
            let n = match self.cx.header_read_timeout {
                None => tokio::select! {
                    n = read => n,
                    () = &mut self.stopped, if idle => return false,
                },
                Some(limit) => {
                    let at = *deadline.get_or_insert_with(|| self.idle.arm_at_least(limit));
                    tokio::select! {
                        n = read => n,
                        () = &mut self.stopped, if idle => return false,
                        () = self.idle.expired(at) => return false,
                    }
                }
            };
            match n {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
    }

    /// Handles the request whose head is in the buffer. `Some(keep_open)`, or
    /// `None` when hyper must take the connection.
    async fn request(&mut self, client: &mut TcpStream) -> Option<bool> {
        let cx = self.cx;
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut slots);
        let len = match req.parse(&self.buf) {
            Ok(httparse::Status::Complete(len)) => len,
            _ => return None,
        };
        let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
            return None;
        };
        let method = Method::from_bytes(method.as_bytes()).ok()?;
        if method == Method::CONNECT {
            return None;
        }
        // Origin-form, or absolute-form (`GET http://host/path`, as clients that
        // use the outbound listener as their HTTP proxy send): the upstream gets the
        // origin-form, and the target's host names the callee.
        let (target, target_host) = split_target(target)?;
        let headers: &[httparse::Header<'_>] = req.headers;
        let conn_tokens = header_tokens(headers, "connection");
        let (framing, close) = request_framing(headers, &conn_tokens)?;
        let head = Head {
            len,
            method,
            framing,
            close,
        };
        let path = target.split_once('?').map_or(target, |(p, _)| p);
        let raw = Headers::Raw(headers);

        // Where it goes, and the engine's decision.
        let (authority, info) = match cx.side {
            Side::Inbound => (
                &cx.shared.local,
                RequestInfo {
                    direction: Direction::Inbound,
                    method: &head.method,
                    path,
                    headers: raw,
                    target: None,
                },
            ),
            Side::Outbound => {
                let dest = super::proxy::target_service(raw, target_host)
                    .ok_or(Failure::BadRequest(
                        "gov-agent: an outbound call needs a `gov-service` or `host` header naming the service\n",
                    ))
                    .and_then(|service| {
                        let pool = cx.shared.directory.get(service);
                        let instance = pool.and_then(|p| p.pick());
                        if instance.is_none() {
                            tracing::debug!(service, "outbound call to an unknown service");
                        }
                        instance
                            .map(|i| (service, i))
                            .ok_or(Failure::UnknownService)
                    });
                match dest {
                    Ok((service, instance)) => (
                        &instance.authority,
                        RequestInfo {
                            direction: Direction::Outbound,
                            method: &head.method,
                            path,
                            headers: raw,
                            target: Some(Target {
                                service,
                                instance: Some(&instance.id),
                            }),
                        },
                    ),
                    Err(failure) => {
                        drop(conn_tokens);
                        return Some(
                            self.answer_locally(client, &head, Local::Failure(failure))
                                .await,
                        );
                    }
                }
            }
        };
        let admission = match cx.shared.engine.admit(&info).await {
            Ok(admission) => admission,
            Err(rejection) => {
                drop(conn_tokens);
                return Some(
                    self.answer_locally(client, &head, Local::Rejection(&rejection))
                        .await,
                );
            }
        };

        self.out.clear();
        write_request_head(
            &mut self.out,
            &head.method,
            target,
            headers,
            &conn_tokens,
            head.framing,
            target_host.unwrap_or(authority.as_str()),
            &self.peer,
        );
        let authority = authority.clone();
        drop(conn_tokens);
        self.buf.advance(head.len);
        Some(self.forward(client, &head, authority, admission).await)
    }

    /// Answers the request here (its head is still in the buffer) and skips its
    /// body. Whether the connection stays open.
    async fn answer_locally(
        &mut self,
        client: &mut TcpStream,
        head: &Head,
        answer: Local<'_>,
    ) -> bool {
        let keep = !head.close && discardable(head, &self.buf) && !self.cx.stopping();
        self.out.clear();
        match answer {
            Local::Rejection(rejection) => rejection.write_http1(&mut self.out, !keep),
            Local::Failure(failure) => failure.write_http1(&mut self.out, !keep),
        }
        if client.write_all(&self.out).await.is_err() {
            return false;
        }
        if !keep {
            return false;
        }
        let body = match head.framing {
            Framing::Length(n) => usize::try_from(n).unwrap_or(usize::MAX),
            _ => 0,
        };
        self.buf.advance(head.len);
        let mut left = body;
        let take = left.min(self.buf.len());
        self.buf.advance(take);
        left -= take;
        while left > 0 {
            self.buf.reserve(READ_CHUNK);
            match client.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {
                    let take = left.min(self.buf.len());
                    self.buf.advance(take);
                    left -= take;
                }
            }
        }
        true
    }

    /// Forwards the request (its head is in `self.out`) to `authority` under
    /// `admission` and relays the response. Whether the client connection stays open.
    async fn forward(
        &mut self,
        client: &mut TcpStream,
        head: &Head,
        authority: Authority,
        mut admission: Admission,
    ) -> bool {
        let deadline = admission.timeout().map(|t| Instant::now() + t);
        if let Some(at) = deadline {
            // Armed once per request here; `receive` only waits on it.
            self.route.arm_before(at);
        }
        // A request without a body can be sent again if a kept-alive upstream
        // connection turns out to be closed before answering (as nginx and hyper
        // do for idempotent requests).
        let replayable = head.framing == Framing::Empty && is_idempotent(&head.method);
        let mut attempt = 0;
        let exchange = loop {
            attempt += 1;
            let (mut upstream, reused) = match self.take_upstream(&authority).await {
                Ok(found) => found,
                Err(()) => break Exchange::Failed(Failure::Connect, Some(Outcome::ConnectFailure)),
            };
            let exchange = self
                .exchange(client, &mut upstream, head, &mut admission, deadline)
                .await;
            match exchange {
                (Exchange::Stale, _) if reused && replayable && attempt == 1 => {
                    tracing::debug!(%authority, "kept-alive upstream connection was closed; sending again");
                    continue;
                }
                (Exchange::Stale, _) => {
                    break Exchange::Failed(Failure::Upstream, Some(Outcome::Reset));
                }
                (exchange, reusable) => {
                    if reusable {
                        self.put_upstream(upstream);
                    }
                    break exchange;
                }
            }
        };
        match exchange {
            Exchange::Done { keep_client } => {
                drop(admission);
                keep_client && !head.close && !self.cx.stopping()
            }
            // `Stale` was turned into a retry or a failure above.
            Exchange::Broken | Exchange::Stale => false,
            Exchange::Failed(failure, outcome) => {
                match outcome {
                    Some(outcome) => admission.finish(outcome),
                    None => drop(admission),
                }
                // Without a request body nothing of the request is left unread.
                let keep = head.framing == Framing::Empty && !head.close && !self.cx.stopping();
                self.out.clear();
                failure.write_http1(&mut self.out, !keep);
                client.write_all(&self.out).await.is_ok() && keep
            }
            Exchange::TimedOut { keep_client } => {
                let close = !keep_client || head.close || self.cx.stopping();
                self.out.clear();
                match admission.timed_out() {
                    Some(rejection) => rejection.write_http1(&mut self.out, close),
                    None => Failure::Timeout.write_http1(&mut self.out, close),
                }
                client.write_all(&self.out).await.is_ok() && !close
            }
        }
    }

    /// A kept-alive connection to `authority` (this client connection's own, else
    /// one from the listener's idle pool), or a new one. `Ok((conn, reused))`.
    async fn take_upstream(&mut self, authority: &Authority) -> Result<(Upstream, bool), ()> {
        // Authorities come from the config: compare bytes, not case-insensitively.
        while let Some(i) = self
            .upstreams
            .iter()
            .position(|u| u.authority.as_str() == authority.as_str())
        {
            let upstream = self.upstreams.swap_remove(i);
            if upstream.alive() {
                return Ok((upstream, true));
            }
        }
        if let Some(upstream) = self.cx.shared.idle.take(authority) {
            return Ok((upstream, true));
        }
        // An address connects at once; a name is looked up first (on tokio's
        // blocking pool).
        let connect = async {
            match authority.as_str().parse::<SocketAddr>() {
                Ok(addr) => TcpStream::connect(addr).await,
                Err(_) => TcpStream::connect(authority.as_str()).await,
            }
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                Ok((
                    Upstream {
                        authority: authority.clone(),
                        stream,
                        buf: BytesMut::with_capacity(READ_CHUNK),
                    },
                    false,
                ))
            }
            Ok(Err(error)) => {
                tracing::debug!(%authority, %error, "upstream connect failed");
                Err(())
            }
            Err(_) => {
                tracing::debug!(%authority, "upstream connect timed out");
                Err(())
            }
        }
    }

    fn put_upstream(&mut self, upstream: Upstream) {
        if self.upstreams.len() >= MAX_UPSTREAMS {
            let oldest = self.upstreams.remove(0);
            self.cx.shared.idle.put(oldest);
        }
        self.upstreams.push(upstream);
    }

    /// One request/response exchange on `upstream`: the request body goes up while
    /// the response comes back. Returns how it ended and whether `upstream` can be
    /// used again.
    async fn exchange(
        &mut self,
        client: &mut TcpStream,
        upstream: &mut Upstream,
        head: &Head,
        admission: &mut Admission,
        deadline: Option<Instant>,
    ) -> (Exchange, bool) {
        // A meter holds the snapshot and the limit's cells: only worth taking for
        // a request that has a body to count.
        let meter = if admission.counts_bytes() && head.framing != Framing::Empty {
            admission.byte_meter()
        } else {
            None
        };
        let (mut client_rd, mut client_wr) = client.split();
        let (mut up_rd, mut up_wr) = upstream.stream.split();
        let replayable = head.framing == Framing::Empty;
        let out = &mut self.out;
        let client_buf = &mut self.buf;
        let send = async {
            if replayable {
                // Keep the head for a second attempt.
                return up_wr
                    .write_all(out.as_slice())
                    .await
                    .map_err(|_| Broke::Write);
            }
            relay(
                head.framing,
                client_buf,
                &mut client_rd,
                &mut up_wr,
                out,
                |n| {
                    if let Some(m) = &meter {
                        m.add(n);
                    }
                },
            )
            .await
        };
        let route = &mut self.route;
        let stopping = &self.cx.stopping;
        let recv = receive(
            &mut up_rd,
            &mut upstream.buf,
            &mut client_wr,
            &mut self.back,
            (&head.method, || {
                head.close || stopping.load(Ordering::Relaxed)
            }),
            admission,
            deadline.map(|d| (route, d)),
        );
        let mut send = pin!(send);
        let mut recv = pin!(recv);
        let mut sent: Option<Result<(), Broke>> = None;
        let received = loop {
            tokio::select! {
                biased;
                received = &mut recv => break received,
                result = &mut send, if sent.is_none() => {
                    match result {
                        // The client broke off its request body.
                        Err(Broke::Read | Broke::Eof) => return (Exchange::Broken, false),
                        // Nothing of the response has reached the client yet.
                        Err(Broke::Chunking) => {
                            return (
                                Exchange::Failed(
                                    Failure::BadRequest("gov-agent: malformed chunked request body\n"),
                                    None,
                                ),
                                false,
                            );
                        }
                        result => sent = Some(result),
                    }
                }
            }
        };
        let body_sent = matches!(sent, Some(Ok(())));
        match received {
            Received::Done {
                keep_upstream,
                keep_client,
            } => (
                Exchange::Done {
                    // A request body the upstream did not wait for leaves the client
                    // stream somewhere inside it.
                    keep_client: keep_client && body_sent,
                },
                keep_upstream && body_sent,
            ),
            Received::NoHead => (Exchange::Stale, false),
            Received::BadHead => (
                Exchange::Failed(Failure::Upstream, Some(Outcome::Reset)),
                false,
            ),
            Received::TimedOut => (
                Exchange::TimedOut {
                    keep_client: body_sent,
                },
                false,
            ),
            Received::Broken => (Exchange::Broken, false),
        }
    }
}

/// How receiving a response ended.
enum Received {
    Done {
        keep_upstream: bool,
        keep_client: bool,
    },
    /// The upstream closed or failed before a byte of a response head.
    NoHead,
    /// The upstream sent something that is not a usable response head.
    BadHead,
    TimedOut,
    /// The response broke after its head went to the client, or the client left.
    Broken,
}

/// Reads the response head to a `method` request (interim 1xx heads go to the
/// client), reports its status to the engine, and relays it with its body to the
/// client, closing the client connection after it if `closing()` says so then.
async fn receive(
    up_rd: &mut ReadHalf<'_>,
    up_buf: &mut BytesMut,
    client_wr: &mut WriteHalf<'_>,
    out: &mut Vec<u8>,
    (method, closing): (&Method, impl Fn() -> bool),
    admission: &mut Admission,
    deadline: Option<(&mut Deadline, Instant)>,
) -> Received {
    let mut deadline = deadline;
    loop {
        // The head, within the route's deadline.
        let mut scanned = 0;
        loop {
            if head_end(up_buf, scanned).is_some() {
                break;
            }
            if up_buf.len() >= MAX_HEAD {
                return Received::BadHead;
            }
            scanned = up_buf.len().saturating_sub(3);
            up_buf.reserve(READ_CHUNK);
            let read = up_rd.read_buf(up_buf);
            let n = match &mut deadline {
                None => read.await,
                Some((timer, at)) => {
                    let at = *at;
                    tokio::select! {
                        n = read => n,
                        () = timer.expired(at) => return Received::TimedOut,
                    }
                }
            };
            match n {
                Ok(0) | Err(_) if up_buf.is_empty() => return Received::NoHead,
                Ok(0) | Err(_) => return Received::BadHead,
                Ok(_) => {}
            }
        }
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut slots);
        let len = match resp.parse(up_buf) {
            Ok(httparse::Status::Complete(len)) => len,
            _ => return Received::BadHead,
        };
        let (Some(code), Some(version)) = (resp.code, resp.version) else {
            return Received::BadHead;
        };
        let headers: &[httparse::Header<'_>] = resp.headers;
        let conn_tokens = header_tokens(headers, "connection");
        if (100..200).contains(&code) {
            if code == 101 {
                // No upgrade was asked for on this path.
                return Received::BadHead;
            }
            out.clear();
            write_response_head(out, code, resp.reason, headers, &conn_tokens, false, false);
            drop(conn_tokens);
            up_buf.advance(len);
            if client_wr.write_all(out).await.is_err() {
                return Received::Broken;
            }
            continue;
        }
        let Some(framing) = response_framing(method, code, headers) else {
            return Received::BadHead;
        };
        let upstream_close = has_token(&conn_tokens, "close")
            || (version == 0 && !has_token(&conn_tokens, "keep-alive"));
        let keep_client = framing != Framing::UntilClose;
        let close_client = !keep_client || closing();
        out.clear();
        write_response_head(
            out,
            code,
            resp.reason,
            headers,
            &conn_tokens,
            close_client,
            true,
        );
        drop(conn_tokens);
        up_buf.advance(len);
        admission.record(Outcome::Status(code));
        let relayed = relay(framing, up_buf, up_rd, client_wr, out, |n| {
            admission.add_bytes(n);
        })
        .await;
        return match relayed {
            Ok(()) => Received::Done {
                keep_upstream: !upstream_close && framing != Framing::UntilClose,
                keep_client: !close_client,
            },
            Err(_) => Received::Broken,
        };
    }
}

/// A relay stopped early.
#[derive(Debug)]
enum Broke {
    /// Reading the source failed.
    Read,
    /// The source ended inside the body.
    Eof,
    /// Writing the destination failed.
    Write,
    /// The chunked framing is broken.
    Chunking,
}

/// Relays one body framed as `framing` from `buf` (bytes already read) and then
/// `src`, to `dst`, after `out` (a head not yet written, sent with the first body
/// bytes in one write). Calls `tally` with the payload bytes as they pass.
async fn relay<R, W>(
    framing: Framing,
    buf: &mut BytesMut,
    src: &mut R,
    dst: &mut W,
    out: &mut Vec<u8>,
    mut tally: impl FnMut(u64),
) -> Result<(), Broke>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut decoder = Decoder::new(framing);
    loop {
        if !decoder.done() && !buf.is_empty() {
            let step = decoder.advance(buf).ok_or(Broke::Chunking)?;
            if step.taken > 0 {
                if out.is_empty() && step.taken > READ_CHUNK {
                    dst.write_all(&buf[..step.taken])
                        .await
                        .map_err(|_| Broke::Write)?;
                } else {
                    out.extend_from_slice(&buf[..step.taken]);
                }
                tally(step.payload);
                buf.advance(step.taken);
            }
        }
        if !out.is_empty() {
            dst.write_all(out).await.map_err(|_| Broke::Write)?;
            out.clear();
        }
        if decoder.done() {
            return Ok(());
        }
        buf.reserve(READ_CHUNK);
        match src.read_buf(buf).await {
            Ok(0) if framing == Framing::UntilClose => return Ok(()),
            Ok(0) => return Err(Broke::Eof),
            Ok(_) => {}
            Err(_) => return Err(Broke::Read),
        }
    }
}

/// Where a body ends, fed the bytes as they arrive.
#[derive(Debug)]
enum Decoder {
    Length(u64),
    Chunked(Chunk),
    UntilClose,
    Done,
}

/// Where a chunked body is (RFC 9112 section 7.1).
#[derive(Debug, Clone, Copy)]
enum Chunk {
    /// Reading the hex size; `digits` read so far.
    Size {
        size: u64,
        digits: u8,
    },
    /// Skipping a chunk extension up to CR.
    Ext {
        size: u64,
    },
    SizeLf {
        size: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    Trailer,
    TrailerLine,
    TrailerLf,
    EndLf,
}

/// What [`Decoder::advance`] consumed.
struct Step {
    /// Bytes of the input that belong to the body (framing included).
    taken: usize,
    /// Of those, payload bytes (what byte limits count).
    payload: u64,
}

impl Decoder {
    fn new(framing: Framing) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Chunk::Size { size: 0, digits: 0 }),
            Framing::UntilClose => Decoder::UntilClose,
        }
    }

    fn done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// Consumes what of `input` belongs to the body; `None` on broken chunking.
    fn advance(&mut self, input: &[u8]) -> Option<Step> {
        match self {
            Decoder::Done => Some(Step {
                taken: 0,
                payload: 0,
            }),
            Decoder::UntilClose => Some(Step {
                taken: input.len(),
                payload: input.len() as u64,
            }),
            Decoder::Length(left) => {
                let take = usize::try_from(*left).map_or(input.len(), |l| l.min(input.len()));
                *left -= take as u64;
                if *left == 0 {
                    *self = Decoder::Done;
                }
                Some(Step {
                    taken: take,
                    payload: take as u64,
                })
            }
            Decoder::Chunked(state) => {
                let (taken, payload, done) = chunked(state, input)?;
                if done {
                    *self = Decoder::Done;
                }
                Some(Step { taken, payload })
            }
        }
    }
}

/// Advances a chunked body over `input`: `(taken, payload, done)`.
fn chunked(state: &mut Chunk, input: &[u8]) -> Option<(usize, u64, bool)> {
    let mut i = 0;
    let mut payload = 0;
    // Extension and trailer bytes, bounded per body.
    let mut meta = 0;
    while i < input.len() {
        let b = input[i];
        *state = match *state {
            Chunk::Size { size, digits } => match (b as char).to_digit(16) {
                Some(d) if digits < 15 => Chunk::Size {
                    size: size * 16 + u64::from(d),
                    digits: digits + 1,
                },
                Some(_) => return None,
                None if digits == 0 => return None,
                None => match b {
                    b'\r' => Chunk::SizeLf { size },
                    b';' | b' ' | b'\t' => Chunk::Ext { size },
                    _ => return None,
                },
            },
            Chunk::Ext { size } => {
                meta += 1;
                if b == b'\r' {
                    Chunk::SizeLf { size }
                } else if b == b'\n' {
                    return None;
                } else {
                    Chunk::Ext { size }
                }
            }
            Chunk::SizeLf { size } => match (b, size) {
                (b'\n', 0) => Chunk::Trailer,
                (b'\n', size) => Chunk::Data(size),
                _ => return None,
            },
            Chunk::Data(left) => {
                let take =
                    usize::try_from(left).map_or(input.len() - i, |l| l.min(input.len() - i));
                payload += take as u64;
                i += take;
                let left = left - take as u64;
                *state = if left == 0 {
                    Chunk::DataCr
                } else {
                    Chunk::Data(left)
                };
                continue;
            }
            Chunk::DataCr if b == b'\r' => Chunk::DataLf,
            Chunk::DataLf if b == b'\n' => Chunk::Size { size: 0, digits: 0 },
            Chunk::DataCr | Chunk::DataLf => return None,
            Chunk::Trailer => match b {
                b'\r' => Chunk::EndLf,
                b'\n' => return None,
                _ => {
                    meta += 1;
                    Chunk::TrailerLine
                }
            },
            Chunk::TrailerLine => {
                meta += 1;
                match b {
                    b'\r' => Chunk::TrailerLf,
                    b'\n' => return None,
                    _ => Chunk::TrailerLine,
                }
            }
            Chunk::TrailerLf if b == b'\n' => Chunk::Trailer,
            Chunk::EndLf if b == b'\n' => return Some((i + 1, payload, true)),
            Chunk::TrailerLf | Chunk::EndLf => return None,
        };
        if meta > MAX_CHUNK_META {
            return None;
        }
        i += 1;
    }
    Some((i, payload, false))
}

/// The origin-form of a request target and, for an absolute-form `http://` one, its
/// authority; `None` for any other form (`*`, authority-form, other schemes).
fn split_target(target: &str) -> Option<(&str, Option<&str>)> {
    if target.starts_with('/') {
        return Some((target, None));
    }
    let scheme = target.get(..7)?;
    if !scheme.eq_ignore_ascii_case("http://") {
        return None;
    }
    let rest = &target[7..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (host, path) = rest.split_at(end);
    if host.is_empty() || host.contains('@') {
        return None;
    }
    match path.as_bytes().first() {
        Some(b'/') => Some((path, Some(host))),
        // `http://host`: the path is `/` (a query without a path goes to hyper).
        None => Some(("/", Some(host))),
        Some(_) => None,
    }
}

/// Where the head in `buf` ends (just past its empty line), looking from `from` on.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(p) = buf[i..].iter().position(|&b| b == b'\n') {
        let lf = i + p;
        match buf.get(lf + 1) {
            Some(b'\n') => return Some(lf + 2),
            Some(b'\r') if buf.get(lf + 2) == Some(&b'\n') => return Some(lf + 3),
            _ => {}
        }
        i = lf + 1;
    }
    None
}

/// The comma-separated tokens of every `name` header, lowercased is not needed:
/// compare with [`has_token`].
fn header_tokens<'h>(
    headers: &[httparse::Header<'h>],
    name: &str,
) -> smallvec::SmallVec<[&'h [u8]; 4]> {
    let mut tokens = smallvec::SmallVec::new();
    for h in headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)) {
        tokens.extend(
            h.value
                .split(|&b| b == b',')
                .map(trim)
                .filter(|t| !t.is_empty()),
        );
    }
    tokens
}

fn has_token(tokens: &[&[u8]], token: &str) -> bool {
    tokens
        .iter()
        .any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// The framing of a request and whether the client asked to close; `None` when this
/// path does not take the request (hyper answers or serves it).
fn request_framing(headers: &[httparse::Header<'_>], conn: &[&[u8]]) -> Option<(Framing, bool)> {
    let mut length: Option<u64> = None;
    let mut chunked = false;
    for h in headers {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(h.value)?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            // Only a plain `chunked`; other codings (and `chunked` twice) go to hyper.
            if chunked || !trim(h.value).eq_ignore_ascii_case(b"chunked") {
                return None;
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("upgrade") || name.eq_ignore_ascii_case("expect") {
            return None;
        }
    }
    let framing = match (chunked, length) {
        // Both: a request smuggling shape; hyper refuses it.
        (true, Some(_)) => return None,
        (true, None) => Framing::Chunked,
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::Empty,
    };
    Some((framing, has_token(conn, "close")))
}

/// The framing of a response to `method` (RFC 9112 section 6.3); `None` when its
/// lengths are unusable.
fn response_framing(
    method: &Method,
    code: u16,
    headers: &[httparse::Header<'_>],
) -> Option<Framing> {
    if method == Method::HEAD || code == 204 || code == 304 || (100..200).contains(&code) {
        return Some(Framing::Empty);
    }
    let mut length: Option<u64> = None;
    let mut coding: Option<bool> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides; chunked anywhere but last reads until close.
            let last = h.value.rsplit(|&b| b == b',').next().map(trim);
            coding = Some(last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n = parse_length(h.value)?;
            if length.is_some_and(|l| l != n) {
                return None;
            }
            length = Some(n);
        }
    }
    Some(match (coding, length) {
        (Some(true), _) => Framing::Chunked,
        (Some(false), _) => Framing::UntilClose,
        (None, Some(n)) => Framing::Length(n),
        (None, None) => Framing::UntilClose,
    })
}

fn parse_length(value: &[u8]) -> Option<u64> {
    let value = trim(value);
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0_u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Whether the rest of a locally answered request can be read and dropped.
fn discardable(head: &Head, buf: &[u8]) -> bool {
    match head.framing {
        Framing::Empty => true,
        Framing::Length(n) => {
            n <= MAX_DISCARD || (head.len as u64).saturating_add(n) <= buf.len() as u64
        }
        Framing::Chunked | Framing::UntilClose => false,
    }
}

fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Whether `name` is hop-by-hop (RFC 9110 section 7.6.1) on either side: the fixed
/// list `headers::strip_hop_by_hop` uses, or named by `connection`.
fn hop_by_hop(name: &str, conn: &[&[u8]]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_str()))
        || has_token(conn, name)
}

/// Writes the head sent upstream: the request line, the client's end-to-end headers
/// (`te` only as `trailers`), `transfer-encoding: chunked` for a chunked body, a
/// `host` when the client sent none, and `x-forwarded-for` with the client appended.
#[allow(clippy::too_many_arguments)]
fn write_request_head(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    headers: &[httparse::Header<'_>],
    conn: &[&[u8]],
    framing: Framing,
    default_host: &str,
    peer: &str,
) {
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut host = false;
    let mut forwarded: Option<&[u8]> = None;
    for h in headers {
        let name = h.name;
        if hop_by_hop(name, conn) {
            continue;
        }
        if name.eq_ignore_ascii_case("te") {
            if !h
                .value
                .split(|&b| b == b',')
                .any(|t| trim(t).eq_ignore_ascii_case(b"trailers"))
            {
                continue;
            }
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            if forwarded.is_none() {
                forwarded = Some(h.value);
            }
            continue;
        } else if name.eq_ignore_ascii_case("host") {
            host = true;
        }
        push_header(out, name.as_bytes(), h.value);
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !host {
        push_header(out, b"host", default_host.as_bytes());
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if let Some(existing) = forwarded {
        out.extend_from_slice(existing);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(peer.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

/// Writes a response head for the client: the upstream's status and end-to-end
/// headers. `transfer-encoding` passes as it came (the body is relayed as framed);
/// `content-length` is dropped when a transfer coding overrides it. A final head
/// that will close the connection says so.
fn write_response_head(
    out: &mut Vec<u8>,
    code: u16,
    reason: Option<&str>,
    headers: &[httparse::Header<'_>],
    conn: &[&[u8]],
    close: bool,
    end: bool,
) {
    use std::io::Write;
    let reason = reason
        .filter(|r| !r.is_empty())
        .or_else(|| {
            StatusCode::from_u16(code)
                .ok()
                .and_then(|s| s.canonical_reason())
        })
        .unwrap_or("");
    let _ = write!(out, "HTTP/1.1 {code} {reason}\r\n");
    let coded = headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("transfer-encoding"));
    for h in headers {
        let name = h.name;
        if name.eq_ignore_ascii_case("transfer-encoding") {
            push_header(out, name.as_bytes(), h.value);
            continue;
        }
        if hop_by_hop(name, conn) || (coded && name.eq_ignore_ascii_case("content-length")) {
            continue;
        }
        push_header(out, name.as_bytes(), h.value);
    }
    if end && close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// One timer per connection for a recurring deadline (the header-read timeout, a
/// route timeout), re-armed only when the deadline has moved by more than an eighth
/// of its length. Registering a tokio timer takes the timer wheel's lock, and a
/// timer per request costs about a tenth of a proxied request's CPU; a deadline
/// that has only moved a little is checked when the timer fires instead, and the
/// timer is then re-armed for the rest.
struct Deadline {
    sleep: Pin<Box<Sleep>>,
    armed: bool,
}

impl Deadline {
    fn new() -> Self {
        Self {
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: false,
        }
    }

    /// Arms the timer for a deadline `limit` from now that may be served late by
    /// up to an eighth of `limit` (a client gets at least `limit`). Returns the
    /// deadline to pass to [`Deadline::expired`].
    fn arm_at_least(&mut self, limit: Duration) -> Instant {
        let at = Instant::now() + limit;
        let slack = limit / 8;
        if !self.armed || self.sleep.deadline() < at || self.sleep.deadline() > at + slack {
            self.sleep.as_mut().reset(at + slack);
            self.armed = true;
        }
        self.sleep.deadline()
    }

    /// Arms the timer to fire at or before `at` (a route deadline, checked exactly
    /// when it fires).
    fn arm_before(&mut self, at: Instant) {
        let now = Instant::now();
        let slack = at.saturating_duration_since(now) / 8;
        if !self.armed || self.sleep.deadline() > at || self.sleep.deadline() + slack < at {
            self.sleep.as_mut().reset(at);
            self.armed = true;
        }
    }

    /// Completes once `at` has passed.
    async fn expired(&mut self, at: Instant) {
        loop {
            self.sleep.as_mut().await;
            if Instant::now() >= at {
                return;
            }
            self.sleep.as_mut().reset(at);
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection with bytes already read from it: reads return those first.
    pub(crate) struct Prefixed<S> {
        prefix: BytesMut,
        #[pin]
        inner: S,
    }
}

impl<S> Prefixed<S> {
    pub(crate) fn new(prefix: BytesMut, inner: S) -> Self {
        Self { prefix, inner }
    }
}

impl<S: AsyncRead> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        this.inner.poll_read(cx, buf)
    }
}

impl<S: AsyncWrite> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNKED: &[u8] = b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";

    /// Feeds `body` to a decoder in pieces split at `cuts`: (taken, payload, done).
    fn feed(framing: Framing, body: &[u8], cuts: &[usize]) -> Option<(usize, u64, bool)> {
        let mut decoder = Decoder::new(framing);
        let (mut taken, mut payload) = (0, 0);
        let mut start = 0;
        for &end in cuts.iter().chain([&body.len()]) {
            let mut piece = &body[start..end];
            while !piece.is_empty() && !decoder.done() {
                let step = decoder.advance(piece)?;
                taken += step.taken;
                payload += step.payload;
                piece = &piece[step.taken..];
                if step.taken == 0 {
                    break;
                }
            }
            start = end;
        }
        Some((taken, payload, decoder.done()))
    }

    #[test]
    fn chunked_bodies_end_where_they_end_however_they_are_split() {
        let whole = feed(Framing::Chunked, CHUNKED, &[]);
        assert_eq!(whole, Some((CHUNKED.len(), 12, true)));
        for cut in 0..CHUNKED.len() {
            assert_eq!(
                feed(Framing::Chunked, CHUNKED, &[cut]),
                whole,
                "cut at {cut}"
            );
        }
        // Bytes after the body (a pipelined request) are not taken.
        let mut more = CHUNKED.to_vec();
        more.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(feed(Framing::Chunked, &more, &[]), whole);
    }

    #[test]
    fn broken_chunking_is_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"5\nhello\r\n",
            b"5\r\nhelloX\r\n",
            b"1234567890abcdef0\r\n",
            b"\r\n",
            b"0\r\n\n",
        ] {
            assert_eq!(
                feed(Framing::Chunked, bad, &[]),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let long_ext = [b"1;".as_slice(), &[b'a'; MAX_CHUNK_META + 1]].concat();
        assert_eq!(feed(Framing::Chunked, &long_ext, &[]), None);
    }

    #[test]
    fn lengths_take_exactly_their_bytes() {
        assert_eq!(
            feed(Framing::Length(3), b"abcdef", &[1]),
            Some((3, 3, true))
        );
        assert_eq!(feed(Framing::Length(9), b"abc", &[]), Some((3, 3, false)));
        assert_eq!(feed(Framing::Empty, b"abc", &[]), Some((0, 0, true)));
        assert_eq!(feed(Framing::UntilClose, b"abc", &[2]), Some((3, 3, false)));
    }

    #[test]
    fn head_end_finds_the_empty_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nh: 1\r\n\r\nrest", 0), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.1\nh: 1\n\nrest", 0), Some(21));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nh: 1\r\n", 0), None);
        // Scanning resumes a little before where it stopped.
        let head = b"GET / HTTP/1.1\r\n\r\n";
        assert_eq!(head_end(head, head.len() - 3), Some(head.len()));
    }

    fn parse<'h>(
        head: &'h [u8],
        slots: &'h mut [httparse::Header<'h>],
    ) -> httparse::Request<'h, 'h> {
        let mut req = httparse::Request::new(slots);
        assert!(req.parse(head).unwrap().is_complete());
        req
    }

    #[test]
    fn request_framing_takes_plain_lengths_and_chunked_only() {
        let framing = |head: &[u8]| {
            let mut slots = [httparse::EMPTY_HEADER; 16];
            let req = parse(head, &mut slots);
            let conn = header_tokens(req.headers, "connection");
            request_framing(req.headers, &conn)
        };
        assert_eq!(
            framing(b"GET / HTTP/1.1\r\n\r\n"),
            Some((Framing::Empty, false))
        );
        assert_eq!(
            framing(
                b"POST / HTTP/1.1\r\ncontent-length: 12\r\nconnection: keep-alive, Close\r\n\r\n"
            ),
            Some((Framing::Length(12), true))
        );
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n"),
            Some((Framing::Length(3), false))
        );
        assert_eq!(
            framing(b"POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n"),
            Some((Framing::Chunked, false))
        );
        for hyper_s in [
            &b"POST / HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\ncontent-length: +3\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nupgrade: websocket\r\n\r\n",
            b"POST / HTTP/1.1\r\nexpect: 100-continue\r\n\r\n",
        ] {
            assert_eq!(
                framing(hyper_s),
                None,
                "{}",
                String::from_utf8_lossy(hyper_s)
            );
        }
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let framing = |method: Method, head: &[u8]| {
            let mut slots = [httparse::EMPTY_HEADER; 16];
            let mut resp = httparse::Response::new(&mut slots);
            assert!(resp.parse(head).unwrap().is_complete());
            response_framing(&method, resp.code.unwrap(), resp.headers)
        };
        let ok_with = |h: &str| format!("HTTP/1.1 200 OK\r\n{h}\r\n");
        assert_eq!(
            framing(Method::GET, ok_with("content-length: 5\r\n").as_bytes()),
            Some(Framing::Length(5))
        );
        assert_eq!(
            framing(Method::HEAD, ok_with("content-length: 5\r\n").as_bytes()),
            Some(Framing::Empty)
        );
        assert_eq!(
            framing(
                Method::GET,
                b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"
            ),
            Some(Framing::Empty)
        );
        assert_eq!(
            framing(Method::GET, b"HTTP/1.1 204 No Content\r\n\r\n"),
            Some(Framing::Empty)
        );
        assert_eq!(
            framing(
                Method::GET,
                ok_with("content-length: 5\r\ntransfer-encoding: gzip, chunked\r\n").as_bytes()
            ),
            Some(Framing::Chunked)
        );
        assert_eq!(
            framing(
                Method::GET,
                ok_with("transfer-encoding: gzip\r\n").as_bytes()
            ),
            Some(Framing::UntilClose)
        );
        assert_eq!(
            framing(Method::GET, ok_with("").as_bytes()),
            Some(Framing::UntilClose)
        );
        assert_eq!(
            framing(
                Method::GET,
                ok_with("content-length: 1\r\ncontent-length: 2\r\n").as_bytes()
            ),
            None
        );
    }

    #[test]
    fn the_upstream_head_drops_hop_by_hop_headers_and_appends_the_client() {
        let head = b"GET /a?b=1 HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nX-Forwarded-For: 10.0.0.1\r\nX-Kept: 2\r\n\r\n";
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let req = parse(head, &mut slots);
        let conn = header_tokens(req.headers, "connection");
        let mut out = Vec::new();
        write_request_head(
            &mut out,
            &Method::GET,
            req.path.unwrap(),
            req.headers,
            &conn,
            Framing::Empty,
            "127.0.0.1:9000",
            "127.0.0.2",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nTE: trailers\r\nX-Kept: 2\r\nhost: 127.0.0.1:9000\r\nx-forwarded-for: 10.0.0.1, 127.0.0.2\r\n\r\n"
        );
    }

    #[test]
    fn targets_in_absolute_form_become_origin_form() {
        assert_eq!(split_target("/a?b"), Some(("/a?b", None)));
        assert_eq!(
            split_target("http://inventory:8080/items?x=1"),
            Some(("/items?x=1", Some("inventory:8080")))
        );
        assert_eq!(
            split_target("HTTP://inventory"),
            Some(("/", Some("inventory")))
        );
        assert_eq!(split_target("http://inventory?x"), None);
        assert_eq!(split_target("https://inventory/"), None);
        assert_eq!(split_target("http://user@inventory/"), None);
        assert_eq!(split_target("*"), None);
        assert_eq!(split_target("inventory:80"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_fire_no_earlier_than_asked_and_rearm_rarely() {
        let mut d = Deadline::new();
        let start = Instant::now();
        let at = d.arm_at_least(Duration::from_secs(8));
        assert!(at >= start + Duration::from_secs(8) && at <= start + Duration::from_secs(9));
        // A second later the same timer still serves (no re-arm).
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(d.arm_at_least(Duration::from_secs(8)), at);
        d.expired(at).await;
        assert!(Instant::now() >= at);

        // A route deadline fires exactly, even when the timer was armed earlier.
        let mut d = Deadline::new();
        let first = Instant::now() + Duration::from_secs(8);
        d.arm_before(first);
        tokio::time::advance(Duration::from_millis(300)).await;
        let second = Instant::now() + Duration::from_secs(8);
        d.arm_before(second);
        assert_eq!(d.sleep.deadline(), first, "moved less than an eighth: kept");
        d.expired(second).await;
        assert_eq!(Instant::now(), second);
    }
}
