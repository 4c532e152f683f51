//! Bounds on hyper's side of the proxy listeners, with real sockets: an idle
//! HTTP/2 connection is closed, a client address holds at most its own cap of
//! connections, and an HTTP/2 request has at most the HTTP/1 path's 100 header
//! fields.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::h1::Wire;
use crate::support::{Agent, http, ms, upstream};

/// The HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 section
/// 3.4): what an h2c client sends before it goes quiet.
const H2C_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Reads until the agent closes `conn`; `false` if it is still open after 10 s
/// (a bound for a stuck test, not a speed).
async fn closed_by_agent(conn: &mut TcpStream) -> bool {
    let mut chunk = [0_u8; 1024];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

async fn metric(agent: &Agent, name: &str) -> String {
    let metrics = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}{{listener=\"inbound\"}} ")))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("{name} is exposed: {metrics}"))
}

async fn h2_get(agent: &Agent, headers: usize) -> u16 {
    h2_answer(agent, headers).await.0
}

/// The status and body of an h2c `GET /a` with `headers` fields of its own.
async fn h2_answer(agent: &Agent, headers: usize) -> (u16, String) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut req = Request::get(agent.url("/a"));
    for i in 0..headers {
        req = req.header(format!("x-h{i}"), "1");
    }
    let response = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.version(), http::Version::HTTP_2);
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn idle_h2c_connections_are_closed_and_a_legit_client_is_then_served() {
    let up = upstream().fast("/a", ms(0)).start().await;
    let agent = crate::support::agent()
        .upstream(&up)
        .max_connections(50)
        .max_connections_per_client(50)
        .header_read_timeout(ms(300))
        .start()
        .await;
    let mut idle = Vec::new();
    for _ in 0..50 {
        let mut conn = TcpStream::connect(agent.sidecar.inbound_addr())
            .await
            .unwrap();
        conn.write_all(H2C_HELLO).await.unwrap();
        idle.push(conn);
    }
    // The cap is full: one more is closed at accept.
    let mut over = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    assert!(closed_by_agent(&mut over).await);
    for conn in &mut idle {
        assert!(
            closed_by_agent(conn).await,
            "an idle h2c connection is closed"
        );
    }
    // The slots are free again: a real client is served, over h2c.
    let mut served = false;
    for _ in 0..100 {
        if metric(&agent, "gov_agent_connections_open").await == "0" {
            served = h2_get(&agent, 1).await == 200;
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    assert!(
        served,
        "a legit client is served once the idle ones are closed"
    );
}

#[tokio::test]
async fn one_client_address_holds_at_most_its_cap_of_connections() {
    let up = upstream().fast("/a", ms(0)).start().await;
    let agent = crate::support::agent()
        .upstream(&up)
        .max_connections_per_client(3)
        .start()
        .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
        wire.send(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert_eq!(wire.response().await.status, 200);
        held.push(wire);
    }
    // The fourth from 127.0.0.1 is closed at accept, before a byte is read.
    let mut fourth = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    assert!(closed_by_agent(&mut fourth).await);
    assert_eq!(
        metric(&agent, "gov_agent_connections_over_client_cap_total").await,
        "1"
    );
    // Another address is another client.
    let other = TcpSocket::new_v4().unwrap();
    other.bind(SocketAddr::from(([127, 0, 0, 2], 0))).unwrap();
    let mut conn = other.connect(agent.sidecar.inbound_addr()).await.unwrap();
    conn.write_all(b"GET /a HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await.unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 200"), "{answer:?}");
    // A slot of 127.0.0.1 frees when one of its connections closes.
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
        tokio::time::sleep(ms(20)).await;
    }
    assert!(served);
}

#[tokio::test]
async fn an_h2_request_with_more_than_100_header_fields_is_refused_with_431() {
    let up = upstream().fast("/a", ms(0)).start().await;
    let agent = crate::support::agent().upstream(&up).start().await;
    // 97 and the agent's `host` and `x-forwarded-for`: the upstream's own bound
    // (hyper's 100) is not met either.
    assert_eq!(h2_get(&agent, 97).await, 200);
    // Refused by the agent, the stream only (not by the upstream's own bound).
    for fields in [101, 150] {
        let (status, body) = h2_answer(&agent, fields).await;
        assert_eq!(status, 431, "{fields}");
        assert_eq!(
            body, "gov-agent: the request head is too large\n",
            "{fields}"
        );
    }
    assert_eq!(h2_get(&agent, 1).await, 200, "the connection still serves");
    assert_eq!(
        up.received(),
        2,
        "only the requests within the bound went upstream"
    );
}
