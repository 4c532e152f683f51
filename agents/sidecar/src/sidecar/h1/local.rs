//! Small decisions of the HTTP/1 path about a request it answers itself or
//! sends again.

use http::Method;

use super::codec::Framing;

/// Bodies of locally answered requests up to this size are read and dropped so the
/// connection can stay open; longer ones close it.
pub(super) const MAX_DISCARD: u64 = 64 * 1024;

/// Whether the rest of a locally answered request (its head `head_len` bytes
/// long, framed by `framing`) can be read and dropped, with `buffered` bytes
/// of it read.
pub(super) fn discardable(framing: Framing, head_len: usize, buffered: usize) -> bool {
    match framing {
        Framing::Empty => true,
        Framing::Length(n) => {
            n <= MAX_DISCARD || (head_len as u64).saturating_add(n) <= buffered as u64
        }
        Framing::Chunked | Framing::UntilClose => false,
    }
}

/// Whether a request with `method` may be sent again (RFC 9110 section 9.2.2).
pub(super) fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}
