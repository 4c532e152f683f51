//! Slow-call fuses end to end (issue 33): the `gov-agent` binary in front of a
//! real upstream whose `/report/slow` answers after 1.5s. Slow answers trip the
//! fuse (`slow_calls >= 3 over 1m slower than 1s`), the next call is refused by
//! it without reaching the upstream, and the trip is a fuse latch like an error
//! trip's, with its reason, kept in `--state-dir`.

use std::time::{Duration, Instant};

use gov_engine::REJECTED_BY;
use http::StatusCode;

use crate::support::{binary, http, ms, upstream};

const SLOW_FUSE: &str = r#"
service: shop
version: slow-v1
rules:
  - name: shop/slow_reports
    on: { path: { kind: PATH_KIND_PREFIX, value: /report } }
    fuse:
      trips:
        - { metric: TRIP_METRIC_SLOW_CALLS, op: COMPARE_OP_GE, count: 3, window_ms: 60000, slow_ms: 1000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_trip_the_fuse_and_the_next_call_is_refused() {
    let up = upstream()
        .fast("/report/fast", ms(0))
        .slow("/report/slow", ms(1500))
        .start()
        .await;
    let state = tempfile::tempdir().unwrap();
    let agent = binary()
        .config(SLOW_FUSE)
        .upstream(&up)
        .state_dir(state.path())
        .spawn();
    let client = http();

    // Fast calls, however many, do not trip it.
    for _ in 0..10 {
        let reply = client.get(&agent.url("/report/fast")).await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
    }
    // Three slow calls at once: each is answered (200, after 1.5s), and the
    // third to end trips the fuse.
    let url = agent.url("/report/slow");
    let slow = (0..3).map(|_| client.get(&url));
    for reply in futures::future::join_all(slow).await {
        assert_eq!(reply.unwrap().status, StatusCode::OK);
    }
    let seen = up.received();
    let refused = client.get(&agent.url("/report/fast")).await.unwrap();
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:?}"
    );
    assert_eq!(refused.header(REJECTED_BY), Some("shop/slow_reports"));
    assert_eq!(up.received(), seen, "a refused call reached the upstream");

    let metrics = client
        .get(&agent.admin_url("/metrics"))
        .await
        .unwrap()
        .text();
    assert!(
        metrics.contains("gov_agent_fuse_state{rule=\"shop/slow_reports\"} 1"),
        "{metrics}"
    );
    // Latched as an error trip is, with the reason of the slow trip.
    let reason = "slow_calls 3 >= 3 over 60s (3 of 13 calls slower than 1s)";
    let start = Instant::now();
    let latches = loop {
        let text = std::fs::read_to_string(state.path().join("latches.json")).unwrap_or_default();
        if text.contains("shop/slow_reports") || start.elapsed() > Duration::from_secs(10) {
            break text;
        }
        tokio::time::sleep(ms(20)).await;
    };
    assert!(latches.contains(reason), "{latches}");
    agent.kill();
}
