//! The differential test of the HTTP/1 path: for generated and mutated request
//! streams, the requests the upstream receives, read by an independent strict
//! parser ([`crate::strict`]), are exactly the requests the engine judged, in
//! order, with the same bodies; or the agent refused (400, 431, 501) and closed.
//!
//! Three properties per stream, sent on one connection:
//! 1. **Nothing unjudged reaches the upstream**: per rule, the engine's admitted
//!    count grew by the number of received requests on its path (one more at most,
//!    for a request whose body the client broke off).
//! 2. **The upstream receives what the client meant**: the received sequence
//!    (method, normalized path, body) is a prefix of what a strict reading of the
//!    client's stream gives, up to the first request a strict recipient refuses or
//!    that hyper takes; a stream nobody mutated is received whole.
//! 3. **Every answer goes to its own request**: the n-th response carries the
//!    upstream's description of the n-th received request; after those, at most a
//!    refusal, then the connection closes.
//!
//!
//! And one property of concurrency (4, at the end): for generated mixes of
//! clients that ask and leave, on every protocol, the upstream never works on
//! more calls at once than the bulkhead allows.
//!
//! Cases: the classic smuggling vectors (CL.TE, TE.CL, TE.TE, obs-fold, bare CR/LF,
//! NUL, signed and oversize lengths, chunk-size overflow, pipelining), then
//! generated streams with byte mutations (proptest, a fixed number of cases, a few
//! seconds).
//! The generated streams run twice: against a service with the default reading
//! of paths, and against one that declares `paths case-insensitive` (its rules
//! match the path folded to lower case; property 1 counts the same way).

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::strict::{Parsed, RawUpstream, Req, parse};
use crate::support::{Agent, Upstream, agent};

/// One rule per path of interest, and one on everything; none ever rejects.
const RULES: &str = r#"
service: shop
version: differential-v1
rules:
  - name: shop/a
    on: { path: { kind: PATH_KIND_EXACT, value: /a } }
    limit:
      calls: { amount: 1000000000, window_ms: 3600000 }
  - name: shop/lim
    on: { path: { kind: PATH_KIND_EXACT, value: /lim } }
    limit:
      calls: { amount: 1000000000, window_ms: 3600000 }
  - name: shop/all
    on: { path: { kind: PATH_KIND_PREFIX, value: / } }
    limit:
      calls: { amount: 1000000000, window_ms: 3600000 }
  - name: shop/crm
    on: { consumer: crm }
    limit:
      calls: { amount: 1000000000, window_ms: 3600000 }
  - name: shop/gold
    on: { header: { name: x-tier, value: gold } }
    limit:
      calls: { amount: 1000000000, window_ms: 3600000 }
  - name: shop/tenant
    on: { path: { kind: PATH_KIND_PREFIX, value: / } }
    limit:
      calls: { amount: 1000000000, window_ms: 3600000 }
      key_parts: [{ header: x-tenant }, { query: k }, { key: LIMIT_KEY_CONSUMER }]
"#;

/// What a rule above counts, as the upstream reads a request.
#[derive(Clone, Copy, Debug)]
enum On {
    /// The path (`None`: every path).
    Path(Option<&'static str>),
    /// One copy of this header with this value: the consumer header, or a
    /// header a rule matches on (issue 29).
    Header(&'static str, &'static str),
}

/// The headers the rules judge (the consumer header first).
const JUDGED: [&str; 3] = ["x-gov-consumer", "x-tier", "x-tenant"];

/// The rules above, with what each counts.
const COUNTED: [(&str, On); 6] = [
    ("shop/a", On::Path(Some("/a"))),
    ("shop/lim", On::Path(Some("/lim"))),
    ("shop/all", On::Path(None)),
    ("shop/crm", On::Header("x-gov-consumer", "crm")),
    ("shop/gold", On::Header("x-tier", "gold")),
    // Keyed on a header (judged: above), a query parameter and the consumer.
    ("shop/tenant", On::Path(None)),
];

impl On {
    fn counts(self, req: &Req, path: &str, folded: bool) -> bool {
        match self {
            On::Path(p) => p.is_none_or(|p| p == path || folded && path.to_ascii_lowercase() == p),
            On::Header(name, value) => req.header(name) == Some(value.as_bytes()),
        }
    }
}

/// Whether a strict recipient reads each judged header of `req` as the
/// engine does: at most once, not spelled with `_`, not named by
/// `connection` (the agent refuses the rest with 400).
fn judged_as_read(req: &Req) -> bool {
    let dashed = |n: &str| n.replace('_', "-");
    JUDGED.iter().all(|j| {
        req.count(j) <= 1
            && !req
                .headers
                .iter()
                .any(|(n, _)| n.contains('_') && dashed(n).eq_ignore_ascii_case(j))
            && !req.headers.iter().any(|(n, v)| {
                n.eq_ignore_ascii_case("connection")
                    && v.split(|&b| b == b',').any(|t| {
                        let t = String::from_utf8_lossy(t.trim_ascii()).into_owned();
                        dashed(&t).eq_ignore_ascii_case(j)
                    })
            })
    })
}

/// The classic vectors, each a whole client stream.
const VECTORS: &[&[u8]] = &[
    // CL.TE: a front end reading CL would forward `G...` as a second request.
    b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 13\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    // TE.CL.
    b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n5c\r\nGPOST /lim HTTP/1.1\r\nhost: x\r\ncontent-length: 15\r\n\r\nx=1\r\n0\r\n\r\n",
    // TE.TE obfuscations.
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: x\r\ncontent-length: 4\r\n\r\n1\r\nZ\r\n0\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding : chunked\r\ncontent-length: 4\r\n\r\n1\r\nZ\r\n0\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding:\tchunked\r\n\r\n1\r\nZ\r\n0\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\nTransfer-Encoding: xchunked\r\ncontent-length: 4\r\n\r\n1\r\nZ\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer_encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n",
    // obs-fold, bare CR, bare LF, NUL.
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding:\r\n chunked\r\ncontent-length: 3\r\n\r\nabc",
    b"GET /a HTTP/1.1\r\nhost: x\rGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    // HTTP/1.0 kept alive, then a chunked 1.0 body (refused: RFC 9112 6.1)
    // hiding a request; `Expect` with its body sent at once, then TE.CL.
    b"GET /a HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\nPOST /a HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /lim HTTP/1.0\r\nhost: x\r\n\r\n",
    b"POST /a HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\ncontent-length: 4\r\n\r\nabcdGET /lim HTTP/1.0\r\nhost: x\r\nconnection: close, keep-alive\r\n\r\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\n\r\nabcdPOST /a HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n5c\r\nGPOST /lim HTTP/1.1\r\n\r\n",
    b"GET /a HTTP/1.1\nhost: x\n\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-a: \0\r\n\r\n",
    // Connection naming the framing.
    b"POST /a HTTP/1.1\r\nhost: x\r\nconnection: content-length\r\ncontent-length: 31\r\n\r\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\nconnection: transfer-encoding\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    // Signed, listed, oversize lengths; chunk-size overflow.
    b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 1, 31\r\n\r\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999999\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n10000000000000001\r\nGET /lim HTTP/1.1\r\n\r\n0\r\n\r\n",
    b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5 junk\r\nhello\r\n0\r\n\r\n",
    // Duplicate hosts, absolute form without one.
    b"GET /a HTTP/1.1\r\nhost: x\r\nhost: y\r\n\r\n",
    b"GET http://x/lim HTTP/1.1\r\n\r\n",
    // The consumer twice, `_` for `-`, named by `connection`; then an honest
    // one (issue 29).
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-gov-consumer: web\r\nx-gov-consumer: crm\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-gov-consumer: web\r\nx_gov_consumer: crm\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-gov-consumer: crm\r\nconnection: x-gov-consumer\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-tier: gold\r\nx-tier: silver\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-gov-consumer: \tcrm \r\nx-tier: gold\r\n\r\nGET /a HTTP/1.1\r\nhost: x\r\nx-gov-consumer: crm\r\nconnection: keep-alive, x-tier\r\n\r\n",
    // A header a key reads: twice, `_` for `-`, named by `connection`,
    // padded; query parameters twice and encoded (issue 38).
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-tenant: acme\r\nx-tenant: zeta\r\n\r\nGET /a HTTP/1.1\r\nhost: x\r\nx-tenant: acme\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-tenant: acme\r\nx_tenant: zeta\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-tenant: acme\r\nconnection: x-tenant\r\n\r\n",
    b"GET /a HTTP/1.1\r\nhost: x\r\nx-tenant:  acme \r\n\r\n",
    b"GET /a?k=1&k=2 HTTP/1.1\r\nhost: x\r\n\r\nGET /lim?%6B=%7D%3A HTTP/1.1\r\nhost: x\r\nx-tenant: a|b\r\n\r\nGET /a?k HTTP/1.1\r\nhost: x\r\n\r\n",
    // Path spellings, pipelined.
    b"GET //lim HTTP/1.1\r\nhost: x\r\n\r\nGET /./lim HTTP/1.1\r\nhost: x\r\n\r\nGET /%6cim HTTP/1.1\r\nhost: x\r\n\r\nGET /x/../lim HTTP/1.1\r\nhost: x\r\n\r\nGET /%2flim HTTP/1.1\r\nhost: x\r\n\r\n",
    // Path parameters: kept on a named last segment, else refused.
    b"GET /lim;x HTTP/1.1\r\nhost: x\r\n\r\nGET /x/..;/lim HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /a;x/lim HTTP/1.1\r\nhost: x\r\n\r\nGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET http://x//lim/../a HTTP/1.1\r\nhost: y\r\n\r\nPOST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhiGET /lim HTTP/1.1\r\nhost: x\r\n\r\n",
];

/// Where a strict reading of a client stream stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Every byte was read as requests.
    End,
    /// The stream ends inside a request.
    Partial,
    /// A request a strict recipient refuses (or whose path cannot be normalized).
    Invalid,
    /// A request hyper serves (HTTP/1.0 without a host): the checks of exact
    /// sequence end here.
    Hyper,
}

/// (method, normalized path, body) of a request.
type Seen = (String, String, Vec<u8>);

/// The requests a strict recipient reads in `stream`, and where it stops.
fn oracle(stream: &[u8]) -> (Vec<Seen>, Stop) {
    let mut seen = Vec::new();
    let mut at = 0;
    loop {
        if at == stream.len() {
            return (seen, Stop::End);
        }
        match parse(&stream[at..]) {
            Parsed::Complete(req, n) => {
                if req.version == 0 && req.count("host") == 0 {
                    return (seen, Stop::Hyper);
                }
                let Some(path) = normalize(req.path()) else {
                    return (seen, Stop::Invalid);
                };
                if !judged_as_read(&req) {
                    return (seen, Stop::Invalid);
                }
                // The agent closes after a request that asks it to, and after
                // an HTTP/1.0 one that does not ask to persist.
                let token = |token: &[u8]| {
                    req.headers.iter().any(|(name, value)| {
                        name.eq_ignore_ascii_case("connection")
                            && value
                                .split(|&b| b == b',')
                                .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
                    })
                };
                let close = token(b"close") || (req.version == 0 && !token(b"keep-alive"));
                seen.push((req.method, path, req.body));
                at += n;
                if close {
                    return (seen, Stop::End);
                }
            }
            Parsed::Partial => return (seen, Stop::Partial),
            Parsed::Invalid(_) => return (seen, Stop::Invalid),
        }
    }
}

/// RFC 3986 section 6 normalization, written apart from the agent's: decoded
/// unreserved escapes, merged slashes, dot segments; `None` for an encoded slash,
/// a broken escape, a double-encoded escape (`%25` then two hex digits), `..`
/// above the root, or a `;` anywhere but in a last segment whose name is not
/// empty, `.` or `..` (docs/operations.md, "Request handling").
fn normalize(path: &str) -> Option<String> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return None;
    }
    let mut decoded = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            let c = u8::from_str_radix(hex, 16).ok()?;
            if c == b'/' || c == b'\\' {
                return None;
            }
            if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                decoded.push(c as char);
            } else {
                decoded.push('%');
                decoded.push_str(&hex.to_ascii_uppercase());
            }
            i += 3;
        } else {
            decoded.push(b[i] as char);
            i += 1;
        }
    }
    let double = decoded.match_indices("%25").any(|(i, _)| {
        decoded
            .get(i + 3..i + 5)
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
    });
    if double {
        return None;
    }
    let mut kept: Vec<&str> = Vec::new();
    let segments: Vec<&str> = decoded.split('/').skip(1).collect();
    for (i, s) in segments.iter().enumerate() {
        if let Some((name, _)) = s.split_once(';')
            && (i + 1 < segments.len() || matches!(name, "" | "." | ".."))
        {
            return None;
        }
    }
    let mut dir = false;
    for s in &segments {
        dir = matches!(*s, "" | "." | "..");
        match *s {
            "" | "." => {}
            ".." => {
                kept.pop()?;
            }
            s => kept.push(s),
        }
    }
    let mut out = String::new();
    for s in &kept {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || dir {
        out.push('/');
    }
    Some(out)
}

/// A response as the client read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Vec<u8>,
}

/// Reads every response until the agent closes (all answers carry a length).
fn answers(mut bytes: &[u8]) -> Result<Vec<Answer>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut slots);
        let len = match resp.parse(bytes) {
            Ok(httparse::Status::Complete(len)) => len,
            other => return Err(format!("unreadable response: {other:?} in {bytes:?}")),
        };
        let status = resp.code.unwrap_or(0);
        if (100..200).contains(&status) {
            // `100 Continue` to an `Expect`: no body.
            bytes = &bytes[len..];
            continue;
        }
        let n: usize = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
            .ok_or_else(|| format!("a response without a length: {bytes:?}"))?;
        if bytes.len() < len + n {
            return Err("a response body is cut short".into());
        }
        out.push(Answer {
            status,
            body: bytes[len..len + n].to_vec(),
        });
        bytes = &bytes[len + n..];
    }
    Ok(out)
}

/// The admitted count of each rule in [`COUNTED`].
fn admitted(agent: &Agent) -> Vec<u64> {
    let stats = agent.sidecar.engine().stats();
    COUNTED
        .iter()
        .map(|(rule, _)| {
            stats
                .rules
                .iter()
                .find(|r| &*r.rule == *rule)
                .map_or(0, |r| r.admitted)
        })
        .collect()
}

/// Sends `stream` on a new connection, closes the sending side, reads every answer.
async fn exchange(agent: &Agent, stream: &[u8]) -> Vec<u8> {
    let mut conn = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    // The agent may close (after a refusal) before everything was written.
    let _ = conn.write_all(stream).await;
    let _ = conn.shutdown().await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0_u8; 4096];
        loop {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the agent answered and closed within 10 s");
    got
}

/// Runs one stream through the agent and checks the three properties.
async fn check(
    agent: &Agent,
    up: &RawUpstream,
    stream: &[u8],
    untouched: bool,
) -> Result<(), String> {
    let folded = agent.sidecar.engine().path_reading().case_insensitive;
    let before = admitted(agent);
    let got = exchange(agent, stream).await;
    // The upstream logs a request once it read it whole; give the last one a moment.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let log = up.take();
    let after = admitted(agent);
    let show = String::from_utf8_lossy(stream);
    let mut received: Vec<Req> = Vec::new();
    for entry in log {
        received.push(entry.map_err(|why| {
            format!("the upstream could not parse what the agent sent ({why}) for {show:?}")
        })?);
    }
    let seen: Vec<Seen> = received
        .iter()
        .map(|r| (r.method.clone(), r.path().to_owned(), r.body.clone()))
        .collect();
    if let Some(r) = received.iter().find(|r| !judged_as_read(r)) {
        return Err(format!(
            "the upstream received a judged header the engine may not have read: {r:?}, for {show:?}"
        ));
    }
    // A consumer header only a verified peer may set: no client here is one.
    let untrusted = matches!(
        agent.sidecar.engine().config().consumer_source,
        gov_engine::config::ConsumerSource::TrustedHeader(_)
    );
    if untrusted && let Some(r) = received.iter().find(|r| r.count("x-gov-consumer") > 0) {
        return Err(format!(
            "the upstream received an untrusted client's consumer header: {r:?}, for {show:?}"
        ));
    }

    // 1. Nothing unjudged reaches the upstream.
    // A case-insensitive service's rules match the path folded (the
    // upstream receives it with its case).
    for (i, (rule, on)) in COUNTED.iter().enumerate() {
        let on_path = received
            .iter()
            .zip(&seen)
            .filter(|(r, (_, p, _))| on.counts(r, p, folded))
            .count() as u64;
        let grew = after[i] - before[i];
        if grew < on_path || grew > on_path + 1 {
            return Err(format!(
                "rule {rule} admitted {grew} but the upstream received {on_path} on its path, for {show:?}: {seen:?}"
            ));
        }
    }

    // 2. The upstream receives what the client meant.
    let (meant, stop) = oracle(stream);
    let exact = seen.len().min(meant.len());
    if seen[..exact] != meant[..exact] {
        return Err(format!(
            "the upstream received {seen:?}, the client meant {meant:?}, for {show:?}"
        ));
    }
    if seen.len() > meant.len() && stop != Stop::Hyper {
        return Err(format!(
            "the upstream received more than the client meant ({seen:?} for {meant:?}, {stop:?}), for {show:?}"
        ));
    }
    if untouched && (seen != meant || stop != Stop::End) {
        return Err(format!(
            "an unmutated stream was not served whole ({seen:?} for {meant:?}, {stop:?}): {show:?}"
        ));
    }

    // 3. Every answer goes to its own request.
    let answers = answers(&got).map_err(|e| format!("{e}, for {show:?}"))?;
    if stop != Stop::Hyper {
        if answers.len() < received.len() || answers.len() > received.len() + 1 {
            return Err(format!(
                "{} answers for {} forwarded requests, for {show:?}: {answers:?}",
                answers.len(),
                received.len()
            ));
        }
        if let Some(last) = answers.get(received.len())
            && ![400, 431, 501].contains(&last.status)
        {
            return Err(format!(
                "the answer after the forwarded requests is not a refusal: {last:?}, for {show:?}"
            ));
        }
    }
    for (answer, req) in answers.iter().zip(&received) {
        let expected = format!("{} {} {}", req.method, req.target, req.body.len());
        if answer.status != 200 || answer.body != expected.as_bytes() {
            return Err(format!(
                "answer {answer:?} is not the upstream's answer to {expected:?}, for {show:?}"
            ));
        }
    }
    Ok(())
}

async fn setup(config: &str) -> (RawUpstream, Agent) {
    let up = RawUpstream::start().await;
    let agent = agent()
        .config(config)
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    (up, agent)
}

#[tokio::test]
async fn the_classic_smuggling_vectors_reach_the_upstream_only_as_judged() {
    let (up, agent) = setup(RULES).await;
    for vector in VECTORS {
        if let Err(e) = check(&agent, &up, vector, false).await {
            panic!("{e}");
        }
    }
}

/// Judged headers over h2c (hyper's path): the upstream receives a request
/// only as the engine judged it, with each judged header once and the value
/// the engine read; whatever the two could read differently is refused.
#[tokio::test]
async fn judged_headers_over_h2c_reach_the_upstream_only_as_judged() {
    judged_headers_over_h2c(RULES, false).await;
}

/// The same for a service that believes the consumer header only from a
/// verified peer (`consumer from header ... trusted from peer`): a client
/// that is no agent has its consumer header removed, so the engine judges
/// no consumer and the upstream receives none.
#[tokio::test]
async fn an_untrusted_consumer_header_over_h2c_is_neither_judged_nor_forwarded() {
    judged_headers_over_h2c(&trusted_only_from_a_peer(), true).await;
}

/// [`RULES`] for a service whose consumer header only `gateway` may set.
fn trusted_only_from_a_peer() -> String {
    let config = RULES.replace(
        "version: differential-v1\n",
        "version: differential-trusted-v1\nconsumer_source: { trusted_header: { peers: [gateway] } }\n",
    );
    assert_ne!(config, RULES);
    config
}

/// Sends each case of judged headers over h2c to an agent with `config`;
/// `stripped`: the consumer header is removed before the engine.
async fn judged_headers_over_h2c(config: &str, stripped: bool) {
    let (up, agent) = setup(config).await;
    let addr = agent.sidecar.inbound_addr();
    let cases: &[&[(&str, &str)]] = &[
        &[("x-gov-consumer", "crm")],
        &[("x-gov-consumer", "crm ")],
        &[("x-gov-consumer", "\tcrm")],
        &[("x-gov-consumer", "web"), ("x-gov-consumer", "crm")],
        &[("x-gov-consumer", "crm"), ("x-gov-consumer", "crm")],
        &[("x_gov_consumer", "crm")],
        &[("x-tier", "gold"), ("x-gov-consumer", "crm")],
        &[("x-tier", "gold "), ("x-gov-consumer", "crm")],
        &[("x-tier", "silver"), ("x-tier", "gold")],
        &[("x-tier", "gold"), ("x-other", "\t1")],
        &[("x-gov-consumer", "web")],
        &[("x-tenant", "acme"), ("x-tenant", "zeta")],
        &[("x-tenant", " acme")],
        &[("x_tenant", "acme")],
        &[("x-tenant", "a|b}:c"), ("x-gov-consumer", "crm")],
    ];
    for fields in cases {
        let before = admitted(&agent);
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        let connection = tokio::spawn(connection);
        let mut req = http::Request::get(format!("http://{addr}/a"));
        for (name, value) in *fields {
            req = req.header(*name, http::HeaderValue::from_str(value).unwrap());
        }
        let mut client = client.ready().await.unwrap();
        let (response, _) = client.send_request(req.body(()).unwrap(), true).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), response)
            .await
            .expect("answered within 10 s")
            .unwrap()
            .status()
            .as_u16();
        connection.abort();
        tokio::time::sleep(Duration::from_millis(2)).await;
        let received: Vec<Req> = up.take().into_iter().map(Result::unwrap).collect();
        let after = admitted(&agent);
        // What an HTTP/1.1 recipient reads (trimmed, first copy) is what the
        // engine read; else the agent refused.
        let honest = {
            let names: Vec<&str> = fields.iter().map(|(n, _)| *n).collect();
            let mut unique = names.clone();
            unique.sort_unstable();
            unique.dedup();
            unique.len() == names.len()
                && fields
                    .iter()
                    .all(|(n, v)| !n.contains('_') && v.trim() == *v)
        };
        assert_eq!(status, if honest { 200 } else { 400 }, "{fields:?}");
        assert_eq!(received.len(), usize::from(honest), "{fields:?}");
        for r in &received {
            assert!(judged_as_read(r), "{r:?}");
            if stripped {
                assert!(
                    r.header("x-gov-consumer").is_none(),
                    "{fields:?} forwarded a consumer: {r:?}"
                );
            }
        }
        for (i, (rule, on)) in COUNTED.iter().enumerate() {
            let counted = received
                .iter()
                .filter(|r| on.counts(r, r.path(), false))
                .count() as u64;
            assert_eq!(
                after[i] - before[i],
                counted,
                "rule {rule} for {fields:?}: received {received:?}"
            );
        }
    }
}

/// One generated request: well formed unless mutated afterwards.
#[derive(Clone, Debug)]
struct Gen {
    method: &'static str,
    target: &'static str,
    host: u8,
    body: Vec<u8>,
    framing: u8,
    chunk: usize,
    connection: Option<&'static str>,
    extra: Option<(&'static str, &'static str)>,
    /// Judged header fields, each a whole `name: value` line (issue 29).
    judged: Option<&'static str>,
}

impl Gen {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(format!("{} {} HTTP/1.1\r\n", self.method, self.target).as_bytes());
        match self.host {
            0 => {}
            1 => out.extend_from_slice(b"host: x\r\n"),
            _ => out.extend_from_slice(b"Host: x\r\nhost: y\r\n"),
        }
        if let Some(c) = self.connection {
            out.extend_from_slice(format!("connection: {c}\r\n").as_bytes());
        }
        if let Some((name, value)) = self.extra {
            out.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if let Some(lines) = self.judged {
            out.extend_from_slice(lines.as_bytes());
        }
        match self.framing {
            0 if self.body.is_empty() => out.extend_from_slice(b"\r\n"),
            0 | 1 => {
                out.extend_from_slice(
                    format!("content-length: {}\r\n\r\n", self.body.len()).as_bytes(),
                );
                out.extend_from_slice(&self.body);
            }
            _ => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                for piece in self.body.chunks(self.chunk.max(1)) {
                    out.extend_from_slice(format!("{:x};e=1\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\nx-t: 1\r\n\r\n");
            }
        }
    }
}

fn gen_request() -> impl Strategy<Value = Gen> {
    (
        prop::sample::select(vec!["GET", "POST", "PUT", "DELETE"]),
        prop::sample::select(vec![
            "/a",
            "/lim",
            "//lim",
            "/./lim",
            "/%6cim",
            "/x/../lim",
            "/%2flim",
            "/../lim",
            "/a?q=/../lim",
            "/lim/",
            "/b/c",
            "http://x/lim",
            "/%41",
            "/a%20b",
            "/x/..;/lim",
            "/.;/lim",
            "/;x/lim",
            "/lim;x",
            "/a;jsessionid=1/lim",
            "/%2541",
            "/LIM",
            "/%4Cim",
            "/A",
            "/x/../Lim;x",
            "/a?k=1&k=2",
            "/lim?%6B=%7D%3A&x",
        ]),
        prop_oneof![8 => Just(1_u8), 1 => Just(0_u8), 1 => Just(2_u8)],
        prop::collection::vec(prop::sample::select(b"abcGET /\r\n0".to_vec()), 0..40),
        0_u8..3,
        1_usize..16,
        prop::option::of(prop::sample::select(vec![
            "close",
            "keep-alive",
            "content-length",
            "transfer-encoding",
            "host, x-a",
            "x-gov-consumer",
            "keep-alive, X-Tier",
            "x-tenant",
        ])),
        prop::option::of(prop::sample::select(vec![
            ("x-a", "1"),
            ("te", "trailers"),
            ("x-forwarded-for", "10.0.0.1"),
            ("content-length", "3"),
            ("transfer-encoding", "chunked"),
        ])),
        prop::option::of(prop::sample::select(JUDGED_LINES.to_vec())),
    )
        .prop_map(
            |(method, target, host, body, framing, chunk, connection, extra, judged)| Gen {
                method,
                target,
                host,
                body,
                framing,
                chunk,
                connection,
                extra,
                judged,
            },
        )
}

/// Spellings of the judged headers, honest and hostile (issue 29).
const JUDGED_LINES: [&str; 13] = [
    "x-gov-consumer: crm\r\n",
    "X-Gov-Consumer: web\r\n",
    "x-gov-consumer:  crm \t\r\n",
    "x-gov-consumer: web\r\nx-gov-consumer: crm\r\n",
    "x-gov-consumer: crm\r\nx-gov-consumer: crm\r\n",
    "x_gov_consumer: crm\r\n",
    "x-tier: gold\r\n",
    "x-tier: gold\r\nx-gov-consumer: crm\r\n",
    "x-tier: silver\r\nX-TIER: gold\r\n",
    "x-tier:\tgold \r\n",
    "x-tenant: acme\r\n",
    "x-tenant: acme\r\nX-Tenant: zeta\r\n",
    "x_tenant: a}:b\r\n",
];

/// Whether a line of [`JUDGED_LINES`] is read alike by every recipient.
fn judged_line_ok(lines: &str) -> bool {
    let names: Vec<String> = lines
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .map(|(n, _)| n.to_ascii_lowercase())
        .collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    unique.len() == names.len() && !names.iter().any(|n| n.contains('_'))
}

/// A byte mutation at a position given as a fraction of the stream.
#[derive(Clone, Debug)]
enum Mutation {
    Insert(prop::sample::Index, u8),
    Delete(prop::sample::Index),
    Replace(prop::sample::Index, u8),
}

fn gen_mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop::sample::select(b" \t\r\n\0:;,0-+a/.%\xff".to_vec());
    prop_oneof![
        (any::<prop::sample::Index>(), byte.clone()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<prop::sample::Index>().prop_map(Mutation::Delete),
        (any::<prop::sample::Index>(), byte).prop_map(|(i, b)| Mutation::Replace(i, b)),
    ]
}

fn mutate(stream: &mut Vec<u8>, mutations: &[Mutation]) {
    for m in mutations {
        if stream.is_empty() {
            return;
        }
        match m {
            Mutation::Insert(i, b) => {
                let at = i.index(stream.len() + 1);
                stream.insert(at, *b);
            }
            Mutation::Delete(i) => {
                stream.remove(i.index(stream.len()));
            }
            Mutation::Replace(i, b) => {
                let at = i.index(stream.len());
                stream[at] = *b;
            }
        }
    }
}

/// A runner of `cases` cases from the fixed `seed`: the same corpus every
/// run, nothing persisted.
fn fixed_runner(cases: u32, seed: u8) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..Config::default()
    };
    TestRunner::new_with_rng(
        config,
        proptest::test_runner::TestRng::from_seed(
            proptest::test_runner::RngAlgorithm::ChaCha,
            &[seed; 32],
        ),
    )
}

#[test]
fn generated_and_mutated_streams_reach_the_upstream_only_as_judged() {
    generated_streams(RULES, 400, 7);
}

/// The same for a service that reads paths case-insensitively (`paths
/// case-insensitive`): `/LIM` and `/%4Cim` count for `shop/lim` and reach the
/// upstream with their case.
#[test]
fn generated_streams_to_a_case_insensitive_service_reach_the_upstream_only_as_judged() {
    let config = RULES.replace(
        "version: differential-v1\n",
        "version: differential-ci-v1\npaths: PATH_DIALECT_STRICT_CASE_INSENSITIVE\n",
    );
    assert_ne!(config, RULES);
    generated_streams(&config, 200, 8);
}

/// The same for a service that believes the consumer header only from a
/// verified peer: no client of these streams is one, so `shop/crm` never
/// counts and the upstream never receives a consumer.
#[test]
fn generated_streams_to_a_service_that_trusts_only_a_peer_reach_the_upstream_only_as_judged() {
    generated_streams(&trusted_only_from_a_peer(), 200, 9);
}

/// Runs `cases` generated streams from `seed` through an agent with `config`.
fn generated_streams(config: &str, cases: u32, seed: u8) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (up, agent) = runtime.block_on(setup(config));
    // A fixed seed and case count: the same corpus every run, a few seconds.
    let mut runner = fixed_runner(cases, seed);
    let strategy = (
        prop::collection::vec(gen_request(), 1..4),
        prop::collection::vec(gen_mutation(), 0..3),
    );
    let result = runner.run(&strategy, |(requests, mutations)| {
        let mut stream = Vec::new();
        for r in &requests {
            r.write(&mut stream);
        }
        // Well formed: one host, nothing in `extra` that frames, a body only
        // with its framing.
        let valid = requests.iter().all(|r| {
            r.host == 1
                && !matches!(r.extra, Some(("content-length" | "transfer-encoding", _)))
                && r.judged.is_none_or(judged_line_ok)
                && !matches!(
                    r.connection,
                    Some("x-gov-consumer" | "keep-alive, X-Tier" | "x-tenant")
                )
                && !matches!(
                    r.target,
                    "/%2flim"
                        | "/../lim"
                        | "/x/..;/lim"
                        | "/.;/lim"
                        | "/;x/lim"
                        | "/a;jsessionid=1/lim"
                        | "/%2541"
                )
        });
        mutate(&mut stream, &mutations);
        let untouched = valid && mutations.is_empty();
        runtime
            .block_on(check(&agent, &up, &stream, untouched))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// === property 4: what the upstream works on, whatever the clients do ===

/// Three at a time on `/work`, no wait.
const THREE: &str = r#"
service: shop
version: differential-concurrency-v1
rules:
  - name: shop/three
    on: { path: { kind: PATH_KIND_PREFIX, value: /work } }
    bulkhead:
      max_concurrent: 3
"#;

/// One client's behaviour with one call to `/work`.
#[derive(Clone, Debug)]
enum Behaviour {
    /// HTTP/1.x over its own connection, `head` the request's head; the
    /// client closes after `leave_ms` (`None`: it reads the answer).
    Http1 {
        head: &'static [u8],
        leave_ms: Option<u64>,
    },
    /// h2c with prior knowledge: `streams` requests on one connection, each
    /// reset after `reset_ms` (`None`: the answers are read).
    H2c { streams: u8, reset_ms: Option<u64> },
}

fn gen_behaviour() -> impl Strategy<Value = Behaviour> {
    let leave = prop_oneof![Just(None), (0_u64..6).prop_map(Some)];
    let head = prop_oneof![
        Just(&b"GET /work HTTP/1.1\r\nhost: x\r\n\r\n"[..]),
        Just(&b"GET /work HTTP/1.0\r\nhost: x\r\n\r\n"[..]),
        Just(
            &b"POST /work HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n"
                [..]
        ),
        Just(&b"POST /work HTTP/1.0\r\nhost: x\r\ncontent-length: 5\r\n\r\nhel"[..]),
        Just(&b"POST /work HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhel"[..]),
        Just(&b"GET /work HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\n"[..]),
        Just(
            &b"GET /work HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n"
                [..]
        ),
    ];
    prop_oneof![
        (head, leave.clone()).prop_map(|(head, leave_ms)| Behaviour::Http1 { head, leave_ms }),
        (1_u8..12, leave).prop_map(|(streams, reset_ms)| Behaviour::H2c { streams, reset_ms }),
    ]
}

/// Runs one client's behaviour against the agent at `addr` (bounded).
async fn behave(addr: std::net::SocketAddr, behaviour: Behaviour) {
    let run = async {
        match behaviour {
            Behaviour::Http1 { head, leave_ms } => {
                let Ok(mut stream) = TcpStream::connect(addr).await else {
                    return;
                };
                let _ = stream.write_all(head).await;
                match leave_ms {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    None => {
                        // The answer's head, then what follows at once (a
                        // kept-alive connection stays open: no EOF to wait for).
                        let mut seen = Vec::new();
                        let mut buf = [0_u8; 1024];
                        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => seen.extend_from_slice(&buf[..n]),
                            }
                        }
                        let _ =
                            tokio::time::timeout(Duration::from_millis(50), stream.read(&mut buf))
                                .await;
                    }
                }
            }
            Behaviour::H2c { streams, reset_ms } => {
                let Ok(tcp) = TcpStream::connect(addr).await else {
                    return;
                };
                let Ok((client, connection)) = h2::client::handshake(tcp).await else {
                    return;
                };
                let connection = tokio::spawn(connection);
                let mut answers = Vec::new();
                for _ in 0..streams {
                    let Ok(mut client) = client.clone().ready().await else {
                        break;
                    };
                    let request = http::Request::get(format!("http://{addr}/work"))
                        .body(())
                        .unwrap();
                    let Ok((response, mut stream)) = client.send_request(request, true) else {
                        break;
                    };
                    match reset_ms {
                        Some(ms) => {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            stream.send_reset(h2::Reason::CANCEL);
                        }
                        None => answers.push(response),
                    }
                }
                for answer in answers {
                    if let Ok(response) = answer.await {
                        let mut body = response.into_body();
                        while let Some(Ok(_)) = body.data().await {}
                    }
                }
                connection.abort();
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
}

/// Property 4 (issue 27): for generated mixes of clients that ask and leave
/// (close, reset, HTTP/1.0, `Expect`, `Upgrade`, h2c), the upstream, which
/// works on a call to its end whatever happens to the connection (as a
/// servlet does), never works on more calls at once than the bulkhead allows.
#[test]
fn generated_client_behaviours_never_put_more_calls_at_the_upstream_than_the_bulkhead() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (up, agent) = runtime.block_on(async {
        let up = crate::support::upstream()
            .working("/work", Duration::from_millis(150))
            .start()
            .await;
        let agent = agent().config(THREE).upstream(&up).start().await;
        (up, agent)
    });
    let addr = agent.sidecar.inbound_addr();
    let mut runner = fixed_runner(12, 27);
    let strategy = prop::collection::vec(gen_behaviour(), 1..16);
    let result = runner.run(&strategy, |clients| {
        runtime.block_on(async {
            let all: Vec<_> = clients
                .into_iter()
                .map(|c| tokio::spawn(behave(addr, c)))
                .collect();
            for client in all {
                let _ = client.await;
            }
            // Whatever is still held finishes at the upstream (bounded).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while up.in_flight("/work") > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let peak = up.peak_in_flight("/work");
        if peak > 3 {
            return Err(TestCaseError::fail(format!(
                "{peak} calls at once at the upstream behind max_concurrent 3"
            )));
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
