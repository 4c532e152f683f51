//! `scale with warmup` (`warmup_scale` on the wire), under paused time:
//! while the instance ramps, a limit admits its calls amount times the
//! instance's slow-start weight (at least one call per window), and its
//! full amount once the ramp is over; a limit without it is never scaled.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::time::Duration;

use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};

/// `order/scaled` on `/a` (100 calls per 1 s, scaled) and `order/plain`
/// on `/b` (the same, not scaled), counted by `algorithm`.
fn engine(algorithm: &str) -> Engine {
    let yaml = format!(
        r#"
service: order
rules:
- name: order/scaled
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /a}}}}
  limit:
    calls: {{amount: 100, window_ms: 1000}}
    warmup_scale: true
    {algorithm}
- name: order/plain
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /b}}}}
  limit:
    calls: {{amount: 100, window_ms: 1000}}
    {algorithm}
"#
    );
    let mut t: TargetConfig = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let e = Engine::empty("order");
    e.apply_target(&t).unwrap();
    e
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

/// Offers 1,000 calls to each path over `seconds` whole windows (evenly);
/// returns how many each admitted.
async fn offer(e: &Engine, seconds: u64) -> (usize, usize) {
    let (mut a, mut b) = (0, 0);
    let calls = 1_000 * seconds;
    for _ in 0..calls {
        a += usize::from(admitted(e, "/a"));
        b += usize::from(admitted(e, "/b"));
        tokio::time::advance(Duration::from_micros(1_000_000 * seconds / calls)).await;
    }
    (a, b)
}

#[tokio::test(start_paused = true)]
async fn a_fixed_window_admits_the_weight_of_its_amount_while_ramping() {
    let e = engine("algorithm: LIMIT_ALGORITHM_FIXED_WINDOW");
    e.set_warmup_weight(25_000);
    assert_eq!(offer(&e, 2).await, (50, 200), "25% of 100 per window");
    e.set_warmup_weight(0);
    assert_eq!(offer(&e, 2).await, (2, 200), "never nothing: 1 per window");
    e.set_warmup_weight(100_000);
    assert_eq!(
        offer(&e, 2).await,
        (200, 200),
        "the full rate after the ramp"
    );
}

#[tokio::test(start_paused = true)]
async fn a_sliding_window_and_a_token_bucket_follow_the_weight_too() {
    for algorithm in [
        "algorithm: LIMIT_ALGORITHM_SLIDING_WINDOW",
        "algorithm: LIMIT_ALGORITHM_TOKEN_BUCKET\n    burst: 20",
    ] {
        let e = engine(algorithm);
        e.set_warmup_weight(25_000);
        let (ramping, plain) = offer(&e, 4).await;
        // 25 a second over 4 s (and a token bucket's burst of 5 at
        // first): about 100 of the plain limit's about 400.
        assert!(
            (90..=110).contains(&ramping),
            "{algorithm}: {ramping} at 25%"
        );
        assert!((395..=425).contains(&plain), "{algorithm}: {plain}");
        e.set_warmup_weight(100_000);
        let (full, plain) = offer(&e, 4).await;
        assert!((395..=425).contains(&full), "{algorithm}: {full} at 100%");
        assert!((395..=425).contains(&plain), "{algorithm}: {plain}");
    }
}

#[test]
fn a_cluster_limit_cannot_scale_with_one_instance_s_warmup() {
    let yaml = "service: order\nrules:\n- name: order/l\n  on: {any: true}\n  limit:\n    calls: {amount: 10, window_ms: 1000}\n    warmup_scale: true\n    scope: LIMIT_SCOPE_CLUSTER\n";
    let mut t: TargetConfig = serde_yaml::from_str(yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let err = Engine::empty("order")
        .apply_target(&t)
        .unwrap_err()
        .to_string();
    assert!(err.contains("scope local"), "{err}");
}
