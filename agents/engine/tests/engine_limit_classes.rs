//! Criticality on a limit, through a wire config: in a service that
//! declares classes, a sheddable call leaves the last tenth of a limit's
//! window to the others; a keyed limit does not read the class.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use gov_engine::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, HeaderValue, Method};

fn engine() -> Engine {
    let yaml = r#"
service: order
consumer_header: x-gov-consumer
matches:
- name: batch
  expr: { consumer: batch }
  criticality: CRITICALITY_SHEDDABLE
rules:
- name: order/all
  on: {path: {kind: PATH_KIND_PREFIX, value: /a}}
  limit:
    calls: {amount: 20, window_ms: 60000}
    algorithm: LIMIT_ALGORITHM_FIXED_WINDOW
- name: order/keyed
  on: {path: {kind: PATH_KIND_PREFIX, value: /k}}
  limit:
    calls: {amount: 20, window_ms: 60000}
    algorithm: LIMIT_ALGORITHM_FIXED_WINDOW
    key: LIMIT_KEY_CONSUMER
"#;
    let mut t: TargetConfig = serde_yaml::from_str(yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let e = Engine::empty("order");
    e.apply_target(&t).unwrap();
    e
}

fn admitted(e: &Engine, path: &str, consumer: &str) -> bool {
    let mut h = HeaderMap::new();
    h.insert("x-gov-consumer", HeaderValue::from_str(consumer).unwrap());
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
async fn a_sheddable_call_leaves_the_last_tenth_of_a_window() {
    let e = engine();
    let shed = (0..20).filter(|_| admitted(&e, "/a", "batch")).count();
    assert_eq!(shed, 18, "sheddable: 18 of 20");
    assert!(admitted(&e, "/a", "crm") && admitted(&e, "/a", "crm"));
    assert!(!admitted(&e, "/a", "crm"), "the window is used up");

    let keyed = (0..20).filter(|_| admitted(&e, "/k", "batch")).count();
    assert_eq!(keyed, 20, "a keyed limit does not read the class");
}
