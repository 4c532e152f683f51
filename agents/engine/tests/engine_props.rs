//! Properties of the engine under random operation sequences:
//! a bulkhead never has more than `max_concurrent` calls in flight, and a
//! released fuse admits again.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use gov_engine::{Admission, Decision, Engine, Outcome, RejectReason, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, Method};
use proptest::prelude::*;

/// A hand-written config, with the compiler's values where it leaves them out.
fn compiled(yaml: &str) -> TargetConfig {
    let mut target: TargetConfig = serde_yaml::from_str(yaml).unwrap();
    gov_proto::compiled::fill(&mut target);
    target
}

fn engine(yaml: &str) -> Engine {
    let target = compiled(yaml);
    let engine = Engine::empty("svc");
    engine.apply_target(&target).unwrap();
    engine
}

#[derive(Clone, Debug)]
enum Op {
    /// Try to admit a call on path `/p{0}` to instance `i{1}`.
    Admit(u8, u8),
    /// End the n-th held call (modulo the number held).
    End(usize),
    /// Re-apply the same config with a new version (state must carry over).
    Reload,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3, 0u8..3).prop_map(|(p, i)| Op::Admit(p, i)),
        3 => any::<usize>().prop_map(Op::End),
        1 => Just(Op::Reload),
    ]
}

fn bulkhead_config(max: u32, per_instance: bool, version: u32) -> String {
    let key = if per_instance {
        "BULKHEAD_KEY_INSTANCE"
    } else {
        "BULKHEAD_KEY_OPERATION"
    };
    format!(
        r#"
service: svc
version: v{version}
rules:
- name: svc/b
  on: {{calls_to: upstream}}
  direction: DIRECTION_OUTBOUND
  bulkhead:
    key: {key}
    max_concurrent: {max}
"#
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn in_flight_never_exceeds_max_concurrent(
        max in 1u32..5,
        per_instance in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let e = engine(&bulkhead_config(max, per_instance, 0));
        let headers = HeaderMap::new();
        // Held admissions, with the instance they were admitted for.
        let mut held: Vec<(u8, Admission)> = Vec::new();
        let mut version = 0;
        for op in ops {
            match op {
                Op::Admit(path, instance) => {
                    let path = format!("/p{path}");
                    let instance_name = format!("i{instance}");
                    let info = RequestInfo::outbound(
                        &Method::GET, &path, &headers, "upstream", Some(&instance_name),
                    );
                    let scope_held = held
                        .iter()
                        .filter(|(i, _)| !per_instance || *i == instance)
                        .count();
                    match e.try_admit(&info) {
                        Decision::Admitted(a) => {
                            prop_assert!(scope_held < max as usize, "admitted over the limit");
                            held.push((instance, a));
                        }
                        Decision::Rejected(r) => {
                            prop_assert_eq!(r.reason, RejectReason::BulkheadFull);
                            prop_assert_eq!(scope_held, max as usize, "refused below the limit");
                        }
                        Decision::Wait(_) => prop_assert!(false, "max_wait is 0: never waits"),
                    }
                }
                Op::End(n) => {
                    if !held.is_empty() {
                        let (_, a) = held.remove(n % held.len());
                        a.finish(Outcome::Status(200));
                    }
                }
                Op::Reload => {
                    version += 1;
                    let applied = e
                        .apply_target(&compiled(&bulkhead_config(max, per_instance, version)))
                        .unwrap();
                    prop_assert_eq!(applied.kept, 1);
                }
            }
            let stats = e.stats();
            prop_assert_eq!(stats.rules[0].in_flight, held.len() as u64);
            let scopes = if per_instance { 3 } else { 1 };
            prop_assert!(stats.rules[0].in_flight <= u64::from(max) * scopes);
        }
    }

    #[test]
    fn a_released_fuse_admits_again(
        outcomes in proptest::collection::vec(prop_oneof![Just(200u16), Just(500u16), Just(503u16)], 1..100),
        auto in any::<bool>(),
    ) {
        let recover = if auto { "recover: {after: {after_ms: 60000, probes: 2}}" } else { "" };
        let e = engine(&format!(
            r#"
service: svc
rules:
- name: svc/f
  on: {{any: true}}
  fuse:
    trips:
    - {{metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 3, window_ms: 60000}}
    {recover}
"#
        ));
        let headers = HeaderMap::new();
        let info = RequestInfo::inbound(&Method::GET, "/", &headers);
        let mut errors = 0;
        for status in outcomes {
            match e.try_admit(&info) {
                Decision::Admitted(a) => {
                    prop_assert!(errors < 3, "admitted after tripping");
                    if status >= 500 {
                        errors += 1;
                    }
                    a.finish(Outcome::Status(status));
                }
                Decision::Rejected(r) => {
                    prop_assert_eq!(r.reason, RejectReason::FuseOpen);
                    prop_assert!(errors >= 3, "refused before tripping");
                    // Release, and the very next call passes.
                    prop_assert_eq!(e.release_fuse("svc/f", "prop"), Ok(true));
                    errors = 0;
                    prop_assert!(matches!(e.try_admit(&info), Decision::Admitted(_)));
                }
                Decision::Wait(_) => prop_assert!(false, "fuses never wait"),
            }
        }
    }
}
