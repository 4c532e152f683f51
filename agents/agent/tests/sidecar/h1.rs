//! The HTTP/1.1 path at the byte level: pipelining, chunked bodies, keep-alive on
//! both sides, close-delimited responses, hand-over to hyper for what it does not take.

use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{agent, ms, upstream};

/// One response as read off the wire.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A client connection that reads responses by hand.
pub struct Wire {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Wire {
    pub async fn connect(addr: std::net::SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Sends `bytes` to a peer that may have closed; whether they were written.
    pub async fn try_send(&mut self, bytes: &[u8]) -> bool {
        self.stream.write_all(bytes).await.is_ok()
    }

    /// Reads more; `false` at end of stream.
    pub async fn fill(&mut self) -> bool {
        let mut chunk = [0_u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk))
            .await
            .expect("the agent answered within 10 s")
            .unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// Whether the agent closed the connection (nothing more to read).
    pub async fn closed(&mut self) -> bool {
        self.buf.is_empty() && !self.fill().await
    }

    /// The next response, or `None` when the agent closed the connection first.
    pub async fn try_response(&mut self) -> Option<Raw> {
        if self.buf.is_empty() && !self.fill().await {
            return None;
        }
        Some(self.response().await)
    }

    pub async fn response(&mut self) -> Raw {
        self.read_response(false).await
    }

    /// The response to a HEAD request (no body, whatever its length says).
    async fn response_to_head(&mut self) -> Raw {
        self.read_response(true).await
    }

    async fn read_response(&mut self, to_head: bool) -> Raw {
        let (status, headers, len) = loop {
            let mut slots = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut slots);
            if let httparse::Status::Complete(len) = resp.parse(&self.buf).unwrap() {
                let headers = resp
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect::<Vec<_>>();
                break (resp.code.unwrap(), headers, len);
            }
            assert!(
                self.fill().await,
                "connection closed inside a response head"
            );
        };
        self.buf.drain(..len);
        let mut raw = Raw {
            status,
            headers,
            body: Vec::new(),
        };
        if to_head {
            return raw;
        }
        if let Some(n) = raw.header("content-length") {
            let n: usize = n.parse().unwrap();
            while self.buf.len() < n {
                assert!(self.fill().await, "connection closed inside a body");
            }
            raw.body = self.buf.drain(..n).collect();
        } else if raw.header("transfer-encoding") == Some("chunked") {
            loop {
                let line = loop {
                    if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    assert!(self.fill().await);
                };
                let size = usize::from_str_radix(
                    std::str::from_utf8(&self.buf[..line])
                        .unwrap()
                        .split(';')
                        .next()
                        .unwrap(),
                    16,
                )
                .unwrap();
                self.buf.drain(..line + 2);
                while self.buf.len() < size + 2 {
                    assert!(self.fill().await);
                }
                raw.body.extend(self.buf.drain(..size));
                self.buf.drain(..2);
                if size == 0 {
                    break;
                }
            }
        } else if status >= 200 && status != 204 && status != 304 {
            while self.fill().await {}
            raw.body = std::mem::take(&mut self.buf);
        }
        raw
    }
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let up = upstream().fast("/a", ms(0)).fast("/b", ms(0)).start().await;
    let agent = agent().upstream(&up).start().await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b?q=1 HTTP/1.1\r\nhost: x\r\n\r\nHEAD /a HTTP/1.1\r\nhost: x\r\n\r\n")
        .await;
    let a = wire.response().await;
    let b = wire.response().await;
    let head = wire.response_to_head().await;
    assert_eq!((a.status, &a.body[..]), (200, &b"/a"[..]));
    assert_eq!((b.status, &b.body[..]), (200, &b"/b"[..]));
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "a HEAD response has no body");
    assert_eq!(up.received(), 3);
    // Still open: one more request on the same connection.
    wire.send(b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await;
    let last = wire.response().await;
    assert_eq!(last.status, 200);
    assert_eq!(last.header("connection"), Some("close"));
    assert!(
        wire.closed().await,
        "`connection: close` closes after the answer"
    );
}

#[tokio::test]
async fn chunked_request_bodies_stream_through_and_the_connection_stays_open() {
    let up = upstream().echo("/echo").fast("/a", ms(0)).start().await;
    let agent = agent().upstream(&up).start().await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(
        b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n",
    )
    .await;
    // The rest arrives later, split inside the framing.
    tokio::time::sleep(ms(20)).await;
    wire.send(b"7\r\n, wor").await;
    wire.send(b"ld\r\n0\r\nx-trailer: 1\r\n\r\n").await;
    let echo = wire.response().await;
    assert_eq!(echo.status, 200);
    assert_eq!(echo.body, b"hello, world");
    wire.send(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(wire.response().await.body, b"/a");
}

#[tokio::test]
async fn a_rejection_answers_here_and_keeps_the_connection() {
    let up = upstream()
        .fast("/limited", ms(0))
        .fast("/free", ms(0))
        .start()
        .await;
    let agent = agent()
        .config(
            r#"
service: shop
version: h1-v1
rules:
  - name: shop/once
    on: { path: { kind: PATH_KIND_EXACT, value: /limited } }
    limit:
      calls: { amount: 1, window_ms: 3600000 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /limited HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(wire.response().await.status, 200);
    // A small request body is read and dropped with the rejection.
    wire.send(b"POST /limited HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nabcde")
        .await;
    let rejected = wire.response().await;
    assert_eq!(rejected.status, 429);
    assert_eq!(rejected.header("gov-rejected-by"), Some("shop/once"));
    assert_eq!(rejected.header("retry-after"), Some("3600"));
    // The draft-ietf-httpapi-ratelimit-headers pair, from the limit.
    assert_eq!(
        rejected.header("ratelimit-policy"),
        Some("\"shop/once\";q=1;w=3600")
    );
    assert_eq!(
        rejected.header("ratelimit"),
        Some("\"shop/once\";r=0;t=3600")
    );
    assert_eq!(rejected.body, b"rejected by shop/once (limit_calls)\n");
    assert_eq!(rejected.header("connection"), None);
    wire.send(b"GET /free HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!(wire.response().await.body, b"/free");
    assert_eq!(
        up.received(),
        2,
        "the rejected call never reached the upstream"
    );
}

#[tokio::test]
async fn http10_without_a_host_and_upgrade_requests_are_served_by_hyper() {
    let up = upstream().fast("/a", ms(0)).echo("/echo").start().await;
    let agent = agent().upstream(&up).start().await;

    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /a HTTP/1.0\r\n\r\n").await;
    let old = wire.response().await;
    assert_eq!((old.status, &old.body[..]), (200, &b"/a"[..]));

    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
        .await;
    let upgraded = wire.response().await;
    assert_eq!(upgraded.status, 200, "the upgrade is not forwarded");
    // hyper serves the one request the HTTP/1 path checked, then closes: no
    // request reaches the upstream without those checks.
    assert_eq!(upgraded.header("connection"), Some("close"));
    assert!(wire.closed().await);
}

/// An upstream speaking raw HTTP/1.1: each connection answers `per_conn` requests
/// with `response`, then closes without a word: at once if `eager`, else when the
/// next request arrives (as a keep-alive timeout that strikes just then).
/// Counts its connections.
async fn raw_upstream(
    response: &'static [u8],
    per_conn: usize,
    eager: bool,
) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                for answered in 0.. {
                    if eager && answered == per_conn {
                        return;
                    }
                    loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            buf.drain(..i + 4);
                            break;
                        }
                        let mut chunk = [0_u8; 1024];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    if answered == per_conn || s.write_all(response).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// An agent with no rules in front of `upstream` (a raw one).
async fn agent_in_front_of(upstream: std::net::SocketAddr) -> crate::support::Agent {
    agent()
        .upstream(&crate::support::Upstream::at(upstream))
        .start()
        .await
}

#[tokio::test]
async fn a_close_delimited_response_reaches_the_client_which_is_then_closed() {
    let (up, _) = raw_upstream(b"HTTP/1.1 200 OK\r\nx-raw: 1\r\n\r\nuntil the end", 1, true).await;
    let agent = agent_in_front_of(up).await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let raw = wire.response().await;
    assert_eq!(raw.status, 200);
    assert_eq!(raw.header("x-raw"), Some("1"));
    assert_eq!(raw.header("connection"), Some("close"));
    assert_eq!(raw.body, b"until the end");
}

#[tokio::test]
async fn a_kept_alive_upstream_connection_that_was_closed_is_replaced_for_idempotent_calls() {
    // One answer per upstream connection, and no `connection: close` to say so: the
    // next request finds the connection open and then closed under it.
    let (up, accepted) =
        raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 1, false).await;
    let agent = agent_in_front_of(up).await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    for _ in 0..3 {
        wire.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let raw = wire.response().await;
        assert_eq!((raw.status, &raw.body[..]), (200, &b"ok"[..]));
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        3,
        "sent again on a new connection"
    );
    // A POST is not sent twice: the stale connection is a 502.
    wire.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nx")
        .await;
    let raw = wire.response().await;
    assert_eq!(raw.status, 502);
}

#[tokio::test]
async fn an_upstream_response_with_interim_heads_and_chunks_passes_through() {
    let (up, _) = raw_upstream(
        b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>\r\n\r\nHTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\nkeep-alive: timeout=5\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        8,
        false,
    )
    .await;
    let agent = agent_in_front_of(up).await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    for _ in 0..2 {
        wire.send(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let early = wire.response().await;
        assert_eq!(early.status, 103);
        assert_eq!(early.header("link"), Some("</a.css>"));
        let created = wire.response().await;
        assert_eq!(created.status, 201);
        assert_eq!(created.body, b"abc");
        assert_eq!(created.header("keep-alive"), None, "hop-by-hop");
    }
}

#[tokio::test]
async fn clients_that_close_after_each_request_still_reuse_upstream_connections() {
    let (up, accepted) = raw_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        100,
        false,
    )
    .await;
    let agent = agent_in_front_of(up).await;
    for _ in 0..5 {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await;
        assert_eq!(wire.response().await.body, b"ok");
        assert!(wire.closed().await);
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one upstream connection served five client connections"
    );
}

#[tokio::test]
async fn an_upstream_connection_closed_while_idle_is_not_used_again() {
    // The upstream closes each connection right after its answer.
    let (up, accepted) =
        raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 1, true).await;
    let agent = agent_in_front_of(up).await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    for expected in 1..=3 {
        wire.send(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\nx")
            .await;
        assert_eq!(
            wire.response().await.status,
            200,
            "not sent on a closed one"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), expected);
        // Let the upstream's close reach the agent.
        tokio::time::sleep(ms(50)).await;
    }
}

#[tokio::test]
async fn the_outbound_listener_takes_absolute_form_requests_like_an_http_proxy() {
    let inventory = upstream().fast("/who", ms(0)).start().await;
    let local = upstream().start().await;
    let agent = agent()
        .upstream(&local)
        .instances("inventory", &[&inventory])
        .start()
        .await;
    let mut wire = Wire::connect(agent.sidecar.outbound_addr().unwrap()).await;
    // As a client with `http_proxy` pointing at the outbound listener sends it.
    wire.send(b"GET http://inventory:8080/who?x=1 HTTP/1.1\r\nhost: inventory:8080\r\n\r\n")
        .await;
    let reply = wire.response().await;
    assert_eq!((reply.status, &reply.body[..]), (200, &b"/who"[..]));
    assert_eq!(inventory.received(), 1);
}

#[tokio::test]
async fn a_malformed_chunked_body_gets_a_400_and_the_connection_closes() {
    let up = upstream().echo("/echo").start().await;
    let agent = agent().upstream(&up).start().await;
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    wire.send(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
        .await;
    let reply = wire.response().await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.header("connection"), Some("close"));
    assert!(wire.closed().await);
}
