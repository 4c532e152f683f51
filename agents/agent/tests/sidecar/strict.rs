//! An independent strict HTTP/1.1 request parser (RFC 9112, no `httparse`), and a
//! raw upstream that parses what the agent sends with it, logs every request and
//! answers each with a description of what it received.
//!
//! The parser is deliberately written apart from the agent's codec: the
//! differential tests hold what the upstream reads, by this parser, equal to what
//! the agent's engine judged.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as a strict recipient reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    pub method: String,
    pub target: String,
    pub version: u8,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Req {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    pub fn count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }

    /// The path of the target (origin-form, or the path of an absolute-form one).
    pub fn path(&self) -> &str {
        let t = self.target.as_str();
        let t = match t
            .strip_prefix("http://")
            .or_else(|| t.strip_prefix("HTTP://"))
        {
            Some(rest) => rest.find('/').map_or("/", |i| &rest[i..]),
            None => t,
        };
        t.split('?').next().unwrap_or(t)
    }
}

/// The result of parsing the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A request and the bytes it took.
    Complete(Req, usize),
    /// More bytes are needed.
    Partial,
    /// Not a valid HTTP/1.x request: why.
    Invalid(&'static str),
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The line starting at `at`, without its CRLF, and where the next one starts.
fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, &'static str> {
    let rest = &buf[at..];
    let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
        if rest.contains(&b'\r') && !rest.ends_with(b"\r") {
            return Err("bare CR");
        }
        return Ok(None);
    };
    if lf == 0 || rest[lf - 1] != b'\r' {
        return Err("bare LF");
    }
    let content = &rest[..lf - 1];
    if content.contains(&b'\r') {
        return Err("bare CR");
    }
    Ok(Some((content, at + lf + 1)))
}

/// Parses one request at the start of `buf` (after up to four empty lines), strictly:
/// `method SP target SP HTTP/1.x CRLF`, fields `name: value` (no whitespace before
/// the colon, no obs-fold, no control bytes), exactly one `host` in HTTP/1.1, and a
/// body framed by one plain `content-length` or by `transfer-encoding: chunked`
/// alone (never both).
pub fn parse(buf: &[u8]) -> Parsed {
    match parse_inner(buf) {
        Ok(Some((req, n))) => Parsed::Complete(req, n),
        Ok(None) => Parsed::Partial,
        Err(why) => Parsed::Invalid(why),
    }
}

fn parse_inner(buf: &[u8]) -> Result<Option<(Req, usize)>, &'static str> {
    let mut at = 0;
    for _ in 0..4 {
        if buf[at..].starts_with(b"\r\n") {
            at += 2;
        }
    }
    let Some((request_line, mut at)) = line(buf, at)? else {
        return Ok(None);
    };
    let mut parts = request_line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("request line is not three parts");
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err("bad method");
    }
    if target.is_empty() || !target.iter().all(|&b| (0x21..0x7f).contains(&b)) {
        return Err("bad target");
    }
    let version = match version {
        b"HTTP/1.1" => 1,
        b"HTTP/1.0" => 0,
        _ => return Err("bad version"),
    };
    let mut headers = Vec::new();
    loop {
        let Some((field, next)) = line(buf, at)? else {
            return Ok(None);
        };
        at = next;
        if field.is_empty() {
            break;
        }
        let colon = field
            .iter()
            .position(|&b| b == b':')
            .ok_or("field without colon")?;
        let (name, value) = (&field[..colon], &field[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err("bad field name");
        }
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err("control byte in a field value");
        }
        let value = value.trim_ascii();
        headers.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
        if headers.len() > 200 {
            return Err("too many fields");
        }
    }
    let mut req = Req {
        method: String::from_utf8_lossy(method).into_owned(),
        target: String::from_utf8_lossy(target).into_owned(),
        version,
        headers,
        body: Vec::new(),
    };
    if req.count("host") != 1 && !(version == 0 && req.count("host") == 0) {
        return Err("not exactly one host");
    }
    let te = req.count("transfer-encoding");
    let cl = req.count("content-length");
    match (te, cl) {
        (0, 0) => Ok(Some((req, at))),
        (0, 1) => {
            let v = req.header("content-length").unwrap_or_default();
            if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
                return Err("bad content-length");
            }
            let n: usize = std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or("bad content-length")?;
            if buf.len() < at + n {
                return Ok(None);
            }
            req.body = buf[at..at + n].to_vec();
            Ok(Some((req, at + n)))
        }
        (1, 0) if version == 1 => {
            if !req
                .header("transfer-encoding")
                .is_some_and(|v| v.eq_ignore_ascii_case(b"chunked"))
            {
                return Err("transfer coding other than chunked");
            }
            let Some((body, end)) = chunked(buf, at)? else {
                return Ok(None);
            };
            req.body = body;
            Ok(Some((req, end)))
        }
        _ => Err("ambiguous framing"),
    }
}

/// A strict chunked body starting at `at`: `(payload, end)`.
fn chunked(buf: &[u8], mut at: usize) -> Result<Option<(Vec<u8>, usize)>, &'static str> {
    let mut body = Vec::new();
    loop {
        let Some((size_line, next)) = line(buf, at)? else {
            return Ok(None);
        };
        let (size, ext) = match size_line.iter().position(|&b| b == b';') {
            Some(i) => (&size_line[..i], Some(&size_line[i + 1..])),
            None => (size_line, None),
        };
        let size = size.trim_ascii_end();
        if size.is_empty() || size.len() > 15 || !size.iter().all(u8::is_ascii_hexdigit) {
            return Err("bad chunk size");
        }
        if size_line.len() != size.len() && ext.is_none() {
            return Err("whitespace after a chunk size without an extension");
        }
        if ext.is_some_and(|e| e.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)) {
            return Err("control byte in a chunk extension");
        }
        let size = usize::from_str_radix(std::str::from_utf8(size).unwrap_or("x"), 16)
            .map_err(|_| "bad chunk size")?;
        at = next;
        if size == 0 {
            // Trailer fields, then the empty line.
            loop {
                let Some((field, next)) = line(buf, at)? else {
                    return Ok(None);
                };
                at = next;
                if field.is_empty() {
                    return Ok(Some((body, at)));
                }
                let colon = field
                    .iter()
                    .position(|&b| b == b':')
                    .ok_or("trailer without colon")?;
                if colon == 0 || !field[..colon].iter().all(|&b| is_tchar(b)) {
                    return Err("bad trailer name");
                }
                if field[colon + 1..]
                    .iter()
                    .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
                {
                    return Err("control byte in a trailer");
                }
            }
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Err("chunk data not followed by CRLF");
        }
        at += size + 2;
    }
}

/// A raw upstream on 127.0.0.1:0 that reads requests with [`parse`], logs each, and
/// answers each with `200` and a body `METHOD TARGET BODY-LENGTH`. A request it
/// cannot parse is logged as invalid, and the connection is closed.
pub struct RawUpstream {
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<Result<Req, &'static str>>>>,
}

impl RawUpstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let conns = log.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let log = conns.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        match parse(&buf) {
                            Parsed::Complete(req, n) => {
                                buf.drain(..n);
                                let body =
                                    format!("{} {} {}", req.method, req.target, req.body.len());
                                log.lock().unwrap().push(Ok(req));
                                let answer = format!(
                                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                    body.len()
                                );
                                if s.write_all(answer.as_bytes()).await.is_err() {
                                    return;
                                }
                                continue;
                            }
                            Parsed::Invalid(why) => {
                                log.lock().unwrap().push(Err(why));
                                return;
                            }
                            Parsed::Partial => {}
                        }
                        let mut chunk = [0_u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        Self { addr, log }
    }

    /// Takes what was logged so far.
    pub fn take(&self) -> Vec<Result<Req, &'static str>> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    /// The requests logged so far (panics on an invalid one).
    pub fn requests(&self) -> Vec<Req> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.clone().expect("the upstream received a valid request"))
            .collect()
    }
}

#[test]
fn the_strict_parser_reads_what_rfc_9112_allows_and_nothing_else() {
    let ok = |s: &str| match parse(s.as_bytes()) {
        Parsed::Complete(req, n) => (req, n),
        other => panic!("{s:?}: {other:?}"),
    };
    let (req, n) = ok("POST /a?b HTTP/1.1\r\nHost: x\r\ncontent-length: 3\r\n\r\nabcGET");
    assert_eq!((req.body.as_slice(), n), (&b"abc"[..], 53));
    assert_eq!(req.path(), "/a");
    let (req, _) = ok(
        "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n3;a=b\r\nabc\r\n0\r\nt: 1\r\n\r\n",
    );
    assert_eq!(req.body, b"abc");
    for bad in [
        "GET / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\nhost: x\r\n\r\n",
        "GET / HTTP/1.1\r\nhost : x\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\n y\r\n\r\n",
        "GET  / HTTP/1.1\r\nhost: x\r\n\r\n",
        "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
        "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5 junk\r\nhello\r\n0\r\n\r\n",
    ] {
        assert!(
            matches!(parse(bad.as_bytes()), Parsed::Invalid(_)),
            "{bad:?}"
        );
    }
    assert_eq!(parse(b"GET / HTTP/1.1\r\nhost: x\r\n"), Parsed::Partial);
}
