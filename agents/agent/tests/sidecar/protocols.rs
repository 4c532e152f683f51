//! Issue 37: HTTP/2, gRPC and WebSocket traffic through the agent, against
//! real peers on loopback: nginx as a strict HTTP/2 upstream and as a gRPC
//! `grpc_pass` hop (RFC 9113 8.3.1: `host` and `:authority` agree), httpx
//! uploading concurrently on one HTTP/2 connection to an upstream that answers
//! before it reads the body, and gRPC over the default upstream protocol.
//!
//! nginx is found as `GOV_TEST_NGINX`, else `nginx` on `PATH` or
//! `/usr/sbin/nginx` (Debian's `nginx`, which `.ci/run` installs); httpx as a
//! `python3` that imports `httpx` and `h2` (Debian's `python3-httpx` and
//! `python3-h2`). Without them a test says so and passes. Each nginx is
//! private: its own prefix in a temporary directory, one process, killed on
//! drop.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gov_agent::sidecar::UpstreamProtocol;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tonic::Code;

use crate::grpc::{call, client, echo_server};
use crate::support::{Upstream, agent, ms, upstream};

// === HTTP/2 upstream requests: `host` and `:authority` agree ===

/// nginx answers 400 to an HTTP/2 request whose `host` differs from its
/// `:authority`; through the agent every request of an HTTP/2 or HTTP/1 client
/// reaches it as one it serves, with either upstream protocol that sends
/// HTTP/2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_http2_upstream_serves_every_request_through_the_agent() {
    let Some(nginx) = Nginx::start("location / { return 200 \"nginx:$request_uri\\n\"; }").await
    else {
        return;
    };
    let up = Upstream::at(nginx.addr);
    for protocol in [UpstreamProtocol::Http2, UpstreamProtocol::Downstream] {
        let agent = agent()
            .upstream(&up)
            .upstream_protocol(protocol)
            .start()
            .await;
        // HTTP/2 clients: `:authority` as the client wrote it, and another one.
        for (h2c, authority) in [(true, None), (true, Some("shop.example")), (false, None)] {
            if !h2c && protocol == UpstreamProtocol::Downstream {
                continue; // HTTP/1 upstream: not this test's business.
            }
            let url = match authority {
                Some(authority) => format!("http://{authority}/x?y=1"),
                None => agent.url("/x?y=1"),
            };
            let (status, body) = get_via(agent.sidecar.inbound_addr(), h2c, &url).await;
            assert_eq!(
                (status, body.as_str()),
                (200, "nginx:/x?y=1\n"),
                "{protocol:?}, h2c {h2c}, authority {authority:?}; nginx's log:\n{}",
                nginx.log()
            );
        }
    }
}

/// Over HTTP/2 the upstream gets the host the client asked for as
/// `:authority` (its `:authority`, or its `host`), and no `host` field: RFC
/// 9113 8.3.1 wants the two to agree. A client's `host` that is no authority
/// (empty) gives way to the upstream's address. The connection is reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_authority_reaches_an_http2_upstream() {
    let h2 = H2Upstream::start(false).await;
    let up = Upstream::at(h2.addr);
    for protocol in [UpstreamProtocol::Http2, UpstreamProtocol::Downstream] {
        let agent = agent()
            .upstream(&up)
            .upstream_protocol(protocol)
            .start()
            .await;
        let inbound = agent.sidecar.inbound_addr();
        let (status, body) = get_via(inbound, true, "http://shop.example:81/x").await;
        assert_eq!(
            (status, body.as_str()),
            (200, "shop.example:81|"),
            "{protocol:?}"
        );
        let (status, body) = get_via(inbound, true, &agent.url("/x")).await;
        assert_eq!((status, body), (200, format!("{inbound}|")), "{protocol:?}");
        if protocol == UpstreamProtocol::Http2 {
            let (status, body) = get_via(inbound, false, "http://billing.example/x").await;
            assert_eq!((status, body.as_str()), (200, "billing.example|"));
            let head = "GET /x HTTP/1.1\r\nhost: \r\nconnection: close\r\n\r\n";
            let answer = raw_exchange(inbound, head).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            assert!(answer.ends_with(&format!("{}|", h2.addr)), "{answer}");
        }
    }
    // Each agent opened one connection to the upstream for all its requests.
    assert_eq!(h2.accepted(), 2);
}

/// An HTTP/2 upstream that closes each connection (GOAWAY, sent before the
/// response) after one request: the agent opens a new connection for the
/// next request and keeps serving. A request sent on the closing connection
/// before its GOAWAY arrived is refused unprocessed and fails (502; not sent
/// again, as with the pool): the test allows it, then asks once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_upstream_that_sends_goaway_after_each_response_is_reconnected() {
    let h2 = H2Upstream::start(true).await;
    let up = Upstream::at(h2.addr);
    let agent = agent()
        .upstream(&up)
        .upstream_protocol(UpstreamProtocol::Http2)
        .start()
        .await;
    let inbound = agent.sidecar.inbound_addr();
    let mut raced = 0;
    for i in 0..10 {
        let (mut status, mut body) = get_via(inbound, true, "http://shop.example/x").await;
        if status == 502 {
            // Sent while the GOAWAY was on its way (the known race): refused
            // unprocessed. The next request goes on a new connection.
            raced += 1;
            tokio::time::sleep(ms(100)).await;
            (status, body) = get_via(inbound, true, "http://shop.example/x").await;
        }
        assert_eq!(
            (status, body.as_str()),
            (200, "shop.example|"),
            "request {i}"
        );
    }
    assert!(
        raced <= 5,
        "{raced} of 10 requests met a closing connection"
    );
    assert!(h2.accepted() >= 2, "{}", h2.accepted());
}

/// A plain HTTP/2 (h2c) upstream answering `{:authority}|{host fields}`,
/// counting the connections it accepted; with `goaway`, it shuts each
/// connection down gracefully after its first response.
struct H2Upstream {
    addr: SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl H2Upstream {
    async fn start(goaway: bool) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let served = Arc::new(tokio::sync::Notify::new());
                    let notify = served.clone();
                    let svc =
                        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                            let notify = notify.clone();
                            async move {
                                let authority = req.uri().authority().map(|a| a.to_string());
                                let hosts: Vec<&str> = req
                                    .headers()
                                    .get_all("host")
                                    .iter()
                                    .map(|h| h.to_str().unwrap_or("?"))
                                    .collect();
                                let body = format!(
                                    "{}|{}",
                                    authority.unwrap_or_default(),
                                    hosts.join(",")
                                );
                                notify.notify_one();
                                if goaway {
                                    // The GOAWAY goes before the response: a
                                    // request sent after the response on the
                                    // same connection would be refused
                                    // unprocessed, which the agent does not
                                    // send again (a known race).
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                                Ok::<_, std::convert::Infallible>(http::Response::new(
                                    http_body_util::Full::new(Bytes::from(body)),
                                ))
                            }
                        });
                    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                    let mut conn = std::pin::pin!(conn);
                    if goaway {
                        tokio::select! {
                            _ = conn.as_mut() => return,
                            () = served.notified() => {}
                        }
                        conn.as_mut().graceful_shutdown();
                    }
                    let _ = conn.await;
                });
            }
        });
        Self {
            addr,
            accepted,
            task,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for H2Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes `head` to `addr` and reads until the server closes.
async fn raw_exchange(addr: SocketAddr, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("closed within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// gRPC through the agent to nginx's `grpc_pass`, then a tonic server: the
/// call succeeds (nginx refused the agent's request with INTERNAL before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_through_the_agent_to_nginx_grpc_pass_succeeds() {
    let server = echo_server().await;
    let location = format!(
        "location /test.v1.Echo/ {{ grpc_pass grpc://{}; }}",
        server.addr
    );
    let Some(nginx) = Nginx::start(&location).await else {
        return;
    };
    let up = Upstream::at(nginx.addr);
    let agent = agent()
        .upstream(&up)
        .upstream_protocol(UpstreamProtocol::Downstream)
        .start()
        .await;
    let mut c = client(&agent).await;
    for _ in 0..3 {
        let reply = call(&mut c, Code::Ok).await;
        assert!(reply.is_ok(), "{reply:?}; nginx's log:\n{}", nginx.log());
    }
}

// === gRPC over the default upstream protocol ===

/// `--upstream-protocol http1` (the default) sends a gRPC call (HTTP/2 with
/// `content-type: application/grpc`) to the upstream over HTTP/2: gRPC has no
/// HTTP/1 form, and the call used to fail as UNAVAILABLE with nothing logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_the_default_upstream_protocol_reaches_a_grpc_server() {
    let server = echo_server().await;
    let agent = agent().upstream(&server).start().await;
    let mut c = client(&agent).await;
    for code in [Code::Ok, Code::NotFound, Code::Ok] {
        match call(&mut c, code).await {
            Ok(_) => assert_eq!(code, Code::Ok),
            Err(status) => assert_eq!(status.code(), code, "{status:?}"),
        }
    }
    // A plain HTTP/2 request on the same agent still goes over HTTP/1.1: the
    // tonic server (HTTP/2 only) does not answer it.
    let (status, _) = get_via(agent.sidecar.inbound_addr(), true, &agent.url("/plain")).await;
    assert_eq!(status, 502);
}

// === early responses and concurrent uploads ===

/// httpx (httpcore) fails an upload whose stream the server resets with
/// NO_ERROR after an early response (RFC 9113 8.1 allows it; httpcore does
/// not take it). The agent reads the rest of such a body (bounded), as nginx
/// does: 20 parallel 1 MiB uploads on one HTTP/2 connection, 5 runs, none
/// fails, whether the upstream reads the body or answers before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httpx_concurrent_uploads_on_one_http2_connection_all_succeed() {
    let Some(python) = python_with(&["httpx", "h2"]) else {
        eprintln!("SKIPPED: no python3 imports httpx and h2 (Debian: python3-httpx python3-h2)");
        return;
    };
    let up = upstream()
        .early("/early")
        .echo("/echo")
        .fast("/early-reset", ms(0))
        .start()
        .await;
    let agent = agent().upstream(&up).start().await;
    for path in ["/early", "/echo", "/early-reset"] {
        let url = agent.url(path);
        let mut cmd = Command::new(&python);
        cmd.args(["-c", HTTPX_UPLOADS, &url]);
        let out = run_bounded(cmd, Duration::from_secs(240)).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{path}: {stdout}\n{stderr}");
        let failures: u32 = stdout
            .trim()
            .strip_prefix("failures per run: ")
            .unwrap_or_else(|| panic!("{path}: {stdout}\n{stderr}"))
            .split(' ')
            .map(|n| n.parse::<u32>().unwrap())
            .sum();
        // Before the drain, up to 20 of every 20 uploads failed. An upstream
        // that answers early and reads the rest (`/early`, as nginx does) or
        // reads it all (`/echo`) must see no failure. `/early-reset` closes
        // its connection with the body unread, so the kernel resets it under
        // the agent's writes: when the reset comes before the agent has read
        // the response, the response is lost and the agent answers 502, as
        // any proxy must (nginx in front of the same upstream failed 27 of
        // 400 such uploads, "writev() failed (32: Broken pipe) while sending
        // request to upstream"; the agent 0 of 400 in the same run, about 1
        // in 100 on a loaded machine). 6 or more of 100 at that rate: under
        // 0.1% of runs.
        let allowed = if path == "/early-reset" { 5 } else { 0 };
        assert!(failures <= allowed, "{path}: {stdout}\n{stderr}");
    }
}

/// 5 runs of 20 parallel 1 MiB POSTs on one HTTP/2 connection (prior
/// knowledge), each bounded to 60 s; prints the failures of each run.
const HTTPX_UPLOADS: &str = r#"
import asyncio, sys
import httpx

URL = sys.argv[1]
BODY = b"x" * (1 << 20)

async def run():
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(http1=False, http2=True, limits=limits, timeout=60) as c:
        async def one():
            try:
                r = await c.post(URL, content=BODY)
                if r.status_code != 200:
                    print("status:", r.status_code, r.text[:200], file=sys.stderr)
                return r.status_code == 200
            except Exception as e:
                print("error:", type(e).__name__, e, file=sys.stderr)
                return False
        results = await asyncio.gather(*[one() for _ in range(20)])
        return sum(1 for ok in results if not ok)

fails = [asyncio.run(run()) for _ in range(5)]
print("failures per run:", " ".join(map(str, fails)))
"#;

// === helpers ===

/// `GET url` through the agent at `addr` (HTTP/1.1, or h2c with prior
/// knowledge; the URL's authority is the request's, the connection the
/// agent's): status and body.
pub(crate) async fn get_via(addr: SocketAddr, h2c: bool, url: &str) -> (u16, String) {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.enforce_http(true);
    let to = Fixed(connector, addr);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(h2c)
        .build(to);
    let req = Request::get(url).body(Empty::new()).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
}

/// A connector that connects to one address whatever the URL says.
#[derive(Clone)]
struct Fixed(
    hyper_util::client::legacy::connect::HttpConnector,
    SocketAddr,
);

impl tower::Service<http::Uri> for Fixed {
    type Response =
        <hyper_util::client::legacy::connect::HttpConnector as tower::Service<http::Uri>>::Response;
    type Error =
        <hyper_util::client::legacy::connect::HttpConnector as tower::Service<http::Uri>>::Error;
    type Future =
        <hyper_util::client::legacy::connect::HttpConnector as tower::Service<http::Uri>>::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let uri: http::Uri = format!("http://{}", self.1).parse().unwrap();
        self.0.call(uri)
    }
}

/// Runs `cmd` to its end, killed after `limit` (then the test fails).
pub(crate) async fn run_bounded(mut cmd: Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} did not end within {limit:?}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(ms(50)).await;
    }
    child.wait_with_output().unwrap()
}

/// A `python3` that imports every one of `modules`: `python3` on `PATH`,
/// else the system's.
pub(crate) fn python_with(modules: &[&str]) -> Option<PathBuf> {
    let import = format!("import {}", modules.join(", "));
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .map(PathBuf::from)
        .find(|python| {
            Command::new(python)
                .args(["-c", &import])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// A private nginx on loopback with one HTTP/2 (h2c) server, killed on drop.
pub(crate) struct Nginx {
    child: Child,
    pub(crate) addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nginx {
    fn binary() -> Option<PathBuf> {
        if let Some(path) = std::env::var_os("GOV_TEST_NGINX") {
            return Some(path.into());
        }
        ["nginx", "/usr/sbin/nginx"]
            .into_iter()
            .map(PathBuf::from)
            .find(|nginx| {
                Command::new(nginx)
                    .arg("-v")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
    }

    /// nginx serving h2c on a free loopback port with `locations` in its one
    /// server; `None` (said on stderr) when nginx is not installed.
    pub(crate) async fn start(locations: &str) -> Option<Nginx> {
        let Some(binary) = Self::binary() else {
            eprintln!("SKIPPED: nginx is not installed (Debian: nginx; or set GOV_TEST_NGINX)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let port = {
            let probe = StdListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let prefix = dir.path().display().to_string();
        let conf = format!(
            r#"daemon off;
master_process off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen 127.0.0.1:{port} http2;
        {locations}
    }}
}}
"#
        );
        std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
        let child = Command::new(binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts");
        let nginx = Nginx { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not listen within 10 s; its log:\n{}",
                nginx.log()
            );
            tokio::time::sleep(ms(20)).await;
        }
        Some(nginx)
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

/// The HTTP/2 upstream client sends a request's body as it comes: a body
/// all there at once (up to 64 KiB inline, the rest piped), and one streamed
/// in pieces well past the stream's 2 MiB window, both echoed byte for byte
/// by an HTTP/2 upstream; the streamed one ends with trailers, after which
/// the upstream must see the end of the stream to answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_reach_an_http2_upstream_whole_whether_ready_or_streamed() {
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;

    let up = upstream().echo("/echo").start().await;
    let agent = agent()
        .upstream(&up)
        .upstream_protocol(UpstreamProtocol::Http2)
        .start()
        .await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>(
    );
    let pattern = |n: usize| -> Vec<u8> { (0..n).map(|i| (i % 251) as u8).collect() };

    // All there at once: 10 bytes, and 300 KiB (past the inline 64 KiB).
    for size in [10, 300 * 1024] {
        let body = Full::new(Bytes::from(pattern(size))).boxed();
        let req = Request::post(agent.url("/echo")).body(body).unwrap();
        let response = client.request(req).await.unwrap();
        assert_eq!(response.status(), 200);
        let echoed = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(echoed.len(), size);
        assert!(
            echoed.as_ref() == pattern(size).as_slice(),
            "{size} bytes came back changed"
        );
    }

    // Streamed: 48 pieces of 64 KiB (3 MiB), then trailers.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::convert::Infallible>>(2);
    let whole = pattern(48 * 64 * 1024);
    let pieces: Vec<Bytes> = whole
        .chunks(64 * 1024)
        .map(Bytes::copy_from_slice)
        .collect();
    tokio::spawn(async move {
        for piece in pieces {
            if tx.send(Ok(Frame::data(piece))).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-checksum", http::HeaderValue::from_static("done"));
        let _ = tx.send(Ok(Frame::trailers(trailers))).await;
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed();
    let req = Request::post(agent.url("/echo")).body(body).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(req))
        .await
        .expect("the streamed upload is answered")
        .unwrap();
    assert_eq!(response.status(), 200);
    let echoed = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(echoed.len(), whole.len());
    assert!(
        echoed.as_ref() == whole.as_slice(),
        "the streamed body came back changed"
    );
}
