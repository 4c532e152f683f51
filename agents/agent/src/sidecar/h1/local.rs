//! Small decisions of the HTTP/1 path about a request it answers itself or
//! sends again.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use http::Method;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::codec::Framing;
use super::relay::{READ_CHUNK, within};

/// Bodies of locally answered requests up to this size are read and dropped so the
/// connection can stay open; longer ones close it.
pub(super) const MAX_DISCARD: u64 = 64 * 1024;

/// Whether the rest of a locally answered request (its head `head_len` bytes
/// long, framed by `framing`) can be read and dropped, with `buffered` bytes
/// of it read. A client that sent `Expect: 100-continue` (`expect`) and got
/// no `100` may send its body or not (RFC 9110 section 10.1.1): only a body
/// already read whole is dropped, else the connection closes, so that no byte
/// of that body is ever read as a request.
pub(super) fn discardable(
    framing: Framing,
    head_len: usize,
    buffered: usize,
    expect: bool,
) -> bool {
    let limit = if expect { 0 } else { MAX_DISCARD };
    match framing {
        Framing::Empty => true,
        Framing::Length(n) => n <= limit || (head_len as u64).saturating_add(n) <= buffered as u64,
        Framing::Chunked | Framing::UntilClose => false,
    }
}

/// The interim answer to `Expect: 100-continue`.
pub(super) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Whether an admitted request that sent `Expect: 100-continue` (`expect`) gets
/// `100 Continue`: when it has a body and none of it arrived yet (`buffered`
/// bytes follow its head); a client that began sending needs no go-ahead.
pub(super) fn awaits_continue(expect: bool, framing: Framing, buffered: usize) -> bool {
    let body = match framing {
        Framing::Chunked => true,
        Framing::Length(n) => n > 0,
        Framing::Empty | Framing::UntilClose => false,
    };
    expect && body && buffered == 0
}

/// Adds `connection: keep-alive` after the status line of the answer in `out`
/// when `says` (an HTTP/1.0 client that asked to persist, and will).
pub(super) fn say_keep_alive(out: &mut Vec<u8>, says: bool) {
    if says && let Some(i) = out.windows(2).position(|w| w == b"\r\n") {
        out.splice(i + 2..i + 2, b"connection: keep-alive\r\n".iter().copied());
    }
}

/// Whether a request with `method` may be sent again (RFC 9110 section 9.2.2).
pub(super) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// Drops the next `left` bytes of a request body, from `buf` and then read
/// from the client, each read within `timeout`. Whether the connection can go
/// on (the client sent them all).
pub(super) async fn skip_body(
    client: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    mut left: usize,
    timeout: Option<Duration>,
) -> bool {
    let take = left.min(buf.len());
    buf.advance(take);
    left -= take;
    while left > 0 {
        buf.reserve(READ_CHUNK);
        match within(timeout, client.read_buf(buf)).await {
            Some(Ok(0) | Err(_)) | None => return false,
            Some(Ok(_)) => {
                let take = left.min(buf.len());
                buf.advance(take);
                left -= take;
            }
        }
    }
    true
}

/// Answers a refused request; the caller then closes the connection: after a framing
/// error nothing that follows on it can be trusted to start a request. (Rare: the
/// answer gets a buffer of its own, so the head it refuses can stay borrowed.)
pub(super) async fn refuse(
    client: &mut (impl tokio::io::AsyncWrite + Unpin),
    cx: &super::Listener,
    refusal: super::codec::Refusal,
) {
    use tokio::io::AsyncWriteExt;
    tracing::debug!(?refusal, "refused a request");
    cx.conns
        .refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut out = Vec::with_capacity(256);
    crate::sidecar::listener::Failure::refused(refusal.answer()).write_http1(&mut out, true);
    let _ = client.write_all(&out).await;
}
