//! Hostile input against the proxy listeners, with real sockets: the smuggling
//! and rule-bypass vectors of issue 10, each against an upstream that parses what
//! it receives strictly and logs it ([`crate::strict::RawUpstream`]).

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::h1::Wire;
use crate::strict::RawUpstream;
use crate::support::{Agent, Upstream, agent, http};

/// One call a hour on `/lim`.
const LIMITED: &str = r#"
service: shop
version: hostile-v1
rules:
  - name: shop/lim
    on: { path: { kind: PATH_KIND_EXACT, value: /lim } }
    limit:
      calls: { amount: 1, window_ms: 3600000 }
"#;

async fn agent_before(up: &RawUpstream) -> Agent {
    agent()
        .config(LIMITED)
        .upstream(&Upstream::at(up.addr))
        .start()
        .await
}

/// Spends the one call of `shop/lim`.
async fn engage(agent: &Agent, up: &RawUpstream) {
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /lim HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(wire.response().await.status, 200);
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /lim HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(wire.response().await.status, 429, "the limit is engaged");
    assert_eq!(up.take().len(), 1);
}

/// Sends `request` on a new connection and expects `status` and a closed connection.
async fn refused(agent: &Agent, request: &[u8], status: u16) {
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(request).await;
    let reply = wire.response().await;
    assert_eq!(
        reply.status,
        status,
        "{}: {}",
        String::from_utf8_lossy(request),
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(wire.closed().await, "the connection closes after a refusal");
}

async fn refused_total(agent: &Agent) -> u64 {
    let metrics = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("gov_agent_requests_refused_total{listener=\"inbound\"} "))
        .and_then(|v| v.parse().ok())
        .expect("the refused counter is exposed")
}

#[tokio::test]
async fn connection_cannot_drop_the_length_and_smuggle_the_body_as_a_request() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    engage(&agent, &up).await;

    let smuggled = b"GET /lim HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    let head = format!(
        "POST /free HTTP/1.1\r\nhost: x\r\nconnection: content-length\r\ncontent-length: {}\r\n\r\n",
        smuggled.len()
    );
    wire.send(&[head.as_bytes(), smuggled].concat()).await;
    let reply = wire.response().await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.body,
        format!("POST /free {}", smuggled.len()).as_bytes()
    );
    // Another client's request on a new connection gets its own answer.
    let mut other = Wire::connect(agent.sidecar.inbound_addr()).await;
    other.send(b"GET /other HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(other.response().await.body, b"GET /other 0");

    let received = up.requests();
    assert_eq!(received.len(), 2, "{received:?}");
    assert_eq!(received[0].body, smuggled, "the body stayed a body");
    assert_eq!(received[1].target, "/other");
}

#[tokio::test]
async fn framing_ambiguities_are_refused_with_400_and_a_close() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    for request in [
        // Two `Host`s, on this path and on hyper's (HTTP/1.0).
        &b"GET /a HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n"[..],
        b"GET /a HTTP/1.0\r\nhost: a\r\nhost: b\r\n\r\n",
        // No `Host` in absolute form.
        b"GET http://a/x HTTP/1.1\r\n\r\n",
        // CL.TE and TE.CL.
        b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 6\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nX",
        b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n0\r\n\r\n",
        // TE.TE obfuscations.
        b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: cow\r\n\r\n",
        b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: xchunked\r\n\r\n",
        b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer_encoding: chunked\r\ncontent-length: 3\r\n\r\nabc",
        // Duplicate, list-valued, signed and oversize lengths.
        b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc",
        b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 3, 3\r\n\r\nabc",
        b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: +3\r\n\r\nabc",
        b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 184467440737095516160\r\n\r\n",
        // obs-fold, bare LF, bare CR, NUL.
        b"GET /a HTTP/1.1\r\nhost: x\r\nx-a: 1\r\n 2\r\n\r\n",
        b"GET /a HTTP/1.1\nhost: x\n\n",
        b"GET /a HTTP/1.1\r\nhost: x\rx-a: 1\r\n\r\n",
        b"GET /a HTTP/1.1\r\nhost: x\r\nx-a: 1\0\r\n\r\n",
        // Paths that cannot be normalized.
        b"GET /%2flim HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /../lim HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /%zz HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /%2flim HTTP/1.0\r\nhost: x\r\n\r\n",
        // A fragment, a backslash.
        b"GET /lim#x HTTP/1.1\r\nhost: x\r\n\r\n",
        b"GET /x\\..\\lim HTTP/1.1\r\nhost: x\r\n\r\n",
    ] {
        refused(&agent, request, 400).await;
    }
    refused(
        &agent,
        b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
        501,
    )
    .await;
    let many = format!(
        "GET /a HTTP/1.1\r\nhost: x\r\n{}\r\n",
        "x-h: 1\r\n".repeat(200)
    );
    refused(&agent, many.as_bytes(), 431).await;
    assert_eq!(up.take(), [], "nothing reached the upstream");
    assert_eq!(refused_total(&agent).await, 24);
}

#[tokio::test]
async fn a_chunk_line_with_junk_after_the_size_is_refused_and_never_relayed() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    for body in [
        &b"5 junk\r\nhello\r\n0\r\n\r\n"[..],
        b"5\r\nhello\r\n0\r\n x: folded\r\n\r\n",
        b"fffffffffffffffff\r\n",
        b"-1\r\n",
    ] {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
            .await;
        wire.send(body).await;
        let reply = wire.response().await;
        assert_eq!(reply.status, 400, "{}", String::from_utf8_lossy(body));
        assert!(wire.closed().await);
    }
    // The upstream may have seen the head and the first chunks, never a whole request.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        up.take().iter().all(Result::is_err),
        "no complete request reached the upstream"
    );
}

#[tokio::test]
async fn every_spelling_of_a_limited_path_meets_its_limit() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    engage(&agent, &up).await;
    for spelling in [
        "//lim",
        "/./lim",
        "/%6cim",
        "/%6Cim",
        "/x/../lim",
        "/lim/.",
        "///lim",
    ] {
        for version in ["1.1", "1.0"] {
            let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
            let request = format!("GET {spelling} HTTP/{version}\r\nhost: x\r\n\r\n");
            wire.send(request.as_bytes()).await;
            let reply = wire.response().await;
            // `/lim/.` is `/lim/`, another path: served.
            let expected = if spelling == "/lim/." { 200 } else { 429 };
            assert_eq!(reply.status, expected, "{request}");
        }
    }
    // What the upstream received is the normalized path the engine judged.
    let targets: Vec<String> = up.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(targets, ["/lim/", "/lim/"]);

    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /a/./b//c/../d?q=/../%2f HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    assert_eq!(wire.response().await.body, b"GET /a/b/d?q=/../%2f 0");
}

#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once_and_counted() {
    let up = RawUpstream::start().await;
    let agent = agent()
        .upstream(&Upstream::at(up.addr))
        .max_connections(2)
        .start()
        .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert_eq!(wire.response().await.status, 200);
        held.push(wire);
    }
    let mut over = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    let mut byte = [0_u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), over.read(&mut byte))
        .await
        .expect("closed within 5 s");
    // Closed at accept, before a byte was read: a clean close (FIN), not a reset.
    assert!(
        matches!(read, Ok(0)),
        "the connection over the cap is closed: {read:?}"
    );
    let metrics = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_connections_over_cap_total{listener=\"inbound\"} 1\n"),
        "{metrics}"
    );
    assert!(metrics.contains("gov_agent_connections_open{listener=\"inbound\"} 2\n"));
    // A slot frees when a client leaves.
    drop(held.pop());
    let mut served = false;
    for _ in 0..100 {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n").await;
        if let Some(reply) = wire.try_response().await {
            assert_eq!(reply.status, 200);
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "a new connection is served once one closed");
}

#[tokio::test]
async fn hyper_serves_one_handed_over_request_then_the_connection_closes() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    engage(&agent, &up).await;
    // A request the HTTP/1 path hands to hyper, then one hyper would parse
    // without the HTTP/1 path's checks: `transfer_encoding` read as
    // `transfer-encoding` by a lenient upstream smuggles `GET /lim`.
    for first in [
        &b"GET /a HTTP/1.0\r\nconnection: keep-alive\r\n\r\n"[..],
        b"GET /a HTTP/1.1\r\nhost: x\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n",
        b"POST /a HTTP/1.1\r\nhost: x\r\nexpect: x-other\r\ncontent-length: 0\r\n\r\n",
    ] {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(&[first, SMUGGLER].concat()).await;
        let reply = wire.response().await;
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(first));
        // hyper adds `keep-alive` for an HTTP/1.0 client that asked for it, after
        // our `close`; `close` wins (RFC 9112 section 9.6), and hyper closes.
        assert!(
            reply
                .header("connection")
                .is_some_and(|c| c.split(',').any(|t| t.trim() == "close")),
            "{:?}",
            reply.headers
        );
        assert!(wire.closed().await, "hyper served one request only");
    }
    let received: Vec<String> = up.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(received, ["/a", "/a", "/a"]);
}

const SMUGGLER: &[u8] = b"POST /b HTTP/1.1\r\nhost: a\r\ntransfer_encoding: chunked\r\ncontent-length: 35\r\n\r\n0\r\n\r\nGET /lim HTTP/1.1\r\nhost: a\r\n\r\n";

/// HTTP/1.0 kept alive and `Expect: 100-continue` stay on the HTTP/1 path
/// (issue 37): what follows them on the connection meets its checks, and the
/// smuggler is refused there.
#[tokio::test]
async fn what_follows_http10_keep_alive_or_expect_meets_the_http1_checks() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    engage(&agent, &up).await;
    for first in [
        &b"GET /a HTTP/1.0\r\nconnection: keep-alive\r\nhost: x\r\n\r\n"[..],
        b"POST /a HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 0\r\n\r\n",
        b"POST /a HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\nhi",
    ] {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(&[first, SMUGGLER].concat()).await;
        let reply = wire.response().await;
        assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(first));
        assert_ne!(reply.header("connection"), Some("close"));
        assert_eq!(wire.response().await.status, 400, "the smuggler is refused");
        assert!(wire.closed().await);
    }
    let received: Vec<String> = up.requests().into_iter().map(|r| r.target).collect();
    assert_eq!(received, ["/a", "/a", "/a"]);
}

/// The agent's own answers on a handed-over connection close it too: a
/// refused `CONNECT` (authority-form, hyper's) used to leave it open for
/// hyper to parse what followed.
#[tokio::test]
async fn a_refused_handed_over_request_closes_the_connection_too() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    let next = b"GET /lim HTTP/1.1\r\nhost: a\r\n\r\n";
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(&[&b"CONNECT x:443 HTTP/1.1\r\nhost: x:443\r\n\r\n"[..], next].concat())
        .await;
    let reply = wire.response().await;
    assert_eq!(reply.status, 400);
    assert!(wire.closed().await, "hyper served one request only");
    assert_eq!(up.take(), []);
}

#[tokio::test]
async fn a_client_that_stalls_its_body_or_stops_reading_is_closed() {
    let up = RawUpstream::start().await;
    let agent = agent()
        .upstream(&Upstream::at(up.addr))
        .client_timeout(Duration::from_millis(200))
        .start()
        .await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nx")
        .await;
    // `closed` waits at most 10 s: the 200 ms client timeout ends it long before.
    assert!(wire.closed().await, "a stalled body closes the connection");
    assert_eq!(
        up.take(),
        [],
        "the partial request never completed upstream"
    );
}

/// The head limit is 64 KiB: a 60,000-byte header value is forwarded, a
/// 70,000-byte one is refused with 431 and never relayed. (Kills the mutant that
/// turns `64 * 1024` into `64 + 1024` in the codec's `MAX_HEAD`.)
#[tokio::test]
async fn a_head_under_64_kib_is_forwarded_and_a_larger_one_refused() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    let head = |n: usize| {
        format!(
            "GET /a HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "a".repeat(n)
        )
    };
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(head(60_000).as_bytes()).await;
    assert_eq!(wire.response().await.status, 200);
    let seen = up.take();
    assert!(
        matches!(seen.as_slice(), [Ok(_)]),
        "relayed once, valid: {seen:?}"
    );
    refused(&agent, head(70_000).as_bytes(), 431).await;
    assert_eq!(up.take(), [], "the oversized head was not relayed");
}

/// Chunk extensions and trailers may take up to 16 KiB per body: a 4,000-byte
/// trailer section is consumed (not relayed) and the body forwarded. (Kills the
/// mutant that turns `16 * 1024` into `16 + 1024` in `MAX_CHUNK_META`.)
#[tokio::test]
async fn a_trailer_section_under_16_kib_is_consumed_and_the_body_forwarded() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    let request = format!(
        "POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n\
         5\r\nhello\r\n0\r\nx-t: {}\r\n\r\n",
        "a".repeat(4_000)
    );
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(request.as_bytes()).await;
    assert_eq!(wire.response().await.status, 200);
    let seen = up.take();
    assert!(
        matches!(seen.as_slice(), [Ok(_)]),
        "relayed once, valid: {seen:?}"
    );
}

/// hyper's path (an HTTP/1.0 request is handed to it): the engine's stamp is
/// the only `gov-would-reject-by` the upstream sees, even when the client's
/// `connection` names that header as hop-by-hop; and a `CONNECT` is refused
/// before the decision, so it spends no call of a limit.
#[tokio::test]
async fn connection_cannot_drop_the_agents_stamp_and_connect_spends_no_call() {
    let up = RawUpstream::start().await;
    let agent = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/trial
    on: { path: { kind: PATH_KIND_PREFIX, value: /trial } }
    mode: MODE_SHADOW
    stamp_would_reject: true
    limit:
      calls: { amount: 1, window_ms: 3600000 }
  - name: shop/one
    on: { any: true }
    limit:
      calls: { amount: 2, window_ms: 3600000 }
"#,
        )
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    for _ in 0..3 {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(b"CONNECT example.org:443 HTTP/1.1\r\nhost: example.org:443\r\n\r\n")
            .await;
        let reply = wire.response().await;
        assert_eq!(
            reply.status,
            400,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert!(String::from_utf8_lossy(&reply.body).contains("CONNECT is not supported"));
    }
    // The first call of `/trial` is within the shadow limit, the second not.
    for _ in 0..2 {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(
            b"GET /trial HTTP/1.0\r\nhost: x\r\nconnection: gov-would-reject-by, x-drop\r\ngov-would-reject-by: shop/forged\r\nx-drop: 1\r\n\r\n",
        )
        .await;
        assert_eq!(wire.response().await.status, 200);
    }
    let stamps: Vec<Option<String>> = up
        .requests()
        .iter()
        .map(|r| {
            assert_eq!(r.header("x-drop"), None, "`connection` still drops headers");
            r.header("gov-would-reject-by")
                .map(|v| String::from_utf8_lossy(v).into_owned())
        })
        .collect();
    assert_eq!(stamps, [None, Some("shop/trial".to_owned())]);
    // Both calls of `shop/one` went to the two GETs: no CONNECT spent one.
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(wire.response().await.status, 429);
}

/// `te` is hop-by-hop but for `te: trailers`: each `te` field is judged on
/// its own, on the HTTP/1 path and on hyper's (a handed-over request), so a
/// `te: gzip` behind a `te: trailers` never reaches the upstream.
#[tokio::test]
async fn a_second_te_field_is_not_forwarded_behind_te_trailers() {
    let up = RawUpstream::start().await;
    let agent = agent_before(&up).await;
    for (path, extra) in [
        ("/h1", ""),
        // `upgrade` to anything but websocket: handed to hyper, forwarded as
        // a plain request.
        ("/hyper", "upgrade: x\r\nconnection: upgrade\r\n"),
    ] {
        for te in [["trailers", "gzip"], ["gzip", "trailers"]] {
            let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
            let request = format!(
                "GET {path} HTTP/1.1\r\nhost: x\r\n{extra}te: {}\r\nte: {}\r\n\r\n",
                te[0], te[1]
            );
            wire.send(request.as_bytes()).await;
            assert_eq!(wire.response().await.status, 200, "{request}");
            let received = up.requests();
            let got = received.last().expect("the upstream got the request");
            assert_eq!(got.path(), path);
            assert_eq!(got.count("te"), 1, "{request}: {:?}", got.headers);
            assert_eq!(got.header("te"), Some(&b"trailers"[..]), "{request}");
        }
    }
}
