//! Clients that leave an admitted call (a closed connection, an HTTP/2
//! `RST_STREAM`) do not free its bulkhead permit while the upstream still
//! works on it: the upstream here works like a servlet container (a reset
//! does not stop the work) and counts what it is working on, and that count
//! never passes `max_concurrent`, whatever the client does.

use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::support::{Agent, Upstream, agent, http, ms, upstream};

/// Five at a time on `/work`, no wait.
const FIVE: &str = r#"
service: shop
version: client-gone-v1
rules:
  - name: shop/five
    on: { path: { kind: PATH_KIND_PREFIX, value: /work } }
    bulkhead:
      max_concurrent: 5
"#;

/// How long the upstream works on each call.
const WORK: Duration = Duration::from_millis(400);

async fn start() -> (Upstream, Agent) {
    let up = upstream().working("/work", WORK).start().await;
    let agent = agent().config(FIVE).upstream(&up).start().await;
    (up, agent)
}

/// After an attack: the upstream finishes what it had, every permit comes
/// back (a call is admitted again). Returns the calls the agent counted as
/// their client gone. (An `Expect` client that leaves before its body is not
/// seen to: its body fails, which the upstream learns only when it answers or
/// gives up on the body, and the agent waits for that.)
async fn settles(up: &Upstream, agent: &Agent) -> u64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while up.in_flight("/work") > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upstream never finished"
        );
        tokio::time::sleep(ms(20)).await;
    }
    let mut answered = None;
    while tokio::time::Instant::now() < deadline {
        let reply = http().get(&agent.url("/work")).await.unwrap();
        if reply.status == 200 {
            answered = Some(reply.status.as_u16());
            break;
        }
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(answered, Some(200), "every permit came back");
    let metrics = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    let gone: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("gov_agent_calls_client_gone_total{listener=\"inbound\"} "))
        .and_then(|v| v.parse().ok())
        .expect("the client-gone counter is exposed");
    gone
}

/// Sends `request` on `n` connections, each closed 2 ms after its request.
async fn send_and_leave(agent: &Agent, request: &'static [u8], n: usize) {
    let addr = agent.sidecar.inbound_addr();
    for _ in 0..n {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        tokio::time::sleep(ms(2)).await;
        drop(stream);
    }
}

/// HTTP/1.0 without a host goes to hyper (with one, to the HTTP/1 path,
/// which notices the client gone only when it answers: below).
#[tokio::test]
async fn http10_clients_that_leave_keep_their_permits_until_the_upstream_is_done() {
    let (up, agent) = start().await;
    send_and_leave(&agent, b"GET /work HTTP/1.0\r\n\r\n", 40).await;
    let gone = settles(&up, &agent).await;
    assert!(
        up.peak_in_flight("/work") <= 5,
        "peak at the upstream: {}",
        up.peak_in_flight("/work")
    );
    assert!(gone >= 1, "the calls whose client left are counted");
}

/// On the HTTP/1 path, clients that leave inside their request body (the
/// upstream has the head and works on it): the call goes on, its permit held,
/// until the upstream answers (it used to be released at once: 40 calls at
/// the upstream behind `max_concurrent 5`).
#[tokio::test]
async fn clients_that_leave_inside_their_body_keep_their_permits_until_the_upstream_is_done() {
    for request in [
        &b"POST /work HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhel"[..],
        b"POST /work HTTP/1.0\r\nhost: x\r\nconnection: keep-alive\r\ncontent-length: 5\r\n\r\nhel",
        b"POST /work HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
    ] {
        let (up, agent) = start().await;
        send_and_leave(&agent, request, 40).await;
        let gone = settles(&up, &agent).await;
        let show = String::from_utf8_lossy(request);
        assert!(
            up.peak_in_flight("/work") <= 5,
            "peak at the upstream: {}, for {show}",
            up.peak_in_flight("/work")
        );
        assert!(
            gone >= 1,
            "the calls whose client left are counted, for {show}"
        );
    }
}

#[tokio::test]
async fn expect_continue_clients_that_leave_keep_their_permits_until_the_upstream_is_done() {
    let (up, agent) = start().await;
    send_and_leave(
        &agent,
        b"POST /work HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n",
        40,
    )
    .await;
    settles(&up, &agent).await;
    assert!(
        up.peak_in_flight("/work") <= 5,
        "peak at the upstream: {}",
        up.peak_in_flight("/work")
    );
}

/// A paced Rapid Reset: HEADERS with END_STREAM, 1 ms, RST_STREAM(CANCEL),
/// again and again on one h2c connection.
#[tokio::test]
async fn h2c_streams_reset_after_their_request_keep_their_permits_until_the_upstream_is_done() {
    let (up, agent) = start().await;
    let addr = agent.sidecar.inbound_addr();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    // On a busy machine the server may not accept the streams as fast as
    // they are reset: past 20 reset before being accepted, h2's own Rapid
    // Reset defence ends the connection (GOAWAY ENHANCE_YOUR_CALM). That is
    // a defence working, not a failure: the calls sent until then must still
    // hold their permits.
    let mut sent = 0;
    for _ in 0..60 {
        let Ok(mut client) = client.clone().ready().await else {
            break;
        };
        let request = http::Request::get(format!("http://{addr}/work"))
            .body(())
            .unwrap();
        let Ok((_response, mut stream)) = client.send_request(request, true) else {
            break;
        };
        sent += 1;
        tokio::time::sleep(ms(1)).await;
        stream.send_reset(h2::Reason::CANCEL);
    }
    assert!(sent > 5, "only {sent} streams before the connection ended");
    let gone = settles(&up, &agent).await;
    assert!(
        up.peak_in_flight("/work") <= 5,
        "peak at the upstream: {}",
        up.peak_in_flight("/work")
    );
    assert!(gone >= 1, "the calls whose client left are counted");
    drop(client);
    connection.abort();
}

/// A wide bulkhead: every call is admitted.
const WIDE: &str = r#"
service: shop
version: client-gone-wide-v1
rules:
  - name: shop/wide
    on: { path: { kind: PATH_KIND_PREFIX, value: /work } }
    bulkhead:
      max_concurrent: 1000
"#;

/// More than 100 admitted calls abandoned in a second: the agent closes the
/// connection (GOAWAY), counts it, and the calls already at the upstream
/// still finish. Every stream is at the upstream before any is reset, so
/// neither a busy machine's pace nor h2's own defence against streams reset
/// before they are accepted (which would end the connection first, and
/// uncounted) decides the outcome.
#[tokio::test]
async fn an_h2c_connection_that_abandons_admitted_calls_over_its_budget_is_closed() {
    const STREAMS: u64 = 150;
    let up = upstream().gated("/work").start().await;
    let agent = agent().config(WIDE).upstream(&up).start().await;
    let addr = agent.sidecar.inbound_addr();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let mut client = client
            .clone()
            .ready()
            .await
            .expect("the connection is open");
        let request = http::Request::get(format!("http://{addr}/work"))
            .body(())
            .unwrap();
        let (response, stream) = client.send_request(request, true).expect("a stream opens");
        streams.push((response, stream));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while up.in_flight("/work") < STREAMS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {STREAMS} calls reached the upstream",
            up.in_flight("/work")
        );
        tokio::time::sleep(ms(10)).await;
    }
    // The budget counts in seconds from the connection's start: past the
    // first, the burst falls in one second of its own.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (_, stream) in &mut streams {
        stream.send_reset(h2::Reason::CANCEL);
    }
    let closed = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(closed.is_ok(), "the connection ends");
    let refused = match client.clone().ready().await {
        Err(_) => true,
        Ok(mut client) => {
            let request = http::Request::get(format!("http://{addr}/work"))
                .body(())
                .unwrap();
            client.send_request(request, true).is_err()
        }
    };
    assert!(refused, "a closed connection takes no new call");
    assert_eq!(
        up.in_flight("/work"),
        STREAMS,
        "the abandoned calls are still at the upstream"
    );
    up.open_gate();
    let gone = settles(&up, &agent).await;
    assert!(gone > 100, "{gone} abandoned calls counted");
    let metrics = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_connections_closed_abandoning_total{listener=\"inbound\"} 1\n"),
        "{metrics}"
    );
}
