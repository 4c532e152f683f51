//! SIGTERM under load against the real `gov-agent` binary: the agent stops accepting,
//! finishes every request it accepted, and exits 0 within the drain deadline.

use std::time::{Duration, Instant};

use http::StatusCode;

use crate::support::{Http, binary, http, ms, upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_loses_no_accepted_request() {
    let up = upstream()
        .fast("/fast", ms(1))
        .slow("/slow", ms(300))
        .start()
        .await;
    let agent = binary().upstream(&up).drain(ms(5000)).spawn();

    // Bounded load: 8 keep-alive clients, at most 2,000 requests each, each stops at
    // its first failure (the listener closing under it).
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let client = http();
        let url = agent.url("/fast");
        loops.spawn(async move { run_until_failure(&client, &url, 2000).await });
    }
    // Let the load run, then start slow requests that are in flight at SIGTERM.
    while up.completed() < 200 {
        tokio::time::sleep(ms(5)).await;
    }
    let mut slow = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let client = http();
        let url = agent.url("/slow");
        slow.spawn(async move { client.get(&url).await });
    }
    let before = up.received();
    while up.received() < before + 4 {
        tokio::time::sleep(ms(2)).await;
    }
    let sent_at = Instant::now();
    agent.terminate();

    // Every slow request that was in flight completes.
    while let Some(result) = slow.join_next().await {
        let reply = result.unwrap().expect("an in-flight request was dropped");
        assert_eq!(reply.status, StatusCode::OK);
    }
    let mut ok = 0;
    let mut failures = Vec::new();
    while let Some(result) = loops.join_next().await {
        let (n, failure) = result.unwrap();
        ok += n;
        failures.extend(failure);
    }
    eprintln!(
        "delivered {ok} fast + 4 slow; upstream received {}; client failures: {failures:?}",
        up.received()
    );
    let status = agent.wait(Duration::from_secs(10));
    assert_eq!(status, Some(0), "gov-agent did not exit 0 after SIGTERM");
    assert!(
        sent_at.elapsed() < Duration::from_secs(5),
        "the drain took the whole deadline though every request was short"
    );

    // The upstream answered exactly what it received, and every one of those answers
    // reached its client: no accepted request was lost. Clients may fail only on a
    // request the agent never accepted (a connect or a reused connection refused
    // once the listener closed).
    assert_eq!(up.received(), up.completed());
    assert_eq!(
        ok + 4,
        up.completed(),
        "requests answered by the upstream but not delivered; failures: {failures:?}"
    );
    for failure in &failures {
        assert!(
            failure.contains("Connect")
                || failure.contains("ConnectionRefused")
                || failure.contains("IncompleteMessage")
                || failure.contains("connection closed")
                || failure.contains("reset"),
            "unexpected failure: {failure}"
        );
    }
}

/// GETs `url` up to `max` times; returns the successes and the first failure.
async fn run_until_failure(client: &Http, url: &str, max: usize) -> (u64, Option<String>) {
    let mut ok = 0;
    for _ in 0..max {
        match tokio::time::timeout(Duration::from_secs(10), client.get(url)).await {
            Ok(Ok(reply)) if reply.status == StatusCode::OK => ok += 1,
            Ok(Ok(reply)) => return (ok, Some(format!("status {}", reply.status))),
            Ok(Err(e)) => return (ok, Some(e)),
            Err(_) => return (ok, Some("timed out".to_owned())),
        }
    }
    (ok, None)
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
