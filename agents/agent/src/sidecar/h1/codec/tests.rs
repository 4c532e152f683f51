//! The codec byte by byte.

use super::*;
use crate::sidecar::h1::chunked::Decoder;
use crate::sidecar::h1::response::{Persist, response_framing, write_response_head};
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
        b"5 junk\r\nhello\r\n",
        b"5 \r\nhello\r\n",
        b" 5\r\nhello\r\n",
        b"0x5\r\nhello\r\n",
        b"-5\r\nhello\r\n",
        b"5;a\nb\r\nhello\r\n",
        b"5;a\0\r\nhello\r\n",
        b"5\r\nhello\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\n x: 1\r\n\r\n",
        b"5\r\nhello\r\n0\r\nx 1\r\n\r\n",
        b"5\r\nhello\r\n0\r\nx : 1\r\n\r\n",
        b"5\r\nhello\r\n0\r\nx: 1\n\r\n",
        b"5\r\nhello\r\n0\r\nx: \x01\r\n\r\n",
        b"fffffffffffffff0\r\n",
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
fn chunk_extensions_may_follow_whitespace_and_a_semicolon() {
    for ok in [
        &b"5;a=1\r\nhello\r\n0\r\n\r\n"[..],
        b"5 ;a\r\nhello\r\n0\r\n\r\n",
        b"5\t; a=\"q\"\r\nhello\r\n0\r\n\r\n",
    ] {
        assert_eq!(
            feed(Framing::Chunked, ok, &[]),
            Some((ok.len(), 5, true)),
            "{:?}",
            String::from_utf8_lossy(ok)
        );
    }
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
    let end = |b: &[u8], strict| head_end(b, 0, strict);
    assert_eq!(
        end(b"GET / HTTP/1.1\r\nh: 1\r\n\r\nrest", true),
        Ok(Some(24))
    );
    assert_eq!(end(b"GET / HTTP/1.1\r\nh: 1\r\n", true), Ok(None));
    // Responses may end lines with a bare LF; requests may not.
    assert_eq!(end(b"HTTP/1.1 200 OK\nh: 1\n\nrest", false), Ok(Some(22)));
    assert!(end(b"GET / HTTP/1.1\nh: 1\n\nrest", true).is_err());
    assert!(end(b"GET / HTTP/1.1\r\nh: 1\n\r\n", true).is_err());
    assert!(end(b"\n", true).is_err());
    // Scanning resumes a little before where it stopped.
    let head = b"GET / HTTP/1.1\r\n\r\n";
    assert_eq!(head_end(head, head.len() - 3, true), Ok(Some(head.len())));
    // A request's empty line is CRLF: LF LF ends only a response's head.
    assert!(end(b"GET / HTTP/1.1\r\nh: 1\r\n\nrest", true).is_err());
    // The empty line's CR without its LF yet (a head split between reads)
    // is not the end; nor is a CR that starts a line.
    assert_eq!(end(b"GET / HTTP/1.1\r\nh: 1\r\n\r", true), Ok(None));
    let cr_line = b"HTTP/1.1 200 OK\n\rh: 1\n\n";
    assert_eq!(end(cr_line, false), Ok(Some(cr_line.len())));
}

/// The bound docs/operations.md states: 16 KiB of chunk extensions (and
/// trailers) are read, more are refused.
#[test]
fn a_chunk_extension_under_16_kib_is_read_and_a_longer_one_refused() {
    let body = |ext: usize| [b"1;".as_slice(), &vec![b'a'; ext], b"\r\nx\r\n0\r\n\r\n"].concat();
    let ok = body(16 * 1024 - 16);
    assert_eq!(feed(Framing::Chunked, &ok, &[]), Some((ok.len(), 1, true)));
    assert_eq!(feed(Framing::Chunked, &body(16 * 1024 + 1), &[]), None);
}

#[test]
fn up_to_four_empty_lines_before_a_request_are_skipped() {
    assert_eq!(leading_empty_lines(b"GET"), Some(0));
    assert_eq!(leading_empty_lines(b"\r\n\r\nGET"), Some(4));
    // Four, the most: skipped; a fifth is refused.
    let four = [b"\r\n".repeat(4).as_slice(), b"GET"].concat();
    assert_eq!(leading_empty_lines(&four), Some(8));
    assert_eq!(leading_empty_lines(&b"\r\n".repeat(5)), None);
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
fn targets_in_absolute_form_become_origin_form() {
    assert_eq!(split_target("/a?b"), Ok(("/a?b", None)));
    assert_eq!(
        split_target("http://inventory:8080/items?x=1"),
        Ok(("/items?x=1", Some("inventory:8080")))
    );
    assert_eq!(
        split_target("HTTP://inventory"),
        Ok(("/", Some("inventory")))
    );
    for refused in [
        "http://inventory?x",
        "https://inventory/",
        "http://user@inventory/",
        "http:///a",
        "http://a b/",
        "*",
        "inventory:80",
        "",
    ] {
        assert!(split_target(refused).is_err(), "{refused}");
    }
}

/// The verdict on `head`, as a comparable summary.
fn verdict(head: &str) -> Result<Served, Refusal> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    match check_request(head.as_bytes(), &mut slots, Reading::default()) {
        Verdict::Serve(req) => Ok(Served::Here {
            target: req.target.to_string(),
            path: req.path().to_owned(),
            host: req.host.to_owned(),
            framing: req.framing,
            close: req.close,
        }),
        Verdict::Hyper => Ok(Served::Hyper),
        Verdict::Refuse(refusal) => Err(refusal),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Served {
    Here {
        target: String,
        path: String,
        host: String,
        framing: Framing,
        close: bool,
    },
    Hyper,
}

fn here(target: &str, path: &str, host: &str, framing: Framing, close: bool) -> Served {
    Served::Here {
        target: target.into(),
        path: path.into(),
        host: host.into(),
        framing,
        close,
    }
}

#[test]
fn plain_requests_are_served_here() {
    assert_eq!(
        verdict("GET /a?b=1 HTTP/1.1\r\nHost: x\r\n\r\n"),
        Ok(here("/a?b=1", "/a", "x", Framing::Empty, false))
    );
    assert_eq!(
        verdict(
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 12\r\nconnection: keep-alive, Close\r\n\r\n"
        ),
        Ok(here("/", "/", "x", Framing::Length(12), true))
    );
    assert_eq!(
        verdict("POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: Chunked\r\n\r\n"),
        Ok(here("/", "/", "x", Framing::Chunked, false))
    );
    // The path is normalized, the query kept as it came.
    assert_eq!(
        verdict("GET //x/../%6cim?a=%2f HTTP/1.1\r\nhost: x\r\n\r\n"),
        Ok(here("/lim?a=%2f", "/lim", "x", Framing::Empty, false))
    );
    // Absolute form: the target's authority replaces `host` (RFC 9112 3.2.2).
    assert_eq!(
        verdict("GET http://inventory:80/a HTTP/1.1\r\nhost: other\r\n\r\n"),
        Ok(here("/a", "/a", "inventory:80", Framing::Empty, false))
    );
}

/// Fields that share a length with `host`, `connection`, `upgrade` or a
/// framing name are none of them: the dispatch on the length goes on to
/// compare the name. An `OPTIONS` with a path, and a `_` outside a framing
/// name, are plain requests too.
#[test]
fn lookalike_fields_and_methods_are_plain_requests() {
    for head in [
        "GET / HTTP/1.1\r\nhost: x\r\nfrom: someone\r\n\r\n",
        "GET / HTTP/1.1\r\nfrom: someone\r\nhost: x\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\nuser-agent: close\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\nreferer: upgrade\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\naccept-charset: utf-8\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\nx-forwarded-proto: http\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\nx_my_header_ab: 1\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\nx_forwarded_port: 80\r\n\r\n",
    ] {
        assert_eq!(
            verdict(head),
            Ok(here("/", "/", "x", Framing::Empty, false)),
            "{head:?}"
        );
    }
    assert_eq!(
        verdict("OPTIONS /a HTTP/1.1\r\nhost: x\r\n\r\n"),
        Ok(here("/a", "/a", "x", Framing::Empty, false))
    );
}

/// A `content-length` is one to 19 decimal digits: empty, or longer (even
/// if only by leading zeros), is refused; the largest 19-digit lengths frame.
#[test]
fn content_lengths_are_one_to_nineteen_digits() {
    let head = |v: &str| format!("POST / HTTP/1.1\r\nhost: x\r\ncontent-length: {v}\r\n\r\n");
    for refused in ["", "00000000000000000001", "99999999999999999999"] {
        assert!(verdict(&head(refused)).is_err(), "{refused:?}");
    }
    for (ok, n) in [("1000000000000000000", 1_000_000_000_000_000_000), ("0", 0)] {
        assert_eq!(
            verdict(&head(ok)),
            Ok(here("/", "/", "x", Framing::Length(n), false)),
            "{ok:?}"
        );
    }
}

#[test]
fn unusual_requests_go_to_hyper_once_checked() {
    for hyper_s in [
        "GET / HTTP/1.0\r\n\r\n",
        "GET / HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        "POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue, x\r\ncontent-length: 1\r\n\r\n",
        "POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\nexpect: x\r\ncontent-length: 1\r\n\r\n",
        "CONNECT x:443 HTTP/1.1\r\nhost: x:443\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    ] {
        assert_eq!(verdict(hyper_s), Ok(Served::Hyper), "{hyper_s:?}");
    }
}

/// HTTP/1.0 with a host, and `Expect: 100-continue`, are served here (issue
/// 37): 1.0 persists only with `keep-alive` and without `close` (RFC 9112
/// section 9.3); a 1.0 client's expectation is ignored (RFC 9110 10.1.1).
#[test]
fn http10_and_expect_continue_are_served_here() {
    let served = |head: &str| {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        match check_request(head.as_bytes(), &mut slots, Reading::default()) {
            Verdict::Serve(req) => Some((req.close, req.http10, req.expect)),
            _ => None,
        }
    };
    for (head, close, http10, expect) in [
        ("GET / HTTP/1.0\r\nhost: x\r\n\r\n", true, true, false),
        (
            "GET / HTTP/1.0\r\nhost: x\r\nconnection: Keep-Alive\r\n\r\n",
            false,
            true,
            false,
        ),
        (
            "GET / HTTP/1.0\r\nhost: x\r\nconnection: keep-alive, close\r\n\r\n",
            true,
            true,
            false,
        ),
        (
            "GET / HTTP/1.0\r\nhost: x\r\nconnection: close\r\nconnection: keep-alive\r\n\r\n",
            true,
            true,
            false,
        ),
        (
            "POST / HTTP/1.0\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n",
            true,
            true,
            false,
        ),
        (
            "GET / HTTP/1.1\r\nhost: x\r\nconnection: keep-alive\r\n\r\n",
            false,
            false,
            false,
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n",
            false,
            false,
            true,
        ),
    ] {
        assert_eq!(served(head), Some((close, http10, expect)), "{head:?}");
    }
    // Its `expect` never goes upstream: the agent answers it.
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let head = b"POST /a HTTP/1.1\r\nhost: h\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n";
    let Verdict::Serve(req) = check_request(head, &mut slots, Reading::default()) else {
        panic!("served");
    };
    let mut out = Vec::new();
    write_request_head(
        &mut out,
        &req,
        "127.0.0.2",
        (std::iter::empty(), None),
        None,
    );
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 1\r\nx-forwarded-for: 127.0.0.2\r\n\r\n"
    );
}

/// An HTTP/1.0 client gets a chunked body as its payload alone, wherever the
/// reads split it; the response head then has no framing header and closes.
#[test]
fn a_chunked_body_goes_to_an_http10_client_dechunked() {
    let body = b"5;x=1\r\nhello\r\n6\r\n world\r\n0\r\nx-t: 1\r\n\r\n";
    for cut in 0..body.len() {
        let mut decoder = Decoder::dechunked(Framing::Chunked);
        let mut out = Vec::new();
        let mut payload = 0;
        for piece in [&body[..cut], &body[cut..]] {
            let mut piece = piece;
            while !piece.is_empty() && !decoder.done() {
                let step = decoder.advance(piece).unwrap();
                if !step.dropped {
                    out.extend_from_slice(&piece[..step.taken]);
                }
                payload += step.payload;
                piece = &piece[step.taken..];
            }
        }
        assert!(decoder.done(), "cut at {cut}");
        assert_eq!(
            (&out[..], payload),
            (&b"hello world"[..], 11),
            "cut at {cut}"
        );
    }
    let mut slots = [httparse::EMPTY_HEADER; 4];
    let mut r = httparse::Response::new(&mut slots);
    let resp = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-a: 1\r\n\r\n";
    assert!(r.parse(resp).unwrap().is_complete());
    let mut out = Vec::new();
    let persist = Persist::of(true, true);
    write_response_head(
        &mut out,
        200,
        None,
        r.headers,
        &[],
        Framing::UntilClose,
        persist,
    );
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "HTTP/1.1 200 OK\r\nx-a: 1\r\nconnection: close\r\n\r\n"
    );
    assert_eq!(Persist::of(true, false), Persist::KeepAlive);
    assert_eq!(Persist::of(false, false), Persist::Implied);
}

#[test]
fn ambiguous_requests_are_refused() {
    for (head, why) in [
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            "CL.TE",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            "TE.CL",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n",
            "duplicate CL",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3, 3\r\n\r\n",
            "list-valued CL",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: +3\r\n\r\n",
            "signed CL",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
            "negative CL",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "oversize CL",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0x10\r\n\r\n",
            "hex CL",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "chunked twice",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n",
            "chunked not last",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: xchunked\r\n\r\n",
            "TE obfuscated",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: x\r\n\r\n",
            "TE.TE",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer_encoding: chunked\r\n\r\n",
            "TE with _",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\nContent_Length: 3\r\n\r\n",
            "CL with _",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding : chunked\r\n\r\n",
            "space before colon",
        ),
        (
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding:\r\n chunked\r\n\r\n",
            "obs-fold",
        ),
        (
            "POST / HTTP/1.0\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
            "TE in HTTP/1.0",
        ),
        ("GET / HTTP/1.1\r\n\r\n", "no host"),
        (
            "GET http://a/ HTTP/1.1\r\n\r\n",
            "absolute form without host",
        ),
        ("GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n", "two hosts"),
        (
            "GET / HTTP/1.0\r\nhost: a\r\nhost: a\r\n\r\n",
            "two hosts in HTTP/1.0",
        ),
        ("GET / HTTP/1.1\r\nhost: a/b\r\n\r\n", "host with a path"),
        ("GET / HTTP/1.1\r\nhost: u@a\r\n\r\n", "host with user info"),
        ("GET / HTTP/1.1\r\nhost: a\0b\r\n\r\n", "NUL in a value"),
        ("GET / HTTP/1.1\r\nhost: a\rb\r\n\r\n", "bare CR"),
        (
            "GET /a b HTTP/1.1\r\nhost: a\r\n\r\n",
            "space in the target",
        ),
        ("GET  / HTTP/1.1\r\nhost: a\r\n\r\n", "two spaces"),
        ("GET /%2flim HTTP/1.1\r\nhost: a\r\n\r\n", "encoded slash"),
        ("GET /../lim HTTP/1.1\r\nhost: a\r\n\r\n", "above the root"),
        ("GET /%zz HTTP/1.1\r\nhost: a\r\n\r\n", "broken escape"),
        ("GET https://a/ HTTP/1.1\r\nhost: a\r\n\r\n", "other scheme"),
        ("GET / HTTP/1.2\r\nhost: a\r\n\r\n", "unknown version"),
        ("G@T / HTTP/1.1\r\nhost: a\r\n\r\n", "bad method"),
    ] {
        let got = verdict(head);
        assert!(matches!(got, Err(Refusal::BadRequest(_))), "{why}: {got:?}");
    }
    assert_eq!(
        verdict("POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
        Err(Refusal::UnknownCoding)
    );
    let many = format!(
        "GET / HTTP/1.1\r\nhost: x\r\n{}\r\n",
        "x-h: 1\r\n".repeat(MAX_HEADERS)
    );
    assert_eq!(verdict(&many), Err(Refusal::HeadTooLarge));
}

/// Writes the upstream head of `head` (which must be served here).
fn upstream_head(head: &str) -> String {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let Verdict::Serve(req) = check_request(head.as_bytes(), &mut slots, Reading::default()) else {
        panic!("not served here: {head:?}");
    };
    let mut out = Vec::new();
    write_request_head(
        &mut out,
        &req,
        "127.0.0.2",
        (std::iter::empty(), None),
        None,
    );
    String::from_utf8(out).unwrap()
}

#[test]
fn the_upstream_head_drops_hop_by_hop_headers_and_appends_the_client() {
    assert_eq!(
        upstream_head(
            "GET /a?b=1 HTTP/1.1\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nHost: h\r\nX-Forwarded-For: 10.0.0.1\r\nX-Kept: 2\r\n\r\n"
        ),
        "GET /a?b=1 HTTP/1.1\r\nTE: trailers\r\nX-Kept: 2\r\nhost: h\r\nx-forwarded-for: 10.0.0.1, 127.0.0.2\r\n\r\n"
    );
}

#[test]
fn connection_cannot_remove_the_framing_the_agent_writes() {
    // The smuggling of issue 10: `connection: content-length` with a body.
    assert_eq!(
        upstream_head(
            "POST /a HTTP/1.1\r\nhost: h\r\nconnection: content-length, host, transfer-encoding\r\ncontent-length: 5\r\n\r\n"
        ),
        "POST /a HTTP/1.1\r\nhost: h\r\ncontent-length: 5\r\nx-forwarded-for: 127.0.0.2\r\n\r\n"
    );
    assert_eq!(
        upstream_head(
            "POST /a HTTP/1.1\r\nhost: h\r\nconnection: transfer-encoding\r\ntransfer-encoding: chunked\r\n\r\n"
        ),
        "POST /a HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\nx-forwarded-for: 127.0.0.2\r\n\r\n"
    );
    // The normalized target goes upstream; the absolute form's authority is the host.
    assert_eq!(
        upstream_head("GET http://inv/./x//y?q HTTP/1.1\r\nhost: other\r\n\r\n"),
        "GET /x/y?q HTTP/1.1\r\nhost: inv\r\nx-forwarded-for: 127.0.0.2\r\n\r\n"
    );
}

#[test]
fn the_response_head_keeps_the_framing_it_relays() {
    let head = |resp: &[u8], framing| {
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let mut r = httparse::Response::new(&mut slots);
        assert!(r.parse(resp).unwrap().is_complete());
        let conn = header_tokens(r.headers, "connection");
        let mut out = Vec::new();
        write_response_head(
            &mut out,
            r.code.unwrap(),
            r.reason,
            r.headers,
            &conn,
            framing,
            Persist::Implied,
        );
        String::from_utf8(out).unwrap()
    };
    assert_eq!(
            head(b"HTTP/1.1 200 OK\r\nconnection: content-length, x-a\r\nx-a: 1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n", Framing::Length(2)),
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
        );
    assert_eq!(
            head(b"HTTP/1.1 200 OK\r\nconnection: transfer-encoding\r\ntransfer-encoding: chunked\r\ncontent-length: 9\r\n\r\n", Framing::Chunked),
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    assert_eq!(
        head(
            b"HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
            Framing::Empty
        ),
        "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n"
    );
}

/// Feeds a request body to a request decoder in pieces split at `cuts`: the bytes
/// relayed, and whether the body ended.
fn relayed(body: &[u8], cuts: &[usize]) -> Option<(Vec<u8>, bool)> {
    let mut decoder = Decoder::request(Framing::Chunked);
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain([&body.len()]) {
        let mut piece = &body[start..end];
        while !piece.is_empty() && !decoder.done() {
            let step = decoder.advance(piece)?;
            if !step.dropped {
                out.extend_from_slice(&piece[..step.taken]);
            }
            piece = &piece[step.taken..];
            if step.taken == 0 {
                break;
            }
        }
        start = end;
    }
    Some((out, decoder.done()))
}

#[test]
fn request_trailers_are_dropped_wherever_the_body_is_split() {
    let body = b"5\r\nhello\r\n0\r\ncontent-length: 99\r\nhost: evil\r\n\r\n";
    let expected = b"5\r\nhello\r\n0\r\n\r\n".to_vec();
    assert_eq!(relayed(body, &[]), Some((expected.clone(), true)));
    for cut in 0..body.len() {
        for second in cut..body.len() {
            assert_eq!(
                relayed(body, &[cut, second]),
                Some((expected.clone(), true)),
                "cut at {cut} and {second}"
            );
        }
    }
    // Responses keep theirs (gRPC-web and the like).
    assert_eq!(
        feed(Framing::Chunked, body, &[]),
        Some((body.len(), 5, true))
    );
}

#[test]
fn the_extension_and_trailer_bound_holds_across_reads() {
    let mut body = b"5;".to_vec();
    body.extend(std::iter::repeat_n(b'a', MAX_CHUNK_META + 10));
    body.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
    let cuts: Vec<usize> = (1..body.len()).step_by(1000).collect();
    assert_eq!(feed(Framing::Chunked, &body, &cuts), None);
    assert_eq!(relayed(&body, &cuts), None);
}

#[test]
fn each_refusal_answers_with_its_status_and_says_why() {
    for (refusal, status) in [
        (Refusal::BadRequest("gov-agent: why\n"), 400),
        (Refusal::HeadTooLarge, 431),
        (Refusal::UnknownCoding, 501),
    ] {
        let (code, body) = refusal.answer();
        assert_eq!(code.as_u16(), status, "{refusal:?}");
        assert!(
            body.starts_with("gov-agent: ") && body.ends_with('\n'),
            "{refusal:?}: {body:?}"
        );
    }
    assert_eq!(
        Refusal::BadRequest("gov-agent: why\n").answer().1,
        "gov-agent: why\n"
    );
    // A path the normalization refuses is a 400 that names the path's fault.
    assert_eq!(
        verdict("GET /a%2Fb HTTP/1.1\r\nhost: x\r\n\r\n"),
        Err(Refusal::BadRequest(PathError::EncodedSlash.body()))
    );
}

#[test]
fn only_the_agent_writes_gov_would_reject_by() {
    let head = "GET /a HTTP/1.1\r\nhost: h\r\nGov-Would-Reject-By: shop/forged\r\ngov-would-reject-by: x\r\nx-kept: 1\r\n\r\n";
    // A client's own is dropped, with no stamp or with one.
    assert_eq!(
        upstream_head(head),
        "GET /a HTTP/1.1\r\nx-kept: 1\r\nhost: h\r\nx-forwarded-for: 127.0.0.2\r\n\r\n"
    );
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let Verdict::Serve(req) = check_request(head.as_bytes(), &mut slots, Reading::default()) else {
        panic!("not served here");
    };
    let mut out = Vec::new();
    let stamps = ["shop/trial", "shop/bad\r\nx-injected: 1", "shop/other"];
    write_request_head(
        &mut out,
        &req,
        "127.0.0.2",
        (stamps.into_iter(), None),
        None,
    );
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "GET /a HTTP/1.1\r\nx-kept: 1\r\ngov-would-reject-by: shop/trial, shop/other\r\nhost: h\r\nx-forwarded-for: 127.0.0.2\r\n\r\n"
    );
}

/// The status line keeps the upstream's reason phrase, and gives the
/// canonical one when the upstream sent none (or an empty one).
#[test]
fn the_response_head_keeps_the_upstreams_reason_or_gives_the_canonical_one() {
    let line = |reason: Option<&str>| {
        let mut out = Vec::new();
        write_response_head(
            &mut out,
            200,
            reason,
            &[],
            &[],
            Framing::Length(0),
            Persist::Implied,
        );
        let text = String::from_utf8_lossy(&out).into_owned();
        text.lines().next().unwrap_or_default().to_owned()
    };
    assert_eq!(line(Some("Very Fine")), "HTTP/1.1 200 Very Fine");
    assert_eq!(line(Some("")), "HTTP/1.1 200 OK");
    assert_eq!(line(None), "HTTP/1.1 200 OK");
}

#[test]
fn path_parameters_that_change_what_a_path_names_are_refused_byte_by_byte() {
    for target in [
        "/x/..;/admin/",
        "/.;/admin/",
        "/;x/admin/",
        "/api;x/admin",
        "/a;jsessionid=1/b",
        "/x/%2e%2e;/admin/",
    ] {
        let head = format!("GET {target} HTTP/1.1\r\nhost: x\r\n\r\n");
        assert_eq!(
            verdict(&head),
            Err(Refusal::BadRequest(PathError::Parameters.body())),
            "{target}"
        );
        // The same before a hand-over to hyper (HTTP/1.0).
        let head = format!("GET {target} HTTP/1.0\r\n\r\n");
        assert_eq!(
            verdict(&head),
            Err(Refusal::BadRequest(PathError::Parameters.body())),
            "{target}"
        );
    }
    // Parameters on a named last segment are forwarded as sent; the query is
    // never read as a path.
    assert_eq!(
        verdict("GET /cart;jsessionid=A1?x=/..;/ HTTP/1.1\r\nhost: x\r\n\r\n"),
        Ok(here(
            "/cart;jsessionid=A1?x=/..;/",
            "/cart;jsessionid=A1",
            "x",
            Framing::Empty,
            false
        ))
    );
    assert_eq!(
        verdict("GET /%252e%252e/admin HTTP/1.1\r\nhost: x\r\n\r\n"),
        Err(Refusal::BadRequest(PathError::DoubleEncoding.body()))
    );
}
