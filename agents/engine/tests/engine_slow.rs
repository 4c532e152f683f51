//! Slow-call fuses through the engine's public API, under paused time: a
//! call's latency is what passes between its admission and its recorded
//! outcome (as the latency histogram has it), a timeout is slow whatever
//! its latency, and a slow trip opens, latches, probes and is released as
//! an error trip is.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::time::Duration;

use gov_engine::{
    Admission, Decision, Engine, EventKind, FuseState, LatchKind, Outcome, RejectReason, Rejection,
    RequestInfo, Restored,
};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

fn target(yaml: &str) -> TargetConfig {
    let mut t = serde_yaml::from_str(yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    t
}

fn engine(yaml: &str) -> Engine {
    let engine = Engine::empty("order");
    engine.apply_target(&target(yaml)).unwrap();
    engine
}

fn now(engine: &Engine, path: &str) -> Result<Admission, Rejection> {
    let h = HeaderMap::new();
    match engine.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
        Decision::Admitted(a) => Ok(a),
        Decision::Rejected(r) => Err(r),
        Decision::Wait(_) => panic!("the engine asked to wait"),
    }
}

fn state(engine: &Engine) -> Option<FuseState> {
    engine
        .stats()
        .rules
        .into_iter()
        .find(|r| &*r.rule == "order/slow")
        .unwrap()
        .fuse
}

/// One call to `/report` that takes `took` and answers `status`.
async fn call(e: &Engine, took: Duration, status: u16) -> bool {
    let Ok(a) = now(e, "/report") else {
        return false;
    };
    tokio::time::advance(took).await;
    a.finish(Outcome::Status(status));
    true
}

/// `slow_call_ratio > 50% over 1m slower than 2s min_calls 4`, with
/// `recover` as given.
fn ratio_fuse(recover: &str) -> String {
    format!(
        r#"
service: order
rules:
- name: order/slow
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /report}}}}
  fuse:
    trips:
    - metric: TRIP_METRIC_SLOW_CALL_RATIO
      op: COMPARE_OP_GT
      ratio_milli_percent: 50000
      window_ms: 60000
      min_calls: 4
      slow_ms: 2000
{recover}"#
    )
}

const MS: fn(u64) -> Duration = Duration::from_millis;

#[tokio::test(start_paused = true)]
async fn slow_calls_trip_the_fuse_and_fast_or_failing_calls_do_not() {
    let e = engine(&ratio_fuse(""));
    let mut events = e.subscribe();
    // Fast calls, errors among them, and calls of exactly 2s: none is slow.
    for _ in 0..4 {
        assert!(call(&e, MS(10), 200).await);
        assert!(call(&e, MS(10), 500).await);
        assert!(call(&e, MS(2000), 200).await);
    }
    assert_eq!(state(&e), Some(FuseState::Closed));
    // 12 calls so far; slow ones until more than half are slow: the 13th
    // slow call of 25 (52%).
    for i in 0..12 {
        assert!(call(&e, MS(2001), 200).await, "slow call {i} refused");
        assert_eq!(state(&e), Some(FuseState::Closed), "after {i}");
    }
    assert!(call(&e, MS(2500), 200).await);
    assert_eq!(state(&e), Some(FuseState::Open));
    let r = now(&e, "/report").unwrap_err();
    assert_eq!(r.reason, RejectReason::FuseOpen);
    assert_eq!(r.status.as_u16(), 503);
    let event = events.try_recv().unwrap();
    assert_eq!(event.kind, EventKind::FuseTripped);
    assert_eq!(
        event.reason,
        "slow_call_ratio 52% > 50% over 60s (13 of 25 calls slower than 2s)"
    );
}

#[tokio::test(start_paused = true)]
async fn min_calls_holds_a_slow_trip_back() {
    let e = engine(&ratio_fuse(""));
    // Three slow calls of three: 100%, under min_calls (4).
    for _ in 0..3 {
        assert!(call(&e, Duration::from_secs(5), 200).await);
    }
    assert_eq!(state(&e), Some(FuseState::Closed));
    // A fast call fills min_calls; as for errors, only a slow call decides.
    assert!(call(&e, MS(5), 200).await);
    assert_eq!(state(&e), Some(FuseState::Closed));
    assert!(call(&e, Duration::from_secs(5), 200).await);
    assert_eq!(state(&e), Some(FuseState::Open));
}

/// A call cut off by its timeout is slow, however short the timeout: here
/// 300ms, under `slower than 2s`.
#[tokio::test(start_paused = true)]
async fn a_timed_out_call_is_slow() {
    let e = engine(
        r#"
service: order
rules:
- name: order/deadline
  on: {path: {kind: PATH_KIND_PREFIX, value: /report}}
  bulkhead: {max_concurrent: 100, timeout_ms: 300}
- name: order/slow
  on: {path: {kind: PATH_KIND_PREFIX, value: /report}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SLOW_CALLS, op: COMPARE_OP_GE, count: 2, window_ms: 10000, slow_ms: 2000}
    # Timeouts are no error here: only slowness can trip it.
    system: {connect_failure: true}
"#,
    );
    let mut events = e.subscribe();
    for _ in 0..2 {
        let a = now(&e, "/report").unwrap();
        tokio::time::advance(MS(300)).await;
        let r = a.timed_out();
        assert_eq!(r.reason, RejectReason::Timeout);
    }
    assert_eq!(state(&e), Some(FuseState::Open));
    assert_eq!(
        events.try_recv().unwrap().reason,
        "slow_calls 2 >= 2 over 10s (2 of 2 calls slower than 2s)"
    );
}

#[tokio::test(start_paused = true)]
async fn half_open_probes_are_judged_on_slowness_too() {
    let e = engine(&ratio_fuse(
        "    recover: {after: {after_ms: 30000, probes: 2}}\n",
    ));
    let mut events = e.subscribe();
    for _ in 0..4 {
        assert!(call(&e, Duration::from_secs(3), 200).await);
    }
    assert_eq!(state(&e), Some(FuseState::Open));
    tokio::time::advance(Duration::from_secs(30)).await;
    // Two probes: the first fast, the second slow (a 200, but 3s).
    assert!(call(&e, MS(100), 200).await);
    assert_eq!(state(&e), Some(FuseState::HalfOpen));
    assert!(call(&e, Duration::from_secs(3), 200).await);
    assert_eq!(state(&e), Some(FuseState::Open), "a slow probe fails");
    let reasons: Vec<_> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|e| (e.kind, e.reason))
        .collect();
    assert_eq!(reasons[1].0, EventKind::FuseHalfOpen);
    assert_eq!(
        reasons[2],
        (
            EventKind::FuseTripped,
            "a probe call was slower than 2s (3s)".to_string()
        )
    );
    // Another `after`, then two fast probes close it.
    tokio::time::advance(Duration::from_secs(27)).await;
    assert!(now(&e, "/report").is_err(), "30s from the failed probe");
    tokio::time::advance(Duration::from_secs(3)).await;
    assert!(call(&e, MS(100), 200).await);
    assert!(call(&e, MS(100), 204).await);
    assert_eq!(state(&e), Some(FuseState::Closed));
}

/// The latch of a slow trip is a fuse latch like any other: listed with its
/// reason, released by an operator, restored after a restart.
#[tokio::test(start_paused = true)]
async fn a_slow_trip_latches_and_is_released_as_an_error_trip_is() {
    let e = engine(&ratio_fuse(""));
    for _ in 0..4 {
        assert!(call(&e, Duration::from_secs(3), 200).await);
    }
    let unix_ms = 1_800_000_000_000;
    let latches = e.latches(unix_ms);
    assert_eq!(latches.len(), 1);
    let latch = latches[0].clone();
    assert_eq!(latch.kind, LatchKind::Fuse);
    assert_eq!(latch.rule, "order/slow");
    assert_eq!(latch.deadline_unix_ms, None, "manual recovery");
    assert_eq!(
        latch.reason,
        "slow_call_ratio 100% > 50% over 60s (4 of 4 calls slower than 2s)"
    );
    // Still open a day later.
    tokio::time::advance(Duration::from_secs(86_400)).await;
    assert!(now(&e, "/report").is_err());
    assert_eq!(e.tripped_fuses()[0].reason, latch.reason);
    assert_eq!(e.release_fuse("order/slow", "ops"), Ok(true));
    // Released: the old slow calls are forgotten, so one more slow call
    // (1 of 1, under min_calls) does not trip it again.
    assert!(call(&e, Duration::from_secs(3), 200).await);
    assert_eq!(state(&e), Some(FuseState::Closed));
    // A new agent restores the latch as it restores an error trip's.
    let fresh = engine(&ratio_fuse(""));
    assert_eq!(fresh.restore_latch(&latch, unix_ms), Ok(Restored::Armed));
    assert_eq!(
        now(&fresh, "/report").unwrap_err().reason,
        RejectReason::FuseOpen
    );
    assert_eq!(fresh.tripped_fuses()[0].reason, latch.reason);
}

/// A fuse of two conditions (error ratio, slow call ratio), in either
/// order: a call that went well is counted in both windows (issue 39: out
/// of line with more than one condition), so each ratio trips where its
/// calls say, not at its `min_calls`.
#[tokio::test(start_paused = true)]
async fn a_fuse_of_two_conditions_counts_calls_that_went_well_in_both() {
    let errors = "    - {metric: TRIP_METRIC_ERROR_RATIO, op: COMPARE_OP_GT, ratio_milli_percent: 50000, window_ms: 60000, min_calls: 4}\n";
    let slow = "    - {metric: TRIP_METRIC_SLOW_CALL_RATIO, op: COMPARE_OP_GT, ratio_milli_percent: 50000, window_ms: 60000, min_calls: 4, slow_ms: 2000}\n";
    for (first, second) in [(errors, slow), (slow, errors)] {
        let yaml = format!(
            "service: order\nrules:\n- name: order/slow\n  on: {{path: {{kind: PATH_KIND_PREFIX, value: /report}}}}\n  fuse:\n    trips:\n{first}{second}"
        );
        for (took, status) in [(MS(10), 500), (MS(2001), 200)] {
            let e = engine(&yaml);
            // Five calls that went well (exactly 2s is not slow).
            for took in [MS(10), MS(2000), MS(10), MS(2000), MS(10)] {
                assert!(call(&e, took, 200).await);
            }
            // Then bad ones: more than half of the calls at the sixth.
            for i in 0..5 {
                assert!(call(&e, took, status).await, "bad call {i} refused");
                assert_eq!(state(&e), Some(FuseState::Closed), "after {i}");
            }
            assert!(call(&e, took, status).await);
            assert_eq!(state(&e), Some(FuseState::Open), "{status}");
        }
    }
}
