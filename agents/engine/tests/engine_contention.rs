//! A bulkhead under contention (issue 39: its take tries once inline, the
//! retry loop out of line): threads racing for its permits never hold more
//! than it has, every call admitted is counted once and gives its permit
//! back; calls that wait for a permit on a runtime of several threads are
//! all admitted in time, as many at once as the bulkhead has.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test fixtures fail the test loudly"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use gov_engine::{Admission, Decision, Engine, Outcome, RequestInfo};
use http::{HeaderMap, Method};

const MAX: usize = 3;

fn engine(wait: bool) -> Engine {
    let wait = if wait { ", max_wait_ms: 600000" } else { "" };
    let yaml = format!(
        r#"
service: order
rules:
- name: order/pool
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /p}}}}
  bulkhead: {{max_concurrent: {MAX}{wait}}}
- name: order/rate
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /p}}}}
  limit: {{calls: {{amount: 1000000000, window_ms: 1000}}}}
- name: order/fuse
  on: {{path: {{kind: PATH_KIND_PREFIX, value: /p}}}}
  fuse:
    trips:
    - {{metric: TRIP_METRIC_ERRORS, op: COMPARE_OP_GE, count: 1, window_ms: 60000}}
"#
    );
    let mut t: gov_proto::v1::TargetConfig = serde_yaml::from_str(&yaml).unwrap();
    gov_proto::compiled::fill(&mut t);
    let e = Engine::empty("order");
    e.apply_target(&t).unwrap();
    e
}

fn try_decide(e: &Engine) -> Option<Admission> {
    let h = HeaderMap::new();
    match e.try_admit(&RequestInfo::inbound(&Method::GET, "/p/1", &h)) {
        Decision::Admitted(a) => Some(a),
        _ => None,
    }
}

fn stat(e: &Engine, rule: &str) -> (u64, u64, u64) {
    let stats = e.stats();
    let s = stats.rules.iter().find(|s| &*s.rule == rule).unwrap();
    (s.admitted, s.in_flight, s.waiting)
}

/// Holds a permit while `live` says how many are held: never more than
/// the bulkhead's.
fn hold(a: Admission, live: &AtomicUsize, n: u64) {
    let now = live.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(now <= MAX, "{now} calls hold a permit of {MAX}");
    std::hint::black_box(n);
    std::thread::yield_now();
    live.fetch_sub(1, Ordering::SeqCst);
    match n % 3 {
        0 => a.finish(Outcome::Status(200)),
        1 => {
            let mut a = a;
            a.record(Outcome::Status(200));
            drop(a);
        }
        _ => drop(a),
    }
}

#[test]
fn threads_racing_for_permits_hold_no_more_than_the_bulkhead() {
    const THREADS: usize = 8;
    const TRIES: u64 = 50_000;
    let e = engine(false);
    let live = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (e, live, admitted) = (e.clone(), live.clone(), admitted.clone());
            std::thread::spawn(move || {
                for n in 0..TRIES {
                    if let Some(a) = try_decide(&e) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        hold(a, &live, n);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no more calls than permits");
    }
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(admitted > 0);
    for rule in ["order/pool", "order/rate", "order/fuse"] {
        assert_eq!(stat(&e, rule), (admitted, 0, 0), "{rule}");
    }
    // Every permit came back: MAX held at once, one more refused.
    let held: Vec<_> = (0..MAX)
        .map(|_| try_decide(&e).expect("a permit"))
        .collect();
    assert!(try_decide(&e).is_none());
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waits_on_several_threads_are_all_admitted_in_turn() {
    const TASKS: usize = 16;
    const CALLS: u64 = 200;
    let e = engine(true);
    let live = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (e, live) = (e.clone(), live.clone());
            tokio::spawn(async move {
                let h = HeaderMap::new();
                for n in 0..CALLS {
                    let req = RequestInfo::inbound(&Method::GET, "/p/1", &h);
                    let a = e.admit(&req).await.expect("admitted after its wait");
                    tokio::task::yield_now().await;
                    hold(a, &live, n);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("every call admitted");
    }
    let total = TASKS as u64 * CALLS;
    for rule in ["order/pool", "order/rate", "order/fuse"] {
        assert_eq!(stat(&e, rule), (total, 0, 0), "{rule}");
    }
}
