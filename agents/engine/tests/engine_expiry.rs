//! Rules that expire (`expires_at_unix_ms` on the wire), under paused time:
//! the engine stops enforcing a rule at its instant, by its own clock, with
//! nobody telling it; the other rules go on.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::time::{Duration, SystemTime};

use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

fn now_unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// `order/promo` (1 call an hour on `/promo`, expiring as `expiry` says)
/// and `order/api` (1 call an hour on `/api`, never expiring).
fn config(expiry: &str) -> TargetConfig {
    let yaml = format!(
        r#"
service: order
rules:
- name: order/promo
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /promo}}}}
  {expiry}
  limit:
    calls: {{amount: 1, window_ms: 3600000}}
    algorithm: LIMIT_ALGORITHM_FIXED_WINDOW
- name: order/api
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /api}}}}
  limit:
    calls: {{amount: 1, window_ms: 3600000}}
    algorithm: LIMIT_ALGORITHM_FIXED_WINDOW
"#
    );
    let mut t: TargetConfig = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    t
}

fn admitted(e: &Engine, path: &str) -> bool {
    let h = HeaderMap::new();
    match e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
        Decision::Admitted(a) => {
            a.finish(Outcome::Status(200));
            true
        }
        Decision::Rejected(_) => false,
        Decision::Wait(_) => panic!("a local limit decides at once"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_rule_stops_being_enforced_at_its_instant_and_the_others_go_on() {
    let e = Engine::empty("order");
    let at = now_unix_ms() + 2_000;
    e.apply_target(&config(&format!("expires_at_unix_ms: {at}")))
        .unwrap();
    assert_eq!(
        e.config().rules[0].expires.map(|x| x.unix_ms),
        Some(at),
        "the instant as the config says"
    );
    assert!(admitted(&e, "/promo"));
    assert!(admitted(&e, "/api"));
    // Enforced until its instant (the wall clock read at the apply may
    // have moved a few real milliseconds since `at` was computed).
    tokio::time::advance(Duration::from_millis(1_900)).await;
    for _ in 0..10 {
        assert!(!admitted(&e, "/promo"), "still enforced before its instant");
    }
    tokio::time::advance(Duration::from_millis(100)).await;
    for _ in 0..10 {
        assert!(admitted(&e, "/promo"), "expired: no longer enforced");
        assert!(!admitted(&e, "/api"), "the rule without an expiry goes on");
    }
}

#[tokio::test(start_paused = true)]
async fn a_config_loaded_after_the_instant_never_enforces_the_rule() {
    let e = Engine::empty("order");
    let past = now_unix_ms() - 1;
    e.apply_target(&config(&format!(
        "expires_at_unix_ms: {past}\n  for_ms: 2000"
    )))
    .unwrap();
    for _ in 0..5 {
        assert!(admitted(&e, "/promo"));
    }
    assert!(admitted(&e, "/api"));
    assert!(!admitted(&e, "/api"));
}

#[tokio::test(start_paused = true)]
async fn an_expired_bulkhead_no_longer_sets_a_deadline() {
    let at = now_unix_ms() + 1_000;
    let yaml = format!(
        r#"
service: order
rules:
- name: order/slow
  on: {{any: true}}
  expires_at_unix_ms: {at}
  bulkhead:
    max_concurrent: 1
    timeout_ms: 50
"#
    );
    let mut t: TargetConfig = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let e = Engine::empty("order");
    e.apply_target(&t).unwrap();
    let h = HeaderMap::new();
    let req = RequestInfo::inbound(&Method::GET, "/", &h);
    let Decision::Admitted(held) = e.try_admit(&req) else {
        panic!("the first call takes the permit");
    };
    assert!(held.timeout().is_some(), "the bulkhead's timeout applies");
    assert!(matches!(e.try_admit(&req), Decision::Rejected(_)));
    tokio::time::advance(Duration::from_millis(1_000)).await;
    let Decision::Admitted(after) = e.try_admit(&req) else {
        panic!("an expired bulkhead takes no permit");
    };
    assert!(after.timeout().is_none(), "nor sets a deadline");
    drop(held);
}

#[test]
fn a_for_without_its_instant_is_refused() {
    let e = Engine::empty("order");
    let err = e
        .apply_target(&config("for_ms: 2000"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("order/promo") && err.contains("for_ms"),
        "{err}"
    );
}
