//! The outbound listener's balancing on loopback: real upstream servers as the
//! instances of `inventory`, one of them killed or slow, and a bounded closed-loop
//! load through the agent's outbound listener.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gov_agent::sidecar::Balance;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::support::*;

/// Clients sending calls at once, and calls each sends (one after another).
const CLIENTS: usize = 8;
const PER_CLIENT: usize = 100;

/// One call of the load.
#[derive(Debug)]
struct Call {
    /// The answer's status, or the client's error.
    result: Result<StatusCode, String>,
    /// The call started after the instance was killed.
    after_kill: bool,
}

impl Call {
    fn ok(&self) -> bool {
        matches!(self.result, Ok(StatusCode::OK))
    }
}

/// `CLIENTS` tasks sending `PER_CLIENT` calls each to `url` (naming `inventory`), each
/// bounded to 10 s; `killed` marks the calls that start after the kill; `done`
/// counts finished calls.
fn load(
    client: Http,
    url: String,
    method: Method,
    killed: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<Vec<Call>> {
    tokio::spawn(async move {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..CLIENTS {
            let (client, url, method) = (client.clone(), url.clone(), method.clone());
            let (killed, done) = (killed.clone(), done.clone());
            tasks.spawn(async move {
                let mut calls = Vec::with_capacity(PER_CLIENT);
                for _ in 0..PER_CLIENT {
                    let body = if method == Method::POST {
                        Bytes::from_static(b"one order")
                    } else {
                        Bytes::new()
                    };
                    let req = Request::builder()
                        .method(method.clone())
                        .uri(&url)
                        .header("gov-service", "inventory")
                        .body(Full::new(body))
                        .unwrap();
                    let after_kill = killed.load(Ordering::SeqCst);
                    let result =
                        match tokio::time::timeout(Duration::from_secs(10), client.send(req)).await
                        {
                            Ok(Ok(reply)) => Ok(reply.status),
                            Ok(Err(e)) => Err(e),
                            Err(_) => Err("timed out after 10s".to_owned()),
                        };
                    done.fetch_add(1, Ordering::SeqCst);
                    calls.push(Call { result, after_kill });
                }
                calls
            });
        }
        let mut all = Vec::new();
        while let Some(calls) = tasks.join_next().await {
            all.extend(calls.unwrap());
        }
        all
    })
}

/// Waits (at most 10 s) until `done` reaches `n`.
async fn until_done(done: &AtomicU64, n: u64) {
    for _ in 0..1000 {
        if done.load(Ordering::SeqCst) >= n {
            return;
        }
        tokio::time::sleep(ms(10)).await;
    }
    panic!("the load did not reach {n} calls in 10s");
}

/// The value of one series in a `/metrics` text.
fn series(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

/// Kills one of two instances in the middle of a closed-loop load of `method` calls;
/// checks that the killed one was ejected; returns the calls and the calls the
/// surviving instance received.
async fn kill_one_under_load(method: Method) -> (Vec<Call>, u64) {
    let a = upstream().echo("/work").start().await;
    let b = upstream().echo("/work").start().await;
    let local = upstream().start().await;
    let agent = agent()
        .upstream(&local)
        .instances("inventory", &[&a, &b])
        .start()
        .await;
    let (killed, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let load = load(
        http(),
        agent.outbound_url("/work"),
        method,
        killed.clone(),
        done.clone(),
    );
    until_done(&done, (CLIENTS * PER_CLIENT / 4) as u64).await;
    let b_addr = b.addr;
    assert!(
        b.received() > 0,
        "the second instance took no call before the kill"
    );
    b.kill().await;
    killed.store(true, Ordering::SeqCst);
    let calls = load.await.unwrap();
    assert!(
        calls.iter().filter(|c| c.after_kill).count() >= CLIENTS * PER_CLIENT / 2,
        "too few calls after the kill to show anything"
    );
    let metrics = http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    let ejections = series(
        &metrics,
        &format!(
            "gov_agent_endpoint_ejections_total{{service=\"inventory\",endpoint=\"{b_addr}\"}}"
        ),
    );
    assert!(
        ejections.is_some_and(|n| n >= 1.0),
        "the killed instance was not ejected:\n{metrics}"
    );
    (calls, a.received())
}

/// GETs: a call that cannot connect goes to the other instance, and one whose
/// kept-alive connection died unanswered is sent again; so once the instance is gone
/// no GET fails. Calls in flight on it at the kill may fail (at most one per client).
#[tokio::test]
async fn a_killed_instance_fails_no_get_after_its_port_closed() {
    let (calls, _) = kill_one_under_load(Method::GET).await;
    let failed_after: Vec<_> = calls.iter().filter(|c| c.after_kill && !c.ok()).collect();
    assert!(
        failed_after.is_empty(),
        "GETs failed after the kill: {failed_after:?}"
    );
    let failed = calls.iter().filter(|c| !c.ok()).count();
    assert!(failed <= CLIENTS, "{failed} GETs failed in all");
}

/// POSTs with a body: a call that cannot connect goes to the other instance (nothing
/// was sent), but one that was sent and died unanswered is not sent again (it may
/// have been processed). The bound: only calls in flight on the killed instance at
/// the kill fail, at most one per client. A call sent on a kept-alive connection to
/// it whose close the agent had not seen yet would fail too; on loopback the close
/// reaches the agent before the next call does, so none fails after the kill.
#[tokio::test]
async fn a_killed_instance_fails_only_the_posts_in_flight_on_it() {
    let (calls, a_took) = kill_one_under_load(Method::POST).await;
    let failed_after: Vec<_> = calls.iter().filter(|c| c.after_kill && !c.ok()).collect();
    assert!(
        failed_after.is_empty(),
        "POSTs failed after the kill: {failed_after:?}"
    );
    let failed = calls.iter().filter(|c| !c.ok()).count();
    assert!(failed <= CLIENTS, "{failed} POSTs failed in all");
    let ok_after = calls.iter().filter(|c| c.after_kill && c.ok()).count();
    assert!(
        a_took as usize >= ok_after,
        "calls after the kill reached the killed instance"
    );
}

/// hyper's path (HTTP/2 here): a call without a body that cannot connect goes to the
/// other instance; a call with a body cannot be sent again there, and fails until
/// the dead instance is ejected: at most `EJECT_AFTER` (5) failures.
#[tokio::test]
async fn hyper_path_retries_bodiless_calls_and_ejects_a_dead_instance() {
    let a = upstream().echo("/work").start().await;
    // A port with nothing listening.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        Upstream::at(listener.local_addr().unwrap())
    };
    let local = upstream().start().await;
    let agent = agent()
        .upstream(&local)
        .instances("inventory", &[&a, &dead])
        .start()
        .await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let url = agent.outbound_url("/work");
    let send = |method: Method, body: &'static [u8]| {
        let req = Request::builder()
            .method(method)
            .uri(&url)
            .header("gov-service", "inventory")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        let h2 = h2.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), h2.request(req))
                .await
                .ok()
                .and_then(Result::ok)
                .map(|r| r.status())
        }
    };
    for _ in 0..20 {
        assert_eq!(send(Method::GET, b"").await, Some(StatusCode::OK));
    }
    let mut failed = 0;
    for _ in 0..20 {
        if send(Method::POST, b"one order").await != Some(StatusCode::OK) {
            failed += 1;
        }
    }
    assert!(failed <= 5, "{failed} POSTs failed");
    assert_eq!(a.received(), 40 - failed);
}

/// Serves `CLIENTS` x `PER_CLIENT` GETs through an agent balancing with `balance` over
/// a fast instance and one 10x slower; returns the calls the slow one received.
/// 5 ms and 50 ms rather than 2 and 20: a loaded machine adds a few ms of
/// scheduling to both, which at 2 and 20 brought the ratio the balancer sees
/// near 4x (peak-EWMA then sent 180 of 800 to the slow one, at load 6).
async fn slow_share(balance: Balance) -> u64 {
    let fast = upstream().fast("/work", ms(5)).start().await;
    let slow = upstream().slow("/work", ms(50)).start().await;
    let local = upstream().start().await;
    let agent = agent()
        .upstream(&local)
        .balance(balance)
        .instances("inventory", &[&fast, &slow])
        .start()
        .await;
    let (killed, done) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let calls = load(
        http(),
        agent.outbound_url("/work"),
        Method::GET,
        killed,
        done,
    )
    .await
    .unwrap();
    let failed: Vec<_> = calls.iter().filter(|c| !c.ok()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(
        fast.received() + slow.received(),
        (CLIENTS * PER_CLIENT) as u64
    );
    slow.received()
}

/// Round robin gives the slow instance half of the calls; peak-EWMA sends it a small
/// share: counts with a wide margin, no clock in the assertion.
#[tokio::test]
async fn a_ten_times_slower_instance_gets_a_clearly_smaller_share_than_round_robin() {
    let total = (CLIENTS * PER_CLIENT) as u64;
    let round_robin = slow_share(Balance::RoundRobin).await;
    assert!(
        round_robin >= total * 45 / 100,
        "round robin sent {round_robin} of {total} calls to the slow instance"
    );
    let peak_ewma = slow_share(Balance::PeakEwma).await;
    assert!(
        peak_ewma <= total / 5,
        "peak-EWMA sent {peak_ewma} of {total} calls to the slow instance (round robin: {round_robin})"
    );
}

/// An instance that accepts connections and hangs up on every request without a
/// byte of answer (a process dying with calls in flight, or a hostile one); returns
/// it and the request heads it received.
async fn hang_up_instance() -> (Upstream, Arc<AtomicU64>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(AtomicU64::new(0));
    let counted = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0_u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                counted.fetch_add(1, Ordering::SeqCst);
                // Dropped: the connection closes with no answer.
            });
        }
    });
    (Upstream::at(addr), heads)
}

/// One call of `method` through `agent`'s outbound listener to `inventory`.
async fn call(agent: &Agent, method: Method, body: &'static [u8]) -> Option<StatusCode> {
    let req = Request::builder()
        .method(method)
        .uri(agent.outbound_url("/work"))
        .header("gov-service", "inventory")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), http().send(req))
        .await
        .ok()
        .and_then(Result::ok)
        .map(|r| r.status)
}

/// A call that got no answer at all, on a new connection as on a kept-alive one, is
/// sent once more if it has no body and an idempotent method, and to another
/// instance: an instance that hangs up may be going away (a killed instance closes
/// its connections before its port). A call with a body is not sent again (it may
/// have been processed), and no call is sent more than twice: with every instance
/// hanging up, a GET gets 502 after exactly two attempts.
#[tokio::test]
async fn a_call_answered_by_a_hang_up_is_sent_once_more_elsewhere_only_without_a_body() {
    let good = upstream().echo("/work").start().await;
    let (rude, rude_heads) = hang_up_instance().await;
    let local = upstream().start().await;
    let agent = agent()
        .upstream(&local)
        .instances("inventory", &[&good, &rude])
        .start()
        .await;
    // POSTs first (the hang-ups eject the rude instance after 5).
    let mut failed = 0;
    for _ in 0..10 {
        match call(&agent, Method::POST, b"one order").await {
            Some(StatusCode::OK) => {}
            Some(StatusCode::BAD_GATEWAY) => failed += 1,
            other => panic!("a POST got {other:?}"),
        }
    }
    assert_eq!(good.received(), 10 - failed, "a POST was sent twice");
    assert_eq!(rude_heads.load(Ordering::SeqCst), failed);
    let agent = agent_over(&local, &[&good, &rude]).await;
    let before = (good.received(), rude_heads.load(Ordering::SeqCst));
    // Each GET's first pick is `rude` about half the time until it is ejected.
    for _ in 0..20 {
        assert_eq!(call(&agent, Method::GET, b"").await, Some(StatusCode::OK));
    }
    assert_eq!(
        good.received() - before.0,
        20,
        "every GET answered by `good`"
    );
    assert!(
        rude_heads.load(Ordering::SeqCst) > before.1,
        "no GET went to the rude instance first: nothing was shown"
    );

    // Both hang up: two attempts per GET, then 502.
    let (rude2, rude2_heads) = hang_up_instance().await;
    let agent = agent_over(&local, &[&rude, &rude2]).await;
    let before = rude_heads.load(Ordering::SeqCst);
    for _ in 0..2 {
        assert_eq!(
            call(&agent, Method::GET, b"").await,
            Some(StatusCode::BAD_GATEWAY)
        );
    }
    assert_eq!(
        rude_heads.load(Ordering::SeqCst) - before + rude2_heads.load(Ordering::SeqCst),
        4,
        "each GET was sent exactly twice"
    );
}

async fn agent_over(local: &Upstream, instances: &[&Upstream]) -> Agent {
    agent()
        .upstream(local)
        .instances("inventory", instances)
        .start()
        .await
}

/// hyper's path: a call to an instance that accepts and never answers is cut off
/// by the engine's deadline (504), and the time it waited is that instance's
/// latency sample, so peak-EWMA stops sending calls there: an instance that hangs
/// must not look fast (it has no other sample, and would cost nothing idle).
#[tokio::test]
async fn an_instance_that_hangs_costs_its_timeouts_and_is_avoided() {
    // Accepts, reads, never answers; keeps the connections open.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang = Upstream::at(listener.local_addr().unwrap());
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            keep.lock().unwrap().push(stream);
        }
    });
    let fast = upstream().fast("/work", ms(0)).start().await;
    let local = upstream().start().await;
    let agent = agent()
        .config(
            r#"
service: shop
rules:
  - name: shop/inventory_calls
    on: { calls_to: inventory }
    direction: DIRECTION_OUTBOUND
    bulkhead:
      max_concurrent: 100
      timeout_ms: 200
"#,
        )
        .upstream(&local)
        .instances("inventory", &[&hang, &fast])
        .start()
        .await;
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut timed_out = 0;
    for _ in 0..30 {
        let req = Request::get(agent.outbound_url("/work"))
            .header("gov-service", "inventory")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), h2.request(req))
            .await
            .expect("answered in time")
            .unwrap()
            .status();
        match status {
            StatusCode::OK => {}
            StatusCode::GATEWAY_TIMEOUT => timed_out += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(timed_out >= 1, "no call went to the hanging instance");
    assert!(
        timed_out <= 3,
        "{timed_out} of 30 calls went to the hanging instance"
    );
    assert!(!held.lock().unwrap().is_empty());
}

/// The ejection time of the declared policy below.
const DECLARED_EJECT: Duration = Duration::from_secs(5);

/// `outlier to inventory { consecutive_failures 2  eject 5s growth 1x max 5s
/// max_ejected 50% }`, as `govc compile` writes it.
const OUTLIER_CONFIG: &str = r#"
service: shop
version: outlier-v1
consumer_header: x-gov-consumer
outlier_targets:
  - service: inventory
    policy:
      consecutive_failures: 2
      eject_ms: 5000
      growth: 1
      max_eject_ms: 5000
      max_ejected_milli_percent: 50000
"#;

/// The declared outlier policy, end to end on loopback: an instance that hangs
/// up on every call is ejected after the declared 2 failures (not the default
/// 5), gets no call while its declared ejection lasts, then gets calls again
/// (the probe) and, failing twice more, is ejected again; every GET is answered
/// by the good instance (the retry elsewhere). Without the policy the rude
/// instance takes calls until its fifth failure.
#[tokio::test]
async fn a_declared_outlier_policy_keeps_calls_off_an_instance_for_its_time_then_probes_it() {
    let good = upstream().echo("/work").start().await;
    let (rude, rude_heads) = hang_up_instance().await;
    let rude_addr = rude.addr;
    let local = upstream().start().await;
    let agent = agent()
        .upstream(&local)
        .instances("inventory", &[&good, &rude])
        .config(OUTLIER_CONFIG)
        .start()
        .await;
    let ejections = |agent: &Agent| {
        let agent_url = agent.admin_url("/metrics");
        async move {
            let metrics = http().get(&agent_url).await.unwrap().text();
            series(
                &metrics,
                &format!(
                    "gov_agent_endpoint_ejections_total{{service=\"inventory\",endpoint=\"{rude_addr}\"}}"
                ),
            )
            .unwrap_or(0.0)
        }
    };
    let mut sent = 0;
    while rude_heads.load(Ordering::SeqCst) < 2 {
        assert!(
            sent < 200,
            "200 GETs and the rude instance got fewer than 2"
        );
        assert_eq!(call(&agent, Method::GET, b"").await, Some(StatusCode::OK));
        sent += 1;
    }
    let ejected_at = tokio::time::Instant::now();
    assert_eq!(ejections(&agent).await, 1.0, "ejected after 2 failures");

    // While it is out: nothing reaches it (checked while well within the
    // ejection: a machine too slow to send 30 calls in 4 s shows nothing).
    for _ in 0..30 {
        assert_eq!(call(&agent, Method::GET, b"").await, Some(StatusCode::OK));
    }
    if ejected_at.elapsed() < DECLARED_EJECT - Duration::from_secs(1) {
        assert_eq!(
            rude_heads.load(Ordering::SeqCst),
            2,
            "a call reached the instance during its declared ejection"
        );
    }

    // After it: probed again, and ejected again after 2 more failures.
    tokio::time::sleep_until(ejected_at + DECLARED_EJECT + Duration::from_millis(100)).await;
    let mut sent = 0;
    while rude_heads.load(Ordering::SeqCst) < 4 {
        assert!(sent < 200, "200 GETs after the ejection and no probe");
        assert_eq!(call(&agent, Method::GET, b"").await, Some(StatusCode::OK));
        sent += 1;
    }
    assert_eq!(
        ejections(&agent).await,
        2.0,
        "ejected again after 2 failures"
    );
}
