//! Tools for `bench/proxy.sh` (not a criterion benchmark): a hello-world upstream and
//! an open-loop, fixed-rate load generator with latency correction.
//!
//! ```text
//! proxy_load upstream 127.0.0.1:18080
//! proxy_load upstream 127.0.0.1:18080 DELAY_MS                # answers after a delay
//! proxy_load upstream 127.0.0.1:18080 DELAY_MS PEAK_MS EVERY  # every EVERY-th call after PEAK_MS
//! proxy_load rate http://127.0.0.1:18081/ RATE SECONDS CONNECTIONS [HOST]
//! proxy_load rate-h2 http://127.0.0.1:18081/ RATE SECONDS CONNECTIONS [grpc]
//! proxy_load naive-proxy 127.0.0.1:18084 127.0.0.1:18080   # reference: hyper + pooled client
//! proxy_load conn-proxy 127.0.0.1:18084 127.0.0.1:18080    # reference: one upstream conn per client conn
//! ```
//!
//! `rate` schedules request `i` at `start + i / RATE` whatever happened before (open
//! loop) and measures each latency from that scheduled time, so a stall shows up in
//! the latency of every request queued behind it (as `oha --latency-correction` and
//! wrk2 do). Requests go over `CONNECTIONS` keep-alive HTTP/1.1 connections. It
//! prints one line of `key=value` pairs: counts, achieved rate and percentiles in
//! microseconds. `ok` and the percentiles count 2xx answers only; any other status
//! (a 429 or 503 from a limit or fuse) counts in `rejected` and keeps its
//! connection, so `achieved_rps` is the goodput under overload. Waits shorter than
//! a millisecond spin (yielding to the runtime) because tokio's timer has
//! millisecond resolution. With `LOAD_CONSUMER=NAME` in the environment,
//! `rate` sends `x-gov-consumer: NAME` (bench/fairness.sh).
//!
//! The upstream speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on one port,
//! and answers a gRPC call (`content-type: application/grpc`) with one empty
//! message and `grpc-status: 0` in the trailers. `rate-h2` is the same open loop
//! over `CONNECTIONS` h2c connections, requests multiplexed on them; with `grpc`
//! each request is a unary gRPC call (POST, one empty message) and counts as `ok`
//! only if its trailers say `grpc-status: 0` (a gRPC rejection answers HTTP 200
//! with another status, so it counts in `rejected`).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    // `cargo bench` passes `--bench`; ignore it.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["upstream", addr] => runtime.block_on(upstream(addr, Duration::ZERO, None)),
        ["upstream", addr, delay_ms] => runtime.block_on(upstream(
            addr,
            Duration::from_millis(delay_ms.parse()?),
            None,
        )),
        ["upstream", addr, delay_ms, peak_ms, every] => runtime.block_on(upstream(
            addr,
            Duration::from_millis(delay_ms.parse()?),
            Some((Duration::from_millis(peak_ms.parse()?), every.parse()?)),
        )),
        ["naive-proxy", listen, to] => runtime.block_on(naive_proxy(listen, to)),
        ["conn-proxy", listen, to] => runtime.block_on(conn_proxy(listen, to)),
        ["rate-h2", url, rate, secs, conns] => runtime.block_on(open_loop_h2(
            url.parse()?,
            rate.parse()?,
            Duration::from_secs(secs.parse()?),
            conns.parse()?,
            false,
        )),
        ["rate-h2", url, rate, secs, conns, "grpc"] => runtime.block_on(open_loop_h2(
            url.parse()?,
            rate.parse()?,
            Duration::from_secs(secs.parse()?),
            conns.parse()?,
            true,
        )),
        ["rate", url, rate, secs, conns] => runtime.block_on(open_loop(
            url.parse()?,
            rate.parse()?,
            Duration::from_secs(secs.parse()?),
            conns.parse()?,
            None,
        )),
        // With a `host` header naming the called service (an agent's outbound listener).
        ["rate", url, rate, secs, conns, host] => runtime.block_on(open_loop(
            url.parse()?,
            rate.parse()?,
            Duration::from_secs(secs.parse()?),
            conns.parse()?,
            Some(host.to_string()),
        )),
        [] => Ok(()), // `cargo bench` without arguments: nothing to do.
        _ => Err(
            "usage: proxy_load upstream ADDR [DELAY_MS [PEAK_MS EVERY]] | rate URL RATE SECONDS CONNECTIONS [HOST] \
             | rate-h2 URL RATE SECONDS CONNECTIONS [grpc]"
                .into(),
        ),
    }
}

/// A hello-world server (13-byte body), as in performance.md section 3.4, on
/// HTTP/1.1 and h2c, answering after `delay` (none: at once), or with `peaks`
/// `(peak, every)` every `every`-th call after `peak` (a warm instance's latency
/// peaks, for bench/warmup.sh). A gRPC call gets one empty message and
/// `grpc-status: 0`.
async fn upstream(
    addr: &str,
    delay: Duration,
    peaks: Option<(Duration, u64)>,
) -> Result<(), Error> {
    let listener = TcpListener::bind(addr).await?;
    let calls = Arc::new(AtomicU64::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let calls = calls.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
                let delay = match peaks {
                    Some((peak, every)) if every > 0 && n.is_multiple_of(every) => peak,
                    _ => delay,
                };
                async move {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    let grpc = req
                        .headers()
                        .get(http::header::CONTENT_TYPE)
                        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                    if grpc {
                        // Drain the request message before answering, as a server does.
                        let _ = req.into_body().collect().await;
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        let frames = [
                            Ok::<_, Infallible>(Frame::data(Bytes::from_static(&[0, 0, 0, 0, 0]))),
                            Ok(Frame::trailers(trailers)),
                        ];
                        let body = StreamBody::new(futures::stream::iter(frames));
                        let mut res = Response::new(BodyExt::boxed(body));
                        res.headers_mut().insert(
                            http::header::CONTENT_TYPE,
                            http::HeaderValue::from_static("application/grpc"),
                        );
                        return Ok::<_, Infallible>(res);
                    }
                    Ok(Response::new(BodyExt::boxed(Full::new(
                        Bytes::from_static(b"Hello, World!"),
                    ))))
                }
            });
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
        });
    }
}

/// The reference proxy of performance.md section 3.2: hyper's HTTP/1 server in front
/// of hyper-util's pooled client, nothing else (no policy, no header rewriting).
async fn naive_proxy(listen: &str, to: &str) -> Result<(), Error> {
    use hyper_util::client::legacy::{Client, connect::HttpConnector};
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, hyper::body::Incoming> =
        Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
    let to: http::uri::Authority = to.parse()?;
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let client = client.clone();
        let to = to.clone();
        tokio::spawn(async move {
            let service = service_fn(move |mut req: Request<hyper::body::Incoming>| {
                let client = client.clone();
                let to = to.clone();
                async move {
                    let mut parts = http::uri::Parts::default();
                    parts.scheme = Some(http::uri::Scheme::HTTP);
                    parts.authority = Some(to);
                    parts.path_and_query = req.uri().path_and_query().cloned();
                    if let Ok(uri) = Uri::from_parts(parts) {
                        *req.uri_mut() = uri;
                    }
                    client.request(req).await
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A proxy with one upstream connection per client connection, both driven by the
/// client connection's task (no pool, no second task, no channel between tasks).
async fn conn_proxy(listen: &str, to: &str) -> Result<(), Error> {
    let listener = TcpListener::bind(listen).await?;
    let to = to.to_owned();
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let to = to.clone();
        tokio::spawn(async move {
            let Ok(up) = TcpStream::connect(&to).await else {
                return;
            };
            let _ = up.set_nodelay(true);
            let Ok((sender, conn)) =
                hyper::client::conn::http1::handshake::<_, hyper::body::Incoming>(TokioIo::new(up))
                    .await
            else {
                return;
            };
            let sender = std::sync::Arc::new(tokio::sync::Mutex::new(sender));
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let sender = sender.clone();
                async move {
                    let mut sender = sender.lock().await;
                    sender.ready().await?;
                    sender.send_request(req).await
                }
            });
            let server = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let mut server = std::pin::pin!(server);
            tokio::select! {
                _ = &mut server => {}
                _ = &mut conn => { let _ = server.await; }
            }
        });
    }
}

/// Open-loop load at `rate` requests per second for `duration` over `conns`
/// connections.
async fn open_loop(
    uri: Uri,
    rate: u64,
    duration: Duration,
    conns: usize,
    host: Option<String>,
) -> Result<(), Error> {
    let authority = uri.authority().ok_or("the URL needs host:port")?.clone();
    let total = rate * duration.as_secs();
    let period = Duration::from_nanos(1_000_000_000 / rate.max(1));

    // Free connections announce themselves here; each worker has its own inbox.
    let (free_tx, mut free_rx) = mpsc::unbounded_channel::<usize>();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Result<Option<u32>, ()>>();
    let mut inboxes = Vec::with_capacity(conns);
    for id in 0..conns {
        let stream = TcpStream::connect(authority.as_str()).await?;
        stream.set_nodelay(true)?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let (tx, mut rx) = mpsc::unbounded_channel::<Instant>();
        inboxes.push(tx);
        let free_tx = free_tx.clone();
        let done_tx = done_tx.clone();
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        let host = host.clone().unwrap_or_else(|| authority.to_string());
        let consumer = std::env::var("LOAD_CONSUMER").ok();
        tokio::spawn(async move {
            let _ = free_tx.send(id);
            while let Some(scheduled) = rx.recv().await {
                // Origin-form (`GET /path`), as oha and browsers send to a server.
                let mut req = Request::get(path.clone()).header(http::header::HOST, host.as_str());
                if let Some(c) = &consumer {
                    req = req.header("x-gov-consumer", c.as_str());
                }
                let req = req.body(Empty::<Bytes>::new());
                let outcome = match req {
                    Ok(req) => match sender.send_request(req).await {
                        Ok(res) => {
                            let success = res.status().is_success();
                            match res.into_body().collect().await {
                                Ok(_) if success => Ok(Some(micros(scheduled.elapsed()))),
                                Ok(_) => Ok(None),
                                Err(_) => Err(()),
                            }
                        }
                        Err(_) => Err(()),
                    },
                    Err(_) => Err(()),
                };
                let failed = outcome.is_err();
                let _ = done_tx.send(outcome);
                if failed {
                    break;
                }
                let _ = free_tx.send(id);
            }
        });
    }
    drop(done_tx);
    drop(free_tx);

    let start = Instant::now() + Duration::from_millis(10);
    for i in 0..total {
        let scheduled = start + period * u32::try_from(i)?;
        wait_until(scheduled).await;
        // Waiting for a free connection counts in the latency (measured from
        // `scheduled`).
        let Some(id) = free_rx.recv().await else {
            break;
        };
        if inboxes[id].send(scheduled).is_err() {
            break;
        }
    }
    drop(inboxes);
    report(rate, total, start, &mut done_rx).await
}

/// Open-loop load over `conns` h2c connections, requests multiplexed on them
/// (request `i` on connection `i % conns`); `grpc`: unary gRPC calls.
async fn open_loop_h2(
    uri: Uri,
    rate: u64,
    duration: Duration,
    conns: usize,
    grpc: bool,
) -> Result<(), Error> {
    let authority = uri.authority().ok_or("the URL needs host:port")?.clone();
    let total = rate * duration.as_secs();
    let period = Duration::from_nanos(1_000_000_000 / rate.max(1));
    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns.max(1) {
        let stream = TcpStream::connect(authority.as_str()).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            TokioIo::new(stream),
        )
        .await?;
        tokio::spawn(conn);
        senders.push(sender);
    }
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Result<Option<u32>, ()>>();
    let url = uri.to_string();
    let start = Instant::now() + Duration::from_millis(10);
    for i in 0..total {
        let scheduled = start + period * u32::try_from(i)?;
        wait_until(scheduled).await;
        let mut sender = senders[usize::try_from(i)? % senders.len()].clone();
        let done_tx = done_tx.clone();
        let url = url.clone();
        tokio::spawn(async move {
            let req = if grpc {
                Request::post(url)
                    .header(http::header::CONTENT_TYPE, "application/grpc")
                    .header("te", "trailers")
                    .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
            } else {
                Request::get(url).body(Full::new(Bytes::new()))
            };
            let outcome = match req {
                Ok(req) => match sender.send_request(req).await {
                    Ok(res) => {
                        let status_ok = res.status().is_success();
                        match res.into_body().collect().await {
                            Ok(body) => {
                                let grpc_ok = !grpc
                                    || body
                                        .trailers()
                                        .and_then(|t| t.get("grpc-status"))
                                        .is_some_and(|v| v == "0");
                                Ok((status_ok && grpc_ok).then(|| micros(scheduled.elapsed())))
                            }
                            Err(_) => Err(()),
                        }
                    }
                    Err(_) => Err(()),
                },
                Err(_) => Err(()),
            };
            let _ = done_tx.send(outcome);
        });
    }
    drop(done_tx);
    report(rate, total, start, &mut done_rx).await
}

/// Collects every call's outcome and prints the one result line.
async fn report(
    rate: u64,
    total: u64,
    start: Instant,
    done_rx: &mut mpsc::UnboundedReceiver<Result<Option<u32>, ()>>,
) -> Result<(), Error> {
    let mut latencies = Vec::with_capacity(usize::try_from(total)?);
    let mut errors = 0_u64;
    let mut rejected = 0_u64;
    while let Some(outcome) = done_rx.recv().await {
        match outcome {
            Ok(Some(us)) => latencies.push(us),
            Ok(None) => rejected += 1,
            Err(()) => errors += 1,
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let q = |p: f64| -> u32 {
        if latencies.is_empty() {
            return 0;
        }
        let rank = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1]
    };
    println!(
        "rate={rate} sent={total} ok={} rejected={rejected} errors={errors} achieved_rps={:.1} p50_us={} p90_us={} p99_us={} p999_us={}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        q(0.50),
        q(0.90),
        q(0.99),
        q(0.999),
    );
    Ok(())
}

/// Sleeps until `deadline`: the timer for the coarse part, then yields to the runtime
/// (which polls IO on every yield) until the deadline passes.
async fn wait_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now + Duration::from_millis(2) {
        tokio::time::sleep_until((deadline - Duration::from_millis(1)).into()).await;
    }
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}
