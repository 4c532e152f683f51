//! Rules in mode shadow: evaluated with their own state, never rejecting or
//! delaying; what they would refuse is counted, listed on the call and
//! stamped when asked. Through the public API, under paused time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::time::Duration;

use gov_engine::{
    Admission, Decision, Engine, Outcome, RejectReason, Rejection, RequestInfo, RuleStats,
    WouldReject,
};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

fn target(yaml: &str) -> TargetConfig {
    let mut t: TargetConfig = serde_yaml::from_str(yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    t
}

fn engine(yaml: &str) -> Engine {
    let engine = Engine::empty("order");
    engine.apply_target(&target(yaml)).unwrap();
    engine
}

fn stats(engine: &Engine, rule: &str) -> RuleStats {
    engine
        .stats()
        .rules
        .into_iter()
        .find(|r| &*r.rule == rule)
        .unwrap()
}

fn shadow_rejected(engine: &Engine, rule: &str, reason: RejectReason) -> u64 {
    stats(engine, rule).shadow_rejected[reason as usize]
}

fn now(e: &Engine, path: &str) -> Decision {
    let h = HeaderMap::new();
    e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h))
}

fn admitted(d: Decision) -> Admission {
    match d {
        Decision::Admitted(a) => a,
        other => panic!("expected an admission, got {other:?}"),
    }
}

fn rejected(d: Decision) -> Rejection {
    match d {
        Decision::Rejected(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

fn would(rule: &str, reason: RejectReason) -> WouldReject {
    WouldReject {
        rule: rule.into(),
        reason,
    }
}

const LIMIT: &str = r#"
service: order
rules:
- name: order/burst
  on: {path: {kind: PATH_KIND_PREFIX, value: /orders}}
  mode: MODE_SHADOW
  limit:
    calls: {amount: 2, window_ms: 1000}
"#;

#[tokio::test(start_paused = true)]
async fn a_shadow_limit_counts_its_window_and_rejects_nothing_until_enforced() {
    let e = engine(LIMIT);
    let calls: Vec<Admission> = (0..5).map(|_| admitted(now(&e, "/orders"))).collect();
    let refused: Vec<Vec<WouldReject>> = calls.iter().map(|a| a.would_reject().collect()).collect();
    assert!(refused[..2].iter().all(Vec::is_empty), "{refused:?}");
    for r in &refused[2..] {
        assert_eq!(r, &[would("order/burst", RejectReason::LimitCalls)]);
    }
    let s = stats(&e, "order/burst");
    assert_eq!((s.admitted, s.rejected.iter().sum::<u64>()), (2, 0));
    assert_eq!(s.shadow_rejected[RejectReason::LimitCalls as usize], 3);
    // Nothing is stamped unless the rule asks for it.
    assert_eq!(calls[4].stamps().count(), 0);
    drop(calls);

    // Enforced by a re-apply in the same window: the window it counted in
    // shadow is kept, so the next call is refused at once.
    let applied = e
        .apply_target(&target(&LIMIT.replace("MODE_SHADOW", "MODE_ENFORCE")))
        .unwrap();
    assert_eq!((applied.kept, applied.fresh), (1, 0));
    let r = rejected(now(&e, "/orders"));
    assert_eq!(
        (&*r.rule, r.reason),
        ("order/burst", RejectReason::LimitCalls)
    );
    assert!(r.would_reject.is_empty());
    // The counts of its shadow time stay with the rule.
    assert_eq!(
        shadow_rejected(&e, "order/burst", RejectReason::LimitCalls),
        3
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    drop(admitted(now(&e, "/orders")));
}

#[tokio::test(start_paused = true)]
async fn a_shadow_bulkhead_never_makes_a_call_wait_nor_holds_a_permit_it_did_not_get() {
    let e = engine(
        r#"
service: order
rules:
- name: order/slow
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  mode: MODE_SHADOW
  stamp_would_reject: true
  bulkhead:
    max_concurrent: 1
    max_wait_ms: 100
    timeout_ms: 50
"#,
    );
    let first = admitted(now(&e, "/slow"));
    // A full bulkhead with `max_wait` would ask to wait: in shadow the call
    // goes on at once, counted as a failed wait, holding nothing.
    let second = admitted(now(&e, "/slow"));
    assert_eq!(
        second.would_reject().collect::<Vec<_>>(),
        [would("order/slow", RejectReason::BulkheadTimeout)]
    );
    assert_eq!(second.stamps().collect::<Vec<_>>(), ["order/slow"]);
    assert_eq!(first.stamps().count(), 0);
    assert_eq!(stats(&e, "order/slow").in_flight, 1);
    // Its `timeout` is not a deadline in shadow; it is counted.
    assert_eq!(first.timeout(), None);
    tokio::time::advance(Duration::from_millis(60)).await;
    first.finish(Outcome::Status(200));
    assert_eq!(
        shadow_rejected(&e, "order/slow", RejectReason::Timeout),
        1,
        "a call that outlived the shadow timeout"
    );
    drop(second);
    // The one permit is free, and only one.
    assert_eq!(stats(&e, "order/slow").in_flight, 0);
    let third = admitted(now(&e, "/slow"));
    assert_eq!(third.would_reject().count(), 0);
    let fourth = admitted(now(&e, "/slow"));
    assert_eq!(fourth.would_reject().count(), 1);
    assert_eq!(
        shadow_rejected(&e, "order/slow", RejectReason::BulkheadTimeout),
        2
    );
    assert_eq!(stats(&e, "order/slow").rejected.iter().sum::<u64>(), 0);
}

/// A shadow fuse beside an enforced limit of one call per second.
const FUSE_AND_LIMIT: &str = r#"
service: order
rules:
- name: order/breaker
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  mode: MODE_SHADOW
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 2, window_ms: 30000}
    recover: {after: {after_ms: 10000, probes: 1}}
- name: order/pace
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  limit:
    calls: {amount: 1, window_ms: 1000}
"#;

#[tokio::test(start_paused = true)]
async fn a_shadow_fuse_trips_and_recovers_in_its_own_state_while_enforced_rules_still_reject() {
    let e = engine(FUSE_AND_LIMIT);
    for _ in 0..2 {
        admitted(now(&e, "/stock")).finish(Outcome::ConnectFailure);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    // Tripped in its own state: the call goes on, counted.
    let a = admitted(now(&e, "/stock"));
    assert_eq!(
        a.would_reject().collect::<Vec<_>>(),
        [would("order/breaker", RejectReason::FuseOpen)]
    );
    assert_eq!(e.tripped_fuses().len(), 1);
    // The enforced limit still rejects, naming the shadow fuse that would
    // have refused the call too.
    let r = rejected(now(&e, "/stock"));
    assert_eq!(&*r.rule, "order/pace");
    assert_eq!(
        r.would_reject,
        [would("order/breaker", RejectReason::FuseOpen)]
    );
    a.finish(Outcome::Status(200));
    assert_eq!(
        shadow_rejected(&e, "order/breaker", RejectReason::FuseOpen),
        2
    );

    // After `recover after 10s` a probe passes and closes it.
    tokio::time::advance(Duration::from_secs(11)).await;
    let probe = admitted(now(&e, "/stock"));
    assert_eq!(probe.would_reject().count(), 0);
    probe.finish(Outcome::Status(200));
    assert!(e.tripped_fuses().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_call_that_waits_for_an_enforced_bulkhead_does_not_wait_for_a_shadow_one() {
    let e = engine(
        r#"
service: order
rules:
- name: order/queue
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead:
    max_concurrent: 1
    max_wait_ms: 1000
- name: order/shadow
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  mode: MODE_SHADOW
  bulkhead:
    max_concurrent: 1
    max_wait_ms: 1000
"#,
    );
    let first = admitted(now(&e, "/slow"));
    let Decision::Wait(pending) = now(&e, "/slow") else {
        panic!("the enforced bulkhead asks to wait")
    };
    let waiter = tokio::spawn(pending.wait());
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(first);
    // Granted by the enforced bulkhead as soon as its permit is free; the
    // shadow one, whose permit is free too, grants without a wait.
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(second.would_reject().count(), 0);
    assert_eq!(stats(&e, "order/shadow").in_flight, 1);
    drop(second);
    assert_eq!(stats(&e, "order/shadow").in_flight, 0);
}

#[test]
fn configs_a_shadow_rule_cannot_honour_are_refused() {
    let e = Engine::empty("order");
    let stamped_enforce = LIMIT.replace(
        "mode: MODE_SHADOW",
        "mode: MODE_ENFORCE\n  stamp_would_reject: true",
    );
    let err = e.apply_target(&target(&stamped_enforce)).unwrap_err();
    assert!(err.to_string().contains("order/burst"), "{err}");
    let exact = LIMIT.replace(
        "calls: {amount: 2, window_ms: 1000}",
        "calls: {amount: 2, window_ms: 1000}\n    scope: LIMIT_SCOPE_CLUSTER\n    sync: CLUSTER_SYNC_EXACT",
    );
    let t = target(&exact);
    let err = gov_engine::CompiledConfig::try_from(&t).unwrap_err();
    assert!(format!("{err:?}").contains("sync exact"), "{err:?}");
}

/// An adaptive bulkhead in mode shadow computes its limit from the calls
/// it admitted and reports it (the stats' capacity) without refusing any:
/// the calls over the limit are counted as it would have refused them.
#[tokio::test(start_paused = true)]
async fn a_shadow_adaptive_bulkhead_moves_its_limit_and_rejects_nothing() {
    let e = engine(
        r#"
service: order
rules:
- name: order/adaptive
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  mode: MODE_SHADOW
  bulkhead:
    max_concurrent: 16
    adaptive: {min: 2, max: 16}
"#,
    );
    let capacity = |e: &Engine| stats(e, "order/adaptive").capacity;
    assert_eq!(capacity(&e), 2, "starts at min");
    // 16 clients, each calling again as soon as its call ends.
    let mut calls: Vec<Option<(Admission, tokio::time::Instant)>> = (0..16).map(|_| None).collect();
    let mut seen = Vec::new();
    for (latency, ticks) in [(10u64, 5000u32), (100, 5000)] {
        for _ in 0..ticks {
            let now = tokio::time::Instant::now();
            for call in &mut calls {
                if call.as_ref().is_some_and(|(_, end)| *end <= now) {
                    let (a, _) = call.take().unwrap();
                    a.finish(Outcome::Status(200));
                }
                if call.is_none() {
                    // Never refused, whatever the limit.
                    let a = admitted(self::now(&e, "/slow"));
                    *call = Some((a, now + Duration::from_millis(latency)));
                }
            }
            seen.push((latency, capacity(&e)));
            tokio::time::advance(Duration::from_millis(1)).await;
        }
    }
    let max_healthy = seen.iter().filter(|s| s.0 == 10).map(|s| s.1).max();
    assert_eq!(max_healthy, Some(16), "grew to max while healthy");
    assert_eq!(seen.last().map(|s| s.1), Some(2), "fell to min once slow");
    assert!(
        shadow_rejected(&e, "order/adaptive", RejectReason::BulkheadFull) > 0,
        "the calls over the limit are counted as would-be refusals"
    );
    let s = stats(&e, "order/adaptive");
    assert_eq!(s.rejected.iter().sum::<u64>(), 0);
}
