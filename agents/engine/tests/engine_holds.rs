//! Calls matching rules past the 64 a call holds as bits (their grants are
//! kept aside): each rule counts them admitted and ended, and their
//! permits come back, whether the call is finished, recorded then dropped,
//! or dropped; a second call of a full bulkhead is refused and named.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use gov_engine::{Admission, Decision, Engine, Outcome, RequestInfo};
use http::{HeaderMap, Method};

/// 70 bulkheads of one permit, each on its own path `/r{i}`, and a fuse
/// and a limit on every path (after them: ids 70 and 71).
fn config() -> gov_proto::v1::TargetConfig {
    let mut yaml = String::from("service: order\nrules:\n");
    for i in 0..70 {
        yaml.push_str(&format!(
            "- {{name: order/b{i}, on: {{path: {{kind: PATH_KIND_PREFIX, value: /r{i}/}}}}, bulkhead: {{max_concurrent: 1}}}}\n"
        ));
    }
    yaml.push_str(
        r#"- name: order/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1000, window_ms: 10000}
- name: order/limit
  on: {path: {kind: PATH_KIND_PREFIX, value: /}}
  limit:
    calls: {amount: 1000000, window_ms: 1000}
"#,
    );
    let mut t: gov_proto::v1::TargetConfig = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    t
}

fn decide(e: &Engine, path: &str) -> Result<Admission, String> {
    let h = HeaderMap::new();
    match e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
        Decision::Admitted(a) => Ok(a),
        Decision::Rejected(r) => Err(r.rule.to_string()),
        Decision::Wait(_) => panic!("a bulkhead without a wait asked to wait"),
    }
}

/// (admitted, in flight) of `rule`.
fn counts(e: &Engine, rule: &str) -> (u64, u64) {
    let s = e.stats();
    let r = s.rules.iter().find(|r| &*r.rule == rule).unwrap();
    (r.admitted, r.in_flight)
}

#[test]
fn rules_past_64_count_and_give_back_every_call() {
    let e = Engine::empty("order");
    e.apply_target(&config()).unwrap();
    for (round, end) in ["finish", "record", "drop"]
        .iter()
        .cycle()
        .take(9)
        .enumerate()
    {
        let n = round as u64 + 1;
        for i in [0, 63, 64, 69] {
            let path = format!("/r{i}/x");
            let mut a = decide(&e, &path).unwrap();
            let rules: Vec<String> = a.rules().map(|(r, _)| r.to_string()).collect();
            assert_eq!(rules.len(), 3, "{rules:?}");
            assert!(rules.contains(&format!("order/b{i}")), "{rules:?}");
            // The bulkhead is full: a second call is refused by it.
            assert_eq!(decide(&e, &path).err(), Some(format!("order/b{i}")));
            assert_eq!(counts(&e, &format!("order/b{i}")), (n, 1), "{i} {end}");
            match *end {
                "finish" => a.finish(Outcome::Status(200)),
                "record" => {
                    a.record(Outcome::Status(200));
                    drop(a);
                }
                _ => drop(a),
            }
            assert_eq!(counts(&e, &format!("order/b{i}")), (n, 0), "{i} {end}");
        }
    }
    // Every call counted by the rules of every path; none in flight.
    assert_eq!(counts(&e, "order/fuse"), (9 * 4, 0));
    assert_eq!(counts(&e, "order/limit"), (9 * 4, 0));
}

/// A call that waits for the permit of a rule past 64 is counted admitted
/// once admitted, and gives the permit back.
#[tokio::test(start_paused = true)]
async fn a_wait_for_a_rule_past_64_counts_and_gives_back() {
    let mut t = config();
    if let Some(gov_proto::v1::rule::Spec::Bulkhead(b)) = t.rules[69].spec.as_mut() {
        b.max_wait_ms = 1_000;
    }
    let e = Engine::empty("order");
    e.apply_target(&t).unwrap();
    let held = decide(&e, "/r69/x").unwrap();
    let h = HeaderMap::new();
    let pending = match e.try_admit(&RequestInfo::inbound(&Method::GET, "/r69/y", &h)) {
        Decision::Wait(p) => p,
        _ => panic!("the second call waits"),
    };
    let waiting = tokio::spawn(pending.wait());
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    assert_eq!(counts(&e, "order/b69"), (1, 1));
    held.finish(Outcome::Status(200));
    let second = waiting.await.unwrap().unwrap();
    assert_eq!(counts(&e, "order/b69"), (2, 1));
    // Full again: a third call would wait.
    let third = e.try_admit(&RequestInfo::inbound(&Method::GET, "/r69/z", &h));
    assert!(matches!(third, Decision::Wait(_)));
    drop(third);
    second.finish(Outcome::Status(500));
    assert_eq!(counts(&e, "order/b69"), (2, 0));
    assert_eq!(counts(&e, "order/fuse"), (2, 0));
    assert!(decide(&e, "/r69/z").is_ok());
}
