//! Relaying one HTTP/1.1 message: the response head from the upstream (interim
//! heads passed on, the status reported to the admission) and a body in either
//! direction, framed as the codec decided, counted as it passes, each side
//! bounded by its timeout.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use http::Method;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::chunked::Decoder;
use super::codec::{
    Framing, MAX_HEAD, MAX_HEADERS, has_token, head_end, header_tokens, push_header,
};
use super::deadline::Deadline;
use super::response::{Persist, response_framing, write_response_head};
use crate::sidecar::upstream::Pick;
use gov_engine::{Admission, Outcome};

/// Asked when an upstream's response head has a status: whether the call
/// is sent again instead (the head is then not relayed).
pub(super) type Retry<'r> = Option<&'r mut (dyn FnMut(Outcome) -> bool + Send)>;

/// Read buffer growth step.
pub(super) const READ_CHUNK: usize = 8 * 1024;

/// How receiving a response ended.
pub(super) enum Received {
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
    /// The retry hook took the response head's outcome: nothing of it was
    /// relayed, and the upstream connection is not reused.
    Retry,
}

/// Adds the `RateLimit-Policy` and `RateLimit` headers of the limits that
/// admitted the call and say `headers always` to the response head in
/// `out` (which ends with its blank line).
fn add_ratelimit(out: &mut Vec<u8>, admission: &Admission) {
    let Some((policy, state)) = admission.ratelimit_headers() else {
        return;
    };
    out.truncate(out.len().saturating_sub(2));
    let fields = [
        Some((gov_engine::RATELIMIT_POLICY, policy)),
        state.map(|s| (gov_engine::RATELIMIT, s)),
    ];
    for (name, value) in fields.into_iter().flatten() {
        push_header(out, name.as_bytes(), value.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// Reads the response head to a `method` request (interim 1xx heads go to the
/// client), reports its status to the engine, and relays it with its body to the
/// client, closing the client connection after it if `closing()` says so then.
/// A status the `retry` hook takes is not relayed ([`Received::Retry`]).
/// An HTTP/1.0 client (`http10`) gets no interim head (RFC 9110 section 15.2)
/// and no chunked framing: a chunked body goes to it as its payload, ended by
/// closing the connection (RFC 9112 section 6.3, as nginx does).
pub(super) async fn receive(
    up_rd: &mut (impl AsyncRead + Unpin),
    up_buf: &mut BytesMut,
    client_wr: &mut (impl AsyncWrite + Unpin),
    out: &mut Vec<u8>,
    (method, http10, closing): (&Method, bool, impl Fn() -> bool),
    (admission, pick, mut retry): (&mut Admission, Option<&Pick>, Retry<'_>),
    (deadline, client_timeout): (Option<(&mut Deadline, Instant)>, Option<Duration>),
) -> Received {
    let mut deadline = deadline;
    loop {
        if let Err(ended) = read_head(up_rd, up_buf, &mut deadline).await {
            return ended;
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
            if http10 {
                drop(conn_tokens);
                up_buf.advance(len);
                continue;
            }
            // An interim head went to the client: the response has begun.
            retry = None;
            out.clear();
            write_response_head(
                out,
                code,
                resp.reason,
                headers,
                &conn_tokens,
                Framing::Empty,
                Persist::Implied,
            );
            drop(conn_tokens);
            up_buf.advance(len);
            if !matches!(
                within(client_timeout, client_wr.write_all(out)).await,
                Some(Ok(()))
            ) {
                return Received::Broken;
            }
            continue;
        }
        let Some(framing) = response_framing(method, code, headers) else {
            return Received::BadHead;
        };
        if let Some(retry) = retry.as_mut()
            && retry(Outcome::Status(code))
        {
            return Received::Retry;
        }
        let upstream_close = has_token(&conn_tokens, "close")
            || (version == 0 && !has_token(&conn_tokens, "keep-alive"));
        let dechunk = http10 && framing == Framing::Chunked;
        let to_client = if dechunk {
            Framing::UntilClose
        } else {
            framing
        };
        let close_client = to_client == Framing::UntilClose || closing();
        out.clear();
        write_response_head(
            out,
            code,
            resp.reason,
            headers,
            &conn_tokens,
            to_client,
            Persist::of(http10, close_client),
        );
        add_ratelimit(out, admission);
        drop(conn_tokens);
        up_buf.advance(len);
        admission.record(Outcome::Status(code));
        if let Some(pick) = pick {
            pick.responded(code);
        }
        let leg = Leg {
            framing,
            request: false,
            dechunk,
            read_timeout: None,
            write_timeout: client_timeout,
        };
        let relayed = relay(leg, up_buf, up_rd, client_wr, out, |n| {
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

/// Reads until `up_buf` holds a whole response head, within the route's
/// deadline; how receiving ended when it does not come.
async fn read_head(
    up_rd: &mut (impl AsyncRead + Unpin),
    up_buf: &mut BytesMut,
    deadline: &mut Option<(&mut Deadline, Instant)>,
) -> Result<(), Received> {
    let mut scanned = 0;
    loop {
        if matches!(head_end(up_buf, scanned, false), Ok(Some(_))) {
            return Ok(());
        }
        if up_buf.len() >= MAX_HEAD {
            return Err(Received::BadHead);
        }
        scanned = up_buf.len().saturating_sub(3);
        up_buf.reserve(READ_CHUNK);
        let read = up_rd.read_buf(up_buf);
        let n = match deadline {
            None => read.await,
            Some((timer, at)) => {
                let at = *at;
                tokio::select! {
                    n = read => n,
                    () = timer.expired(at) => return Err(Received::TimedOut),
                }
            }
        };
        match n {
            Ok(0) | Err(_) if up_buf.is_empty() => return Err(Received::NoHead),
            Ok(0) | Err(_) => return Err(Received::BadHead),
            Ok(_) => {}
        }
    }
}

/// A relay stopped early.
#[derive(Debug)]
pub(super) enum Broke {
    /// Reading the source failed.
    Read,
    /// The source ended inside the body.
    Eof,
    /// Writing the destination failed.
    Write,
    /// The chunked framing is broken.
    Chunking,
}

/// Which body [`relay`] carries, and how long each side may stall.
#[derive(Clone, Copy)]
pub(super) struct Leg {
    pub(super) framing: Framing,
    /// A request body: its trailer fields are dropped.
    pub(super) request: bool,
    /// Only the payload of a chunked body is relayed.
    pub(super) dechunk: bool,
    /// The longest a read of the source may wait (the client's request body).
    pub(super) read_timeout: Option<Duration>,
    /// The longest a write to the destination may wait (the response to the
    /// client, which may stop reading).
    pub(super) write_timeout: Option<Duration>,
}

/// `fut`, bounded by `limit`; `None` when it ran out.
pub(super) async fn within<F: std::future::Future>(
    limit: Option<Duration>,
    fut: F,
) -> Option<F::Output> {
    match limit {
        None => Some(fut.await),
        // The timer registers only if `fut` is pending on its first poll.
        Some(limit) => tokio::time::timeout(limit, fut).await.ok(),
    }
}

/// Relays one body framed as `leg.framing` from `buf` (bytes already read) and
/// then `src`, to `dst`, after `out` (a head not yet written, sent with the first
/// body bytes in one write). Calls `tally` with the payload bytes as they pass.
pub(super) async fn relay<R, W>(
    leg: Leg,
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
    let mut decoder = if leg.request {
        Decoder::request(leg.framing)
    } else if leg.dechunk {
        Decoder::dechunked(leg.framing)
    } else {
        Decoder::new(leg.framing)
    };
    loop {
        while !decoder.done() && !buf.is_empty() {
            let step = decoder.advance(buf).ok_or(Broke::Chunking)?;
            if step.taken == 0 {
                break;
            }
            if step.dropped {
                // Stripped trailer fields.
            } else if out.is_empty() && step.taken > READ_CHUNK {
                within(leg.write_timeout, dst.write_all(&buf[..step.taken]))
                    .await
                    .and_then(Result::ok)
                    .ok_or(Broke::Write)?;
            } else {
                out.extend_from_slice(&buf[..step.taken]);
            }
            tally(step.payload);
            buf.advance(step.taken);
        }
        if !out.is_empty() {
            within(leg.write_timeout, dst.write_all(out))
                .await
                .and_then(Result::ok)
                .ok_or(Broke::Write)?;
            out.clear();
        }
        if decoder.done() {
            return Ok(());
        }
        buf.reserve(READ_CHUNK);
        match within(leg.read_timeout, src.read_buf(buf)).await {
            Some(Ok(0)) if leg.framing == Framing::UntilClose => return Ok(()),
            Some(Ok(0)) => return Err(Broke::Eof),
            Some(Ok(_)) => {}
            Some(Err(_)) | None => return Err(Broke::Read),
        }
    }
}
