//! WebSocket through the agent (issue 37): a real WebSocket echo server (Python's
//! `websockets`) behind it, raw frames in front. The upgrade is judged by the
//! rules like any call, a tunnel holds its bulkhead permit for its life and is
//! counted in `/metrics`; an upgrade with a body, one the upstream refuses,
//! and one to anything but `websocket` never become a tunnel.
//!
//! The echo server is a `python3` that imports `websockets` (Debian's
//! `python3-websockets`, which `.ci/run` installs); without it those tests say
//! so and pass.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::protocols::python_with;
use crate::support::{Agent, Upstream, agent, http, ms, upstream};

/// A private WebSocket echo server on loopback, killed on drop.
struct Echo {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Echo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const ECHO_SERVER: &str = r#"
import asyncio, websockets

async def echo(ws, path=None):
    async for message in ws:
        await ws.send(message)

async def main():
    async with websockets.serve(echo, "127.0.0.1", 0) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()

asyncio.run(main())
"#;

impl Echo {
    fn start() -> Option<Echo> {
        let Some(python) = python_with(&["websockets"]) else {
            eprintln!("SKIPPED: no python3 imports websockets (Debian: python3-websockets)");
            return None;
        };
        let mut child = Command::new(python)
            .args(["-c", ECHO_SERVER])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .trim()
            .parse()
            .expect("the echo server prints its port");
        Some(Echo {
            child,
            addr: ([127, 0, 0, 1], port).into(),
        })
    }
}

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

/// Sends `head` to `addr`; the response head (up to its blank line) and the
/// open connection.
async fn ask(addr: SocketAddr, head: &str) -> (String, TcpStream) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut byte))
            .await
            .expect("a response head within 10 s")
            .unwrap();
        assert!(
            n == 1,
            "closed before a response head: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.push(byte[0]);
    }
    (String::from_utf8(got).unwrap(), conn)
}

fn upgrade_head(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nhost: shop\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: {KEY}\r\nsec-websocket-version: 13\r\n\r\n"
    )
}

/// One masked text frame out, one text frame back: the echo.
async fn echo(conn: &mut TcpStream, text: &str) -> String {
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | u8::try_from(text.len()).unwrap()];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    conn.write_all(&frame).await.unwrap();
    let mut head = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut head))
        .await
        .expect("an echo within 10 s")
        .unwrap();
    assert_eq!(head[0], 0x81, "a text frame");
    let mut payload = vec![0u8; usize::from(head[1] & 0x7f)];
    conn.read_exact(&mut payload).await.unwrap();
    String::from_utf8(payload).unwrap()
}

/// The value of `name` on the inbound listener for upgrades from `protocol`
/// (`http1`, `h2`).
async fn metric(agent: &Agent, name: &str, protocol: &str) -> String {
    let text = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    let prefix = format!("{name}{{listener=\"inbound\",protocol=\"{protocol}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} in /metrics"))
        .to_owned()
}

/// Reads until the agent closes the connection (bounded); what came.
async fn until_closed(conn: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest))
        .await
        .expect("the agent closes the connection within 10 s")
        .ok();
    rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_echoes_through_the_agent_until_its_upgrade_limit_is_spent() {
    let Some(server) = Echo::start() else { return };
    let up = Upstream::at(server.addr);
    let agent = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/ws
    on: { path: { kind: PATH_KIND_EXACT, value: /ws } }
    limit:
      calls: { amount: 2, window_ms: 3600000 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let addr = agent.sidecar.inbound_addr();
    let (head, mut first) = ask(addr, &upgrade_head("/ws")).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(echo(&mut first, "hello").await, "hello");
    assert_eq!(echo(&mut first, "again").await, "again");
    let (head, mut second) = ask(addr, &upgrade_head("/ws")).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(echo(&mut second, "two").await, "two");
    assert_eq!(
        metric(&agent, "gov_agent_upgraded_connections_open", "http1").await,
        "2"
    );
    assert_eq!(
        metric(&agent, "gov_agent_upgraded_connections_total", "http1").await,
        "2"
    );
    assert_eq!(
        metric(&agent, "gov_agent_upgraded_connections_open", "h2").await,
        "0"
    );
    // The limit is spent: the third upgrade is a rejection, no tunnel.
    let (head, mut third) = ask(addr, &upgrade_head("/ws")).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(head.contains("gov-rejected-by: shop/ws"), "{head}");
    let _ = until_closed(&mut third).await;
    // The open ones still echo.
    assert_eq!(echo(&mut first, "still").await, "still");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_holds_its_bulkhead_permit_for_its_life() {
    let Some(server) = Echo::start() else { return };
    let up = Upstream::at(server.addr);
    let agent = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/one_socket
    on: { path: { kind: PATH_KIND_EXACT, value: /ws } }
    bulkhead:
      max_concurrent: 1
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let addr = agent.sidecar.inbound_addr();
    let (head, mut open) = ask(addr, &upgrade_head("/ws")).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(echo(&mut open, "hi").await, "hi");
    // Its permit is held while it is open, however long after the 101.
    tokio::time::sleep(ms(200)).await;
    let (head, _) = ask(addr, &upgrade_head("/ws")).await;
    assert!(head.contains("gov-rejected-by: shop/one_socket"), "{head}");
    drop(open);
    // Closed: the permit comes back once the agent has seen the close.
    let mut admitted = false;
    for _ in 0..100 {
        let (head, mut conn) = ask(addr, &upgrade_head("/ws")).await;
        if head.starts_with("HTTP/1.1 101") {
            assert_eq!(echo(&mut conn, "back").await, "back");
            admitted = true;
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    assert!(admitted, "the permit came back when the socket closed");
}

/// An upgrade request with a body: the body could be read as the first
/// frames or as a request smuggled past the engine. Refused, closed, and the
/// upstream sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_with_a_body_is_refused() {
    let up = upstream().fast("/", ms(0)).start().await;
    let agent = agent().upstream(&up).start().await;
    let addr = agent.sidecar.inbound_addr();
    for framing in ["content-length: 40\r\n", "transfer-encoding: chunked\r\n"] {
        let head = upgrade_head("/ws").replace("\r\n\r\n", &format!("\r\n{framing}\r\n"));
        let smuggled = "GET /secret HTTP/1.1\r\nhost: shop\r\n\r\n";
        let (answer, mut conn) = ask(addr, &format!("{head}{smuggled}")).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{framing}: {answer}");
        let _ = until_closed(&mut conn).await;
    }
    assert_eq!(up.received(), 0);
}

/// The upstream answers an upgrade with an ordinary response: no tunnel, the
/// connection closes after it, and what the client sends next never reaches
/// the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_the_upstream_refuses_is_no_tunnel() {
    let up = upstream().fast("/ws", ms(0)).start().await;
    let agent = agent().upstream(&up).start().await;
    let (head, mut conn) = ask(agent.sidecar.inbound_addr(), &upgrade_head("/ws")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let _ = conn
        .write_all(b"GET /secret HTTP/1.1\r\nhost: shop\r\n\r\n")
        .await;
    let _ = until_closed(&mut conn).await;
    assert_eq!(
        up.received(),
        1,
        "only the upgrade request reached the upstream"
    );
}

/// `upgrade: h2c` would carry HTTP/2 requests the engine never judged: the
/// agent removes it, and a `101` the upstream sends anyway (to that, or to a
/// request that asked for nothing) is a 502, never a tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_anything_but_websocket_or_an_unasked_101_is_no_tunnel() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let heads_tx = heads_tx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = heads_tx.send(String::from_utf8_lossy(&got).into_owned());
                let _ = conn
                    .write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n")
                    .await;
                // Then anything that comes is "echoed", as a tunnel would.
                while let Ok(n) = conn.read(&mut buf).await {
                    if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let up = Upstream::at(addr);
    let agent = agent().upstream(&up).start().await;
    let h2c = "GET /x HTTP/1.1\r\nhost: shop\r\nupgrade: h2c\r\nconnection: Upgrade, HTTP2-Settings\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    for request in [h2c, "GET /y HTTP/1.1\r\nhost: shop\r\n\r\n"] {
        let (head, mut conn) = ask(agent.sidecar.inbound_addr(), request).await;
        assert!(head.starts_with("HTTP/1.1 502"), "{head}");
        let _ = conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        // The connection closes (hyper's side) or reads the bytes as what
        // comes next (the agent's HTTP/1 path: an HTTP/2 preface); either
        // way nothing reaches the upstream or comes back from it.
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), conn.read_to_end(&mut rest)).await;
        assert!(!rest.windows(3).any(|w| w == b"PRI"), "nothing echoed back");
        let seen = heads.recv().await.unwrap().to_ascii_lowercase();
        assert!(!seen.contains("upgrade"), "{seen}");
        assert!(!seen.contains("http2-settings"), "{seen}");
    }
    assert!(
        heads.try_recv().is_err(),
        "no other request reached the upstream"
    );
}

/// A masked text frame carrying `text` (client to server, RFC 6455 5.3).
fn masked(text: &str) -> bytes::Bytes {
    let mask = [9u8, 8, 7, 6];
    let mut frame = vec![0x81, 0x80 | u8::try_from(text.len()).unwrap()];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame.into()
}

/// An HTTP/2 WebSocket on `client`: the extended CONNECT (RFC 8441) to
/// `path` with `:protocol`; its response and the stream's two halves.
async fn h2_connect(
    client: &h2::client::SendRequest<bytes::Bytes>,
    protocol: &'static str,
    path: &str,
) -> (http::Response<h2::RecvStream>, h2::SendStream<bytes::Bytes>) {
    let mut req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(format!("http://shop{path}"))
        .header("sec-websocket-version", "13")
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(h2::ext::Protocol::from_static(protocol));
    let mut client = client.clone().ready().await.unwrap();
    let (response, send) = client.send_request(req, false).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("a response within 10 s")
        .unwrap();
    (response, send)
}

/// One frame out on `send`, its echo back on `recv`.
async fn h2_echo(
    send: &mut h2::SendStream<bytes::Bytes>,
    recv: &mut h2::RecvStream,
    text: &str,
) -> String {
    send.send_data(masked(text), false).unwrap();
    let mut got = Vec::new();
    while got.len() < 2 || got.len() < 2 + usize::from(got[1] & 0x7f) {
        let data = tokio::time::timeout(Duration::from_secs(10), recv.data())
            .await
            .expect("an echo within 10 s")
            .expect("the stream stays open")
            .unwrap();
        let _ = recv.flow_control().release_capacity(data.len());
        got.extend_from_slice(&data);
    }
    assert_eq!(got[0], 0x81, "a text frame");
    String::from_utf8(got[2..].to_vec()).unwrap()
}

/// WebSocket over HTTP/2 (issue 37): the agent's h2c listener announces
/// extended CONNECT; `:protocol websocket` is judged by the rules like the
/// HTTP/1.1 upgrade (the same rule, by path), bridged to the upstream as an
/// HTTP/1.1 upgrade, answered 200, and echoes both ways; counted per protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_websocket_echoes_through_the_agent_until_its_upgrade_limit_is_spent() {
    let Some(server) = Echo::start() else { return };
    let up = Upstream::at(server.addr);
    let agent = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/ws
    on: { path: { kind: PATH_KIND_EXACT, value: /ws } }
    limit:
      calls: { amount: 2, window_ms: 3600000 }
"#,
        )
        .upstream(&up)
        .start()
        .await;
    let tcp = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    for _ in 0..200 {
        if client.is_extended_connect_protocol_enabled() {
            break;
        }
        tokio::time::sleep(ms(10)).await;
        client = client.ready().await.unwrap();
    }
    assert!(
        client.is_extended_connect_protocol_enabled(),
        "the agent announces SETTINGS_ENABLE_CONNECT_PROTOCOL"
    );
    let (first, mut first_tx) = h2_connect(&client, "websocket", "/ws").await;
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("sec-websocket-accept").is_none());
    assert!(first.headers().get("upgrade").is_none());
    let mut first_rx = first.into_body();
    assert_eq!(
        h2_echo(&mut first_tx, &mut first_rx, "hello").await,
        "hello"
    );
    let (second, mut second_tx) = h2_connect(&client, "websocket", "/ws").await;
    assert_eq!(second.status(), 200);
    let mut second_rx = second.into_body();
    assert_eq!(h2_echo(&mut second_tx, &mut second_rx, "two").await, "two");
    assert_eq!(
        metric(&agent, "gov_agent_upgraded_connections_open", "h2").await,
        "2"
    );
    assert_eq!(
        metric(&agent, "gov_agent_upgraded_connections_total", "h2").await,
        "2"
    );
    assert_eq!(
        metric(&agent, "gov_agent_upgraded_connections_total", "http1").await,
        "0"
    );
    // The limit is spent: the third is a rejection, on its stream only.
    let (third, _tx) = h2_connect(&client, "websocket", "/ws").await;
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers().get("gov-rejected-by").unwrap(), "shop/ws");
    assert_eq!(
        h2_echo(&mut first_tx, &mut first_rx, "still").await,
        "still"
    );
    // Closing a stream closes its tunnel.
    first_tx.send_data(bytes::Bytes::new(), true).unwrap();
    drop((first_tx, first_rx));
    let mut closed = false;
    for _ in 0..200 {
        if metric(&agent, "gov_agent_upgraded_connections_open", "h2").await == "1" {
            closed = true;
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert!(closed, "the ended stream's tunnel closed");
    assert_eq!(h2_echo(&mut second_tx, &mut second_rx, "on").await, "on");
    connection.abort();
}

/// Any other CONNECT over HTTP/2 is refused on its stream and reaches no
/// upstream: an extended CONNECT to another protocol, and a plain one
/// (authority-form, a TCP tunnel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_h2_connects_are_refused() {
    let up = upstream().fast("/", ms(0)).start().await;
    let agent = agent().upstream(&up).start().await;
    let tcp = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    for _ in 0..200 {
        if client.is_extended_connect_protocol_enabled() {
            break;
        }
        tokio::time::sleep(ms(10)).await;
        client = client.ready().await.unwrap();
    }
    let (other, _tx) = h2_connect(&client, "connect-udp", "/x").await;
    assert_eq!(other.status(), 400);
    let req = http::Request::builder()
        .method(http::Method::CONNECT)
        .uri("upstream.example:443")
        .body(())
        .unwrap();
    let (response, _tx) = client
        .clone()
        .ready()
        .await
        .unwrap()
        .send_request(req, false)
        .unwrap();
    assert_eq!(response.await.unwrap().status(), 400);
    assert_eq!(up.received(), 0);
    connection.abort();
}
