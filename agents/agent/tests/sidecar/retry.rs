//! Declared retries on loopback, on both proxy paths (the HTTP/1 path and
//! hyper's, reached over h2c): a real upstream that fails its first calls
//! with 503, the agent's outbound listener, real clients.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::support::*;

/// An upstream that answers 503 to its first `fail` calls, then 200 with
/// the request body (after `delay`); it counts the calls it received and
/// the most it had in flight at once.
struct Failing {
    upstream: Upstream,
    calls: Arc<AtomicU64>,
    peak: Arc<AtomicU64>,
}

async fn failing(fail: u64, delay: Duration) -> Failing {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicU64::new(0));
    let (c, p) = (calls.clone(), peak.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (calls, peak, in_flight) = (c.clone(), p.clone(), in_flight.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let (calls, peak, in_flight) = (calls.clone(), peak.clone(), in_flight.clone());
                    async move {
                        let n = calls.fetch_add(1, Ordering::SeqCst);
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        tokio::time::sleep(delay).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        let response = if n < fail {
                            let mut r = Response::new(Full::new(Bytes::from_static(b"busy\n")));
                            *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                            r
                        } else {
                            Response::new(Full::new(body.unwrap_or_default()))
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Failing {
        upstream: Upstream::at(addr),
        calls,
        peak,
    }
}

/// A retry rule on calls to `inventory`: `attempts`, on 503, a budget of
/// `percent`% plus `min` per hour (no floor to speak of within a test), and
/// `extra` rules before it.
fn config(attempts: u32, percent: u32, min: u32, extra: &str) -> String {
    format!(
        r#"
service: shop
version: retry-v1
rules:{extra}
  - name: shop/inventory_retries
    on: {{ calls_to: inventory }}
    direction: DIRECTION_OUTBOUND
    retry:
      attempts: {attempts}
      on: {{ status: [{{ from: 503, to: 503 }}], connect_failure: true }}
      backoff_ms: 1
      backoff_max_ms: 5
      budget: {{ ratio_milli_percent: {}, min_retries: {min}, per_ms: 3600000 }}
      methods: [GET, PUT, DELETE]
"#,
        percent * 1000
    )
}

async fn agent_for(up: &Failing, config: &str) -> Agent {
    let local = upstream().start().await;
    agent()
        .config(config)
        .upstream(&local)
        .instances("inventory", &[&up.upstream])
        .start()
        .await
}

/// The HTTP/1 client, or an h2c one (hyper's path in the agent).
#[derive(Clone, Copy, Debug)]
enum Path {
    H1,
    H2,
}

async fn call(agent: &Agent, path: Path, method: Method, body: &'static [u8]) -> Reply {
    let req = Request::builder()
        .method(method)
        .uri(agent.outbound_url("/stock"))
        .header("gov-service", "inventory")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let sent = async {
        match path {
            Path::H1 => http().send(req).await,
            Path::H2 => {
                let client = Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .build_http::<Full<Bytes>>();
                let response = client.request(req).await.map_err(|e| format!("{e:?}"))?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await.map_err(|e| format!("{e:?}"))?;
                Ok(Reply {
                    status: parts.status,
                    headers: parts.headers,
                    body: body.to_bytes(),
                })
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), sent)
        .await
        .expect("answered within 10s")
        .expect("an answer")
}

async fn metrics(agent: &Agent) -> String {
    http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
}

fn retries(text: &str, outcome: &str) -> u64 {
    let series =
        format!(r#"gov_agent_retries_total{{rule="shop/inventory_retries",outcome="{outcome}"}} "#);
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
}

/// An upstream that fails its first two calls with 503: a GET (and a PUT
/// with a body, held and sent again whole) gets the 200 of its third
/// attempt, and the retries are counted.
async fn the_client_sees_success_within_its_attempts(path: Path) {
    let up = failing(2, ms(0)).await;
    let agent = agent_for(&up, &config(3, 100, 2, "")).await;
    let reply = call(&agent, path, Method::GET, b"").await;
    assert_eq!(reply.status, StatusCode::OK, "{path:?}");
    assert_eq!(up.calls.load(Ordering::SeqCst), 3);

    let up = failing(2, ms(0)).await;
    let agent = agent_for(&up, &config(3, 100, 2, "")).await;
    let reply = call(&agent, path, Method::PUT, b"one order").await;
    assert_eq!(reply.status, StatusCode::OK, "{path:?}");
    assert_eq!(
        reply.body,
        Bytes::from_static(b"one order"),
        "the body sent again whole"
    );
    assert_eq!(up.calls.load(Ordering::SeqCst), 3);
    let text = metrics(&agent).await;
    assert_eq!(retries(&text, "sent"), 2);
    assert_eq!(retries(&text, "budget_exhausted"), 0);
}

#[tokio::test]
async fn h1_a_retried_call_succeeds_within_its_attempts() {
    the_client_sees_success_within_its_attempts(Path::H1).await;
}

#[tokio::test]
async fn h2_a_retried_call_succeeds_within_its_attempts() {
    the_client_sees_success_within_its_attempts(Path::H2).await;
}

/// A budget of 10% and one retry in reserve: the first failing call is
/// retried; the next ones find the budget spent and their 503 reaches the
/// client, with each refusal counted.
async fn a_spent_budget_stops_retries(path: Path) {
    let up = failing(1000, ms(0)).await;
    let agent = agent_for(&up, &config(3, 10, 1, "")).await;
    let first = call(&agent, path, Method::GET, b"").await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    // The reserve paid one retry; 10% of a call is not another.
    assert_eq!(up.calls.load(Ordering::SeqCst), 2);
    for _ in 0..4 {
        let reply = call(&agent, path, Method::GET, b"").await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    // Five calls at 10% are half a retry: none more was sent.
    assert_eq!(up.calls.load(Ordering::SeqCst), 6, "{path:?}");
    let text = metrics(&agent).await;
    assert_eq!(retries(&text, "sent"), 1);
    assert_eq!(retries(&text, "budget_exhausted"), 5);
    // Calls 2 to 11 credit a whole retry (the first found the bucket full):
    // the eleventh call's is paid.
    for _ in 0..6 {
        call(&agent, path, Method::GET, b"").await;
    }
    assert_eq!(up.calls.load(Ordering::SeqCst), 13, "{path:?}");
}

#[tokio::test]
async fn h1_a_spent_budget_stops_retries() {
    a_spent_budget_stops_retries(Path::H1).await;
}

#[tokio::test]
async fn h2_a_spent_budget_stops_retries() {
    a_spent_budget_stops_retries(Path::H2).await;
}

/// A POST is not idempotent: the rule does not retry it, and its 503 is the
/// client's (the upstream saw it once).
async fn a_post_is_not_retried(path: Path) {
    let up = failing(1, ms(0)).await;
    let agent = agent_for(&up, &config(3, 100, 5, "")).await;
    let reply = call(&agent, path, Method::POST, b"one order").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{path:?}");
    assert_eq!(up.calls.load(Ordering::SeqCst), 1);
    assert_eq!(retries(&metrics(&agent).await, "sent"), 0);
}

#[tokio::test]
async fn h1_a_post_is_not_retried() {
    a_post_is_not_retried(Path::H1).await;
}

#[tokio::test]
async fn h2_a_post_is_not_retried() {
    a_post_is_not_retried(Path::H2).await;
}

/// A bulkhead of one permit on the same calls: a retried call holds its one
/// permit across its attempts (another call at the same time is refused
/// 408), and is admitted once.
async fn a_retried_call_takes_one_permit(path: Path) {
    let up = failing(2, ms(100)).await;
    let bulkhead = r#"
  - name: shop/one_at_a_time
    on: { calls_to: inventory }
    direction: DIRECTION_OUTBOUND
    bulkhead:
      max_concurrent: 1"#;
    let agent = agent_for(&up, &config(3, 100, 5, bulkhead)).await;
    let retried = call(&agent, path, Method::GET, b"");
    let other = async {
        // While the first call is between attempts or in one.
        tokio::time::sleep(ms(150)).await;
        call(&agent, path, Method::GET, b"").await
    };
    let (retried, other) = tokio::join!(retried, other);
    assert_eq!(retried.status, StatusCode::OK, "{path:?}");
    assert_eq!(
        other.status,
        StatusCode::REQUEST_TIMEOUT,
        "the permit was held"
    );
    assert_eq!(up.calls.load(Ordering::SeqCst), 3);
    assert_eq!(up.peak.load(Ordering::SeqCst), 1);
    let text = metrics(&agent).await;
    let admitted = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"gov_agent_rule_admitted_total{rule="shop/one_at_a_time"} "#)?
                .parse::<u64>()
                .ok()
        })
        .unwrap();
    assert_eq!(
        admitted, 1,
        "one client call, one admission, three attempts"
    );
    assert_eq!(retries(&text, "sent"), 2);
}

#[tokio::test]
async fn h1_a_retried_call_takes_one_bulkhead_permit() {
    a_retried_call_takes_one_permit(Path::H1).await;
}

#[tokio::test]
async fn h2_a_retried_call_takes_one_bulkhead_permit() {
    a_retried_call_takes_one_permit(Path::H2).await;
}

/// Hostile: a PUT under a retry rule whose client declares a body it does
/// not send (the agent holds the body before the first attempt) gets
/// nothing sent upstream and costs only its connection; the agent keeps
/// serving. A declared body above the hold bound is relayed as it streams,
/// once, and not retried.
#[tokio::test]
async fn a_body_the_client_does_not_send_is_never_sent_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = failing(1, ms(0)).await;
    let agent = agent_for(&up, &config(3, 100, 5, "")).await;
    let addr = agent.sidecar.outbound_addr().unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"PUT /stock HTTP/1.1\r\nhost: inventory\r\ncontent-length: 20\r\n\r\nfive!")
        .await
        .unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the agent closed the connection");
    assert_eq!(
        up.calls.load(Ordering::SeqCst),
        0,
        "nothing half-sent upstream"
    );

    // Above the bound: one attempt, the upstream's 503 reaches the client.
    let big: &'static [u8] = Box::leak(vec![b'x'; 70 * 1024].into_boxed_slice());
    let reply = call(&agent, Path::H1, Method::PUT, big).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(up.calls.load(Ordering::SeqCst), 1);
    // And a held one is retried as before.
    let reply = call(&agent, Path::H1, Method::PUT, b"small").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.body, Bytes::from_static(b"small"));
}
