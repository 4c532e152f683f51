//! The consumer header and the headers rules match on, spelled by an attacker
//! (issue 29), on both proxy paths: the agent's HTTP/1.1 path, hyper's
//! (HTTP/1.0 is handed over) and h2c. Each spelling that the engine and an
//! upstream could read differently is refused with 400 before the engine
//! counts it; an honest one is counted and reaches the upstream once.

use http::Request;

use crate::h1::Wire;
use crate::strict::RawUpstream;
use crate::support::{Agent, Upstream, agent};

/// `calls 3 per 1h per consumer`, and one rule on `x-tier: gold`.
const PER_CONSUMER: &str = r#"
service: shop
version: identity-v1
consumer_header: x-gov-consumer
rules:
  - name: shop/per_consumer
    on: { path: { kind: PATH_KIND_PREFIX, value: /orders } }
    limit:
      key: LIMIT_KEY_CONSUMER
      calls: { amount: 3, window_ms: 3600000 }
  - name: shop/gold
    on: { header: { name: x-tier, value: gold } }
    limit:
      calls: { amount: 1000000, window_ms: 3600000 }
"#;

async fn setup() -> (RawUpstream, Agent) {
    let up = RawUpstream::start().await;
    let agent = agent()
        .config(PER_CONSUMER)
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    (up, agent)
}

fn admitted(agent: &Agent, rule: &str) -> u64 {
    agent
        .sidecar
        .engine()
        .stats()
        .rules
        .iter()
        .find(|r| &*r.rule == rule)
        .map_or(0, |r| r.admitted)
}

/// Sends one HTTP/1.x request with `fields` (whole lines) on a new connection.
async fn h1(agent: &Agent, version: &str, fields: &str) -> (u16, String) {
    let mut wire = Wire::connect(agent.sidecar.inbound_addr()).await;
    let head = format!("GET /orders HTTP/{version}\r\nhost: x\r\n{fields}\r\n");
    wire.send(head.as_bytes()).await;
    let reply = wire.response().await;
    (
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned(),
    )
}

/// Sends one h2c request (prior knowledge) with `fields`.
async fn h2c(agent: &Agent, fields: &[(&str, &str)]) -> u16 {
    let tcp = tokio::net::TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut req = Request::get(format!("http://{}/orders", agent.sidecar.inbound_addr()));
    for (name, value) in fields {
        req = req.header(*name, http::HeaderValue::from_str(value).unwrap());
    }
    let mut client = client.ready().await.unwrap();
    let (response, _) = client.send_request(req.body(()).unwrap(), true).unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), response)
        .await
        .expect("answered within 10 s")
        .unwrap();
    let status = response.status().as_u16();
    let mut body = response.into_body();
    while let Some(Ok(_)) = body.data().await {}
    connection.abort();
    status
}

#[tokio::test]
async fn hostile_spellings_of_the_consumer_are_refused_on_http1() {
    let (up, agent) = setup().await;
    for version in ["1.1", "1.0"] {
        for fields in [
            "x-gov-consumer: web\r\nx-gov-consumer: crm\r\n",
            "x-gov-consumer: crm\r\nX-Gov-Consumer: crm\r\n",
            "x_gov_consumer: web\r\n",
            "x-gov-consumer: crm\r\nx_gov_consumer: web\r\n",
            "x-gov-consumer: crm\r\nconnection: x-gov-consumer\r\n",
            "x-gov-consumer: crm\r\nconnection: keep-alive, X-GOV-CONSUMER\r\n",
            "x-tier: gold\r\nx-tier: silver\r\n",
            "x-tier: gold\r\nconnection: x-tier\r\n",
        ] {
            let (status, body) = h1(&agent, version, fields).await;
            assert_eq!(status, 400, "HTTP/{version} {fields:?}: {body}");
            assert!(body.contains("gov-agent:"), "{body}");
        }
    }
    assert_eq!(
        admitted(&agent, "shop/per_consumer"),
        0,
        "nothing was judged"
    );
    assert_eq!(up.take(), [], "nothing reached the upstream");
}

#[tokio::test]
async fn an_http1_consumer_with_surrounding_whitespace_is_the_trimmed_consumer() {
    // RFC 9112 section 5: the whitespace around a field value is not part of
    // it; the engine and the upstream both read `crm`, so it is one budget.
    let (up, agent) = setup().await;
    for fields in [
        "x-gov-consumer: crm\r\n",
        "x-gov-consumer:\tcrm \r\n",
        "x-gov-consumer:   crm\t\r\n",
    ] {
        assert_eq!(h1(&agent, "1.1", fields).await.0, 200, "{fields:?}");
    }
    assert_eq!(h1(&agent, "1.1", "x-gov-consumer: crm\r\n").await.0, 429);
    let received = up.requests();
    assert_eq!(received.len(), 3);
    for r in &received {
        assert_eq!(r.count("x-gov-consumer"), 1);
        assert_eq!(r.header("x-gov-consumer"), Some(&b"crm"[..]));
    }
}

#[tokio::test]
async fn hostile_spellings_of_the_consumer_are_refused_on_h2c() {
    let (up, agent) = setup().await;
    for fields in [
        &[("x-gov-consumer", "crm ")][..],
        &[("x-gov-consumer", "\tcrm")],
        &[("x-gov-consumer", " crm")],
        &[("x-gov-consumer", "web"), ("x-gov-consumer", "crm")],
        &[("x_gov_consumer", "web")],
        &[("x-gov-consumer", "crm"), ("x-tier", "gold ")],
        &[("x-tier", "gold"), ("x-tier", "gold")],
        // RFC 9113 section 8.2.1: any field value.
        &[("x-gov-consumer", "crm"), ("x-other", "a ")],
    ] {
        assert_eq!(h2c(&agent, fields).await, 400, "{fields:?}");
    }
    assert_eq!(
        admitted(&agent, "shop/per_consumer"),
        0,
        "nothing was judged"
    );
    assert_eq!(admitted(&agent, "shop/gold"), 0, "nothing was judged");
    assert_eq!(up.take(), [], "nothing reached the upstream");

    // `crm` is one consumer with one budget of 3, however it is spelled.
    for _ in 0..3 {
        assert_eq!(h2c(&agent, &[("x-gov-consumer", "crm")]).await, 200);
    }
    assert_eq!(h2c(&agent, &[("x-gov-consumer", "crm ")]).await, 400);
    assert_eq!(h2c(&agent, &[("x-gov-consumer", "crm")]).await, 429);
    let received = up.requests();
    assert_eq!(received.len(), 3);
    for r in &received {
        assert_eq!(r.count("x-gov-consumer"), 1);
        assert_eq!(r.header("x-gov-consumer"), Some(&b"crm"[..]));
    }
}

#[tokio::test]
async fn refused_spellings_are_counted_as_refused() {
    let (_up, agent) = setup().await;
    assert_eq!(
        h1(&agent, "1.1", "x-gov-consumer: a\r\nx-gov-consumer: b\r\n")
            .await
            .0,
        400
    );
    let metrics = crate::support::http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_requests_refused_total{listener=\"inbound\"} 1"),
        "{metrics}"
    );
}

/// Issue 29: rotating consumer IDs cannot reset an exhausted consumer's
/// budget, nor each get a budget of their own past the key cap
/// (`--max-keys-per-rule` here; `max_keys` in the policy below): they share
/// the rule's overflow budget, and `/metrics` shows it.
#[tokio::test]
async fn rotating_consumers_share_the_overflow_and_never_reset_an_exhausted_one() {
    let up = RawUpstream::start().await;
    let agent = agent()
        .config(PER_CONSUMER)
        .max_keys_per_rule(8)
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    for _ in 0..3 {
        assert_eq!(h1(&agent, "1.1", "x-gov-consumer: web\r\n").await.0, 200);
    }
    assert_eq!(h1(&agent, "1.1", "x-gov-consumer: web\r\n").await.0, 429);
    let mut admitted = 0;
    for i in 0..40 {
        let fields = format!("x-gov-consumer: attacker-{i}\r\n");
        admitted += usize::from(h1(&agent, "1.1", &fields).await.0 == 200);
    }
    assert_eq!(
        h1(&agent, "1.1", "x-gov-consumer: web\r\n").await.0,
        429,
        "web is still exhausted"
    );
    // Seven keys fit beside `web`; the other 33 share the rule's 3 calls.
    assert_eq!(admitted, 7 + 3);
    let metrics = crate::support::http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_rule_keys{rule=\"shop/per_consumer\"} 8"),
        "{metrics}"
    );
    assert!(
        metrics.contains("gov_agent_rule_keys_overflowed_total{rule=\"shop/per_consumer\"} 33"),
        "{metrics}"
    );
}

/// `overflow reject` with `max_keys` in the config: new consumers past the
/// cap are refused with the limit's status.
#[tokio::test]
async fn overflow_reject_refuses_new_consumers_past_max_keys() {
    let up = RawUpstream::start().await;
    let agent = agent()
        .config(
            r#"
service: shop
version: identity-keys-v1
consumer_header: x-gov-consumer
rules:
  - name: shop/per_consumer
    on: { path: { kind: PATH_KIND_PREFIX, value: /orders } }
    limit:
      key: LIMIT_KEY_CONSUMER
      calls: { amount: 3, window_ms: 3600000 }
      max_keys: 2
      overflow: KEY_OVERFLOW_REJECT
"#,
        )
        .upstream(&Upstream::at(up.addr))
        .start()
        .await;
    assert_eq!(h1(&agent, "1.1", "x-gov-consumer: a\r\n").await.0, 200);
    assert_eq!(h1(&agent, "1.1", "x-gov-consumer: b\r\n").await.0, 200);
    assert_eq!(h1(&agent, "1.1", "x-gov-consumer: c\r\n").await.0, 429);
    assert_eq!(h1(&agent, "1.1", "x-gov-consumer: a\r\n").await.0, 200);
    assert_eq!(up.requests().len(), 3);
}
