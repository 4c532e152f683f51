//! The response side of the codec (`codec.rs`, pure functions over byte
//! slices): the framing of an upstream's response (RFC 9112 section 6.3) and
//! the head the agent writes to the client.

use http::{Method, StatusCode};

use super::codec::{Framing, hop_by_hop, parse_length, push_header, trim};

/// The framing of a response to `method` (RFC 9112 section 6.3); `None` when its
/// lengths are unusable.
pub(crate) fn response_framing(
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

/// What a response head says of the client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Persist {
    /// Nothing: HTTP/1.1 persists by default.
    Implied,
    /// `connection: close`: the agent closes after this response.
    Close,
    /// `connection: keep-alive`: to an HTTP/1.0 client that asked for it, which
    /// otherwise reads the response as the connection's last (RFC 9112 9.3).
    KeepAlive,
}

impl Persist {
    /// What to say to a client (`http10` or not) after a response that `close`s
    /// the connection or not.
    pub(crate) fn of(http10: bool, close: bool) -> Self {
        match (close, http10) {
            (true, _) => Persist::Close,
            (false, true) => Persist::KeepAlive,
            (false, false) => Persist::Implied,
        }
    }

    /// The header line, if any.
    pub(crate) fn line(self) -> &'static [u8] {
        match self {
            Persist::Implied => b"",
            Persist::Close => b"connection: close\r\n",
            Persist::KeepAlive => b"connection: keep-alive\r\n",
        }
    }
}

/// Writes a response head for the client: the upstream's status and end-to-end
/// headers. The framing headers follow `framing`, not `connection`: one
/// `content-length` for a length, the upstream's `transfer-encoding` for a chunked
/// body, both as they came for a body-less response (and neither when the body
/// runs until the connection closes). `persist` says whether the connection
/// stays open.
pub(crate) fn write_response_head(
    out: &mut Vec<u8>,
    code: u16,
    reason: Option<&str>,
    headers: &[httparse::Header<'_>],
    conn: &[&[u8]],
    framing: Framing,
    persist: Persist,
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
    for h in headers {
        let name = h.name;
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if matches!(framing, Framing::Chunked | Framing::Empty) {
                push_header(out, name.as_bytes(), h.value);
            }
            continue;
        }
        if name.eq_ignore_ascii_case("content-length") {
            if framing == Framing::Empty {
                push_header(out, name.as_bytes(), h.value);
            }
            continue;
        }
        if hop_by_hop(name, conn) {
            continue;
        }
        push_header(out, name.as_bytes(), h.value);
    }
    if let Framing::Length(n) = framing {
        let _ = write!(out, "content-length: {n}\r\n");
    }
    out.extend_from_slice(persist.line());
    out.extend_from_slice(b"\r\n");
}
