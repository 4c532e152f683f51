//! The engine through its public API: configs written as the YAML that
//! `govc compile` prints, decisions under paused time, commands, stats,
//! events, config swaps, and the tower layer around a real `service_fn`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use gov_engine::{
    Admission, Decision, Engine, EventKind, FuseState, GovernLayer, Latch, LatchKind, Outcome,
    REJECTED_BY, RejectReason, Rejection, RequestInfo, Restored,
};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};

/// A hand-written config, with the compiler's values where it leaves them out.
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

fn headers(consumer: Option<&str>) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Some(c) = consumer {
        h.insert("x-gov-consumer", HeaderValue::from_str(c).unwrap());
    }
    h
}

/// Decides for `GET path` without waiting (panics if the engine asks to wait).
fn now(engine: &Engine, path: &str, consumer: Option<&str>) -> Result<Admission, Rejection> {
    let h = headers(consumer);
    match engine.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
        Decision::Admitted(a) => Ok(a),
        Decision::Rejected(r) => Err(r),
        Decision::Wait(_) => panic!("the engine asked to wait"),
    }
}

async fn admit(
    engine: &Engine,
    path: &str,
    consumer: Option<&str>,
) -> Result<Admission, Rejection> {
    let h = headers(consumer);
    engine
        .admit(&RequestInfo::inbound(&Method::GET, path, &h))
        .await
}

fn stats(engine: &Engine, rule: &str) -> gov_engine::RuleStats {
    engine
        .stats()
        .rules
        .into_iter()
        .find(|r| &*r.rule == rule)
        .unwrap()
}

const BULKHEAD: &str = r#"
service: order
version: v1
rules:
- name: order/slow_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead:
    max_concurrent: 2
    max_wait_ms: 10
    reject_status: 408
"#;

#[tokio::test(start_paused = true)]
async fn bulkhead_fails_fast_and_names_the_rule() {
    let e = engine(BULKHEAD);
    let a = admit(&e, "/slow/1", None).await.unwrap();
    let b = admit(&e, "/slow/2", None).await.unwrap();
    // Unmatched paths are not governed.
    let free = admit(&e, "/fast", None).await.unwrap();
    assert!(!free.is_governed());

    let started = Instant::now();
    let r = admit(&e, "/slow/3", None).await.unwrap_err();
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(10),
        "waited max_wait"
    );
    assert_eq!(r.reason, RejectReason::BulkheadTimeout);
    let resp = r.to_response();
    assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(resp.headers()[REJECTED_BY], "order/slow_calls");

    let s = stats(&e, "order/slow_calls");
    assert_eq!((s.in_flight, s.admitted, s.capacity), (2, 2, 2));
    assert_eq!(s.rejected(RejectReason::BulkheadTimeout), 1);

    a.finish(Outcome::Status(200));
    let c = admit(&e, "/slow/3", None).await.unwrap();
    drop((b, c));
    let s = stats(&e, "order/slow_calls");
    assert_eq!((s.in_flight, s.admitted), (0, 3));
    assert_eq!(
        s.latency.iter().sum::<u64>(),
        1,
        "one call recorded its latency"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiting_call_gets_the_next_permit() {
    let e = engine(&BULKHEAD.replace("max_wait_ms: 10", "max_wait_ms: 100"));
    let a = admit(&e, "/slow", None).await.unwrap();
    let _b = admit(&e, "/slow", None).await.unwrap();
    let h = HeaderMap::new();
    let Decision::Wait(pending) = e.try_admit(&RequestInfo::inbound(&Method::GET, "/slow", &h))
    else {
        panic!("expected to wait")
    };
    let waiter = tokio::spawn(async move {
        let start = Instant::now();
        pending.wait().await.map(|adm| (start.elapsed(), adm))
    });
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(stats(&e, "order/slow_calls").waiting, 1);
    drop(a);
    let (waited, _c) = waiter.await.unwrap().unwrap();
    assert_eq!(waited, Duration::from_millis(40));
    assert_eq!(stats(&e, "order/slow_calls").waiting, 0);
}

const LIMIT: &str = r#"
service: order
consumer_header: x-gov-consumer
rules:
- name: order/crm_supplier
  on:
    and:
      exprs:
      - path: {kind: PATH_KIND_PREFIX, value: /mdm/supplier}
      - consumer: crm
  limit:
    calls: {amount: 2, window_ms: 1000}
    key: LIMIT_KEY_CONSUMER
- name: order/per_consumer
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  limit:
    calls: {amount: 1, window_ms: 1000}
    key: LIMIT_KEY_CONSUMER
    release: {after_ms: 7200000}
"#;

/// The same release for every algorithm: a released key starts fresh (a
/// token bucket full again, a sliding window without its count), not with
/// a fixed window's word read as another algorithm's state.
#[tokio::test(start_paused = true)]
async fn a_released_key_starts_fresh_whatever_the_algorithm() {
    for algorithm in [
        "LIMIT_ALGORITHM_TOKEN_BUCKET",
        "LIMIT_ALGORITHM_SLIDING_WINDOW",
    ] {
        let burst = if algorithm.ends_with("BUCKET") {
            "burst: 1\n    "
        } else {
            ""
        };
        let config = LIMIT.replace(
            "calls: {amount: 1, window_ms: 1000}",
            &format!("calls: {{amount: 1, window_ms: 1000}}\n    {burst}algorithm: {algorithm}"),
        );
        assert_ne!(config, LIMIT);
        let e = engine(&config);
        // Some seconds into the limit's life: a window number well above 0.
        tokio::time::advance(std::time::Duration::from_secs(30)).await;
        assert!(now(&e, "/api", Some("a")).is_ok(), "{algorithm}");
        assert!(now(&e, "/api", Some("a")).is_err(), "{algorithm}");
        assert_eq!(
            e.release_limit("order/per_consumer", Some("a"), "ops"),
            Ok(true)
        );
        assert!(
            now(&e, "/api", Some("a")).is_ok(),
            "{algorithm}: the next call after a release is admitted"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn limit_rejects_one_consumer_with_retry_after() {
    let e = engine(LIMIT);
    assert!(now(&e, "/mdm/supplier/1", Some("crm")).is_ok());
    tokio::time::advance(Duration::from_millis(300)).await;
    assert!(now(&e, "/mdm/supplier/2", Some("crm")).is_ok());
    let r = now(&e, "/mdm/supplier/3", Some("crm")).unwrap_err();
    assert_eq!(r.reason, RejectReason::LimitCalls);
    let resp = r.to_response();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(resp.headers()[REJECTED_BY], "order/crm_supplier");
    // Other consumers do not match this limit at all.
    for _ in 0..10 {
        assert!(now(&e, "/mdm/supplier/1", Some("shop")).is_ok());
    }
    // A new window admits crm again.
    tokio::time::advance(Duration::from_millis(700)).await;
    assert!(now(&e, "/mdm/supplier/4", Some("crm")).is_ok());
}

#[tokio::test(start_paused = true)]
async fn engaged_limit_latches_per_consumer_until_released() {
    let e = engine(LIMIT);
    let mut events = e.subscribe();
    assert!(now(&e, "/api", Some("a")).is_ok());
    let r = now(&e, "/api", Some("a")).unwrap_err();
    assert_eq!(r.retry_after_secs(), Some(7200));
    assert_eq!(events.try_recv().unwrap().kind, EventKind::LimitEngaged);
    // Engaged for consumer `a` only, and across windows.
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(now(&e, "/api", Some("a")).is_err());
    assert!(now(&e, "/api", Some("b")).is_ok());
    assert!(stats(&e, "order/per_consumer").limit_engaged);
    let engaged = e.engaged_limits();
    assert_eq!(engaged.len(), 1);
    assert_eq!(engaged[0].remaining, Some(Duration::from_secs(7140)));

    assert_eq!(e.release_limit("order/per_consumer", None, "ops"), Ok(true));
    assert_eq!(events.try_recv().unwrap().kind, EventKind::LimitReleased);
    assert!(now(&e, "/api", Some("a")).is_ok());
    assert!(e.release_limit("order/nope", None, "ops").is_err());
    assert!(
        e.release_fuse("order/per_consumer", "ops").is_err(),
        "not a fuse"
    );
}

/// A release inside the window whose count engaged the latch stays
/// released: the key starts on a fresh count, so its next call is admitted
/// and the latch comes back only when it goes over the limit again.
#[tokio::test(start_paused = true)]
async fn a_release_in_an_over_count_window_holds_until_the_key_goes_over_again() {
    let e = engine(LIMIT);
    let mut events = e.subscribe();
    assert!(now(&e, "/api", Some("a")).is_ok());
    assert!(now(&e, "/api", Some("a")).is_err());
    assert_eq!(events.try_recv().unwrap().kind, EventKind::LimitEngaged);
    // Still the same 1 s window (time is paused).
    assert_eq!(
        e.release_limit("order/per_consumer", Some("a"), "ops"),
        Ok(true)
    );
    assert_eq!(events.try_recv().unwrap().kind, EventKind::LimitReleased);
    assert!(
        now(&e, "/api", Some("a")).is_ok(),
        "the next call after a release is admitted"
    );
    assert!(events.try_recv().is_err(), "and engages nothing");
    assert!(e.engaged_limits().is_empty());
    // Over the limit again: engaged again, for its full time.
    let r = now(&e, "/api", Some("a")).unwrap_err();
    assert_eq!(r.retry_after_secs(), Some(7200));
    assert_eq!(events.try_recv().unwrap().kind, EventKind::LimitEngaged);
    // A release of every key does the same.
    assert_eq!(e.release_limit("order/per_consumer", None, "ops"), Ok(true));
    assert!(now(&e, "/api", Some("a")).is_ok());
}

#[tokio::test(start_paused = true)]
async fn one_key_of_a_consumer_limit_releases_alone_and_events_and_stats_name_keys() {
    let e = engine(LIMIT);
    let mut events = e.subscribe();
    for consumer in ["a", "b"] {
        assert!(now(&e, "/api", Some(consumer)).is_ok());
        assert!(now(&e, "/api", Some(consumer)).is_err());
        let engaged = events.try_recv().unwrap();
        assert_eq!(engaged.kind, EventKind::LimitEngaged);
        assert_eq!(&*engaged.key, consumer);
        assert_eq!(engaged.to_proto().key, consumer);
    }
    let s = stats(&e, "order/per_consumer");
    assert!(s.limit_engaged);
    let keys: Vec<&str> = s.engaged_keys.iter().map(|k| &**k).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(s.to_proto().engaged_keys, ["a", "b"]);

    // Releasing `b` leaves `a` latched.
    assert_eq!(
        e.release_limit("order/per_consumer", Some("b"), "ops"),
        Ok(true)
    );
    let released = events.try_recv().unwrap();
    assert_eq!(released.kind, EventKind::LimitReleased);
    assert_eq!(&*released.key, "b");
    // b starts on a fresh count (see the test above).
    assert!(now(&e, "/api", Some("b")).is_ok());
    assert!(now(&e, "/api", Some("a")).is_err(), "a stays latched");
    let keys: Vec<String> = stats(&e, "order/per_consumer")
        .engaged_keys
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(keys, ["a"]);
    // A key that is not latched: nothing to release, no event.
    assert_eq!(
        e.release_limit("order/per_consumer", Some("zed"), "ops"),
        Ok(false)
    );
    assert!(events.try_recv().is_err());
    // Every key: `a` too; the event has no key (all of them).
    assert_eq!(e.release_limit("order/per_consumer", None, "ops"), Ok(true));
    assert_eq!(&*events.try_recv().unwrap().key, "");
    assert!(!stats(&e, "order/per_consumer").limit_engaged);
}

#[tokio::test(start_paused = true)]
async fn limit_releases_itself_after_its_time() {
    let e = engine(LIMIT);
    assert!(now(&e, "/api", Some("a")).is_ok());
    assert!(now(&e, "/api", Some("a")).is_err());
    tokio::time::advance(Duration::from_secs(7199)).await;
    assert!(now(&e, "/api", Some("a")).is_err());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(now(&e, "/api", Some("a")).is_ok());
}

#[tokio::test(start_paused = true)]
async fn byte_limit_counts_streamed_bytes() {
    let e = engine(
        r#"
service: order
rules:
- name: order/bytes
  on: {any: true}
  limit:
    bytes: {amount: 1000, window_ms: 60000}
"#,
    );
    let a = now(&e, "/upload", None).unwrap();
    assert!(a.counts_bytes());
    a.add_bytes(300); // request
    a.byte_meter().unwrap().add(700); // response, from elsewhere
    a.finish(Outcome::Status(200));
    let r = now(&e, "/upload", None).unwrap_err();
    assert_eq!(r.reason, RejectReason::LimitBytes);
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    tokio::time::advance(Duration::from_secs(60)).await;
    assert!(now(&e, "/upload", None).is_ok());
}

const OUTBOUND: &str = r#"
service: order
rules:
- name: order/inventory_pace
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
async fn outbound_shaping_delays_instead_of_rejecting() {
    let e = engine(OUTBOUND);
    let h = HeaderMap::new();
    let call = |instance: &'static str| {
        let e = e.clone();
        let h = h.clone();
        async move {
            let start = Instant::now();
            let info =
                RequestInfo::outbound(&Method::GET, "/stock", &h, "inventory", Some(instance));
            e.admit(&info).await.map(|a| (start.elapsed(), a))
        }
    };
    // Two calls fit the window; the bulkhead is per instance.
    let (d1, _a1) = call("10.0.0.1:80").await.unwrap();
    let (d2, _a2) = call("10.0.0.2:80").await.unwrap();
    assert_eq!((d1, d2), (Duration::ZERO, Duration::ZERO));
    // The third waits for the next window (100 ms) instead of being rejected.
    let (d3, _a3) = call("10.0.0.3:80").await.unwrap();
    assert_eq!(d3, Duration::from_millis(100));
    // The inbound side is not affected by outbound rules.
    assert!(!now(&e, "/stock", None).unwrap().is_governed());
    // Same instance again: its bulkhead (max 1, no wait) is full.
    tokio::time::advance(Duration::from_millis(100)).await;
    let r = call("10.0.0.1:80").await.unwrap_err();
    assert_eq!(r.reason, RejectReason::BulkheadFull);
    assert_eq!(&*r.rule, "order/per_instance");
}

#[tokio::test(start_paused = true)]
async fn shaping_gives_up_beyond_max_delay() {
    let e = engine(&OUTBOUND.replace("max_delay_ms: 150", "max_delay_ms: 50"));
    let h = HeaderMap::new();
    let info = RequestInfo::outbound(&Method::GET, "/stock", &h, "inventory", None);
    let _a = e.admit(&info).await.unwrap();
    drop(e.admit(&info).await); // the shared bulkhead scope is full, the limit still counts it
    tokio::time::advance(Duration::from_millis(10)).await;
    let r = e.admit(&info).await.unwrap_err();
    assert_eq!(
        r.reason,
        RejectReason::LimitCalls,
        "90 ms to the next window > 50 ms"
    );
    assert_eq!(r.retry_after, Some(Duration::from_millis(90)));
}

const FUSE: &str = r#"
service: order
rules:
- name: order/mdm
  on: {path: {kind: PATH_KIND_PREFIX, value: /mdm}}
  fuse:
    trips:
    - metric: TRIP_METRIC_BUSINESS_ERROR_RATIO
      op: COMPARE_OP_GT
      ratio_milli_percent: 50000
      window_ms: 60000
      min_calls: 4
    business:
      status: [{from: 500, to: 599}]
"#;

#[tokio::test(start_paused = true)]
async fn fuse_trips_for_everyone_and_a_release_admits_again() {
    let e = engine(FUSE);
    let mut events = e.subscribe();
    now(&e, "/mdm/a", Some("crm"))
        .unwrap()
        .finish(Outcome::Status(200));
    for _ in 0..3 {
        now(&e, "/mdm/a", Some("crm"))
            .unwrap()
            .finish(Outcome::Status(500));
    }
    let event = events.try_recv().unwrap();
    assert_eq!(event.kind, EventKind::FuseTripped);
    assert_eq!(&*event.rule, "order/mdm");
    assert_eq!(
        event.reason,
        "business_error_ratio 75% > 50% over 60s (4 calls)"
    );
    // Open for every consumer, with 503.
    for consumer in [Some("crm"), Some("shop"), None] {
        let r = now(&e, "/mdm/b", consumer).unwrap_err();
        assert_eq!(r.reason, RejectReason::FuseOpen);
        assert_eq!(r.retry_after, None, "manual recovery: no promise");
        assert_eq!(r.to_response().status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    // Manual recovery: still open a day later.
    tokio::time::advance(Duration::from_secs(86_400)).await;
    assert!(now(&e, "/mdm/b", None).is_err());
    assert_eq!(e.tripped_fuses()[0].state, FuseState::Open);
    assert_eq!(stats(&e, "order/mdm").fuse, Some(FuseState::Open));

    assert_eq!(e.release_fuse("order/mdm", "ops"), Ok(true));
    assert_eq!(events.try_recv().unwrap().kind, EventKind::FuseReleased);
    assert!(now(&e, "/mdm/b", None).is_ok());
    assert!(e.tripped_fuses().is_empty());
    assert_eq!(e.release_fuse("order/mdm", "ops"), Ok(false));
}

#[tokio::test(start_paused = true)]
async fn fuse_recovers_through_half_open_probes() {
    let e = engine(
        r#"
service: inventory
rules:
- name: inventory/stock_errors
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 30000}
    recover: {after: {after_ms: 30000, probes: 2}}
"#,
    );
    let mut events = e.subscribe();
    now(&e, "/stock", None)
        .unwrap()
        .finish(Outcome::ConnectFailure);
    tokio::time::advance(Duration::from_secs(10)).await;
    let r = now(&e, "/stock", None).unwrap_err();
    assert_eq!(
        r.retry_after,
        Some(Duration::from_secs(20)),
        "until half-open"
    );
    assert_eq!(r.to_response().headers()["retry-after"], "20");
    tokio::time::advance(Duration::from_secs(20)).await;
    let p1 = now(&e, "/stock", None).unwrap();
    let p2 = now(&e, "/stock", None).unwrap();
    assert_eq!(
        stats(&e, "inventory/stock_errors").fuse,
        Some(FuseState::HalfOpen)
    );
    assert_eq!(
        now(&e, "/stock", None).unwrap_err().reason,
        RejectReason::FuseOpen
    );
    p1.finish(Outcome::Status(200));
    p2.finish(Outcome::Status(200));
    assert_eq!(
        stats(&e, "inventory/stock_errors").fuse,
        Some(FuseState::Closed)
    );
    assert!(now(&e, "/stock", None).is_ok());
    let kinds: Vec<_> = std::iter::from_fn(|| events.try_recv().ok())
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            EventKind::FuseTripped,
            EventKind::FuseHalfOpen,
            EventKind::FuseReleased
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn timeouts_take_the_shortest_and_count_for_fuses() {
    let e = engine(
        r#"
service: order
rules:
- name: order/api_timeout
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  bulkhead:
    max_concurrent: 1000
    timeout_ms: 300
- name: order/api_bulkhead
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  bulkhead:
    max_concurrent: 10
    timeout_ms: 2000
- name: order/api_fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 10000}
"#,
    );
    let a = now(&e, "/api/x", None).unwrap();
    assert_eq!(a.timeout(), Some(Duration::from_millis(300)));
    let r = a.timed_out();
    assert_eq!(r.reason, RejectReason::Timeout);
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(&*r.rule, "order/api_timeout");
    assert_eq!(
        stats(&e, "order/api_timeout").rejected(RejectReason::Timeout),
        1
    );
    // A timeout is a system error by default: the fuse tripped.
    assert_eq!(
        now(&e, "/api/x", None).unwrap_err().reason,
        RejectReason::FuseOpen
    );
    // Both bulkheads' permits were returned.
    assert_eq!(stats(&e, "order/api_timeout").in_flight, 0);
    assert_eq!(stats(&e, "order/api_bulkhead").in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn a_refused_call_returns_the_permits_it_took() {
    let e = engine(
        r#"
service: order
rules:
- name: order/b
  on: {any: true}
  bulkhead:
    max_concurrent: 1
- name: order/l
  on: {path: {kind: PATH_KIND_EXACT, value: /limited}}
  limit:
    calls: {amount: 1, window_ms: 1000}
"#,
    );
    // Limits are checked before bulkheads, so a refused call holds nothing.
    drop(now(&e, "/limited", None).unwrap());
    assert_eq!(
        now(&e, "/limited", None).unwrap_err().reason,
        RejectReason::LimitCalls
    );
    assert_eq!(stats(&e, "order/b").in_flight, 0);
    assert!(now(&e, "/other", None).is_ok());
}

#[tokio::test(start_paused = true)]
async fn reload_keeps_the_state_of_unchanged_rules() {
    let e = engine(BULKHEAD);
    let a = now(&e, "/slow", None).unwrap();
    let b = now(&e, "/slow", None).unwrap();
    // Same rule, same parameters, new version: in-flight permits still count.
    let applied = e
        .apply_target(&target(&BULKHEAD.replace("version: v1", "version: v2")))
        .unwrap();
    assert_eq!(
        (&*applied.version, applied.kept, applied.fresh),
        ("v2", 1, 0)
    );
    assert_eq!(e.config().version.as_ref(), "v2");
    let d = e.try_admit(&RequestInfo::inbound(
        &Method::GET,
        "/slow",
        &HeaderMap::new(),
    ));
    assert!(matches!(d, Decision::Wait(_)), "still full after reload");
    drop(d);
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 2);
    // Changed parameters: a new bulkhead over the same permit pool (a resize
    // never admits above the new limit; issue 12): the 2 in flight still count.
    let applied = e
        .apply_target(&target(
            &BULKHEAD.replace("max_concurrent: 2", "max_concurrent: 3"),
        ))
        .unwrap();
    assert_eq!((applied.kept, applied.fresh), (0, 1));
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 2);
    // Old admissions give their permits back to the shared pool.
    drop((a, b));
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_config_is_refused_and_the_old_one_stays() {
    let e = engine(BULKHEAD);
    let err = e
        .apply_target(&target(
            &BULKHEAD.replace("max_concurrent: 2", "max_concurrent: 0"),
        ))
        .unwrap_err();
    assert_eq!(err.rule(), Some("order/slow_calls"));
    assert_eq!(
        err.to_string(),
        "rule `order/slow_calls`: `max_concurrent` must be > 0"
    );
    assert_eq!(e.config().version.as_ref(), "v1");
    let bad_match = BULKHEAD.replace("value: /slow", "value: slow");
    let err = e.apply_target(&target(&bad_match)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule `order/slow_calls`: path `slow` does not start with `/`"
    );
    let dup = format!(
        "{BULKHEAD}{}",
        BULKHEAD
            .lines()
            .skip_while(|l| !l.starts_with("- name"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let err = e.apply_target(&target(&dup)).unwrap_err();
    assert_eq!(err.to_string(), "rule `order/slow_calls` is defined twice");
}

/// The engine fills in no default: a config missing a value the compiler
/// always writes (or carrying a kind, mode or enum value this agent does not
/// know) is refused, naming the rule, and the config in force stays.
#[test]
fn a_missing_or_unknown_value_is_refused_naming_the_rule() {
    use gov_proto::v1::rule::Spec;
    fn spec(t: &mut TargetConfig, i: usize) -> &mut Spec {
        t.rules[i].spec.as_mut().unwrap()
    }
    fn bulkhead(t: &mut TargetConfig) -> &mut gov_proto::v1::Bulkhead {
        match spec(t, 0) {
            Spec::Bulkhead(b) => b,
            _ => panic!("rule 0 is a bulkhead"),
        }
    }
    fn fuse(t: &mut TargetConfig) -> &mut gov_proto::v1::Fuse {
        match spec(t, 0) {
            Spec::Fuse(f) => f,
            _ => panic!("rule 0 is a fuse"),
        }
    }
    fn limit(t: &mut TargetConfig) -> &mut gov_proto::v1::Limit {
        match spec(t, 0) {
            Spec::Limit(l) => l,
            _ => panic!("rule 0 is a limit"),
        }
    }
    type Break = fn(&mut TargetConfig);
    let cases: [(&str, &str, Break); 20] = [
        (BULKHEAD, "names no consumer header", |t| {
            t.consumer_header.clear()
        }),
        (BULKHEAD, "`mode` is missing", |t| t.rules[0].mode = 0),
        (BULKHEAD, "mode 9 is unknown to this agent", |t| {
            t.rules[0].mode = 9
        }),
        (BULKHEAD, "the rule has no spec", |t| t.rules[0].spec = None),
        (BULKHEAD, "`on` is missing", |t| t.rules[0].on = None),
        (BULKHEAD, "direction 5 is unknown", |t| {
            t.rules[0].direction = 5
        }),
        (BULKHEAD, "`reject_status` is missing", |t| {
            bulkhead(t).reject_status = 0
        }),
        (BULKHEAD, "`key` 9 is unknown to this agent", |t| {
            bulkhead(t).key = 9
        }),
        (LIMIT, "`reject_status` is missing", |t| {
            limit(t).reject_status = 0
        }),
        (FUSE, "`reject_status` is missing", |t| {
            fuse(t).reject_status = 0
        }),
        (FUSE, "`business` (the error class) is missing", |t| {
            fuse(t).business = None
        }),
        (FUSE, "`system` (the error class) is missing", |t| {
            fuse(t).system = None
        }),
        (FUSE, "`recover` is missing", |t| fuse(t).recover = None),
        (BULKHEAD, "`reject_grpc_status` is missing", |t| {
            bulkhead(t).reject_grpc_status = 0
        }),
        (LIMIT, "`reject_grpc_status` is missing", |t| {
            limit(t).reject_grpc_status = 0
        }),
        (FUSE, "`reject_grpc_status` is missing", |t| {
            fuse(t).reject_grpc_status = 0
        }),
        (
            FUSE,
            "`reject_grpc_status` 17 is not a grpc status code",
            |t| fuse(t).reject_grpc_status = 17,
        ),
        (
            FUSE,
            "`system.grpc_status` -1 is not a grpc status code",
            |t| fuse(t).system.as_mut().unwrap().grpc_status.push(-1),
        ),
        // A slow metric without its threshold, an error metric with one.
        (FUSE, "`trip.slow_ms` must be > 0", |t| {
            fuse(t).trips[0].metric = gov_proto::v1::TripMetric::SlowCallRatio as i32
        }),
        (
            FUSE,
            "`trip.slow_ms` is set on `business_error_ratio`, which counts errors",
            |t| fuse(t).trips[0].slow_ms = 2000,
        ),
    ];
    for (yaml, expected, break_it) in cases {
        let e = engine(yaml);
        let before = e.config();
        let mut t = target(yaml);
        t.version = "broken".into();
        break_it(&mut t);
        let err = e.apply_target(&t).unwrap_err();
        assert!(err.to_string().contains(expected), "{expected}: {err}");
        if !expected.contains("consumer header") {
            assert_eq!(err.rule(), Some(t.rules[0].name.as_str()), "{err}");
        }
        assert!(
            std::sync::Arc::ptr_eq(&before, &e.config()),
            "{expected}: the config in force stays"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn stats_convert_to_the_wire() {
    let e = engine(BULKHEAD);
    let a = now(&e, "/slow", None).unwrap();
    tokio::time::advance(Duration::from_millis(150)).await;
    a.finish(Outcome::Status(200));
    let wire = e.stats().to_proto(1234);
    assert_eq!(wire.version, "v1");
    let r = &wire.rules[0];
    assert_eq!(r.rule, "order/slow_calls");
    assert_eq!(
        r.latency_buckets,
        [0, 0, 0, 0, 1, 0, 0, 0],
        "150 ms is in the <=200 ms bucket"
    );
    assert_eq!(r.admitted, 1);
    assert_eq!(r.capacity, 2);
}

// === The tower layer ===

#[tokio::test(start_paused = true)]
async fn tower_layer_governs_a_real_service() {
    let e = engine(
        r#"
service: order
rules:
- name: order/slow_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead:
    max_concurrent: 1
- name: order/bytes
  on: {path: {kind: PATH_KIND_PREFIX, value: /big}}
  limit:
    bytes: {amount: 100, window_ms: 60000}
"#,
    );
    let inner = tower::service_fn(
        |req: Request<gov_engine::MeteredBody<Full<Bytes>>>| async move {
            let path = req.uri().path().to_string();
            // Read the request body through the meter.
            let body = req.into_body().collect().await.unwrap().to_bytes();
            if path.starts_with("/slow") {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let reply = if path.starts_with("/big") {
                vec![b'x'; 80]
            } else {
                body.to_vec()
            };
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(reply))))
        },
    );
    let svc = GovernLayer::new(e.clone()).layer(inner);
    let req = |path: &str, body: &'static str| {
        Request::get(path)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };

    // A slow call holds the only permit; a second one is refused at once with 408.
    let first = tokio::spawn(svc.clone().oneshot(req("/slow/1", "")));
    tokio::time::sleep(Duration::from_millis(1)).await;
    let second = svc.clone().oneshot(req("/slow/2", "")).await.unwrap();
    assert_eq!(second.status(), StatusCode::REQUEST_TIMEOUT);
    assert_eq!(second.headers()[REJECTED_BY], "order/slow_calls");
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The permit is held until the body is read to the end.
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 1);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty());
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 0);
    let third = svc.clone().oneshot(req("/slow/3", "")).await.unwrap();
    assert_eq!(third.status(), StatusCode::OK);
    drop(third);

    // Bytes: 30 request + 80 response > 100, so the next call is refused.
    let big = svc
        .clone()
        .oneshot(req("/big", "012345678901234567890123456789"))
        .await
        .unwrap();
    assert_eq!(big.status(), StatusCode::OK);
    let body = big.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 80);
    let refused = svc.clone().oneshot(req("/big", "")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()[REJECTED_BY], "order/bytes");
    let text = refused.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&text[..], b"rejected by order/bytes (limit_bytes)\n");

    // Ungoverned paths pass untouched.
    let mut svc = svc;
    let echo = svc
        .ready()
        .await
        .unwrap()
        .call(req("/echo", "hi"))
        .await
        .unwrap();
    assert_eq!(echo.into_body().collect().await.unwrap().to_bytes(), "hi");
}

#[tokio::test(start_paused = true)]
async fn tower_layer_waits_and_times_out() {
    let e = engine(
        r#"
service: order
rules:
- name: order/b
  on: {any: true}
  bulkhead:
    max_concurrent: 1
    max_wait_ms: 500
    timeout_ms: 200
"#,
    );
    let inner = tower::service_fn(
        |req: Request<gov_engine::MeteredBody<Full<Bytes>>>| async move {
            let ms: u64 = req.uri().path()[1..].parse().unwrap();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"done"))))
        },
    );
    let svc = GovernLayer::new(e.clone()).layer(inner);
    let req = |path: &str| Request::get(path).body(Full::new(Bytes::new())).unwrap();

    let start = Instant::now();
    let first = tokio::spawn({
        let svc = svc.clone();
        async move {
            // The permit is held until the response body ends: read it.
            let response = svc.oneshot(req("/100")).await.unwrap();
            let status = response.status();
            response.into_body().collect().await.unwrap();
            status
        }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    // Waits for the first call's permit (about 100 ms), then runs.
    let second = svc.clone().oneshot(req("/50")).await.unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    drop(second);
    assert_eq!(start.elapsed(), Duration::from_millis(150));
    assert_eq!(first.await.unwrap(), StatusCode::OK);

    // Exceeds the 200 ms timeout: 504 naming the bulkhead that set it.
    let slow = svc.clone().oneshot(req("/1000")).await.unwrap();
    assert_eq!(slow.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(slow.headers()[REJECTED_BY], "order/b");
    assert_eq!(stats(&e, "order/b").in_flight, 0);
}

// === Concurrency ===

/// Many tasks on two worker threads contend for 3 permits with a generous
/// wait: nobody is refused (no lost wake-up), and never more than 3 hold one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_two_threads_never_exceed_the_permits() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    let e = engine(
        r#"
service: order
rules:
- name: order/b
  on: {any: true}
  bulkhead:
    max_concurrent: 3
    max_wait_ms: 10000
"#,
    );
    let holding = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (e, holding, most) = (e.clone(), holding.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..100 {
                let a = admit(&e, "/x", None)
                    .await
                    .expect("admitted within max_wait");
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Hold the permit across a timer so that others must wait.
                if (t + i) % 2 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                } else {
                    tokio::task::yield_now().await;
                }
                holding.fetch_sub(1, Ordering::SeqCst);
                a.finish(Outcome::Status(200));
            }
        }));
    }
    let all = async {
        for t in tasks {
            t.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("bounded run");
    assert!(most.load(Ordering::SeqCst) <= 3);
    let s = stats(&e, "order/b");
    assert_eq!((s.admitted, s.in_flight, s.waiting), (1600, 0, 0));
}

/// Configs swapped while two threads decide: every call is decided by one
/// config's rules, never a mix (the config a call was decided under and the
/// timeout its rules give always agree), and both configs were in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_swap_is_atomic_per_request() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    // Config `one` gives every call 100 ms, config `two` 200 ms, each through
    // a bulkhead with that timeout and a bulkhead with a longer one.
    let config = |version: &str, ms: u64| {
        target(&format!(
            r#"
service: order
version: {version}
rules:
- name: order/t_{version}
  on: {{any: true}}
  bulkhead:
    max_concurrent: 1000
    timeout_ms: {ms}
- name: order/b_{version}
  on: {{any: true}}
  bulkhead:
    max_concurrent: 1000
    timeout_ms: {}
"#,
            ms * 10
        ))
    };
    let (one, two) = (config("one", 100), config("two", 200));
    let e = Engine::empty("order");
    e.apply_target(&one).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Calls decided under `one` and under `two`.
    let seen = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let mut deciders = Vec::new();
    for _ in 0..2 {
        let (e, stop, seen) = (e.clone(), stop.clone(), seen.clone());
        deciders.push(tokio::spawn(async move {
            for n in 0..100_000_000u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let a = now(&e, "/", None).unwrap();
                let version = match (a.config_version(), a.timeout()) {
                    (Some("one"), Some(t)) if t == Duration::from_millis(100) => 0,
                    (Some("two"), Some(t)) if t == Duration::from_millis(200) => 1,
                    other => panic!("a call saw a mix of configs: {other:?}"),
                };
                seen[version].fetch_add(1, Ordering::Relaxed);
                a.finish(Outcome::Status(200));
                if n % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    // Each swap lands while the deciders run, and each config is in force
    // until a call was decided under it: on a busy machine the deciders may
    // be descheduled for a whole burst of swaps, and a config nobody
    // decided under proves nothing.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for i in 0..400 {
        let (config, version) = if i % 2 == 0 { (&two, 1) } else { (&one, 0) };
        let before = seen[version].load(Ordering::Relaxed);
        e.apply_target(config).unwrap();
        while seen[version].load(Ordering::Relaxed) == before {
            // A decider that saw a mix panicked: report it now.
            if let Some(d) = deciders.iter_mut().find(|d| d.is_finished()) {
                d.await.unwrap();
                panic!("a decider ran out of calls before the swaps ended");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no call decided under swap {i} within 60 s"
            );
            tokio::task::yield_now().await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for d in deciders {
        d.await.unwrap();
    }
}

/// A bulkhead of `max` permits on `/slow`, as engine `n`'s config.
fn bulkhead_of(n: usize, max: usize) -> String {
    BULKHEAD
        .replace("version: v1", &format!("version: e{n}"))
        .replace("max_concurrent: 2", &format!("max_concurrent: {max}"))
        .replace("max_wait_ms: 10", "max_wait_ms: 0")
}

/// How many `/slow` calls `e` admits at once (all held, then released).
fn capacity(e: &Engine) -> usize {
    let held: Vec<Admission> = (0..100).map_while(|_| now(e, "/slow", None).ok()).collect();
    held.len()
}

#[tokio::test(start_paused = true)]
async fn one_thread_deciding_for_many_engines_sees_each_current_config() {
    // More engines than a thread caches snapshots for, used in turns.
    let engines: Vec<Engine> = (0..7).map(|n| engine(&bulkhead_of(n, n + 1))).collect();
    for round in 0..3 {
        for (n, e) in engines.iter().enumerate() {
            assert_eq!(capacity(e), n + 1 + round, "engine {n}, round {round}");
        }
        // Swap every config between rounds: the next decisions see the new one.
        for (n, e) in engines.iter().enumerate() {
            e.apply_target(&target(&bulkhead_of(n, n + 2 + round)))
                .unwrap();
        }
    }
    // An unmatched request after a swap that adds a rule for it.
    let e = &engines[0];
    assert!(now(e, "/other", None).unwrap().config_version().is_none());
    e.apply_target(&target(
        &bulkhead_of(0, 1).replace("value: /slow", "value: /other"),
    ))
    .unwrap();
    assert!(now(e, "/other", None).unwrap().is_governed());
    assert!(!now(e, "/slow", None).unwrap().is_governed());
}

#[test]
fn counts_are_exact_across_many_threads() {
    // More threads at once than there are stripes (at most 64): some count
    // in the shared stripe; all of them exit before the stats are read.
    const THREADS: usize = 70;
    const CALLS: usize = 300;
    let e = engine(&bulkhead_of(0, 1_000_000));
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (e, barrier) = (e.clone(), barrier.clone());
            std::thread::spawn(move || {
                for i in 0..CALLS {
                    let a = now(&e, "/slow", None).unwrap();
                    // Every tenth call ends without a recorded outcome.
                    if (i + t) % 10 != 0 {
                        a.finish(Outcome::Status(200));
                    }
                }
                // Hold the stripe until every thread has counted.
                barrier.wait();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = stats(&e, "order/slow_calls");
    let total = (THREADS * CALLS) as u64;
    assert_eq!(s.admitted, total);
    assert_eq!(s.latency.iter().sum::<u64>(), total - total / 10);
    assert_eq!(s.in_flight, 0);
    // A thread that starts now (slots were given back) adds to the same sums.
    let e2 = e.clone();
    std::thread::spawn(move || {
        now(&e2, "/slow", None)
            .unwrap()
            .finish(Outcome::Status(200))
    })
    .join()
    .unwrap();
    assert_eq!(stats(&e, "order/slow_calls").admitted, total + 1);
}

// === latches across restarts and config swaps ===

/// A manual fuse on /mdm (one error trips it) and a per-consumer limit on
/// /api that latches for 2h.
const LATCHING: &str = r#"
service: order
version: v1
consumer_header: x-gov-consumer
rules:
- name: order/mdm
  on: {path: {kind: PATH_KIND_PREFIX, value: /mdm}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 10000}
- name: order/per_consumer
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  limit:
    calls: {amount: 1, window_ms: 1000}
    key: LIMIT_KEY_CONSUMER
    release: {after_ms: 7200000}
"#;

/// The wall clock these tests pretend it is (engine time is paused).
const T0: u64 = 1_700_000_000_000;

/// Trips the fuse and engages the limit for consumer `a`.
fn trip_both(e: &Engine) {
    now(e, "/mdm", None).unwrap().finish(Outcome::Status(500));
    assert!(now(e, "/mdm", None).is_err());
    assert!(now(e, "/api", Some("a")).is_ok());
    assert!(now(e, "/api", Some("a")).is_err());
}

#[tokio::test(start_paused = true)]
async fn latches_survive_a_restart_silently_and_end_only_by_release_or_deadline() {
    let before = engine(LATCHING);
    trip_both(&before);
    tokio::time::advance(Duration::from_secs(600)).await;
    let latches = before.latches(T0);
    assert_eq!(latches.len(), 2, "{latches:?}");
    let of = |kind| latches.iter().find(|l| l.kind == kind).unwrap();
    let fuse = of(LatchKind::Fuse);
    assert_eq!(fuse.rule, "order/mdm");
    assert_eq!(fuse.deadline_unix_ms, None, "manual");
    assert!(fuse.reason.starts_with("errors 1 >= 1"), "{}", fuse.reason);
    let limit = of(LatchKind::Limit);
    assert_eq!(
        (limit.rule.as_str(), limit.key.as_str()),
        ("order/per_consumer", "a")
    );
    // Engaged 600s ago for 2h: an absolute deadline 6600s from now.
    assert_eq!(limit.deadline_unix_ms, Some(T0 + 6_600_000));
    // Through the wire form, as the agent keeps them.
    let latches: Vec<Latch> = latches
        .iter()
        .map(|l| Latch::try_from(&l.to_proto()).unwrap())
        .collect();
    drop(before);

    // A new process: a fresh engine with the same config, latches restored.
    let after = engine(LATCHING);
    let mut events = after.subscribe();
    assert!(now(&after, "/mdm", None).is_ok(), "fresh state");
    for l in &latches {
        assert_eq!(after.restore_latch(l, T0), Ok(Restored::Armed));
        assert_eq!(after.restore_latch(l, T0), Ok(Restored::Held));
    }
    assert_eq!(events.try_recv().ok(), None, "restoring is not an event");
    assert!(after.tripped_fuses()[0].reason.starts_with("errors 1 >= 1"));
    assert!(now(&after, "/mdm", None).is_err());
    assert_eq!(
        now(&after, "/api", Some("a"))
            .unwrap_err()
            .retry_after_secs(),
        Some(6600)
    );
    assert!(now(&after, "/api", Some("b")).is_ok(), "only consumer a");
    // The limit's own `release after`, from the stored deadline.
    tokio::time::advance(Duration::from_secs(6599)).await;
    assert!(now(&after, "/api", Some("a")).is_err());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(now(&after, "/api", Some("a")).is_ok());
    assert_eq!(events.try_recv().unwrap().kind, EventKind::LimitReleased);
    // The manual fuse: a day later still open; a release ends it.
    tokio::time::advance(Duration::from_secs(86_400)).await;
    assert!(now(&after, "/mdm", None).is_err());
    assert_eq!(after.latches(T0 + 7_200_000 + 86_400_000).len(), 1);
    assert_eq!(after.release_fuse("order/mdm", "ops"), Ok(true));
    assert_eq!(events.try_recv().unwrap().kind, EventKind::FuseReleased);
    assert!(now(&after, "/mdm", None).is_ok());
    assert!(after.latches(T0).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_latch_whose_deadline_passed_while_down_is_not_armed() {
    let before = engine(LATCHING);
    trip_both(&before);
    let latches = before.latches(T0);
    let of = |kind| latches.iter().find(|l| l.kind == kind).unwrap();
    let (fuse, limit) = (of(LatchKind::Fuse), of(LatchKind::Limit));
    let after = engine(LATCHING);
    // Back 2h and 1s later.
    let later = T0 + 7_201_000;
    assert_eq!(after.restore_latch(limit, later), Ok(Restored::Expired));
    assert!(now(&after, "/api", Some("a")).is_ok());
    // Without a deadline, a limit's latch ends at since + its `release after`.
    let mut no_deadline = limit.clone();
    no_deadline.deadline_unix_ms = None;
    no_deadline.since_unix_ms = T0;
    assert_eq!(
        after.restore_latch(&no_deadline, T0 + 1_000),
        Ok(Restored::Armed)
    );
    assert_eq!(
        after.engaged_limits()[0].remaining,
        Some(Duration::from_secs(7199))
    );
    // Without its key (what govd knows), a per-consumer latch arms nothing.
    let mut keyless = limit.clone();
    keyless.key.clear();
    assert_eq!(after.restore_latch(&keyless, T0), Ok(Restored::KeyMissing));
    assert!(now(&after, "/api", None).is_ok());
    // Names are checked like release commands.
    let mut wrong = fuse.clone();
    wrong.kind = LatchKind::Limit;
    assert!(after.restore_latch(&wrong, T0).is_err());
    wrong.rule = "order/nope".into();
    assert!(after.restore_latch(&wrong, T0).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_config_swap_that_changes_a_latched_rule_keeps_its_latch() {
    let e = engine(LATCHING);
    let mut events = e.subscribe();
    trip_both(&e);
    while events.try_recv().is_ok() {}
    // Both rules change their parameters: they get fresh state, with the latch.
    let changed = LATCHING
        .replace("count: 1,", "count: 5,")
        .replace("amount: 1,", "amount: 10,")
        .replace("version: v1", "version: v2");
    let applied = e.apply_target(&target(&changed)).unwrap();
    assert_eq!((applied.kept, applied.fresh), (0, 2));
    assert!(now(&e, "/mdm", None).is_err(), "the fuse stays open");
    assert!(
        now(&e, "/api", Some("a")).is_err(),
        "the limit stays engaged"
    );
    assert_eq!(
        e.engaged_limits()[0].remaining,
        Some(Duration::from_secs(7200))
    );
    assert_eq!(events.try_recv().ok(), None, "a swap releases nothing");
    // A rule that is gone takes its latch with it.
    let gone = changed
        .split("- name: order/per_consumer")
        .next()
        .unwrap()
        .to_owned();
    e.apply_target(&target(&gone)).unwrap();
    assert_eq!(e.latches(T0).len(), 1);
}

// === Resizing a bulkhead ===

fn one_bulkhead(max: u32) -> String {
    format!(
        "service: order\nrules:\n- name: order/calls\n  on: {{path: {{kind: PATH_KIND_PREFIX, value: /x}}}}\n  bulkhead: {{max_concurrent: {max}}}\n"
    )
}

/// Shrinking a bulkhead under load keeps one permit pool: the calls in flight
/// count against the new limit, so it admits nothing until fewer than the new
/// limit are in flight (before, a new bulkhead stood beside the old one and the
/// upstream saw old + new in flight).
#[tokio::test(start_paused = true)]
async fn a_shrunk_bulkhead_never_admits_above_its_new_limit() {
    let e = engine(&one_bulkhead(10));
    let mut held: Vec<Admission> = (0..10).map(|_| now(&e, "/x/1", None).unwrap()).collect();
    assert!(now(&e, "/x/1", None).is_err(), "10 of 10 in flight");

    e.apply_target(&target(&one_bulkhead(5))).unwrap();
    assert!(
        now(&e, "/x/1", None).is_err(),
        "10 in flight, the new limit is 5"
    );
    // Calls admitted before finish: their permits go back to the shared pool.
    held.truncate(4);
    let fifth = now(&e, "/x/1", None).expect("4 in flight: one more fits under 5");
    assert!(now(&e, "/x/1", None).is_err(), "5 of 5 in flight");
    assert_eq!(stats(&e, "order/calls").in_flight, 5);

    // Growing keeps the pool too: 5 in flight, 3 more fit under 8, not 8.
    e.apply_target(&target(&one_bulkhead(8))).unwrap();
    let more: Vec<Admission> = (0..3).map(|_| now(&e, "/x/1", None).unwrap()).collect();
    assert!(now(&e, "/x/1", None).is_err(), "8 of 8 in flight");
    drop((held, fifth, more));
    assert_eq!(stats(&e, "order/calls").in_flight, 0);
}

/// A resize keeps a bulkhead's permit pools only when its scopes are keyed the
/// same way; a new key (here per operation to per instance) starts from fresh
/// scopes, so calls admitted under the old keying do not count against the new
/// one. (Kills the mutant `Bulkhead::can_resize_to -> true`.)
#[tokio::test(start_paused = true)]
async fn a_bulkhead_whose_key_changes_starts_from_fresh_scopes() {
    let e = engine(BULKHEAD);
    let a = now(&e, "/slow", None).unwrap();
    let b = now(&e, "/slow", None).unwrap();
    let applied = e
        .apply_target(&target(&BULKHEAD.replace(
            "    max_concurrent: 2",
            "    key: BULKHEAD_KEY_INSTANCE\n    max_concurrent: 2",
        )))
        .unwrap();
    assert_eq!((applied.kept, applied.fresh), (0, 1));
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 0);
    let c = now(&e, "/slow", None).unwrap();
    drop((a, b, c));
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 0);
}

/// In process, a gRPC call's outcome is the `grpc-status` of its trailers,
/// read as the body streams, and a tripped fuse answers gRPC callers the gRPC
/// way: the same engine functions the sidecar's hyper path uses.
#[tokio::test(start_paused = true)]
async fn the_layer_classifies_grpc_trailers_and_answers_grpc_rejections() {
    use http_body_util::StreamBody;
    let e = engine(
        r#"
service: order
rules:
- name: order/down
  on: {path: {kind: PATH_KIND_PREFIX, value: /shop.v1.Order/}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 2, window_ms: 60000}
    system: {grpc_status: [GRPC_CODE_UNAVAILABLE]}
    business: {grpc_status: [GRPC_CODE_INTERNAL]}
"#,
    );
    // Answers `grpc-status: <the request's x-code>` in its trailers.
    let inner = tower::service_fn(
        |req: Request<gov_engine::MeteredBody<Full<Bytes>>>| async move {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", req.headers()["x-code"].clone());
            let frames = futures::stream::iter([
                Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(b"\0\0\0\0\0"))),
                Ok(http_body::Frame::trailers(trailers)),
            ]);
            Ok::<_, Infallible>(Response::new(StreamBody::new(frames)))
        },
    );
    let mut svc = GovernLayer::new(e.clone()).layer(inner);
    let call = |code: &'static str| {
        Request::post("/shop.v1.Order/Create")
            .version(http::Version::HTTP_2)
            .header("content-type", "application/grpc")
            .header("x-code", code)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    for code in ["5", "13", "not a number", "14", "0"] {
        let response = svc.ready().await.unwrap().call(call(code)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap();
        assert_eq!(body.trailers().unwrap()["grpc-status"], code);
    }
    // One UNAVAILABLE so far: not tripped. A second trips it.
    assert_eq!(stats(&e, "order/down").fuse, Some(FuseState::Closed));
    let response = svc.ready().await.unwrap().call(call("14")).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert_eq!(stats(&e, "order/down").fuse, Some(FuseState::Open));

    let rejected = svc.ready().await.unwrap().call(call("0")).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::OK);
    assert_eq!(rejected.headers()["content-type"], "application/grpc");
    assert_eq!(rejected.headers()["grpc-status"], "14");
    assert_eq!(
        rejected.headers()["grpc-message"],
        "rejected by order/down (fuse_open)"
    );
    assert_eq!(rejected.headers()[REJECTED_BY], "order/down");
    // Counted by code: NOT_FOUND, INTERNAL, UNKNOWN (not a number), 2 UNAVAILABLE, OK.
    let grpc = stats(&e, "order/down").grpc;
    assert_eq!(
        (grpc[0], grpc[2], grpc[5], grpc[13], grpc[14]),
        (1, 1, 1, 1, 2)
    );
    assert_eq!(grpc.iter().sum::<u64>(), 6);
}

/// What a decision log reads of an admitted call: the rules that admitted it
/// and how long each made it wait, then its outcome and response bytes when
/// the admission is dropped.
#[tokio::test(start_paused = true)]
async fn an_admission_reports_its_rules_waits_and_end() {
    use std::sync::{Arc, Mutex};
    let e = engine(&BULKHEAD.replace("max_wait_ms: 10", "max_wait_ms: 100"));
    let first = admit(&e, "/slow", None).await.unwrap();
    let rules: Vec<_> = first.rules().map(|(r, w)| (r.to_string(), w)).collect();
    assert_eq!(rules, [("order/slow_calls".to_string(), None)]);
    let _second = admit(&e, "/slow", None).await.unwrap();
    let h = HeaderMap::new();
    let Decision::Wait(pending) = e.try_admit(&RequestInfo::inbound(&Method::GET, "/slow", &h))
    else {
        panic!("expected to wait")
    };
    let waiter = tokio::spawn(pending.wait());
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(first);
    let mut third = waiter.await.unwrap().unwrap();
    let rules: Vec<_> = third.rules().map(|(r, w)| (r.to_string(), w)).collect();
    assert_eq!(
        rules,
        [(
            "order/slow_calls".to_string(),
            Some(Duration::from_millis(30))
        )]
    );

    let seen = Arc::new(Mutex::new(None));
    let into = seen.clone();
    third.on_end(move |ended| *into.lock().unwrap() = Some(ended));
    third.record(Outcome::Status(503));
    third.record(Outcome::Status(200));
    third.add_bytes(7);
    third.add_bytes(5);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(seen.lock().unwrap().is_none(), "told only at the end");
    drop(third);
    let ended = seen.lock().unwrap().take().unwrap();
    assert_eq!(
        ended.outcome,
        Some(Outcome::Status(503)),
        "the first outcome"
    );
    assert_eq!(ended.bytes, 12);
    assert_eq!(ended.at, Instant::now());

    // An unmatched call is observed too, and one that ended without an outcome.
    let mut free = admit(&e, "/fast", None).await.unwrap();
    let into = seen.clone();
    free.on_end(move |ended| *into.lock().unwrap() = Some(ended));
    assert_eq!(free.rules().count(), 0);
    drop(free);
    assert_eq!(seen.lock().unwrap().take().unwrap().outcome, None);
}

#[test]
fn a_config_names_the_headers_its_matches_read_and_its_windowed_rules() {
    let e = engine(
        r#"
service: order
rules:
- name: order/tenant
  on:
    or:
      exprs:
      - header: {name: X-Tenant, value: a}
      - and: {exprs: [{header: {name: x-tenant, value: b}}, {header: {name: x-zone, value: z}}]}
  limit:
    calls: {amount: 2, window_ms: 1000}
- name: order/slow_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /slow}}
  bulkhead:
    max_concurrent: 2
"#,
    );
    let names: Vec<_> = e
        .config()
        .match_headers()
        .iter()
        .map(|h| h.to_string())
        .collect();
    assert_eq!(names, ["x-tenant", "x-zone"]);
    let epochs: Vec<_> = e.epochs().into_iter().map(|(r, _)| r.to_string()).collect();
    assert_eq!(epochs, ["order/tenant"], "a bulkhead has no window");
}

/// A bulkhead whose direction changes under the same name is another rule
/// with a pool of its own: the inbound calls in flight do not count against
/// the outbound one (a resize keeps the pool only within one direction).
#[tokio::test(start_paused = true)]
async fn a_bulkhead_whose_direction_changes_starts_with_a_fresh_pool() {
    let e = engine(BULKHEAD);
    let a = now(&e, "/slow", None).unwrap();
    let b = now(&e, "/slow", None).unwrap();
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 2);
    let applied = e
        .apply_target(&target(&BULKHEAD.replace(
            "  bulkhead:",
            "  direction: DIRECTION_OUTBOUND\n  bulkhead:",
        )))
        .unwrap();
    assert_eq!((applied.kept, applied.fresh), (0, 1));
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 0);
    drop((a, b));
    assert_eq!(stats(&e, "order/slow_calls").in_flight, 0);
}

/// A bulkhead's rejection carries the gRPC code its rule says (the default,
/// UNAVAILABLE, or the one configured), as its HTTP status.
#[tokio::test(start_paused = true)]
async fn a_bulkhead_rejects_with_its_configured_grpc_code() {
    use gov_proto::v1::GrpcCode;
    for (extra, code) in [
        ("", GrpcCode::Unavailable),
        (
            "\n    reject_grpc_status: GRPC_CODE_ABORTED",
            GrpcCode::Aborted,
        ),
    ] {
        let e = engine(&BULKHEAD.replace(
            "    reject_status: 408",
            &format!("    reject_status: 408{extra}"),
        ));
        let held = (now(&e, "/slow", None), now(&e, "/slow", None));
        let refused = admit(&e, "/slow", None).await.unwrap_err();
        assert_eq!((refused.status.as_u16(), refused.grpc), (408, code));
        drop(held);
    }
}

/// A fuse decides on a failure: a success that brings the window to
/// `min_calls` with the ratio already over the threshold does not trip it;
/// the next failure does. (Resilience4j evaluates on every call once the
/// minimum is reached; gov only when a call fails, so a success never
/// opens a fuse. This test pins that.)
#[tokio::test(start_paused = true)]
async fn a_fuse_trips_on_a_failure_never_on_a_success() {
    let e = engine(FUSE);
    let call = |status: u16| {
        now(&e, "/mdm/a", None)
            .map(|a| a.finish(Outcome::Status(status)))
            .is_ok()
    };
    // 3 failures in 3 calls: under min_calls (4).
    assert!((0..3).all(|_| call(500)));
    // The 4th call succeeds: 75% > 50% over 4 calls, yet no trip.
    assert!(call(200));
    assert!(call(200), "a success did not trip it");
    // The next failure does: 4 of 6.
    assert!(call(500));
    assert!(!call(200), "tripped on the failure");
}

/// A half-open probe whose call is dropped before it reports (refused by a
/// later rule, the client gone) gives its probe back: the next call probes.
#[tokio::test(start_paused = true)]
async fn a_dropped_probe_is_given_back() {
    let e = engine(
        r#"
service: inventory
rules:
- name: inventory/stock_errors
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 30000}
    recover: {after: {after_ms: 30000, probes: 1}}
"#,
    );
    now(&e, "/stock", None)
        .unwrap()
        .finish(Outcome::ConnectFailure);
    tokio::time::advance(Duration::from_secs(30)).await;
    // Half-open with one probe: a probe dropped unreported gives it back.
    let probe = now(&e, "/stock", None).unwrap();
    drop(probe);
    let probe = now(&e, "/stock", None).unwrap();
    probe.finish(Outcome::Status(200));
    assert_eq!(
        stats(&e, "inventory/stock_errors").fuse,
        Some(FuseState::Closed)
    );
}
