//! gRPC through the agent: a real tonic server behind it, a real tonic client in
//! front, rules on gRPC methods. The client decodes the agent's rejections as the
//! gRPC codes the rules give; a fuse counts the `grpc-status` of the answers;
//! a server stream holds its bulkhead permit until its last message.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use gov_agent::sidecar::UpstreamProtocol;
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use crate::support::{Agent, Upstream, agent, http};

/// `test.v1.Echo/Say`'s request: the server answers with `code` (0: OK).
#[derive(Clone, PartialEq, prost::Message)]
struct Say {
    #[prost(int32, tag = "1")]
    code: i32,
    /// Server stream: how many messages, 100 ms apart.
    #[prost(uint32, tag = "2")]
    messages: u32,
    /// Unary: how long the server takes to answer (at most 5 s).
    #[prost(uint64, tag = "3")]
    delay_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Reply {
    #[prost(string, tag = "1")]
    text: String,
}

const SAY: &str = "/test.v1.Echo/Say";
const STREAM: &str = "/test.v1.Echo/Stream";

/// The `test.v1.Echo` service, written as tonic's codegen writes one.
#[derive(Clone)]
struct Echo;

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "test.v1.Echo";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::<Reply, Say>::default());
            Ok(match req.uri().path() {
                SAY => grpc.unary(tower::service_fn(say), req).await,
                STREAM => grpc.server_streaming(tower::service_fn(stream), req).await,
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

async fn say(req: tonic::Request<Say>) -> Result<tonic::Response<Reply>, Status> {
    let say = req.into_inner();
    tokio::time::sleep(Duration::from_millis(say.delay_ms.min(5000))).await;
    match say.code {
        0 => Ok(tonic::Response::new(Reply { text: "hi".into() })),
        code => Err(Status::new(Code::from(code), "the server says so")),
    }
}

type Replies = Pin<Box<dyn futures::Stream<Item = Result<Reply, Status>> + Send>>;

async fn stream(req: tonic::Request<Say>) -> Result<tonic::Response<Replies>, Status> {
    let n = req.into_inner().messages.min(20);
    let replies = futures::stream::unfold(0, move |i| async move {
        if i == n {
            return None;
        }
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Some((
            Ok(Reply {
                text: i.to_string(),
            }),
            i + 1,
        ))
    });
    Ok(tonic::Response::new(Box::pin(replies) as Replies))
}

/// A tonic server of `Echo` on loopback.
pub(crate) async fn echo_server() -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Echo)
            .serve_with_incoming(incoming),
    );
    Upstream::at(addr)
}

async fn grpc_agent(config: &str, up: &Upstream) -> Agent {
    agent()
        .config(config)
        .upstream(up)
        .upstream_protocol(UpstreamProtocol::Downstream)
        .start()
        .await
}

pub(crate) async fn client(agent: &Agent) -> tonic::client::Grpc<Channel> {
    let channel = Channel::from_shared(agent.url(""))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic::client::Grpc::new(channel)
}

/// One unary call of `Say` answering `code`.
pub(crate) async fn call(
    c: &mut tonic::client::Grpc<Channel>,
    code: Code,
) -> Result<Reply, Status> {
    c.ready().await.unwrap();
    let req = tonic::Request::new(Say {
        code: code as i32,
        ..Say::default()
    });
    let codec = ProstCodec::<Say, Reply>::default();
    c.unary(req, PathAndQuery::from_static(SAY), codec)
        .await
        .map(tonic::Response::into_inner)
}

fn rejected_by(status: &Status) -> Option<&str> {
    status.metadata().get("gov-rejected-by")?.to_str().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_limit_rejects_with_resource_exhausted() {
    let up = echo_server().await;
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/say_rate
    on: { path: { kind: PATH_KIND_EXACT, value: /test.v1.Echo/Say } }
    limit:
      calls: { amount: 2, window_ms: 600000 }
"#,
        &up,
    )
    .await;
    let mut c = client(&agent).await;
    for _ in 0..2 {
        assert_eq!(call(&mut c, Code::Ok).await.unwrap().text, "hi");
    }
    let status = call(&mut c, Code::Ok).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(rejected_by(&status), Some("shop/say_rate"));
    assert_eq!(status.message(), "rejected by shop/say_rate (limit_calls)");
    // The RateLimit headers as metadata of the trailers-only answer.
    let meta = |name: &str| status.metadata().get(name).and_then(|v| v.to_str().ok());
    assert_eq!(
        meta("ratelimit-policy"),
        Some("\"shop/say_rate\";q=2;w=600")
    );
    assert_eq!(meta("ratelimit"), Some("\"shop/say_rate\";r=0;t=600"));
    assert_eq!(meta("retry-after"), Some("600"));
    // Another method of the service is not limited.
    c.ready().await.unwrap();
    let req = tonic::Request::new(Say {
        messages: 1,
        ..Say::default()
    });
    let mut replies = c
        .server_streaming(
            req,
            PathAndQuery::from_static(STREAM),
            ProstCodec::<Say, Reply>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replies.message().await.unwrap().unwrap().text, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fuse_trips_on_unavailable_answers_and_not_on_not_found() {
    let up = echo_server().await;
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/say_down
    on: { path: { kind: PATH_KIND_EXACT, value: /test.v1.Echo/Say } }
    fuse:
      trips:
        - { metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 3, window_ms: 600000 }
      system: { grpc_status: [GRPC_CODE_UNAVAILABLE, GRPC_CODE_DEADLINE_EXCEEDED] }
      business: { grpc_status: [GRPC_CODE_INTERNAL] }
"#,
        &up,
    )
    .await;
    let mut c = client(&agent).await;
    // NOT_FOUND is an answer: five of them trip nothing, and OK neither.
    for _ in 0..5 {
        let status = call(&mut c, Code::NotFound).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(rejected_by(&status), None, "the server's answer");
    }
    call(&mut c, Code::Ok).await.unwrap();
    // Three UNAVAILABLE answers of the server trip it.
    for _ in 0..3 {
        let status = call(&mut c, Code::Unavailable).await.unwrap_err();
        assert_eq!(rejected_by(&status), None, "the server's answer");
    }
    let status = call(&mut c, Code::Ok).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(rejected_by(&status), Some("shop/say_down"));
    assert_eq!(status.message(), "rejected by shop/say_down (fuse_open)");

    // `/metrics` counts the calls by the code they ended with.
    let metrics = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    for line in [
        r#"gov_agent_rule_grpc_calls_total{rule="shop/say_down",code="OK"} 1"#,
        r#"gov_agent_rule_grpc_calls_total{rule="shop/say_down",code="NOT_FOUND"} 5"#,
        r#"gov_agent_rule_grpc_calls_total{rule="shop/say_down",code="UNAVAILABLE"} 3"#,
        r#"gov_agent_rule_rejected_total{rule="shop/say_down",reason="fuse_open"} 1"#,
    ] {
        assert!(metrics.contains(line), "no `{line}` in:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_holds_its_bulkhead_permit_until_it_ends_and_a_rejection_is_unavailable() {
    let up = echo_server().await;
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/one_at_a_time
    on: { path: { kind: PATH_KIND_PREFIX, value: /test.v1.Echo/ } }
    bulkhead:
      max_concurrent: 1
"#,
        &up,
    )
    .await;
    let mut c = client(&agent).await;
    c.ready().await.unwrap();
    let req = tonic::Request::new(Say {
        messages: 3,
        ..Say::default()
    });
    let mut replies = c
        .server_streaming(
            req,
            PathAndQuery::from_static(STREAM),
            ProstCodec::<Say, Reply>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replies.message().await.unwrap().unwrap().text, "0");

    // The stream is open: it holds the one permit.
    let mut other = client(&agent).await;
    let status = call(&mut other, Code::Ok).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(rejected_by(&status), Some("shop/one_at_a_time"));
    assert_eq!(
        status.message(),
        "rejected by shop/one_at_a_time (bulkhead_full)"
    );

    // The rest of the stream, then its end (the trailers): the permit is back.
    let mut texts = Vec::new();
    while let Some(reply) = replies.message().await.unwrap() {
        texts.push(reply.text);
    }
    assert_eq!(texts, ["1", "2"]);
    let mut admitted = false;
    // The permit is released when the agent has sent the end of the stream,
    // which the client may see a moment before: a bounded retry.
    for _ in 0..50 {
        match call(&mut other, Code::Ok).await {
            Ok(_) => {
                admitted = true;
                break;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(admitted, "the permit came back when the stream ended");
}

/// Raw HTTP/2 requests, for what a tonic client never sends.
fn h2() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

fn grpc_request(url: &str, timeout: Option<&str>) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::post(url)
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = timeout {
        req = req.header("grpc-timeout", t);
    }
    // An empty `Say` message: code 0.
    req.body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .unwrap()
}

/// A rejection is a trailers-only gRPC response: HTTP 200, `application/grpc`,
/// `grpc-status` and `grpc-message` in the head, no body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_is_a_trailers_only_grpc_response() {
    let up = echo_server().await;
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/none
    on: { path: { kind: PATH_KIND_EXACT, value: /test.v1.Echo/Say } }
    limit:
      calls: { amount: 1, window_ms: 600000 }
      reject_grpc_status: GRPC_CODE_PERMISSION_DENIED
"#,
        &up,
    )
    .await;
    let client = h2();
    let ok = client
        .request(grpc_request(&agent.url(SAY), None))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let trailers = ok.into_body().collect().await.unwrap();
    assert_eq!(trailers.trailers().unwrap()["grpc-status"], "0");

    let rejected = client
        .request(grpc_request(&agent.url(SAY), None))
        .await
        .unwrap();
    assert_eq!(rejected.status(), 200);
    let h = rejected.headers();
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "7");
    assert_eq!(h["grpc-message"], "rejected by shop/none (limit_calls)");
    assert_eq!(h["gov-rejected-by"], "shop/none");
    let body = rejected.into_body().collect().await.unwrap();
    assert!(body.to_bytes().is_empty());

    // The same path over HTTP/1 with a gRPC content type is not gRPC (gRPC needs
    // HTTP/2): a plain 429.
    let reply = http()
        .send(
            http::Request::post(agent.url(SAY))
                .header("content-type", "application/grpc")
                .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("gov-rejected-by"), Some("shop/none"));
}

/// A `grpc-timeout` shorter than the rule's timeout is the call's deadline: the
/// agent answers DEADLINE_EXCEEDED without naming a rule, and the fuse counts a
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_is_the_deadline_when_shorter_than_the_rules() {
    let up = echo_server().await;
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/slow_ok
    on: { path: { kind: PATH_KIND_EXACT, value: /test.v1.Echo/Say } }
    bulkhead:
      max_concurrent: 10
      timeout_ms: 60000
"#,
        &up,
    )
    .await;
    // Sent raw: a tonic client would cut the call itself on its own timeout.
    let say = prost::Message::encode_to_vec(&Say {
        delay_ms: 3000,
        ..Say::default()
    });
    let mut framed = vec![0_u8];
    framed.extend_from_slice(&u32::try_from(say.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&say);
    let mut req = grpc_request(&agent.url(SAY), Some("100m"));
    *req.body_mut() = Full::new(Bytes::from(framed));
    let response = h2().request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let h = response.headers();
    assert_eq!(h["grpc-status"], "4", "DEADLINE_EXCEEDED: {h:?}");
    assert!(
        h.get("gov-rejected-by").is_none(),
        "the caller's deadline, no rule's"
    );
}

/// `grpc-timeout` values no gRPC client sends are ignored: the call goes through
/// under its rules, the agent does not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_timeouts_are_ignored() {
    let up = echo_server().await;
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/all
    on: { path: { kind: PATH_KIND_PREFIX, value: / } }
    bulkhead:
      max_concurrent: 10
      timeout_ms: 60000
"#,
        &up,
    )
    .await;
    let client = h2();
    for bad in [
        "99999999999999999999999H", // overflow
        "123456789S",               // more than 8 digits
        "-100m",                    // negative-looking
        "+1S",
        "100x", // bad unit
        "100",  // no unit
        "m",    // no digits
        "1.5S",
        "",
        "99999999H", // huge but valid: no deadline that matters
    ] {
        let response = client
            .request(grpc_request(&agent.url(SAY), Some(bad)))
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{bad:?}");
        let body = response.into_body().collect().await.unwrap();
        assert_eq!(body.trailers().unwrap()["grpc-status"], "0", "{bad:?}");
    }
}

/// An upstream whose `grpc-status` trailer is not a number: the call ended
/// UNKNOWN (as a gRPC client reads it), which a fuse may count; nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_status_that_is_not_a_number_counts_as_unknown() {
    use hyper::body::Frame;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // At most a few connections: the test makes three calls.
        for _ in 0..8 {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    let mut trailers = http::HeaderMap::new();
                    trailers.insert("grpc-status", "banana".parse().unwrap());
                    let frames = futures::stream::iter([
                        Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
                        Ok(Frame::trailers(trailers)),
                    ]);
                    let body = http_body_util::StreamBody::new(frames);
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .header("content-type", "application/grpc")
                            .body(body)
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    let up = Upstream::at(addr);
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/unknown
    on: { path: { kind: PATH_KIND_EXACT, value: /test.v1.Echo/Say } }
    fuse:
      trips:
        - { metric: TRIP_METRIC_BUSINESS_ERRORS, op: COMPARE_OP_GE, count: 2, window_ms: 600000 }
      business: { grpc_status: [GRPC_CODE_UNKNOWN] }
"#,
        &up,
    )
    .await;
    let client = h2();
    for _ in 0..2 {
        let response = client
            .request(grpc_request(&agent.url(SAY), None))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap();
        // Forwarded as it came.
        assert_eq!(body.trailers().unwrap()["grpc-status"], "banana");
    }
    // Two UNKNOWN outcomes tripped the fuse.
    let response = client
        .request(grpc_request(&agent.url(SAY), None))
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(response.headers()["gov-rejected-by"], "shop/unknown");
}

/// A call cut off by its rule's `timeout` (shorter than its `grpc-timeout`) ends
/// DEADLINE_EXCEEDED, naming the rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_timeout_is_deadline_exceeded_naming_the_rule() {
    let up = echo_server().await;
    let agent = grpc_agent(
        r#"
service: shop
rules:
  - name: shop/quick
    on: { path: { kind: PATH_KIND_EXACT, value: /test.v1.Echo/Say } }
    bulkhead:
      max_concurrent: 10
      timeout_ms: 100
"#,
        &up,
    )
    .await;
    let mut c = client(&agent).await;
    c.ready().await.unwrap();
    let mut req = tonic::Request::new(Say {
        delay_ms: 3000,
        ..Say::default()
    });
    req.set_timeout(Duration::from_secs(30));
    let codec = ProstCodec::<Say, Reply>::default();
    let status = c
        .unary(req, PathAndQuery::from_static(SAY), codec)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(rejected_by(&status), Some("shop/quick"));
    assert_eq!(status.message(), "rejected by shop/quick (timeout)");
}
