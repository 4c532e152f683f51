//! The HTTP/1.1 codec of the proxy: pure functions over byte slices.
//!
//! The agent alone decides the framing of what it sends upstream, so every framing
//! decision lives here, each beside the RFC 9112 section it follows:
//! [`check_request`] says whether a request head is served, handed to hyper or
//! refused; `chunked.rs`'s `Decoder` finds where a body ends; [`write_request_head`] and
//! `response.rs`'s `write_response_head` write the heads the agent sends, with framing headers of
//! its own. Nothing here reads a socket, so all of it is tested byte by byte.

use std::borrow::Cow;

use http::{HeaderValue, Method};
use smallvec::SmallVec;

use super::super::headers::{FRAMING, HOP_BY_HOP, keeps_te};
use crate::sidecar::front::{HeadView, one_framing, one_host, underscored_framing};
pub(crate) use crate::sidecar::front::{MAX_HEADERS, Refusal, valid_authority};
use gov_engine::Headers;
use gov_engine::WOULD_REJECT_BY;
use gov_engine::deadline::{GOV_TIMEOUT, format};
#[cfg(test)]
use gov_engine::path::PathError;
use gov_engine::path::{Reading, normalize};

/// Largest head (larger: 431).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Longest chunk extension and trailer section accepted in a chunked body.
pub(crate) const MAX_CHUNK_META: usize = 16 * 1024;
/// Empty lines ignored before a request line (RFC 9112 section 2.2).
const MAX_LEADING_EMPTY_LINES: usize = 4;
/// The HTTP/2 connection preface (RFC 9113 section 3.4): hyper serves it.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// How a message body is delimited (RFC 9112 section 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Responses only: the body ends when the upstream closes.
    UntilClose,
}

/// What the HTTP/1 path does with a request head.
#[derive(Debug)]
pub(crate) enum Verdict<'b> {
    /// Served on this path.
    Serve(Checked<'b>),
    /// hyper serves the connection from this request on: HTTP/2, HTTP/1.0
    /// without a host, `Upgrade`, an `Expect` other than `100-continue`,
    /// `CONNECT` and `OPTIONS *`. The head passed every check that applies to it.
    Hyper,
    /// Answered with this, then the connection closes.
    Refuse(Refusal),
}

/// A request head that passed [`check_request`].
#[derive(Debug)]
pub(crate) struct Checked<'b> {
    /// Where the head ends in the buffer.
    pub(crate) len: usize,
    pub(crate) method: Method,
    /// The origin-form target sent upstream: the normalized path, then the query.
    pub(crate) target: Cow<'b, str>,
    /// The length of the path in `target`.
    pub(crate) path_len: usize,
    /// The `host` sent upstream: the authority of an absolute-form target (RFC 9112
    /// section 3.2.2), else the client's one `Host`.
    pub(crate) host: &'b str,
    pub(crate) framing: Framing,
    /// The client asked to close after this request: `close`, or HTTP/1.0
    /// without `keep-alive` (RFC 9112 section 9.3).
    pub(crate) close: bool,
    /// An HTTP/1.0 request: no interim answers, no chunked response.
    pub(crate) http10: bool,
    /// HTTP/1.1 with `Expect: 100-continue` (RFC 9110 section 10.1.1); an
    /// HTTP/1.0 client's is ignored.
    pub(crate) expect: bool,
    /// The tokens of the `connection` header fields.
    pub(crate) conn: SmallVec<[&'b [u8]; 4]>,
    /// The header fields as the client sent them.
    pub(crate) headers: &'b [httparse::Header<'b>],
}

impl Checked<'_> {
    /// The normalized path (what rules match).
    pub(crate) fn path(&self) -> &str {
        &self.target[..self.path_len]
    }

    /// The query, after `?` (empty without one).
    pub(crate) fn query(&self) -> &str {
        let rest = &self.target[self.path_len..];
        rest.strip_prefix('?').unwrap_or(rest)
    }
}

/// The checked head as the request front reads it ([`crate::sidecar::front`]):
/// [`check_request`] already refused and normalized it while parsing.
impl HeadView for Checked<'_> {
    fn method(&self) -> &Method {
        &self.method
    }

    fn path(&self) -> &str {
        Checked::path(self)
    }

    fn query(&self) -> &str {
        Checked::query(self)
    }

    fn headers(&self) -> Headers<'_> {
        Headers::Raw(self.headers)
    }

    fn host(&self) -> Option<&str> {
        Some(self.host)
    }
}

/// Where the head in `buf` ends (just past its empty line), looking from `from` on.
/// In a request every line ends with CRLF (`strict`): a bare LF is an error, as is
/// a bare CR (which `httparse` refuses). Responses may end lines with LF alone
/// (RFC 9112 section 2.2).
pub(crate) fn head_end(buf: &[u8], from: usize, strict: bool) -> Result<Option<usize>, Refusal> {
    let mut i = from;
    while let Some(p) = buf[i..].iter().position(|&b| b == b'\n') {
        let lf = i + p;
        if strict && (lf == 0 || buf[lf - 1] != b'\r') {
            return Err(Refusal::BadRequest(
                "gov-agent: a line of the request head does not end with CRLF\n",
            ));
        }
        match buf.get(lf + 1) {
            Some(b'\n') if !strict => return Ok(Some(lf + 2)),
            Some(b'\r') if buf.get(lf + 2) == Some(&b'\n') => return Ok(Some(lf + 3)),
            _ => {}
        }
        i = lf + 1;
    }
    Ok(None)
}

/// How many bytes of empty lines start `buf` (ignored before a request line); `None`
/// when there are too many.
pub(crate) fn leading_empty_lines(buf: &[u8]) -> Option<usize> {
    let mut n = 0;
    while buf[n..].starts_with(b"\r\n") {
        n += 2;
        if n > 2 * MAX_LEADING_EMPTY_LINES {
            return None;
        }
    }
    Some(n)
}

/// Decides a complete request head at the start of `buf` (RFC 9112): the request
/// line (section 3), `Host` (3.2), the message framing (6.1, 6.3), and the target
/// normalized as the upstream reads paths (RFC 3986 section 6, `reading`). Everything
/// ambiguous is refused; the rest is served here or handed to hyper.
pub(crate) fn check_request<'b>(
    buf: &'b [u8],
    slots: &'b mut [httparse::Header<'b>],
    reading: Reading,
) -> Verdict<'b> {
    if buf.starts_with(H2_PREFACE) {
        return Verdict::Hyper;
    }
    let mut req = httparse::Request::new(slots);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => {
            return Verdict::Refuse(Refusal::BadRequest(
                "gov-agent: the request head is incomplete\n",
            ));
        }
        Err(httparse::Error::TooManyHeaders) => return Verdict::Refuse(Refusal::HeadTooLarge),
        Err(_) => {
            return Verdict::Refuse(Refusal::BadRequest(
                "gov-agent: the request head is malformed\n",
            ));
        }
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Verdict::Refuse(Refusal::BadRequest(
            "gov-agent: the request line is malformed\n",
        ));
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Verdict::Refuse(Refusal::BadRequest("gov-agent: the method is malformed\n"));
    };
    let headers: &'b [httparse::Header<'b>] = req.headers;
    let fields = match Fields::of(headers) {
        Ok(fields) => fields,
        Err(refusal) => return Verdict::Refuse(refusal),
    };
    // RFC 9112 section 6.1: a Transfer-Encoding in HTTP/1.0 is a faulty framing.
    if version == 0 && fields.coding.is_some() {
        return Verdict::Refuse(Refusal::BadRequest(
            "gov-agent: HTTP/1.0 has no transfer codings\n",
        ));
    }
    // Section 3.2: exactly one Host in HTTP/1.1, at most one in HTTP/1.0, and a
    // valid one.
    let host = fields.host;
    let valid = host.is_none_or(valid_authority);
    if let Err(refusal) = one_host(fields.hosts, valid, version == 1) {
        return Verdict::Refuse(refusal);
    }
    let framing = match fields.framing() {
        Ok(framing) => framing,
        Err(refusal) => return Verdict::Refuse(refusal),
    };

    // The target: what hyper takes, then origin-form or absolute-form.
    if method == Method::CONNECT || (method == Method::OPTIONS && target == "*") {
        return Verdict::Hyper;
    }
    let (target, authority) = match split_target(target) {
        Ok(split) => split,
        Err(refusal) => return Verdict::Refuse(refusal),
    };
    let (path, query) = match target.find('?') {
        Some(q) => target.split_at(q),
        None => (target, ""),
    };
    let path = match normalize(path, reading) {
        Ok(path) => path,
        Err(error) => return Verdict::Refuse(error.into()),
    };
    if fields.upgrade || fields.expect == Expect::Other {
        return Verdict::Hyper;
    }
    let path_len = path.len();
    let target = match path {
        Cow::Borrowed(_) => Cow::Borrowed(target),
        Cow::Owned(mut p) => {
            p.push_str(query);
            Cow::Owned(p)
        }
    };
    let Some(host) = authority.or(host) else {
        // HTTP/1.1 without a Host was refused above; HTTP/1.0 without one goes
        // to hyper (which names the upstream).
        return Verdict::Hyper;
    };
    // Section 9.3: HTTP/1.0 persists only with `keep-alive`; `close` always wins.
    let close = has_token(&fields.conn, "close")
        || (version == 0 && !has_token(&fields.conn, "keep-alive"));
    Verdict::Serve(Checked {
        len,
        method,
        target,
        path_len,
        host,
        framing,
        close,
        http10: version == 0,
        expect: version == 1 && fields.expect == Expect::Continue,
        conn: fields.conn,
        headers,
    })
}

/// What [`check_request`] reads off the header fields, in one pass.
struct Fields<'b> {
    hosts: usize,
    host: Option<&'b str>,
    lengths: usize,
    length: Option<u64>,
    /// The transfer codings: `Some(chunked_last)`, with `chunked` at most once.
    coding: Option<Coding>,
    upgrade: bool,
    expect: Expect,
    conn: SmallVec<[&'b [u8]; 4]>,
}

/// The `Expect` fields of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    None,
    /// Only `100-continue`: answered on this path.
    Continue,
    /// Another expectation: hyper's.
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Coding {
    /// Exactly `chunked`.
    Chunked,
    /// `chunked` last, after other codings.
    Other,
}

impl<'b> Fields<'b> {
    fn of(headers: &'b [httparse::Header<'b>]) -> Result<Self, Refusal> {
        let mut fields = Fields {
            hosts: 0,
            host: None,
            lengths: 0,
            length: None,
            coding: None,
            upgrade: false,
            expect: Expect::None,
            conn: SmallVec::new(),
        };
        let mut codings: SmallVec<[&[u8]; 2]> = SmallVec::new();
        for h in headers {
            let name = h.name.as_bytes();
            // Dispatch on the length first: most fields are none of these.
            match name.len() {
                4 if name.eq_ignore_ascii_case(b"host") => {
                    fields.hosts += 1;
                    fields.host =
                        Some(std::str::from_utf8(trim(h.value)).map_err(|_| Refusal::BAD_HOST)?);
                }
                14 if name.eq_ignore_ascii_case(b"content-length") => {
                    fields.lengths += 1;
                    fields.length = Some(parse_length(h.value).ok_or(Refusal::BadRequest(
                        "gov-agent: the `content-length` is not a plain decimal number\n",
                    ))?);
                }
                17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                    codings.extend(
                        h.value
                            .split(|&b| b == b',')
                            .map(trim)
                            .filter(|c| !c.is_empty()),
                    );
                }
                10 if name.eq_ignore_ascii_case(b"connection") => fields.conn.extend(
                    h.value
                        .split(|&b| b == b',')
                        .map(trim)
                        .filter(|t| !t.is_empty()),
                ),
                7 if name.eq_ignore_ascii_case(b"upgrade") => fields.upgrade = true,
                6 if name.eq_ignore_ascii_case(b"expect") => {
                    let go_on = trim(h.value).eq_ignore_ascii_case(b"100-continue");
                    fields.expect = match fields.expect {
                        Expect::None | Expect::Continue if go_on => Expect::Continue,
                        _ => Expect::Other,
                    };
                }
                // `content_length` and `transfer_encoding`: some servers read `_` as
                // `-`, and would frame the body by a field the agent did not.
                14 | 17 if underscored_framing(name) => return Err(Refusal::UNDERSCORED),
                _ => {}
            }
        }
        if !codings.is_empty() {
            // RFC 9112 section 6.3 (4): `chunked` must be the final coding; and it
            // is applied only once (section 7).
            let chunked = |c: &[u8]| c.eq_ignore_ascii_case(b"chunked");
            let last_chunked = codings.last().is_some_and(|c| chunked(c));
            if !last_chunked || codings.iter().filter(|c| chunked(c)).count() > 1 {
                return Err(Refusal::BadRequest(
                    "gov-agent: `chunked` must be the last transfer coding, once\n",
                ));
            }
            fields.coding = Some(if codings.len() == 1 {
                Coding::Chunked
            } else {
                Coding::Other
            });
        }
        Ok(fields)
    }

    /// The framing of the body (RFC 9112 section 6.3).
    fn framing(&self) -> Result<Framing, Refusal> {
        // Never both, at most one length (even when equal).
        one_framing(self.coding.is_some(), self.lengths)?;
        match (self.coding, self.length) {
            (Some(Coding::Other), _) => Err(Refusal::UnknownCoding),
            (Some(Coding::Chunked), _) => Ok(Framing::Chunked),
            (None, Some(n)) => Ok(Framing::Length(n)),
            (None, None) => Ok(Framing::Empty),
        }
    }
}

/// The origin-form of a request target and, for an absolute-form `http://` one, its
/// authority (RFC 9112 section 3.2). Any other form is refused.
pub(crate) fn split_target(target: &str) -> Result<(&str, Option<&str>), Refusal> {
    // A fragment is never sent (RFC 9112 section 3.2); upstreams that get one
    // disagree on whether it belongs to the path (`/lim#x` is `/lim` to some).
    if target.contains('#') {
        return Err(Refusal::BadRequest(
            "gov-agent: the request target has a `#` fragment\n",
        ));
    }
    if target.starts_with('/') {
        return Ok((target, None));
    }
    let refused =
        Refusal::BadRequest("gov-agent: the request target must be a path or an `http://` URL\n");
    let Some(scheme) = target.get(..7) else {
        return Err(refused);
    };
    if !scheme.eq_ignore_ascii_case("http://") {
        return Err(refused);
    }
    let rest = &target[7..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (host, path) = rest.split_at(end);
    if host.is_empty() || !valid_authority(host) {
        return Err(Refusal::BadRequest(
            "gov-agent: the authority of the request target is malformed\n",
        ));
    }
    match path.as_bytes().first() {
        Some(b'/') => Ok((path, Some(host))),
        // `http://host`: the path is `/`.
        None => Ok(("/", Some(host))),
        Some(_) => Err(refused),
    }
}

/// The comma-separated tokens of every `name` header; compare with [`has_token`].
pub(crate) fn header_tokens<'h>(
    headers: &[httparse::Header<'h>],
    name: &str,
) -> SmallVec<[&'h [u8]; 4]> {
    let mut tokens = SmallVec::new();
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

pub(crate) fn has_token(tokens: &[&[u8]], token: &str) -> bool {
    tokens
        .iter()
        .any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

pub(super) fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// A `content-length` value: one decimal number, no sign, no list (RFC 9110 8.6).
pub(super) fn parse_length(value: &[u8]) -> Option<u64> {
    let value = trim(value);
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0_u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Whether `name` is hop-by-hop (RFC 9110 section 7.6.1) on either side: the fixed
/// list `headers::strip_hop_by_hop` uses, or named by `connection`.
pub(super) fn hop_by_hop(name: &str, conn: &[&[u8]]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_str()))
        || has_token(conn, name)
}

/// Whether `name` frames or routes a message: the agent writes these itself, and
/// `connection` can neither remove nor add them.
fn is_framing(name: &str) -> bool {
    FRAMING
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_str()))
}

/// Writes the head sent upstream for `req`: the request line with the normalized
/// target, the client's end-to-end headers (`te` only as `trailers`), then the
/// agent's own `host`, framing header for the body it relays, and
/// `x-forwarded-for` with the client appended, and `gov-would-reject-by`
/// naming `stamps` (the shadow rules that would have refused the call) when
/// there are any. The client's `host`, `content-length`,
/// `transfer-encoding`, `expect` and `gov-would-reject-by` (and, with `consumer`, the
/// consumer header, written with the verified value) are never copied: whatever
/// its `connection` names, the upstream frames the body exactly as the
/// agent does, and only the agent says which rules would have refused.
pub(crate) fn write_request_head<'a>(
    out: &mut Vec<u8>,
    req: &Checked<'_>,
    peer: &str,
    (stamps, deadline): (impl Iterator<Item = &'a str>, Option<std::time::Duration>),
    consumer: Option<(&str, Option<&[u8]>)>,
) {
    use std::io::Write;
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut forwarded: Option<&[u8]> = None;
    for h in req.headers {
        let name = h.name;
        // `expect: 100-continue` is the agent's to answer (the only one here).
        if is_framing(name) || hop_by_hop(name, &req.conn) || name.eq_ignore_ascii_case("expect") {
            continue;
        }
        if name.eq_ignore_ascii_case("te") {
            if !keeps_te(h.value) {
                continue;
            }
        } else if name.eq_ignore_ascii_case("x-forwarded-for") {
            if forwarded.is_none() {
                forwarded = Some(h.value);
            }
            continue;
        } else if name.eq_ignore_ascii_case(WOULD_REJECT_BY)
            || consumer.is_some_and(|(c, _)| name.eq_ignore_ascii_case(c))
            || name.eq_ignore_ascii_case(GOV_TIMEOUT.as_str())
        {
            continue;
        }
        push_header(out, name.as_bytes(), h.value);
    }
    // The caller's deadline, as what is left of it (`gov_engine::deadline`).
    if let Some(left) = deadline {
        push_header(
            out,
            GOV_TIMEOUT.as_str().as_bytes(),
            format(left).as_bytes(),
        );
    }
    // The consumer the agent verified (`consumer from jwt`), never the client's.
    if let Some((name, Some(value))) = consumer {
        push_header(out, name.as_bytes(), value);
    }
    let mut stamped = false;
    // Rule names come from the compiler (identifiers), but a hand-written
    // config could hold anything: never write one that is no header value.
    for rule in stamps.filter(|r| HeaderValue::from_str(r).is_ok()) {
        out.extend_from_slice(if stamped {
            b", ".as_slice()
        } else {
            b"gov-would-reject-by: ".as_slice()
        });
        out.extend_from_slice(rule.as_bytes());
        stamped = true;
    }
    if stamped {
        out.extend_from_slice(b"\r\n");
    }
    push_header(out, b"host", req.host.as_bytes());
    match req.framing {
        Framing::Length(n) => {
            let _ = write!(out, "content-length: {n}\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Empty | Framing::UntilClose => {}
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    if let Some(existing) = forwarded {
        out.extend_from_slice(existing);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(peer.as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

pub(super) fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A token character (RFC 9110 section 5.6.2).
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests;
