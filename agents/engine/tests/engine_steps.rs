//! The steps of a decision that the mutation testing (`scripts/mutants.sh`,
//! `docs/testing.md`) found unchecked: what a call holds after it waited, what
//! an ended call gives back, and how its bytes and outcome are counted.
//! Through the public API, under paused time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::time::Duration;

use gov_engine::{Decision, Engine, RejectReason, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};
use tokio::time::Instant;

/// A hand-written config, with the compiler's values where it leaves them out.
fn engine(yaml: &str) -> Engine {
    let mut t: TargetConfig = serde_yaml::from_str(yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let engine = Engine::empty("order");
    engine.apply_target(&t).unwrap();
    engine
}

fn stats(engine: &Engine, rule: &str) -> gov_engine::RuleStats {
    engine
        .stats()
        .rules
        .into_iter()
        .find(|r| &*r.rule == rule)
        .unwrap()
}

/// A shaping limit (2 calls per 100 ms, waits up to 150 ms), then a bulkhead
/// of one per instance that does not wait.
const SHAPED_THEN_BULKHEAD: &str = r#"
service: order
rules:
- name: order/pace
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  limit:
    calls: {amount: 2, window_ms: 100}
    action: LIMIT_ACTION_SHAPE
    max_delay_ms: 150
- name: order/per_instance
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  bulkhead:
    key: BULKHEAD_KEY_INSTANCE
    max_concurrent: 1
"#;

#[tokio::test(start_paused = true)]
async fn a_call_that_waited_still_takes_the_steps_after_the_wait() {
    let e = engine(SHAPED_THEN_BULKHEAD);
    let h = HeaderMap::new();
    let to = |instance| RequestInfo::outbound(&Method::GET, "/stock", &h, "inventory", instance);
    let _a = e.admit(&to(Some("10.0.0.1:80"))).await.unwrap();
    let _b = e.admit(&to(Some("10.0.0.2:80"))).await.unwrap();
    // The third is shaped (waits for the next window, counted as waiting),
    // then takes its instance's bulkhead permit: the step after the one
    // that waited.
    let shaped = tokio::spawn({
        let e = e.clone();
        async move {
            let h = HeaderMap::new();
            let start = Instant::now();
            let info =
                RequestInfo::outbound(&Method::GET, "/stock", &h, "inventory", Some("10.0.0.3:80"));
            e.admit(&info).await.map(|a| (start.elapsed(), a))
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(stats(&e, "order/pace").waiting, 1);
    let (waited, c) = shaped.await.unwrap().unwrap();
    assert_eq!(waited, Duration::from_millis(100));
    assert_eq!(stats(&e, "order/pace").waiting, 0);
    assert_eq!(stats(&e, "order/per_instance").in_flight, 3);
    tokio::time::advance(Duration::from_millis(100)).await;
    let r = e.admit(&to(Some("10.0.0.3:80"))).await.unwrap_err();
    assert_eq!(
        (r.reason, &*r.rule),
        (RejectReason::BulkheadFull, "order/per_instance")
    );
    drop(c);
    assert_eq!(stats(&e, "order/per_instance").in_flight, 2);
    assert!(e.admit(&to(Some("10.0.0.3:80"))).await.is_ok());
}

/// Two bulkheads on the same path: the first of one permit waits up to 100
/// ms, the second of two does not wait.
const TWO_BULKHEADS: &str = r#"
service: order
rules:
- name: order/one
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead:
    max_concurrent: 1
    max_wait_ms: 100
- name: order/two
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead:
    max_concurrent: 2
"#;

#[tokio::test(start_paused = true)]
async fn a_waiting_call_takes_the_later_bulkheads_of_its_phase() {
    let e = engine(TWO_BULKHEADS);
    let h = HeaderMap::new();
    let a = e
        .admit(&RequestInfo::inbound(&Method::GET, "/slow", &h))
        .await
        .unwrap();
    let Decision::Wait(pending) = e.try_admit(&RequestInfo::inbound(&Method::GET, "/slow", &h))
    else {
        panic!("a full bulkhead of one with max_wait asks to wait")
    };
    let waiter = tokio::spawn(pending.wait());
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(a);
    let b = waiter.await.unwrap().unwrap();
    // The waiter holds a permit of both rules, the later one included.
    assert_eq!(stats(&e, "order/one").in_flight, 1);
    assert_eq!(stats(&e, "order/two").in_flight, 1);
    drop(b);
    assert_eq!(stats(&e, "order/two").in_flight, 0);
}

/// Decides for `GET path` as `consumer` without waiting.
fn now(e: &Engine, path: &str, consumer: Option<&str>) -> Decision {
    let mut h = HeaderMap::new();
    if let Some(c) = consumer {
        h.insert("x-gov-consumer", c.parse().unwrap());
    }
    e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h))
}

fn admitted(d: Decision) -> gov_engine::Admission {
    match d {
        Decision::Admitted(a) => a,
        other => panic!("expected an admission, got {other:?}"),
    }
}

fn rejected(d: Decision) -> gov_engine::Rejection {
    match d {
        Decision::Rejected(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_waited_call_is_counted_as_admitted_by_every_rule() {
    let e = engine(TWO_BULKHEADS);
    let a = admitted(now(&e, "/slow", None));
    let Decision::Wait(pending) = now(&e, "/slow", None) else {
        panic!("a full bulkhead of one with max_wait asks to wait")
    };
    drop(a);
    let b = pending.wait().await.unwrap();
    assert_eq!(stats(&e, "order/one").admitted, 2);
    assert_eq!(stats(&e, "order/two").admitted, 2);
    b.finish(gov_engine::Outcome::Status(200));
}

const CONSUMER_BYTES: &str = r#"
service: order
consumer_header: x-gov-consumer
rules:
- name: order/bytes_per_consumer
  on: {path: {kind: PATH_KIND_PREFIX, value: /up}}
  limit:
    bytes: {amount: 1000, window_ms: 60000}
    key: LIMIT_KEY_CONSUMER
- name: order/bytes_all
  on: {path: {kind: PATH_KIND_PREFIX, value: /up}}
  limit:
    bytes: {amount: 5000, window_ms: 60000}
- name: order/calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /up}}
  limit:
    calls: {amount: 100, window_ms: 60000}
"#;

#[tokio::test(start_paused = true)]
async fn bytes_count_in_the_calls_scope_for_every_byte_limit() {
    let e = engine(CONSUMER_BYTES);
    // Two byte limits match: the call counts bytes for both.
    let a = admitted(now(&e, "/up", Some("crm")));
    assert!(a.counts_bytes());
    a.add_bytes(1000);
    a.finish(gov_engine::Outcome::Status(200));
    // `crm` used its own 1,000 bytes; `erp`'s scope is untouched.
    assert_eq!(
        rejected(now(&e, "/up", Some("crm"))).reason,
        RejectReason::LimitBytes
    );
    let b = admitted(now(&e, "/up", Some("erp")));
    // Through a meter, as a body wrapper counts them: `erp`'s scope again.
    b.byte_meter().unwrap().add(1000);
    drop(b);
    assert_eq!(
        rejected(now(&e, "/up", Some("erp"))).reason,
        RejectReason::LimitBytes
    );
    // The shared limit saw both calls' bytes.
    for consumer in ["a", "b", "c"] {
        let c = admitted(now(&e, "/up", Some(consumer)));
        c.add_bytes(1000);
    }
    let r = rejected(now(&e, "/up", Some("d")));
    assert_eq!(
        (r.reason, &*r.rule),
        (RejectReason::LimitBytes, "order/bytes_all")
    );
    // A call no byte limit matches counts nothing.
    let free = admitted(now(&e, "/elsewhere", None));
    assert!(!free.counts_bytes() && free.byte_meter().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_call_is_in_flight_until_it_records_or_ends() {
    let e = engine(CONSUMER_BYTES);
    let in_flight = |e: &Engine| stats(e, "order/calls").in_flight;
    let a = admitted(now(&e, "/up", Some("crm")));
    let mut b = admitted(now(&e, "/up", Some("crm")));
    assert_eq!(in_flight(&e), 2);
    // Recorded at its head, still held until its body ends: no longer in
    // flight, and ending it later does not count it twice.
    b.record(gov_engine::Outcome::Status(200));
    assert_eq!(in_flight(&e), 1);
    drop(b);
    assert_eq!(in_flight(&e), 1);
    // Dropped without an outcome: ended all the same.
    drop(a);
    assert_eq!(in_flight(&e), 0);
    let s = stats(&e, "order/calls");
    assert_eq!((s.admitted, s.latency.iter().sum::<u64>()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_ends_nothing_it_was_not_counted_for() {
    let e = engine(
        r#"
service: order
rules:
- name: order/calls
  on: {any: true}
  limit:
    calls: {amount: 100, window_ms: 60000}
- name: order/b
  on: {any: true}
  bulkhead:
    max_concurrent: 1
"#,
    );
    let a = admitted(now(&e, "/", None));
    // The limit admits the second call, then the bulkhead refuses it: it
    // was never counted as admitted, so it ends nothing.
    assert_eq!(
        rejected(now(&e, "/", None)).reason,
        RejectReason::BulkheadFull
    );
    assert_eq!(stats(&e, "order/calls").in_flight, 1);
    drop(a);
    assert_eq!(stats(&e, "order/calls").in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn of_equal_timeouts_the_first_rule_names_the_timeout() {
    let e = engine(
        r#"
service: order
rules:
- name: order/first
  on: {any: true}
  bulkhead:
    max_concurrent: 10
    timeout_ms: 300
- name: order/second
  on: {any: true}
  bulkhead:
    max_concurrent: 10
    timeout_ms: 300
- name: order/longer
  on: {any: true}
  bulkhead:
    max_concurrent: 10
    timeout_ms: 900
"#,
    );
    let a = admitted(now(&e, "/", None));
    assert_eq!(a.timeout(), Some(Duration::from_millis(300)));
    assert_eq!(&*a.timed_out().rule, "order/first");
}
