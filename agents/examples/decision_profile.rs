//! A bare decision loop for profilers (`perf record`, `valgrind --tool=callgrind`):
//! the config and requests of `benches/decision.rs` without criterion's
//! analysis in the profile.
//!
//! Run: `cargo run --release -p gov-agent --example decision_profile -- matched 1000000`
//! (`matched` or `unmatched`, then the number of decisions).

#![allow(clippy::print_stdout, reason = "a profiling tool prints its count")]

use std::hint::black_box;

use gov_agent::{Decision, Engine, Outcome, RequestInfo};
use gov_proto::v1::TargetConfig;
use http::{HeaderMap, HeaderValue, Method};

/// The same config as `benches/decision.rs`.
const CONFIG: &str = r#"
service: order
domain: trade
version: bench
consumer_header: x-gov-consumer
bulkheads:
- rule: order/slow_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /benchmark/delay/z100}}
  max_concurrent: 10
  max_wait_ms: 10
- rule: order/api_calls
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  max_concurrent: 1000000
- rule: order/per_instance
  on: {calls_to: inventory}
  direction: DIRECTION_OUTBOUND
  key: BULKHEAD_KEY_INSTANCE
  max_concurrent: 20
  max_wait_ms: 50
limits:
- rule: order/crm_supplier
  on: {and: {exprs: [{path: {kind: PATH_KIND_PREFIX, value: /mdm/supplier}}, {consumer: crm}]}}
  calls: {amount: 100, window_ms: 1000}
  bytes: {amount: 10485760, window_ms: 60000}
  key: LIMIT_KEY_CONSUMER
  release: {after_ms: 7200000}
- rule: order/api_rate
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  calls: {amount: 1000000000000, window_ms: 1000}
- rule: order/writes
  on: {and: {exprs: [{or: {exprs: [{method: POST}, {method: PUT}]}}, {path: {kind: PATH_KIND_PREFIX, value: /orders}}]}}
  calls: {amount: 50, window_ms: 1000}
fuses:
- rule: order/mdm
  on: {and: {exprs: [{path: {kind: PATH_KIND_PREFIX, value: /mdm/supplier}}, {consumer: crm}]}}
  trips:
  - {metric: TRIP_METRIC_BUSINESS_ERROR_RATIO, op: COMPARE_OP_GT, ratio_milli_percent: 50000, window_ms: 60000, min_calls: 20}
  - {metric: TRIP_METRIC_SYSTEM_ERRORS, op: COMPARE_OP_GE, count: 10, window_ms: 10000}
- rule: order/api_fuse
  on: {path: {kind: PATH_KIND_PREFIX, value: /api}}
  trips:
  - {metric: TRIP_METRIC_ERROR_RATIO, op: COMPARE_OP_GT, ratio_milli_percent: 50000, window_ms: 60000, min_calls: 20}
timeouts:
- rule: order/export_timeout
  on: {path: {kind: PATH_KIND_EXACT, value: /export}}
  timeout_ms: 5000
- rule: order/admin_timeout
  on: {header: {name: x-admin, value: "yes"}}
  timeout_ms: 1000
"#;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "matched".into());
    let n: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let target: TargetConfig = match serde_yaml::from_str(CONFIG) {
        Ok(t) => t,
        Err(e) => panic!("config: {e}"),
    };
    let engine = Engine::empty("order");
    if let Err(e) = engine.apply_target(&target) {
        panic!("config: {e}");
    }
    let mut h = HeaderMap::new();
    h.insert("x-gov-consumer", HeaderValue::from_static("shop"));
    h.insert("accept", HeaderValue::from_static("application/json"));
    h.insert("user-agent", HeaderValue::from_static("bench/1.0"));
    let get = Method::GET;
    let path = if mode == "unmatched" {
        "/static/app.js"
    } else {
        "/api/orders/7"
    };
    let info = RequestInfo::inbound(&get, path, &h);
    let mut admitted = 0u64;
    for _ in 0..n {
        match engine.try_admit(black_box(&info)) {
            Decision::Admitted(a) => {
                a.finish(Outcome::Status(200));
                admitted += 1;
            }
            Decision::Rejected(r) => panic!("unexpected rejection: {r}"),
            Decision::Wait(_) => panic!("unexpected wait"),
        }
    }
    println!("{mode}: {admitted} of {n} admitted");
}
