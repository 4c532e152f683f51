//! Latches kept in `--state-dir` (issue 12, item 1): a tripped manual fuse survives
//! a `kill -9` of the agent, and a state directory that cannot be written changes
//! nothing in memory.

use std::time::{Duration, Instant};

use gov_engine::REJECTED_BY;
use http::StatusCode;

use crate::support::{Agent, agent, binary, http, ms, upstream};

/// A manual fuse on /flaky: 3 errors in a minute trip it.
const FUSE: &str = r#"
service: shop
version: latch-v1
rules:
  - name: shop/flaky_upstream
    on: { path: { kind: PATH_KIND_PREFIX, value: /flaky } }
    fuse:
      trips:
        - { metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 3, window_ms: 60000 }
"#;

/// Calls /flaky on `url` until the fuse answers (at most 3 errors first).
async fn trip(url: &str) {
    let client = http();
    for _ in 0..3 {
        let reply = client.get(url).await.unwrap();
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    let reply = client.get(url).await.unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header(REJECTED_BY), Some("shop/flaky_upstream"));
}

/// `/metrics` of an in-process agent.
async fn metrics(agent: &Agent) -> String {
    http()
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text()
}

/// Polls `f` every 20ms for at most 10s.
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if f().await {
            return;
        }
        tokio::time::sleep(ms(20)).await;
    }
    panic!("timed out waiting for {what}");
}

fn latch_file(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("latches.json")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tripped_manual_fuse_survives_kill_9_and_no_call_reaches_the_upstream() {
    let up = upstream().flaky("/flaky").start().await;
    up.set_failing(true);
    let state = tempfile::tempdir().unwrap();
    let start = || {
        binary()
            .config(FUSE)
            .upstream(&up)
            .state_dir(state.path())
            .spawn()
    };
    let first = start();
    trip(&first.url("/flaky")).await;
    // Written on the trip, before anything else happens.
    eventually("the latch on disk", async || {
        latch_file(state.path()).contains("shop/flaky_upstream")
    })
    .await;
    first.kill();

    // The upstream is fine again, but only an operator may say so.
    up.set_failing(false);
    let seen = up.received();
    let second = start();
    let client = http();
    for _ in 0..5 {
        let reply = client.get(&second.url("/flaky")).await.unwrap();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    }
    assert_eq!(up.received(), seen, "a call reached the failing upstream");
    assert!(
        second
            .log()
            .contains("re-armed a latch kept across the restart"),
        "{}",
        second.log()
    );
    let metrics = client
        .get(&second.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_fuse_state{rule=\"shop/flaky_upstream\"} 1"),
        "{metrics}"
    );
    // A second restart in a row keeps it too (the restored latch was written back).
    second.kill();
    let third = start();
    let reply = client.get(&third.url("/flaky")).await.unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(up.received(), seen);
    third.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_dir_that_cannot_be_written_keeps_the_latch_in_memory_and_counts_it() {
    let up = upstream().flaky("/flaky").start().await;
    up.set_failing(true);
    let tmp = tempfile::tempdir().unwrap();
    // A file where the directory should be: creating it fails, even for root.
    let state = tmp.path().join("state");
    std::fs::write(&state, b"not a directory").unwrap();
    let agent = agent()
        .config(FUSE)
        .upstream(&up)
        .state_dir(&state)
        .start()
        .await;
    trip(&agent.url("/flaky")).await;
    eventually("a failed write counted", async || {
        let m = metrics(&agent).await;
        m.contains("\ngov_agent_latches_persisted 0\n")
            && !m.contains("\ngov_agent_latch_write_errors_total 0\n")
    })
    .await;
    // Still enforcing.
    up.set_failing(false);
    let seen = up.received();
    let reply = http().get(&agent.url("/flaky")).await.unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(up.received(), seen);

    // The disk is back: the next retry writes the latch.
    std::fs::remove_file(&state).unwrap();
    eventually("the latch written after the fault", async || {
        metrics(&agent)
            .await
            .contains("\ngov_agent_latches_persisted 1\n")
    })
    .await;
    let file = latch_file(&state);
    assert!(file.contains("shop/flaky_upstream"), "{file}");

    // A release is written too.
    assert_eq!(
        agent
            .sidecar
            .engine()
            .release_fuse("shop/flaky_upstream", "test"),
        Ok(true)
    );
    eventually("the release on disk", async || {
        !latch_file(&state).contains("shop/flaky_upstream")
    })
    .await;
}
