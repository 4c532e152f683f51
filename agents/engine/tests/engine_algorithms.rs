//! The calls algorithms of a limit (`algorithm` on the wire): exact counts
//! under paused time, from a first partial window through window edges to a
//! last partial one, with the `Retry-After` each refusal carries.
//!
//! Every test offers 10x the limit (10 calls per 1 s; a call every 10 ms)
//! from 500 ms after the limit starts (the middle of its first window) to
//! 4,490 ms: 400 calls over 4 s, where 40 is the limit.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::time::Duration;

use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

fn engine(algorithm: &str) -> Engine {
    let yaml = format!(
        r#"
service: order
rules:
- name: order/calls
  on: {{any: true}}
  limit:
    calls: {{amount: 10, window_ms: 1000}}
    {algorithm}
"#
    );
    let mut t: TargetConfig = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let engine = Engine::empty("order");
    engine.apply_target(&t).unwrap();
    engine
}

/// One call now: `Ok(())` admitted, `Err(retry_after)` refused.
fn call(e: &Engine) -> Result<(), Duration> {
    let h = HeaderMap::new();
    match e.try_admit(&RequestInfo::inbound(&Method::GET, "/", &h)) {
        Decision::Admitted(a) => {
            a.finish(Outcome::Status(200));
            Ok(())
        }
        Decision::Rejected(r) => Err(r.retry_after.expect("a limit says when to retry")),
        Decision::Wait(_) => panic!("a local limit decides at once"),
    }
}

/// Offers a call every 10 ms from 500 ms to 4,490 ms after the engine's
/// start; returns the milliseconds (since the start) of the admitted calls.
async fn offer(e: &Engine) -> Vec<u64> {
    tokio::time::advance(Duration::from_millis(500)).await;
    let mut admitted = Vec::new();
    for i in 0..400 {
        if call(e).is_ok() {
            admitted.push(500 + i * 10);
        }
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    admitted
}

/// Today's fixed window: the first partial window (500-999 ms) admits a
/// whole window's 10 at once, and so does the last (4,000-4,490 ms): 50 of
/// 40 (1.25x).
#[tokio::test(start_paused = true)]
async fn a_fixed_window_admits_a_whole_window_in_a_partial_one() {
    let e = engine("algorithm: LIMIT_ALGORITHM_FIXED_WINDOW");
    let admitted = offer(&e).await;
    assert_eq!(admitted.len(), 50);
    let first: Vec<u64> = (0..10).map(|i| 500 + i * 10).collect();
    assert_eq!(admitted[..10], first[..], "the first 10 at once");
    assert_eq!(admitted[10], 1000, "the next at the window's edge");
    let last: Vec<u64> = (0..10).map(|i| 4000 + i * 10).collect();
    assert_eq!(admitted[40..], last[..]);
}

/// The fixed window's edge: 999 ms is the old window, 1,000 ms the new one,
/// and a refusal waits until the edge.
#[tokio::test(start_paused = true)]
async fn a_fixed_window_refuses_until_its_edge() {
    let e = engine("");
    tokio::time::advance(Duration::from_millis(600)).await;
    for _ in 0..10 {
        call(&e).unwrap();
    }
    assert_eq!(call(&e), Err(Duration::from_millis(400)));
    tokio::time::advance(Duration::from_millis(399)).await;
    assert_eq!(
        call(&e),
        Err(Duration::from_millis(1)),
        "999 ms: still full"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(call(&e), Ok(()), "1,000 ms: a new window");
}

/// The sliding window: the first window has nothing before it, so it
/// admits 10 at once; from then on a call fits each time the previous
/// window's weight falls by one call (every 100 ms), and the last partial
/// window admits in proportion (5 in 490 ms): 45 of 40.
#[tokio::test(start_paused = true)]
async fn a_sliding_window_spreads_each_window_after_the_first() {
    let e = engine("algorithm: LIMIT_ALGORITHM_SLIDING_WINDOW");
    let admitted = offer(&e).await;
    assert_eq!(admitted.len(), 45);
    let second: Vec<u64> = (0..10).map(|i| 1010 + i * 100).collect();
    assert_eq!(admitted[10..20], second[..]);
    let last: Vec<u64> = (0..5).map(|i| 4010 + i * 100).collect();
    assert_eq!(admitted[40..], last[..]);
}

/// The sliding window's edge and its waits: at 1,000 ms the previous window
/// weighs a whole 10, so the call waits 1 ms; after one more call, 101 ms.
#[tokio::test(start_paused = true)]
async fn a_sliding_window_waits_for_the_weight_to_fall() {
    let e = engine("algorithm: LIMIT_ALGORITHM_SLIDING_WINDOW");
    tokio::time::advance(Duration::from_millis(900)).await;
    for _ in 0..10 {
        call(&e).unwrap();
    }
    assert_eq!(
        call(&e),
        Err(Duration::from_millis(101)),
        "full: the next window"
    );
    tokio::time::advance(Duration::from_millis(100)).await;
    assert_eq!(
        call(&e),
        Err(Duration::from_millis(1)),
        "1,000 ms weighs 10"
    );
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(call(&e), Ok(()));
    assert_eq!(call(&e), Err(Duration::from_millis(100)));
    // A window later with nothing in between: the previous one is empty.
    tokio::time::advance(Duration::from_millis(2000)).await;
    for _ in 0..10 {
        call(&e).unwrap();
    }
    assert!(call(&e).is_err());
}

/// The token bucket with a burst of 1: one call every 100 ms from the first,
/// whatever the windows: exactly 40 of 40.
#[tokio::test(start_paused = true)]
async fn a_token_bucket_admits_the_rate_from_the_first_call() {
    let e = engine("algorithm: LIMIT_ALGORITHM_TOKEN_BUCKET\n    burst: 1");
    let admitted = offer(&e).await;
    assert_eq!(admitted.len(), 40);
    let every: Vec<u64> = (0..40).map(|i| 500 + i * 100).collect();
    assert_eq!(admitted, every);
}

/// A burst of 5: five at once, then the rate: 44 of 40; a refusal waits
/// until a call fits, to the millisecond; an idle bucket refills to its
/// burst and no further.
#[tokio::test(start_paused = true)]
async fn a_token_bucket_admits_its_burst_then_the_rate() {
    let e = engine("algorithm: LIMIT_ALGORITHM_TOKEN_BUCKET\n    burst: 5");
    let admitted = offer(&e).await;
    assert_eq!(admitted.len(), 44);
    assert_eq!(admitted[..6], [500, 510, 520, 530, 540, 600]);
    tokio::time::advance(Duration::from_secs(10)).await;
    for _ in 0..5 {
        call(&e).unwrap();
    }
    assert_eq!(call(&e), Err(Duration::from_millis(100)));
    tokio::time::advance(Duration::from_millis(30)).await;
    assert_eq!(call(&e), Err(Duration::from_millis(70)));
    tokio::time::advance(Duration::from_millis(70)).await;
    assert_eq!(call(&e), Ok(()));
}

/// The wire refuses what no algorithm means: a burst without a token
/// bucket, a burst above the amount, a token bucket without a burst (with
/// leases too: every algorithm is leased under `sync batch`).
#[test]
fn a_burst_is_checked_against_its_algorithm() {
    let batch =
        "\n    scope: LIMIT_SCOPE_CLUSTER\n    sync: CLUSTER_SYNC_BATCH\n    sync_batch_ms: 100";
    for (algorithm, burst, more, problem) in [
        ("FIXED_WINDOW", 5, "", "only a token bucket has one"),
        ("TOKEN_BUCKET", 11, "", "must be 1..=10"),
        ("TOKEN_BUCKET", 0, "", "must be 1..=10"),
        ("TOKEN_BUCKET", 0, batch, "must be 1..=10"),
        ("SLIDING_WINDOW", 3, batch, "only a token bucket has one"),
    ] {
        let yaml = format!(
            "service: order\nrules:\n- name: order/calls\n  on: {{any: true}}\n  limit:\n    calls: {{amount: 10, window_ms: 1000}}\n    algorithm: LIMIT_ALGORITHM_{algorithm}\n    burst: {burst}{more}\n"
        );
        let mut t: TargetConfig = serde_yaml::from_str(&yaml).unwrap();
        gov_proto::compiled::fill(&mut t);
        let engine = Engine::empty("order");
        let err = engine.apply_target(&t).unwrap_err().to_string();
        assert!(err.contains(problem), "{algorithm} {burst}: {err}");
    }
}
