//! Every order of what a caller may do to an admitted call (observe it,
//! count it as a system error, record an outcome) before it ends
//! (finished, dropped, timed out), with and without holds kept aside (a
//! shadow rule's would-be refusal): the observer is told once, with the
//! outcome recorded after it was set; fuses see a system error marked
//! before the record; the call is counted once and its permit comes back.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::sync::{Arc, Mutex};

use gov_engine::{Admission, Decision, Engine, Outcome, RequestInfo};
use http::{HeaderMap, Method};

const CONFIG: &str = r#"
service: order
rules:
- name: order/pool
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  bulkhead: {max_concurrent: 1}
- name: order/fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /stock}}
  fuse:
    trips:
    - {metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 60000}
- name: order/shadow
  mode: MODE_SHADOW
  on: {path: {kind: PATH_KIND_PREFIX, value: /}}
  limit:
    calls: {amount: 1, window_ms: 3600000}
"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Observe,
    SystemError,
    Record,
}

#[derive(Clone, Copy, Debug)]
enum End {
    Finish,
    Drop,
    TimedOut,
}

fn engine() -> Engine {
    let mut t: gov_proto::v1::TargetConfig = serde_yaml::from_str(CONFIG).unwrap();
    gov_proto::compiled::fill(&mut t);
    let e = Engine::empty("order");
    e.apply_target(&t).unwrap();
    e
}

fn decide(e: &Engine, path: &str) -> Option<Admission> {
    let h = HeaderMap::new();
    match e.try_admit(&RequestInfo::inbound(&Method::GET, path, &h)) {
        Decision::Admitted(a) => Some(a),
        _ => None,
    }
}

/// Every order of every subset of the three operations.
fn orders() -> Vec<Vec<Op>> {
    fn grow(done: &[Op], all: &mut Vec<Vec<Op>>) {
        all.push(done.to_vec());
        for op in [Op::Observe, Op::SystemError, Op::Record] {
            if !done.contains(&op) {
                grow(&[done, &[op]].concat(), all);
            }
        }
    }
    let mut all = Vec::new();
    grow(&[], &mut all);
    all
}

fn run(ops: &[Op], end: End, aside: bool) {
    let ctx = format!("{ops:?} {end:?} aside {aside}");
    let e = engine();
    if aside {
        // The shadow limit's one call: the next is one it would refuse.
        drop(decide(&e, "/warm"));
    }
    let mut a = decide(&e, "/stock").expect("admitted");
    assert_eq!(a.would_reject().count(), usize::from(aside), "{ctx}");
    let told = Arc::new(Mutex::new(Vec::new()));
    for op in ops {
        match op {
            Op::Observe => {
                let told = told.clone();
                a.on_end(move |ended| told.lock().unwrap().push(ended.outcome));
            }
            Op::SystemError => a.count_as_system_error(),
            Op::Record => a.record(Outcome::Status(200)),
        }
    }
    match end {
        End::Finish => a.finish(Outcome::Status(201)),
        End::Drop => drop(a),
        End::TimedOut => drop(a.timed_out()),
    }
    let at = |op: Op| ops.iter().position(|&o| o == op);
    let recorded_at = at(Op::Record).unwrap_or(ops.len());
    let outcome = match (at(Op::Record), end) {
        (Some(_), _) => Some(Outcome::Status(200)),
        (None, End::Finish) => Some(Outcome::Status(201)),
        (None, End::TimedOut) => Some(Outcome::Timeout),
        (None, End::Drop) => None,
    };
    // The observer: told once, of the first outcome given after it was
    // set (an observer set after the record is told the end's outcome,
    // as before issue 39's marks).
    let end_outcome = match end {
        End::Finish => Some(Outcome::Status(201)),
        End::TimedOut => Some(Outcome::Timeout),
        End::Drop => None,
    };
    let want = match (at(Op::Observe), at(Op::Record)) {
        (Some(o), Some(r)) if o < r => vec![Some(Outcome::Status(200))],
        (Some(_), _) => vec![end_outcome],
        (None, _) => vec![],
    };
    assert_eq!(*told.lock().unwrap(), want, "{ctx}");
    let stats = e.stats();
    let rule = |name: &str| stats.rules.iter().find(|s| &*s.rule == name).unwrap();
    for name in ["order/pool", "order/fuse"] {
        let s = rule(name);
        assert_eq!((s.admitted, s.in_flight), (1, 0), "{ctx} {name}");
        let latency: u64 = s.latency.iter().sum();
        assert_eq!(latency, u64::from(outcome.is_some()), "{ctx} {name}");
    }
    // A system error marked before the record trips the fuse (one error);
    // a call that went well does not.
    let system_error = at(Op::SystemError).is_some_and(|s| s < recorded_at);
    if !matches!(outcome, Some(Outcome::Timeout)) {
        let tripped = outcome.is_some() && system_error;
        assert_eq!(decide(&e, "/stock").is_none(), tripped, "{ctx}");
    }
}

#[test]
fn every_order_of_a_calls_life_ends_it_once() {
    let orders = orders();
    assert_eq!(orders.len(), 16);
    for ops in &orders {
        for end in [End::Finish, End::Drop, End::TimedOut] {
            for aside in [false, true] {
                run(ops, end, aside);
            }
        }
    }
}
