//! SIGTERM under load against the real `gov-agent` binary: the agent stops accepting
//! (new connections are refused), answers every request it accepted, and exits 0
//! well before its drain deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

use crate::support::{binary, http, ms, upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_no_accepted_request() {
    sigterm_under_load(1).await;
}

/// The same with two worker threads: connections served on the workers,
/// the accept loop and the drain on the agent's own thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_on_worker_threads_loses_no_accepted_request() {
    sigterm_under_load(2).await;
}

async fn sigterm_under_load(workers: usize) {
    let up = upstream().fast("/fast", ms(1)).gated("/slow").start().await;
    // A drain deadline far above anything this test waits for: an agent that waits
    // it out instead of finishing when its connections are done fails `wait` below.
    let agent = binary()
        .upstream(&up)
        .workers(workers)
        .drain(ms(60_000))
        .spawn();

    // Bounded load: 8 clients, at most 2,000 requests each, each request on a fresh
    // connection, so that a failure is either a refused connect (the agent never saw
    // the request) or a request the agent accepted and did not answer.
    let (phase, phases) = tokio::sync::watch::channel(Phase::Run);
    let parked = Arc::new(AtomicUsize::new(0));
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (addr, phases, parked) = (agent.inbound, phases.clone(), parked.clone());
        loops.spawn(async move { run_until_held(addr, "/fast", 2000, phases, parked).await });
    }
    // Let the load run, then hold four slow requests in flight at the upstream.
    let deadline = Instant::now() + Duration::from_secs(30);
    while up.completed() < 200 {
        assert!(Instant::now() < deadline, "the load never got going");
        tokio::time::sleep(ms(5)).await;
    }
    let mut slow = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let addr = agent.inbound;
        slow.spawn(async move { request(addr, "/slow", Duration::from_secs(60)).await });
    }
    while up.in_flight("/slow") < 4 {
        assert!(Instant::now() < deadline, "the slow requests never arrived");
        tokio::time::sleep(ms(2)).await;
    }
    // The fast clients finish the request they are on and wait before their next
    // connect; then SIGTERM. (Connects racing the signal are the next test's.)
    phase.send_replace(Phase::Hold);
    while parked.load(Ordering::SeqCst) < 8 {
        assert!(Instant::now() < deadline, "the fast clients never stopped");
        tokio::time::sleep(ms(2)).await;
    }
    agent.terminate();

    // New connections are refused while the accepted slow requests are still held:
    // the listener closes when the drain begins, not when the process exits.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let connect = tokio::net::TcpStream::connect(agent.inbound);
        match tokio::time::timeout(Duration::from_secs(1), connect).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            // Accepted, reset in the backlog while the listener was closing, or
            // waiting in a full backlog.
            Ok(Ok(_) | Err(_)) | Err(_) => {
                assert!(
                    Instant::now() < deadline,
                    "still accepting connections 10 s after SIGTERM"
                );
                tokio::time::sleep(ms(5)).await;
            }
        }
    }
    assert_eq!(up.in_flight("/slow"), 4, "a held slow request ended early");
    // Every fast client's next connect is refused.
    phase.send_replace(Phase::Resume);

    // Every slow request that was in flight completes once the upstream answers.
    up.open_gate();
    while let Some(result) = slow.join_next().await {
        let status = match result.unwrap() {
            Ok(status) => status,
            Err(Refused | ResetAtConnect) => panic!("a slow request was not connected"),
            Err(Failed(e)) => panic!("an in-flight request was dropped: {e}"),
        };
        assert_eq!(status, StatusCode::OK);
    }
    let mut ok = 0;
    let mut failures = Vec::new();
    while let Some(result) = loops.join_next().await {
        let (n, failure) = result.unwrap();
        ok += n;
        failures.extend(failure);
    }
    eprintln!(
        "delivered {ok} fast + 4 slow; upstream received {}; failures: {failures:?}",
        up.received()
    );
    assert!(
        failures.is_empty(),
        "requests failed, or a connect after SIGTERM was not refused: {failures:?}"
    );
    let status = agent.wait(Duration::from_secs(20));
    assert_eq!(
        status,
        Some(0),
        "gov-agent did not exit 0 within 20 s of its last request (drain deadline 60 s)"
    );

    // No rule rejects here, so what the agent accepted is what reached the upstream;
    // the upstream answered all of it, and every answer reached its client.
    assert_eq!(up.received(), up.completed());
    assert_eq!(
        ok + 4,
        up.completed(),
        "requests answered by the upstream but not delivered"
    );
}

/// What the fast clients do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Send requests; each must be answered 200.
    Run,
    /// Finish the request in progress, then wait.
    Hold,
    /// Connect once more, which must be refused.
    Resume,
}

/// GETs `path` on fresh connections up to `max` times while `phases` says `Run`;
/// then counts itself in `parked`, waits for `Resume`, and connects once more.
/// Returns the successes, and the first failure: a request not answered 200, or a
/// last connect that was not refused.
async fn run_until_held(
    addr: SocketAddr,
    path: &str,
    max: usize,
    mut phases: tokio::sync::watch::Receiver<Phase>,
    parked: Arc<AtomicUsize>,
) -> (u64, Option<String>) {
    let mut ok = 0;
    for _ in 0..max {
        if *phases.borrow() != Phase::Run {
            break;
        }
        match request(addr, path, Duration::from_secs(10)).await {
            Ok(StatusCode::OK) => ok += 1,
            Ok(status) => return (ok, Some(format!("status {status}"))),
            Err(Refused | ResetAtConnect) => {
                return (ok, Some("before SIGTERM: connect failed".to_owned()));
            }
            Err(Failed(e)) => return (ok, Some(format!("before SIGTERM: {e}"))),
        }
    }
    parked.fetch_add(1, Ordering::SeqCst);
    let resumed = tokio::time::timeout(
        Duration::from_secs(30),
        phases.wait_for(|p| *p == Phase::Resume),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    if !resumed {
        return (ok, Some("never resumed".to_owned()));
    }
    match request(addr, path, Duration::from_secs(10)).await {
        Err(Refused) => (ok, None),
        Err(ResetAtConnect) => (ok, Some("after SIGTERM: connect reset".to_owned())),
        Err(Failed(e)) => (ok, Some(format!("after SIGTERM: {e}"))),
        Ok(status) => (ok, Some(format!("after SIGTERM: answered {status}"))),
    }
}

/// Why a request got no response.
#[derive(Debug)]
enum Failure {
    /// The connect was refused: the agent never saw the request.
    Refused,
    /// The handshake was reset before the connect returned: nothing was sent
    /// (a connect completing as the listener closed).
    ResetAtConnect,
    /// Anything else (a connect error other than refused, a reset, an early close,
    /// a timeout): a request the agent may have accepted got no answer.
    Failed(String),
}
use Failure::{Failed, Refused, ResetAtConnect};

/// One GET on a fresh connection, bounded by `limit`, the connect told apart from
/// the exchange.
async fn request(addr: SocketAddr, path: &str, limit: Duration) -> Result<StatusCode, Failure> {
    let stream = match tokio::net::TcpStream::connect(addr).await {
        Ok(stream) => stream,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Err(Refused),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Err(ResetAtConnect),
        Err(e) => return Err(Failed(format!("connect: {e}"))),
    };
    let exchange = async {
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e:?}"))?;
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header("host", addr.to_string())
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = send
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e:?}"))?;
        let status = response.status();
        response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e:?}"))?;
        Ok::<_, String>(status)
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(result) => result.map_err(Failed),
        Err(_) => Err(Failed(format!("no answer in {limit:?}"))),
    }
}

/// New connections racing SIGTERM: 16 clients connect and send a GET as fast as
/// they can while the signal lands, in several rounds (each a fresh agent: the race
/// is one of timing). A connection the agent accepted has its first request read
/// and answered, even when its bytes arrive with the stop, and the connects in the
/// listen backlog are accepted and served before the listener closes: every
/// request is answered 200 or its connect is refused, never reset or closed
/// unanswered. (Before, about one round in three lost a request this way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_racing_sigterm_on_new_connections_are_answered_or_refused() {
    const ROUNDS: usize = 6;
    const CLIENTS: usize = 16;
    let up = upstream().fast("/fast", ms(1)).start().await;
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let agent = binary().upstream(&up).drain(ms(30_000)).spawn();
        let before = up.completed();
        let mut clients = tokio::task::JoinSet::new();
        for _ in 0..CLIENTS {
            let addr = agent.inbound;
            clients.spawn(async move { until_refused(addr, 20_000).await });
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while up.completed() < before + 100 {
            assert!(
                Instant::now() < deadline,
                "round {round}: the load never got going"
            );
            tokio::time::sleep(ms(1)).await;
        }
        agent.terminate();
        let mut ok = 0;
        while let Some(result) = clients.join_next().await {
            let (n, failure) = result.unwrap();
            ok += n;
            failures.extend(failure.map(|f| format!("round {round}: {f}")));
        }
        assert_eq!(
            agent.wait(Duration::from_secs(20)),
            Some(0),
            "round {round}: gov-agent did not exit 0 within 20 s of its last request"
        );
        // No rule rejects: what the upstream answered is what reached the clients.
        assert_eq!(
            ok,
            up.completed() - before,
            "round {round}: requests answered by the upstream but not delivered"
        );
        eprintln!("round {round}: {ok} answered, then refused");
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Connections that never send a request (idle, or a hostile client holding
/// sockets open) do not hold the drain: the first request's grace after SIGTERM is
/// short (1 s), then they are closed, and the agent exits long before its 60 s
/// drain deadline (or the 30 s header-read timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_at_sigterm_are_closed_after_a_short_grace() {
    use tokio::io::AsyncReadExt;
    let up = upstream().fast("/fast", ms(1)).start().await;
    let agent = binary().upstream(&up).drain(ms(60_000)).spawn();
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(tokio::net::TcpStream::connect(agent.inbound).await.unwrap());
    }
    // Answered on a later connection: the silent ones were accepted before it.
    assert_eq!(
        request(agent.inbound, "/fast", Duration::from_secs(10))
            .await
            .ok(),
        Some(StatusCode::OK)
    );
    agent.terminate();
    for mut conn in silent {
        let mut buf = [0_u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(15), conn.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0) | Err(_))),
            "a silent connection was not closed within 15 s of SIGTERM: {read:?}"
        );
    }
    assert_eq!(
        agent.wait(Duration::from_secs(15)),
        Some(0),
        "gov-agent did not exit 0 soon after SIGTERM (drain deadline 60 s)"
    );
}

/// GETs `/fast` on fresh connections, at most `max` times, until a connect is
/// refused: the successes, and the first request that got neither a 200 nor a
/// refused connect.
async fn until_refused(addr: SocketAddr, max: usize) -> (u64, Option<String>) {
    let mut ok = 0;
    for _ in 0..max {
        match request(addr, "/fast", Duration::from_secs(10)).await {
            Ok(StatusCode::OK) => ok += 1,
            Ok(status) => return (ok, Some(format!("answered {status}"))),
            // Nothing was sent either way: a client can retry both. (A reset at
            // connect is a handshake that completed in the microseconds between
            // the agent's last accept of its backlog and the close.)
            Err(Refused | ResetAtConnect) => return (ok, None),
            Err(Failed(e)) => return (ok, Some(e)),
        }
    }
    (ok, Some(format!("not refused after {max} requests")))
}

/// `gov-agent 2>&1 | head`: with stderr a closed pipe, SIGTERM still drains and
/// exits 0 (the log write of "received signal" used to panic and exit 101).
#[tokio::test]
async fn sigterm_with_a_closed_stderr_still_stops_cleanly() {
    let up = upstream().fast("/fast", ms(1)).start().await;
    let agent = binary()
        .upstream(&up)
        .drain(ms(500))
        .close_stderr_after_start()
        .spawn();
    // A request writes no log line, but proves the agent serves with stderr closed.
    let reply = http().get(&agent.url("/fast")).await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    agent.terminate();
    assert_eq!(agent.wait(Duration::from_secs(10)), Some(0));
}
