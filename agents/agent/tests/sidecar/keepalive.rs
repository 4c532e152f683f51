//! HTTP/1.0 keep-alive and `Expect: 100-continue` on the HTTP/1 path (issue 37):
//! both used to go to hyper for one request and close the connection (an
//! HTTP/1.0 client that asked to persist got `connection: close, keep-alive`;
//! curl, which sends `Expect` with every upload over 1 KiB, reconnected each
//! time). Now they persist as nginx's do, and the hostile variants stay refused
//! or closed.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::h1::Wire;
use crate::support::{agent, ms, upstream};

const LIMITED: &str = r#"
service: shop
version: keepalive-v1
rules:
  - name: shop/once
    on: { path: { kind: PATH_KIND_EXACT, value: /limited } }
    limit:
      calls: { amount: 1, window_ms: 3600000 }
"#;

/// An upstream that answers every request with a chunked body (and a trailer),
/// keeping its connections open.
async fn chunked_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    while let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..i + 4);
                        let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-t\r\n\r\n5\r\nhello\r\n6;e=1\r\n world\r\n0\r\nx-t: 1\r\n\r\n";
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                    let mut chunk = [0_u8; 1024];
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn http10_keep_alive_is_kept_as_nginx_does() {
    let up = upstream()
        .fast("/a", ms(0))
        .fast("/limited", ms(0))
        .echo("/echo")
        .start()
        .await;
    let agent = agent().config(LIMITED).upstream(&up).start().await;
    let addr = agent.sidecar.inbound_addr();

    // Two requests (and a rejection, and a body) on one HTTP/1.0 connection,
    // each answered `connection: keep-alive` on the same socket.
    let mut wire = Wire::connect(addr).await;
    for (request, status, body) in [
        (
            &b"GET /a HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\n"[..],
            200,
            &b"/a"[..],
        ),
        (
            b"GET /a HTTP/1.0\r\nHost: x\r\nConnection: Keep-Alive\r\n\r\n",
            200,
            b"/a",
        ),
        (
            b"POST /echo HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\ncontent-length: 5\r\n\r\nhello",
            200,
            b"hello",
        ),
        (
            b"GET /limited HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\n",
            200,
            b"/limited",
        ),
        (
            b"GET /limited HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\n",
            429,
            b"rejected by shop/once (limit_calls)\n",
        ),
    ] {
        wire.send(request).await;
        let reply = wire.response().await;
        let show = String::from_utf8_lossy(request);
        assert_eq!((reply.status, &reply.body[..]), (status, body), "{show}");
        assert_eq!(reply.header("connection"), Some("keep-alive"), "{show}");
    }
    // Without `keep-alive` the answer closes the connection.
    wire.send(b"GET /a HTTP/1.0\r\nhost: x\r\n\r\n").await;
    let last = wire.response().await;
    assert_eq!(
        (last.status, last.header("connection")),
        (200, Some("close"))
    );
    assert!(wire.closed().await, "HTTP/1.0 without keep-alive closes");

    // `keep-alive, close`: close wins.
    let mut wire = Wire::connect(addr).await;
    wire.send(b"GET /a HTTP/1.0\r\nhost: x\r\nconnection: keep-alive, close\r\n\r\nGET /a HTTP/1.0\r\nhost: x\r\n\r\n")
        .await;
    let reply = wire.response().await;
    assert_eq!(
        (reply.status, reply.header("connection")),
        (200, Some("close"))
    );
    assert!(wire.closed().await, "`close` wins over `keep-alive`");

    // A chunked request body in HTTP/1.0 is refused (RFC 9112 section 6.1),
    // and what followed it is never read as a request.
    let mut wire = Wire::connect(addr).await;
    wire.send(b"POST /echo HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\nGET /limited HTTP/1.0\r\nhost: x\r\n\r\n")
        .await;
    assert_eq!(wire.response().await.status, 400);
    assert!(wire.closed().await);
    assert_eq!(up.received(), 6, "the refused stream reached no upstream");
}

/// A chunked response goes to an HTTP/1.0 client as its payload alone, ended
/// by closing the connection (it knows no chunked framing): never kept alive.
#[tokio::test]
async fn a_response_without_a_length_closes_an_http10_connection() {
    let up = crate::support::Upstream::at(chunked_upstream().await);
    let agent = agent().upstream(&up).start().await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /c HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\nGET /c HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\n\r\n")
        .await;
    let reply = wire.response().await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("transfer-encoding"), None);
    assert_eq!(reply.header("content-length"), None);
    assert_eq!(reply.header("trailer"), None);
    assert_eq!(reply.header("connection"), Some("close"));
    // `response` read it to the close: the payload, nothing of the framing,
    // and no second answer.
    assert_eq!(reply.body, b"hello world");
    // An HTTP/1.1 client on the same upstream gets the chunks as they came.
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /c HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let reply = wire.response().await;
    assert_eq!(reply.header("transfer-encoding"), Some("chunked"));
    assert_eq!(reply.body, b"hello world");
}

/// Reads the next response head (up to its blank line) off `wire`'s stream.
async fn interim(wire: &mut Wire) -> u16 {
    wire.response().await.status
}

#[tokio::test]
async fn expect_100_continue_keeps_the_connection_and_a_rejection_closes_it() {
    let up = upstream()
        .echo("/echo")
        .fast("/limited", ms(0))
        .start()
        .await;
    let agent = agent().config(LIMITED).upstream(&up).start().await;
    let addr = agent.sidecar.inbound_addr();

    // Three uploads with `Expect` on one connection: `100 Continue`, the body,
    // the answer, and the connection stays.
    let mut wire = Wire::connect(addr).await;
    for i in 0..3 {
        let body = format!("upload {i}");
        wire.send(
            format!(
                "POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await;
        assert_eq!(interim(&mut wire).await, 100, "upload {i}");
        wire.send(body.as_bytes()).await;
        let reply = wire.response().await;
        assert_eq!((reply.status, &reply.body[..]), (200, body.as_bytes()));
        assert_eq!(reply.header("connection"), None, "upload {i}");
    }
    // A client that sends its body without waiting gets no `100`.
    wire.send(
        b"POST /echo HTTP/1.1\r\nhost: x\r\nExpect: 100-Continue\r\ncontent-length: 2\r\n\r\nhi",
    )
    .await;
    let reply = wire.response().await;
    assert_eq!((reply.status, &reply.body[..]), (200, &b"hi"[..]));
    // Chunked, and with no body at all.
    wire.send(b"POST /echo HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ntransfer-encoding: chunked\r\n\r\n")
        .await;
    assert_eq!(interim(&mut wire).await, 100);
    wire.send(b"3\r\nabc\r\n0\r\n\r\n").await;
    assert_eq!(wire.response().await.body, b"abc");
    wire.send(b"GET /limited HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n\r\n")
        .await;
    let reply = wire.response().await;
    assert_eq!(reply.status, 200, "no body: no `100`, the answer");

    // Rejected by a rule before the body: the answer, no `100`, and the
    // connection closes (the client may send its body or not: RFC 9110 10.1.1);
    // a body that looks like a request is never read as one.
    wire.send(
        b"POST /limited HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 31\r\n\r\n",
    )
    .await;
    let reply = wire.response().await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("connection"), Some("close"));
    let _ = wire
        .try_send(b"GET /limited HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    assert!(
        wire.closed().await,
        "the rejected upload's connection closed"
    );
    assert_eq!(up.received(), 6, "the rejected upload never went upstream");

    // An HTTP/1.0 client's `Expect` is ignored (RFC 9110 10.1.1): no `100`.
    let mut wire = Wire::connect(addr).await;
    wire.send(
        b"POST /echo HTTP/1.0\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
    )
    .await;
    tokio::time::sleep(ms(100)).await;
    wire.send(b"ok").await;
    let reply = wire.response().await;
    assert_eq!((reply.status, &reply.body[..]), (200, &b"ok"[..]));
}
