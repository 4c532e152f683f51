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
//! This path is a security boundary: every request head is first decided by
//! [`codec::check_request`], which refuses every ambiguity with 400 (and closes the
//! connection), normalizes the path before matching, and decides the framing the
//! agent writes upstream. What is left goes to hyper, with the bytes already read:
//! HTTP/2 (by its preface), HTTP/1.0 without a host, `Upgrade`, an `Expect`
//! other than `100-continue`, `CONNECT` and `OPTIONS *`. The hand-over happens only between requests, before anything of the
//! request was sent upstream, so a connection is served by one path at a time.
//!
//! HTTP/1.0 (kept alive when it asks, as nginx does) and `Expect: 100-continue`
//! (answered `100 Continue` by the agent once the rules admitted the call) are
//! served here too; see [`local`].

mod chunked;
pub(crate) mod codec;
mod conn;
mod context;
mod deadline;
mod exchange;
mod left;
mod local;
mod pool;
mod prefixed;
mod read;
mod relay;
mod response;
mod retry;
mod split;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use self::codec::{
    Checked, Framing, MAX_HEAD, MAX_HEADERS, Refusal, Verdict, check_request, head_end,
    leading_empty_lines, write_request_head,
};
use self::conn::{Conn, Exchange, Head, Io};
pub(crate) use self::context::Listener;
use self::deadline::Deadline;
use self::local::{
    CONTINUE, awaits_continue, discardable, is_idempotent, refuse, say_keep_alive, skip_body,
};
use self::pool::Dest;
pub(crate) use self::pool::IdlePool;
pub(crate) use self::prefixed::Prefixed;
use self::relay::{READ_CHUNK, within};
use super::consumer;
use super::front::{Answer, Front, front};
#[cfg(test)]
use super::listener::Side;
use super::listener::{Failure, path_reading};
use super::mtls::Caller;
use gov_engine::deadline::{DeadlineHeader, read as read_deadline};
use gov_engine::{Admission, Headers, Outcome};

/// How long after the listener's stop a connection that has not sent its first
/// request yet may still send it: the bytes of a request sent as the stop lands
/// are on their way (a client cannot tell an unread first request from a lost
/// one, and need not retry a request on a fresh connection).
pub(crate) const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// Serves one client connection: HTTP/1.1 here, the rest through `fallback`, which
/// gets the connection and the bytes read but not yet handled.
pub(crate) async fn serve<S, F, Fut>(
    mut client: S,
    peer: SocketAddr,
    caller: Option<Arc<Caller>>,
    cx: Listener,
    fallback: F,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send,
    F: FnOnce(Prefixed<S>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut conn = Conn {
        cx: &cx,
        peer: peer.ip().to_string(),
        caller,
        buf: BytesMut::with_capacity(READ_CHUNK),
        out: Vec::with_capacity(1024),
        back: Vec::with_capacity(1024),
        upstreams: Vec::new(),
        idle: Deadline::new(),
        route: Deadline::new(),
        stopped: Box::pin(cx.stop.clone().cancelled_owned()),
        first: true,
        grace: None,
    };
    let end = conn.run(&mut client).await;
    // The upstream connections outlive this client connection in the idle pool.
    for upstream in conn.upstreams.drain(..) {
        cx.idle.put(upstream);
    }
    match end {
        End::Fallback => {
            let buf = std::mem::take(&mut conn.buf);
            drop(conn);
            fallback(Prefixed::new(buf, client)).await;
        }
        // A TLS connection ends with its close alert (a plain one with FIN,
        // as dropping it would).
        End::Close => {
            drop(conn);
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, client.shutdown()).await;
        }
    }
}

/// How long closing a client connection may take (a TLS close alert).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// How reading a request head ended.
enum HeadRead {
    /// The buffer holds a whole head.
    Ready,
    /// The connection is done (closed, idle past the header-read timeout, or the
    /// listener is stopping while it waits).
    Closed,
    /// The head is refused before it was parsed.
    Refused(Refusal),
}

/// How the HTTP/1 path ends with a connection.
enum End {
    Close,
    /// hyper takes over (the unread bytes stay in the buffer).
    Fallback,
}

/// An answer the agent makes itself.
enum Local<'r> {
    Rejection(&'r gov_engine::Rejection),
    Failure(Failure),
    /// `consumer from jwt ... on invalid reject`: 401 with this text.
    Unauthenticated(&'r str),
}

impl Conn<'_> {
    async fn run(&mut self, client: &mut impl Io) -> End {
        loop {
            match self.read_head(client).await {
                HeadRead::Ready => self.first = false,
                HeadRead::Closed => return End::Close,
                HeadRead::Refused(refusal) => {
                    refuse(client, self.cx, refusal).await;
                    return End::Close;
                }
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

    /// Handles the request whose head is in the buffer. `Some(keep_open)`, or
    /// `None` when hyper must take the connection. The steps: the codec's
    /// verdict, the request front ([`front`]: refusals, the consumer, an
    /// outbound call's instance), the engine's decision, the head sent
    /// upstream, then the exchange.
    async fn request(&mut self, client: &mut impl Io) -> Option<bool> {
        let cx = self.cx;
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = match check_request(&self.buf, &mut slots, path_reading(&cx.shared, cx.side))
        {
            Verdict::Serve(req) => req,
            Verdict::Hyper => return None,
            Verdict::Refuse(refusal) => {
                refuse(client, cx, refusal).await;
                return Some(false);
            }
        };
        let head = Head {
            len: req.len,
            method: req.method.clone(),
            framing: req.framing,
            close: req.close,
            http10: req.http10,
            expect: req.expect,
        };
        let front = match front(&cx.shared, cx.side, self.caller.as_deref(), &mut req) {
            Ok(front) => front,
            Err(Answer::Refused(refusal)) => {
                refuse(client, cx, refusal).await;
                return Some(false);
            }
            Err(Answer::Unauthenticated(text)) => {
                drop(req);
                let answer = Local::Unauthenticated(&text);
                return Some(self.answer_locally(client, &head, answer).await);
            }
            Err(Answer::Failure(failure)) => {
                drop(req);
                let answer = Local::Failure(failure);
                return Some(self.answer_locally(client, &head, answer).await);
            }
        };
        let admission = match self.admit(&req, &head, &front).await {
            Ok(admission) => admission,
            Err(rejection) => {
                drop((req, front));
                return Some(
                    self.answer_locally(client, &head, Local::Rejection(&rejection))
                        .await,
                );
            }
        };
        self.out.clear();
        let (stamps, left) = (admission.stamps(), admission.forwarded_deadline());
        write_request_head(
            &mut self.out,
            &req,
            &self.peer,
            (stamps, left),
            front.identity.value(),
        );
        drop(req);
        self.buf.advance(head.len);
        let to = match front.pick {
            Some(pick) => Dest::Endpoint(pick),
            None => Dest::Local(cx.shared.local.clone()),
        };
        // Admitted: the client waiting for it may send its body now.
        if awaits_continue(head.expect, head.framing, self.buf.len())
            && !matches!(
                within(cx.client_timeout, client.write_all(CONTINUE)).await,
                Some(Ok(()))
            )
        {
            return Some(false);
        }
        Some(self.forward(client, &head, to, admission).await)
    }

    /// The engine's decision on `req`: its `RequestInfo` from the front,
    /// with the consumer header as the agent writes it upstream, the body's
    /// declared length, and the caller's deadline.
    async fn admit(
        &self,
        req: &Checked<'_>,
        head: &Head,
        front: &Front,
    ) -> Result<Admission, gov_engine::Rejection> {
        let replaced;
        let raw = match front.identity.value() {
            Some((name, value)) => {
                replaced = consumer::replaced(req.headers, name, value);
                Headers::Raw(&replaced)
            }
            None => Headers::Raw(req.headers),
        };
        let info = front.info(self.cx.side, req, raw);
        let declared = match head.framing {
            Framing::Empty => Some(0),
            Framing::Length(n) => Some(n),
            Framing::Chunked | Framing::UntilClose => None,
        };
        // The clock is read only for a request with a deadline.
        let caller = read_deadline(DeadlineHeader::Gov, raw, Instant::now);
        let invalid = front.identity.invalid();
        self.cx.shared.admit(&info, declared, invalid, caller).await
    }

    /// Answers the request here (its head is still in the buffer) and skips its
    /// body. Whether the connection stays open.
    async fn answer_locally(
        &mut self,
        client: &mut impl Io,
        head: &Head,
        answer: Local<'_>,
    ) -> bool {
        let keep = !head.close
            && discardable(head.framing, head.len, self.buf.len(), head.expect)
            && !self.cx.stopping();
        self.out.clear();
        match answer {
            Local::Rejection(rejection) => rejection.write_http1(&mut self.out, !keep),
            Local::Failure(failure) => failure.write_http1(&mut self.out, !keep),
            Local::Unauthenticated(text) => consumer::write_http1(&mut self.out, text, !keep),
        }
        say_keep_alive(&mut self.out, head.http10 && keep);
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
        skip_body(client, &mut self.buf, body, self.cx.client_timeout).await
    }

    /// Forwards the request (its head is in `self.out`) to `to` under `admission`
    /// and relays the response. Whether the client connection stays open.
    ///
    /// Two second attempts, each at most once: a request that could not connect goes
    /// to another endpoint of the called service (nothing of it was sent, so any
    /// method); a request without a body and with an idempotent method that got no
    /// byte of an answer is sent again (as nginx does for idempotent requests): an
    /// outbound call to another endpoint when there is one, on a new connection or
    /// a kept-alive one; an inbound request only when its kept-alive connection was
    /// closed (the local service's idle timeout). Both may happen to one request: a
    /// resend that finds the endpoint gone connects elsewhere. A retry rule that
    /// matched the call replaces both ([`retry`]).
    async fn forward(
        &mut self,
        client: &mut impl Io,
        head: &Head,
        mut to: Dest,
        mut admission: Admission,
    ) -> bool {
        if let Some(policy) = retry::policy(head, &to, &admission) {
            return self
                .forward_retried(client, head, to, admission, policy)
                .await;
        }
        let deadline = admission.timeout().map(|t| Instant::now() + t);
        if let Some(at) = deadline {
            // Armed once per request here; `receive` only waits on it.
            self.route.arm_before(at);
        }
        let replayable = head.framing == Framing::Empty && is_idempotent(&head.method);
        let (mut resent, mut rerouted) = (false, false);
        let mut left = None;
        let exchange = loop {
            let (mut upstream, reused) = match self.take_upstream(to.authority()).await {
                Ok(found) => found,
                Err(()) => {
                    if let Dest::Endpoint(pick) = &to {
                        pick.failed();
                        if !rerouted && let Some(next) = pick.retry() {
                            tracing::debug!(
                                from = %pick.endpoint().authority,
                                to = %next.endpoint().authority,
                                "upstream connect failed; trying another endpoint"
                            );
                            rerouted = true;
                            to = Dest::Endpoint(next);
                            continue;
                        }
                    }
                    break Exchange::Failed(Failure::Connect, Some(Outcome::ConnectFailure));
                }
            };
            let exchange = self
                .exchange(
                    client,
                    &mut upstream,
                    head,
                    (&mut admission, to.pick(), None),
                    deadline,
                )
                .await;
            match exchange {
                // No byte of an answer. An outbound call is sent again to another
                // endpoint when there is one, whether the connection was kept alive
                // or new: an endpoint that hangs up may be going away (a killed
                // instance closes its connections a moment before its port).
                (Exchange::Stale, _)
                    if replayable && !resent && (reused || matches!(to, Dest::Endpoint(_))) =>
                {
                    resent = true;
                    if let Dest::Endpoint(pick) = &to {
                        // A new connection closed unanswered is a failure; a
                        // kept-alive one may have met only its idle timeout.
                        if !reused {
                            pick.failed();
                        }
                        if let Some(next) = pick.retry() {
                            tracing::debug!(
                                from = %pick.endpoint().authority,
                                to = %next.endpoint().authority,
                                "upstream closed without answering; sending to another endpoint"
                            );
                            to = Dest::Endpoint(next);
                            continue;
                        }
                    }
                    tracing::debug!(authority = %to.authority(), "kept-alive upstream connection was closed; sending again");
                    continue;
                }
                (Exchange::Stale, _) => {
                    to.failed();
                    break Exchange::Failed(Failure::Upstream, Some(Outcome::Reset));
                }
                (Exchange::ClientLeft, _) => {
                    left = Some(upstream);
                    break Exchange::Broken;
                }
                (exchange, reusable) => {
                    match &exchange {
                        Exchange::Failed(_, Some(Outcome::Reset)) => to.failed(),
                        Exchange::TimedOut { .. } => to.timed_out(),
                        _ => {}
                    }
                    if reusable {
                        self.put_upstream(upstream);
                    }
                    break exchange;
                }
            }
        };
        self.conclude(client, head, exchange, admission, left).await
    }
}

#[cfg(test)]
mod tests;
