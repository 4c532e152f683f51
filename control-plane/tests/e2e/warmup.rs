//! Slow start through real processes (issue 31): a third instance of `inv`
//! joins two warm ones under load and ramps from 10% over 20 s while the warm
//! ones' latency has peaks. Second by second, its share of the caller's calls
//! stays within what its weight at the caller allows: at most 1.25 x weight x
//! 1/3, plus 3 points for the sampling of a second's calls.

use super::*;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Clients calling `inv` through the caller at once, each one call after another.
const CLIENTS: usize = 16;

/// The declared ramp.
const RAMP: &str = "  capacity workers 100\n  warmup {\n    register\n    ramp 20s from 10%\n  }\n";

/// An upstream answering `name` after `base`, every `peak_every`-th call after
/// `peak` instead (0: never): a warm instance with latency peaks (a GC pause,
/// a busy neighbour).
async fn noisy_upstream(
    name: &'static str,
    base: Duration,
    peak: Duration,
    peak_every: usize,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let calls = calls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req| {
                    let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
                    async move {
                        let delay = if peak_every > 0 && n.is_multiple_of(peak_every) {
                            peak
                        } else {
                            base
                        };
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            Bytes::from_static(name.as_bytes()),
                        )))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    addr
}

/// The weight the caller's balancer gives `endpoint` of `inv`, from its
/// `/metrics`; `None` while it is not in the caller's set.
async fn weight_at_caller(admin: SocketAddr, endpoint: SocketAddr) -> Option<f64> {
    let (_, _, body) = http_get(admin, "/metrics").await;
    let series =
        format!("gov_agent_endpoint_weight_ratio{{service=\"inv\",endpoint=\"{endpoint}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
}

/// One second of the ramp as the caller saw it.
#[derive(Debug)]
struct Second {
    calls: usize,
    to_new: usize,
    /// The highest weight the caller gave the new instance in this second (or
    /// just before it).
    weight: f64,
}

impl Second {
    fn share(&self) -> f64 {
        self.to_new as f64 / self.calls.max(1) as f64
    }

    fn bound(&self) -> f64 {
        1.25 * self.weight / 3.0 + 0.03
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ramping_instance_takes_at_most_its_weight_of_a_full_share_each_second() {
    let dir = tempfile::tempdir().unwrap();
    let govd = control_plane(&dir.path().join("state")).start().await;
    // `a` and `b` start under a policy without warmup: at full weight at once.
    apply_inv_and_web(&govd, dir.path(), "  capacity workers 100\n").await;
    let web = agent("web", "web-1")
        .control_plane(&govd)
        .outbound()
        .start(dir.path())
        .await;
    let caller = web.outbound.unwrap();
    let (ms2, ms30) = (Duration::from_millis(2), Duration::from_millis(30));
    let a = agent("inv", "inv-a")
        .upstream(noisy_upstream("a", ms2, ms30, 5).await)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    let b = agent("inv", "inv-b")
        .upstream(noisy_upstream("b", ms2, ms30, 5).await)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    assert_eq!(reached(caller, 2).await, ["a", "b"]);
    // The ramp is in the config of instances that start from now on.
    apply_inv_and_web(&govd, dir.path(), RAMP).await;

    // The load: every answer with its time.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (client, stop) = (client.clone(), stop.clone());
        clients.spawn(async move {
            let mut answers: Vec<(Instant, bool)> = Vec::new();
            let mut failed = 0;
            while !stop.load(Ordering::Relaxed) {
                let req = hyper::Request::get(format!("http://{caller}/x"))
                    .header("gov-service", "inv")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let answer = tokio::time::timeout(Duration::from_secs(10), async {
                    let reply = client.request(req).await.ok()?;
                    let ok = reply.status() == 200;
                    let body = http_body_util::BodyExt::collect(reply.into_body())
                        .await
                        .ok()?
                        .to_bytes();
                    ok.then_some(body)
                })
                .await;
                match answer {
                    Ok(Some(body)) => answers.push((Instant::now(), &body[..] == b"c")),
                    _ => failed += 1,
                }
            }
            (answers, failed)
        });
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let c = agent("inv", "inv-c")
        .upstream(noisy_upstream("c", Duration::ZERO, Duration::ZERO, 0).await)
        .control_plane(&govd)
        .start(dir.path())
        .await;
    // The caller's weight for `c`, every 100 ms, until it is full (at most 60 s).
    let mut weights: Vec<(Instant, f64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(w) = weight_at_caller(web.admin, c.inbound).await {
            weights.push((Instant::now(), w));
            if w >= 1.0 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut answers, mut failed) = (Vec::new(), 0);
    while let Some(done) = clients.join_next().await {
        let (a, f) = done.unwrap();
        answers.extend(a);
        failed += f;
    }
    assert_eq!(failed, 0, "calls failed while `c` joined");
    let (Some(&(start, _)), Some(&(full, w))) = (weights.first(), weights.last()) else {
        panic!("the caller never had `c` in its set");
    };
    assert!(w >= 1.0, "`c` never reached full weight: {weights:?}");

    // Per second from the first weight the caller had for `c` to full weight.
    let mut seconds = Vec::new();
    let mut from = start;
    while from + Duration::from_secs(1) <= full {
        let to = from + Duration::from_secs(1);
        let weight = weights
            .iter()
            .filter(|(t, _)| *t < to)
            .skip_while(|(t, _)| *t < from)
            .map(|(_, w)| *w)
            .chain(
                weights
                    .iter()
                    .rev()
                    .find(|(t, _)| *t < from)
                    .map(|(_, w)| *w),
            )
            .fold(0.0, f64::max);
        let in_it = answers.iter().filter(|(t, _)| (from..to).contains(t));
        let (calls, to_new) =
            in_it.fold((0, 0), |(n, c), (_, is_c)| (n + 1, c + usize::from(*is_c)));
        seconds.push(Second {
            calls,
            to_new,
            weight,
        });
        from = to;
    }
    for (i, s) in seconds.iter().enumerate() {
        eprintln!(
            "second {i:2}: weight {:.2}, {} of {} calls to `c` ({:.3}; bound {:.3})",
            s.weight,
            s.to_new,
            s.calls,
            s.share(),
            s.bound()
        );
    }
    assert!(
        seconds.len() >= 15,
        "the ramp was seen for {} s only",
        seconds.len()
    );
    let measured: Vec<&Second> = seconds.iter().filter(|s| s.calls >= 100).collect();
    assert!(
        measured.len() >= 10,
        "too few calls per second to measure a share: {seconds:?}"
    );
    let over: Vec<_> = measured.iter().filter(|s| s.share() > s.bound()).collect();
    assert!(over.is_empty(), "over its weight's share: {over:?}");
    // And it is not starved: over the ramp it got at least half of its
    // weight's share.
    let (got, allowed) = measured.iter().fold((0.0, 0.0), |(g, a), s| {
        (
            g + s.to_new as f64,
            a + s.calls as f64 * s.weight.min(1.0) / 3.0,
        )
    });
    assert!(
        got >= allowed / 2.0,
        "`c` got {got} calls of the {allowed:.0} its weight allows"
    );

    c.stop().await;
    a.stop().await;
    b.stop().await;
}
