//! Deadlines that travel (issue 33), through real agents and upstreams on
//! loopback: the caller's `gov-timeout` caps the rules' timeouts, the request
//! forwarded carries what is left of it, an app that writes what is left on
//! its own outbound call gets it applied by its agent's outbound listener,
//! and a used-up deadline is refused there without reaching the called
//! service. Hostile values read the same on the HTTP/1 path and hyper's.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gov_engine::grpc::parse_timeout;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use crate::support::{Agent, agent, http, ms};

/// Serves HTTP/1 and HTTP/2 on 127.0.0.1:0 with `answer`.
async fn serve<F, Fut>(answer: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let answer = answer.clone();
                    async move { Ok::<_, Infallible>(answer(req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    addr
}

/// An upstream that answers the `gov-timeout` values it was sent (`,`
/// between two, `-` for none), and counts the requests it got.
async fn deadline_echo() -> (SocketAddr, Arc<AtomicU64>) {
    let received = Arc::new(AtomicU64::new(0));
    let count = received.clone();
    let addr = serve(move |req: Request<Incoming>| {
        count.fetch_add(1, Ordering::SeqCst);
        async move { Response::new(Full::new(Bytes::from(seen(req.headers())))) }
    })
    .await;
    (addr, received)
}

fn seen(headers: &http::HeaderMap) -> String {
    let values: Vec<_> = headers
        .get_all("gov-timeout")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    if values.is_empty() {
        "-".to_owned()
    } else {
        values.join(",")
    }
}

fn duration(value: &str) -> Duration {
    parse_timeout(value.as_bytes()).unwrap_or_else(|| panic!("not a deadline: {value:?}"))
}

/// What the app of the two-hop test saw: the deadline it got, and the
/// status and body of its own call to `b`.
type Seen = Arc<Mutex<Option<(String, StatusCode, String, Option<String>)>>>;

/// Service `a`: reads `gov-timeout` when a request arrives, works `x-work`
/// ms, then calls `b` through its agent's outbound listener with what is
/// left of the deadline (as docs/operations.md "Deadlines" shows), and
/// answers `b`'s answer.
async fn app_a(outbound: Arc<Mutex<Option<SocketAddr>>>, seen: Seen) -> SocketAddr {
    serve(move |req: Request<Incoming>| {
        let (outbound, seen) = (outbound.clone(), seen.clone());
        // A task of its own: the work goes on when the agent gives up on it.
        let work = tokio::spawn(async move {
            let arrived = Instant::now();
            let got = req
                .headers()
                .get("gov-timeout")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let work = req
                .headers()
                .get("x-work")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(0);
            tokio::time::sleep(ms(work)).await;
            let to = outbound.lock().unwrap().unwrap();
            let mut call = Request::get(format!("http://{to}/b")).header("gov-service", "b");
            if let Some(deadline) = got.as_deref().and_then(|v| parse_timeout(v.as_bytes())) {
                let left = deadline.saturating_sub(arrived.elapsed());
                call = call.header("gov-timeout", gov_engine::deadline::format(left));
            }
            let reply = http()
                .send(call.body(Full::default()).unwrap())
                .await
                .unwrap();
            let why = reply.header("gov-deadline-exceeded").map(str::to_owned);
            *seen.lock().unwrap() = Some((
                got.unwrap_or_else(|| "-".into()),
                reply.status,
                reply.text(),
                why,
            ));
            let mut response = Response::new(Full::new(reply.body.clone()));
            *response.status_mut() = reply.status;
            response
        });
        async move { work.await.unwrap() }
    })
    .await
}

/// The rule of `a`'s inbound calls: a 1 s timeout.
const A_RULES: &str = r#"
service: shop
rules:
  - name: shop/all
    on: { path: { kind: PATH_KIND_PREFIX, value: / } }
    bulkhead:
      max_concurrent: 100
      timeout_ms: 1000
"#;

async fn metrics(agent: &Agent) -> String {
    http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
}

/// client -> agent (inbound of `a`) -> app `a` -> the same agent's outbound
/// listener -> `b`: each hop sees less time left than the one before, the
/// rule's timeout caps the caller's; a deadline used up by `a`'s work is
/// refused at the second hop (504, counted) and never reaches `b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_shrinks_across_two_hops_and_a_used_up_one_stops_at_the_second() {
    let (b, b_received) = deadline_echo().await;
    let outbound = Arc::new(Mutex::new(None));
    let seen: Seen = Arc::default();
    let a = app_a(outbound.clone(), seen.clone()).await;
    let agent = agent()
        .config(A_RULES)
        .upstream(&crate::support::Upstream::at(a))
        .instance_addrs("b", &[b])
        .start()
        .await;
    *outbound.lock().unwrap() = agent.sidecar.outbound_addr();
    let client = http();

    // 800 ms sent, 50 ms of work in `a`.
    let reply = client
        .get_with(
            &agent.url("/a"),
            &[("gov-timeout", "800m"), ("x-work", "50")],
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let (at_a, ..) = seen.lock().unwrap().clone().unwrap();
    // b answers the deadline it saw.
    let (at_a, at_b) = (duration(&at_a), duration(&reply.text()));
    assert!(at_a < ms(800), "a got less than the client sent: {at_a:?}");
    assert!(at_a > ms(500), "a got most of it: {at_a:?}");
    assert!(
        at_b <= at_a - ms(50),
        "b got what was left after a's work: {at_a:?} then {at_b:?}"
    );

    // 5 s sent: the rule's 1 s timeout is the deadline a gets.
    let reply = client
        .get_with(&agent.url("/a"), &[("gov-timeout", "5S")])
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    let (at_a, ..) = seen.lock().unwrap().clone().unwrap();
    assert!(duration(&at_a) <= ms(1000), "the rule's timeout: {at_a}");
    assert!(duration(&at_a) > ms(900), "{at_a}");

    // 100 ms sent, 150 ms of work: the client gets 504 from the first hop,
    // and a's call to b, made with nothing left, is refused by the outbound
    // listener before it takes a permit or reaches b.
    let before = b_received.load(Ordering::SeqCst);
    *seen.lock().unwrap() = None;
    let reply = client
        .get_with(
            &agent.url("/a"),
            &[("gov-timeout", "100m"), ("x-work", "150")],
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(reply.header("gov-deadline-exceeded"), Some("in-flight"));
    let mut second = None;
    for _ in 0..100 {
        second = seen.lock().unwrap().clone();
        if second.is_some() {
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    let (_, status, body, why) = second.expect("a made its call to b");
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(why.as_deref(), Some("before-admission"));
    assert!(
        body.contains("used up before the call was admitted"),
        "{body}"
    );
    assert_eq!(b_received.load(Ordering::SeqCst), before, "b never saw it");
    let m = metrics(&agent).await;
    assert!(
        m.contains("gov_agent_doomed_calls_total{listener=\"outbound\"} 1\n"),
        "{m}"
    );
    assert!(m.contains("gov_agent_doomed_calls_total{listener=\"inbound\"} 0\n"));
}

/// An agent in front of [`deadline_echo`] whose rule sets no timeout.
async fn echo_agent() -> (Agent, Arc<AtomicU64>) {
    let (up, received) = deadline_echo().await;
    let agent = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/all
    on: { path: { kind: PATH_KIND_PREFIX, value: / } }
    bulkhead:
      max_concurrent: 100
"#,
        )
        .upstream(&crate::support::Upstream::at(up))
        .start()
        .await;
    (agent, received)
}

/// One request with these `gov-timeout` lines over HTTP/1 (the agent's own
/// path): the status, the `gov-deadline-exceeded` header, and the body.
async fn over_http1(agent: &Agent, values: &[&str]) -> (u16, Option<String>, String) {
    let mut head = b"GET /x HTTP/1.1\r\nhost: shop\r\nconnection: close\r\n".to_vec();
    for v in values {
        head.extend_from_slice(b"gov-timeout: ");
        head.extend_from_slice(v.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let mut tcp = TcpStream::connect(agent.sidecar.inbound_addr())
        .await
        .unwrap();
    tcp.write_all(&head).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text[9..12].parse().unwrap();
    let why = text
        .lines()
        .find_map(|l| l.strip_prefix("gov-deadline-exceeded: "))
        .map(str::to_owned);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, why, body)
}

/// The same request over HTTP/2 (hyper's path).
async fn over_h2(agent: &Agent, values: &[&str]) -> (u16, Option<String>, String) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut req = Request::get(agent.url("/x"));
    for v in values {
        req = req.header("gov-timeout", *v);
    }
    let response = client
        .request(req.body(Full::default()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let why = response
        .headers()
        .get("gov-deadline-exceeded")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, why, String::from_utf8_lossy(&body).into_owned())
}

/// Malformed, negative, oversize and repeated values are no deadline on both
/// paths: the call goes on and the upstream gets no `gov-timeout`; a huge
/// well-formed one goes on with at most what was sent; `0` is refused on both
/// the same way, before reaching the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_deadlines_read_the_same_on_both_paths() {
    let (agent, received) = echo_agent().await;
    let long = "9".repeat(9000) + "m";
    let ignored: [&[&str]; 10] = [
        &["abc"],
        &["-5m"],
        &["+5m"],
        &["1.5S"],
        &["5 m"],
        &["123456789m"],
        &[&long],
        &[""],
        &["1S", "1S"],
        &["0m", "5S"],
    ];
    for values in ignored {
        for path in ["http1", "h2"] {
            let (status, why, body) = match path {
                "http1" => over_http1(&agent, values).await,
                _ => over_h2(&agent, values).await,
            };
            assert_eq!((status, why, &*body), (200, None, "-"), "{path} {values:?}");
        }
    }
    for path in ["http1", "h2"] {
        let (status, _, body) = match path {
            "http1" => over_http1(&agent, &["99999999H"]).await,
            _ => over_h2(&agent, &["99999999H"]).await,
        };
        assert_eq!(status, 200, "{path}");
        assert!(duration(&body) <= duration("99999999H"), "{path} {body}");
        // Rounded down to the hour, the unit that holds it.
        assert_eq!(body, "99999998H", "{path}");
    }
    let before = received.load(Ordering::SeqCst);
    for zero in ["0m", "0S", "0n", "00000000H"] {
        for path in ["http1", "h2"] {
            let (status, why, body) = match path {
                "http1" => over_http1(&agent, &[zero]).await,
                _ => over_h2(&agent, &[zero]).await,
            };
            assert_eq!(status, 504, "{path} {zero}");
            assert_eq!(why.as_deref(), Some("before-admission"), "{path}");
            assert!(body.contains("deadline exceeded"), "{path} {body}");
        }
    }
    assert_eq!(received.load(Ordering::SeqCst), before, "none reached it");
    let m = metrics(&agent).await;
    assert!(
        m.contains("gov_agent_doomed_calls_total{listener=\"inbound\"} 8\n"),
        "{m}"
    );
}
